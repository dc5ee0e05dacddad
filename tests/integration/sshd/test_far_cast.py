"""Casting over three machines: this host and two netns SSH hosts, one
delivered and probed (far1), one added but never probed (far2). A run lands
on the only eligible slot; a label excludes what it should; a far machine
never probed is passed over with that reason, before anything is dialled;
with every seat held the refusal is fleet-full naming each candidate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import saphan_exe
from integration.sshd.conftest import Remote

HOLD = "while [ ! -e release ]; do sleep 0.1; done"


def _fleet(far: Remote) -> None:
    far.ok("machine", "add", "here", "--local", "--label", "zone=local")
    far.ok("slot", "add", "here", "s1", "--tool", "command")
    far.ready("far1")
    far.ok("machine", "set", "far1", "--label", "zone=eu")
    far.add("far2")
    far.ok("machine", "set", "far2", "--label", "zone=eu")
    far.ok("slot", "add", "far2", "s1", "--tool", "command")
    far.ok("slot", "add", "far2", "agent", "--tool", "loop")


def _why(rec: dict[str, Any]) -> dict[str, str]:
    return {f"{p['machine']}/{p['slot']}": p["why"] for p in rec["cast"]["passed_over"]}


def test_a_cast_lands_on_the_only_eligible_slot(far: Remote) -> None:
    _fleet(far)
    h = far.host("far1")
    wd = h.mkdir("cast-wd")
    r = far("run", "--tool", "command", "--label", "zone=eu", "--workdir", str(wd), "--json",
            "--", "sh", "-c", "echo cast > landed")
    assert r.code == 0, r.err
    rec = json.loads(r.out)
    assert (rec["machine"], rec["slot"]) == ("far1", "s1")
    assert rec["enforced_by"]["mechanism"] == "landlock"
    assert (h.far_path(wd) / "landed").read_text() == "cast\n"
    why = _why(rec)
    assert why["here/s1"] == "labels: zone=eu wanted, has zone=local"
    assert why["far2/s1"].startswith("[landlock-unprobed] machine far2 has no measured "
                                     "Landlock level")
    assert "far2/agent" not in why  # another tool's slot is never a candidate
    assert rec["cast"]["candidates"] == ["far1/s1"]
    # only far2, never probed: nothing can take it, and far2 was never dialled
    r = far("run", "--tool", "command", "--machine", "far2", "--workdir", str(wd), "--", "true")
    assert r.code == 3 and "refused [no-eligible-slot]" in r.err
    assert "far2/s1: [landlock-unprobed]" in r.err


def test_every_seat_held_is_fleet_full_naming_each(far: Remote, tmp_path: Path) -> None:
    _fleet(far)
    h = far.host("far1")
    wd = h.mkdir("cast-full")
    local = subprocess.Popen(
        [saphan_exe(), "run", "--machine", "here", "--slot", "s1", "--workdir", str(tmp_path),
         "--", "sh", "-c", HOLD], env=far.s.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    remote = far.start_run("far1", wd, "sh", "-c", HOLD)
    try:
        far.wait_far_holder("far1")
        r = far("run", "--tool", "command", "--workdir", str(wd), "--json", "--", "true")
        assert r.code == 3, r.err
        rec = json.loads(r.out)
        assert rec["refusal"]["class"] == "fleet-full"
        msg = rec["refusal"]["message"]
        assert "far1/s1: full: slot s1 on far1 carries 1 run and may carry 1" in msg
        assert "far2/s1: [landlock-unprobed]" in msg
        # here's workdir is another machine's path: passed over at inspection
        assert f"here/s1: [workdir-missing] the working directory {wd} does not exist" in msg
        assert rec["machine"] == "(fleet)" and rec["enforced_by"] is None
    finally:
        (tmp_path / "release").touch()
        (h.far_path(wd) / "release").touch()
        codes = [p.wait(timeout=60) for p in (local, remote)]
    assert codes == [0, 0]


def test_an_unreachable_candidate_is_passed_over(far: Remote) -> None:
    far.ready("far1")
    far.ready("far3")
    h1, h3 = far.host("far1"), far.host("far3")
    wd = h1.mkdir("cast-unreach")
    h3.mkdir("cast-unreach")
    holder = far.start_run("far1", wd, "sh", "-c", HOLD)
    h3.stop()
    try:
        far.wait_far_holder("far1")
        r = far("run", "--tool", "command", "--workdir", str(wd), "--json", "--", "true")
        assert r.code == 3, r.err
        msg = json.loads(r.out)["refusal"]["message"]
        assert "far1/s1: full: slot s1 on far1 carries 1 run" in msg
        assert "far3/s1: unreachable: " in msg
    finally:
        h3.start()
        (h1.far_path(wd) / "release").touch()
        code = holder.wait(timeout=60)
    assert code == 0
