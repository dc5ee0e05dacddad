"""Cast: which slots of the fleet may take a run of a tool, in what order.

A candidate is every slot of the tool whose machine can give the run its
boundary, judged from signed rows before anything is dialled, and that
matches the order's labels (fleet/labels.py: a slot's label overrides its
machine's) and its image:

    local machine   bubblewrap found in the trusted directories (Linux), or
                    sandbox-exec (macOS) — the boundary every local run gets
    SSH machine     a verified Landlock row at or above the floor
                    (confine/landlock_gate.py) and a verified delivered
                    launcher row (fleet/delivery.py)
    --image DIGEST  a verified ``docker-oci`` row for exactly that digest,
                    measured within ``[cast] image_fresh_seconds`` of now
                    (fleet/containers.py): a routing fact, never a boundary

Ranking (deterministic, documented in docs/fleet.md): local machines before
SSH machines (no dial before the seat), then by machine name, then by slot
name. No count is ever read: the database decides, by trying the
reservation on each candidate in this order (run/pipeline.py).

Everything passed over is kept with why, for the record and the refusal.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saphan.errors import UserError
from saphan.refusals import Refusal

if TYPE_CHECKING:
    from saphan.context import Context
    from saphan.fleet.facts import FactReader
    from saphan.store.rows import Machine, Slot

RANKING = "local machines first, then by machine name, then by slot name"


@dataclass(frozen=True)
class Candidate:
    machine: Machine
    slot: Slot

    @property
    def name(self) -> str:
        return f"{self.machine.name}/{self.slot.name}"


@dataclass
class Cast:
    """The order (tool, labels, image, machine) and what it found."""

    tool: str
    labels: Mapping[str, str]
    image: str | None
    machine: str | None
    eligible: list[Candidate] = field(default_factory=list)
    #: {"machine", "slot", "why"} for every slot of the tool not eligible
    passed_over: list[dict[str, str]] = field(default_factory=list)
    image_fresh_seconds: int | None = None

    def as_record(self) -> dict[str, Any]:
        return {
            "tool": self.tool, "labels": dict(self.labels), "image": self.image,
            "machine": self.machine, "ranking": RANKING,
            "candidates": [c.name for c in self.eligible],
            "passed_over": list(self.passed_over),
            **({"image_fresh_seconds": self.image_fresh_seconds,
                "image_note": "eligibility by image is a routing fact, not confinement: the "
                              "run does not execute inside a container"}
               if self.image is not None else {}),
        }


def candidates(ctx: Context, tool: str, *, machine: str | None = None,
               labels: Mapping[str, str] | None = None, image: str | None = None) -> Cast:
    """Every slot of ``tool`` (on ``machine``, when named), eligible or passed
    over with why, ranked (module docstring)."""
    from saphan.fleet import labels as labels_mod
    from saphan.tools import TOOLS

    if tool not in TOOLS:
        raise UserError(f"--tool {tool!r} is unknown; choose one of {', '.join(TOOLS)}")
    wanted = dict(labels or {})
    found = Cast(tool, wanted, image, machine)
    machines = {m.name: m for m in ctx.machines()}
    if machine is not None and machine not in machines:
        raise UserError(f"machine {machine!r} is not known (`saphan machine list`)")
    if image is not None:
        from saphan.fleet import containers

        containers.check_digest(image)
        found.image_fresh_seconds = containers.fresh_seconds(ctx.config)
    every_label = labels_mod.all_labels(ctx)
    gates: dict[str, str | None] = {}
    read = _fact_reader(ctx)
    slots = [s for s in ctx.store.list_slots(machine) if s.tool == tool]
    for s in sorted(slots, key=lambda s: (machines[s.machine].transport != "local",
                                          s.machine, s.name)):
        m = machines[s.machine]
        if m.name not in gates:
            gates[m.name] = _machine_gate(read, m, image, found.image_fresh_seconds)
        why = gates[m.name]
        if why is None:
            unmet = labels_mod.matches(
                labels_mod.effective(every_label.get((m.name, ""), {}),
                                     every_label.get((m.name, s.name), {})), wanted)
            why = "labels: " + "; ".join(unmet) if unmet else None
        if why is None:
            found.eligible.append(Candidate(m, s))
        else:
            found.passed_over.append({"machine": m.name, "slot": s.name, "why": why})
    return found


def _fact_reader(ctx: Context) -> FactReader:
    """Verified facts for this cast: the record key read once (its custody
    checked), the machine rows the cast already holds."""
    from saphan.fleet import facts

    key, home, store = ctx.record_key(), ctx.workspace.home, ctx.store

    def read(m: Machine, kind: str) -> tuple[dict[str, Any], str] | None:
        return facts.read(store, key, home, m, kind)
    return read


def _machine_gate(read: FactReader, m: Machine, image: str | None,
                  fresh: int | None) -> str | None:
    """Why ``m`` cannot take a run (None: it can), from signed rows only."""
    try:
        if m.transport == "local":
            why = _local_boundary()
        else:
            from saphan.confine.landlock_gate import FACT_KIND, gate_row
            from saphan.site.far import FACT_KIND as LAUNCHER

            gate_row(m.name, read(m, FACT_KIND))
            why = (None if read(m, LAUNCHER) is not None else
                   "no delivered saphan-launcher is recorded (`saphan machine deliver "
                   f"{m.name} --probe`)")
        if why is None and image is not None:
            from saphan.fleet import containers

            why = containers.ineligible(read, m, image, fresh or 0)
    except Refusal as r:
        return f"[{r.cls}] {r.message}"
    return why


def _local_boundary() -> str | None:
    from saphan.confine import trusted

    system = platform.system()
    if system == "Linux":
        return None if trusted.find("bwrap") else (
            "no bubblewrap in the trusted directories (`apt-get install bubblewrap`)")
    if system == "Darwin":
        return None if trusted.find("sandbox-exec") else "no sandbox-exec"
    return f"no boundary on this operating system ({system})"


def refusal(found: Cast, full: Sequence[dict[str, str]]) -> Refusal:
    """``fleet-full`` when some candidate was at capacity, else
    ``no-eligible-slot``; the message names each slot and why."""
    from saphan import refusals

    what = f"tool {found.tool}" + "".join(
        f", {k}={v}" for k, v in sorted(found.labels.items())) + (
        f", image {found.image}" if found.image else "") + (
        f", machine {found.machine}" if found.machine else "")
    every = [*full, *found.passed_over]
    listed = "; ".join(f"{p['machine']}/{p['slot']}: {p['why']}" for p in every) or (
        f"no slot of tool {found.tool} exists"
        + (f" on machine {found.machine}" if found.machine else "") + " (`saphan slot list`)")
    if full:
        return refusals.fleet_full(
            f"every candidate for {what} is at capacity: {listed}",
            "wait for a seat (`saphan run --wait[=SECS]`), add seats (`saphan slot set M S "
            "--max-sessions N`) or slots, or end a run (`saphan runs cancel ID`)")
    if found.image is not None and found.passed_over and all(
            p["why"].startswith("image: ") for p in found.passed_over):
        from saphan.fleet import containers

        return containers.refusal(found.image, found.passed_over)
    if found.passed_over and all(p["why"].startswith("[record-signature-invalid]")
                                 for p in found.passed_over):
        # every slot was kept out by a row that does not verify: that is the refusal
        return refusals.record_signature_invalid(
            f"no slot can take a run of {what}: the rows it needed do not verify: {listed}",
            "investigate who can write the store; then measure again (`saphan machine "
            "probe-confinement M`, `machine deliver M --probe`, `machine probe-container M "
            "--image REF@DIGEST`)")
    return refusals.no_eligible_slot(
        f"no slot can take a run of {what}: {listed}",
        "add a slot of that tool (`saphan slot add M S --tool T`) on a machine that can give "
        "its boundary (`saphan machine deliver M --probe` for an SSH machine), or change the "
        "labels asked for (`saphan machine list`, `saphan slot list` show them)")
