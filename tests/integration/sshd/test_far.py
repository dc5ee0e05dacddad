"""The preflight dial's session leaf for a Claude slot: created on the far
machine, reported back, re-derived and checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.sshd.conftest import Remote, linked_projects
from saphan import Engine, Refusal
from saphan.site import far as remote
from saphan.site.far import Preflight, verify_session_dir
from saphan.tools.session_key import session_key


def _dial(far: Remote, name: str, workdir: Path, tool: str = "claude") -> Preflight:
    engine = Engine(far.s.home)
    try:
        m = engine.machine(name)
        launcher = engine.machine_facts(name)["launcher"]["value"]["path"]
        return remote.preflight(engine.ssh(m), workdir=str(workdir), launcher_path=launcher,
                                tool=tool, agent="sh")
    finally:
        engine.close()


def test_preflight_creates_this_runs_leaf_and_it_verifies(far: Remote) -> None:
    far.add("far1")
    far.ok("machine", "deliver", "far1")
    h = far.host("far1")
    wd = h.mkdir("sess/my project.v2")
    pf = _dial(far, "far1", wd)
    key = session_key(str(wd))
    assert key == re.sub("[^A-Za-z0-9]", "-", str(wd)) and key.endswith("-my-project-v2")
    leaf = h.home / ".claude" / "projects" / key
    assert pf.get("session_dir") == str(leaf) and pf.get("session_key") == key
    assert h.far_path(leaf).is_dir() and h.far_path(leaf).stat().st_uid == h.uid
    assert verify_session_dir("far1", pf) == str(leaf)
    # A command slot asks for no session directory at all.
    assert _dial(far, "far1", wd, tool="command").get("session_dir") is None


def test_linked_projects_dir_is_refused_as_foreign(far: Remote) -> None:
    far.add("far2")
    far.ok("machine", "deliver", "far2")
    h = far.host("far2")
    wd = h.mkdir("sess2/wd")
    elsewhere = h.mkdir("elsewhere")
    with linked_projects(h, elsewhere) as claude:
        pf = _dial(far, "far2", wd)
        # the link is named, and nothing is made through it
        assert pf.get("session_dir_link") == pf.get("session_dir") == f"{claude}/projects"
        assert list(h.far_path(elsewhere).iterdir()) == []
        with pytest.raises(Refusal) as e:
            verify_session_dir("far2", pf)
        assert e.value.cls == "session-dir-foreign"
        assert f"it is not {claude}/projects/{session_key(str(wd))}" in e.value.message
        assert f"{claude}/projects is a link there" in e.value.message


def test_long_workdir_uses_the_engines_hashed_key(far: Remote) -> None:
    far.add("far1")
    far.ok("machine", "deliver", "far1")
    h = far.host("far1")
    wd = h.mkdir("long/" + "/".join(["d" * 60] * 4))
    pf = _dial(far, "far1", wd)
    key = session_key(str(wd))
    assert len(key) > 200 and pf.get("session_key") == key
    assert verify_session_dir("far1", pf) == str(h.home / ".claude" / "projects" / key)
    # Reached through a link, the far shell cannot derive a long key: no grant.
    link = h.data / "ln"
    h.as_user("ln", "-sfn", str(wd), str(link))
    pf = _dial(far, "far1", link)
    assert pf.get("session_dir") is None
    assert "cannot derive" in (pf.get("session_unresolved") or "")


def _pf(**raw: str) -> Preflight:
    base = {"workdir": "/w/p", "config_home_real": "/home/u/.claude",
            "session_dir": "/home/u/.claude/projects/-w-p", "session_key": "-w-p"}
    base.update(raw)
    return Preflight({k: v for k, v in base.items() if v != ""})


@pytest.mark.parametrize("reported", [
    "/home/u/.claude",                          # the configuration home itself
    "/home/u/.claude/projects",                 # the parent of every leaf
    "/home/u/.claude/projects/-other-dir",      # another directory's leaf
    "/home/u/.claude/projects/-w-p/..",         # climbs out
    "/home/u/.claude/projects/../projects/-w-p",
    "/home/u/.claude/sessions/-w-p",            # not under projects
    "/",
    "home/u/.claude/projects/-w-p",             # relative
])
def test_verifier_refuses_anything_but_this_runs_own_leaf(reported: str) -> None:
    with pytest.raises(Refusal) as e:
        verify_session_dir("m1", _pf(session_dir=reported))
    assert e.value.cls == "session-dir-foreign"
    assert verify_session_dir("m1", _pf()) == "/home/u/.claude/projects/-w-p"


def test_verifier_refuses_a_key_the_engine_does_not_derive() -> None:
    with pytest.raises(Refusal) as e:
        verify_session_dir("m1", _pf(session_key="-w-q", session_dir="/home/u/.claude/projects/-w-q"))
    assert e.value.cls == "session-dir-foreign"
