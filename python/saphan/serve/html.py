"""The dashboard's pages: server-rendered HTML, every value escaped.

Each page is a function from what serve/reader.py read to a string; every
value goes through :func:`esc` (``html.escape``, quotes too) and every link
is built from checked parameters (serve/params.py) with ``urlencode``. The
one script (:data:`SCRIPT`) and style sheet (:data:`STYLE`) are constants
served at /static/…: the Content-Security-Policy (serve/app.py) allows no
inline script or style, so even a string that escaped escaping could not run.

What the script does, and all it does: a region marked ``data-poll`` is
fetched again every :data:`POLL_MS` and replaced by the server's HTML for
it (escaped there); a ``data-tail`` block appends a run's output as text
nodes (inert: never parsed as HTML) until the run has ended and all of it
was read.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

POLL_MS = 2000
#: the most of a run's output the page keeps (characters; older text is dropped)
TAIL_KEEP = 512 * 1024


def esc(value: object) -> str:
    """``value`` as HTML text: ``-`` for None or empty."""
    if value is None or value == "":
        return "-"
    return html.escape(str(value), quote=True)


def url(path: str, query: Mapping[str, str] | None = None) -> str:
    """A link to ``path`` (built from checked parts) with ``query``, escaped for an attribute."""
    return esc(path + ("?" + urlencode(query) if query else ""))


def run_href(run_id: object) -> str:
    """The link to a run's page (its id as the store has it, percent-encoded)."""
    return url("/run/" + quote(str(run_id), safe=""))


def page(title: str, body: str, *, active: str, store: str) -> str:
    on = ' class="on"'
    nav = "".join(f'<a href="{href}"{on if name == active else ""}>{name}</a>'
                  for name, href in (("fleet", "/"), ("runs", "/runs"), ("batches", "/batches")))
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<meta name=\"referrer\" content=\"no-referrer\">"
        f"<title>{esc(title)} · saphan</title>"
        "<link rel=\"stylesheet\" href=\"/static/saphan.css\">"
        "<script src=\"/static/saphan.js\" defer></script></head><body>"
        f"<header><strong>saphan</strong><nav>{nav}</nav>"
        f"<span class=\"store\">read-only · {esc(store)}</span></header>"
        f"<main>{body}</main></body></html>\n")


def table(headers: Sequence[str], rows: Iterable[str], *, tbody_attrs: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return (f"<table><thead><tr>{head}</tr></thead>"
            f"<tbody{tbody_attrs}>{''.join(rows)}</tbody></table>")


def _badge(status: str) -> str:
    kind = {"valid": "ok", "pending": "info"}.get(status, "bad")
    return f'<span class="badge {kind}" data-signature="{esc(status)}">{esc(status)}</span>'


def _labels(labels: Mapping[str, str]) -> str:
    return " ".join(f"<code>{esc(k)}={esc(v)}</code>" for k, v in sorted(labels.items())) or "-"


# -- fleet ---------------------------------------------------------------------------------------

def fleet_page(data: Mapping[str, Any], store: str) -> str:
    body = (f'<h1>Fleet</h1><div data-poll="{url("/fleet/body")}">{fleet_body(data)}</div>')
    return page("fleet", body, active="fleet", store=store)


def fleet_body(data: Mapping[str, Any]) -> str:
    machines = data["machines"]
    if not machines:
        return ("<p>No machines yet: <code>saphan machine add NAME --local</code> "
                "(docs/fleet.md).</p>")
    parts = [f"<p>{len(machines)} machine(s), {data['live']} live run(s).</p>"]
    for m in machines:
        parts.append(
            f'<section class="machine" id="machine-{esc(m["name"])}">'
            f"<h2>{esc(m['name'])} <small>{esc(m['transport'])} · {esc(m['address'])}</small></h2>"
            f"<p>labels: {_labels(m['labels'])}</p>")
        facts = [
            f'<tr class="fact {esc(f["status"])}"><td>{esc(f["kind"])}</td>'
            f"<td>{_badge(f['status'])}</td>"
            f"<td>{esc(f['measured_at'])} <small>({esc(f['age'])})</small></td>"
            f"<td><code>{esc(f['summary'])}</code>"
            + (f"<div class=\"why\">{esc(f['message'])}</div>" if f.get("message") else "")
            + (f"<div class=\"fix\">fix: {esc(f['remediation'])}</div>"
               if f.get("remediation") else "")
            + "</td></tr>"
            for f in m["facts"]]
        parts.append("<h3>signed facts</h3>" + (
            table(["kind", "signature", "measured", "value"], facts) if facts
            else "<p>none measured (<code>saphan machine probe-confinement NAME</code>)</p>"))
        for s in m["slots"]:
            parts.append(
                f'<h3 class="slot">slot {esc(s["name"])} <small>tool {esc(s["tool"])} · '
                f"capacity {esc(s['capacity'])} · labels {_labels(s['labels'])}"
                + (f" · agent pin <code>{esc(s['agent_pin'][:16])}</code>" if s["agent_pin"]
                   else "") + "</small></h3>")
            parts.append(table(["ordinal", "seat", "run", "pid", "host", "since", "liveness"],
                               (_ordinal(m["name"], s["name"], o) for o in s["ordinals"])))
        if not m["slots"]:
            parts.append("<p>no slots (<code>saphan slot add</code>)</p>")
        parts.append("</section>")
    if data.get("stray"):
        parts.append(
            '<section class="stray"><h2>live rows on no seat shown above</h2>'
            "<p>The store holds these live rows on a machine or slot it does not list, or on "
            "no ordinal: not seats saphan made.</p>"
            + table(["run", "machine", "slot", "ordinal", "state"], (
                f'<tr class="flagged"><td><a href="{run_href(r["run"])}">{esc(r["run"])}'
                f"</a></td><td>{esc(r['machine'])}</td><td>{esc(r['slot'])}</td>"
                f"<td>{esc(r['ordinal'])}</td><td>{esc(r['state'])}</td></tr>"
                for r in data["stray"])) + "</section>")
    return "".join(parts)


def _ordinal(machine: str, slot: str, o: Mapping[str, Any]) -> str:
    over = " (over capacity)" if o["over_capacity"] else ""
    n = f'{o["ordinal"]}' if o["last"] == o["ordinal"] else f'{o["ordinal"]}..{o["last"]}'
    if not o["held"]:
        many = o["last"] - o["ordinal"] + 1
        what = "free" if many == 1 else f"free ({many:,} seats)"
        return (f'<tr class="seat free" data-ordinal="{esc(o["ordinal"])}"><td>{esc(n)}</td>'
                f"<td>{what}</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>")
    life = str(o["liveness"])
    backed = "" if o["backed"] else (
        ' <span class="badge bad" title="no live record signed here backs this row">'
        "row only</span>")
    return (
        f'<tr class="seat held{"" if o["backed"] else " flagged"}" '
        f'data-ordinal="{esc(o["ordinal"])}"><td>{esc(n)}</td>'
        f"<td>held{over} <small>({esc(o['state'])})</small>{backed}</td>"
        f'<td><a href="{run_href(o["run"])}">{esc(o["run"])}</a></td>'
        f"<td>{esc(o['pid'])}</td><td>{esc(o['host'])}</td><td>{esc(o['since'])}</td>"
        f'<td><span class="life {esc(life)}">{esc(life)}</span> '
        f"<small>{esc(o['evidence'])}</small></td></tr>")


# -- runs -------------------------------------------------------------------------------------

RUN_HEADERS = ["run", "machine", "slot", "ord", "tool", "started", "state", "outcome",
               "exit / refusal", "enforced", "usage", "signature"]


def runs_page(data: Mapping[str, Any], query: Mapping[str, str], choices: Mapping[str, Any],
              store: str) -> str:
    form = _filters_form(query, choices)
    live = "before" not in query  # the first page follows the store; older pages stay put
    poll = f' data-poll="{url("/runs/rows", query)}"' if live else ""
    body = (f"<h1>Runs</h1>{form}"
            + table(RUN_HEADERS, [run_rows(data)], tbody_attrs=f' id="runs"{poll}')
            + _pager(data, query))
    return page("runs", body, active="runs", store=store)


def run_rows(data: Mapping[str, Any]) -> str:
    rows = data["rows"]
    if not rows:
        return f'<tr><td colspan="{len(RUN_HEADERS)}">no runs match</td></tr>'
    return "".join(_run_row(r) for r in rows)


def _run_row(r: Mapping[str, Any]) -> str:
    alone = r["live"] and not r["backed"]
    flagged = " flagged" if r["flagged"] or alone else ""
    code = r["exit"] if r["exit"] is not None else r["refusal_class"]
    return (
        f'<tr class="run {esc(r["state"])}{flagged}" data-run="{esc(r["id"])}">'
        f'<td><a href="{run_href(r["id"])}">{esc(str(r["id"])[:14])}…</a></td>'
        f"<td>{esc(r['machine'])}</td><td>{esc(r['slot'])}</td><td>{esc(r['ordinal'])}</td>"
        f"<td>{esc(r['tool'])}</td><td>{esc(r['started_at'])}</td><td>{esc(r['state'])}</td>"
        f"<td>{esc(r['outcome'])}</td><td>{esc(code)}</td><td>{esc(r['enforced'])}</td>"
        f"<td>{esc(r['cost'])}</td><td>{_badge(r['signature'])}"
        + (' <span class="badge bad" title="no live record signed here backs this row">'
           "row only</span>" if alone else "") + "</td></tr>")


def _filters_form(query: Mapping[str, str], choices: Mapping[str, Any]) -> str:
    def select(name: str, options: Iterable[str]) -> str:
        chosen = query.get(name, "")
        opts = [f'<option value=""{"" if chosen else " selected"}>any {esc(name)}</option>']
        opts += [f'<option value="{esc(o)}"{" selected" if o == chosen else ""}>{esc(o)}</option>'
                 for o in options]
        return f'<label>{esc(name)} <select name="{esc(name)}">{"".join(opts)}</select></label>'

    fields = "".join(select(n, choices[n]) for n in ("state", "machine", "slot", "tool",
                                                       "outcome"))
    size = query.get("limit", "50")
    fields += ('<label>per page <select name="limit">' + "".join(
        f'<option value="{n}"{" selected" if str(n) == size else ""}>{n}</option>'
        for n in choices.get("limit", (50,))) + "</select></label>")
    return (f'<form class="filters" method="get" action="/runs">{fields}'
            '<button type="submit">filter</button> <a href="/runs">clear</a></form>')


def _pager(data: Mapping[str, Any], query: Mapping[str, str]) -> str:
    links = []
    if "before" in query:
        links.append(f'<a href="{url("/runs", {k: v for k, v in query.items() if k != "before"})}"'
                     ">newest</a>")
    if data["next"]:
        links.append(f'<a rel="next" href="{url("/runs", {**query, "before": data["next"]})}">'
                     "older →</a>")
    if data.get("blocked"):
        links.append(f'<span class="badge bad">{esc(data["blocked"])}</span>')
    return f'<p class="pager">{" · ".join(links)}</p>' if links else ""


# -- one run ---------------------------------------------------------------------------------

def run_page(run_id: str, data: Mapping[str, Any], store: str) -> str:
    r = data["row"]
    head = (f"<h1>Run <code>{esc(run_id)}</code> {_badge(r['signature'])}</h1>"
            f"<p>{esc(r['tool'])} on {esc(r['machine'])} / {esc(r['slot'])} · "
            f"state {esc(r['state'])} · outcome {esc(r['outcome'])}</p>")
    poll = f' data-poll="{url(f"/run/{run_id}/record")}"' if data["live"] else ""
    body = head + f'<div id="record"{poll}>{record_body(data)}</div>'
    for stream in ("stdout", "stderr"):
        tail = url(f"/run/{run_id}/output", {"stream": stream})
        body += (f"<h2>{stream}</h2><pre class=\"output\" id=\"{stream}\" data-tail=\"{tail}\" "
                 f"data-keep=\"{TAIL_KEEP}\"></pre>")
    body += _diff(data.get("diff"))
    return page(f"run {run_id}", body, active="runs", store=store)


def record_body(data: Mapping[str, Any]) -> str:
    parts = []
    sig = data["signature"] or {}
    if data["row"]["flagged"]:
        parts.append(
            f'<div class="flag" role="alert"><strong>{esc(sig.get("class") or "not verified")}'
            f"</strong>: {esc(sig.get('message'))}<br>fix: {esc(sig.get('remediation'))}</div>")
    refusal = data.get("refusal")
    if refusal:
        parts.append(
            f'<div class="refusal"><strong>refused [<span class="class">'
            f'{esc(refusal.get("class"))}</span>]</strong> {esc(refusal.get("message"))}'
            f'<div class="fix">fix: <span class="remediation">{esc(refusal.get("remediation"))}'
            "</span></div></div>")
    usage = data.get("usage")
    if usage:
        from saphan.tools.usage import summary

        try:
            text = summary(usage)
        except (TypeError, ValueError, AttributeError):
            text = "usage present but not in the shape saphan writes"
        parts.append(f'<p class="usage">usage: {esc(text)}</p>')
    note = "" if data["shaped"] else "<p>not in the shape saphan writes; as stored:</p>"
    cut = ('<p class="note">(cut: the record is larger than the page shows; '
           "<code>saphan runs show ID --json</code> has all of it)</p>") if data.get("cut") else ""
    parts.append(f'{note}<pre class="record">{esc(chr(10).join(data["lines"]))}</pre>{cut}')
    return "".join(parts)


def _diff(d: Any) -> str:
    if d is None:
        return ""
    from saphan.terminal import terminal_safe

    head = (f"<h2>diff <small>{esc((d.base or '')[:12])}..{esc((d.head or '')[:12])}, "
            "read from the main repository</small></h2>")
    note = f'<p class="note">{esc(d.note)}</p>' if d.note else ""
    if d.text is None:
        return head + note
    lines, in_hunk = [], False
    for line in terminal_safe(d.text).split("\n"):
        # (split on newline only: git's lines; U+2028 and the like are not line ends)
        # a hunk's + and - lines are its changes; outside a hunk (git's own
        # header lines) nothing is coloured, whatever a changed line starts with
        if line.startswith("diff --git "):
            in_hunk = False
        elif line.startswith("@@"):
            in_hunk = True
        kind = ("hunk" if line.startswith("@@") else
                "add" if in_hunk and line.startswith("+") else
                "del" if in_hunk and line.startswith("-") else "")
        lines.append(f'<span class="{kind}">{html.escape(line)}</span>' if kind
                     else html.escape(line))
    cut = "<p class=\"note\">(cut at the size limit)</p>" if d.truncated else ""
    return head + note + f'<pre class="diff">{chr(10).join(lines)}</pre>' + cut


# -- batches --------------------------------------------------------------------------------

def batches_page(items: Sequence[Mapping[str, Any]], store: str) -> str:
    rows = [
        f'<tr><td><a href="{url("/batch/" + str(b["id"]))}">{esc(b["id"])}</a></td>'
        f"<td>{esc(b['created_at'])}</td><td>{esc(b['source'])}</td><td>{esc(b['tasks'])}</td>"
        f"<td>{esc(', '.join(f'{k} {v}' for k, v in sorted(b['states'].items())))}"
        + (f' <span class="badge bad" title="task rows the workspace key did not sign">'
           f"{b['unverified']} task(s) !invalid</span>" if b["unverified"] else "")
        + "</td></tr>"
        for b in items]
    body = "<h1>Batches</h1>" + (
        table(["batch", "created", "file", "tasks", "states"], rows) if rows
        else "<p>No batches (<code>saphan batch run FILE</code>).</p>")
    return page("batches", body, active="batches", store=store)


def batch_page(batch_id: str, report: Mapping[str, Any], store: str) -> str:
    body = (f"<h1>Batch <code>{esc(batch_id)}</code></h1>"
            f'<div data-poll="{url(f"/batch/{batch_id}/body")}">{batch_body(report)}</div>')
    return page(f"batch {batch_id}", body, active="batches", store=store)


def batch_body(report: Mapping[str, Any]) -> str:
    tasks = report["tasks"]
    done = report["done_verified"]  # a task row that does not verify is not counted done
    states = ", ".join(f"{k} {v}" for k, v in sorted(report["states"].items()))
    rows = []
    from saphan.ids import is_run_id

    for t in tasks:
        run = t.get("run_id")
        link = (f'<a href="{run_href(run)}">{esc(run[:14])}…</a>'
                if isinstance(run, str) and is_run_id(run) else esc(run))
        forged = t.get("task_signature") != "valid"
        rows.append(
            f'<tr class="task {esc(t.get("state"))}{" flagged" if forged else ""}">'
            f"<td>{esc(t.get('seq'))}</td>"
            f"<td>{esc(t.get('id'))}"
            + (' <span class="badge bad" title="the task row does not verify under the '
               'workspace key: not a task saphan wrote">task !invalid</span>' if forged else "")
            + f"</td><td>{esc(t.get('what'))}</td>"
            f"<td>{esc(t.get('state'))}</td><td>{link}</td>"
            f"<td>{esc(t.get('machine'))}</td><td>{esc(t.get('outcome'))}</td>"
            f"<td>{esc(t.get('exit_code'))}</td><td>{_badge(str(t.get('signature')))}</td></tr>")
    return (f'<p>{esc(report["source"])} · <progress max="{len(tasks)}" value="{done}"></progress>'
            f" {done} of {len(tasks)} done and verified ({esc(states)})</p>"
            + table(["#", "task", "what", "state", "run", "machine", "outcome", "exit",
                     "signature"],
                    rows))


def error_page(status: int, message: str) -> str:
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{status}</title></head><body><h1>{status}</h1><p>{esc(message)}</p>"
            "</body></html>\n")


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#fafafa}
header{display:flex;gap:1.5em;align-items:center;padding:.6em 1em;background:#1b1f24;color:#eee}
header nav a{color:#9cf;margin-right:1em;text-decoration:none}header nav a.on{color:#fff;font-weight:600}
header .store{margin-left:auto;color:#aaa;font-size:12px}
main{padding:1em 1.5em}
table{border-collapse:collapse;margin:.4em 0 1em;background:#fff}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f2f4}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px}
pre{background:#fff;border:1px solid #ddd;padding:.6em;overflow:auto;white-space:pre-wrap;
word-break:break-all;max-height:40em}
.badge{padding:0 .4em;border-radius:3px;font-size:12px}
.badge.ok{background:#d8f5dd}.badge.info{background:#dde8f7}.badge.bad{background:#f9d3d3;font-weight:600}
tr.flagged,tr.fact.invalid,tr.fact.foreign{background:#fff1f1}
tr.seat.held{background:#fff8e1}
.life.dead{color:#b00;font-weight:600}.life.alive{color:#070}
.flag,.refusal{border-left:4px solid #b00;background:#fff1f1;padding:.5em .8em;margin:.6em 0}
.fix{margin-top:.3em}.why{color:#733}
.diff .add{color:#075c1b;background:#e6ffec}.diff .del{color:#8a1313;background:#ffebe9}
.diff .hunk{color:#555}
.note{color:#555}
pre.output.empty::before{content:"(no output)";color:#777}
form.filters label{margin-right:.8em}
"""

SCRIPT = """
"use strict";
// saphan serve: the page's only script (serve/html.py says what it does).
(function () {
  var PERIOD = %(poll)d;
  function later(f, ms) { window.setTimeout(f, ms); }
  function poll(el) {
    var last = null;
    function tick() {
      fetch(el.getAttribute("data-poll"), {credentials: "same-origin", cache: "no-store"})
        .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.text(); })
        .then(function (text) { if (text !== last) { last = text; el.innerHTML = text; } })
        .catch(function () {})
        .then(function () { later(tick, PERIOD); });
    }
    later(tick, PERIOD);
  }
  function tail(el) {
    var end = null, keep = parseInt(el.getAttribute("data-keep"), 10);
    function tick() {
      var u = el.getAttribute("data-tail") + (end === null ? "" : "&offset=" + end);
      fetch(u, {credentials: "same-origin", cache: "no-store"})
        .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
        .then(function (w) {
          if (w.text) {
            el.appendChild(document.createTextNode(w.text));
            if (el.textContent.length > keep) { el.textContent = el.textContent.slice(-keep); }
            el.scrollTop = el.scrollHeight;
          }
          var moved = end === null || w.end > end;
          end = w.end;
          if (w.end < w.size && moved) { later(tick, 50); }
          else if (w.live) { later(tick, PERIOD / 2); }
          else {
            el.setAttribute("data-done", "1");
            if (el.textContent === "") { el.className += " empty"; }
          }
        })
        .catch(function () { later(tick, PERIOD); });
    }
    tick();
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-poll]"), poll);
    Array.prototype.forEach.call(document.querySelectorAll("[data-tail]"), tail);
  });
})();
""".replace("%(poll)d", str(POLL_MS))
