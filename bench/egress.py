"""The egress door's cost (egress/door.py), against baselines in the same run.

    python3 bench/egress.py [--reps 5] [--mb 100] [--connects 200] [--runs 20]

Needs root (it makes a network namespace and a veth pair, named
saphan-bench-<pid> / sbch<pid>h, and removes them at exit), bubblewrap and
the installed package (`ci/setup`). The door always denies loopback, so the
upstream listens on the veth's host end (10.232.N.1, a free N from pid%250; an address of
this machine: the kernel carries host-namespace traffic to it over loopback,
so the "direct" baseline is a loopback-speed TCP path). The upstream is a
plain socket server in a process of its own that answers any request head
with 100 MB (10^8 bytes; MB/s below is 10^6 bytes/s); every client is a
process of its own too (stdlib python3, 1 MiB reads), so the door's thread is
alone in this process, as it is in `saphan run`. PYTHONDONTWRITEBYTECODE is
dropped from saphan's environment (the warm-up runs write the .pyc files), so
a freshly edited module is not compiled on every sample.

1. Throughput of one 100 MB download, medians of --reps, cases interleaved:
   - direct: TCP connect to the upstream, GET, read to EOF [baseline];
   - door: the same through the real Door class started here: CONNECT on
     its unix socket (Proxy-Authorization Basic with its token), then GET
     (isolates the door);
   - door+bridge, no jail: `saphan-launcher reap --bridge 127.0.0.1:P=SOCK`
     in this namespace, to the same door (the bridge's hop without the jail);
   - door+bridge: a real cut run, `saphan run --egress-policy P -- python3
     client.py` in the jail, CONNECT through `127.0.0.1:3128` (the launcher's
     bridge to the run's own door) with $HTTPS_PROXY; timed by the client
     inside the jail (from its connect to the last byte) and printed;
   - for information, curl: `curl -o /dev/null` direct, and `curl -p -x
     "$HTTPS_PROXY"` in a cut run (curl's own time_total).
   Target: door+bridge >= 0.5x direct.
2. Connect latency, --connects sequential handshakes each: direct TCP
   connect + close, against door CONNECT (connect the unix socket, CONNECT,
   read the 200, close); p50 and p99.
3. Start-up: wall time of `saphan run --machine here --slot s1 --workdir W
   -- true` without and with `--egress-policy` (one allowed host), alternated,
   --runs each, medians. Target: the policy adds <= 20 ms.

A table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

#: the upstream: answers every request head with SIZE bytes, then closes
SERVER = r"""
import socket, sys, threading
addr, size = sys.argv[1], int(sys.argv[2])
blob = memoryview(b"x" * (1 << 20))
head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size
def serve(c):
    with c:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = c.recv(65536)
            if not chunk:
                return
            buf += chunk
        c.sendall(head)
        left = size
        while left:
            n = min(left, len(blob))
            c.sendall(blob[:n])
            left -= n
        c.shutdown(socket.SHUT_WR)
        while c.recv(65536):
            pass
s = socket.create_server((addr, 0), backlog=512)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

#: the client (stdlib only: it also runs in the jail, under /usr/bin/python3)
CLIENT = r"""
import base64, json, os, socket, sys, time
from urllib.parse import urlsplit
mode, rest = sys.argv[1], sys.argv[2:]
buf = bytearray(1 << 20)
view = memoryview(buf)

def connect_via(s, host, port, token):
    cred = base64.b64encode(b"saphan:" + token.encode()).decode()
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
              f"Proxy-Authorization: Basic {cred}\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit(f"door closed: {got!r}")
        got += chunk
    if not got.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"door refused: {got[:200]!r}")

def fetch(s):
    s.sendall(b"GET / HTTP/1.1\r\nHost: upstream\r\n\r\n")
    total = 0
    while True:
        n = s.recv_into(view)
        if not n:
            break
        total += n
    return total

def open_door(sock_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    return s

def proxy_from_env():
    u = urlsplit(os.environ["HTTPS_PROXY"])
    return u.hostname, u.port, u.password

if mode == "get-direct":
    host, port = rest[0], int(rest[1])
    t0 = time.perf_counter()
    s = socket.create_connection((host, port))
    n = fetch(s)
elif mode == "get-door":
    sock_path, token, host, port = rest[0], rest[1], rest[2], int(rest[3])
    t0 = time.perf_counter()
    s = open_door(sock_path)
    connect_via(s, host, port, token)
    n = fetch(s)
elif mode == "get-proxy":
    host, port = rest[0], int(rest[1])
    phost, pport, token = proxy_from_env()
    t0 = time.perf_counter()
    s = socket.create_connection((phost, pport))
    connect_via(s, host, port, token)
    n = fetch(s)
elif mode in ("lat-direct", "lat-door"):
    times = []
    if mode == "lat-direct":
        host, port, count = rest[0], int(rest[1]), int(rest[2])
    else:
        sock_path, token, host, port, count = rest[0], rest[1], rest[2], int(rest[3]), int(rest[4])
    for _ in range(count):
        t0 = time.perf_counter()
        if mode == "lat-direct":
            s = socket.create_connection((host, port))
        else:
            s = open_door(sock_path)
            connect_via(s, host, port, token)
        s.close()
        times.append(time.perf_counter() - t0)
    print("BENCH-RESULT " + json.dumps({"times": times}), flush=True)
    raise SystemExit(0)
else:
    raise SystemExit(f"unknown mode {mode}")
t = time.perf_counter() - t0
s.close()
cpu = os.times()
print("BENCH-RESULT " + json.dumps({"bytes": n, "seconds": t, "cpu": cpu.user + cpu.system}),
      flush=True)
"""


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=check)


class Veth:
    """A network namespace and a veth pair whose host end holds the upstream's address."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.netns = f"saphan-bench-{pid}"
        self.host_end, self.peer = f"sbch{pid}h"[:15], f"sbch{pid}n"[:15]
        self.net, self.addr = "", ""
        self.pid = pid

    def up(self) -> Veth:
        # the first 10.232.N.0/24 from N = pid % 250 that no interface here holds
        for i in range(250):
            net = f"10.232.{(self.pid + i) % 250}"
            if not _ip("-4", "addr", "show", "to", f"{net}.0/24").stdout.strip():
                self.net, self.addr = net, f"{net}.1"
                break
        else:
            sys.exit("every 10.232.N.0/24 is already on an interface of this machine")
        try:
            _ip("netns", "add", self.netns)
            _ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.peer)
            _ip("link", "set", self.peer, "netns", self.netns)
            _ip("addr", "add", f"{self.addr}/24", "dev", self.host_end)
            _ip("link", "set", self.host_end, "up")
            _ip("-n", self.netns, "addr", "add", f"{self.net}.2/24", "dev", self.peer)
            _ip("-n", self.netns, "link", "set", self.peer, "up")
        except subprocess.CalledProcessError as e:
            self.down()
            sys.exit(f"could not make the bench's veth pair: {e.stderr.strip()}")
        return self

    def down(self) -> None:
        _ip("link", "del", self.host_end, check=False)
        _ip("netns", "del", self.netns, check=False)


def _result(out: str) -> dict[str, Any]:
    for line in out.splitlines():
        if line.startswith("BENCH-RESULT "):
            return dict(json.loads(line.split(" ", 1)[1]))
    raise RuntimeError(f"no BENCH-RESULT line in:\n{out[-2000:]}")


def _pct(xs: list[float], p: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="downloads per throughput case (>= 3)")
    ap.add_argument("--mb", type=int, default=100, help="download size, 10^6 bytes")
    ap.add_argument("--connects", type=int, default=200, help="handshakes per latency case")
    ap.add_argument("--runs", type=int, default=20, help="saphan runs per start-up case (>= 15)")
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("bwrap") is None:
        sys.exit("bench/egress.py needs root, `ip` (iproute2) and bwrap")
    scripts = os.path.join(sysconfig.get_path("scripts"), "saphan")
    saphan = scripts if os.path.exists(scripts) else shutil.which("saphan")
    if saphan is None:
        sys.exit("saphan is not installed (run ci/setup)")
    # SIGTERM ends the bench through the finally blocks (veth, door, temp dirs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="saphan-bench-egress-"))
    veth = Veth()
    server: subprocess.Popen[str] | None = None
    door = None
    try:
        veth.up()
        home, wd = tmp / "home", tmp / "wd"
        wd.mkdir()
        (wd / "client.py").write_text(CLIENT)
        env = dict(os.environ, SAPHAN_HOME=str(home), XDG_STATE_HOME=str(tmp / "xdg-state"))
        # as installed: with PYTHONDONTWRITEBYTECODE an editable install compiles every
        # module edited since its last .pyc on every run (the egress modules, freshly
        # edited, 10+ ms); the warm-up runs below write the .pyc files
        env.pop("PYTHONDONTWRITEBYTECODE", None)

        def sh(*argv: str) -> None:
            subprocess.run([saphan, *argv], env=env, check=True, stdout=subprocess.DEVNULL)

        sh("init")
        sh("machine", "add", "here", "--local")
        sh("slot", "add", "here", "s1", "--tool", "command")
        size = args.mb * 1_000_000
        server = subprocess.Popen([sys.executable, "-c", SERVER, veth.addr, str(size)],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = int(server.stdout.readline())
        policy = tmp / "egress.json"
        policy.write_text(json.dumps({"schema": 1, "name": "bench",
                                      "allow": [{"host": veth.addr, "ports": [port]}]}))

        from saphan.egress.door import Allow, Door

        token = "bench-token-" + os.urandom(12).hex()
        sock = str(tmp / "door.sock")
        door = Door(sock, token=token, placeholder="bench-placeholder", audit_path=str(tmp / "audit"),
                    allow=(Allow(veth.addr, (port,)),), routes=())
        door.start()

        py = [sys.executable, str(wd / "client.py")]
        jail_py = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        cut = [saphan, "run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
               "--egress-policy", str(policy), "--"]
        url = f"http://{veth.addr}:{port}/"

        def client(argv: list[str], env: dict[str, str] = env) -> dict[str, Any]:
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{argv[:6]} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
            return _result(p.stdout + "\n" + p.stderr)

        def curl_secs(argv: list[str]) -> dict[str, Any]:
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            for line in (p.stdout + "\n" + p.stderr).splitlines():
                if line.startswith("BENCH-CURL "):
                    n, secs = line.split()[1:3]
                    return {"bytes": int(float(n)), "seconds": float(secs)}
            raise RuntimeError(f"curl: no result ({p.returncode})\n{p.stdout}\n{p.stderr}")

        launcher = subprocess.run([saphan, "launcher", "path"], env=env, capture_output=True,
                                  text=True, check=True).stdout.strip()
        with socket.socket() as probe:  # a free port on the host's loopback for the bridge
            probe.bind(("127.0.0.1", 0))
            bridge_port = probe.getsockname()[1]
        # the same bridge with no jail: the launcher in this namespace, to this door
        bridged = [launcher, "reap", "--bridge", f"127.0.0.1:{bridge_port}={sock}", "--"]
        bridge_env = dict(env, HTTPS_PROXY=f"http://saphan:{token}@127.0.0.1:{bridge_port}")
        fmt = "BENCH-CURL %{size_download} %{time_total}\\n"
        cases: dict[str, Any] = {
            "direct": lambda: client([*py, "get-direct", veth.addr, str(port)]),
            "door": lambda: client([*py, "get-door", sock, token, veth.addr, str(port)]),
            "door+bridge, no jail": lambda: client(
                [*bridged, *py, "get-proxy", veth.addr, str(port)], bridge_env),
            "door+bridge (cut run)": lambda: client(
                [*cut, jail_py, "client.py", "get-proxy", veth.addr, str(port)]),
            "curl direct": lambda: curl_secs(
                ["curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", fmt, url]),
            "curl door+bridge (cut run)": lambda: curl_secs(
                [*cut, "sh", "-c", f'curl -sS -p -x "$HTTPS_PROXY" -o /dev/null -w "{fmt}" {url}']),
        }
        rates: dict[str, list[float]] = {k: [] for k in cases}
        for name, fn in cases.items():  # warm-up, and a check that each case works
            got = fn()
            if got["bytes"] < size:
                raise RuntimeError(f"{name}: {got['bytes']} bytes, wanted {size}")
        for _ in range(max(3, args.reps)):  # interleaved, so drift hits every case alike
            for name, fn in cases.items():
                got = fn()
                if got["bytes"] < size:
                    raise RuntimeError(f"{name}: {got['bytes']} bytes, wanted {size}")
                rates[name].append(size / got["seconds"] / 1e6)
        mbs = {k: statistics.median(v) for k, v in rates.items()}

        half = str(max(1, args.connects // 2))
        lat: dict[str, list[float]] = {"direct TCP connect": [],
                                       "door CONNECT (unix socket, 200)": []}
        for _ in range(2):  # two halves each, alternated
            lat["direct TCP connect"] += client(
                [*py, "lat-direct", veth.addr, str(port), half])["times"]
            lat["door CONNECT (unix socket, 200)"] += client(
                [*py, "lat-door", sock, token, veth.addr, str(port), half])["times"]
        summary = door.stop()

        plain_run = [saphan, "run", "--machine", "here", "--slot", "s1", "--workdir", str(wd),
                     "--", "true"]
        cut_run = [*cut, "true"]
        walls: dict[str, list[float]] = {"plain": [], "cut": []}

        def wall(argv: list[str]) -> float:
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            return time.perf_counter() - t0

        wall(plain_run)
        wall(cut_run)
        for i in range(max(15, args.runs)):  # alternated, the order swapped each round
            order = ("plain", "cut") if i % 2 == 0 else ("cut", "plain")
            for k in order:
                walls[k].append(wall(plain_run if k == "plain" else cut_run))
        start = {k: statistics.median(v) for k, v in walls.items()}
    finally:
        if door is not None:
            door.stop()
        if server is not None:
            server.kill()
            server.wait()
        veth.down()
        shutil.rmtree(tmp, ignore_errors=True)

    base = mbs["direct"]
    print(f"1. throughput, one {args.mb} MB download, median of {max(3, args.reps)} "
          f"(upstream on {veth.addr}, a veth address reached over loopback)")
    print(f"{'case':<40} {'MB/s':>8} {'min':>8} {'max':>8} {'vs direct':>10}  target")
    targets = {"door+bridge (cut run)": ">= 0.50x", "door": "(isolates the door)",
               "door+bridge, no jail": "(launcher bridge in this namespace)"}
    for name, xs in rates.items():
        ref = mbs["curl direct"] if name.startswith("curl") else base
        tag = " [baseline]" if name in ("direct", "curl direct") else ""
        print(f"{name + tag:<40} {mbs[name]:>8.0f} {min(xs):>8.0f} {max(xs):>8.0f} "
              f"{mbs[name] / ref:>9.2f}x  {targets.get(name, '')}")
    print(f"\n2. connect latency, {len(lat['direct TCP connect'])} sequential handshakes each (ms)")
    print(f"{'case':<40} {'p50':>8} {'p99':>8} {'p50 vs direct':>14}")
    lat_base = statistics.median(lat["direct TCP connect"])
    for name, xs in lat.items():
        tag = " [baseline]" if name.startswith("direct") else ""
        print(f"{name + tag:<40} {statistics.median(xs) * 1000:>8.3f} "
              f"{_pct(xs, 99) * 1000:>8.3f} {statistics.median(xs) / lat_base:>13.1f}x")
    added = (start["cut"] - start["plain"]) * 1000
    print(f"\n3. start-up, `saphan run -- true`, median of {max(15, args.runs)} alternated (ms)")
    print(f"{'case':<40} {'median':>8} {'added':>8}  target")
    print(f"{'plain run [baseline]':<40} {start['plain'] * 1000:>8.1f}")
    print(f"{'--egress-policy (one allowed host)':<40} {start['cut'] * 1000:>8.1f} "
          f"{added:>+8.1f}  <= +20 ms")
    print(f"(door summary: {summary['requests']} requests, {summary['bytes_down']} bytes down)")
    print(json.dumps({
        "bench": "egress", "mb": args.mb, "reps": max(3, args.reps),
        "upstream": f"{veth.addr} (veth host end, kernel loopback path)",
        "throughput_mb_s": {k: round(v, 1) for k, v in mbs.items()},
        "throughput_samples_mb_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "ratio_door_vs_direct": round(mbs["door"] / base, 3),
        "ratio_door_bridge_vs_direct": round(mbs["door+bridge (cut run)"] / base, 3),
        "latency_ms": {k: {"p50": round(statistics.median(v) * 1000, 3),
                           "p99": round(_pct(v, 99) * 1000, 3), "n": len(v)}
                       for k, v in lat.items()},
        "startup_ms": {"plain": round(start["plain"] * 1000, 1),
                       "egress_policy": round(start["cut"] * 1000, 1),
                       "added": round(added, 1), "runs": max(15, args.runs)},
        "targets": {"door_bridge_ratio_ge_0_5": mbs["door+bridge (cut run)"] / base >= 0.5,
                    "startup_added_le_20_ms": added <= 20},
    }))


if __name__ == "__main__":
    main()
