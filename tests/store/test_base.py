"""The Store (store/base.py): every read and write saphan makes, the same on
SQLite and PostgreSQL — machines, slots, the seat reservation and a run's
life from reserved to finalised, and signed facts."""

from __future__ import annotations

from pathlib import Path

from saphan.store import Store, open_store
from saphan.store.rows import Fact, Machine, Slot

HOLDER = ("h", 1, 1, "b")


def _reserve(store: Store, run_id: str, capacity: int = 3, slot: str = "s") -> int | None:
    return store.reserve(run_id=run_id, machine="m", slot=slot, capacity=capacity, tool="command",
                         workdir="/w", holder=HOLDER)


def _machine_and_slot(store: Store, max_sessions: int | None = 3) -> None:
    assert store.add_machine(Machine("m", "local"))
    assert store.add_slot(Slot("m", "s", "command", max_sessions))


# -- the live-seat index, history and prefix search -------------------------------

def test_not_null_seat_columns_and_partial_index(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    store.add_machine(Machine("m", "local"))
    assert not store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", None))
    assert not store.add_slot(Slot("m", "s", "command", None))
    holder = ("h", 1, 1, "b")
    kw = dict(machine="m", slot="s", capacity=1, tool="command", workdir=None, holder=holder)
    assert store.reserve(run_id="a", **kw) == 0  # type: ignore[arg-type]
    assert store.reserve(run_id="b", **kw) is None  # type: ignore[arg-type]
    assert store.get_run("b") is None  # the losing insert affected zero rows
    store.finalize("a", state="ended", outcome="exited")
    assert store.reserve(run_id="c", **kw) == 0  # type: ignore[arg-type]
    # Finished rows are outside the index: history keeps both.
    assert {r.id for r in store.runs_on_slot("m", "s")} == {"a", "c"}


def test_remove_machine_keeps_history(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", 2))
    store.reserve(run_id="r1", machine="m", slot="s", capacity=2, tool="command", workdir=None,
                  holder=("h", 1, 1, "b"))
    store.finalize("r1", state="ended", outcome="exited")
    assert store.remove_machine("m")
    assert store.get_machine("m") is None and store.list_slots("m") == []
    assert store.get_run("r1") is not None


def test_find_runs_by_prefix(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "p.db")
    store.add_machine(Machine("m", "local"))
    store.add_slot(Slot("m", "s", "command", 3))
    for rid in ("R1A", "R1B", "R2A"):
        store.reserve(run_id=rid, machine="m", slot="s", capacity=3, tool="command",
                      workdir=None, holder=("h", 1, 1, "b"))
    assert [r.id for r in store.find_runs("R2")] == ["R2A"]
    assert len(store.find_runs("R1")) == 2
    assert store.find_runs("X") == []
    # LIKE wildcards in the prefix are not wildcards
    assert store.find_runs("R_A") == []


# -- machines and slots ---------------------------------------------------------------

def test_machines_round_trip_in_name_order(store: Store) -> None:
    far = Machine("far", "ssh", "agent", "10.0.0.5", 2222, "/k", "ssh-ed25519 AAAA", "t1")
    assert store.add_machine(Machine("m", "local", created_at="t0"))
    assert store.add_machine(far)
    assert store.get_machine("far") == far
    assert store.get_machine("ghost") is None
    assert [m.name for m in store.list_machines()] == ["far", "m"]


def test_a_machine_without_a_creation_time_gets_now(store: Store) -> None:
    store.add_machine(Machine("m", "local"))
    got = store.get_machine("m")
    assert got is not None and got.created_at.startswith("20") and got.created_at.endswith("Z")


def test_remove_machine_takes_its_slots_and_facts_and_says_whether_it_was_there(store: Store) -> None:
    _machine_and_slot(store)
    store.put_fact(Fact("m", "landlock", "{}", "t", "sig"))
    assert store.remove_machine("m")
    assert store.list_facts("m") == [] and store.list_slots() == []
    assert not store.remove_machine("m")


def test_slot_settings_change_one_slot_and_report_a_missing_one(store: Store) -> None:
    _machine_and_slot(store)
    assert store.add_slot(Slot("m", "t", "codex", None))
    assert store.set_max_sessions("m", "s", 5)
    assert store.set_agent_pin("m", "s", "ab" * 32)
    got = store.get_slot("m", "s")
    assert got is not None and (got.max_sessions, got.agent_sha256) == (5, "ab" * 32)
    assert store.get_slot("m", "t").max_sessions is None  # type: ignore[union-attr]
    assert store.set_max_sessions("m", "s", None) and store.set_agent_pin("m", "s", None)
    assert store.get_slot("m", "s").capacity == 1  # type: ignore[union-attr]
    assert not store.set_max_sessions("m", "ghost", 2)
    assert not store.set_agent_pin("m", "ghost", None)
    assert store.get_slot("m", "ghost") is None
    assert [s.name for s in store.list_slots("m")] == ["s", "t"]


# -- the seat reservation -------------------------------------------------------------------

def test_reserve_takes_the_first_free_ordinal(store: Store) -> None:
    _machine_and_slot(store)
    assert [_reserve(store, r) for r in ("a", "b", "c", "d")] == [0, 1, 2, None]
    store.finalize("b", state="ended", outcome="exited")
    assert _reserve(store, "e") == 1
    assert [(r.id, r.session_ordinal) for r in store.live_runs("m", "s")] == [
        ("a", 0), ("e", 1), ("c", 2)]


def test_a_reserved_row_names_its_holder_and_request(store: Store) -> None:
    _machine_and_slot(store)
    store.reserve(run_id="a", machine="m", slot="s", capacity=1, tool="codex", workdir="/w/x",
                  holder=("host", 42, 99, "boot"))
    r = store.get_run("a")
    assert r is not None
    assert (r.machine, r.slot, r.session_ordinal, r.state, r.tool, r.workdir) == (
        "m", "s", 0, "reserved", "codex", "/w/x")
    assert (r.holder_host, r.holder_pid, r.holder_start_ticks, r.holder_boot_id) == (
        "host", 42, 99, "boot")
    assert r.live and r.finished_at is None and r.outcome is None and r.record() == {}


def test_slots_are_separate_capacities(store: Store) -> None:
    _machine_and_slot(store, 1)
    store.add_slot(Slot("m", "s2", "command", 1))
    assert _reserve(store, "a", 1) == 0
    assert _reserve(store, "b", 1, slot="s2") == 0
    assert _reserve(store, "c", 1) is None


def test_a_run_lives_from_reserved_to_finalised_once(store: Store) -> None:
    _machine_and_slot(store)
    _reserve(store, "a")
    store.mark_running("a")
    assert store.get_run("a").state == "running"  # type: ignore[union-attr]
    store.set_holder("a", ("far", 7, 8, "boot2"))
    r = store.get_run("a")
    assert r is not None and (r.holder_host, r.holder_pid, r.holder_start_ticks, r.holder_boot_id) == (
        "far", 7, 8, "boot2")
    assert store.finalize("a", state="ended", outcome="exited", exit_code=3, record_json='{"x": 1}',
                          finished_at="2030-01-01T00:00:00Z")
    assert not store.finalize("a", state="ended", outcome="killed")
    r = store.get_run("a")
    assert r is not None and not r.live
    assert (r.state, r.outcome, r.exit_code, r.finished_at, r.record()) == (
        "ended", "exited", 3, "2030-01-01T00:00:00Z", {"x": 1})
    # a finished run's holder and state no longer change
    store.set_holder("a", ("x", 1, 1, "b"))
    store.mark_running("a")
    r2 = store.get_run("a")
    assert r2 is not None and r2.holder_host == "far" and r2.state == "ended"
    store.set_record("a", '{"y": 2}')
    assert store.get_run("a").record() == {"y": 2}  # type: ignore[union-attr]


def test_a_refused_run_is_born_finished_outside_the_seats(store: Store) -> None:
    _machine_and_slot(store, 1)
    assert _reserve(store, "a", 1) == 0
    store.insert_refused_run(run_id="r", machine="m", slot="s", tool="command", workdir="/w",
                             holder=HOLDER, refusal_class="seat-full", record_json='{"r": 1}',
                             at="2030-01-01T00:00:00Z")
    r = store.get_run("r")
    assert r is not None
    assert (r.session_ordinal, r.state, r.outcome, r.refusal_class, r.started_at, r.finished_at) == (
        -1, "refused", "refused", "seat-full", "2030-01-01T00:00:00Z", "2030-01-01T00:00:00Z")
    assert [x.id for x in store.live_runs("m", "s")] == ["a"]


# -- reading runs ------------------------------------------------------------------------------

def test_runs_are_listed_newest_first_with_a_limit(store: Store) -> None:
    _machine_and_slot(store, 1)
    for i, rid in enumerate(("R1", "R2", "R3")):
        store.insert_refused_run(run_id=rid, machine="m", slot="s", tool="command", workdir=None,
                                 holder=HOLDER, refusal_class="seat-full", record_json="{}",
                                 at=f"2030-01-0{i + 1}T00:00:00Z")
    assert [r.id for r in store.list_runs()] == ["R3", "R2", "R1"]
    assert [r.id for r in store.list_runs(limit=2)] == ["R3", "R2"]
    assert store.last_run().id == "R3"  # type: ignore[union-attr]
    assert [r.id for r in store.runs_on_slot("m", "s")] == ["R1", "R2", "R3"]
    assert store.runs_on_slot("m", "other") == []


def test_runs_listing_filters_and_pages_by_cursor(store: Store) -> None:
    _machine_and_slot(store, 1)
    tools = ("command", "claude", "codex")
    for i in range(9):
        # two runs share each start time: the cursor breaks the tie by id
        store.insert_refused_run(run_id=f"R{i}", machine="m", slot="s", tool=tools[i % 3],
                                 workdir=None, holder=HOLDER, refusal_class="seat-full",
                                 record_json="{}", at=f"2030-01-0{i // 2 + 1}T00:00:00Z")
    newest = [r.id for r in store.list_runs(100)]
    assert newest == ["R8", "R7", "R6", "R5", "R4", "R3", "R2", "R1", "R0"]
    pages, before = [], None
    while True:
        page = store.list_runs(2, before=before)
        if not page:
            break
        pages.append([r.id for r in page])
        before = (page[-1].started_at, page[-1].id)
    assert [rid for page in pages for rid in page] == newest  # every run once, in order, across the pages
    assert [r.id for r in store.list_runs(10, tool="claude")] == ["R7", "R4", "R1"]
    assert [r.id for r in store.list_runs(10, tool="claude", before=("2030-01-03T00:00:00Z",
                                                                      "R5"))] == ["R4", "R1"]
    assert [r.id for r in store.list_runs(10, tool="codex", outcome="refused", machine="m",
                                          slot="s", state="refused")] == ["R8", "R5", "R2"]
    assert store.list_runs(10, tool="loop") == []
    assert store.list_runs(10, live=True) == []
    assert [r.id for r in store.list_runs(10, since="2030-01-05")] == ["R8"]


def test_no_runs_yet(store: Store) -> None:
    assert store.last_run() is None and store.list_runs() == [] and store.find_runs("") == []


def test_prefix_search_escapes_every_wildcard(store: Store) -> None:
    _machine_and_slot(store)
    for rid in ("A%B", "A_C", "A!D"):
        _reserve(store, rid)
    assert [r.id for r in store.find_runs("A%")] == ["A%B"]
    assert [r.id for r in store.find_runs("A_")] == ["A_C"]
    assert [r.id for r in store.find_runs("A!")] == ["A!D"]
    assert len(store.find_runs("A")) == 2  # at most two: enough to call a prefix ambiguous


# -- signed facts --------------------------------------------------------------------------------

def test_a_fact_is_stored_replaced_and_listed_by_kind(store: Store) -> None:
    store.add_machine(Machine("m", "local"))
    store.put_fact(Fact("m", "landlock", '{"level":5}', "t1", "s1"))
    store.put_fact(Fact("m", "launcher", '{"sha256":"ab"}', "t2", "s2"))
    store.put_fact(Fact("m", "landlock", '{"level":7}', "t3", "s3"))
    assert store.get_fact("m", "landlock") == Fact("m", "landlock", '{"level":7}', "t3", "s3")
    assert store.get_fact("m", "container") is None
    assert [f.kind for f in store.list_facts("m")] == ["landlock", "launcher"]


def test_the_store_describes_itself_and_closes(database_url: str, tmp_path: Path) -> None:
    store = open_store(database_url, tmp_path / "x.db")
    assert store.description == store.db.description
    if database_url.startswith("sqlite"):
        assert store.description.startswith("sqlite:///")
        assert store.description.endswith(str(tmp_path / "store.db"))
    store.close()


def test_every_live_run_on_every_slot_and_a_reopened_connection(store: Store) -> None:
    """all_live_runs: what reconciliation reads (live rows only, every slot);
    reopen: a new connection that sees the same store."""
    _machine_and_slot(store)
    assert store.add_slot(Slot("m", "t", "command", 1))
    assert store.all_live_runs() == []
    _reserve(store, "a")
    _reserve(store, "b", slot="t", capacity=1)
    _reserve(store, "c")
    store.finalize("c", state="ended", outcome="exited", exit_code=0)
    assert sorted(r.id for r in store.all_live_runs()) == ["a", "b"]
    store.reopen()
    assert sorted(r.id for r in store.all_live_runs()) == ["a", "b"]
    assert store.finalize("a", state="ended", outcome="exited", exit_code=0)
    assert [r.id for r in store.all_live_runs()] == ["b"]


# -- labels -------------------------------------------------------------------------

def test_labels_are_set_replaced_removed_and_listed(store: Store) -> None:
    _machine_and_slot(store)
    assert store.labels() == {}
    store.set_label("m", "", "zone", "eu")
    store.set_label("m", "s", "zone", "us")
    store.set_label("m", "s", "gpu", "a100")
    store.set_label("m", "s", "gpu", "h100")  # the same key again: its value replaced
    assert store.labels() == {("m", ""): {"zone": "eu"}, ("m", "s"): {"gpu": "h100", "zone": "us"}}
    assert list(store.labels()[("m", "s")]) == ["gpu", "zone"]
    assert store.remove_label("m", "s", "gpu")
    assert not store.remove_label("m", "s", "gpu")
    assert not store.remove_label("m", "", "gpu")
    assert store.labels() == {("m", ""): {"zone": "eu"}, ("m", "s"): {"zone": "us"}}


def test_removing_a_slot_or_machine_removes_its_labels(store: Store) -> None:
    _machine_and_slot(store)
    assert store.add_slot(Slot("m", "t", "command", None))
    assert store.add_machine(Machine("n", "local"))
    assert store.add_slot(Slot("n", "s", "command", None))
    for machine, slot in (("m", ""), ("m", "s"), ("m", "t"), ("n", ""), ("n", "s")):
        store.set_label(machine, slot, "k", f"{machine}/{slot}")
    assert store.remove_slot("m", "s")
    assert set(store.labels()) == {("m", ""), ("m", "t"), ("n", ""), ("n", "s")}
    assert store.remove_machine("m")  # the foreign key holds: its labels went first
    assert store.labels() == {("n", ""): {"k": "n/"}, ("n", "s"): {"k": "n/s"}}
    assert not store.remove_slot("m", "t")
