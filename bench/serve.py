"""The dashboard's pages with 10,000 runs in the store (`saphan serve`), on
SQLite and PostgreSQL, beside the framework's floor and `runs list`'s own
read, measured side by side in the same run (medians, interleaved rounds).

    python3 bench/serve.py [--runs 10000] [--requests 100] [--store sqlite|postgresql]
                           [--depth 100] [--profile] [--quick]

The target (the dashboard's issue): the runs page and one run's page with
10,000 runs in the store, p50 <= 100 ms server time, using indexed queries.

The workspace, one per store, in a temp dir removed at the end: `saphan init`
(SQLite in the workspace, or a PostgreSQL 15 started on loopback with
bench/reserve.py's recipe), the local machine ``here`` (`machine add --local`,
`machine probe-confinement`: a real signed fact) with a command, a claude and
a codex slot, and two SSH machines ``far1``, ``far2`` written through the
store's API (never dialled: nothing here connects to them), their landlock
facts signed by fleet/facts.write (far2's bound to the host it used to name:
the fleet page shows it invalid). Then real runs, `saphan run --machine here
--slot s1` for real (one with about 150 kB of stdout, one ``--repo`` run whose
commit is imported, so its page reads a diff from the main repository),
then ``--runs`` more written through the store's API the way a run writes
them: Store.reserve (PostgreSQL: the server's reservation function),
Store.mark_running, Store.finalize with the record signed by
records.signed_record_json — the real run's record as the template, with its
id, machine, slot, tool, ordinal, times, outcome and exit; claude and codex
runs carry a usage block; about 8 % are refused (Store.insert_refused_run with
the refusal in the record). So every row carries a real signed record of
about 3.5 kB that the page verifies with HMAC. Rows are written 250 to a
transaction (the rows are the same; only the commit count differs); on
PostgreSQL the table is then ANALYZEd, as autovacuum does within a minute
of such inserts (SQLite has no automatic ANALYZE and saphan runs none: its
planner works without statistics, as in a real workspace). Last,
six live runs: four on ``here`` held by this benchmark's own process (their
holders alive; live record files via run/record.running), two on ``far1``
whose holder is a far process (liveness "unknown": not dialled).

The server is the real `saphan serve --bind 127.0.0.1:0` (as tests/serve/
served.py starts it), asked over one kept-alive HTTP/1.1 connection with the
token as ``Authorization: Bearer``. "Server time" is the wall time of one
request over loopback, from sending it to the last byte of the answer: an
upper bound on the server's own time (it includes loopback, HTTP parsing and
the client's reading). After a warm-up of ``--warmup`` requests per page,
``--requests`` rounds each ask every page once, in an order rotated each
round; each answer's status and row count are checked. Pages:

    /                     the fleet
    /runs                 the first page (50 newest)
    /runs?machine=here    the machine with most runs (about half)
    /runs?tool=claude, /runs?outcome=refused, /runs?state=live
    /runs?before=…        page 5 and page ``--depth`` (following "older →")
    /run/ID               a finished run (real), and the --repo run (git diff)
    /run/ID/output        ?stream=stdout: the last 64 kB of about 150 kB

Baselines, same run, same store:

    static css            /static/saphan.css through the same server: the
                          token gate, Starlette and uvicorn, reading nothing
    bare hello            a Starlette app with one plain-text route on
                          uvicorn, same options, in its own process: the
                          framework and HTTP floor without saphan
    Engine.runs(50)       `saphan runs list --limit 50 --json`'s read via the
                          Python API, in this process (rows read, records
                          verified), no HTTP

Also in this process, with an Engine opened as the server opens one: each
page built without HTTP (serve/reader.py then serve/html.py, as the route
does), to split the page's own cost from the transport. The query plans: the
runs page's queries composed as Store.list_runs composes them (from
store/queries.py LIST_RUNS and RUN_FILTERS), under SQLite's EXPLAIN QUERY
PLAN and PostgreSQL's EXPLAIN ANALYZE (the custom plan, and the generic plan
the server may switch to after psycopg prepares a statement it has run five
times), each with its own median time. Then one JSON line. ``--profile`` adds
cProfile's top functions for reader.runs (first page) and reader.run.
Defaults take about 2 minutes on 2 cores (both stores); ``--quick`` (2,000
runs, 30 requests, depth 20) about half a minute.
"""

from __future__ import annotations

import argparse
import cProfile
import html as htmlmod
import http.client
import importlib
import importlib.util
import io
import json
import math
import os
import pstats
import random
import re
import select
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMEOUT = 600.0
TARGET_MS = 100.0
#: (machine, slot, tool, capacity, share of the runs)
SLOTS = [
    ("here", "s1", "command", 8, 0.25), ("here", "cl", "claude", 2, 0.15),
    ("here", "cx", "codex", 2, 0.10), ("far1", "s1", "command", 8, 0.20),
    ("far1", "cl", "claude", 4, 0.15), ("far2", "s1", "command", 4, 0.10),
    ("far2", "cx", "codex", 2, 0.05),
]
FAR = {"far1": "build-1.example", "far2": "build-2.example"}
#: (outcome, state, share): the finished runs' endings; refused ones are born finished
OUTCOMES = [
    ("exited", "ended", 0.70), ("failed", "ended", 0.12), ("refused", "refused", 0.08),
    ("error", "ended", 0.02), ("cancelled", "ended", 0.03), ("interrupted", "ended", 0.02),
    ("holder-dead", "ended", 0.02), ("finalized-by-operator", "ended", 0.01),
]
REFUSALS = [
    ("seat-full", "every seat of {m}/{s} is held by a live run ({n} of {n})",
     "wait for one to end (`saphan runs list --state live`), or raise the slot's "
     "--max-sessions"),
    ("fleet-full", "every candidate slot for tool {t} is at capacity",
     "wait, or add a slot (`saphan slot add`)"),
    ("digest-mismatch", "the agent binary's SHA-256 differs from the slot's pin",
     "deliver the pinned binary again (`saphan machine deliver {m} --agent {t}`)"),
]
MODELS = {"claude": "claude-sonnet-4-5", "codex": "gpt-5-codex"}
PAGE_ORDER = ["fleet", "runs", "runs machine", "runs tool", "runs outcome", "runs live",
              "runs page 5", "runs deep", "run", "run --repo", "output", "static css",
              "bare hello"]


def _saphan() -> str:
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    found = scripts if os.path.exists(scripts) else shutil.which("saphan")
    if found is None:
        sys.exit("needs the saphan package installed (run ci/setup)")
    return found


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]  # nearest rank


# -- the workspace ------------------------------------------------------------------------

@dataclass
class Workspace:
    kind: str  # "sqlite" | "postgresql"
    root: Path
    saphan: str
    url: str | None = None  # PostgreSQL's
    env: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # what the pages open
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    def __post_init__(self) -> None:
        env = dict(os.environ, SAPHAN_HOME=str(self.home),
                   XDG_STATE_HOME=str(self.root / "state"),
                   PYTHONPYCACHEPREFIX=str(self.root.parent / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env = env

    def cli(self, *argv: str, cwd: str | None = None) -> str:
        p = subprocess.run([self.saphan, *argv], env=self.env, capture_output=True, text=True,
                           timeout=TIMEOUT, cwd=cwd)
        if p.returncode != 0:
            raise SystemExit(f"saphan {' '.join(argv)} exited {p.returncode}:\n"
                             f"{p.stdout}{p.stderr}")
        return p.stdout

    @contextmanager
    def environ(self) -> Iterator[None]:
        """This process's SAPHAN_HOME and XDG_STATE_HOME set to the workspace's."""
        keys = ("SAPHAN_HOME", "XDG_STATE_HOME")
        saved = {k: os.environ.get(k) for k in keys}
        os.environ.update({k: self.env[k] for k in keys})
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _last_run(ws: Workspace) -> str:
    out = json.loads(ws.cli("runs", "list", "--limit", "1", "--json"))
    return str(out[0]["id"])


def setup(ws: Workspace, runs: int, seed: int) -> None:
    """The fleet, the real runs, then ``runs`` rows the way runs write them (module text)."""
    t0 = time.perf_counter()
    ws.root.mkdir(parents=True)
    ws.cli("init", *(["--database-url", ws.url] if ws.url else []))
    ws.cli("machine", "add", "here", "--local")
    for m, s, tool, cap, _ in SLOTS:
        if m == "here":
            ws.cli("slot", "add", m, s, "--tool", tool, "--max-sessions", str(cap))
    ws.cli("machine", "probe-confinement", "here")
    wd, repo = ws.root / "wd", ws.root / "repo"
    wd.mkdir()
    run = ["run", "--machine", "here", "--slot", "s1"]
    ws.cli(*run, "--workdir", str(wd), "--", "sh", "-c", "echo hello; echo to stderr >&2")
    ws.ids["run"] = _last_run(ws)
    ws.cli(*run, "--workdir", str(wd), "--", "sh", "-c",
           "i=0; while [ $i -lt 4000 ]; do echo \"line $i: $(date +%s) "
           "0123456789abcdef\"; i=$((i+1)); done")
    ws.ids["output"] = _last_run(ws)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.org"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README").write_text("".join(f"line {i}\n" for i in range(200)))
    subprocess.run([*git, "-C", str(repo), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "init"], check=True)
    ws.cli(*run, "--repo", str(repo), "--", "sh", "-c",
           "sed -i 's/^line 1\\(.\\)$/LINE 1\\1/' README && printf 'added\\n' >> README && "
           "git -c user.name=bench -c user.email=bench@example.org commit -qam 'edit'")
    ws.ids["run --repo"] = _last_run(ws)
    with ws.environ():
        _rows(ws, runs, random.Random(seed))
    if ws.url:  # what autovacuum does within a minute of the inserts, done now: same plans
        import psycopg

        with psycopg.connect(ws.url, autocommit=True) as c:
            c.execute("ANALYZE runs")
    ws.counts["setup_s"] = round(time.perf_counter() - t0, 1)


def _rows(ws: Workspace, n: int, rng: random.Random) -> None:
    from saphan import Engine
    from saphan.errors import Refusal
    from saphan.fleet import facts
    from saphan.ids import new_run_id
    from saphan.liveness import current_holder
    from saphan.records import signed_record_json
    from saphan.run import record as recorder
    from saphan.store.rows import Machine, Slot
    from saphan.timefmt import now_iso

    engine = Engine(ws.home)
    try:
        ctx, store = engine.ctx, engine.store
        key = ctx.record_key()
        here = store.get_fact("here", "landlock")
        assert here is not None
        measured = {k: v for k, v in json.loads(here.value_json).items()
                    if k not in ("bound_to", "seq", "record_key_id")}
        for name, host in FAR.items():
            m = Machine(name, "ssh", "saphan", host, 22, None, None, now_iso())
            store.add_machine(m)
            signer = m if name == "far1" else m._replace(ssh_host="old-" + host)  # re-pointed
            facts.write(store, key, ws.home, signer, "landlock",
                        {**measured, "transport": "ssh"}, now_iso())
        for m_name, s, tool, cap, _ in SLOTS:
            if m_name != "here":
                store.add_slot(Slot(m_name, s, tool, cap, now_iso()))
        real = store.get_run(ws.ids["run"])
        assert real is not None and real.record_json
        template = json.loads(real.record_json)  # the real run's record, re-signed per row
        for k in ("record_signature", "record_key_id", "driven_by"):
            template.pop(k, None)
        me = current_holder()
        local = me.as_tuple()
        slot_w = [w for *_, w in SLOTS]
        out_w = [w for *_, w in OUTCOMES]
        counts: dict[str, int] = {}
        made = 0
        while made < n:
            with store.db.transaction():
                for _ in range(min(250, n - made)):
                    m_name, s, tool, cap, _w = rng.choices(SLOTS, slot_w)[0]
                    outcome, state, _w2 = rng.choices(OUTCOMES, out_w)[0]
                    holder = local if m_name == "here" else (
                        f"ssh://saphan@{FAR[m_name]}:22", 4000 + made % 1000, None, None)
                    run_id = new_run_id()
                    record = dict(template, id=run_id, machine=m_name, slot=s, tool=tool,
                                  workdir=f"/srv/work/task-{made % 97}")
                    if tool != "command":
                        record.update(_agent(tool, rng))
                    if outcome == "refused":
                        cls, msg, fix = rng.choice(REFUSALS)
                        fill = {"m": m_name, "s": s, "t": tool, "n": cap}
                        at = now_iso()
                        record.update(state="refused", outcome="refused", exit_code=None,
                                      session_ordinal=None, enforced_by=None, finished_at=at,
                                      started_at=at, refusal=Refusal(
                                          cls, msg.format(**fill), fix.format(**fill)).as_dict())
                        store.insert_refused_run(
                            run_id=run_id, machine=m_name, slot=s, tool=tool,
                            workdir=record["workdir"], holder=holder, refusal_class=cls,
                            record_json=signed_record_json(key, record), at=at)
                    else:
                        ordinal = store.reserve(run_id=run_id, machine=m_name, slot=s,
                                                capacity=cap, tool=tool,
                                                workdir=record["workdir"], holder=holder)
                        assert ordinal is not None
                        store.mark_running(run_id)
                        row = store.get_run(run_id)
                        assert row is not None
                        code = {"exited": 0, "failed": rng.choice([1, 2, 101]),
                                "interrupted": -2, "cancelled": -15}.get(outcome)
                        at = now_iso()
                        record.update(state=state, outcome=outcome, exit_code=code,
                                      session_ordinal=ordinal, started_at=row.started_at,
                                      finished_at=at)
                        store.finalize(run_id, state=state, outcome=outcome, exit_code=code,
                                       record_json=signed_record_json(key, record),
                                       finished_at=at)
                    counts[f"{m_name}/{tool}/{outcome}"] = counts.get(
                        f"{m_name}/{tool}/{outcome}", 0) + 1
                    made += 1
        # the live runs: four held by this process (alive), two by far processes (unknown)
        live = [("here", "s1", "command", 8, local)] * 3 + [("here", "cl", "claude", 2, local)]
        live += [("far1", "s1", "command", 8, ("ssh://saphan@build-1.example:22", 5151 + i,
                                               None, None)) for i in range(2)]
        for m_name, s, tool, cap, holder in live:
            run_id = new_run_id()
            ordinal = store.reserve(run_id=run_id, machine=m_name, slot=s, capacity=cap,
                                    tool=tool, workdir="/srv/work/live", holder=holder)
            row = store.get_run(run_id)
            assert ordinal is not None and row is not None
            record = dict(template, id=run_id, machine=m_name, slot=s, tool=tool,
                          workdir="/srv/work/live", session_ordinal=ordinal,
                          started_at=row.started_at, state="running", outcome=None,
                          exit_code=None, finished_at=None)
            if tool != "command":
                record.update(_agent(tool, rng), usage=None)
            recorder.running(ctx, record)
            ws.ids.setdefault("live", run_id)
        ws.counts.update(runs=n + 3 + len(live), live=len(live), **{
            "refused": sum(v for k, v in counts.items() if k.endswith("/refused")),
            "machine here": sum(v for k, v in counts.items() if k.startswith("here/")) + 3,
            "tool claude": sum(v for k, v in counts.items() if "/claude/" in k)})
    finally:
        engine.close()


def _agent(tool: str, rng: random.Random) -> dict[str, Any]:
    tokens = {"input": rng.randint(2_000, 90_000), "output": rng.randint(200, 9_000),
              "cache_read": rng.randint(0, 400_000), "cache_creation": rng.randint(0, 20_000)}
    cost = round(tokens["input"] * 3e-6 + tokens["output"] * 15e-6
                 + tokens["cache_read"] * 3e-7, 4)
    return {"argv": [f"/opt/agents/{tool}", "-p", "fix the failing test in tests/test_x.py"],
            "model": MODELS[tool],
            "usage": {"models": [MODELS[tool]], "tokens": tokens, "cost_usd": cost,
                      "reported_by": tool}}


# -- PostgreSQL -----------------------------------------------------------------------------

def _postgres(stack: ExitStack) -> str:
    """A PostgreSQL started for this run (bench/reserve.py's recipe); its database's URL."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    postgres = importlib.import_module("reserve").postgres
    return str(stack.enter_context(postgres()))


# -- the servers ------------------------------------------------------------------------------

class Client:
    """One kept-alive HTTP/1.1 connection; the token as a bearer header."""

    def __init__(self, host: str, port: int, token: str | None):
        self.host, self.port = host, port
        self.headers = {"Host": f"{host}:{port}"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.conn = http.client.HTTPConnection(host, port, timeout=60)

    def get(self, path: str) -> tuple[float, int, bytes]:
        t0 = time.perf_counter()
        self.conn.request("GET", path, headers=self.headers)
        r = self.conn.getresponse()
        body = r.read()
        return time.perf_counter() - t0, r.status, body

    def close(self) -> None:
        self.conn.close()


@contextmanager
def _process(argv: list[str], env: dict[str, str], pattern: str) -> Iterator[re.Match[str]]:
    """``argv`` started; the first stdout line matching ``pattern``; SIGINT at the end.
    Its stdout is read unbuffered (os.read): a buffered readline could take several
    lines at once and leave select() waiting for bytes already read."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = b""
    try:
        while True:
            m = next((m for ln in seen.decode(errors="replace").splitlines()
                      if (m := re.search(pattern, ln))), None)
            if m is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                err = proc.stderr.read() if proc.poll() is not None and proc.stderr else b""
                raise SystemExit(f"{argv[0]} did not start: {seen!r} {err!r}")
            if select.select([proc.stdout], [], [], left)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)
        yield m
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


_HELLO = """
import socket, sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

async def hello(request):
    return PlainTextResponse("hello")

app = Starlette(routes=[Route("/", hello)])
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print("port", sock.getsockname()[1], flush=True)
config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                        server_header=False, proxy_headers=False, timeout_graceful_shutdown=2)
uvicorn.Server(config).run(sockets=[sock])
"""


# -- measuring ------------------------------------------------------------------------------

_NEXT = re.compile(r'<a rel="next" href="([^"]+)">')
_ROW = re.compile(rb'<tr class="run ')


def _older(c: Client, path: str, pages: int) -> str:
    """The path of the page ``pages`` "older →" links after ``path``."""
    for _ in range(pages):
        _, status, body = c.get(path)
        m = _NEXT.search(body.decode())
        if status != 200 or m is None:
            raise SystemExit(f"{path}: {status}, no older link")
        path = htmlmod.unescape(m.group(1))
    return path


def _check(name: str, status: int, body: bytes, want_rows: int | None) -> None:
    if status != 200:
        raise SystemExit(f"{name}: HTTP {status}: {body[:300]!r}")
    if want_rows is not None:
        got = len(_ROW.findall(body))
        if got != want_rows:
            raise SystemExit(f"{name}: {got} rows, wanted {want_rows}")


def measure_http(ws: Workspace, paths: dict[str, str], hello_port: int, token: str, port: int,
                 rows: dict[str, int | None], warmup: int, requests: int
                 ) -> dict[str, list[float]]:
    c = Client("127.0.0.1", port, token)
    h = Client("127.0.0.1", hello_port, None)
    try:
        def one(name: str) -> float:
            if name == "bare hello":
                dt, status, body = h.get("/")
            else:
                dt, status, body = c.get(paths[name])
            _check(name, status, body, rows.get(name))
            return dt

        names = [n for n in PAGE_ORDER if n == "bare hello" or n in paths]
        for _ in range(warmup):
            for name in names:
                one(name)
        samples: dict[str, list[float]] = {n: [] for n in names}
        for r in range(requests):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                samples[name].append(one(name))
        return samples
    finally:
        c.close()
        h.close()


def measure_in_process(ws: Workspace, paths: dict[str, str], requests: int
                       ) -> dict[str, list[float]]:
    """Each page built as its route builds it, without HTTP (reader, then html)."""
    from urllib.parse import parse_qsl, urlsplit

    from saphan import Engine
    from saphan.serve import app, html, params, reader

    with ws.environ():
        engine = Engine(ws.home, reconcile=False)
        engine.ctx.verb = "saphan serve"
        store = engine.store.description
        try:
            def build(name: str) -> Callable[[], object]:
                u = urlsplit(paths[name])
                query = dict(parse_qsl(u.query, keep_blank_values=True))
                if name == "fleet":
                    return lambda: html.fleet_page(reader.fleet(engine), store)
                if name.startswith("runs"):
                    f = params.run_filters(query)

                    def runs() -> str:
                        data, choices = app._runs_and_choices(engine, f)
                        return html.runs_page(data, f.query(), choices, store)
                    return runs
                if name == "output":
                    rid = u.path.split("/")[2]
                    return lambda: json.dumps(reader.output(engine, rid, "stdout", None))
                rid = u.path.split("/")[2]
                return lambda: html.run_page(rid, reader.run(engine, rid), store)

            calls = {n: build(n) for n in paths if n != "static css"}
            calls["Engine.runs(50)"] = lambda: engine.runs(50)
            for call in calls.values():
                call()
            samples: dict[str, list[float]] = {n: [] for n in calls}
            names = list(calls)
            for r in range(requests):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    t0 = time.perf_counter()
                    calls[name]()
                    samples[name].append(time.perf_counter() - t0)
            return samples
        finally:
            engine.close()


def profile(ws: Workspace, paths: dict[str, str], top: int = 14) -> list[str]:
    from saphan import Engine
    from saphan.serve import params, reader

    out = []
    with ws.environ():
        engine = Engine(ws.home, reconcile=False)
        try:
            for what, call in (
                    ("reader.runs (first page) x 20",
                     lambda: reader.runs(engine, params.run_filters({}))),
                    (f"reader.run {ws.ids['run --repo']} (--repo) x 20",
                     lambda: reader.run(engine, ws.ids["run --repo"]))):
                call()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(20):
                    call()
                prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
                text = buf.getvalue().splitlines()
                start = next(i for i, ln in enumerate(text) if "ncalls" in ln)
                out.append(f"\n[{ws.kind}] cProfile, {what} (cumulative; seconds are totals)")
                out += ["  " + ln for ln in text[start:] if ln.strip()]
        finally:
            engine.close()
    return out


# -- query plans ------------------------------------------------------------------------------

def _shapes(cursor5: tuple[str, str], deep: tuple[str, str]) -> list[tuple[str, str, tuple]]:
    """The runs page's queries, composed as Store.list_runs composes them (limit 51: the
    page asks one more than it shows)."""
    from saphan.store import queries as q

    def sql(*names: str) -> str:
        clauses = [q.RUN_FILTERS[n] for n in names]
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return q.LIST_RUNS.format(where=where)

    return [
        ("first page", sql(), (51,)),
        ("machine=here", sql("machine"), ("here", 51)),
        ("machine=here slot=s1", sql("machine", "slot"), ("here", "s1", 51)),
        ("tool=claude", sql("tool"), ("claude", 51)),
        ("outcome=refused", sql("outcome"), ("refused", 51)),
        ("state=refused", sql("state"), ("refused", 51)),
        ("state=live", sql("live"), (51,)),
        ("slot=s1", sql("slot"), ("s1", 51)),
        ("page 5 (before)", sql("before"), (cursor5[0], cursor5[0], cursor5[1], 51)),
        ("deep page (before)", sql("before"), (deep[0], deep[0], deep[1], 51)),
        ("tool=claude, deep (before)", sql("tool", "before"),
         ("claude", deep[0], deep[0], deep[1], 51)),
        ("machine=here, deep (before)", sql("machine", "before"),
         ("here", deep[0], deep[0], deep[1], 51)),
    ]


def _timed(run: Callable[[], object], n: int = 30) -> float:
    run()
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1000


def _verdict_sqlite(lines: list[str], sql: str) -> str:
    text = " ".join(lines)
    if "USING" not in text:
        return "FULL SCAN"
    if "TEMP B-TREE" in text:
        return "index seek + sort of every match"
    if "SEARCH" in text:
        return "index seek, in order"
    if "runs_live_newest" in text:
        return "the live rows' own index, in order"
    if " WHERE " in sql:
        return "walks runs_newest in order, filtering (no seek)"
    return "index, in order"


def plans_sqlite(ws: Workspace, shapes: list[tuple[str, str, tuple]]) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{ws.home / 'saphan.db'}?mode=ro", uri=True)
    out = []
    try:
        for name, sql, args in shapes:
            lines = [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, args)]
            ms = _timed(lambda sql=sql, args=args: db.execute(sql, args).fetchall())
            out.append({"query": name, "plan": lines, "ms": round(ms, 3),
                        "verdict": _verdict_sqlite(lines, sql)})
    finally:
        db.close()
    return out


def _verdict_pg(lines: list[str]) -> str:
    nodes = [ln.strip().removeprefix("->").strip() for ln in lines]
    removed = sum(int(x) for x in re.findall(r"Rows Removed by Filter: (\d+)", " ".join(lines)))
    if any(n.startswith("Seq Scan") for n in nodes):
        what = "FULL SCAN"
    elif any(n.startswith(("Sort ", "Incremental Sort")) or n == "Sort" for n in nodes):
        what = "index + sort"
    else:
        what = "index, in order"
    return what + (f", {removed} rows filtered out" if removed else "")


def plans_pg(url: str, shapes: list[tuple[str, str, tuple]]) -> list[dict[str, Any]]:
    import psycopg

    out = []
    with psycopg.connect(url, autocommit=True) as c:
        analyzed = c.execute("SELECT last_analyze, last_autoanalyze, n_live_tup FROM "
                             "pg_stat_user_tables WHERE relname = 'runs'").fetchone()
        for i, (name, sql, args) in enumerate(shapes):
            pg = sql.replace("?", "%s")
            lit = psycopg.ClientCursor(c)  # values inlined: EXECUTE takes no bind parameters
            custom = [r[0] for r in lit.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + pg, args)]
            # the generic plan: what a statement prepared by psycopg may be run with
            n = len(args)
            c.execute("SET plan_cache_mode = force_generic_plan")
            text = pg
            for k in range(1, n + 1):
                text = text.replace("%s", f"${k}", 1)
            c.execute(f"PREPARE bench_q{i} AS {text}")
            generic = [r[0] for r in lit.execute(
                f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE bench_q{i}("
                + ", ".join(["%s"] * n) + ")", args)]
            c.execute(f"DEALLOCATE bench_q{i}")
            c.execute("RESET plan_cache_mode")
            ms = _timed(lambda pg=pg, args=args: c.execute(pg, args).fetchall())
            out.append({"query": name, "plan": custom, "generic_plan": generic,
                        "ms": round(ms, 3), "verdict": _verdict_pg(custom),
                        "generic_verdict": _verdict_pg(generic)})
        out.append({"analyzed": [str(x) for x in analyzed] if analyzed else None})
    return out


# -- one store ---------------------------------------------------------------------------------

def bench_store(ws: Workspace, args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n[{ws.kind}] setting up {args.runs} runs ...", flush=True)
    setup(ws, args.runs, args.seed)
    print(f"[{ws.kind}] set up in {ws.counts['setup_s']} s: {ws.counts}", flush=True)
    paths = {
        "fleet": "/", "runs": "/runs", "runs machine": "/runs?machine=here",
        "runs tool": "/runs?tool=claude", "runs outcome": "/runs?outcome=refused",
        "runs live": "/runs?state=live",
        "run": f"/run/{ws.ids['run']}", "run --repo": f"/run/{ws.ids['run --repo']}",
        "output": f"/run/{ws.ids['output']}/output?stream=stdout",
        "static css": "/static/saphan.css",
    }
    rows: dict[str, int | None] = {n: 50 for n in paths if n.startswith("runs")}
    rows["runs live"] = ws.counts["live"]
    rows["runs deep"] = rows["runs page 5"] = 50
    result: dict[str, Any] = {"counts": ws.counts}
    hello_env = dict(ws.env)
    with _process([sys.executable, "-c", _HELLO], hello_env, r"^port (\d+)") as hm, \
            _process([ws.saphan, "serve", "--bind", "127.0.0.1:0"], ws.env,
                     r"open:\s+http://[a-z0-9.-]+:(\d+)/\?token=([A-Za-z0-9_-]+)") as sm:
        port, token = int(sm.group(1)), sm.group(2)
        c = Client("127.0.0.1", port, token)
        try:
            paths["runs page 5"] = _older(c, "/runs", 4)
            paths["runs deep"] = _older(c, "/runs", args.depth - 1)
            _, _, body = c.get(f"/run/{ws.ids['run --repo']}")
            if b'class="diff"' not in body:
                print(f"[{ws.kind}] NOTE: the --repo run's page shows no diff", flush=True)
        finally:
            c.close()
        print(f"[{ws.kind}] serving on 127.0.0.1:{port}; measuring {args.requests} rounds "
              f"of {len(paths) + 1} pages ...", flush=True)
        result["http"] = measure_http(ws, paths, int(hm.group(1)), token, port, rows,
                                      args.warmup, args.requests)
    print(f"[{ws.kind}] in-process ...", flush=True)
    result["in_process"] = measure_in_process(ws, paths, args.requests)

    def cur(path: str) -> tuple[str, str]:
        from urllib.parse import parse_qs, urlsplit

        started, _, rid = parse_qs(urlsplit(path).query)["before"][0].partition("~")
        return started, rid

    shapes = _shapes(cur(paths["runs page 5"]), cur(paths["runs deep"]))
    result["plans"] = (plans_sqlite(ws, shapes) if ws.kind == "sqlite"
                       else plans_pg(str(ws.url), shapes))
    result["paths"] = paths
    if args.profile:
        result["profile"] = profile(ws, paths)
    return result


# -- report ---------------------------------------------------------------------------------

def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, total: float) -> None:
    summary: dict[str, Any] = {"bench": "serve", "runs": args.runs, "requests": args.requests,
                               "depth": args.depth, "quick": args.quick, "stores": {}}
    for kind, res in results.items():
        http_ = {k: [x * 1000 for x in v] for k, v in res["http"].items()}
        inproc = {k: [x * 1000 for x in v] for k, v in res["in_process"].items()}
        floor = statistics.median(http_["static css"])
        hello = statistics.median(http_["bare hello"])
        listing = statistics.median(inproc["Engine.runs(50)"])
        print(f"\n[{kind}] {res['counts']['runs']} runs ({res['counts']['live']} live); "
              f"{args.requests} requests per page over one kept-alive connection, after "
              f"{args.warmup} warm-up; ms")
        hdr = (f"{'page':<14} {'path':<44} {'p50':>7} {'p90':>7} {'in-proc':>8} "
               f"{'÷ css':>6} {'÷ hello':>7} {'÷ runs(50)':>10} {'target':>7}")
        print(hdr)
        print("-" * len(hdr))
        rows: dict[str, Any] = {}
        for name in PAGE_ORDER:
            if name not in http_:
                continue
            xs = http_[name]
            p50, p90 = statistics.median(xs), _pct(xs, 90)
            ip = statistics.median(inproc[name]) if name in inproc else None
            path = res["paths"].get(name, "(its own server) /")
            if len(path) > 44:
                path = path[:30] + "…" + path[-13:]
            target = ("" if name in ("static css", "bare hello") else
                      "met" if p50 <= TARGET_MS else "MISSED")
            print(f"{name:<14} {path:<44} {p50:>7.2f} {p90:>7.2f} "
                  f"{'' if ip is None else f'{ip:8.2f}':>8} {p50 / floor:>6.1f} "
                  f"{p50 / hello:>7.1f} {p50 / listing:>10.2f} {target:>7}")
            rows[name] = {"p50_ms": round(p50, 3), "p90_ms": round(p90, 3),
                          "in_process_p50_ms": None if ip is None else round(ip, 3),
                          "vs_css": round(p50 / floor, 2), "vs_hello": round(p50 / hello, 2),
                          "vs_engine_runs50": round(p50 / listing, 3)}
        print(f"{'Engine.runs(50)':<14} {'in-process, no HTTP':<44} {listing:>7.2f} "
              f"{_pct(inproc['Engine.runs(50)'], 90):>7.2f}")
        rows["Engine.runs(50)"] = {"p50_ms": round(listing, 3),
                                   "p90_ms": round(_pct(inproc["Engine.runs(50)"], 90), 3)}
        print(f"\n[{kind}] query plans (the runs page's queries as Store.list_runs composes "
              "them; median ms of the query alone)")
        for p in res["plans"]:
            if "query" not in p:
                print(f"  statistics: last_analyze / last_autoanalyze / rows = {p['analyzed']}")
                continue
            print(f"  {p['query']:<28} {p['ms']:>7.3f} ms  {p['verdict']}")
            for ln in p["plan"]:
                print(f"      {ln}")
            if "generic_plan" in p:
                print(f"    generic plan: {p['generic_verdict']}")
                for ln in p["generic_plan"]:
                    print(f"      {ln}")
        for ln in res.get("profile", []):
            print(ln)
        summary["stores"][kind] = {"counts": res["counts"], "pages": rows,
                                   "plans": res["plans"]}
    print(f"\n'÷ css': p50 / the same server's /static/saphan.css p50 (gate + Starlette + "
          "uvicorn, nothing read); '÷ hello': p50 / a bare Starlette route's; '÷ runs(50)': "
          "p50 / Engine.runs(50) in-process. in-proc: the page built without HTTP "
          f"(reader + html). Target: p50 <= {TARGET_MS:.0f} ms. Wall {total:.0f} s; load "
          f"average now {os.getloadavg()[0]:.2f}")
    summary["wall_s"] = round(total, 1)
    print(json.dumps(summary))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=None, help="runs in the store (default 10000)")
    ap.add_argument("--requests", type=int, default=None, help="timed requests per page "
                    "(default 100)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up requests per page")
    ap.add_argument("--depth", type=int, default=None,
                    help="the deep page's number (default 100: 5,000 runs back)")
    ap.add_argument("--store", choices=["sqlite", "postgresql"], action="append",
                    help="only this store (repeatable; default both)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile reader.runs (first page) and reader.run")
    ap.add_argument("--quick", action="store_true", help="2,000 runs, 30 requests, depth 20")
    args = ap.parse_args()
    args.runs = args.runs or (2000 if args.quick else 10000)
    args.requests = args.requests or (30 if args.quick else 100)
    args.depth = args.depth or (20 if args.quick else 100)
    if args.runs < 50 * (args.depth + 1) or args.requests < 1 or args.warmup < 0:
        ap.error("--runs must fill --depth pages of 50 (and one more); --requests >= 1")
    stores = args.store or ["sqlite", "postgresql"]
    saphan = _saphan()
    for mod in ("starlette", "uvicorn"):
        if importlib.util.find_spec(mod) is None:
            sys.exit("needs the serve extra: pip install 'saphan[serve]'")
    if shutil.which("bwrap") is None:
        sys.exit("needs bubblewrap (run ci/setup)")
    # SIGTERM: unwind through the finally blocks (stop PostgreSQL, remove temp dirs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import starlette
    import uvicorn

    import saphan as pkg

    print(f"bench/serve: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, Starlette "
          f"{starlette.__version__}, uvicorn {uvicorn.__version__}, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    print(f"saphan {pkg.__version__} from {Path(pkg.__file__).parent} ({saphan}); {args.runs} "
          f"runs, {args.requests} requests per page, deep page {args.depth}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="saphan-bench-serve-"))
    t_begin = time.time()
    results: dict[str, dict[str, Any]] = {}
    try:
        with ExitStack() as stack:
            for kind in stores:
                url = _postgres(stack) if kind == "postgresql" else None
                ws = Workspace(kind, root / kind, saphan, url)
                results[kind] = bench_store(ws, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results, args, time.time() - t_begin)


if __name__ == "__main__":
    socket.setdefaulttimeout(120)
    main()
