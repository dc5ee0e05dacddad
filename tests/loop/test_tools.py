"""loop/tools.py: the loop's tools as the model sees them and as they run.
Nothing here checks where a write goes (the boundary is the OS's); what is
tested is what each call returns to the model, that a malformed call is
BadCall, that nothing blocks or runs past its budget, and that a command gets
exactly the environment it was given. In-process, in a temporary workdir."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from saphan.loop.tools import (
    NAMES,
    OUTPUT_LIMIT,
    READ_LIMIT,
    SCHEMAS,
    BadCall,
    Toolbox,
    clip,
    run_argv,
)

ENV = {"PATH": "/usr/bin:/bin", "ONLY_THIS": "given"}


def _box(wd: Path, *, allowed: frozenset[str] | None = None, timeout: float = 10,
         remaining: float = 60) -> Toolbox:
    return Toolbox(workdir=str(wd), env=ENV, allowed=allowed, command_timeout=timeout,
                   remaining=lambda: remaining)


def test_the_tools_the_model_is_offered() -> None:
    assert NAMES == ("run_command", "read_file", "write_file", "list_dir", "finish")
    for schema in SCHEMAS:
        assert schema["type"] == "function"
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])


@pytest.mark.parametrize(("name", "args", "needle"), [
    ("rm_rf", {}, "there is no tool 'rm_rf'; the tools are run_command, read_file"),
    ("read_file", ["a"], "read_file: arguments must be a JSON object"),
    ("read_file", {}, "`path` must be a non-empty string"),
    ("read_file", {"path": ""}, "`path` must be a non-empty string"),
    ("read_file", {"path": "a\0b"}, "without NUL bytes"),
    ("write_file", {"path": "a"}, "write_file: `content` must be a string"),
    ("write_file", {"path": "a", "content": 5}, "`content` must be a string"),
    ("run_command", {}, "`argv` must be a non-empty list of strings"),
    ("run_command", {"argv": []}, "`argv` must be a non-empty list"),
    ("run_command", {"argv": ["ls", 3]}, "`argv` must be a non-empty list"),
    ("run_command", {"argv": ["ls", "a\0"]}, "without NUL bytes"),
])
def test_malformed_calls(tmp_path: Path, name: str, args: object, needle: str) -> None:
    with pytest.raises(BadCall) as info:
        _box(tmp_path).call(name, args)
    assert needle in str(info.value)


# -- files -------------------------------------------------------------------------------------

def test_write_read_and_list(tmp_path: Path) -> None:
    box = _box(tmp_path)
    assert box.call("write_file", {"path": "notes.txt", "content": "héllo\n"}) == (
        "wrote 7 bytes to notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "héllo\n"
    assert box.call("read_file", {"path": "notes.txt"}) == "héllo\n"
    box.call("write_file", {"path": "notes.txt", "content": "x"})  # replaced, not appended
    assert (tmp_path / "notes.txt").read_text() == "x"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner").write_text("")
    assert box.call("list_dir", {}) == "notes.txt\nsub/"
    assert box.call("list_dir", {"path": "sub"}) == "inner"
    (tmp_path / "empty").mkdir()
    assert box.call("list_dir", {"path": "empty"}) == "(empty)"
    # An absolute path is the model's to name; the boundary decides.
    assert box.call("read_file", {"path": str(tmp_path / "sub" / "inner")}) == ""


def test_errors_come_back_as_text(tmp_path: Path) -> None:
    box = _box(tmp_path)
    assert box.call("read_file", {"path": "absent"}) == (
        "error: No such file or directory (absent)")
    assert box.call("write_file", {"path": "no/such/dir/f", "content": ""}) == (
        "error: No such file or directory (no/such/dir/f)")
    assert box.call("list_dir", {"path": "absent"}) == (
        "error: No such file or directory (absent)")
    assert box.call("read_file", {"path": "."}) == "error: not a regular file (.)"


def test_a_fifo_or_a_device_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p")
    box = _box(tmp_path)
    t0 = time.monotonic()
    assert box.call("read_file", {"path": "p"}) == "error: not a regular file (p)"
    got = box.call("write_file", {"path": "p", "content": "x"})
    assert got.startswith("error: ") and "(p)" in got  # no reader: ENXIO, not a hang
    assert box.call("read_file", {"path": "/dev/zero"}) == "error: not a regular file (/dev/zero)"
    assert time.monotonic() - t0 < 2


def test_a_large_file_is_read_up_to_the_limit(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"a" * (READ_LIMIT + 100))
    got = _box(tmp_path).call("read_file", {"path": "big"})
    assert got == "a" * READ_LIMIT + "\n[… truncated]"
    (tmp_path / "exact").write_bytes(b"b" * READ_LIMIT)
    assert _box(tmp_path).call("read_file", {"path": "exact"}) == "b" * READ_LIMIT


def test_finish_records_the_summary(tmp_path: Path) -> None:
    box = _box(tmp_path)
    assert box.finished is None
    assert box.call("finish", {"summary": "done it"}) == "finished"
    assert box.finished == "done it"
    box.call("finish", {"summary": 42})
    assert box.finished == "42"


# -- commands ------------------------------------------------------------------------------------

def test_a_command_runs_in_the_workdir_with_only_the_given_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPHAN_TEST_LEAK", "from the loop's own environment")
    got = _box(tmp_path).call("run_command", {"argv": ["sh", "-c", "pwd; env; echo err >&2; "
                                                               "exit 3"]})
    lines = got.splitlines()
    assert lines[0] == "exit 3"
    assert lines[1] == str(tmp_path)
    assert "ONLY_THIS=given" in lines and "err" in lines
    assert not any("SAPHAN_TEST_LEAK" in x for x in lines)


def test_a_command_line_given_as_text_is_split_not_shelled(tmp_path: Path) -> None:
    got = _box(tmp_path).call("run_command", {"argv": "echo 'a b' $HOME; touch x"})
    assert got == "exit 0\na b $HOME; touch x\n"
    assert not (tmp_path / "x").exists()


def test_the_class_allows_commands_by_exact_base_name(tmp_path: Path) -> None:
    box = _box(tmp_path, allowed=frozenset({"echo", "true"}))
    assert box.call("run_command", {"argv": ["/bin/echo", "ok"]}) == "exit 0\nok\n"
    for argv0 in ("sh", "echo2", "/usr/bin/ech", "ec"):
        got = box.call("run_command", {"argv": [argv0, "x"]})
        assert got == (f"refused by the permission class: {os.path.basename(argv0)!r} is not "
                       "one of the allowed commands (echo, true); exact base name"), argv0
    nothing = _box(tmp_path, allowed=frozenset())
    assert "allowed commands (none)" in nothing.call("run_command", {"argv": ["true"]})


def test_a_command_is_killed_at_its_timeout_with_its_group(tmp_path: Path) -> None:
    box = _box(tmp_path, timeout=10)
    t0 = time.monotonic()
    got = box.call("run_command", {"argv": ["sh", "-c", "echo started; (sleep 30; touch late) & "
                                                    "sleep 30"], "timeout": 1})
    took = time.monotonic() - t0
    assert got.startswith("killed after 1 s (timeout)\nstarted"), got
    assert took < 5, took
    time.sleep(0.3)
    assert not (tmp_path / "late").exists()


def test_the_timeout_is_capped_by_the_class_and_the_runs_budget(tmp_path: Path) -> None:
    t0 = time.monotonic()
    got = _box(tmp_path, timeout=1).call("run_command", {"argv": ["sleep", "20"],
                                                         "timeout": 600})
    assert got.startswith("killed after 1 s") and time.monotonic() - t0 < 5
    got = _box(tmp_path, remaining=1).call("run_command", {"argv": ["sleep", "20"]})
    assert got.startswith("killed after 1 s")
    got = _box(tmp_path, remaining=0).call("run_command", {"argv": ["touch", "x"]})
    assert got == "not run: the run's time budget has ended"
    assert not (tmp_path / "x").exists()


def test_a_detached_process_holding_the_output_does_not_hang_the_call(tmp_path: Path) -> None:
    t0 = time.monotonic()
    got = run_argv(["sh", "-c", "setsid sleep 6 & echo started; sleep 20"], cwd=str(tmp_path),
                   env=ENV, timeout=1)
    assert got.startswith("killed after 1 s (timeout)")
    assert "kept its output open" in got
    assert time.monotonic() - t0 < 8


def test_a_program_that_cannot_start(tmp_path: Path) -> None:
    got = run_argv(["/no/such/program"], cwd=str(tmp_path), env=ENV, timeout=5)
    assert got == "error: cannot start '/no/such/program': No such file or directory"


def test_long_output_keeps_its_head_and_tail() -> None:
    assert clip("short") == "short"
    text = "H" * OUTPUT_LIMIT + "T" * 1000
    clipped = clip(text)
    assert clipped.startswith("H" * (OUTPUT_LIMIT // 2) + "\n[… 1000 characters omitted …]\n")
    assert clipped.endswith("T" * 1000)
    assert len(clipped) < len(text)
