"""`saphan machine probe-container NAME --image REF@sha256:DIGEST`: run the
pinned image by digest with the machine's container runtime (podman, else
docker), over the machine's own transport, and require the outcome.

Steps, each a command on the machine (this host, or over its pinned SSH
connection), none through a shell's interpretation of a value:

1. the runtime: ``podman``, else ``docker``, found on the machine's PATH;
2. ``RUNTIME --version``;
3. the image is there, and it is exactly the digest: ``podman image
   inspect --format {{.Digest}}`` (docker: its RepoDigests) must name it —
   a name part proves nothing (podman runs a local digest whatever the name);
4. ``RUNTIME run --rm --pull never --network none REF@DIGEST``: it must exit
   0, and with ``--expect-output TEXT`` its output must contain TEXT;
5. ``RUNTIME info``: the machine's CPUs and memory as the runtime sees them.

Only when every step holds are the signed rows written: ``docker-oci:
sha256:…`` (the image, digest, runtime and version, the output's SHA-256)
and the machine's ``runtime``, ``vm_cpus`` and ``vm_memory_bytes`` — this
probe is their only writer. A failed probe writes nothing and says which
step failed. Eligibility is a routing fact (fleet/containers.py); the runs
a cast sends there do not execute inside a container.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from saphan.errors import TransportError, UserError
from saphan.fleet import containers
from saphan.timefmt import now_iso

if TYPE_CHECKING:
    from saphan.context import Context

#: one command on the machine: argv -> (exit status, stdout, stderr)
Runner = Callable[[list[str]], "tuple[int, str, str]"]
#: at most this much of the container's output is kept (it is hashed whole)
OUTPUT_KEPT = 4096
#: what a runtime's answer about the machine may say (else the probe fails)
MAX_CPUS, MAX_MEMORY = 65536, 1 << 50


class ProbeFailed(Exception):
    """A probe step that did not hold (named in the message); nothing written."""


def probe(ctx: Context, name: str, image: str, *,
          expect_output: str | None = None) -> dict[str, Any]:
    """Probe ``image`` (REF@sha256:DIGEST) on machine ``name``; the rows written."""
    from saphan.fleet import facts

    digest = containers.check_digest(image)
    if "@" not in image or not image.split("@", 1)[0]:
        raise UserError(f"--image {image!r}: give REF@{digest} (the runtime runs a name with "
                        "the digest; the digest alone decides what runs)")
    m = ctx.machine(name)
    run = _runner(ctx, name)
    value = measure(run, image, digest, expect_output=expect_output, machine=name)
    key, home, at = ctx.record_key(), ctx.workspace.home, now_iso()
    cpus, memory = value.pop("cpus"), value.pop("memory_bytes")
    rows = {containers.kind(digest): value,
            "runtime": {"name": value["runtime"], "version": value["runtime_version"]},
            "vm_cpus": {"value": cpus}, "vm_memory_bytes": {"value": memory}}
    for kind, v in rows.items():
        facts.write(ctx.store, key, home, m, kind, v, at)
    return {"machine": name, "measured_at": at, "rows": rows}


def measure(run: Runner, image: str, digest: str, *, expect_output: str | None,
            machine: str) -> dict[str, Any]:
    """Steps 1 to 5 (module docstring) with ``run``; ProbeFailed names the step."""
    rt = next((c for c in ("podman", "docker")
               if run(["sh", "-c", f"command -v {c}"])[0] == 0), None)
    if rt is None:
        raise ProbeFailed(f"no container runtime on {machine}: neither podman nor docker is on "
                          "its PATH (install one: `apt-get install podman runc`)")
    code, out, err = run([rt, "--version"])
    if code != 0:
        raise ProbeFailed(f"`{rt} --version` on {machine} ended {code}: {err.strip()[:300]}")
    version = out.strip().splitlines()[0][:200] if out.strip() else ""
    fmt = "{{.Digest}}" if rt == "podman" else "{{json .RepoDigests}}"
    code, out, err = run([rt, "image", "inspect", "--format", fmt, "--", image])
    if code != 0:
        raise ProbeFailed(f"image {image} is not on {machine} ({rt} image inspect ended "
                          f"{code}: {err.strip()[:300]}); load it there first")
    if digest not in out:
        raise ProbeFailed(f"the image {machine} holds under {image} has digest "
                          f"{out.strip()[:200]!r}, not {digest}")
    code, out, err = run([rt, "run", "--rm", "--pull", "never", "--network", "none", "--",
                          image])
    if code != 0:
        raise ProbeFailed(f"`{rt} run {image}` on {machine} ended {code}: "
                          f"{(err or out).strip()[:300]}")
    if expect_output is not None and expect_output not in out:
        raise ProbeFailed(f"`{rt} run {image}` on {machine} printed {out[:200]!r}, which does "
                          f"not contain the expected {expect_output!r}")
    code, info, err = run([rt, "info", "--format", "json"])
    cpus, memory = _sizes(rt, info) if code == 0 else (None, None)
    if cpus is None or memory is None:
        raise ProbeFailed(f"`{rt} info` on {machine} did not say its CPUs and memory "
                          f"(ended {code}: {err.strip()[:200]})")
    return {"image": image, "digest": digest,
            "name_checked": False,  # the digest decides what ran; the name is as given
            "runtime": rt, "runtime_version": version,
            "outcome": "exit 0" + (f", output contains {expect_output!r}"
                                   if expect_output is not None else ""),
            "output_sha256": hashlib.sha256(out.encode()).hexdigest(),
            "output": out[:OUTPUT_KEPT], "cpus": cpus, "memory_bytes": memory}


def _sizes(rt: str, info: str) -> tuple[int | None, int | None]:
    try:
        data = json.loads(info)
    except ValueError:
        return None, None
    if rt == "podman":
        host = data.get("host") if isinstance(data, dict) else None
        got = (host.get("cpus"), host.get("memTotal")) if isinstance(host, dict) else (None, None)
    else:
        got = (data.get("NCPU"), data.get("MemTotal")) if isinstance(data, dict) else (None, None)
    cpus, memory = got
    return (cpus if type(cpus) is int and 1 <= cpus <= MAX_CPUS else None,
            memory if type(memory) is int and 1 << 20 <= memory <= MAX_MEMORY else None)


def _runner(ctx: Context, name: str) -> Runner:
    m = ctx.machine(name)
    if m.transport == "ssh":
        conn = ctx.ssh(m)

        def far(argv: list[str]) -> tuple[int, str, str]:
            try:
                done = conn.run(shlex.join(argv), timeout=300)
            except TransportError as e:
                raise ProbeFailed(f"machine {name} could not be asked: {e}") from None
            return done.exit_code, done.out, done.err
        return far

    def here(argv: list[str]) -> tuple[int, str, str]:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                                  check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ProbeFailed(f"{argv[0]} on {name}: {e}") from None
        return done.returncode, done.stdout, done.stderr
    return here
