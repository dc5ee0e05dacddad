"""What an operator sees of a batch: a live view while it works (rich, on a
terminal), one line per change otherwise (on stderr), and the summary table.

Everything shown that a task, a run or a far machine could have chosen
(an error, a command line) is escaped to printable text and never read as
markup (rich ``Text``, not markup strings).
"""

from __future__ import annotations

import contextlib
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from saphan.confine.protected import printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from saphan.batch.worker import Event
    from saphan.context import Context

#: the finished tasks the live view keeps under the running ones
RECENT = 5


class Display:
    """Told each worker Event; draws the batch (``live``: a rich Live view on
    stdout) or writes a line per event on stderr."""

    def __init__(self, ctx: Context, batch_id: str, *, live: bool):
        from saphan.batch.api import record_key_or_none, task_view

        self.ctx, self.batch_id, self.live = ctx, batch_id, live
        self.key = record_key_or_none(ctx)
        self.rows: dict[int, dict[str, Any]] = {
            t.seq: task_view(ctx, t, key=self.key) for t in ctx.store.batch_tasks(batch_id)}
        self.recent: list[int] = []
        self._live: Any = None

    def __enter__(self) -> Display:
        if self.live:
            from rich.live import Live

            self._live = Live(get_renderable=self.render, refresh_per_second=4,
                              redirect_stderr=False, transient=False)
            self._live.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            with contextlib.suppress(OSError):  # the terminal is gone (SIGHUP)
                self._live.refresh()
                self._live.stop()

    def event(self, e: Event) -> None:
        from saphan.batch.api import task_view

        t = self.ctx.store.get_task(e.task.batch, e.task.seq) or e.task
        row = e.run if e.run is None or e.run.id == t.run_id else None
        view = task_view(self.ctx, t, row, key=self.key)
        if view["run_id"] is None and e.task.run_id is not None:
            view["last_run"] = e.task.run_id
        self.rows[t.seq] = view
        if e.kind in ("done", "requeued") and t.seq not in self.recent[-RECENT:]:
            self.recent = [*self.recent, t.seq][-RECENT:]
        if not self.live:
            with contextlib.suppress(OSError):  # the terminal is gone (SIGHUP)
                sys.stderr.write(printable(line(e.kind, view, e.note)) + "\n")
                sys.stderr.flush()

    def render(self) -> RenderableType:
        from rich.console import Group
        from rich.text import Text

        running = [v for v in self.rows.values() if v["state"] == "claimed"]
        recent = [self.rows[s] for s in self.recent if self.rows[s]["state"] != "claimed"]
        head = Text(printable(f"batch {self.batch_id}: {counts(self.rows.values())}"))
        parts: list[RenderableType] = [head, table(running, title="running")]
        if recent:
            parts.append(table(recent, title="just finished"))
        return Group(*parts)


def counts(views: Any) -> str:
    states: dict[str, int] = {}
    for v in views:
        key = v["state"] if v["state"] != "done" else (v["outcome"] or "done")
        states[key] = states.get(key, 0) + 1
    order = ["pending", "claimed", *sorted(k for k in states if k not in ("pending", "claimed"))]
    return ", ".join(f"{k} {states[k]}" for k in order if k in states)


def line(kind: str, v: dict[str, Any], note: str = "") -> str:
    """One change to one task, as a line."""
    run = v["run_id"] or v.get("last_run") or "-"
    where = f" on {v['machine']}/{v['slot']}" if v["machine"] else ""
    if kind == "claimed":
        text = f"claimed (run {run})"
    elif kind == "seated":
        text = f"running{where} (run {run})" if v["state"] == "claimed" else f"run {run}{where}"
    elif kind == "done" and v["machine"] is None:
        text = f"{v['outcome']}: no run was made"
    elif kind == "done":
        how = (f"[{v['refusal_class']}]" if v.get("refusal_class")
               else f"(exit {v['exit_code']})")
        text = (f"{v['outcome']} {how}{where} in {_secs(v)}"
                f"{_usage(v)} (run {run})")
    elif kind == "requeued":
        text = f"back to pending (run {run})"
    else:
        text = f"{kind} (run {run})"
    if v.get("signature") not in (None, "valid", "pending"):
        text += f"; its record is !{v['signature']} (not believed)"
    return f"task {v['id']}: {text}" + (f": {note}" if note else "")


HEADERS = ("task", "state", "machine/slot", "elapsed", "tokens", "cost", "outcome", "run",
           "note")


def cells(v: dict[str, Any]) -> list[str]:
    """One task's cells, each one word but the last (``awk`` keeps columns)."""
    where = f"{v['machine']}/{v['slot']}" if v["machine"] else "-"
    if v["outcome"] is None:
        outcome = "-"
    elif v.get("refusal_class"):
        outcome = f"{v['outcome']}:{v['refusal_class']}"
    else:
        outcome = f"{v['outcome']}:{'-' if v['exit_code'] is None else v['exit_code']}"
    if v.get("signature") not in (None, "valid", "pending"):
        outcome = f"!{v['signature']}:{outcome}"  # as `runs list` flags it
    tokens, cost = _usage_cells(v)
    state = v["state"] if v["state"] != "claimed" or v["machine"] else "waiting"
    note = v.get("error") or ""
    return [printable(str(c)) for c in (v["id"], state, where, _secs(v).replace(" ", ""),
                                        tokens, cost, outcome, v["run_id"] or "-", note)]


def table(views: list[dict[str, Any]], *, title: str | None = None) -> Any:
    """The tasks as a rich Table (every cell plain text, never markup)."""
    from rich.table import Table
    from rich.text import Text

    tab = Table(title=title, title_justify="left", expand=False)
    for name in HEADERS:
        tab.add_column(name, no_wrap=name != "note", min_width=24 if name == "note" else None,
                       overflow="fold")
    for v in views:
        tab.add_row(*(Text(c) for c in cells(v)))
    return tab


def summary(report: dict[str, Any], *, terminal: bool | None = None) -> None:
    """The batch's summary table on stdout: drawn by rich on a terminal,
    plain columns otherwise."""
    tty = sys.stdout.isatty() if terminal is None else terminal
    head = printable(f"batch {report['batch']}: {counts(report['tasks'])}")
    if tty:
        from rich.console import Console
        from rich.text import Text

        console = Console(highlight=False)
        console.print(table(report["tasks"]))
        console.print(Text(head))
        return
    rows = [cells(v) for v in report["tasks"]]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(HEADERS)]
    out = ["  ".join(h.upper().ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    sys.stdout.write("\n".join([*out, head]) + "\n")


def _secs(v: dict[str, Any]) -> str:
    s = v.get("elapsed_seconds")
    if v.get("started_at") and v["state"] == "claimed":  # still going: now
        from saphan.batch.api import elapsed

        s = elapsed(v["started_at"], None)
    return "-" if s is None else f"{s:.1f} s"


def _usage_cells(v: dict[str, Any]) -> tuple[str, str]:
    u = v.get("usage")
    if not isinstance(u, dict):
        return "-", "-"
    tokens = u.get("tokens")
    total = (sum(x for x in tokens.values() if isinstance(x, int))
             if isinstance(tokens, dict) else None)
    cost = u.get("cost_usd")
    return ("-" if not total else str(total),
            f"${cost:.4f}" if isinstance(cost, (int, float)) else "-")


def _usage(v: dict[str, Any]) -> str:
    tokens, cost = _usage_cells(v)
    return "" if tokens == "-" and cost == "-" else f", {tokens} tokens, {cost}"
