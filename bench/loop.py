"""The built-in loop (`--tool loop`, issue 9), against baselines in the same run.

    python3 bench/loop.py [--runs 15] [--turns 20]

A scripted chat-completions server on loopback (tests/tools/model_servers.py)
plays the model; everything else is the product as installed, on a fresh
temporary workspace (SQLite, one local machine). Three measurements, medians
of --runs, cases interleaved so drift hits every case alike:

1. Whole run: `saphan run` on a loop slot whose model calls `finish` at once
   (one model turn), against `saphan run -- /bin/true` on a command slot of
   the same machine and workspace. The difference is what the loop lane adds
   to a run: the loop interpreter started inside the jail, the spec, the key
   pipe, one HTTP round trip, the transcript and result.
2. Per turn: a loop run of K turns, each one `run_command ["true"]`, then
   `finish`, minus the one-turn run of the same round, divided by K (the
   median of these paired differences: the rounds' drift, tens of ms on a
   shared machine, would swamp K turns in a difference of two medians; the
   loop's own clock inside the jail is printed too). Baseline: a plain,
   unjailed Python loop in this process doing K POSTs of the same JSON shape
   to the same kind of server (http.client, a new connection per request, as
   the loop's client does) and K `subprocess.run(["true"])`.
3. Jail start-up of the loop interpreter: `bwrap --ro-bind / / --dev-bind
   /dev/null /dev/null -- PY -I -c "import saphan.loop.agent"`, against
   `PY -I -c pass` and the same import unjailed (PY = this interpreter, the
   one a loop slot runs).

No target is set; the figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "tools"))

from model_servers import ChatCompletionsServer  # noqa: E402


def _wall(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       check=True, text=True)
    return time.perf_counter() - t0, r.stdout


def _reset(srv: ChatCompletionsServer) -> None:
    """Start the script over (the server picks the turn by requests seen)."""
    for seen in (srv.requests, srv.paths, srv.headers, srv.bodies):
        seen.clear()


def _plain_turns(srv: ChatCompletionsServer, turns: int, secret: str) -> float:
    """The baseline: `turns` POSTs + `true`s, unjailed, in this process."""
    from saphan.loop.tools import SCHEMAS

    _reset(srv)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "run true"}]
    t0 = time.perf_counter()
    for _ in range(turns):
        body = json.dumps({"model": "m", "messages": messages, "tools": SCHEMAS,
                           "tool_choice": "auto", "stream": False}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {secret}"})
        message = json.loads(conn.getresponse().read())["choices"][0]["message"]
        conn.close()
        r = subprocess.run(["true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           check=False)
        messages.append({"role": "assistant", "content": None,
                         "tool_calls": message["tool_calls"]})
        messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                         "content": f"exit {r.returncode}\n"})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--turns", type=int, default=20, help="K, tool-call turns (default 20)")
    args = ap.parse_args()
    k = args.turns
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    saphan = scripts if os.path.exists(scripts) else shutil.which("saphan")
    bwrap = shutil.which("bwrap")
    if saphan is None or bwrap is None:
        sys.exit("needs saphan and bwrap installed (run ci/setup)")
    true = shutil.which("true") or "/bin/true"
    py = sys.executable
    tmp = tempfile.mkdtemp(prefix="saphan-bench-loop-")
    home, wd = os.path.join(tmp, "home"), os.path.join(tmp, "wd")
    os.makedirs(wd)
    key = os.path.join(tmp, "lane.key")
    secret = "sk-bench-" + os.urandom(16).hex()
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (secret + "\n").encode())
    os.close(fd)
    env = dict(os.environ, SAPHAN_HOME=home)
    env.pop("OPENAI_API_KEY", None)

    one = ChatCompletionsServer([("calls", [("finish", {"summary": "nothing to do"})])])
    many = ChatCompletionsServer(
        [("calls", [("run_command", {"argv": ["true"]})])] * k
        + [("calls", [("finish", {"summary": f"ran true {k} times"})])])
    plain = ChatCompletionsServer([("calls", [("run_command", {"argv": ["true"]})])] * k)
    try:
        for srv in (one, many, plain):
            srv.__enter__()
        for argv in (["init"], ["machine", "add", "here", "--local"],
                     ["slot", "add", "here", "cmd", "--tool", "command"],
                     ["slot", "add", "here", "lp", "--tool", "loop"],
                     ["lane", "add", "one", "--base-url", f"{one.base_url}/v1", "--model", "m",
                      "--credential-file", key],
                     ["lane", "add", "many", "--base-url", f"{many.base_url}/v1", "--model",
                      "m", "--credential-file", key]):
            subprocess.run([saphan, *argv], env=env, check=True, stdout=subprocess.DEVNULL)

        def loop_run(lane: str) -> list[str]:
            return [saphan, "run", "--machine", "here", "--slot", "lp", "--workdir", wd,
                    "--lane", lane, "--prompt", "bench", "--json"]

        jail = [bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev/null", "/dev/null", "--"]
        imp = [py, "-I", "-c", "import saphan.loop.agent"]
        procs = {
            "run -- /bin/true (command slot)": ([saphan, "run", "--machine", "here", "--slot",
                                                 "cmd", "--workdir", wd, "--json", "--", true],
                                                None),
            "run, loop slot, 1 turn (finish)": (loop_run("one"), one),
            f"run, loop slot, {k + 1} turns": (loop_run("many"), many),
            "py -I -c pass": ([py, "-I", "-c", "pass"], None),
            "py -I import saphan.loop.agent": (imp, None),
            "bwrap py -I import saphan.loop.agent": ([*jail, *imp], None),
        }
        samples: dict[str, list[float]] = {name: [] for name in procs}
        samples["plain loop, per turn"] = []
        inner: dict[str, list[float]] = {"one": [], "many": []}
        for _ in range(args.runs):
            for name, (argv, srv) in procs.items():
                if srv is not None:
                    _reset(srv)
                dt, out = _wall(argv, env)
                samples[name].append(dt)
                if srv is not None:
                    rec = json.loads(out)
                    loop = rec["loop"]
                    want = 1 if srv is one else k + 1
                    if loop["end"] != "finished" or loop["turns"] != want:
                        sys.exit(f"{name}: the loop ended {loop['end']!r} after "
                                 f"{loop['turns']} turn(s), expected {want}")
                    inner["one" if srv is one else "many"].append(loop["seconds"])
            samples["plain loop, per turn"].append(_plain_turns(plain, k, secret) / k)
    finally:
        for srv in (one, many, plain):
            srv.__exit__()
        shutil.rmtree(tmp, ignore_errors=True)

    med = {name: statistics.median(xs) * 1000 for name, xs in samples.items()}
    names = list(procs)
    cmd_run, run1, runk = med[names[0]], med[names[1]], med[names[2]]
    per_turn = statistics.median(
        (b - a) / k for a, b in zip(samples[names[1]], samples[names[2]], strict=True)) * 1000
    rows = [
        ("1. whole run", None, None),
        ("loop run, 1 turn", run1, ("run -- /bin/true", cmd_run)),
        (f"2. per turn (K={k}, run_command true)", None, None),
        (f"loop run, {k + 1} turns", runk, ("loop run, 1 turn", run1)),
        ("loop, per turn (paired diff / K)", per_turn,
         ("plain loop, per turn", med["plain loop, per turn"])),
        ("3. loop interpreter start-up", None, None),
        ("py -I import saphan.loop.agent", med[names[4]], ("py -I -c pass", med[names[3]])),
        ("bwrap + import saphan.loop.agent", med[names[5]], ("py -I -c pass", med[names[3]])),
        ("bwrap + import saphan.loop.agent", med[names[5]],
         ("unjailed import", med[names[4]])),
    ]
    print(f"median of {args.runs} runs (ms)")
    print(f"{'case':<36} {'median ms':>10}   {'baseline':<22} {'ms':>8} {'ratio':>7} "
          f"{'diff ms':>9}")
    for name, m, base in rows:
        if m is None:
            print(name)
            continue
        assert base is not None
        bname, b = base
        print(f"{'  ' + name:<36} {m:>10.1f}   {bname:<22} {b:>8.1f} {m / b:>6.2f}x "
              f"{m - b:>+9.1f}")
    i1, ik = (statistics.median(inner[x]) * 1000 for x in ("one", "many"))
    print(f"\ninside the jail (the loop's own clock, loop-result.json `seconds`): "
          f"1 turn {i1:.1f} ms, {k + 1} turns {ik:.1f} ms -> {(ik - i1) / k:.1f} ms per turn")
    print(f"outside the loop's clock in the 1-turn run: {run1 - i1:.1f} ms "
          f"(saphan run + jail + interpreter start-up + spec/pipe + record)")


if __name__ == "__main__":
    main()
