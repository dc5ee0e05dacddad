"""The Policy value (confine/policy.py): its defaults, the writable set every
renderer grants, and the shape the run record shows."""

from __future__ import annotations

import dataclasses

import pytest

from saphan.confine.policy import DEVICE_LITERALS, Policy


def test_device_literals_are_the_documented_five() -> None:
    # SPEC.md §2: the devices every run may write, and nothing else of /dev.
    assert DEVICE_LITERALS == ("/dev/null", "/dev/tty", "/dev/zero", "/dev/random", "/dev/urandom")


def test_defaults_grant_the_devices_and_nothing_read_only_hidden_or_denied() -> None:
    p = Policy(workdir="/w", writable_dirs=("/w",))
    assert p.writable_literals == DEVICE_LITERALS
    assert p.readonly_dirs == p.hidden_dirs == p.read_denials == p.setenv == p.notes == ()
    assert p.network == "open" and p.scratch_dir == ""


def test_writable_set_is_the_directories_then_the_literals() -> None:
    p = Policy(workdir="/w", writable_dirs=("/w", "/ws/runs/R/out"), writable_literals=("/dev/null",))
    assert p.writable_set() == ["/w", "/ws/runs/R/out", "/dev/null"]


def test_the_record_names_every_part_of_the_policy() -> None:
    p = Policy(
        workdir="/w", writable_dirs=("/w", "/o"), readonly_dirs=("/w/.git",),
        hidden_dirs=("/ws",), read_denials=("/k",), scratch_dir="/w/.saphan-run/tmp",
        setenv=(("GIT_OBJECT_DIRECTORY", "/w/.saphan-run/objects"),), notes=("a note",),
    )
    assert p.as_record() == {
        "workdir": "/w",
        "writable_dirs": ["/w", "/o"],
        "writable_literals": list(DEVICE_LITERALS),
        "readonly_within_writable": ["/w/.git"],
        "read_denials": ["/k"],
        "hidden": ["/ws"],
        "setenv": {"GIT_OBJECT_DIRECTORY": "/w/.saphan-run/objects"},
        "network": "not restricted",
        "scratch_dir": "/w/.saphan-run/tmp",
    }


def test_a_restricted_network_is_recorded_as_given() -> None:
    p = Policy(workdir="/w", writable_dirs=("/w",), network="none")
    assert p.as_record()["network"] == "none"


def test_a_policy_cannot_be_changed_after_it_is_built() -> None:
    p = Policy(workdir="/w", writable_dirs=("/w",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.writable_dirs = ("/",)  # type: ignore[misc]
    assert p.writable_dirs == ("/w",)
