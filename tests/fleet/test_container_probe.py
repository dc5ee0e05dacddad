"""`saphan machine probe-container` with a real podman (from Debian) on an
image built offline here (tests/fleet/oci.py), then casts by that digest:
the probe writes the docker-oci row and the machine's runtime, vm_cpus and
vm_memory_bytes; a cast with that digest lands, another digest is refused
container-ineligible, a tampered row is record-signature-invalid; a probe
whose outcome differs writes nothing.

podman runs with a configuration and a storage of the test's own
(CONTAINERS_CONF, CONTAINERS_STORAGE_CONF): runc, no network, limits this
VM allows, the vfs driver (no mounts left behind)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from conftest import Saphan, require
from fleet.oci import build

pytestmark = pytest.mark.usefixtures("bwrap_available")


@pytest.fixture
def podman(tmp_path: Path) -> tuple[dict[str, str], str, str]:
    """(the environment podman needs, the image reference, its digest)."""
    require(shutil.which("podman") is not None and shutil.which("runc") is not None,
            "podman and runc (apt-get install podman runc; ci/setup does)")
    busybox = Path("/bin/busybox")
    require(busybox.exists(), "a static busybox (apt-get install busybox-static)")
    root = tmp_path / "podman"
    root.mkdir()
    conf = root / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
                    'netns = "none"\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
                    'events_logger = "file"\n')
    storage = root / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/graph"\n'
                       f'runroot = "{root}/run"\n')
    env = {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}
    ref = "localhost/saphan-probe:t"
    digest = build(busybox, root / "image.tar", ref, "probe says hello")
    subprocess.run(["podman", "load", "-q", "-i", str(root / "image.tar")], check=True,
                   env={**_base_env(), **env}, capture_output=True, timeout=120)
    return env, f"localhost/saphan-probe@{digest}", digest


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_probe_then_cast_by_digest(saphan_sqlite: Saphan, tmp_path: Path,
                                   podman: tuple[dict[str, str], str, str]) -> None:
    extra, image, digest = podman
    s = saphan_sqlite
    env = s.env(**extra)
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    # an outcome that differs: nothing written
    r = s("machine", "probe-container", "here", "--image", image, "--expect-output", "nope",
          env=env)
    assert r.code == 1 and "does not contain the expected 'nope'" in r.err, r.err
    assert "nothing was written" in r.err
    assert s.ok("machine", "show", "here", "--json").json()["facts"] == {}
    # the probe
    got = s.ok("machine", "probe-container", "here", "--image", image, "--expect-output",
               "probe says hello", "--json", env=env).json()
    rows = got["rows"]
    assert set(rows) == {f"docker-oci:{digest}", "runtime", "vm_cpus", "vm_memory_bytes"}
    row = rows[f"docker-oci:{digest}"]
    assert row["digest"] == digest and row["runtime"] == "podman"
    assert row["output"] == "probe says hello\n"
    assert rows["vm_cpus"]["value"] >= 1 and rows["vm_memory_bytes"]["value"] > 1 << 20
    assert rows["runtime"]["version"].startswith("podman version")
    facts = s.ok("machine", "show", "here", "--json").json()["facts"]
    assert facts[f"docker-oci:{digest}"]["value"]["digest"] == digest
    # a cast by that digest lands; the record says it is routing, not confinement
    r = s("run", "--tool", "command", "--image", digest, "--workdir", str(tmp_path), "--json",
          "--", "true")
    assert r.code == 0, r.err
    cast = json.loads(r.out)["cast"]
    assert cast["chosen"] == {"machine": "here", "slot": "s1"}
    assert cast["image"] == digest and "not confinement" in cast["image_note"]
    # another digest: refused, naming what the machine lacks
    other = "sha256:" + "0" * 64
    r = s("run", "--tool", "command", "--image", other, "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3 and "refused [container-ineligible]" in r.err
    assert f"here/s1: no probe-confirmed docker-oci row for {other}" in r.err
    # a tampered row: record-signature-invalid, never eligible
    db = sqlite3.connect(s.home / "saphan.db")
    db.execute("UPDATE machine_facts SET value_json = replace(value_json, 'podman', 'docker') "
               "WHERE kind = ?", (f"docker-oci:{digest}",))
    db.commit()
    db.close()
    r = s("run", "--tool", "command", "--image", digest, "--workdir", str(tmp_path), "--json",
          "--", "true")
    assert r.code == 3, r.err
    rec = json.loads(r.out)
    assert rec["refusal"]["class"] == "record-signature-invalid"
    assert (f"here/s1: [record-signature-invalid] the docker-oci:{digest} row of machine here"
            in rec["refusal"]["message"])


def test_an_image_the_machine_does_not_hold_writes_nothing(
        saphan_sqlite: Saphan, podman: tuple[dict[str, str], str, str]) -> None:
    extra, _, _ = podman
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    missing = "localhost/nothing@sha256:" + "1" * 64
    r = s("machine", "probe-container", "here", "--image", missing, env=s.env(**extra))
    assert r.code == 1 and f"image {missing} is not on here" in r.err, r.err
    r = s("machine", "probe-container", "here", "--image", "sha256:" + "1" * 64)
    assert r.code == 2 and "give REF@sha256:" in r.err


@pytest.mark.parametrize(("info", "want"), [
    ('{"host": {"cpus": 2, "memTotal": 25276510208}}', (2, 25276510208)),
    # review: a far runtime's answer is hostile input: a bool, a 10^44, a negative
    ('{"host": {"cpus": true, "memTotal": 99999999999999999999999999999999999999999999}}',
     (None, None)),
    ('{"host": {"cpus": -1, "memTotal": "lots"}}', (None, None)),
    ('[1, 2]', (None, None)),
    ("not json", (None, None)),
])
def test_the_runtimes_sizes_are_checked(info: str, want: tuple[int | None, int | None]) -> None:
    from saphan.fleet.container_probe import _sizes

    assert _sizes("podman", info) == want
