"""`saphan measure-base` on an SSH runner (a netns sshd host): the same verb,
through saphan-launcher's Landlock domain there, gives the same report as on
this host — and a moved branch is "base not measured" there too.

The far user runs the system's python3 with a real pytest copied into its
user site-packages (the control plane's own pytest and its dependencies,
pure Python): no stand-in runs the suite."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import _pytest
import iniconfig
import packaging
import pluggy
import py
import pygments
import pytest

from integration.sshd.conftest import Remote
from integration.sshd.sshhosts import FarHost
from measure.repos import git, python_repo

PYTEST = ("python3", "-m", "pytest", "-q", "-p", "no:cacheprovider")


def _far_pytest(h: FarHost) -> None:
    """pytest and what it imports, in the far user's user site-packages."""
    site = h.far_path(h.home / ".local" / "lib" / "python3.11" / "site-packages")
    site.mkdir(parents=True, exist_ok=True)
    for mod in (pytest, _pytest, pluggy, iniconfig, packaging, pygments):
        src = Path(mod.__file__ or "").parent
        if not (site / src.name).exists():
            shutil.copytree(src, site / src.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(py.__file__ or "", site / "py.py")  # pytest's one-file shim
    h.in_view("chown", "-R", f"{h.user}:{h.user}", str(h.home / ".local"))


def _far_repo(h: FarHost, tmp: Path, *, branch: str | None = None) -> tuple[Path, str, str]:
    """The fixture repository (made here, copied) in the far user's data dir,
    owned by that user; its far path, base and head (``branch``: a branch
    made at head)."""
    repo, base, head = python_repo(tmp)
    if branch is not None:
        git(repo, "branch", branch, head)
    parent = h.mkdir(f"measure-{tmp.name}")
    shutil.copytree(repo, h.far_path(parent) / repo.name, symlinks=True)
    h.in_view("chown", "-R", f"{h.user}:{h.user}", str(parent))
    return parent / repo.name, base, head


def _measure(far: Remote, wd: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    r = far("measure-base", "--machine", "far2", "--slot", "s1", "--workdir", str(wd),
            *args, "--json", "--", *PYTEST, timeout=600)
    return r.code, json.loads(r.out), r.err


def test_far_measure_base_gives_the_same_report(far: Remote, tmp_path: Path) -> None:
    far.ready("far2")
    h = far.host("far2")
    _far_pytest(h)
    wd, base, head = _far_repo(h, tmp_path)
    code, rec, err = _measure(far, wd, "--base", base[:10])
    m = rec["measure"]
    assert m["result"] == "measured", (err[-3000:], m)
    assert code == 1
    assert rec["enforced_by"]["mechanism"] == "landlock" and rec["transport"]["kind"] == "ssh"
    assert m["base"]["expected"] == m["base"]["measured"] == base
    assert m["head"]["commit"] == head
    assert m["pairs"] == {
        "pre-existing": ["test_suite::test_pre"],
        "introduced": ["test_suite::test_intro", "test_suite::test_tree"],
        "fixed": ["test_suite::test_fix"],
        "passing": ["test_suite::test_keep"],
        "only-base": [], "only-head": []}
    tree = m["one_tree"]
    assert tree["holds"] and not tree["scratch_present"], tree
    assert tree["changed_since_head"] == [
        {"item": "test_suite::test_tree", "head": "failed", "final": "passed"}]
    # the far scratch and the run's far return directory are gone; the
    # default scratch's rule went into the far repository's info/exclude
    far_wd = h.far_path(wd)
    assert not (far_wd / m["order"]["scratch"]).exists()
    assert not (far_wd / ".saphan-run" / rec["id"]).exists()
    assert "/.saphan-run/" in (far_wd / ".git" / "info" / "exclude").read_text()
    assert json.loads(Path(m["file"]).read_text())["pairs"] == m["pairs"]


def test_far_moved_branch_is_base_not_measured(far: Remote, tmp_path: Path) -> None:
    far.ready("far2")
    h = far.host("far2")
    _far_pytest(h)
    wd, base, head = _far_repo(h, tmp_path, branch="release")
    code, rec, err = _measure(far, wd, "--base", "release", "--expect", base)
    m = rec["measure"]
    assert code == 4, err[-2000:]
    assert m["result"] == "base not measured"
    assert m["base"]["expected"] == base and m["base"]["measured"] == head
    assert "pairs" not in m


def test_a_scratch_parent_swapped_for_a_link_deletes_nothing_outside(far: Remote,
                                                                   tmp_path: Path) -> None:
    """The head suite replaces the scratch's parent with a link to a far
    directory outside the tree holding a same-named entry: the driver's
    removal is refused by the Landlock domain, saphan's far check sees the
    link and removes nothing; the victim is intact."""
    far.ready("far2")
    h = far.host("far2")
    wd, base, _ = _far_repo(h, tmp_path)
    victim = h.mkdir("victim")
    h.as_user("mkdir", "-p", str(victim / "x"))
    h.as_user("sh", "-c", f"echo keep > {victim}/x/f")
    far_wd = h.far_path(wd)
    with (far_wd / ".git" / "info" / "exclude").open("a") as f:
        f.write("/scr/\n/scr.moved/\n")
    swap = f'[ -L scr ] || {{ [ -d scr ] && mv scr scr.moved && ln -s {victim} scr; }}; true'
    r = far("measure-base", "--machine", "far2", "--slot", "s1", "--workdir", str(wd),
            "--base", base, "--scratch", "scr/x", "--json", "--", "sh", "-c", swap,
            timeout=600)
    m = json.loads(r.out)["measure"]
    assert m["result"] in ("measured", "base not measured"), (r.err[-2000:], m)
    tree = m["one_tree"]
    assert not tree["holds"] and not tree["removed_by_saphan"], tree
    assert tree.get("check_error", "").startswith("the check on the runner ended 0: link scr")
    assert (h.far_path(victim) / "x" / "f").read_text() == "keep\n"
