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
    # shapes that ended the loop with a traceback (issue 16)
    ("run_command", {"argv": "ls 'unclosed"}, "`argv` as text cannot be split (No closing"),
    ("run_command", {"argv": ["\ud800"]}, "valid Unicode"),
    ("run_command", {"argv": ["true"], "timeout": True}, "`timeout` must be a positive number"),
    ("run_command", {"argv": ["true"], "timeout": "5"}, "`timeout` must be a positive number"),
    ("run_command", {"argv": ["true"], "timeout": -1}, "`timeout` must be a positive number"),
    ("run_command", {"argv": ["true"], "timeout": float("nan")}, "`timeout` must be a positive"),
    ("read_file", {"path": "a\udc80"}, "valid Unicode"),
    ("write_file", {"path": "a", "content": "x\ud800"}, "`content` is not valid Unicode"),
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


def test_a_huge_timeout_is_capped_not_a_crash(tmp_path: Path) -> None:
    box = _box(tmp_path, timeout=5)
    assert box.call("run_command", {"argv": ["true"], "timeout": 10 ** 400}) == "exit 0\n"
    assert box.call("run_command", {"argv": ["true"], "timeout": float("inf")}) == "exit 0\n"


def test_the_class_allows_commands_by_exact_name(tmp_path: Path) -> None:
    box = _box(tmp_path, allowed=frozenset({"echo", "true"}))
    assert box.call("run_command", {"argv": ["echo", "ok"]}) == "exit 0\nok\n"
    for argv0 in ("sh", "echo2", "ec"):
        got = box.call("run_command", {"argv": [argv0, "x"]})
        assert got == (f"refused by the permission class: {argv0!r} is not one of the allowed "
                       "commands (echo, true); exact name"), argv0
    nothing = _box(tmp_path, allowed=frozenset())
    assert "allowed commands (none)" in nothing.call("run_command", {"argv": ["true"]})


def _planted(d: Path, name: str = "echo") -> Path:
    """A program the model wrote, under an allowed name; it leaves a mark."""
    prog = d / name
    prog.write_text(f"#!/bin/sh\ntouch {d / 'ran'}\necho planted\n")
    prog.chmod(0o755)
    return prog


@pytest.mark.parametrize("argv0", ["./echo", "/bin/echo", "sub/../echo", "echo/"])
def test_the_class_refuses_any_path(tmp_path: Path, argv0: str) -> None:
    """`./echo` was accepted: its base name is `echo`. A name is looked up on
    PATH; anything with a "/" is refused, whatever it points at."""
    _planted(tmp_path)
    got = _box(tmp_path, allowed=frozenset({"echo"})).call("run_command", {"argv": [argv0]})
    assert got.startswith(f"refused by the permission class: {argv0!r} is a path; give an "
                          "allowed command by its name alone (echo)"), got
    assert not (tmp_path / "ran").exists()


def test_an_allowed_name_that_resolves_into_the_writable_set_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wd, other, bindir = tmp_path / "wd", tmp_path / "out", tmp_path / "bin"
    for d in (wd, other, bindir):
        d.mkdir()
    allowed = frozenset({"echo"})

    def call(path: str, writable: tuple[str, ...] = ()) -> str:
        box = Toolbox(workdir=str(wd), env={**ENV, "PATH": path}, allowed=allowed,
                      command_timeout=10, remaining=lambda: 60, writable=writable)
        return box.call("run_command", {"argv": ["echo", "hi"]})

    prog = _planted(wd)
    got = call(f"{wd}:/usr/bin:/bin")  # the workdir on PATH, before the real echo
    assert got == (f"refused by the permission class: 'echo' is {prog}, inside the run's "
                   f"writable set ({wd}): an allowed name runs only a program the run cannot "
                   "have written"), got
    # through a link outside the set that points into it
    (bindir / "echo").symlink_to(prog)
    got = call(f"{bindir}:/usr/bin:/bin")
    assert f"'echo' is {bindir / 'echo'} -> {prog}, inside the run's writable set" in got, got
    # another writable directory of the run (its return path)
    out_prog = _planted(other)
    got = call(f"{other}:/usr/bin:/bin", writable=(str(other),))
    assert f"'echo' is {out_prog}, inside the run's writable set ({other})" in got, got
    assert not (wd / "ran").exists() and not (other / "ran").exists()
    # relative entries (here: the working directory) are never searched
    monkeypatch.chdir(wd)
    assert call(".::echo-dir:/usr/bin:/bin") == "exit 0\nhi\n"
    assert call("/nonexistent") == "error: 'echo' was not found on PATH (/nonexistent)"
    assert not (wd / "ran").exists()


def test_the_resolved_program_runs_under_its_name(tmp_path: Path) -> None:
    """What runs is the program found on PATH, links resolved (a link the run
    could swap after the check is not followed again), argv[0] the name."""
    bindir, wd = tmp_path / "bin", tmp_path / "wd"
    bindir.mkdir()
    wd.mkdir()
    (bindir / "sh").symlink_to("/bin/sh")
    box = Toolbox(workdir=str(wd), env={**ENV, "PATH": str(bindir)},
                  allowed=frozenset({"sh"}), command_timeout=10, remaining=lambda: 60)
    got = box.call("run_command", {"argv": ["sh", "-c", 'echo "$0"; pwd']})
    assert got == f"exit 0\nsh\n{wd}\n", got


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
