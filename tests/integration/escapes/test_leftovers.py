"""The boundary against what earlier runs leave behind (the leftovers battery).

Every route here was measured as an escape on an earlier build. Each test
plants what a jailed run could plant — through a real jailed run where the
boundary allows the planting, directly where it models an older build's
leftovers — then lets the next run, saphan itself, or the operator's own
git act, and asserts the victim is byte-for-byte unchanged. Routes run on
bubblewrap and, where the lane differs, on the local Landlock lane.
A summary at the end prints attempts and refusals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import escapes
from conftest import Saphan, require
from saphan import _native

pytestmark = pytest.mark.usefixtures("bwrap_available")

GIT_ENV = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
           "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid"}

#: route -> "refused" | "escaped", filled by the tests, printed by the summary
TALLY: dict[str, str] = {}


def _tally(route: str, held: bool) -> None:
    TALLY[route] = "refused" if held else "ESCAPED"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={**os.environ, **GIT_ENV}).stdout


@pytest.fixture(params=["bubblewrap", "landlock"])
def lane(request: pytest.FixtureRequest, saphan_sqlite: Saphan) -> tuple[Saphan, list[str]]:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "2")
    if request.param == "landlock":
        require(_native.landlock_abi()[0] >= 3, "a kernel with Landlock ABI >= 3")
        s.ok("machine", "probe-confinement", "here")
        return s, ["--boundary", "landlock"]
    return s, []


@pytest.fixture
def bw(saphan_sqlite: Saphan) -> Saphan:
    saphan_sqlite.ok("machine", "add", "here", "--local")
    saphan_sqlite.ok("slot", "add", "here", "s1", "--tool", "command")
    return saphan_sqlite


def run(s: Saphan, extra: list[str], *where_and_cmd: str, **kw: object) -> tuple[int, str, str,
                                                                                   dict[str, object]]:
    r = s("run", "--machine", "here", "--slot", "s1", *extra, *where_and_cmd,
          env=s.env(**GIT_ENV), **kw)  # type: ignore[arg-type]
    shown = s("runs", "show", "last", "--json")
    rec = json.loads(shown.out) if shown.out.strip().startswith("{") else {}
    return r.code, r.out, r.err, rec


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "app.py").write_text("print('main')\n")
    git(r, "add", "app.py")
    git(r, "commit", "-q", "-m", "base")
    return r


def _victims(tmp_path: Path) -> dict[str, Path]:
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    v = out / "victim.txt"
    v.write_text("precious\n" * 50)
    return {"outside": out, "victim": v}


def _snapshot(paths: list[Path]) -> dict[str, str]:
    snap = {}
    for root in paths:
        for p in sorted([root, *root.rglob("*")]) if root.is_dir() else [root]:
            if p.is_symlink():
                snap[str(p)] = "link:" + os.readlink(p)
            elif p.is_file():
                snap[str(p)] = escapes.digest(p)
            elif p.is_dir():
                snap[str(p)] = "dir"
    return snap


# -- 1. planted .git that used to widen the next run's grants ------------------

@pytest.mark.parametrize("target", ["root", "tmp", "workspace"])
def test_planted_git_layout_grants_nothing_outside(lane: tuple[Saphan, list[str]],
                                                  tmp_path: Path, target: str) -> None:
    s, extra = lane
    wd = tmp_path / "wd"
    wd.mkdir()
    v = _victims(tmp_path)
    # What a first jailed run wrote (all inside its workdir): a linked-worktree
    # lookalike whose refs/objects are relative links out of the workdir.
    depth = len(wd.parts) + 4
    up = "../" * depth
    aim = {"root": up.rstrip("/"), "tmp": up + "tmp", "workspace": up + str(s.home).lstrip("/")}
    plant = (
        "mkdir -p .x/g/worktrees/w .x/g/logs && printf 'gitdir: %s/.x/g/worktrees/w\\n' \"$PWD\" "
        "> .git && echo ../.. > .x/g/worktrees/w/commondir && "
        "echo \"$PWD/.git\" > .x/g/worktrees/w/gitdir && "
        "echo 'ref: refs/heads/saphan/x' > .x/g/worktrees/w/HEAD && "
        f"mkdir -p .x/g/refs && ln -s {aim[target]} .x/g/refs/heads && "
        f"ln -s {aim[target]} .x/g/objects && echo planted"
    )
    code, out, err, _ = run(s, extra, "--workdir", str(wd), "--", "sh", "-c", plant)
    assert code == 0 and "planted" in out, err
    before = _snapshot([v["outside"], s.home / "record.key", s.home / "config.toml"])
    db_before = escapes.digest(s.home / "saphan.db")
    victim_dir = {"root": v["outside"], "tmp": Path("/tmp"), "workspace": s.home}[target]
    attack = (
        f"for p in .x/g/refs/heads/saphan .x/g/objects .x/g/refs/heads; do "
        f"echo x > $p/pwned-{target} 2>/dev/null && echo WROTE $p; done; "
        f"echo x > .x/g/refs/heads/{v['victim'].relative_to('/')} 2>/dev/null && echo WROTE victim;"
        " echo done"
    )
    code, out, err, rec = run(s, extra, "--workdir", str(wd), "--", "sh", "-c", attack)
    assert code == 0, err
    assert "WROTE" not in out, out
    writable = rec["writable"]
    assert isinstance(writable, list)
    real_wd = os.path.realpath(wd)
    for w in writable:
        assert w.startswith(real_wd) or w.startswith(str(s.home / "runs")) or w.startswith("/dev/"), w
        assert os.path.realpath(w) == w  # resolved: what was bound is what is listed
    assert not (victim_dir / f"pwned-{target}").exists()
    assert _snapshot([v["outside"], s.home / "record.key", s.home / "config.toml"]) == before
    assert any("cannot commit" in n for n in rec["notes"])  # type: ignore[union-attr]
    del db_before  # the store changed by design (the run's own rows); records verify below
    assert s("runs", "list", "--json").code == 0
    _tally(f"planted .git -> {target} ({'landlock' if extra else 'bubblewrap'})", True)


def test_workdir_inside_a_repository_cannot_write_its_git(lane: tuple[Saphan, list[str]],
                                                          repo: Path) -> None:
    s, extra = lane
    sub = repo / "sub"
    sub.mkdir()
    config = (repo / ".git" / "config").read_bytes()
    head = (repo / ".git" / "HEAD").read_bytes()
    code, out, err, _ = run(s, extra, "--workdir", str(sub), "--", "sh", "-c",
                            "echo '[core]' >> ../.git/config && echo WROTE; "
                            "git commit -q --allow-empty -m x 2>/dev/null && echo COMMITTED; "
                            "echo done")
    assert code == 0, err
    assert "WROTE" not in out and "COMMITTED" not in out, out
    assert (repo / ".git" / "config").read_bytes() == config
    assert (repo / ".git" / "HEAD").read_bytes() == head
    _tally(f"workdir inside a repository ({'landlock' if extra else 'bubblewrap'})", True)


# -- 2. saphan's own writes never follow a planted link ---------------------------

def test_planted_scratch_link_is_refused_by_name(bw: Saphan, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    v = _victims(tmp_path)
    (wd / ".saphan-run").symlink_to(v["outside"])
    before = _snapshot([v["outside"]])
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "true")
    assert r.code == 3, r.err
    assert "refused [workdir-unsafe]" in r.err and ".saphan-run" in r.err
    assert _snapshot([v["outside"]]) == before
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and rec["refusal"]["class"] == "workdir-unsafe"
    _tally("planted scratch link", True)


def test_planted_info_exclude_link_is_not_followed(bw: Saphan, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    v = _victims(tmp_path)
    # A first run in a plain directory may create any .git it likes.
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           f"mkdir -p .git && ln -s {v['outside']} .git/info && echo planted")
    assert r.code == 0 and "planted" in r.out, r.err
    assert "protected" in r.err or ".git" in r.err  # reported on the terminal
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert any(c["name"] == ".git" for c in rec["protected_changes"])
    before = _snapshot([v["outside"]])
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "true")
    assert r.code == 0, r.err
    assert _snapshot([v["outside"]]) == before
    assert not (v["outside"] / "exclude").exists()
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert any("info/exclude" in n and "symbolic link" in n for n in rec["notes"])
    _tally("planted info/exclude link", True)


def test_scratch_never_collides_with_a_workspace(bw: Saphan, tmp_path: Path) -> None:
    """--workdir $HOME with another workspace at $HOME/.saphan: saphan's scratch
    is .saphan-run/, and the other workspace is hidden from the jail."""
    home = tmp_path / "home"
    other = home / ".saphan"
    other.mkdir(parents=True)
    (other / "record.key").write_bytes(b"k" * 32)
    os.chmod(other / "record.key", 0o600)
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(home), "--", "sh", "-c",
           "cat ~/.saphan/record.key && echo READ; ls -A ~/.saphan; echo x > ~/.saphan/w && "
           "echo WROTE; echo done", env=bw.env(HOME=str(home)))
    assert r.code == 0, r.err
    assert "READ" not in r.out and "kkkk" not in r.out
    assert sorted(p.name for p in other.iterdir()) == ["record.key"]
    assert (home / ".saphan-run" / "tmp").is_dir()
    _tally("another workspace's key (default ~/.saphan)", True)


# -- 3. nothing a run writes is interpreted later; nothing old can change ------------

FSMONITOR_PLANT = r"""
set +e
gd=$(sed 's/^gitdir: //' .git)
mkdir -p fake && printf '[core]\n\tfsmonitor = "touch {marker}; false"\n' > fake/config
mkdir -p fake/objects fake/refs && echo 'ref: refs/heads/x' > fake/HEAD
echo "$PWD/fake" > $gd/commondir 2>/dev/null && echo WROTE commondir
echo "$PWD/.git" > $gd/gitdir.new 2>/dev/null && mv $gd/gitdir.new $gd/gitdir 2>/dev/null && echo WROTE gitdir
printf 'gitdir: %s/fake\n' "$PWD" > .git 2>/dev/null && echo WROTE dotgit
printf '[core]\n\tfsmonitor = "touch {marker}; false"\n' > $gd/config.worktree && echo MADE config.worktree
echo locked > $gd/locked && echo MADE locked
echo done
"""


def test_git_metadata_rewrite_does_not_run_in_the_operators_git(lane: tuple[Saphan, list[str]],
                                                                repo: Path, tmp_path: Path) -> None:
    s, extra = lane
    marker = tmp_path / "FSMONITOR-RAN"
    git(repo, "config", "extensions.worktreeConfig", "true")
    code, out, err, rec = run(s, extra, "--repo", str(repo), "--", "sh", "-c",
                              FSMONITOR_PLANT.format(marker=marker))
    assert code == 0, err
    for what in ("commondir", "gitdir", "dotgit"):
        assert f"WROTE {what}" not in out, out
    wt = Path(rec["worktree"]["path"])  # type: ignore[index]
    gd = Path(git(wt, "rev-parse", "--absolute-git-dir").strip())
    assert not (gd / "config.worktree").exists() and not (gd / "locked").exists()
    # The operator's git in the kept worktree runs nothing the run wrote.
    subprocess.run(["git", "-C", str(wt), "status"], capture_output=True, check=False)
    subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, check=True)
    assert not marker.exists()
    assert (wt / ".git").read_text().strip() == f"gitdir: {gd}"
    _tally(f"commondir/gitdir/.git rewrite + operator git status ({'landlock' if extra else 'bubblewrap'})",
           True)


def _blob_path(repo: Path, rev: str) -> Path:
    oid = git(repo, "rev-parse", rev).strip()
    return repo / ".git" / "objects" / oid[:2] / oid[2:]


def test_main_content_and_other_runs_branches_cannot_change(lane: tuple[Saphan, list[str]],
                                                           repo: Path) -> None:
    s, extra = lane
    # Run A commits on its branch.
    code, _, err, rec_a = run(s, extra, "--repo", str(repo), "--", "sh", "-c",
                              "echo a > a.txt && git add a.txt && git commit -q -m A")
    assert code == 0, err
    a_branch = rec_a["worktree"]["branch"]  # type: ignore[index]
    a_head = git(repo, "rev-parse", a_branch).strip()
    main_blob = _blob_path(repo, "main:app.py")
    before = {
        "main": git(repo, "rev-parse", "main").strip(),
        "show": git(repo, "show", "main:app.py"),
        "objects": _snapshot([repo / ".git" / "objects"]),
        "refs": _snapshot([repo / ".git" / "refs"]),
    }
    oid = main_blob.parent.name + main_blob.name
    attack = f"""
set +e
common={repo}/.git
chmod u+w $common/objects/{oid[:2]}/{oid[2:]} 2>/dev/null
printf 'forged' > $common/objects/{oid[:2]}/{oid[2:]} 2>/dev/null && echo WROTE loose
pk=$common/objects/pack/pack-$(printf '0%.0s' $(seq 40)).pack
cp {main_blob} $pk 2>/dev/null && echo WROTE pack
git update-ref refs/heads/{a_branch} HEAD 2>/dev/null && echo MOVED update-ref
echo 0000000000000000000000000000000000000000 > $common/refs/heads/{a_branch} 2>/dev/null && echo MOVED file
git update-ref refs/heads/main HEAD 2>/dev/null && echo MOVED main
echo done
"""
    code, out, err, _ = run(s, extra, "--repo", str(repo), "--", "sh", "-c", attack)
    assert code == 0, err
    for word in ("WROTE", "MOVED"):
        assert word not in out, out
    assert git(repo, "rev-parse", "main").strip() == before["main"]
    assert git(repo, "show", "main:app.py") == before["show"]
    assert git(repo, "rev-parse", a_branch).strip() == a_head
    assert _snapshot([repo / ".git" / "objects"]) == before["objects"]
    subprocess.run(["git", "-C", str(repo), "fsck", "--strict"], check=True, capture_output=True)
    _tally(f"main's objects / another run's branch ({'landlock' if extra else 'bubblewrap'})", True)


def test_forged_objects_and_foreign_refs_fail_the_import_loudly(bw: Saphan, repo: Path) -> None:
    main_show = git(repo, "show", "main:app.py")
    # A forged loose object in the run's own object directory: its name is
    # not the hash of its content; the commit that needs it cannot import.
    forge = r"""
set -e
echo new > n.txt && git add n.txt && git commit -q -m real
blob=$(git rev-parse HEAD:n.txt)
f=$GIT_OBJECT_DIRECTORY/$(echo $blob | cut -c1-2)/$(echo $blob | cut -c3-)
chmod u+w $f
python3 -c "import zlib,sys; open(sys.argv[1],'wb').write(zlib.compress(b'blob 6\0forged'))" $f
echo forged
"""
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           forge, env=bw.env(**GIT_ENV))
    assert r.code == 0 and "forged" in r.out, r.err
    assert "NOT imported" in r.err
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    imp = rec["worktree"]["import"]
    assert imp["result"] == "refused", imp
    assert git(repo, "rev-parse", rec["worktree"]["branch"]).strip() == rec["worktree"]["base"]
    # A symbolic HEAD naming another branch is a foreign ref.
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "gd=$(git rev-parse --absolute-git-dir); echo 'ref: refs/heads/main' > $gd/HEAD",
           env=bw.env(**GIT_ENV))
    assert "NOT imported" in r.err and "foreign ref" in r.err
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and rec["worktree"]["import"]["result"] == "refused"
    assert git(repo, "show", "main:app.py") == main_show
    subprocess.run(["git", "-C", str(repo), "fsck", "--strict"], check=True, capture_output=True)
    _tally("forged object / foreign ref at import", True)


def test_commits_import_onto_the_runs_branch_only(bw: Saphan, repo: Path) -> None:
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "for i in 1 2 3; do echo $i > f$i && git add f$i && git commit -q -m c$i; done; "
           "git status --porcelain", env=bw.env(**GIT_ENV))
    assert r.code == 0, r.err
    assert r.out.strip() == ""  # .saphan-run/ is ignored
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    imp = rec["worktree"]["import"]
    assert imp["result"] == "imported" and imp["commits"] == 3
    branch = rec["worktree"]["branch"]
    assert git(repo, "rev-parse", branch).strip() == imp["head"] == rec["worktree"]["head_after"]
    assert git(repo, "log", "--format=%s", "-1", branch).strip() == "c3"
    wt = Path(rec["worktree"]["path"])
    assert git(wt, "symbolic-ref", "HEAD").strip() == f"refs/heads/{branch}"
    assert git(wt, "status", "--porcelain").strip() == ""
    assert not (wt / ".saphan-run" / "objects").exists()


# -- 4. no saphan secrets, no stray environment --------------------------------------

def test_jail_sees_no_workspace_identity_file_or_agent_socket(lane: tuple[Saphan, list[str]],
                                                             tmp_path: Path) -> None:
    s, extra = lane
    key = tmp_path / "keys" / "id_ed25519"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    # A machine row as `machine add --ssh` writes it (the store's own API).
    from saphan.store import open_store
    from saphan.store.rows import Machine

    store = open_store("sqlite", s.home / "saphan.db")
    store.add_machine(Machine("far", "ssh", ssh_user="agent", ssh_host="10.9.9.9", ssh_port=22,
                              identity_file=str(key), host_key="ssh-ed25519 AAAA",
                              created_at="2026-11-30T00:00:00.000000Z"))
    store.close()
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(tmp_path / "agent.sock")],
                           capture_output=True, text=True, check=True)
    pid = int(agent.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        subprocess.run(["ssh-add", str(key)], env={**os.environ,
                       "SSH_AUTH_SOCK": str(tmp_path / "agent.sock")}, check=True,
                       capture_output=True)
        wd = tmp_path / "wd"
        wd.mkdir()
        probe = (f"set +e; cat {key} && echo READ-KEY; ls -A {s.home}; "
                 f"cat {s.home}/saphan.db >/dev/null 2>&1 && echo READ-DB; "
                 f"cat {s.home}/record.key >/dev/null 2>&1 && echo READ-RECORD-KEY; "
                 "echo sock=$SSH_AUTH_SOCK; ssh-add -l >/dev/null 2>&1 && echo AGENT-WORKS; "
                 "echo AWS=$AWS_SECRET_ACCESS_KEY; echo done")
        r = s("run", "--machine", "here", "--slot", "s1", *extra, "--workdir", str(wd), "--",
              "sh", "-c", probe,
              env=s.env(SSH_AUTH_SOCK=str(tmp_path / "agent.sock"),
                        AWS_SECRET_ACCESS_KEY="leaky-value"))
        assert r.code == 0, r.err
        for word in ("READ-KEY", "READ-DB", "READ-RECORD-KEY", "AGENT-WORKS", "PRIVATE KEY",
                     "leaky-value"):
            assert word not in r.out, r.out
        assert "sock=\n" in r.out
        rec = s.ok("runs", "show", "last", "--json").json()
        assert isinstance(rec, dict)
        passed = rec["environment"]["passed"]
        assert "SSH_AUTH_SOCK" not in passed and "AWS_SECRET_ACCESS_KEY" not in passed
        assert "PATH" in passed
        assert str(key) in rec["policy"]["read_denials"]
    finally:
        os.kill(pid, signal.SIGTERM)
    _tally(f"identity file / ssh agent / workspace ({'landlock' if extra else 'bubblewrap'})",
           True)


# -- 5. a run ends when its last process ends ----------------------------------------

def test_daemon_does_not_outlive_the_run(lane: tuple[Saphan, list[str]], tmp_path: Path) -> None:
    s, extra = lane
    wd = tmp_path / "wd"
    wd.mkdir()
    late = wd / "late.txt"
    r = s("run", "--machine", "here", "--slot", "s1", *extra, "--workdir", str(wd), "--", "sh",
          "-c", "setsid sh -c 'sleep 3; echo late > late.txt' >/dev/null 2>&1 < /dev/null & "
          "echo started")
    assert r.code == 0, r.err
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["processes_killed_at_end"] >= 1
    time.sleep(5)
    assert not late.exists()
    _tally(f"setsid daemon after the run ({'landlock' if extra else 'bubblewrap'})", True)


FORGE = """
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pfd = libc.syscall(434, 1, 0)  # pidfd_open(1): bubblewrap's process 1 in the jail
got = None
for n in range(3, 16):
    fd = libc.syscall(438, pfd, n, 0)  # pidfd_getfd
    if fd >= 0 and "eventfd" in os.readlink(f"/proc/self/fd/{fd}"):
        got = fd
        break
if got is not None:
    os.write(got, struct.pack("Q", 0 + 1))  # "the command exited 0"
    print("wrote", flush=True)
else:
    print("no channel", os.strerror(ctypes.get_errno()), flush=True)
time.sleep(3)
open("late.txt", "w").write("late")
sys.exit(7)
"""


def test_a_run_cannot_forge_its_status_through_the_boundary_process(
        lane: tuple[Saphan, list[str]], tmp_path: Path) -> None:
    """Review: under bubblewrap the command took its process 1's status
    channel (pidfd_getfd) and said "exited 0": bubblewrap ended with status
    0 and the run was recorded `exited 0` while the command ran on. The
    launcher's word is the command's status, and the jail ends with its
    boundary process (the lifeline)."""
    s, extra = lane
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "forge.py").write_text(FORGE)
    r = s("run", "--machine", "here", "--slot", "s1", *extra, "--workdir", str(wd), "--",
          "python3", "forge.py")
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    if _native.landlock_abi()[0] >= 6:
        # the command runs in a Landlock domain of its own on both lanes
        # (under bubblewrap a signal scope, no filesystem rule): no ptrace,
        # no pidfd_getfd of anything outside it
        assert "no channel" in r.out, r.out
    if "wrote" in r.out:  # it took the channel: nothing is claimed from it
        assert rec["outcome"] == "failed" and rec["exit_code"] is None, rec
        assert any("the command's status is unknown" in n for n in rec["notes"]), rec["notes"]
        time.sleep(4)
        assert not (wd / "late.txt").exists(), "the command ran on after its record"
    else:  # refused the channel: its own end, as it was
        assert "no channel" in r.out, r.out
        assert (rec["outcome"], rec["exit_code"]) == ("failed", 7), rec
    _tally(f"a forged status through bubblewrap's process 1 ({'landlock' if extra else 'bubblewrap'})",
           True)


@pytest.fixture
def outsider() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def test_no_signal_reaches_a_process_outside(lane: tuple[Saphan, list[str]], tmp_path: Path,
                                            outsider: subprocess.Popen[bytes]) -> None:
    s, extra = lane
    wd = tmp_path / "wd"
    wd.mkdir()
    r = s("run", "--machine", "here", "--slot", "s1", *extra, "--workdir", str(wd), "--", "sh",
          "-c", f"kill -TERM {outsider.pid} 2>/dev/null && echo SIGNALLED; "
          f"kill -0 {os.getpid()} 2>/dev/null && echo SEES-PYTEST; echo done")
    assert r.code == 0, r.err
    assert "SIGNALLED" not in r.out and "SEES-PYTEST" not in r.out
    assert outsider.poll() is None
    _tally(f"signal to an outside process ({'landlock' if extra else 'bubblewrap'})", True)


# -- 7. files that run later -----------------------------------------------------------

PROTECTED_FILES = [".gitmodules", ".envrc", ".mcp.json", ".bashrc", ".profile", ".zshrc"]
PROTECTED_DIRS = [".vscode", ".idea", ".claude", ".codex"]


def test_existing_protected_files_cannot_change(lane: tuple[Saphan, list[str]],
                                                tmp_path: Path) -> None:
    s, extra = lane
    wd = tmp_path / "wd"
    wd.mkdir()
    for f in PROTECTED_FILES:
        (wd / f).write_text(f"original {f}\n")
    for d in PROTECTED_DIRS:
        (wd / d).mkdir()
        (wd / d / "settings.json").write_text("{}\n")
    before = _snapshot([wd])
    attempts = [f"echo pwned >> {f} && echo WROTE {f}; rm -f {f} && echo RM {f}; "
                f"mv {f} {f}.x && echo MV {f}" for f in PROTECTED_FILES]
    attempts += [f"echo pwned > {d}/settings.json && echo WROTE {d}; echo x > {d}/new && "
                 f"echo NEW {d}; mv {d} {d}.x && echo MV {d}" for d in PROTECTED_DIRS]
    r = s("run", "--machine", "here", "--slot", "s1", *extra, "--workdir", str(wd), "--", "sh",
          "-c", "set +e; " + "; ".join(attempts) + "; echo done")
    assert r.code == 0, r.err
    for word in ("WROTE", "RM ", "MV ", "NEW "):
        assert word not in r.out, r.out
    after = {k: v for k, v in _snapshot([wd]).items() if ".saphan-run" not in k}
    assert after == before
    _tally(f"existing protected files ({'landlock' if extra else 'bubblewrap'})", True)


def test_created_protected_files_are_reported_and_not_imported(bw: Saphan, repo: Path) -> None:
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "echo 'use flake' > .envrc && mkdir .vscode && echo '{}' > .vscode/tasks.json && "
           "git add -A . && git commit -q -m sneaky", env=bw.env(**GIT_ENV))
    assert r.code == 0, r.err
    assert ".envrc" in r.err and ".vscode" in r.err
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    names = {c["name"] for c in rec["protected_changes"]}
    assert {".envrc", ".vscode"} <= names
    assert rec["worktree"]["import"]["result"] == "refused"
    assert ".envrc" in rec["worktree"]["import"]["why"]
    assert git(repo, "rev-parse", rec["worktree"]["branch"]).strip() == rec["worktree"]["base"]
    _tally("created protected files (reported, not imported)", True)


def test_a_nested_gitattributes_is_not_imported(bw: Saphan, repo: Path) -> None:
    """git reads every directory's .gitattributes: one committed in a
    subdirectory routes that directory's files to the operator's configured
    filter and diff drivers as the top one would (found by a review)."""
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "mkdir -p src/deep && echo '* diff=anything filter=anything' > "
           "src/deep/.gitattributes && echo x > src/deep/a.txt && git add -A && "
           "git commit -q -m nested", env=bw.env(**GIT_ENV))
    assert r.code == 0, r.err
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and rec["worktree"]["import"]["result"] == "refused", rec
    assert "src/deep/.gitattributes" in rec["worktree"]["import"]["why"]
    assert git(repo, "rev-parse", rec["worktree"]["branch"]).strip() == rec["worktree"]["base"]
    _tally("a nested .gitattributes at import", True)


# -- 8. a launcher refusal is a refusal ---------------------------------------------------

def test_launcher_refusal_on_the_local_lane_is_recorded(saphan_sqlite: Saphan, tmp_path: Path,
                                                        no_landlock: str) -> None:
    s = saphan_sqlite
    require(_native.landlock_abi()[0] >= 3, "a kernel with Landlock ABI >= 3")
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    s.ok("machine", "probe-confinement", "here")
    from conftest import saphan_exe

    p = subprocess.run([no_landlock, saphan_exe(), "run", "--machine", "here", "--slot", "s1",
                        "--boundary", "landlock", "--workdir", str(tmp_path), "--", "sh", "-c",
                        "echo RAN"], capture_output=True, text=True, env=s.env(), timeout=120)
    assert p.returncode == 3, p.stderr
    assert "RAN" not in p.stdout
    assert "refused [landlock-incapable]" in p.stderr
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["refusal"]["class"] == "landlock-incapable"
    assert rec["enforced_by"] is None
    _tally("launcher refusal on the local Landlock boundary", True)


def test_forged_confirmation_line_is_not_a_confirmation(saphan_sqlite: Saphan,
                                                        tmp_path: Path) -> None:
    """The run prints the launcher's line itself; the record's confirmation is
    the launcher's own line from its descriptor, never the run's."""
    s = saphan_sqlite
    require(_native.landlock_abi()[0] >= 3, "a kernel with Landlock ABI >= 3")
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    s.ok("machine", "probe-confinement", "here")
    fake = "saphan-launcher: landlock abi=7 enforced writable=[/] scopes=[]"
    r = s("run", "--machine", "here", "--slot", "s1", "--boundary", "landlock", "--workdir",
          str(tmp_path), "--", "sh", "-c", f"echo '{fake}' >&2; echo '{fake}'")
    assert r.code == 0, r.err
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["enforced_by"]["confirmation"] != fake
    assert "writable=[/]" not in json.dumps(rec["enforced_by"]["status_lines"])


def test_reaper_custody_is_measured_outside_the_jail(bw: Saphan, tmp_path: Path) -> None:
    """Inside the jail's user namespace the launcher cannot measure its own
    custody (`reap` leaves it to the engine): the engine refuses a reaper
    others can replace, before anything starts."""
    import shutil

    copy = tmp_path / "bin" / "saphan-launcher"
    copy.parent.mkdir()
    shutil.copy(bw("launcher", "path").out.strip(), copy)
    copy.chmod(0o775)
    wd = tmp_path / "wd"
    wd.mkdir()
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           "echo RAN > ran.txt", env=bw.env(SAPHAN_LAUNCHER=str(copy)))
    assert r.code == 3, r.err
    assert "refused [custody-binary-unsafe]" in r.err and "reaper" in r.err
    assert not (wd / "ran.txt").exists()


def test_a_directory_swapped_for_a_link_after_the_check_is_not_what_gets_bound(
        tmp_path: Path) -> None:
    """A concurrent run in an enclosing directory swaps an ancestor of the next
    run's working directory for a link (to a tree holding a same-named victim
    directory) between saphan's grant check and bubblewrap's bind. saphan
    binds the descriptor it opened when it checked (``--bind-fd``), and
    bubblewrap 0.8 refuses a destination reached through a link (measured:
    it also does so for a bind by path): the victim is unchanged either way.
    A swap before the descriptors are opened is refused by name."""
    from saphan.confine import bwrap
    from saphan.confine.compose import grant_fds
    from saphan.confine.grants import derive
    from saphan.refusals import Refusal

    def attempt(by_fd: bool) -> tuple[dict[str, str], Path]:
        root = tmp_path / ("fd" if by_fd else "path")
        outer, victims = root / "outer", root / "victims"
        (outer / "sub").mkdir(parents=True)
        (victims / "sub").mkdir(parents=True)
        victim = victims / "sub" / "victim.txt"
        victim.write_text("precious\n")
        before = _snapshot([victims])
        wd = outer / "sub"
        policy = derive(str(wd))
        fds = grant_fds(policy.writable_dirs) if by_fd else {}
        try:
            outer.rename(root / "outer.real")  # the swap, after the check
            outer.symlink_to(victims)
            argv = [*bwrap.render(policy, "bwrap", fds), "sh", "-c",
                    f"echo pwned > {wd}/victim.txt; echo x > {wd}/new.txt; echo done"]
            subprocess.run(argv, capture_output=True, text=True, timeout=60,
                           pass_fds=tuple(fds.values()))
        finally:
            for fd in fds.values():
                os.close(fd)
        return before, victims

    for by_fd in (True, False):
        before, victims = attempt(by_fd)
        assert _snapshot([victims]) == before, by_fd
    with pytest.raises(Refusal, match="symbolic link"):
        grant_fds((str(tmp_path / "fd" / "outer" / "sub"),))
    _tally("directory swapped for a link between check and bind", True)


# -- routes a review found on this build (measured as escapes before the fix) --------

FAKE_TOOL = """#!/bin/sh
echo "$0 $*" >> {marker}
[ "$1" = --version ] && {{ echo "bubblewrap 0.8.0"; exit 0; }}
while [ "$1" != "--" ]; do shift; done; shift; exec "$@"
"""


def test_a_bwrap_or_git_planted_on_path_is_never_run(bw: Saphan, repo: Path,
                                                      tmp_path: Path) -> None:
    """A run that can write a directory on the operator's PATH plants a fake
    `bwrap` (exec the command unconfined) and `git`. saphan takes both from
    the trusted system directories only: the fakes never run, and the next
    run is confined by the real bubblewrap."""
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "FAKE-RAN"
    for name in ("bwrap", "git"):
        (fake / name).write_text(FAKE_TOOL.format(marker=marker))
        (fake / name).chmod(0o755)
    v = _victims(tmp_path)
    env = bw.env(**GIT_ENV, PATH=f"{fake}:{os.environ['PATH']}")
    wd = tmp_path / "wd"
    wd.mkdir()
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           f"echo pwned > {v['victim']} 2>/dev/null && echo WROTE; echo done", env=env)
    assert r.code == 0 and "WROTE" not in r.out, (r.out, r.err)
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert not rec["enforced_by"]["executable"].startswith(str(fake))
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "echo a > a && /usr/bin/git add a && /usr/bin/git commit -q -m a", env=env)
    assert r.code == 0, r.err
    assert not marker.exists(), marker.read_text()
    assert v["victim"].read_text() == "precious\n" * 50
    _tally("bwrap/git planted on the operator's PATH", True)


def test_every_registered_workspace_is_hidden_and_kept_apart(bw: Saphan,
                                                            tmp_path: Path) -> None:
    """Another workspace of this account (registered at `saphan init`) is
    hidden in every jail, whichever workspace runs it; a workdir inside it is
    refused."""
    other = tmp_path / "other-ws"
    env_other = {**bw.env(), "SAPHAN_HOME": str(other)}
    subprocess.run([*_saphan(), "init"], env=env_other, check=True, capture_output=True)
    wd = tmp_path / "wd"
    wd.mkdir()
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           f"cat {other}/record.key >/dev/null 2>&1 && echo READ-KEY; ls -A {other}; "
           f"cat {other}/saphan.db >/dev/null 2>&1 && echo READ-DB; echo done")
    assert r.code == 0, r.err
    assert "READ-KEY" not in r.out and "READ-DB" not in r.out and "record.key" not in r.out
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(other / "runs"), "--",
           "true")
    assert r.code == 2 and "inside the saphan workspace" in r.err, r.err
    _tally("another registered workspace's key and store", True)


def _saphan() -> list[str]:
    from conftest import saphan_exe

    return [saphan_exe()]


def test_concurrent_runs_do_not_break_each_others_import(bw: Saphan, repo: Path) -> None:
    """Run A points its HEAD at an object the repository does not have and
    stays; run B's import still succeeds (the verified fetch lands in a
    staging repository, never walking other worktrees' HEADs)."""
    bw.ok("slot", "set", "here", "s1", "--max-sessions", "2")
    a = subprocess.Popen(
        [*_saphan(), "run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--",
         "sh", "-c", "gd=$(git rev-parse --absolute-git-dir); "
         "echo 1111111111111111111111111111111111111111 > $gd/HEAD; sleep 6"],
        env=bw.env(**GIT_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(2)
        r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
               "echo b > b && git add b && git commit -q -m B", env=bw.env(**GIT_ENV))
        assert r.code == 0, r.err
        rec = bw.ok("runs", "show", "last", "--json").json()
        assert isinstance(rec, dict)
        assert rec["worktree"]["import"]["result"] == "imported", rec["worktree"]["import"]
    finally:
        a.wait(timeout=60)
    _tally("a concurrent run's bogus HEAD against another's import", True)


def test_tracked_hooks_dir_and_history_are_protected(bw: Saphan, repo: Path) -> None:
    """A repository whose core.hooksPath is a tracked directory: the run can
    neither change it in place nor get a change imported — not even one it
    made and undid in a later commit (every commit is checked)."""
    hooks = repo / "scripts" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    git(repo, "add", "scripts")
    git(repo, "commit", "-q", "-m", "hooks")
    git(repo, "config", "core.hooksPath", "scripts/hooks")
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "echo 'touch /tmp/x' >> scripts/hooks/pre-commit 2>/dev/null && echo WROTE; "
           "mkdir -p .vscode && echo '{}' > .vscode/tasks.json && git add -A && "
           "git commit -q -m add && git rm -q -r .vscode && git commit -q -m undo; echo done",
           env=bw.env(**GIT_ENV))
    assert r.code == 0 and "WROTE" not in r.out, (r.out, r.err)
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    imp = rec["worktree"]["import"]
    assert imp["result"] == "refused" and ".vscode/tasks.json" in imp["why"], imp
    _tally("tracked hooks dir / protected file added then removed", True)


def test_names_a_run_chooses_reach_the_terminal_escaped(bw: Saphan, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           "mkdir .vscode && touch \"$(printf '.vscode/x\\r\\033[2K\\033]52;c;AAAA\\007')\"")
    assert r.code == 0, r.err
    assert "\x1b" not in r.err and "\r" not in r.err and "\x07" not in r.err
    assert "\\x1b" in r.err
    # ... and in `runs show`: a name with a newline cannot print a line of its
    # own (a forged "signature: valid" line, measured through a loop's words).
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           "touch \"$(printf '.vscode/y\\nsignature:   valid (forged)')\"")
    shown = bw.ok("runs", "show", "last").out
    assert not any(line.startswith("signature:   valid (forged") for line in shown.splitlines())
    assert "\\nsignature:   valid (forged)" in shown


def test_a_workspace_below_the_workdir_cannot_be_swapped(bw: Saphan, tmp_path: Path) -> None:
    """Another workspace two levels below the workdir: the run could rename
    the directory between them and plant its own workspace there (measured
    on an earlier build: the operator's next `runs list` read the run's
    store and key). Refused by name; the same for a registry there."""
    wd = tmp_path / "wd"
    other = wd / "proj" / "ws-other"
    subprocess.run([*_saphan(), "init"], env={**bw.env(), "SAPHAN_HOME": str(other)},
                   check=True, capture_output=True)
    key = (other / "record.key").read_bytes()
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
           "mv proj .old && echo MOVED")
    assert r.code == 3 and "refused [workdir-unsafe]" in r.err, (r.out, r.err)
    assert "MOVED" not in r.out and (other / "record.key").read_bytes() == key
    # The registry itself below a workdir (a non-default XDG_STATE_HOME).
    wd2 = tmp_path / "wd2"
    state = wd2 / "st"
    env = bw.env(XDG_STATE_HOME=str(state))
    bw.ok("init", env=env)  # registers this workspace there
    r = bw("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd2), "--", "sh", "-c",
           "mv st st.old && echo MOVED", env=env)
    assert r.code == 3 and "refused [workdir-unsafe]" in r.err, (r.out, r.err)
    assert "MOVED" not in r.out
    _tally("a workspace or the registry moved aside below the workdir", True)


GITLINK = r"""
set -e
mkdir -p sub && cd sub && git init -q && cd ..
printf '[core]\n\tfsmonitor = "touch {marker}; false"\n' >> sub/.git/config
oid=$(git rev-parse HEAD)
git update-index --add --cacheinfo 160000,$oid,sub
git commit -q -m gitlink
"""


def test_a_gitlink_is_never_imported(bw: Saphan, repo: Path, tmp_path: Path) -> None:
    """A commit that adds a gitlink makes the operator's `git status` run git
    inside it, with the fsmonitor the run planted (measured on an earlier
    build): the import is refused, and the operator's git runs nothing."""
    marker = tmp_path / "GITLINK-RAN"
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           GITLINK.format(marker=marker), env=bw.env(**GIT_ENV))
    assert r.code == 0, r.err
    assert "NOT imported" in r.err and "gitlink" in r.err
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and rec["worktree"]["import"]["result"] == "refused"
    assert {"name": "sub/.git", "what": "nested-git"} in rec["protected_changes"]
    wt = Path(rec["worktree"]["path"])
    subprocess.run(["git", "-C", str(wt), "status"], capture_output=True, check=False)
    assert not marker.exists()
    _tally("a gitlink with a planted fsmonitor", True)


def test_the_loops_result_file_is_read_without_following_or_blocking(tmp_path: Path) -> None:
    """out/ is the run's to write: a FIFO named loop-result.json must not stall
    saphan, a link must not make it read (and record) a file elsewhere."""
    import json as _json

    from saphan.lanes import Lane
    from saphan.loop.adapter import LoopAdapter
    from saphan.tools.binaries import AgentBinary
    from saphan.tools.instruction import Instruction

    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(_json.dumps({"end": "finished", "turns": 999}))
    adapter = LoopAdapter(
        AgentBinary("loop", "/usr/bin/python3", "0" * 64, "x"),
        Instruction(prompt_path="", workdir=str(tmp_path)), "engine", "R",
        lane=Lane("l", "http://127.0.0.1:9/v1", "m", str(tmp_path / "k")), secret=b"k" * 16,
        out_dir=str(out))
    (out / "loop-result.json").symlink_to(elsewhere)
    assert adapter.after_run(str(tmp_path / "stdout.log"))["loop"]["end"] is None
    (out / "loop-result.json").unlink()
    os.mkfifo(out / "loop-result.json")
    t0 = time.monotonic()
    assert adapter.after_run(str(tmp_path / "stdout.log"))["loop"]["end"] is None
    assert time.monotonic() - t0 < 5
    _tally("the loop's result file as a link or a FIFO", True)


TREE_BOMB = r"""
set -e
blob=$(echo x | git hash-object -w --stdin)
t=$(printf '100644 blob %s\tf\n' "$blob" | git mktree)
for level in 1 2 3 4 5 6 7; do
  t=$(for i in 0 1 2 3 4 5 6 7 8 9; do printf '040000 tree %s\td%s\n' "$t" "$i"; done | git mktree)
done
c=$(git commit-tree -p HEAD -m bomb "$t")
git update-ref --no-deref HEAD "$c"
echo planted
"""


def test_a_tree_bomb_is_refused_within_bounds(bw: Saphan, repo: Path) -> None:
    """A commit whose tree names 10^7 paths from a dozen objects: saphan's
    listing of the run's commits is bounded (an unbounded one took 24 GB at
    10^10 paths, measured): refused, quickly, nothing imported."""
    t0 = time.monotonic()
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           TREE_BOMB, env=bw.env(**GIT_ENV), timeout=300)
    assert r.code == 0 and "planted" in r.out, r.err
    assert "NOT imported" in r.err, r.err
    assert time.monotonic() - t0 < 120
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and rec["worktree"]["import"]["result"] == "refused"
    assert git(repo, "rev-parse", rec["worktree"]["branch"]).strip() == rec["worktree"]["base"]
    _tally("a tree bomb at import", True)


def test_a_newline_in_a_name_hides_nothing_at_import(bw: Saphan, repo: Path) -> None:
    """A path with a newline and a colon must not be read as a raw-diff record
    of its own, hiding the protected path after it (measured on an earlier
    build): a control character in a path refuses the import."""
    r = bw("run", "--machine", "here", "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
           "echo x > .envrc && printf x > \"$(printf '.e\\n:')\" && git add -A && "
           "git commit -q -m hide && git rm -q --cached .envrc && git commit -q -m rm",
           env=bw.env(**GIT_ENV))
    assert r.code == 0, r.err
    rec = bw.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict) and rec["worktree"]["import"]["result"] == "refused", rec
    _tally("a newline-and-colon name hiding a protected path", True)


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """A loop device over a file holding a marker: the stand-in for the disk
    under a hidden workspace (record.key was read through one, measured)."""
    import shutil

    require(os.geteuid() == 0 and shutil.which("losetup") is not None,
            "root and losetup(8) to attach a loop device")
    marker = b"SAPHAN-DISK-MARKER-" + os.urandom(8).hex().encode()
    img = tmp_path / "disk.img"
    img.write_bytes(marker + b"\0" * (1 << 20))
    dev = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        yield dev, marker
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)


def test_a_block_device_is_never_readable(lane: tuple[Saphan, list[str]], tmp_path: Path,
                                          loop_device: tuple[str, bytes]) -> None:
    """Device nodes are unusable in every jail but the named /dev literals: a
    jailed root cannot read a disk (and what a hidden workspace holds on it)."""
    s, extra = lane
    dev, marker = loop_device
    wd = tmp_path / "wd"
    wd.mkdir()
    r = s("run", "--machine", "here", "--slot", "s1", *extra, "--workdir", str(wd), "--", "sh",
          "-c", f"head -c 64 {dev}; echo; echo done; echo x > /dev/null && echo NULL-OK")
    assert r.code == 0, r.err
    assert marker.decode() not in r.out and "done" in r.out and "NULL-OK" in r.out, r.out
    _tally(f"a block device under a hidden workspace ({'landlock' if extra else 'bubblewrap'})",
           True)


def test_zz_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints attempts and refusals of this battery (run last in the module)."""
    with capsys.disabled():
        print(f"\nleftovers battery: {len(TALLY)} routes attempted, "
              f"{sum(v == 'refused' for v in TALLY.values())} refused")
        for route, verdict in sorted(TALLY.items()):
            print(f"  {verdict:8} {route}")
    assert TALLY, "run the whole module: the summary counts the routes above"
    assert all(v == "refused" for v in TALLY.values()), TALLY
