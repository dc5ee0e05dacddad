"""Policy -> bubblewrap argv (confine/bwrap.py): the order of the arguments is
the security property, so it is asserted on the argv AND by running the
rendered jail with the real bubblewrap and looking at what it lets through."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from saphan.confine import bwrap
from saphan.confine.grants import derive
from saphan.confine.policy import DEVICE_LITERALS, Policy

TAIL = ["--unshare-user", "--unshare-pid", "--proc", "/proc", "--die-with-parent",
        "--new-session", "--cap-drop", "ALL"]


def _index(argv: list[str], *seq: str) -> int:
    """Where the consecutive arguments ``seq`` start in ``argv``."""
    for i in range(len(argv) - len(seq) + 1):
        if argv[i:i + len(seq)] == list(seq):
            return i
    raise AssertionError(f"{seq} not in {argv}")


# -- the argv ------------------------------------------------------------------

HIDDEN_POLICY = Policy(
    workdir="/w/repo",
    writable_dirs=("/w/repo", "/ws/runs/R/out", "/w/repo/.saphan/runs/R/out"),
    readonly_dirs=("/w/repo/.git",),
    hidden_dirs=("/ws", "/w/repo/.saphan"),
    read_denials=("/etc/saphan-test-missing-secret",),
    scratch_dir="/w/repo/.saphan-run/tmp",
    setenv=(("GIT_OBJECT_DIRECTORY", "/w/repo/.saphan-run/objects"),),
)


def test_everything_read_only_first_then_hiding_then_grants() -> None:
    argv = bwrap.render(HIDDEN_POLICY, "/usr/bin/bwrap")
    assert argv[:4] == ["/usr/bin/bwrap", "--ro-bind", "/", "/"]
    hide_ws = _index(argv, "--perms", "0700", "--tmpfs", "/ws")
    bind_wd = _index(argv, "--bind", "/w/repo", "/w/repo")
    # A workspace outside the workdir is hidden before the grants are bound…
    assert hide_ws < bind_wd
    # …one inside the workdir after the workdir's bind, which would cover it.
    hide_inner = _index(argv, "--perms", "0700", "--tmpfs", "/w/repo/.saphan")
    assert hide_inner > bind_wd
    # The run's own paths under a hidden workspace come back after its tmpfs.
    assert _index(argv, "--bind", "/ws/runs/R/out", "/ws/runs/R/out") > hide_ws
    inner_out = "/w/repo/.saphan/runs/R/out"
    back = [i for i in range(len(argv) - 2) if argv[i:i + 3] == ["--bind", inner_out, inner_out]]
    assert back and max(back) > hide_inner
    # Then the carve-outs and the read-only remount of each hidden tmpfs.
    ro = _index(argv, "--ro-bind", "/w/repo/.git", "/w/repo/.git")
    assert ro > max(back)
    assert _index(argv, "--remount-ro", "/ws") > ro
    assert _index(argv, "--remount-ro", "/w/repo/.saphan") > ro


def test_an_egress_run_is_cut_and_gets_the_doors_directory_read_only() -> None:
    policy = replace(HIDDEN_POLICY, network="egress", door_dir="/ws/runs/R/door")
    argv = bwrap.render(policy, "/usr/bin/bwrap")
    assert "--unshare-net" in argv
    door = _index(argv, "--ro-bind", "/ws/runs/R/door", "/ws/runs/R/door")
    # after the hiding tmpfs (it is under a hidden workspace), before its
    # read-only remount, and never writable
    assert _index(argv, "--perms", "0700", "--tmpfs", "/ws") < door
    assert door < _index(argv, "--remount-ro", "/ws")
    assert "/ws/runs/R/door" not in [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    plain = bwrap.render(HIDDEN_POLICY, "/usr/bin/bwrap")
    assert "--unshare-net" not in plain and "/ws/runs/R/door" not in plain
    from saphan.confine.compose import bridge_args

    assert bridge_args(policy) == ["--bridge", "127.0.0.1:3128=/ws/runs/R/door/door.sock"]
    assert bridge_args(HIDDEN_POLICY) == []


def test_around_a_self_confined_tool_only_namespaces_hiding_and_denials() -> None:
    policy = replace(HIDDEN_POLICY, network="egress", door_dir="/ws/runs/R/door",
                     read_denials=("/etc/saphan-test-missing-secret",))
    argv = bwrap.render_cut_around(policy, "/usr/bin/bwrap")
    assert argv[:4] == ["/usr/bin/bwrap", "--bind", "/", "/"]
    hide = _index(argv, "--perms", "0700", "--tmpfs", "/ws")
    assert hide < _index(argv, "--bind", "/ws/runs/R/out", "/ws/runs/R/out")
    assert hide < _index(argv, "--ro-bind", "/ws/runs/R/door", "/ws/runs/R/door") \
        < _index(argv, "--remount-ro", "/ws")
    assert _index(argv, "--ro-bind", "/dev/null", "/etc/saphan-test-missing-secret") > hide
    assert argv[-18:] == ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add",
                          "CAP_SETGID", "--cap-add", "CAP_SETFCAP", "--unshare-user",
                          "--unshare-pid", "--unshare-net", "--proc", "/proc", "--die-with-parent",
                          "--new-session", "--chdir", "/w/repo", "--"]
    # the tool's own sandbox keeps the writes (only the three capabilities
    # it needs to map its uids inside are left)
    assert "--ro-bind" not in argv[:4]


@pytest.mark.usefixtures("bwrap_available")
def test_around_a_self_confined_tool_the_hiding_cannot_be_undone(tmp_path: Path) -> None:
    """As root, with every capability kept, a process in the cut could
    unmount the denial over a secret (review: measured). Not with these."""
    secret = tmp_path / "secret.key"
    secret.write_text("sk-secret\n")
    policy = Policy(workdir=str(tmp_path), writable_dirs=(str(tmp_path),),
                    read_denials=(str(secret),), network="egress")
    argv = bwrap.render_cut_around(policy, "bwrap")
    script = (f"cat {secret}; umount {secret} 2>&1 && echo UNMOUNTED; cat {secret}; "
              "grep CapEff /proc/self/status")
    p = subprocess.run([*argv, "sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert "sk-secret" not in p.stdout and "UNMOUNTED" not in p.stdout, p.stdout
    eff = int(p.stdout.split("CapEff:")[1].split()[0], 16)
    assert eff & ~((1 << 6) | (1 << 7) | (1 << 31)) == 0, hex(eff)  # SETGID, SETUID, SETFCAP


def test_read_denials_are_the_last_word_about_their_path(tmp_path: Path) -> None:
    secret_file = tmp_path / "record.key"
    secret_file.write_text("k")
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    policy = Policy(workdir=str(tmp_path), writable_dirs=(str(tmp_path),),
                    read_denials=(str(secret_file), str(secret_dir)))
    argv = bwrap.render(policy, "bwrap")
    deny_file = _index(argv, "--ro-bind", "/dev/null", str(secret_file))
    deny_dir = _index(argv, "--tmpfs", str(secret_dir), "--remount-ro", str(secret_dir))
    last_bind = max(i for i, a in enumerate(argv) if a in ("--bind", "--bind-fd", "--dev-bind-try"))
    assert min(deny_file, deny_dir) > last_bind
    assert max(deny_file, deny_dir) < _index(argv, *TAIL[:1])


def test_the_tail_isolates_the_jail_and_sets_its_directory_and_variables() -> None:
    argv = bwrap.render(HIDDEN_POLICY, "bwrap")
    tail = argv[_index(argv, *TAIL):]
    assert tail == [*TAIL, "--chdir", "/w/repo",
                    "--setenv", "TMPDIR", "/w/repo/.saphan-run/tmp",
                    "--setenv", "GIT_OBJECT_DIRECTORY", "/w/repo/.saphan-run/objects", "--"]


def test_no_scratch_dir_sets_no_tmpdir() -> None:
    argv = bwrap.render(Policy(workdir="/w", writable_dirs=("/w",)), "bwrap")
    assert "TMPDIR" not in argv
    assert argv[-1] == "--"


def test_devices_are_bound_with_devices_usable_other_literals_plainly() -> None:
    policy = Policy(workdir="/w", writable_dirs=("/w",),
                    writable_literals=(*DEVICE_LITERALS, "/w2/.git/refs/heads/x.lock"))
    argv = bwrap.render(policy, "bwrap")
    for dev in DEVICE_LITERALS:
        assert _index(argv, "--dev-bind-try", dev, dev)
    assert _index(argv, "--bind", "/w2/.git/refs/heads/x.lock", "/w2/.git/refs/heads/x.lock")
    assert "--dev-bind" not in argv


def test_a_directory_with_a_descriptor_is_bound_by_it() -> None:
    policy = Policy(workdir="/w", writable_dirs=("/w", "/o"))
    argv = bwrap.render(policy, "bwrap", {"/w": 17})
    assert _index(argv, "--bind-fd", "17", "/w")
    assert _index(argv, "--bind", "/o", "/o")
    assert ["--bind", "/w", "/w"] not in [argv[i:i + 3] for i in range(len(argv))]


def test_the_outer_jail_leaves_writes_to_landlock_but_hides_and_denies() -> None:
    argv = bwrap.render_outer(HIDDEN_POLICY, "bwrap")
    # `--bind`, never `--dev-bind`: device nodes stay unusable under it.
    assert argv[:4] == ["bwrap", "--bind", "/", "/"]
    assert "--dev-bind" not in argv
    # The workdir is not bound again (it is writable already); the run's own
    # paths under the hidden workspaces are.
    assert ["--bind", "/w/repo", "/w/repo"] not in [argv[i:i + 3] for i in range(len(argv))]
    assert _index(argv, "--bind", "/ws/runs/R/out", "/ws/runs/R/out") > _index(argv, "--tmpfs", "/ws")
    assert _index(argv, "--ro-bind", "/w/repo/.git", "/w/repo/.git")
    assert _index(argv, "--remount-ro", "/ws")
    assert argv[_index(argv, *TAIL):][-1] == "--"


# -- the rendered jail, run by the real bubblewrap ---------------------------------

@dataclass
class Tree:
    wd: Path
    outside: Path
    ws: Path  # a workspace outside the workdir
    inner_ws: Path  # a workspace inside the workdir
    out: Path  # the run's return path, under ws
    inner_out: Path  # under inner_ws

    def policy(self, **kw: object) -> Policy:
        return replace(Policy(
            workdir=str(self.wd),
            writable_dirs=(str(self.wd), str(self.out), str(self.inner_out)),
            readonly_dirs=(str(self.wd / ".git"),),
            hidden_dirs=(str(self.ws), str(self.inner_ws)),
            scratch_dir=str(self.wd / ".saphan-run" / "tmp"),
        ), **kw)


@pytest.fixture
def tree(tmp_path: Path, bwrap_available: None) -> Tree:
    wd = tmp_path / "wd"
    (wd / ".git").mkdir(parents=True)
    (wd / ".git" / "config").write_text("[core]\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("victim\n")
    ws = tmp_path / "ws"
    out = ws / "runs" / "R" / "out"
    out.mkdir(parents=True)
    (ws / "record.key").write_text("WORKSPACE-KEY\n")
    inner_ws = wd / ".saphan"
    inner_out = inner_ws / "runs" / "R" / "out"
    inner_out.mkdir(parents=True)
    (inner_ws / "record.key").write_text("INNER-KEY\n")
    return Tree(wd, outside, ws, inner_ws, out, inner_out)


def _jail(argv: Sequence[str], script: str, pass_fds: Sequence[int] = ()) -> dict[str, str]:
    """Run ``script`` (lines of ``name: command``) in the jail; name -> ok/REFUSED."""
    body = "; ".join(f"if ( {cmd} ) >/dev/null 2>&1; then echo {name}=ok; else echo {name}=REFUSED; fi"
                     for name, cmd in (line.split(": ", 1) for line in script.strip().splitlines()))
    p = subprocess.run([*argv, "sh", "-c", body], capture_output=True, text=True, timeout=30,
                       pass_fds=tuple(pass_fds))
    assert p.returncode == 0, p.stderr
    return dict(line.split("=", 1) for line in p.stdout.splitlines())


def test_the_jail_writes_the_workdir_and_the_return_paths_only(tree: Tree) -> None:
    got = _jail(bwrap.render(tree.policy(), "bwrap"), f"""
inside: echo x > {tree.wd}/new.txt
out: echo x > {tree.out}/result.txt
inner_out: echo x > {tree.inner_out}/result.txt
outside: echo x > {tree.outside}/victim.txt
tmp: echo x > /tmp/saphan-bwrap-unit-$$
git_config: echo x >> {tree.wd}/.git/config
dev_null: echo x > /dev/null
""")
    assert got == {"inside": "ok", "out": "ok", "inner_out": "ok", "outside": "REFUSED",
                   "tmp": "REFUSED", "git_config": "REFUSED", "dev_null": "ok"}
    assert (tree.wd / "new.txt").read_text() == "x\n"
    assert (tree.out / "result.txt").read_text() == "x\n"
    assert (tree.inner_out / "result.txt").read_text() == "x\n"
    assert (tree.outside / "victim.txt").read_text() == "victim\n"
    assert (tree.wd / ".git" / "config").read_text() == "[core]\n"


def test_hidden_workspaces_show_nothing_but_the_runs_own_paths(tree: Tree) -> None:
    got = _jail(bwrap.render(tree.policy(), "bwrap"), f"""
key: cat {tree.ws}/record.key
inner_key: cat {tree.inner_ws}/record.key
plant: echo x > {tree.ws}/config.toml
inner_plant: echo x > {tree.inner_ws}/config.toml
only_runs: test "$(ls -A {tree.ws})" = runs
""")
    assert got == {"key": "REFUSED", "inner_key": "REFUSED", "plant": "REFUSED",
                   "inner_plant": "REFUSED", "only_runs": "ok"}
    assert sorted(p.name for p in tree.ws.iterdir()) == ["record.key", "runs"]


def test_read_denials_hide_a_file_and_a_directory_inside_the_workdir(tree: Tree) -> None:
    (tree.wd / "secret.key").write_text("TOPSECRET\n")
    (tree.wd / "secrets").mkdir()
    (tree.wd / "secrets" / "token").write_text("TOKEN\n")
    policy = tree.policy(read_denials=(str(tree.wd / "secret.key"), str(tree.wd / "secrets")))
    got = _jail(bwrap.render(policy, "bwrap"), f"""
file_read: grep -q TOPSECRET {tree.wd}/secret.key
file_write: echo x > {tree.wd}/secret.key
dir_read: cat {tree.wd}/secrets/token
dir_write: echo x > {tree.wd}/secrets/new
""")
    assert set(got.values()) == {"REFUSED"}, got
    assert (tree.wd / "secret.key").read_text() == "TOPSECRET\n"
    assert sorted(p.name for p in (tree.wd / "secrets").iterdir()) == ["token"]


def test_the_jail_starts_in_the_workdir_with_its_variables_and_its_own_pids(tree: Tree) -> None:
    policy = tree.policy(setenv=(("GIT_OBJECT_DIRECTORY", "/x/objects"),))
    got = _jail(bwrap.render(policy, "bwrap"), f"""
cwd: test "$(pwd)" = {tree.wd}
tmpdir: test "$TMPDIR" = {tree.wd}/.saphan-run/tmp
setenv: test "$GIT_OBJECT_DIRECTORY" = /x/objects
own_pids: ! test -e /proc/{os.getpid()}
no_caps: grep -q '^CapEff:.0000000000000000$' /proc/self/status
""")
    assert got == dict.fromkeys(("cwd", "tmpdir", "setenv", "own_pids", "no_caps"), "ok")


def test_a_directory_bound_by_descriptor_stays_the_one_checked(tree: Tree) -> None:
    """The path is swapped for another directory after the descriptor was
    opened: the jail writes the directory that was opened, never the new one."""
    real = tree.wd.parent / "wd-real"
    fd = os.open(tree.wd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        argv = bwrap.render(Policy(workdir=str(tree.wd), writable_dirs=(str(tree.wd),)), "bwrap",
                            {str(tree.wd): fd})
        tree.wd.rename(real)
        tree.wd.mkdir()
        got = _jail(argv, f"write: echo x > {tree.wd}/planted.txt", pass_fds=(fd,))
    finally:
        os.close(fd)
    assert got == {"write": "ok"}
    assert (real / "planted.txt").read_text() == "x\n"
    assert list(tree.wd.iterdir()) == []


def test_a_directory_swapped_for_a_link_is_never_bound(tree: Tree) -> None:
    fd = os.open(tree.wd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        argv = bwrap.render(Policy(workdir=str(tree.wd), writable_dirs=(str(tree.wd),)), "bwrap",
                            {str(tree.wd): fd})
        tree.wd.rename(tree.wd.parent / "wd-real")
        tree.wd.symlink_to(tree.outside)
        p = subprocess.run([*argv, "sh", "-c", f"echo x > {tree.wd}/planted.txt"],
                           capture_output=True, text=True, timeout=30, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert p.returncode != 0
    assert sorted(x.name for x in tree.outside.iterdir()) == ["victim.txt"]


def test_the_outer_jail_keeps_devices_unusable_and_workspaces_hidden(tree: Tree) -> None:
    got = _jail(bwrap.render_outer(tree.policy(), "bwrap"), f"""
dev_full: head -c 1 /dev/full
dev_null: echo x > /dev/null
key: cat {tree.ws}/record.key
out: echo x > {tree.out}/result.txt
git_config: echo x >> {tree.wd}/.git/config
""")
    assert got == {"dev_full": "REFUSED", "dev_null": "ok", "key": "REFUSED", "out": "ok",
                   "git_config": "REFUSED"}
    assert (tree.out / "result.txt").read_text() == "x\n"
    assert (tree.wd / ".git" / "config").read_text() == "[core]\n"


def test_a_later_grant_cannot_re_expose_a_read_denial(tmp_path: Path, bwrap_available: None) -> None:
    """The secret sits inside a writable directory; the denial still wins."""
    wd = tmp_path / "wd"
    wd.mkdir()
    secret = wd / "secret.key"
    secret.write_text("TOPSECRET\n")
    policy = derive(str(wd), read_denials=(str(secret),))
    argv = bwrap.render(policy, "bwrap")
    assert argv.index(str(secret)) > max(i for i, a in enumerate(argv) if a in ("--bind", "--bind-fd"))
    p = subprocess.run([*argv, "sh", "-c", f"cat {secret}; echo x > {secret}"],
                       capture_output=True, text=True)
    assert "TOPSECRET" not in p.stdout
    assert secret.read_text() == "TOPSECRET\n"
