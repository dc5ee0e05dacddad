"""A run's record as text: what `saphan runs show` prints, and the
dashboard's run page shows (serve/).

    record_lines(record)   one line per item: the flag first when the record
                           does not verify, then run, machine, tool, what
                           enforced, the writable set, the outcome or the
                           refusal with its fix, notes, the signature

Every line is made printable (confine/protected.printable): a record holds
what a run chose — names, its output, a loop's words — so no field can make
a line of its own (a forged "signature: valid"), and no byte of it drives a
terminal. The caller catches KeyError/TypeError/AttributeError/IndexError for
a record that does not verify and so need not have the shape saphan writes
(ValueError too: a string where a number was).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saphan.records import RunRecord


def _cell(value: object) -> str:
    """A value for text output: ``-`` when there is none (never ``None``)."""
    return "-" if value is None or value == "" else str(value)


def record_lines(record: RunRecord) -> list[str]:
    """The record as `saphan runs show` prints it, one line per item (module docstring)."""
    from saphan.confine.protected import printable
    from saphan.records import INVALID_HEADLINE, MISSING_HEADLINE

    out: list[str] = []

    def echo(text: object) -> None:
        # A record holds what a run chose (names, its output, a loop's words):
        # one line per field, control characters and newlines escaped, so no
        # field can print a line of its own (a forged "signature: valid").
        out.append(printable(str(text)))

    d = record.data
    verified = d.get("signature") or {}
    if record.signature_flagged:
        echo(INVALID_HEADLINE if record.signature == "invalid" else MISSING_HEADLINE)
        echo(f"  why:       {verified.get('message')}")
        for m in verified.get("mismatched") or []:
            echo(f"  mismatch:  {m['column']}: row {m['row']!r}, signed {m['signed']!r}")
        echo(f"  fix:       {verified.get('remediation')}")
    elif record.signature == "foreign":
        echo(f"signed by key {verified.get('key_id')}, not held here: this record is not "
             "verified here (and not invalid)")
        echo(f"  why:       {verified.get('message')}")
        echo(f"  fix:       {verified.get('remediation')}")
    enforced = d.get("enforced_by")
    echo(f"run:         {d['id']}")
    echo(f"machine:     {d['machine']}  slot: {d['slot']}  ordinal: {_cell(d.get('session_ordinal'))}")
    argv = d.get("argv")
    if isinstance(argv, list) and len(argv) > 3 and argv[1] == "-c" \
            and argv[3] == "saphan-measure-base":
        # the driver's script is in the record (--json); its parameters show
        argv = [argv[0], "-c", "<the measure-base driver>", *argv[3:]]
    echo(f"tool:        {_cell(d.get('tool'))}  argv: {json.dumps(argv, sort_keys=True)}")
    echo(f"workdir:     {_cell(d.get('workdir'))}")
    if d.get("worktree"):
        w = d["worktree"]
        echo(f"worktree:    {w['path']} on {w['branch']} from {w['base'][:12]} "
                   f"({'kept' if w.get('kept') else 'removed'}; head {_cell(w.get('head_after'))[:12]})")
    if enforced:
        echo(f"enforced_by: {enforced['mechanism']} {enforced['version']} "
                   f"({enforced['executable']} sha256:{enforced['executable_sha256']})")
        if enforced.get("confirmation"):
            echo(f"confirmed:   {enforced['confirmation']}")
        if enforced.get("read_denials_and_carve_outs_by"):
            outer = enforced["read_denials_and_carve_outs_by"]
            echo(f"read denials by: {outer['mechanism']} {outer['version']}")
    elif d.get("live") is not None:
        echo("enforced_by: - (the run holds its seat; its boundary is not composed yet)")
    else:
        echo("enforced_by: nothing (the run did not start)")
    for line in (enforced or {}).get("pinned_settings") or []:
        echo(f"pinned:      {line}")
    if d.get("tool_policy"):
        echo(f"policy:      permission mode {d['tool_policy']['permission_mode']} "
                   "(the tool's own policy, not a boundary)")
    if d.get("resumes"):
        echo(f"resumes:     run {d['resumes']['run']} (session {d['resumes']['session']})")
    if d.get("lane"):
        lane = d["lane"]
        echo(f"lane:        {lane['name']}: {lane['model']} at {lane['base_url']} (key on a "
                   f"pipe; ${lane['credential_env']} scrubbed)")
    if d.get("loop"):
        loop = d["loop"] if isinstance(d["loop"], dict) else {}
        # written by the run (its result file): shown escaped, never trusted for shape
        got_tokens = loop.get("tokens")
        tokens: dict[str, Any] = got_tokens if isinstance(got_tokens, dict) else {}
        echo(f"loop:        {loop.get('end')} after {loop.get('turns')} turn(s), "
                   f"{loop.get('tool_calls')} tool call(s), {tokens.get('total', 0)} tokens, "
                   f"{loop.get('redactions')} redaction(s): {loop.get('detail')}")
        echo(f"transcript:  {loop.get('transcript')}")
    if isinstance(d.get("usage"), dict):
        from saphan.tools.usage import summary

        echo(f"model:       {d.get('model')}  (pinned)" if d.get("model") else "model:       -")
        echo(f"usage:       {summary(d['usage'])}")
    if d.get("network"):
        echo(f"network:     {d['network']}")
    egress = d.get("egress")
    if isinstance(egress, dict):
        door = (egress.get("door") or {}).get("summary") or {}
        if door:
            echo(f"door:        {door.get('requests', 0)} request(s), "
                 f"{door.get('allowed', 0)} allowed, {door.get('denied', 0)} denied; "
                 f"audit: {door.get('audit_log')}")
            for host in door.get("denied_hosts") or []:
                echo(f"denied:      {host}")
        if egress.get("agent_credential"):
            echo(f"credential:  {egress['agent_credential']}")
    for path in d.get("writable") or []:
        echo(f"writable:    {path}")
    for path in (d.get("policy") or {}).get("read_denials", []):
        echo(f"unreadable:  {path}")
    echo(f"started:     {_cell(d.get('started_at'))}")
    live = d.get("live")
    if live is not None:
        holder, life = live.get("holder") or {}, live.get("liveness") or {}
        echo(f"holder:      pid {_cell(holder.get('pid'))} on {_cell(holder.get('host'))} "
             f"({life.get('state', 'unknown')}: {life.get('evidence', 'not read')})")
        echo(f"finished:    - (live: {d.get('state')})")
    else:
        echo(f"finished:    {_cell(d.get('finished_at'))}")
    from saphan.run.end import signal_text

    echo(f"outcome:     {d.get('outcome') or '-'}  exit: {signal_text(d.get('exit_code'))}")
    if d.get("refusal"):
        echo(f"refusal:     [{d['refusal']['class']}] {d['refusal']['message']}")
        if d["refusal"].get("remediation"):
            echo(f"fix:         {d['refusal']['remediation']}")
    for change in d.get("protected_changes") or []:
        echo(f"protected:   {change.get('name')} ({change.get('what')})")
    imported = (d.get("worktree") or {}).get("import") or {}
    if imported:
        why = f": {imported['why']}" if imported.get("why") else ""
        echo(f"import:      {imported.get('result')} onto {imported.get('branch')}{why}")
    for note in d.get("notes") or []:
        echo(f"note:        {note}")
    if isinstance(d.get("measure"), dict) and "result" in d["measure"]:
        from saphan.measure.report import lines as measure_lines

        for line in measure_lines(d["measure"]):
            echo(line)
    if record.signature == "valid":
        echo("signature:   valid (HMAC-SHA256 with the workspace record key; the row's "
                   "columns match)")
    elif record.signature == "pending":
        echo("signature:   pending (a live run: its record is signed when it ends)")
    elif record.signature == "foreign":
        echo(f"signature:   FOREIGN: signed by key {verified.get('key_id')}, not held here "
             "(see the first line)")
    else:
        echo(f"signature:   {record.signature.upper()} (see the first line)")
    return out
