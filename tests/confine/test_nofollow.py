"""saphan's own reads and writes where a run could have planted links
(confine/nofollow.py): a link at any component is named, never followed, and a
FIFO or device under an expected name never stalls or feeds saphan."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from saphan.confine import nofollow
from saphan.errors import PlantedLink


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory a planted link points at; its one file must never change."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "victim.txt").write_text("victim\n")
    return d


def _unchanged(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "victim\n"


def _returns_soon(fn: Callable[[], object], fifo: Path) -> BaseException | None:
    """Run ``fn`` in a thread; it must finish within 5 s (a FIFO opened for
    blocking would hang it: then the FIFO is opened from here to release it)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            caught.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # releases a blocked open
        os.close(fd)
        t.join(5)
        pytest.fail(f"{fn} blocked on the FIFO {fifo}")
    return caught[0] if caught else None


# -- walking directories ------------------------------------------------------------

def test_open_dir_reaches_a_real_directory(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    with nofollow.open_dir(str(tmp_path / "a" / "b")) as fd:
        assert os.listdir(fd) == ["f"]


def test_open_dir_names_the_link_component_and_its_target(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "link").symlink_to(outside)
    with pytest.raises(PlantedLink) as e, nofollow.open_dir(str(tmp_path / "link" / "sub")):
        pass
    assert e.value.path == str(tmp_path / "link")
    assert e.value.what == f"a symbolic link (-> {outside})"
    assert str(e.value) == f"{tmp_path / 'link'} is a symbolic link (-> {outside}); saphan does not follow it"


def test_open_dir_names_a_file_where_a_directory_was_expected(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(PlantedLink, match="is a regular file"), nofollow.open_dir(str(tmp_path / "f")):
        pass


def test_open_dir_refuses_a_relative_path_and_reports_a_missing_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an absolute path"), nofollow.open_dir("rel/dir"):
        pass
    with pytest.raises(FileNotFoundError), nofollow.open_dir(str(tmp_path / "missing")):
        pass


def test_open_dir_leaks_no_descriptor_on_success_or_refusal(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "link").symlink_to(outside)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with nofollow.open_dir(str(tmp_path)):
            pass
        with pytest.raises(PlantedLink), nofollow.open_dir(str(tmp_path / "link" / "x")):
            pass
    assert len(os.listdir("/proc/self/fd")) == before


# -- makedirs -------------------------------------------------------------------------

def test_makedirs_creates_each_component_and_accepts_existing_ones(tmp_path: Path) -> None:
    got = nofollow.makedirs(str(tmp_path), "a/b/c", 0o700)
    assert got == str(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert (tmp_path / "a" / "b" / "c").stat().st_mode & 0o777 == 0o700
    assert nofollow.makedirs(str(tmp_path), "a/b/c") == got


def test_makedirs_never_creates_through_a_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").symlink_to(outside)
    with pytest.raises(PlantedLink) as e:
        nofollow.makedirs(str(tmp_path), "a/b/c/d")
    assert e.value.path == str(tmp_path / "a" / "b")
    _unchanged(outside)


def test_makedirs_through_a_link_in_its_root_is_refused(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "root").symlink_to(outside)
    with pytest.raises(PlantedLink):
        nofollow.makedirs(str(tmp_path / "root"), "new")
    _unchanged(outside)


def test_makedirs_names_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    with pytest.raises(PlantedLink, match="a regular file"):
        nofollow.makedirs(str(tmp_path), "a/b")


@pytest.mark.parametrize("rel", ["a/../b", "./a", ".."])
def test_makedirs_refuses_dot_components(tmp_path: Path, rel: str) -> None:
    with pytest.raises(ValueError, match=r"must not contain \. or \.\."):
        nofollow.makedirs(str(tmp_path), rel)
    assert {p.name for p in tmp_path.iterdir()} <= {"a"}


# -- reading ----------------------------------------------------------------------------

def test_read_small_reads_a_small_regular_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"gitdir: /x\n")
    assert nofollow.read_small(str(tmp_path / "f")) == b"gitdir: /x\n"


def test_read_small_refuses_a_link_at_the_last_or_an_inner_component(tmp_path: Path,
                                                                    outside: Path) -> None:
    (tmp_path / "f").symlink_to(outside / "victim.txt")
    with pytest.raises(PlantedLink, match="symbolic link"):
        nofollow.read_small(str(tmp_path / "f"))
    (tmp_path / "d").symlink_to(outside)
    with pytest.raises(PlantedLink, match="symbolic link"):
        nofollow.read_small(str(tmp_path / "d" / "victim.txt"))


def test_read_small_refuses_a_file_over_its_limit(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 11)
    assert nofollow.read_small(str(tmp_path / "f"), limit=11) == b"x" * 11
    with pytest.raises(PlantedLink, match="larger than 10 bytes"):
        nofollow.read_small(str(tmp_path / "f"), limit=10)


def test_read_small_never_blocks_on_a_planted_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "gitdir"
    os.mkfifo(fifo)
    err = _returns_soon(lambda: nofollow.read_small(str(fifo)), fifo)
    assert isinstance(err, PlantedLink)
    assert err.what == "a special file (FIFO, socket or device)"


def test_read_small_refuses_a_device() -> None:
    with pytest.raises(PlantedLink, match="special file"):
        nofollow.read_small("/dev/zero")


# -- writing -------------------------------------------------------------------------------

def test_append_line_creates_then_appends(tmp_path: Path) -> None:
    path = str(tmp_path / "registry")
    nofollow.append_line(path, "/a")
    nofollow.append_line(path, "/b")
    assert (tmp_path / "registry").read_text() == "/a\n/b\n"


def test_append_line_never_writes_through_a_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "registry").symlink_to(outside / "victim.txt")
    with pytest.raises(PlantedLink):
        nofollow.append_line(str(tmp_path / "registry"), "/a")
    (tmp_path / "dir").symlink_to(outside)
    with pytest.raises(PlantedLink):
        nofollow.append_line(str(tmp_path / "dir" / "new"), "/a")
    _unchanged(outside)


def test_append_line_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "registry"
    os.mkfifo(fifo)
    assert isinstance(_returns_soon(lambda: nofollow.append_line(str(fifo), "/a"), fifo),
                      (PlantedLink, OSError))


def test_write_replace_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("old")
    nofollow.write_replace(str(tmp_path / "f"), b"new", 0o600)
    assert (tmp_path / "f").read_bytes() == b"new"
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_write_replace_replaces_a_planted_link_instead_of_following_it(tmp_path: Path,
                                                                       outside: Path) -> None:
    (tmp_path / "f").symlink_to(outside / "victim.txt")
    nofollow.write_replace(str(tmp_path / "f"), b"new")
    assert not (tmp_path / "f").is_symlink()
    assert (tmp_path / "f").read_bytes() == b"new"
    _unchanged(outside)


def test_write_replace_refuses_a_link_in_its_parent(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "d").symlink_to(outside)
    with pytest.raises(PlantedLink):
        nofollow.write_replace(str(tmp_path / "d" / "victim.txt"), b"new")
    _unchanged(outside)


# -- what is there ----------------------------------------------------------------------------

def test_lexists_plain_names_each_kind_without_following(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    (tmp_path / "l").symlink_to(tmp_path / "d")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    os.mkfifo(tmp_path / "p")
    kinds = {n: nofollow.lexists_plain(str(tmp_path / n))
             for n in ("d", "f", "l", "dangling", "p", "missing")}
    assert kinds == {"d": "dir", "f": "file", "l": "link", "dangling": "link", "p": "other",
                     "missing": None}
