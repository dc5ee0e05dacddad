"""What saphan sees of the working tree after a measure-base run
(measure/scratch.py), on real directories: a scratch still there is
reported, and removed only when asked — the scratch itself, never what a
link in it or above it points at; the git directories below the tree are
found without following a link, with saphan's own places skipped and the
count bounded.

check_far needs an SSH runner: tests/integration/sshd/test_far_measure.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saphan.measure import scratch

SCRATCH = ".saphan-run/base-x"


def tree(tmp_path: Path) -> Path:
    """A working tree with its own .git and saphan's tmp (nothing to report)."""
    wd = tmp_path / "wd"
    (wd / ".git" / "objects").mkdir(parents=True)
    (wd / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (wd / ".saphan-run" / "tmp" / "run1" / ".git").mkdir(parents=True)
    (wd / "src").mkdir()
    (wd / "src" / "code.py").write_text("x = 1\n")
    return wd


def a_clone(where: Path) -> None:
    (where / ".git" / "objects").mkdir(parents=True)
    (where / ".git" / "HEAD").write_text("deadbeef\n")
    (where / "src").mkdir()
    (where / "src" / "code.py").write_text("x = 0\n")


def outside(tmp_path: Path) -> Path:
    """A directory beside the tree, with files that must survive."""
    out = tmp_path / "outside"
    (out / "deep").mkdir(parents=True)
    (out / "precious").write_text("keep\n")
    (out / "deep" / "also").write_text("keep\n")
    return out


def survived(out: Path) -> bool:
    return ((out / "precious").read_text() == "keep\n"
            and (out / "deep" / "also").read_text() == "keep\n")


# -- check_local ----------------------------------------------------------------------


@pytest.mark.parametrize("remove", [None, SCRATCH])
def test_an_absent_scratch_is_reported_absent(tmp_path: Path, remove: str | None) -> None:
    wd = tree(tmp_path)
    assert scratch.check_local(str(wd), SCRATCH, remove=remove) == {
        "scratch_present": False, "removed_by_saphan": False, "git_dirs_below": []}


def test_a_scratch_whose_parent_is_gone_is_absent(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    got = scratch.check_local(str(wd), "nested/deeper/base-x", remove="nested")
    assert got == {"scratch_present": False, "removed_by_saphan": False, "git_dirs_below": []}


def test_a_scratch_still_there_is_reported_and_kept_unless_removal_is_asked(
        tmp_path: Path) -> None:
    wd = tree(tmp_path)
    a_clone(wd / SCRATCH)
    got = scratch.check_local(str(wd), SCRATCH, remove=None)
    assert got["scratch_present"] is True
    assert got["removed_by_saphan"] is False
    assert "check_error" not in got
    assert got["git_dirs_below"] == [f"{SCRATCH}/.git"]
    assert (wd / SCRATCH / "src" / "code.py").is_file()


def test_a_scratch_still_there_is_removed_and_its_siblings_kept(tmp_path: Path) -> None:
    wd = tree(tmp_path)
    a_clone(wd / SCRATCH)
    sibling = wd / ".saphan-run" / "base-y"
    sibling.mkdir()
    (sibling / "file").write_text("other run\n")
    got = scratch.check_local(str(wd), SCRATCH, remove=SCRATCH)
    assert got == {"scratch_present": False, "removed_by_saphan": True, "git_dirs_below": []}
    assert not os.path.lexists(wd / SCRATCH)
    assert (sibling / "file").read_text() == "other run\n"
    assert (wd / ".saphan-run" / "tmp" / "run1" / ".git").is_dir()
    assert (wd / ".git" / "HEAD").is_file()
    assert (wd / "src" / "code.py").read_text() == "x = 1\n"


def test_a_scratch_that_is_a_file_is_removed(tmp_path: Path) -> None:
    wd = tree(tmp_path)
    (wd / SCRATCH).write_text("not a clone\n")
    got = scratch.check_local(str(wd), SCRATCH, remove=SCRATCH)
    assert got["removed_by_saphan"] is True
    assert not os.path.lexists(wd / SCRATCH)


def test_a_scratch_that_is_a_link_loses_only_the_link(tmp_path: Path) -> None:
    wd = tree(tmp_path)
    out = outside(tmp_path)
    (wd / SCRATCH).symlink_to(out, target_is_directory=True)
    got = scratch.check_local(str(wd), SCRATCH, remove=SCRATCH)
    assert got["removed_by_saphan"] is True
    assert got["scratch_present"] is False
    assert not os.path.lexists(wd / SCRATCH)
    assert survived(out)


def test_a_link_above_the_scratch_is_refused_and_nothing_outside_removed(
        tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    out = outside(tmp_path)
    a_clone(out / "base-x")
    (wd / ".saphan-run").symlink_to(out, target_is_directory=True)
    got = scratch.check_local(str(wd), SCRATCH, remove=SCRATCH)
    assert got["scratch_present"] is True
    assert got["removed_by_saphan"] is False
    assert got["check_error"].startswith("PlantedLink: ")
    assert ".saphan-run" in got["check_error"]
    assert (out / "base-x" / "src" / "code.py").is_file()
    assert (out / "base-x" / ".git" / "HEAD").is_file()
    assert survived(out)
    assert (wd / ".saphan-run").is_symlink()


def test_removal_never_follows_a_link_inside_the_scratch(tmp_path: Path) -> None:
    wd = tree(tmp_path)
    out = outside(tmp_path)
    a_clone(wd / SCRATCH)
    inner = wd / SCRATCH / "src" / "vendored"
    inner.mkdir()
    (inner / "to-dir").symlink_to(out, target_is_directory=True)
    (inner / "to-file").symlink_to(out / "precious")
    (wd / SCRATCH / "to-deep").symlink_to(out / "deep", target_is_directory=True)
    (wd / SCRATCH / "to-root").symlink_to(tmp_path, target_is_directory=True)
    got = scratch.check_local(str(wd), SCRATCH, remove=SCRATCH)
    assert got["removed_by_saphan"] is True
    assert not os.path.lexists(wd / SCRATCH)
    assert survived(out)
    assert (wd / "src" / "code.py").is_file()


# -- git_dirs_below -------------------------------------------------------------------


def test_git_dirs_below_finds_nested_dirs_and_files_only(tmp_path: Path) -> None:
    wd = tree(tmp_path)
    (wd / "sub" / ".git" / "inner" / ".git").mkdir(parents=True)  # not looked into
    (wd / "vendor" / "lib").mkdir(parents=True)
    (wd / "vendor" / "lib" / ".git").write_text("gitdir: ../../.git/modules/lib\n")
    (wd / ".saphan-run" / "base-q" / ".git").mkdir(parents=True)
    (wd / ".saphan-run" / "tmp" / "more").mkdir()
    (wd / ".saphan-run" / "tmp" / "more" / ".git").write_text("gitdir: x\n")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "repo" / ".git").mkdir(parents=True)
    (wd / "linked").symlink_to(elsewhere, target_is_directory=True)
    got = scratch.git_dirs_below(str(wd))
    assert sorted(got) == [".saphan-run/base-q/.git", "sub/.git", "vendor/lib/.git"]


def test_git_dirs_below_stops_naming_at_the_limit(tmp_path: Path) -> None:
    wd = tree(tmp_path)
    for i in range(scratch.NAMED + 10):
        (wd / f"p{i:03d}").mkdir()
        (wd / f"p{i:03d}" / ".git").write_text("gitdir: x\n")
    got = scratch.git_dirs_below(str(wd))
    assert len(got) == scratch.NAMED + 1
    assert got[-1].startswith("(stopped looking after ")
    assert got[-1].endswith(" entries)")
    assert all(g.endswith("/.git") and g.startswith("p") for g in got[:-1])


def test_git_dirs_below_stops_walking_at_the_entry_limit(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    wd = tree(tmp_path)
    for i in range(40):
        (wd / "src" / f"f{i}").write_text("")
    monkeypatch.setattr(scratch, "WALK_LIMIT", 10)
    got = scratch.git_dirs_below(str(wd))
    assert len(got) == 1
    assert got[0].startswith("(stopped looking after ")


def test_what_the_run_made_above_the_scratch_goes_with_it(tmp_path: Path) -> None:
    # review: a killed run's `scr/a/b` lost only `b`; the empty `scr/a` stayed
    wd = tree(tmp_path)
    assert scratch.first_missing(str(wd), "scr/a/b") == "scr"
    (wd / "scr" / "a").mkdir(parents=True)  # the clone died before making b
    got = scratch.check_local(str(wd), "scr/a/b", remove="scr")
    assert got["removed_by_saphan"] and not got["scratch_present"]
    assert not (wd / "scr").exists() and (wd / "src" / "code.py").exists()


def test_the_top_gitfile_of_a_linked_worktree_is_not_a_repository_below(
        tmp_path: Path) -> None:
    wd = tmp_path / "wt"
    wd.mkdir()
    (wd / ".git").write_text("gitdir: /somewhere/.git/worktrees/wt\n")
    (wd / "sub").mkdir()
    (wd / "sub" / ".git").write_text("gitdir: elsewhere\n")
    assert scratch.git_dirs_below(str(wd)) == ["sub/.git"]


def test_a_directory_the_walk_cannot_enter_is_said(tmp_path: Path) -> None:
    # review: a .git below a path longer than PATH_MAX was skipped in silence
    wd = tree(tmp_path)
    fd = os.open(wd, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(25):  # 25 * 201 characters: past PATH_MAX (4096)
            os.mkdir("d" * 200, dir_fd=fd)
            nxt = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkdir(".git", dir_fd=fd)
    finally:
        os.close(fd)
    got = scratch.git_dirs_below(str(wd))
    assert got[-1].startswith("(not looked into: 1 directory, e.g. [Errno 36] File name too "
                              "long"), got
