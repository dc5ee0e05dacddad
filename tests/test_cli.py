"""cli.py: the `saphan` command line, through the real console script.

What the CLI itself decides: which verbs exist, the exit codes (0 done; 1 a
failed command or an environment error; 2 bad input, one line, nothing
written; 3 a refusal, two lines and the run id when one was recorded), the
--json shapes (sorted keys, indent 2) and the text tables. The verbs' own
behaviour has its modules' tests (test_cli_machines.py, test_cli_workspace.py,
test_record_signature.py, ...).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import Result, Saphan

VERBS = {
    "": ["batch", "config", "db", "doctor", "egress", "init", "lane", "launcher", "machine", "measure-base",
         "policy", "run",
         "runs", "serve", "slot", "worktrees"],
    "batch": ["list", "resume", "run", "show", "work"],
    "config": ["check", "show"],
    "machine": ["add", "deliver", "list", "probe-confinement", "probe-container", "remove", "set",
                "show"],
    "slot": ["add", "list", "remove", "set", "show"],
    "runs": ["cancel", "finalize", "list", "logs", "show"],
    "lane": ["add", "check", "list", "remove"],
    "db": ["migrate"],
    "policy": ["check"],
    "egress": ["check"],
    "launcher": ["path"],
    "worktrees": ["prune"],
}


def _commands(help_text: str) -> list[str]:
    """The names in the Commands: section of click's help."""
    section = help_text.split("\nCommands:\n", 1)[1]
    return [m.group(1) for m in re.finditer(r"^  (\S+)", section, re.M)]


def _canonical(r: Result) -> Any:
    """The --json output, checked to be exactly what the CLI promises."""
    value = json.loads(r.out)
    assert r.out == json.dumps(value, indent=2, sort_keys=True) + "\n"
    return value


def _pc(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "class.json"
    path.write_text(json.dumps(data))
    return path


# -- verbs and help -----------------------------------------------------------------

def test_help_lists_every_verb(home: Path) -> None:
    s = Saphan(home)
    for group, verbs in VERBS.items():
        args = [group] if group else []
        for flag in ("--help", "-h"):
            r = s.ok(*args, flag)
            assert r.out.startswith(f"Usage: saphan {group}".rstrip() + " "), r.out
            assert _commands(r.out) == verbs, (group, r.out)
    top = s.ok("--help").out
    assert "saphan init" in top and "saphan runs show last" in top  # the quick start
    assert "(exit 3)" in top.replace("\n  ", " ")
    assert not home.exists()  # help needs no workspace and makes none


def test_run_help_names_its_exit_status(home: Path) -> None:
    out = Saphan(home).ok("run", "--help").out
    assert "0 when the command exited 0, 1 when it failed, 3 when refused" in " ".join(out.split())
    for option in ("--machine", "--slot", "--workdir", "--repo", "--boundary", "--json",
                   "--prompt", "--prompt-file", "--model", "--permission-class", "--resume",
                   "--lane", "--max-turns", "--max-seconds"):
        assert option in out


# -- exit codes -----------------------------------------------------------------------

@pytest.mark.parametrize(("args", "needle"), [
    (["frobnicate"], "No such command"),
    (["--no-such-flag"], "No such option"),
    (["run", "--slot", "s"], "--slot needs --machine"),
    (["run", "--", "true"], "or --tool T to cast the run"),
    (["run", "--slot", "s", "--machine", "m", "--tool", "command"], "not both"),
    (["slot", "add", "m", "s", "--tool", "bogus"], "'bogus' is not one of"),
    (["slot", "add", "m", "s", "--tool", "command", "--max-sessions", "many"],
     "'many' is not a valid integer"),
    (["runs", "show"], "Missing argument 'ID'"),
])
def test_usage_errors_exit_2_before_the_workspace_is_touched(home: Path, args: list[str],
                                                             needle: str) -> None:
    r = Saphan(home)(*args)
    assert r.code == 2, (args, r.out, r.err)
    assert needle in r.err, r.err
    assert "Usage: saphan" in r.err and r.out == ""
    assert not home.exists()


def test_bad_input_is_one_line_exit_2(saphan_sqlite: Saphan) -> None:
    s = saphan_sqlite
    cases = [
        (["runs", "show", "last"], "error: there are no runs yet"),
        (["runs", "show", "01NOSUCHRUN"], "error: no run '01NOSUCHRUN'; see `saphan runs list`"),
        (["runs", "finalize", "01NOSUCHRUN"], "error: no run '01NOSUCHRUN'"),
        (["slot", "show", "ghost", "s1"], "error: no machine named 'ghost'"),
    ]
    for args, line in cases:
        r = s(*args)
        assert r.code == 2, (args, r.err)
        assert r.err.splitlines() == [line] or r.err.startswith(line), (args, r.err)
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_slot_set_validates_everything_before_looking_anything_up(
        saphan_sqlite: Saphan) -> None:
    """The slot does not exist: each message is about the flags, so no flag
    was acted on before all of them were checked."""
    s = saphan_sqlite
    for args, needle in [
        ([], "nothing to change: give --max-sessions N, --pin-sha256 HEX, --unpin, a run default"),
        (["--pin-sha256", "a" * 64, "--unpin"], "give --pin-sha256 HEX or --unpin, not both"),
        (["--pin-sha256", "XYZ"], "--pin-sha256 'XYZ' is not a SHA-256 digest"),
        (["--max-sessions", "0"], "--max-sessions 0 is below 1"),
        (["--max-sessions", "2", "--pin-sha256", "A" * 64], "is not a SHA-256 digest"),
    ]:
        r = s("slot", "set", "ghost", "s9", *args)
        assert r.code == 2, (args, r.err)
        assert r.err.strip() == f"error: {needle}" or needle in r.err, (args, r.err)
    r = s("slot", "set", "ghost", "s9", "--max-sessions", "2")
    assert r.code == 2 and "no machine named 'ghost'" in r.err


def test_a_refusal_is_two_lines_exit_3(home: Path, tmp_path: Path) -> None:
    """No workspace needed: `policy check` refuses a malformed class by name."""
    path = _pc(tmp_path, {"schema": 1, "commands": ["git status"]})
    r = Saphan(home)("policy", "check", str(path))
    assert r.code == 3
    lines = r.err.splitlines()
    assert len(lines) == 2, r.err
    assert lines[0].startswith(f"refused [policy-invalid]: permission class {path}: ")
    assert lines[1].startswith("fix: ") and f"saphan policy check {path}" in lines[1]
    assert r.out == ""


def test_a_recorded_refusal_names_its_run(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    cfg = s.home / "config.toml"
    cfg.write_text(cfg.read_text().replace('"engine"', '"bogus"'))
    r = s("run", "--machine", "m", "--slot", "s", "--workdir", str(tmp_path), "--", "true")
    assert r.code == 3
    lines = r.err.splitlines()
    assert [x.split(" ", 1)[0] for x in lines] == ["refused", "fix:", "run:"], r.err
    run_id = lines[2].removeprefix("run: ")
    shown = _canonical(s("runs", "show", run_id, "--json"))
    assert shown["id"] == run_id and shown["outcome"] == "refused"
    assert shown["refusal"]["class"] == "confinement-setting-invalid"


def test_an_unreachable_store_is_exit_1(saphan_sqlite: Saphan) -> None:
    cfg = saphan_sqlite.home / "config.toml"
    cfg.write_text('[database]\nurl = "postgresql://nobody@127.0.0.1:1/none"\n')
    r = saphan_sqlite("machine", "list")
    assert r.code == 1
    assert r.err.startswith("error: store: ") and "127.0.0.1" in r.err
    assert "Traceback" not in r.err


def test_launcher_path_and_a_missing_launcher(home: Path, tmp_path: Path) -> None:
    s = Saphan(home)
    r = s("launcher", "path")
    if r.code == 0:
        assert Path(r.out.strip()).is_file()
        assert r.out.strip().endswith("saphan-launcher")
    gone = s.env(SAPHAN_LAUNCHER=str(tmp_path / "gone"))
    r = s("launcher", "path", env=gone)
    assert r.code == 1
    assert r.err.strip() == ("Error: saphan-launcher not found; run ci/setup (it builds and "
                             "packages it) or set SAPHAN_LAUNCHER")
    r = s("--version", env=gone)
    assert r.code == 0
    assert r.out.splitlines()[1] == ("saphan-launcher: not found (run ci/setup, or set "
                                     "SAPHAN_LAUNCHER)")


def test_home_option_overrides_saphan_home(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-ws"
    s = Saphan(home)
    r = s.ok("--home", str(other), "init")
    assert f"created {other / 'config.toml'}" in r.out
    assert f"workspace ready at {other} (store: " in r.out
    assert (other / "record.key").exists() and not home.exists()
    assert s("--home", str(other), "machine", "list").code == 0
    assert s("machine", "list").code == 2  # $SAPHAN_HOME still has none


# -- --json shapes and tables ----------------------------------------------------------------

def test_json_shapes(saphan: Saphan, tmp_path: Path) -> None:
    """On both stores: the same keys and types, sorted, indented."""
    s = saphan
    for args in (["machine", "list"], ["slot", "list"], ["runs", "list"], ["lane", "list"],
                 ["lane", "check"]):
        assert _canonical(s.ok(*args, "--json")) == [], args
    s.ok("machine", "add", "m1", "--local")
    s.ok("slot", "add", "m1", "s1", "--tool", "command", "--max-sessions", "2",
         "--pin-sha256", "b" * 64)
    machine_keys = {"name", "transport", "address", "identity_file", "host_key", "created_at",
                    "ssh_agent", "proxy_jump", "labels"}
    [m] = _canonical(s.ok("machine", "list", "--json"))
    assert set(m) == machine_keys
    assert (m["name"], m["transport"], m["address"], m["identity_file"], m["host_key"]) == (
        "m1", "local", "local", None, None)
    assert re.match(r"^\d{4}-\d\d-\d\dT[\d:.]+Z$", m["created_at"])
    shown = _canonical(s.ok("machine", "show", "m1", "--json"))
    assert set(shown) == machine_keys | {"slots", "facts", "agents"}
    assert shown["facts"] == {}
    slot_keys = {"machine", "slot", "tool", "max_sessions", "agent_sha256", "created_at",
                 "endpoint", "model", "max_seconds", "max_turns", "agent_path", "labels"}
    [slot] = _canonical(s.ok("slot", "list", "--json"))
    assert shown["slots"] == [slot]
    assert set(slot) == slot_keys
    assert (slot["machine"], slot["slot"], slot["tool"], slot["max_sessions"],
            slot["agent_sha256"]) == ("m1", "s1", "command", 2, "b" * 64)
    assert _canonical(s.ok("slot", "list", "m1", "--json")) == [slot]
    r = s("slot", "list", "nosuch", "--json")
    assert r.code == 2 and r.out == "" and "no machine named 'nosuch'" in r.err
    one = _canonical(s.ok("slot", "show", "m1", "s1", "--json"))
    assert one == {**slot, "capacity": 2, "holders": []}


def test_policy_check_json_is_the_class_as_recorded(home: Path, tmp_path: Path) -> None:
    path = _pc(tmp_path, {"schema": 2, "name": "plan", "allowed_commands": ["git", "git"],
                          "network": "open", "credentials": ["GH_TOKEN"]})
    got = _canonical(Saphan(home).ok("policy", "check", str(path), "--json"))
    assert got == {"source": str(path), "schema": 2, "name": "plan", "commands": ["git"],
                   "write_scope": [], "network": "open", "credentials": ["GH_TOKEN"],
                   "permission_mode": None, "writable_protected": [], "egress_policy": None}
    text = Saphan(home).ok("policy", "check", str(path)).out.splitlines()
    assert text[0] == f"permission class plan: schema 2 ({path})"
    assert "commands (exact base name): git" in text


def test_tables(saphan_sqlite: Saphan) -> None:
    s = saphan_sqlite
    assert s.ok("machine", "list").out == "NAME  TRANSPORT  ADDRESS  ADDED  LABELS\n"
    assert s.ok("runs", "list").out.split() == [
        "ID", "MACHINE", "SLOT", "ORD", "STARTED", "OUTCOME", "EXIT/CLASS", "ENFORCED", "SIG"]
    assert s.ok("lane", "check").out == "no lanes declared; add one with `saphan lane add`\n"
    s.ok("machine", "add", "m1", "--local")
    s.ok("slot", "add", "m1", "s1", "--tool", "command")
    lines = s.ok("machine", "list").out.splitlines()
    assert lines[0].split() == ["NAME", "TRANSPORT", "ADDRESS", "ADDED", "LABELS"]
    assert lines[1].split()[:3] == ["m1", "local", "local"]
    # Columns line up: each header starts where its values start.
    assert lines[0].index("ADDRESS") == lines[1].index("local", lines[1].index("local") + 1)
    slots = s.ok("slot", "list").out.splitlines()
    assert slots[0].split() == ["MACHINE", "SLOT", "TOOL", "MAX_SESSIONS", "AGENT_PIN",
                                "LABELS"]
    assert slots[1].split() == ["m1", "s1", "command", "1", "-", "-"]
    shown = s.ok("machine", "show", "m1").out.splitlines()
    assert shown[:2] == ["name: m1", "transport: local"]
    assert "slots:" in shown and "labels: -" in shown
    assert "  s1  tool=command  max_sessions=1 (default)  labels=-" in shown
    assert shown[-1] == "facts: none measured"
    slot = s.ok("slot", "show", "m1", "s1").out.splitlines()
    assert slot[:4] == ["slot s1 on m1: tool command, capacity 1, 0 live", "agent pin: none",
                        "run defaults: none", "labels: -"]
    assert slot[4].split() == ["ORDINAL", "RUN", "PID", "HOST", "SINCE", "LIVENESS"]


def test_slot_run_defaults_through_the_cli(saphan_sqlite: Saphan) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "m1", "--local")
    out = s.ok("slot", "add", "m1", "cl", "--tool", "claude", "--endpoint",
               "http://127.0.0.1:9/anthropic", "--max-seconds", "600").out
    assert "run defaults endpoint=http://127.0.0.1:9/anthropic, max_seconds=600" in out
    out = s.ok("slot", "set", "m1", "cl", "--model", "claude-x", "--unset", "max-seconds").out
    assert out.strip() == ("slot cl on m1 run defaults: endpoint=http://127.0.0.1:9/anthropic, "
                           "model=claude-x")
    assert "run defaults: endpoint=http://127.0.0.1:9/anthropic, model=claude-x" in s.ok(
        "slot", "show", "m1", "cl").out
    # bad input: exit 2, the fix named, nothing written
    for args, needle in ((["--max-turns", "0"], "--max-turns 0 is out of range; give 1..10000"),
                         (["--endpoint", "https://u:p@h/"], "carries credentials"),
                         (["--model", "y", "--unset", "model"], "not both")):
        r = s("slot", "set", "m1", "cl", *args)
        assert r.code == 2 and needle in r.err, (args, r.err)
    assert _canonical(s.ok("slot", "show", "m1", "cl", "--json"))["model"] == "claude-x"
    r = s("slot", "add", "m1", "cx", "--tool", "codex", "--max-turns", "3")
    assert r.code == 2 and "--max-turns applies to claude, loop slots" in r.err
    r = s("run", "--machine", "m1", "--slot", "cl", "--prompt", "x", "--max-seconds", "0")
    assert r.code == 2 and r.err == "error: --max-seconds 0 is below 1\n"
    r = s("run", "--machine", "m1", "--slot", "cl", "--prompt", "x", "--max-turns", "10001")
    assert r.code == 2 and r.err == "error: --max-turns 10001 is out of range; give 1..10000\n"


# -- runs: text and --json ---------------------------------------------------------------------

@pytest.mark.usefixtures("bwrap_available")
def test_run_reports_on_stderr_and_json_on_stdout(saphan_sqlite: Saphan, tmp_path: Path) -> None:
    s = saphan_sqlite
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command")
    wd = tmp_path / "wd"
    wd.mkdir()
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--",
          "sh", "-c", "echo streamed; exit 3")
    assert r.code == 1  # the command failed
    assert r.out == "streamed\n"  # the run's output streams to stdout
    last = r.err.splitlines()[-1]
    m = re.match(r"^run (\w{26}) failed \(exit 3\); enforced by bubblewrap (\S+); "
                 r"record: saphan runs show (\w{26})$", last)
    assert m is not None, last
    assert m.group(1) == m.group(3)
    failed = m.group(1)
    r = s("run", "--machine", "here", "--slot", "s1", "--workdir", str(wd), "--json", "--",
          "sh", "-c", "echo quiet")
    assert r.code == 0
    record = json.loads(r.out)  # nothing but the record on stdout
    assert record["outcome"] == "exited" and record["exit_code"] == 0
    assert record["argv"][0].endswith("/sh") and record["argv"][1:] == ["-c", "echo quiet"]
    assert record["signature"]["status"] == "valid"
    assert (Path(s.home / "runs" / record["id"] / "stdout.log").read_text() == "quiet\n")
    listed = _canonical(s.ok("runs", "list", "--json"))
    assert [x["id"] for x in listed] == [record["id"], failed]  # newest first
    assert [x["id"] for x in _canonical(s.ok("runs", "list", "--limit", "1", "--json"))] == [
        record["id"]]
    rows = s.ok("runs", "list").out.splitlines()
    assert rows[1].split()[0] == record["id"] and rows[1].split()[-1] == "valid"
    assert rows[2].split()[5:7] == ["failed", "3"]
    shown = s.ok("runs", "show", failed[:12]).out.splitlines()
    assert f"run:         {failed}" in shown
    assert "outcome:     failed  exit: 3" in shown
    argv = json.dumps(s.ok("runs", "show", failed, "--json").json()["argv"])
    assert f"tool:        command  argv: {argv}" in shown
    assert shown[-1].startswith("signature:   valid ")
    assert s.ok("runs", "show", "last", "--json").json()["id"] == record["id"]


# -- config show | check ------------------------------------------------------------------------

def test_config_show_masks_a_postgresql_password(saphan_sqlite: Saphan) -> None:
    s = saphan_sqlite
    cfg = s.home / "config.toml"
    cfg.write_text('[database]\nurl = "postgresql://ops:hunter2@db.example:5432/fleet"\n'
                   "[ssh]\nconnect_timeout = 3\n")
    shown = _canonical(s.ok("config", "show", "--json"))
    assert "hunter2" not in json.dumps(shown)
    assert shown["store"] == "postgresql://ops:***@db.example:5432/fleet"
    assert (shown["workspace"], shown["config_file"], shown["record_key"]) == (
        str(s.home), str(cfg), str(s.home / "record.key"))
    settings = {row["key"]: (row["value"], row["source"]) for row in shown["settings"]}
    assert all(set(row) == {"key", "value", "source"} for row in shown["settings"])
    assert settings == {
        "run.confinement": ("engine", "default"),
        "database.url": ("postgresql://ops:***@db.example:5432/fleet", "file"),
        "database.write_retry_seconds": (30, "default"),
        "ssh.connect_timeout": (3, "file"),
        "ssh.command_timeout": (120, "default"),
        "codex.base_url": (None, "default"),
        "codex.env_key": (None, "default"),
        "cast.image_fresh_seconds": (86400, "default"),
        "auth.claude_token_url": (None, "default"),
        "auth.codex_token_url": (None, "default"),
    }
    text = s.ok("config", "show").out
    assert "hunter2" not in text
    lines = text.splitlines()
    assert lines[:4] == [f"workspace {s.home}", f"config_file {cfg}",
                         f"record_key {s.home / 'record.key'}",
                         "store postgresql://ops:***@db.example:5432/fleet"]
    assert 'database.url "postgresql://ops:***@db.example:5432/fleet" (file)' in lines
    assert "codex.base_url - (default)" in lines and "None" not in text
    # The default workspace: the SQLite file it opens.
    cfg.write_text('[database]\nurl = "sqlite"\n')
    assert _canonical(s.ok("config", "show", "--json"))["store"] == \
        f"sqlite:///{s.home / 'saphan.db'}"


@pytest.mark.parametrize(("text", "needle", "fix"), [
    ('[run]\nconfinment = "engine"\n', "unknown key run.confinment",
     "fix: rename or remove confinment under [run]"),
    ('[run]\nconfinement = "engnie"\n', "run.confinement is 'engnie'",
     'set confinement = "engine" under [run]'),
    ("[ssh]\ncommand_timeout = true\n", "ssh.command_timeout must be a TOML integer",
     "fix: write command_timeout = <integer> under [ssh]"),
    ('[database]\nurl = "mysql://x"\n', "database.url 'mysql://***' is neither",
     'fix: set url = "sqlite"'),
])
def test_config_check_exits_2_naming_the_key_and_the_fix(saphan_sqlite: Saphan, text: str,
                                                          needle: str, fix: str) -> None:
    cfg = saphan_sqlite.home / "config.toml"
    assert saphan_sqlite.ok("config", "check").out == (
        f"{cfg}: valid (confinement engine; 2 setting(s) from the file, the rest defaults)\n")
    cfg.write_text(text)
    r = saphan_sqlite("config", "check")
    assert r.code == 2 and r.out == "", r.err
    assert len(r.err.splitlines()) == 1 and r.err.startswith("error: "), r.err
    assert needle in r.err and fix in r.err and str(cfg) in r.err, r.err


def test_config_verbs_without_a_workspace_name_init(home: Path) -> None:
    for verb in ("show", "check"):
        r = Saphan(home)("config", verb)
        assert r.code == 2 and "saphan init" in r.err, r.err
    assert not home.exists()


# -- shell completion (click's, through the installed entry point) --------------------------------

def _complete(home: Path, shell: str, words: str) -> list[str]:
    import subprocess

    from conftest import saphan_exe

    env = Saphan(home).env(_SAPHAN_COMPLETE=f"{shell}_complete", COMP_WORDS=words,
                           COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)))
    p = subprocess.run([saphan_exe()], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_shell_completion_through_the_installed_entry_point(home: Path) -> None:
    import subprocess

    from conftest import saphan_exe

    for shell, marker in (("bash", "complete -o nosort -F _saphan_completion saphan"),
                          ("zsh", "compdef _saphan_completion saphan"),
                          ("fish", "complete --no-files --command saphan")):
        p = subprocess.run([saphan_exe()], env=Saphan(home).env(
            _SAPHAN_COMPLETE=f"{shell}_source"), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and marker in p.stdout, (shell, p.stdout, p.stderr)
    assert _complete(home, "bash", "saphan doc") == ["plain,doctor"]
    assert _complete(home, "bash", "saphan config ") == ["plain,check", "plain,show"]
    assert _complete(home, "bash", "saphan runs ") == [
        f"plain,{v}" for v in VERBS["runs"]]
    assert not home.exists()  # completing touches no workspace
