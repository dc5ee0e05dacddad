"""Policy -> Seatbelt profile (confine/seatbelt.py): deny every write, allow the
policy's set, then carve-outs and read denials last. sandbox-exec exists only on
macOS, so the profile is checked as text: its rules, their order, its quoting."""

from __future__ import annotations

import re

from saphan.confine import seatbelt
from saphan.confine.policy import DEVICE_LITERALS, Policy

POLICY = Policy(
    workdir="/w/repo",
    writable_dirs=("/w/repo", "/ws/runs/R/out", "/w/.git/worktrees/r"),
    writable_literals=DEVICE_LITERALS,
    readonly_dirs=("/w/repo/.git",),
    read_denials=("/ws/record.key", "/ws/config.toml"),
    scratch_dir="/w/repo/.saphan-run/tmp",
)


#: a Seatbelt string: quotes, with backslash escapes inside
STRING = r'"(?:[^"\\]|\\.)*"'


def _heads(profile: str) -> list[str]:
    """The first line of each top-level rule, in order."""
    return [b.splitlines()[0] for b in re.split(r"\n(?=\()", profile.strip())]


def test_seatbelt_golden() -> None:
    assert seatbelt.render(POLICY) == (
        '(version 1)\n'
        '(allow default)\n'
        '(deny file-write*)\n'
        '(allow file-write*\n'
        '    (subpath "/w/repo")\n'
        '    (subpath "/ws/runs/R/out")\n'
        '    (subpath "/w/.git/worktrees/r")\n'
        '    (literal "/dev/null")\n'
        '    (literal "/dev/tty")\n'
        '    (literal "/dev/zero")\n'
        '    (literal "/dev/random")\n'
        '    (literal "/dev/urandom"))\n'
        '(deny file-write*\n'
        '    (subpath "/w/repo/.git"))\n'
        '(deny file-read* file-write*\n'
        '    (subpath "/ws/record.key")\n'
        '    (subpath "/ws/config.toml"))\n'
    )


def test_an_egress_run_renders_no_network_but_the_doors_socket_and_port() -> None:
    policy = Policy(workdir="/w", writable_dirs=("/w",), hidden_dirs=("/ws",),
                    network="egress", door_dir="/ws/runs/R/door")
    profile = seatbelt.render(policy)
    assert profile.endswith(
        '(deny network*)\n'
        '(allow network-outbound (remote unix-socket (path-literal '
        '"/ws/runs/R/door/door.sock")))\n'
        '(allow network-outbound (remote ip "localhost:3128"))\n')
    # the door's directory is readable again under the hidden workspace
    assert '(allow file-read*\n    (subpath "/w")\n    (subpath "/ws/runs/R/door"))' in profile
    # last: nothing after the network rules re-opens the network
    assert _heads(profile)[-3:] == ["(deny network*)", "(allow network-outbound (remote "
                                    "unix-socket (path-literal \"/ws/runs/R/door/door.sock\")))",
                                    '(allow network-outbound (remote ip "localhost:3128"))']


def test_hidden_workspaces_are_denied_then_the_runs_own_paths_readable_again() -> None:
    policy = Policy(workdir="/w", writable_dirs=("/w", "/ws/runs/R/out"),
                    readonly_dirs=("/w/.git",), hidden_dirs=("/ws",),
                    read_denials=("/ws/record.key",))
    profile = seatbelt.render(policy)
    assert _heads(profile) == [
        "(version 1)", "(allow default)", "(deny file-write*)",
        "(deny file-read* file-write*",  # the hidden workspace, before any grant
        "(allow file-read*",  # the run's own paths under it, readable again
        "(allow file-write*",
        "(deny file-write*",
        "(deny file-read* file-write*",  # read denials: last, nothing re-grants them
    ]
    blocks = re.split(r"\n(?=\()", profile.strip())
    assert re.findall(r'"([^"]+)"', blocks[3]) == ["/ws"]
    assert re.findall(r'"([^"]+)"', blocks[4]) == ["/w", "/ws/runs/R/out", "/w/.git"]
    assert re.findall(r'"([^"]+)"', blocks[-1]) == ["/ws/record.key"]


def test_nothing_to_carve_out_or_deny_gives_no_empty_rules() -> None:
    profile = seatbelt.render(Policy(workdir="/w", writable_dirs=("/w",), writable_literals=()))
    assert profile == '(version 1)\n(allow default)\n(deny file-write*)\n(allow file-write*\n' \
                      '    (subpath "/w"))\n'


def test_quotes_and_backslashes_in_a_path_cannot_end_the_string() -> None:
    odd = '/w/a"b\\c) (allow file-write* (subpath "/'
    profile = seatbelt.render(Policy(workdir=odd, writable_dirs=(odd,), writable_literals=()))
    # Outside its strings the profile is the plain one: the path stayed inside its string.
    strings = re.findall(STRING, profile)
    assert re.sub(STRING, '""', profile) == (
        '(version 1)\n(allow default)\n(deny file-write*)\n(allow file-write*\n    (subpath ""))\n')
    assert strings == ['"/w/a\\"b\\\\c) (allow file-write* (subpath \\"/"']


def test_argv_runs_sandbox_exec_with_the_profile_file() -> None:
    assert seatbelt.argv(POLICY, "/ws/runs/R/seatbelt.sb") == [
        "/usr/bin/sandbox-exec", "-f", "/ws/runs/R/seatbelt.sb"]
