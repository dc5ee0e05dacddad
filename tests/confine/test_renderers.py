"""One Policy, three renderings: they must grant and deny the same paths.

Each renderer's own tests live with it (test_bwrap.py, test_seatbelt.py,
test_landlock.py); here the renderings are held against each other."""

from __future__ import annotations

import json
import re

from saphan.confine import bwrap, landlock, seatbelt
from saphan.confine.policy import DEVICE_LITERALS, Policy

POLICY = Policy(
    workdir="/w/repo",
    writable_dirs=("/w/repo", "/ws/runs/R/out", "/w/.git/worktrees/r"),
    writable_literals=DEVICE_LITERALS,
    readonly_dirs=("/w/repo/.git",),
    read_denials=("/ws/record.key", "/ws/config.toml"),
    scratch_dir="/w/repo/.saphan-run/tmp",
)


def _bwrap_sets(argv: list[str]) -> tuple[set[str], set[str], list[str]]:
    writable, readonly, order = set(), set(), []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--bind", "--dev-bind-try", "--bind-try"):
            writable.add(argv[i + 2])
            order.append("w")
            i += 3
        elif a == "--ro-bind" and argv[i + 1] == "/dev/null":
            order.append("deny:" + argv[i + 2])
            i += 3
        elif a == "--ro-bind":
            if argv[i + 2] != "/":
                readonly.add(argv[i + 2])
                order.append("ro")
            i += 3
        else:
            i += 1
    return writable, readonly, order


def _seatbelt_rules(profile: str) -> list[tuple[str, set[str]]]:
    """(rule head, paths) per top-level rule, in order."""
    rules = []
    for block in re.split(r"\n(?=\()", profile.strip()):
        head = block.splitlines()[0].strip()
        rules.append((head, set(re.findall(r'\((?:subpath|literal) "([^"]+)"\)', block))))
    return rules


def test_bwrap_and_seatbelt_grant_the_same_set() -> None:
    argv = bwrap.render(POLICY, "/usr/bin/bwrap")
    b_writable, b_readonly, _order = _bwrap_sets(argv)
    rules = dict(_seatbelt_rules(seatbelt.render(POLICY))[2:])
    assert b_writable == rules["(allow file-write*"] == set(POLICY.writable_set())
    assert b_readonly == rules["(deny file-write*"] == set(POLICY.readonly_dirs)


def test_read_denials_come_last_in_both() -> None:
    argv = bwrap.render(POLICY, "/usr/bin/bwrap")
    _, _, order = _bwrap_sets(argv)
    denials = [o for o in order if o.startswith("deny:")]
    assert order[-len(denials):] == denials
    assert {d[5:] for d in denials} == set(POLICY.read_denials)
    profile = seatbelt.render(POLICY).rstrip().splitlines()
    last_rule = "\n".join(profile[profile.index("(deny file-read* file-write*"):])
    for path in POLICY.read_denials:
        assert f'"{path}"' in last_rule
    # nothing after the denial block
    assert profile[-1].endswith(")")


def test_landlock_rendering_carries_the_same_writable_set() -> None:
    plain = Policy(workdir="/w", writable_dirs=("/w", "/o"), scratch_dir="/w/.saphan-run/tmp")
    value = json.loads(landlock.render(plain))
    assert value == {"version": 1, "workdir": "/w", "readable": "everything",
                     "writable": ["/w", "/o", *DEVICE_LITERALS]}
    argv = bwrap.render(plain, "bwrap")
    assert _bwrap_sets(argv)[0] == set(value["writable"])
