"""Slots (fleet/slots.py): a machine's named capacities — adding one, its
max_sessions and agent pin, and who holds its seats now."""

from __future__ import annotations

import os
import socket

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import machines, slots
from saphan.liveness import boot_id, current_holder, process_start_ticks
from saphan.store.rows import Slot

PIN = "0123456789abcdef" * 4


@pytest.fixture
def m1(ctx: Context) -> str:
    machines.add_machine(ctx, "m1", local=True)
    return "m1"


def _reserve(ctx: Context, run_id: str, holder: tuple[str, int, int | None, str | None],
             capacity: int = 4) -> int | None:
    return ctx.store.reserve(run_id=run_id, machine="m1", slot="s", capacity=capacity,
                             tool="command", workdir="/w", holder=holder)


def test_a_slot_is_added_with_what_was_given(ctx: Context, m1: str) -> None:
    s = slots.add_slot(ctx, m1, "s", tool="codex", max_sessions=3, agent_sha256=PIN)
    assert (s.machine, s.name, s.tool, s.max_sessions, s.agent_sha256) == ("m1", "s", "codex", 3, PIN)
    assert s.capacity == 3 and s.created_at
    assert ctx.slot("m1", "s") == s


def test_no_max_sessions_is_one_seat(ctx: Context, m1: str) -> None:
    s = slots.add_slot(ctx, m1, "s", tool="command")
    assert s.max_sessions is None and s.capacity == 1


@pytest.mark.parametrize(("machine", "slot", "kw", "needle"), [
    ("m1", "bad name", {}, "slot name 'bad name' is not allowed"),
    ("ghost", "s", {}, "no machine named 'ghost'"),
    ("m1", "s", {"tool": "vim"}, "--tool 'vim' is unknown; choose one of command, claude, codex, loop"),
    ("m1", "s", {"max_sessions": 0}, "--max-sessions 0 is below 1"),
    ("m1", "s", {"max_sessions": -2}, "--max-sessions -2 is below 1"),
    ("m1", "s", {"agent_sha256": "ABC"}, "--pin-sha256 'ABC' is not a SHA-256 digest"),
    ("m1", "s", {"agent_sha256": PIN.upper()}, "not a SHA-256 digest"),
])
def test_bad_input_names_the_fix_and_writes_nothing(ctx: Context, m1: str, machine: str, slot: str,
                                                    kw: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"tool": "command", **kw}
    with pytest.raises(UserError) as e:
        slots.add_slot(ctx, machine, slot, **args)  # type: ignore[arg-type]
    assert needle in str(e.value)
    assert ctx.store.list_slots() == []


def test_a_slot_name_is_taken_once_per_machine(ctx: Context, m1: str) -> None:
    machines.add_machine(ctx, "m2", local=True)
    first = slots.add_slot(ctx, "m1", "s", tool="command")
    with pytest.raises(UserError, match="slot 's' already exists on machine 'm1'"):
        slots.add_slot(ctx, "m1", "s", tool="codex", max_sessions=5)
    assert ctx.slot("m1", "s") == first
    slots.add_slot(ctx, "m2", "s", tool="codex")  # the same name on another machine is another slot


def test_slots_list_all_or_one_machines_in_name_order(ctx: Context, m1: str) -> None:
    machines.add_machine(ctx, "m0", local=True)
    for machine, name in (("m1", "b"), ("m1", "a"), ("m0", "z")):
        slots.add_slot(ctx, machine, name, tool="command")
    assert [(s.machine, s.name) for s in slots.slots(ctx)] == [("m0", "z"), ("m1", "a"), ("m1", "b")]
    assert [s.name for s in slots.slots(ctx, "m1")] == ["a", "b"]
    with pytest.raises(UserError, match="no machine named 'ghost'"):
        slots.slots(ctx, "ghost")


def test_max_sessions_changes_and_none_means_one(ctx: Context, m1: str) -> None:
    slots.add_slot(ctx, m1, "s", tool="command")
    assert slots.set_max_sessions(ctx, "m1", "s", 4).capacity == 4
    assert slots.set_max_sessions(ctx, "m1", "s", None).capacity == 1
    with pytest.raises(UserError, match="--max-sessions 0 is below 1"):
        slots.set_max_sessions(ctx, "m1", "s", 0)
    with pytest.raises(UserError, match="no slot 'ghost' on machine 'm1'"):
        slots.set_max_sessions(ctx, "m1", "ghost", 2)
    assert ctx.slot("m1", "s").max_sessions is None


def test_lowering_max_sessions_never_evicts_a_live_run(ctx: Context, m1: str) -> None:
    slots.add_slot(ctx, m1, "s", tool="command", max_sessions=3)
    for rid in ("R1", "R2", "R3"):
        assert _reserve(ctx, rid, ("h", 1, 1, "b"), capacity=3) is not None
    s = slots.set_max_sessions(ctx, "m1", "s", 1)
    assert s.capacity == 1
    assert [r.id for r in ctx.store.live_runs("m1", "s")] == ["R1", "R2", "R3"]


def test_the_agent_pin_is_set_and_removed(ctx: Context, m1: str) -> None:
    slots.add_slot(ctx, m1, "s", tool="claude")
    assert slots.set_agent_pin(ctx, "m1", "s", PIN).agent_sha256 == PIN
    with pytest.raises(UserError, match="not a SHA-256 digest"):
        slots.set_agent_pin(ctx, "m1", "s", "f" * 63)
    assert ctx.slot("m1", "s").agent_sha256 == PIN
    assert slots.set_agent_pin(ctx, "m1", "s", None).agent_sha256 is None
    with pytest.raises(UserError, match="no slot 'ghost'"):
        slots.set_agent_pin(ctx, "m1", "ghost", PIN)


def test_holders_name_each_seat_its_process_and_whether_it_lives(ctx: Context, m1: str) -> None:
    slots.add_slot(ctx, m1, "s", tool="command", max_sessions=4)
    me = current_holder()
    _reserve(ctx, "ALIVE", me.as_tuple())
    gone = ("ghost-host", 12345, 1, boot_id())
    _reserve(ctx, "FAR", gone)
    # A pid of this host that was reused since: recorded with another start time.
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    _reserve(ctx, "REUSED", (socket.gethostname(), os.getpid(), ticks + 1, boot_id()))
    got = {h["run"]: h for h in slots.holders(ctx, "m1", "s")}
    assert [h["ordinal"] for h in slots.holders(ctx, "m1", "s")] == [0, 1, 2]
    alive = got["ALIVE"]
    assert (alive["pid"], alive["host"], alive["liveness"]) == (os.getpid(), me.host, "alive")
    assert alive["since"] == ctx.store.get_run("ALIVE").started_at  # type: ignore[union-attr]
    assert got["FAR"]["liveness"] == "unknown" and "ghost-host" in got["FAR"]["evidence"]
    assert got["REUSED"]["liveness"] == "dead" and "was reused" in got["REUSED"]["evidence"]


def test_finished_runs_hold_nothing(ctx: Context, m1: str) -> None:
    slots.add_slot(ctx, m1, "s", tool="command")
    _reserve(ctx, "R1", current_holder().as_tuple(), capacity=1)
    ctx.store.finalize("R1", state="ended", outcome="exited")
    assert slots.holders(ctx, "m1", "s") == []
    with pytest.raises(UserError, match="no slot 'x' on machine 'm1'"):
        slots.holders(ctx, "m1", "x")


def test_slot_rows_round_trip_through_the_store(ctx: Context, m1: str) -> None:
    s = Slot("m1", "s", "loop", 2, "t", PIN)
    assert ctx.store.add_slot(s)
    assert slots.slots(ctx, "m1") == [s]


# -- run defaults ---------------------------------------------------------------

def test_run_defaults_are_stored_shown_changed_and_cleared(ctx: Context, m1: str) -> None:
    s = slots.add_slot(ctx, m1, "cl", tool="claude", endpoint="http://127.0.0.1:8080/anthropic",
                       model="claude-x", max_seconds=900, max_turns=12)
    assert (s.endpoint, s.model, s.max_seconds, s.max_turns) == (
        "http://127.0.0.1:8080/anthropic", "claude-x", 900, 12)
    assert ctx.slot(m1, "cl") == s
    assert s.as_dict()["endpoint"] == "http://127.0.0.1:8080/anthropic"
    s = slots.set_run_defaults(ctx, m1, "cl", model="claude-y", unset=("max_turns",))
    # the given one changed, the cleared one is gone, the others are kept
    assert (s.endpoint, s.model, s.max_seconds, s.max_turns) == (
        "http://127.0.0.1:8080/anthropic", "claude-y", 900, None)
    assert ctx.slot(m1, "cl") == s


@pytest.mark.parametrize(("tool", "kw", "needle"), [
    ("loop", {"endpoint": "http://127.0.0.1:1"}, "--endpoint applies to claude, codex slots; "
     "this slot runs loop"),
    ("command", {"max_seconds": 5}, "--max-seconds applies to claude, codex, loop slots"),
    ("codex", {"max_turns": 5}, "--max-turns applies to claude, loop slots; this slot runs codex"),
    ("loop", {"model": "m"}, "--model applies to claude, codex slots"),
    ("claude", {"endpoint": "ftp://h/x"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "http://h/x?a=1"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "https://h/x y"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "http://h:99999/"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "http://[::1"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "https://a\u2101b/"}, "in printable ASCII"),
    ("claude", {"endpoint": "https://h\u202e/"}, "in printable ASCII"),
    ("claude", {"endpoint": "https://host#"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "https://good.com\\.evil.com/"}, "is not an http(s) URL"),
    ("claude", {"endpoint": "http://10.0.0.1/v1"}, "plain http to 10.0.0.1 would send the API key"),
    ("claude", {"endpoint": "http://127.attacker.example/v1"}, "plain http to 127.attacker"),
    ("claude", {"endpoint": "http://127.0.0.1.attacker.example:80/v1"}, "would send the API key"),
    ("claude", {"model": "m\x1b]52;c;eA==\x07"}, "is not a model name"),
    ("claude", {"endpoint": "https://user:secret@gw.example/"}, "carries credentials"),
    ("claude", {"model": "--dangerously-skip-permissions"}, "is not a model name"),
    ("claude", {"max_seconds": 0}, "--max-seconds 0 is out of range; give 1..604800"),
    ("claude", {"max_turns": 10_001}, "--max-turns 10001 is out of range; give 1..10000"),
])
def test_run_defaults_are_checked_before_anything_is_written(
    ctx: Context, m1: str, tool: str, kw: dict[str, object], needle: str,
) -> None:
    with pytest.raises(UserError) as e:
        slots.add_slot(ctx, m1, "s", tool=tool, **kw)  # type: ignore[arg-type]
    assert needle in str(e.value)
    assert ctx.store.list_slots() == []
    before = slots.add_slot(ctx, m1, "s", tool=tool)
    with pytest.raises(UserError) as e:
        slots.set_run_defaults(ctx, m1, "s", **kw)
    assert needle in str(e.value)
    assert ctx.slot(m1, "s") == before


def test_a_default_is_given_or_cleared_not_both(ctx: Context, m1: str) -> None:
    before = slots.add_slot(ctx, m1, "s", tool="claude", model="a")
    with pytest.raises(UserError, match="give --model or --unset model, not both"):
        slots.set_run_defaults(ctx, m1, "s", model="b", unset=("model",))
    assert ctx.slot(m1, "s") == before


def test_every_tool_slot_add_accepts_is_one_run_can_run(ctx: Context) -> None:
    """Tool by site: `slot add` refuses a tool on a site where `run` could
    never run it, and accepts every other; an accepted slot's run passes
    the cast's support check (run/request.check_fits)."""
    from saphan.run.request import check_fits
    from saphan.tools import TOOLS
    from saphan.tools.instruction import Request
    from saphan.tools.registry import supports

    machines.add_machine(ctx, "here", local=True)
    far = ctx.store.add_machine(ctx.machine("here")._replace(
        name="far", transport="ssh", ssh_user="u", ssh_host="10.0.0.1", ssh_port=22,
        host_key="ssh-ed25519 AAAA"))
    assert far
    walked = []
    for machine in ("here", "far"):
        m = ctx.machine(machine)
        for tool in TOOLS:
            name = f"{tool}-{machine}"
            if not supports(tool, m.transport):
                with pytest.raises(UserError, match=f"{tool} does not run on ssh machines"):
                    slots.add_slot(ctx, machine, name, tool=tool)
                walked.append((tool, machine, "refused"))
                continue
            s = slots.add_slot(ctx, machine, name, tool=tool)
            if tool == "command":
                check_fits(s, m, ["true"], None, None)
            else:
                check_fits(s, m, [], Request(prompt="t"), None)
            walked.append((tool, machine, "runs"))
    assert ("claude", "far", "runs") in walked and ("codex", "far", "runs") in walked
    assert len(walked) == 2 * len(TOOLS)
