"""Lanes through the real CLI: `saphan lane add/list/check/remove`, the
custody refusals on a lane's credential file, and the input checks a loop
run makes before anything is dispatched.

Bad input exits 2 with one line naming the thing; an unsafe credential file
exits 3 with ``refused [custody-key-unsafe]`` and a ``fix:`` line; the lanes
file is mode 0600 and never holds a key; no listing prints a key.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import pytest

from conftest import Result, Saphan
from tools.model_servers import ChatCompletionsServer


def _keyfile(tmp_path: Path, name: str = "lane.key", *, mode: int = 0o600) -> tuple[Path, str]:
    secret = f"sk-test-{secrets.token_hex(16)}"
    key = tmp_path / "keys" / name
    key.parent.mkdir(exist_ok=True)
    key.write_text(secret + "\n")
    key.chmod(mode)
    return key, secret


def _add(s: Saphan, name: str, key: Path, *extra: str,
         base_url: str = "http://127.0.0.1:8080/v1", model: str = "m1") -> Result:
    return s("lane", "add", name, "--base-url", base_url, "--model", model,
             "--credential-file", str(key), *extra)


def _user_error(r: Result, *names: str) -> None:
    """Exit 2, one line on stderr naming each of `names`, nothing on stdout."""
    assert r.code == 2, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.err
    for name in names:
        assert name in lines[0], (name, r.err)
    assert r.out == ""


def _custody_refused(r: Result, key: Path, lane: str = "L", *, fix: str = "") -> None:
    """Exit 3, ``refused [custody-key-unsafe]`` naming the file, and a fix line
    naming the file (with `fix` in it) and the check to run afterwards."""
    assert r.code == 3, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert lines[0].startswith("refused [custody-key-unsafe]: "), r.err
    assert str(key) in lines[0], r.err
    fixes = [line for line in lines if line.startswith("fix: ")]
    assert len(fixes) == 1, r.err
    assert str(key) in fixes[0] and fix in fixes[0], r.err
    assert f"saphan lane check {lane}" in fixes[0], r.err


def _lanes_file(s: Saphan) -> Path:
    return s.home / "lanes.toml"


# -- add / list / check / remove ---------------------------------------------------

def test_add_list_check_remove(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    key, secret = _keyfile(tmp_path)
    other, other_secret = _keyfile(tmp_path, "other.key")
    r = s.ok("lane", "add", "local", "--base-url", "http://127.0.0.1:8080/v1",
             "--model", "qwen2.5-coder", "--credential-file", str(key))
    assert "added lane local" in r.out and "custody ok" in r.out and secret not in r.out
    s.ok("lane", "add", "remote.2", "--base-url", "https://llm.example.test/v1",
         "--model", "big", "--credential-file", str(other), "--credential-env", "LLM_KEY",
         "--timeout", "30")

    listed = s.ok("lane", "list", "--json").json()
    assert listed == [
        {"name": "local", "base_url": "http://127.0.0.1:8080/v1", "model": "qwen2.5-coder",
         "credential_file": str(key), "credential_env": "OPENAI_API_KEY", "timeout": 120},
        {"name": "remote.2", "base_url": "https://llm.example.test/v1", "model": "big",
         "credential_file": str(other), "credential_env": "LLM_KEY", "timeout": 30},
    ]
    human = s.ok("lane", "list")
    assert "local" in human.out and "remote.2" in human.out and str(key) in human.out
    check = s.ok("lane", "check", "--json").json()
    assert check == [{"lane": "local", "credential_file": str(key), "custody": "ok"},
                     {"lane": "remote.2", "credential_file": str(other), "custody": "ok"}]
    one = s.ok("lane", "check", "local")
    assert "lane local" in one.out and "custody ok" in one.out and "remote.2" not in one.out

    # No verb ever prints a key; the lanes file never holds one and is 0600.
    for r in (human, s.ok("lane", "list", "--json"), s.ok("lane", "check"), one):
        for sec in (secret, other_secret):
            assert sec not in r.out and sec not in r.err
    lf = _lanes_file(s)
    assert stat.S_IMODE(lf.stat().st_mode) == 0o600
    raw = lf.read_bytes()
    for sec in (secret, other_secret):
        assert sec.encode() not in raw and sec[8:].encode() not in raw

    # Adding twice names the duplicate, changes nothing.
    before = lf.read_bytes()
    _user_error(_add(s, "local", key), "'local'", "already exists")
    assert lf.read_bytes() == before

    r = s.ok("lane", "remove", "local")
    assert "removed lane local" in r.out and str(key) in r.out
    assert key.read_text() == secret + "\n"  # the key file is not touched
    assert [x["name"] for x in s.ok("lane", "list", "--json").json()] == ["remote.2"]
    assert stat.S_IMODE(lf.stat().st_mode) == 0o600
    s.ok("lane", "remove", "remote.2")
    assert s.ok("lane", "list", "--json").json() == []
    assert "no lanes declared" in s.ok("lane", "check").out


def test_relative_credential_file_is_stored_absolute(saphan_sqlite: Saphan,
                                                     tmp_path: Path) -> None:
    key, _ = _keyfile(tmp_path)
    s = saphan_sqlite
    r = s("lane", "add", "rel", "--base-url", "http://127.0.0.1:1/v1", "--model", "m",
          "--credential-file", "keys/lane.key", cwd=str(tmp_path))
    assert r.code == 0, r.err
    assert s.ok("lane", "list", "--json").json()[0]["credential_file"] == str(key)


def test_relative_credential_file_in_the_lanes_file_is_refused(saphan_sqlite: Saphan) -> None:
    s = saphan_sqlite
    _lanes_file(s).write_text('[lane.x]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\n'
                              'credential_file = "keys/lane.key"\n')
    _lanes_file(s).chmod(0o600)  # custody passes; the content is what is wrong
    _user_error(s("lane", "list"), "'keys/lane.key'", "not an absolute path")


# -- bad inputs: exit 2, one line naming the thing ------------------------------------

@pytest.mark.parametrize(
    ("args", "names"),
    [
        pytest.param(["--base-url", "ftp://x"], ["--base-url", "'ftp://x'"], id="base-url-ftp"),
        pytest.param(["--base-url", "127.0.0.1:8080/v1"], ["--base-url"], id="base-url-no-scheme"),
        pytest.param(["--model=-m"], ["--model", "'-m'"], id="model-dash"),
        pytest.param(["--model", "two words"], ["--model", "'two words'"], id="model-space"),
        pytest.param(["--credential-env", "lower"], ["--credential-env", "'lower'"],
                     id="credential-env-lower"),
        pytest.param(["--timeout", "0"], ["--timeout 0"], id="timeout-0"),
        pytest.param(["--timeout", "3601"], ["--timeout 3601"], id="timeout-too-big"),
    ],
)
def test_bad_lane_inputs(saphan_sqlite: Saphan, tmp_path: Path, args: list[str],
                         names: list[str]) -> None:
    key, _ = _keyfile(tmp_path)
    base = {"--base-url": "http://127.0.0.1:8080/v1", "--model": "m1"}
    for a in args:
        base.pop(a.split("=")[0], None)
    flat = [x for kv in base.items() for x in kv]
    r = saphan_sqlite("lane", "add", "L", *flat, *args, "--credential-file", str(key))
    _user_error(r, *names)
    assert not _lanes_file(saphan_sqlite).exists()


@pytest.mark.parametrize("name", ["-bad", "has space", "a/b", "x" * 64])
def test_bad_lane_name(saphan_sqlite: Saphan, tmp_path: Path, name: str) -> None:
    key, _ = _keyfile(tmp_path)
    r = saphan_sqlite("lane", "add", "--base-url", "http://127.0.0.1:1/v1", "--model", "m",
                      "--credential-file", str(key), "--", name)
    _user_error(r, f"lane name {name!r}", "not allowed")
    assert not _lanes_file(saphan_sqlite).exists()


def test_missing_credential_file(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    missing = tmp_path / "keys" / "nope.key"
    _user_error(_add(saphan_sqlite, "L", missing), str(missing), "does not exist")
    assert not _lanes_file(saphan_sqlite).exists()


def test_credential_file_without_a_token(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    """Custody holds (one byte, 0600) but there is no key in it."""
    key = tmp_path / "blank.key"
    key.write_text("\n")
    key.chmod(0o600)
    _user_error(_add(saphan_sqlite, "L", key), str(key), "token")


def test_remove_unknown_lane(saphan_sqlite: Saphan) -> None:
    _user_error(saphan_sqlite("lane", "remove", "ghost"), "'ghost'", "saphan lane list")
    _user_error(saphan_sqlite("lane", "check", "ghost"), "'ghost'")


# -- custody refusals: exit 3 -------------------------------------------------------

def _unsafe(kind: str, tmp_path: Path) -> Path:
    key, _ = _keyfile(tmp_path)
    if kind == "mode-0644":
        key.chmod(0o644)
        return key
    if kind == "mode-0640":
        key.chmod(0o640)
        return key
    if kind == "hard-link":
        os.link(key, tmp_path / "keys" / "second-name.key")
        return key
    if kind == "symlink":
        link = tmp_path / "keys" / "link.key"
        link.symlink_to(key)
        return link
    if kind == "empty":
        empty = tmp_path / "keys" / "empty.key"
        empty.touch(mode=0o600)
        empty.chmod(0o600)
        return empty
    if kind == "too-long":
        big = tmp_path / "keys" / "big.key"
        big.write_text("k" * 5000)
        big.chmod(0o600)
        return big
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["mode-0644", "mode-0640", "hard-link", "symlink", "empty",
                                  "too-long"])
def test_unsafe_credential_file_is_refused_at_add(saphan_sqlite: Saphan, tmp_path: Path,
                                                  kind: str) -> None:
    key = _unsafe(kind, tmp_path)
    r = _add(saphan_sqlite, "L", key)
    _custody_refused(r, key, fix="chmod 0600" if kind.startswith("mode-") else "")
    assert not _lanes_file(saphan_sqlite).exists()
    assert saphan_sqlite.ok("lane", "list", "--json").json() == []


@pytest.mark.slow
@pytest.mark.usefixtures("bwrap_available")
def test_custody_lost_after_add_refuses_check_and_run(saphan_sqlite: Saphan,
                                                      tmp_path: Path) -> None:
    s = saphan_sqlite
    key, secret = _keyfile(tmp_path)
    wd = tmp_path / "wd"
    wd.mkdir()
    with ChatCompletionsServer([("calls", [("finish", {"summary": "ok"})])]) as srv:
        _add(s, "L", key, base_url=srv.base_url + "/v1")
        s.ok("lane", "check", "L")
        s.ok("machine", "add", "here", "--local")
        s.ok("slot", "add", "here", "lp", "--tool", "loop")
        key.chmod(0o644)
        _custody_refused(s("lane", "check"), key, fix="chmod 0600")
        _custody_refused(s("lane", "check", "L"), key, fix="chmod 0600")
        r = s("run", "--machine", "here", "--slot", "lp", "--workdir", str(wd),
              "--prompt", "task", "--json", timeout=60)
        received = len(srv.requests)
    _custody_refused(r, key, fix="chmod 0600")
    # --json: the refused run's record on stdout (issue 17: a program reads the refusal)
    refused = json.loads(r.out)
    assert refused["refusal"]["class"] == "custody-key-unsafe" and secret not in r.out
    assert "\nrun: " in r.err  # the refusal names the run it was recorded on
    assert secret not in r.err
    assert received == 0
    rec = s.ok("runs", "show", "last", "--json").json()
    assert isinstance(rec, dict)
    assert rec["outcome"] == "refused" and rec["tool"] == "loop"
    assert rec["refusal"]["class"] == "custody-key-unsafe"
    assert str(key) in rec["refusal"]["message"]
    assert rec["enforced_by"] is None
    assert r.err.strip().splitlines()[-1] == f"run: {rec['id']}"
    assert refused["id"] == rec["id"]
    assert secret not in json.dumps(rec)
    key.chmod(0o600)  # custody restored: the check passes again
    s.ok("lane", "check")


# -- run input checks: exit 2, nothing dispatched -------------------------------------

def _runs(s: Saphan) -> list[object]:
    got = s.ok("runs", "list", "--json").json()
    assert isinstance(got, list)
    return got


@pytest.fixture
def loop_ws(saphan_sqlite: Saphan, tmp_path: Path) -> tuple[Saphan, Path]:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "lp", "--tool", "loop")
    s.ok("slot", "add", "here", "cmd", "--tool", "command")
    wd = tmp_path / "wd"
    wd.mkdir()
    return s, wd


def _loop_run(s: Saphan, wd: Path, *extra: str, slot: str = "lp") -> Result:
    return s("run", "--machine", "here", "--slot", slot, "--workdir", str(wd), *extra,
             timeout=60)


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        pytest.param(["--model", "m2"], ["--model", "lane"], id="model-on-loop"),
        pytest.param(["--resume", "last"], ["--resume"], id="resume-on-loop"),
        pytest.param(["--max-turns", "0"], ["--max-turns 0", "below 1"], id="max-turns-0"),
        pytest.param(["--max-seconds", "0"], ["--max-seconds 0", "below 1"], id="max-seconds-0"),
        pytest.param(["--lane", "ghost"], ["'ghost'", "saphan lane list"], id="unknown-lane"),
    ],
)
def test_loop_run_input_checks(loop_ws: tuple[Saphan, Path], tmp_path: Path,
                               extra: list[str], names: list[str]) -> None:
    s, wd = loop_ws
    key, _ = _keyfile(tmp_path)
    with ChatCompletionsServer([]) as srv:
        assert _add(s, "L", key, base_url=srv.base_url + "/v1").code == 0
        r = _loop_run(s, wd, "--prompt", "task", *extra)
        received = len(srv.requests)
    _user_error(r, *names)
    assert received == 0
    assert _runs(s) == []


def test_lane_flags_on_a_command_slot(loop_ws: tuple[Saphan, Path], tmp_path: Path) -> None:
    s, wd = loop_ws
    key, _ = _keyfile(tmp_path)
    assert _add(s, "L", key).code == 0
    for extra in (["--lane", "L"], ["--max-turns", "3"], ["--max-seconds", "3"]):
        r = _loop_run(s, wd, *extra, "--", "true", slot="cmd")
        _user_error(r, "'cmd'", "--lane")
    assert _runs(s) == []


def test_loop_run_without_a_lane(loop_ws: tuple[Saphan, Path]) -> None:
    s, wd = loop_ws
    _user_error(_loop_run(s, wd, "--prompt", "task"), "needs a lane", "saphan lane add")
    assert _runs(s) == []


def test_loop_run_with_two_lanes_and_no_choice(loop_ws: tuple[Saphan, Path],
                                               tmp_path: Path) -> None:
    s, wd = loop_ws
    a, _ = _keyfile(tmp_path, "a.key")
    b, _ = _keyfile(tmp_path, "b.key")
    with ChatCompletionsServer([]) as srv:
        assert _add(s, "A", a, base_url=srv.base_url + "/v1").code == 0
        assert _add(s, "B", b, base_url=srv.base_url + "/v1").code == 0
        r = _loop_run(s, wd, "--prompt", "task")
        received = len(srv.requests)
    _user_error(r, "2 lanes", "A, B", "--lane")
    assert received == 0
    assert _runs(s) == []


def test_loop_run_needs_a_prompt(loop_ws: tuple[Saphan, Path], tmp_path: Path) -> None:
    s, wd = loop_ws
    key, _ = _keyfile(tmp_path)
    assert _add(s, "L", key).code == 0
    _user_error(_loop_run(s, wd, "--lane", "L"), "--prompt")
    _user_error(_loop_run(s, wd, "--prompt", "task", "--", "true"), "--prompt", "not a command")
    assert _runs(s) == []


@pytest.mark.parametrize("value", ["ollama", "x", "sk-short-123456"])
def test_short_key_is_refused_at_add(saphan_sqlite: Saphan, tmp_path: Path, value: str) -> None:
    """A key under 16 characters cannot be scrubbed by value without mangling
    ordinary text, so it is refused (bad input), naming the fix."""
    key = tmp_path / "short.key"
    key.write_text(value + "\n")
    key.chmod(0o600)
    r = saphan_sqlite("lane", "add", "L", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                      "--credential-file", str(key))
    assert r.code == 2, r.err
    assert f"holds a {len(value)}-character key" in r.err and "openssl rand -hex 24" in r.err
    assert not (saphan_sqlite.home / "lanes.toml").exists()


@pytest.mark.parametrize("damage", ["group-writable", "second-name"])
def test_lanes_file_gets_a_credential_custody(saphan_sqlite: Saphan, tmp_path: Path,
                                              damage: str) -> None:
    """The lanes file says where each key is sent: a lanes file others could
    rewrite (or that has a second name) is refused before any lane is used."""
    s = saphan_sqlite
    key = tmp_path / "k.key"
    key.write_text(f"sk-test-{secrets.token_hex(12)}\n")
    key.chmod(0o600)
    s.ok("lane", "add", "L", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
         "--credential-file", str(key))
    lanes_file = s.home / "lanes.toml"
    assert stat.S_IMODE(lanes_file.stat().st_mode) == 0o600
    if damage == "group-writable":
        lanes_file.chmod(0o620)
        said = "has mode 0620"
    else:
        os.link(lanes_file, tmp_path / "lanes-backup.toml")
        said = "has 2 hard links"
    for verb in (["lane", "list"], ["lane", "check"]):
        r = s(*verb)
        assert r.code == 3, (verb, r.err)
        assert f"refused [custody-key-unsafe]: lanes file {lanes_file} {said}" in r.err, r.err
        assert "fix: " in r.err
