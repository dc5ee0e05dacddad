"""A batch file (batch/spec.py): JSONL checked line by line before anything
is written, every error naming its line; a task as the arguments of one
cast run; a task described on one short line."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from saphan.batch import spec
from saphan.batch.spec import check_files, describe, parse, parse_file, pinned_files, run_arguments
from saphan.errors import UserError
from saphan.tools.instruction import Request

#: a valid permission class (a batch checks the class when it is made)
CLASS = '{"schema": 2, "allowed_commands": ["make"], "network": "open"}'


def _jsonl(*tasks: object) -> bytes:
    return "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks).encode()


def _refused(data: bytes, *needles: str) -> str:
    with pytest.raises(UserError) as e:
        parse(data, cwd="/cwd")
    text = str(e.value)
    for needle in needles:
        assert needle in text, text
    return text


# -- good files ------------------------------------------------------------------------

def test_parse_good_file() -> None:
    data = _jsonl(
        {"id": "t1", "command": ["make", "test"], "workdir": "/src/a"},
        {"tool": "claude", "prompt": "fix the flaky test", "repo": "/src/b", "base": "main",
         "labels": {"zone": "eu"}, "max_seconds": 900, "max_turns": 5, "model": "m1"},
    )
    got = parse(data, cwd="/cwd")
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert got.tasks == [
        ("t1", {"tool": "command", "command": ["make", "test"], "workdir": "/src/a"}),
        ("line-2", {"tool": "claude", "prompt": "fix the flaky test", "repo": "/src/b",
                    "base": "main", "labels": {"zone": "eu"}, "max_seconds": 900,
                    "max_turns": 5, "model": "m1"}),
    ]


def test_default_ids_and_blank_lines() -> None:
    data = b'\n{"command": ["a"]}\n   \n{"id": "x", "command": ["b"]}\n\t\n{"command": ["c"]}'
    got = parse(data, cwd="/cwd")
    assert [tid for tid, _ in got.tasks] == ["line-2", "x", "line-6"]
    assert [s["command"] for _, s in got.tasks] == [["a"], ["b"], ["c"]]


def test_crlf_lines() -> None:
    got = parse(b'{"command": ["a"]}\r\n{"command": ["b"]}\r\n', cwd="/cwd")
    assert [tid for tid, _ in got.tasks] == ["line-1", "line-2"]


def test_relative_paths_made_absolute_against_cwd(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "pc.json").write_text(CLASS)
    (tmp_path / "egress.json").write_text('{"v": 1}')
    data = _jsonl({"command": ["x"], "workdir": "rel/dir"},
                  {"tool": "codex", "prompt": "p", "repo": "r", "permission_class": "pc.json",
                   "egress_policy": str(tmp_path / "egress.json")},
                  {"command": ["y"], "workdir": "/abs/wd", "machine": "m1", "image": "img"})
    (_, a), (_, b), (_, c) = parse(data, cwd=str(base)).tasks
    assert a["workdir"] == f"{base}/rel/dir"
    assert b["repo"] == f"{base}/r"
    assert b["permission_class"] == f"{base}/pc.json"
    assert b["egress_policy"] == str(tmp_path / "egress.json")
    # the policy files' contents are pinned in the signed task
    assert b["permission_class_sha256"] == hashlib.sha256(CLASS.encode()).hexdigest()
    assert b["egress_policy_sha256"] == hashlib.sha256(b'{"v": 1}').hexdigest()
    assert c["workdir"] == "/abs/wd"
    # names that are not paths are kept as given
    assert c["machine"] == "m1" and c["image"] == "img"


def test_a_task_without_a_directory_gets_the_current_one_pinned() -> None:
    """Never the directory a worker or a resume happens to start in."""
    (_, s), = parse(_jsonl({"command": ["x"]}), cwd="/where/it/was/made").tasks
    assert s["workdir"] == "/where/it/was/made"
    (_, r), = parse(_jsonl({"command": ["x"], "repo": "/r"}), cwd="/w").tasks
    assert "workdir" not in r


def test_a_class_naming_its_own_egress_policy_is_refused(tmp_path: Path) -> None:
    (tmp_path / "e.json").write_text("{}")
    (tmp_path / "pc.json").write_text(json.dumps({
        "schema": 4, "allowed_commands": ["make"], "network": "open",
        "egress_policy": str(tmp_path / "e.json")}))
    with pytest.raises(UserError, match="names an egress policy of its own"):
        parse(_jsonl({"command": ["x"], "permission_class": "pc.json"}), cwd=str(tmp_path))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="batch:1: permission class"):
        parse(_jsonl({"command": ["x"], "permission_class": "bad.json"}), cwd=str(tmp_path))


def test_the_run_loads_a_private_copy_of_the_signed_bytes(tmp_path: Path) -> None:
    """Checked then opened again by path, a swapped file would be loaded:
    the run gets a copy of exactly the bytes that were checked."""
    pc = tmp_path / "pc.json"
    pc.write_text(CLASS)
    (_, s), = parse(_jsonl({"command": ["x"], "permission_class": str(pc)}),
                    cwd=str(tmp_path)).tasks
    pinned = pinned_files(s, str(tmp_path / "ws" / "batches" / "B"))
    copy = Path(pinned["permission_class"])
    assert copy.parent == tmp_path / "ws" / "batches" / "B" and copy.read_text() == CLASS
    assert copy.stat().st_mode & 0o777 == 0o600
    assert pinned_files(s, str(copy.parent))["permission_class"] == str(copy)  # again: same
    pc.write_text(CLASS.replace('"open"', '"off"'))
    with pytest.raises(UserError, match="changed since the batch was made"):
        pinned_files(s, str(copy.parent))


def test_a_policy_file_is_pinned_and_checked_before_the_task_runs(tmp_path: Path) -> None:
    pc = tmp_path / "pc.json"
    pc.write_text(CLASS)
    (_, s), = parse(_jsonl({"command": ["x"], "permission_class": str(pc)}),
                    cwd=str(tmp_path)).tasks
    check_files(s)  # unchanged: fine
    pc.write_text(CLASS.replace('"open"', '"off"'))
    with pytest.raises(UserError, match="changed since the batch was made"):
        check_files(s)
    pc.unlink()
    pc.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="not a link"):
        check_files(s)
    with pytest.raises(UserError, match="batch:1: 'permission_class'"):
        parse(_jsonl({"command": ["x"], "permission_class": str(tmp_path / "none.json")}))
    # a directory or a FIFO is not a policy file: named, nothing written
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for odd in (tmp_path, fifo):
        with pytest.raises(UserError, match="is not a regular file"):
            parse(_jsonl({"command": ["x"], "egress_policy": str(odd)}))


def test_parse_uses_the_current_directory_by_default(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (_, s), = parse(_jsonl({"command": ["x"], "workdir": "wd"})).tasks
    assert s["workdir"] == str(tmp_path / "wd")


def test_line_separators_inside_json_strings() -> None:
    # U+2028, U+2029 and U+0085 may stand unescaped in a JSON string: they
    # do not end a JSONL line (only "\n" does).
    data = _jsonl({"command": ["echo", "a\u2028b"]}, {"command": ["echo", "c\u0085d"]},
                  {"tool": "claude", "prompt": "e\u2029f"})
    got = parse(data, cwd="/cwd")
    assert [tid for tid, _ in got.tasks] == ["line-1", "line-2", "line-3"]
    assert got.tasks[0][1]["command"] == ["echo", "a\u2028b"]


# -- refused lines, each named ------------------------------------------------------------

def test_not_json_names_its_line() -> None:
    _refused(b'{"command": ["a"]}\n\n{"command": \n', "batch:3", "not JSON")


def test_not_an_object() -> None:
    _refused(_jsonl({"command": ["a"]}, ["make"]), "batch:2", "JSON object", "list")


def test_unknown_key() -> None:
    text = _refused(_jsonl({"command": ["a"], "cmd": "x"}), "batch:1", "unknown key 'cmd'")
    assert "workdir" in text  # the keys a task has are listed


@pytest.mark.parametrize("task, key", [
    ({"command": ["a"], "workdir": 3}, "'workdir'"),
    ({"command": ["a"], "workdir": ""}, "'workdir'"),
    ({"command": ["a"], "workdir": "a\x00b"}, "'workdir'"),
    ({"command": ["a"], "machine": ["m"]}, "'machine'"),
    ({"tool": "claude", "prompt": None}, "'prompt'"),
    ({"tool": "claude", "prompt": "p", "max_seconds": "60"}, "'max_seconds'"),
    ({"tool": "claude", "prompt": "p", "max_seconds": 1.5}, "'max_seconds'"),
    ({"tool": "claude", "prompt": "p", "max_seconds": 0}, "'max_seconds'"),
    ({"tool": "claude", "prompt": "p", "max_turns": 10_000_001}, "'max_turns'"),
    ({"command": ["a"], "id": 7}, "'id'"),
    ({"command": ["a"], "id": ""}, "'id'"),
    ({"command": ["a"], "id": "-leading-dash"}, "'id'"),
    ({"command": ["a"], "id": "has space"}, "'id'"),
    ({"command": ["a"], "id": "x" * 129}, "'id'"),
    ({"command": ["a"], "labels": ["zone=eu"]}, "'labels'"),
    ({"command": ["a"], "labels": {"zone": 1}}, "'labels'"),
    ({"tool": "nope", "command": ["a"]}, "tool 'nope' is unknown"),
])
def test_wrong_types(task: dict[str, Any], key: str) -> None:
    _refused(_jsonl({"command": ["ok"]}, task), "batch:2", key)


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_a_budget(value: bool) -> None:
    _refused(_jsonl({"tool": "claude", "prompt": "p", "max_turns": value}), "batch:1",
             "'max_turns'", "whole number")


def test_budget_bounds_kept() -> None:
    (_, s), = parse(_jsonl({"tool": "codex", "prompt": "p", "max_seconds": 1,
                            "max_turns": 10_000_000}), cwd="/").tasks
    assert (s["max_seconds"], s["max_turns"]) == (1, 10_000_000)


def test_id_characters_allowed() -> None:
    (tid, s), = parse(_jsonl({"id": "a.b_c:d/e@f+g-h", "command": ["x"]}), cwd="/").tasks
    assert tid == "a.b_c:d/e@f+g-h" and "id" not in s


def test_duplicate_ids() -> None:
    _refused(_jsonl({"id": "t", "command": ["a"]}, {"command": ["b"]},
                    {"id": "t", "command": ["c"]}), "batch:3", "'t'", "line 1")


def test_explicit_id_colliding_with_a_default_one() -> None:
    _refused(_jsonl({"id": "line-2", "command": ["a"]}, {"command": ["b"]}), "batch:2",
             "'line-2'")


@pytest.mark.parametrize("labels, needle", [
    ({"zone": "e u"}, "whitespace"),
    ({"zone": "eu,us"}, "','"),
    ({"zone": ""}, "empty value"),
    ({"Zone": "eu"}, "label key"),
    ({"zone": "x" * 129}, "over 128"),
])
def test_bad_labels(labels: dict[str, str], needle: str) -> None:
    _refused(_jsonl({"command": ["a"], "labels": labels}), "batch:1", needle)


def test_label_key_with_equals_is_refused() -> None:
    # {"zone=eu": "x"} is not the label zone=eu=x: a key holds no '='.
    _refused(_jsonl({"command": ["a"], "labels": {"zone=eu": "x"}}), "batch:1", "label")


def test_good_labels_kept() -> None:
    (_, s), = parse(_jsonl({"command": ["a"], "labels": {"zone": "eu", "gpu": "a=b"}}),
                    cwd="/").tasks
    assert s["labels"] == {"zone": "eu", "gpu": "a=b"}


@pytest.mark.parametrize("command", [None, [], "make test", ["make", 1], ["a\x00b"]])
def test_command_task_needs_a_list_of_strings(command: object) -> None:
    task: dict[str, Any] = {"tool": "command"}
    if command is not None:
        task["command"] = command
    _refused(_jsonl(task), "batch:1", "non-empty list of strings")


@pytest.mark.parametrize("key, value", [("prompt", "p"), ("max_turns", 3), ("model", "m"),
                                        ("lane", "l"), ("max_seconds", 5)])
def test_command_task_refuses_agent_keys(key: str, value: object) -> None:
    _refused(_jsonl({"command": ["a"], key: value}), "batch:1", f"{key!r}", "agent tasks")


@pytest.mark.parametrize("tool", ["claude", "codex", "loop"])
def test_agent_task_needs_prompt(tool: str) -> None:
    _refused(_jsonl({"tool": tool, "model": "m"}), "batch:1", "needs 'prompt'")


def test_agent_task_refuses_command() -> None:
    _refused(_jsonl({"tool": "claude", "prompt": "p", "command": ["a"]}), "batch:1",
             "not 'command'")


def test_repo_and_workdir_refused() -> None:
    _refused(_jsonl({"command": ["a"], "repo": "/r", "workdir": "/w"}), "batch:1",
             "'repo' or 'workdir'")


def test_base_without_repo_refused() -> None:
    _refused(_jsonl({"command": ["a"], "base": "main", "workdir": "/w"}), "batch:1",
             "'base' needs 'repo'")


def test_not_utf8() -> None:
    _refused(b'{"command": ["a"]}\n{"command": ["\xff"]}\n', "batch", "not UTF-8", "byte 33")


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"])
def test_empty_file(data: bytes) -> None:
    _refused(data, "batch", "no tasks")


def test_too_many_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec, "MAX_TASKS", 2)
    assert len(parse(_jsonl({"command": ["a"]}, {"command": ["b"]}), cwd="/").tasks) == 2
    _refused(_jsonl({"command": ["a"]}, {"command": ["b"]}, {"command": ["c"]}), "over 2 tasks")


# -- parse_file ---------------------------------------------------------------------

def test_parse_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "b.jsonl"
    data = _jsonl({"command": ["a"], "workdir": "wd"})
    path.write_bytes(data)
    got = parse_file(str(path))
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert got.tasks == [("line-1", {"tool": "command", "command": ["a"],
                                     "workdir": str(tmp_path / "wd")})]


def test_parse_file_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(_jsonl({"command": ["a"]}, {"command": ["b"], "nope": 1}))
    with pytest.raises(UserError, match=f"^{path}:2: unknown key 'nope'"):
        parse_file(str(path))


def test_parse_file_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"cannot read the batch file .*missing\.jsonl"):
        parse_file(str(tmp_path / "missing.jsonl"))


def test_parse_file_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read the batch file"):
        parse_file(str(tmp_path))


def test_parse_file_too_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "b.jsonl"
    data = _jsonl({"command": ["a"]})
    path.write_bytes(data)
    monkeypatch.setattr(spec, "MAX_FILE_BYTES", len(data))
    assert len(parse_file(str(path)).tasks) == 1  # exactly the limit is read
    monkeypatch.setattr(spec, "MAX_FILE_BYTES", len(data) - 1)
    with pytest.raises(UserError, match=r"is over .*split it"):
        parse_file(str(path))


# -- run_arguments ----------------------------------------------------------------------

def test_run_arguments_command() -> None:
    (_, s), = parse(_jsonl({"command": ["make", "test"], "workdir": "/w", "image": "img",
                            "labels": {"zone": "eu"}}), cwd="/").tasks
    argv, kwargs = run_arguments(s)
    assert argv == ["make", "test"]
    assert kwargs == {"tool": "command", "labels": {"zone": "eu"}, "image": "img",
                      "workdir": "/w", "repo": None, "base_ref": None}
    assert "request" not in kwargs


def test_run_arguments_command_with_permission_class(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(CLASS)
    (_, s), = parse(_jsonl({"command": ["x"], "repo": "/r", "base": "dev",
                            "permission_class": "p.json", "labels": {}}),
                    cwd=str(tmp_path)).tasks
    argv, kwargs = run_arguments(s)
    assert argv == ["x"]
    assert kwargs["repo"] == "/r" and kwargs["base_ref"] == "dev"
    assert kwargs["labels"] is None  # no labels: none asked for
    assert kwargs["request"] == Request(permission_class=str(tmp_path / "p.json"))


def test_run_arguments_claude(tmp_path: Path) -> None:
    (tmp_path / "e.json").write_text("{}")
    (_, s), = parse(_jsonl({"tool": "claude", "prompt": "fix it", "model": "m", "lane": "l",
                            "max_turns": 4, "max_seconds": 60, "egress_policy": "e.json",
                            "repo": "r"}), cwd=str(tmp_path)).tasks
    argv, kwargs = run_arguments(s)
    assert argv == []
    req = kwargs.pop("request")
    assert isinstance(req, Request)
    assert (req.prompt, req.model, req.lane, req.max_turns, req.max_seconds,
            req.permission_class, req.egress_policy, req.prompt_file, req.resume) == (
        "fix it", "m", "l", 4, 60, None, str(tmp_path / "e.json"), None, None)
    assert kwargs == {"tool": "claude", "labels": None, "image": None, "workdir": None,
                      "repo": str(tmp_path / "r"), "base_ref": None}


# -- describe -------------------------------------------------------------------------

def test_describe() -> None:
    assert describe({"tool": "command", "command": ["make", "test"]}) == "make test"
    assert describe({"tool": "claude", "prompt": "fix"}) == "claude: fix"


def test_describe_truncates() -> None:
    text = describe({"tool": "command", "command": ["x" * 100]})
    assert len(text) == 60 and text == "x" * 59 + "…"
    exact = describe({"tool": "command", "command": ["y" * 60]})
    assert exact == "y" * 60


def test_describe_escapes_control_characters() -> None:
    text = describe({"tool": "codex", "prompt": "a\x1b[31mred\nb\tc"})
    assert text == "codex: a?[31mred?b?c"
    assert all(c.isprintable() for c in text)


def test_a_copy_cut_short_by_an_earlier_attempt_is_not_trusted(tmp_path: Path) -> None:
    pc = tmp_path / "pc.json"
    pc.write_text(CLASS)
    (_, s), = parse(_jsonl({"command": ["x"], "permission_class": str(pc)}),
                    cwd=str(tmp_path)).tasks
    into = tmp_path / "ws" / "batches" / "B"
    copy = Path(pinned_files(s, str(into))["permission_class"])
    copy.write_text(CLASS[:10])  # a write cut short
    assert Path(pinned_files(s, str(into))["permission_class"]).read_text() == CLASS
    assert [p.name for p in into.iterdir()] == [copy.name]  # no temp file left
