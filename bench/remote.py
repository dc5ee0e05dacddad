"""The remote lane's cost, against named baselines measured in the same run.

    sudo python3 bench/remote.py [--runs 30] [--rounds 5]

Builds 4 SSH test hosts (network namespaces + veth + a real sshd each, the
same hosts tests/integration/sshd uses; needs root) and measures, as medians:

1. a remote `/bin/true` run end to end through the Python API with the
   machine's connection reused (reserve, preflight dial, the run on the far
   side under Landlock, record, finalise), beside a plain
   `ssh host /bin/true` (OpenSSH client, new connection each time) — and,
   for information, a whole `saphan run` process (new connection each time);
2. `deliver --probe` to 4 hosts in parallel, beside the same to 1 host.

3. the launcher's self-digest (`--expect-sha256`, hashing /proc/self/exe
   before it applies anything) on a copy padded to 10 MB, beside the same
   launcher without it (bench/self_digest.py);
4. a far Claude Code run (`saphan run` on a claude slot of far1: the dial,
   the auth pre-flight from the runner, the frame, Landlock there) beside
   the same run on a local claude slot (bubblewrap), both against a
   scripted model server that answers at once ("excluding model time":
   one turn, no tool call). Needs the pinned claude (ci/setup).

Targets: remote run <= 2x plain ssh; 4 hosts in parallel <= 1.5x one host
(issue 6); the self-digest adds <= 5 ms on a 10 MB launcher (issue 15); the
far Claude run's overhead over the local one is reported (issue 18).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from integration.sshd.sshhosts import HostSet, missing_parts


def _median(fn: Callable[[], object], n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30, help="samples per run case")
    ap.add_argument("--rounds", type=int, default=5, help="samples per delivery case")
    ap.add_argument("--claude-runs", type=int, default=8, help="samples per Claude case")
    args = ap.parse_args()
    missing = missing_parts()
    if missing:
        sys.exit(f"bench/remote.py needs: {', '.join(missing)}")
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    saphan = scripts if os.path.exists(scripts) else shutil.which("saphan")
    if saphan is None:
        sys.exit("saphan is not installed (run ci/setup)")
    from saphan import Engine

    hosts = HostSet(4).up()
    home = Path(tempfile.mkdtemp(prefix="saphan-bench-"))
    env = dict(os.environ, SAPHAN_HOME=str(home))
    try:
        subprocess.run([saphan, "init"], env=env, check=True, stdout=subprocess.DEVNULL)
        known = hosts.root / "known_hosts"
        with open(known, "w") as f:
            for h in hosts.hosts:
                subprocess.run([saphan, "machine", "add", h.name, "--ssh", h.target,
                                "--identity", str(hosts.client_key)], env=env, check=True,
                               stdout=subprocess.DEVNULL)
                pub = h.host_key.with_suffix(".pub").read_text().split()
                f.write(f"{h.addr} {pub[0]} {pub[1]}\n")
        subprocess.run([saphan, "machine", "deliver", "--all", "--probe"],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([saphan, "slot", "add", "far1", "s1", "--tool", "command"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        far1 = hosts["far1"]
        wd = far1.mkdir("bench/wd")

        plain = ["ssh", "-i", str(hosts.client_key), "-o", "BatchMode=yes",
                 "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
                 "-o", "GlobalKnownHostsFile=/dev/null", f"{far1.user}@{far1.addr}", "/bin/true"]
        cli = [saphan, "run", "--machine", "far1", "--slot", "s1", "--workdir", str(wd),
               "--json", "--", "/bin/true"]
        engine = Engine(home)

        def api_run() -> None:
            rec = engine.run("far1", "s1", ["/bin/true"], workdir=str(wd), stream=False)
            assert rec.exit_code == 0, rec.to_json()

        def run(argv: list[str]) -> Callable[[], None]:
            return lambda: subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)

        api_run()  # opens the connection the samples reuse
        samples: dict[str, list[float]] = {"plain": [], "api": [], "cli": []}
        for _ in range(args.runs):  # interleaved, so drift hits every case alike
            samples["plain"].append(_median(run(plain), 1))
            samples["api"].append(_median(api_run, 1))
            samples["cli"].append(_median(run(cli), 1))
        engine.close()
        med = {k: statistics.median(v) for k, v in samples.items()}

        def deliver(names: list[str]) -> Callable[[], None]:
            return run([saphan, "machine", "deliver", *names, "--probe", "--json"])

        one, four = [], []
        for _ in range(args.rounds):
            one.append(_median(deliver(["far1"]), 1))
            four.append(_median(deliver(["far1", "far2", "far3", "far4"]), 1))
        d1, d4 = statistics.median(one), statistics.median(four)

        rows = [
            ("ssh host /bin/true (OpenSSH, new connection) [baseline]", med["plain"], 1.0, ""),
            ("remote /bin/true run, API, connection reused", med["api"],
             med["api"] / med["plain"], "<= 2.0x"),
            ("remote /bin/true run, `saphan run` process (new connection)", med["cli"],
             med["cli"] / med["plain"], "(info)"),
            ("deliver --probe, 1 host [baseline]", d1, 1.0, ""),
            ("deliver --probe, 4 hosts in parallel", d4, d4 / d1, "<= 1.5x"),
        ]
        from self_digest import measure

        launcher = Path(subprocess.run([saphan, "launcher", "path"], env=env, text=True,
                                       capture_output=True).stdout.strip())
        plain_reap, digest_reap, _ = measure(launcher, 10_000_000, args.runs)
        rows += [
            ("launcher reap -- /bin/true, padded to 10 MB [baseline]", plain_reap, 1.0, ""),
            ("the same with --expect-sha256 (self-digest of /proc/self/exe)", digest_reap,
             digest_reap / plain_reap, f"+{(digest_reap - plain_reap) * 1000:.1f} ms, <= +5 ms"),
        ]
        rows += _claude_rows(saphan, env, hosts, args.claude_runs)
        print(f"{'case':<64} {'median ms':>10} {'ratio':>7}  target")
        for name, value, ratio, target in rows:
            print(f"{name:<64} {value * 1000:>10.1f} {ratio:>6.2f}x  {target}")
        size = Path(subprocess.run([saphan, "launcher", "path"], env=env, text=True,
                                   capture_output=True).stdout.strip()).stat().st_size
        print(f"(runs: {args.runs} samples each; deliveries: {args.rounds} each; "
              f"launcher: {size} bytes)")
    finally:
        hosts.down()
        shutil.rmtree(home, ignore_errors=True)


def _claude_rows(saphan: str, env: dict[str, str], hosts: HostSet,
                 n: int) -> list[tuple[str, float, float, str]]:
    """Case 4: a claude run here and on far1, interleaved, medians."""
    from integration.sshd.test_far_agents import _far_agent, far_loopback
    from saphan.tools import binaries
    from tools.model_servers import MessagesServer

    claude = binaries.locate("claude")
    if claude is None or n <= 0:
        return []
    far1 = hosts["far1"]
    here_wd = Path(tempfile.mkdtemp(prefix="saphan-bench-wd-"))
    far_wd = far1.mkdir("bench/claude")
    cenv = dict(env, ANTHROPIC_API_KEY="sk-ant-bench-not-a-key", SAPHAN_CLAUDE_BIN=claude)
    script = [("text", "done")]
    try:
        with MessagesServer(script) as here_srv, \
                MessagesServer(script, host=far1.host_addr) as far_srv, \
                far_loopback(far1, far_srv.port) as far_url:
            def sh(*argv: str) -> None:
                subprocess.run([saphan, *argv], env=cenv, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            sh("machine", "add", "here", "--local")
            sh("slot", "add", "here", "cl", "--tool", "claude", "--endpoint", here_srv.base_url)
            path = _far_agent(far1, claude, "claude")
            sh("slot", "add", "far1", "cl", "--tool", "claude", "--endpoint", far_url,
               "--agent-path", str(path))

            def local() -> None:
                sh("run", "--machine", "here", "--slot", "cl", "--workdir", str(here_wd),
                   "--prompt", "hi", "--json")

            def remote() -> None:
                sh("run", "--machine", "far1", "--slot", "cl", "--workdir", str(far_wd),
                   "--prompt", "hi", "--json")

            local()
            remote()
            xs: dict[str, list[float]] = {"local": [], "far": []}
            for _ in range(n):
                xs["local"].append(_median(local, 1))
                xs["far"].append(_median(remote, 1))
    finally:
        shutil.rmtree(here_wd, ignore_errors=True)
    lo, fa = statistics.median(xs["local"]), statistics.median(xs["far"])
    return [
        ("claude run, local slot (bubblewrap) [baseline]", lo, 1.0, ""),
        ("claude run, far1 (dial, auth from the runner, frame, Landlock)", fa, fa / lo,
         f"+{(fa - lo) * 1000:.0f} ms (info)"),
    ]


if __name__ == "__main__":
    main()
