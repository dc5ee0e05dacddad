"""config.py: the workspace's config.toml is a closed schema, validated on load;
run.confinement is checked by every run (a refusal), not by load."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from saphan.config import (
    CONFINEMENT_MODES,
    DEFAULT_TEXT,
    SCHEMA,
    Config,
    check,
    confinement_mode,
    effective,
    load,
)
from saphan.errors import UserError
from saphan.refusals import Refusal


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_the_default_file_loads_to_the_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, DEFAULT_TEXT)
    cfg = load(path)
    assert cfg == Config(path=path, confinement="engine", database_url="sqlite",
                         ssh_connect_timeout=10, ssh_command_timeout=120,
                         codex_base_url=None, codex_env_key=None)
    assert confinement_mode(cfg) == "engine"


def test_an_empty_file_means_every_default(tmp_path: Path) -> None:
    cfg = load(_write(tmp_path, ""))
    assert (cfg.confinement, cfg.database_url, cfg.ssh_connect_timeout,
            cfg.ssh_command_timeout) == ("engine", "sqlite", 10, 120)


def test_every_known_key_is_read(tmp_path: Path) -> None:
    cfg = load(_write(tmp_path, """
[run]
confinement = "vendor"
[database]
url = "postgresql://ops@db.example:5432/saphan"
write_retry_seconds = 5
[ssh]
connect_timeout = 3
command_timeout = 45
[codex]
base_url = "http://127.0.0.1:9000/v1"
env_key = "LOCAL_KEY"
[cast]
image_fresh_seconds = 600
[auth]
claude_token_url = "https://gateway.example/v1/oauth/token"
codex_token_url = "http://127.0.0.1:9/oauth/token"
"""))
    assert cfg.confinement == "vendor"
    assert cfg.database_url == "postgresql://ops@db.example:5432/saphan"
    assert cfg.write_retry_seconds == 5
    assert (cfg.ssh_connect_timeout, cfg.ssh_command_timeout) == (3, 45)
    assert (cfg.codex_base_url, cfg.codex_env_key) == ("http://127.0.0.1:9000/v1", "LOCAL_KEY")
    assert cfg.image_fresh_seconds == 600
    assert cfg.claude_token_url == "https://gateway.example/v1/oauth/token"
    assert cfg.codex_token_url == "http://127.0.0.1:9/oauth/token"
    # Every key in the schema was exercised above: a new key needs a line here.
    assert {(s, k) for s, keys in SCHEMA.items() for k in keys} == {
        ("run", "confinement"), ("database", "url"), ("database", "write_retry_seconds"),
        ("ssh", "connect_timeout"),
        ("ssh", "command_timeout"), ("codex", "base_url"), ("codex", "env_key"),
        ("cast", "image_fresh_seconds"), ("auth", "claude_token_url"),
        ("auth", "codex_token_url")}


def test_a_token_url_in_the_clear_off_this_machine_is_refused(tmp_path: Path) -> None:
    """A refresh token never crosses the network in the clear."""
    with pytest.raises(UserError, match=r"auth\.codex_token_url"):
        load(_write(tmp_path, '[auth]\ncodex_token_url = "http://auth.example/oauth/token"\n'))


@pytest.mark.parametrize(("text", "needle"), [
    ("[run2]\nx = 1\n", "unknown section [run2]; known sections: run, database, ssh, codex"),
    ("[run]\nconfinment = \"engine\"\n", "unknown key run.confinment; known keys in [run]: "
                                         "confinement"),
    ("run = 3\n", "`run` must be a table"),
    ("[ssh]\nconnect_timeout = \"10\"\n",
     'ssh.connect_timeout must be a TOML integer, got "10" (a TOML string); fix: write '
     "connect_timeout = <integer> under [ssh]"),
    ("[ssh]\ncommand_timeout = true\n",
     "ssh.command_timeout must be a TOML integer, got true (a TOML boolean)"),
    ("[codex]\nenv_key = 5\n", "codex.env_key must be a TOML string, got 5 (a TOML integer)"),
    ("[database]\nurl = \"mysql://x\"\n", "database.url 'mysql://***' is neither"),
    ("[database]\nurl = \"sqlite:relative.db\"\n", "is neither \"sqlite\""),
    ("[ssh]\nconnect_timeout = 0\n", "ssh.connect_timeout is 0; give a number of seconds >= 1"),
    ("[database]\nwrite_retry_seconds = 3601\n",
     "database.write_retry_seconds is 3601; give 0..3600 seconds"),
    ("[database]\nwrite_retry_seconds = -1\n",
     "database.write_retry_seconds is -1; give 0..3600 seconds"),
    ("[ssh]\ncommand_timeout = -5\n", "ssh.command_timeout is -5"),
    ("[run\n", "is not valid TOML"),
])
def test_bad_files_are_refused_by_name(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load(path)
    message = str(info.value)
    assert needle in message, message
    assert str(path) in message
    assert "\n" not in message  # one line: the CLI prints it as is


@pytest.mark.parametrize("url", ["sqlite", "sqlite:////var/lib/saphan.db",
                                 "postgresql://u@h/d", "postgres://u@h:1/d"])
def test_accepted_database_urls(tmp_path: Path, url: str) -> None:
    assert load(_write(tmp_path, f'[database]\nurl = "{url}"\n')).database_url == url


def test_a_missing_file_names_saphan_init(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"no config at .*; run `saphan init` first"):
        load(tmp_path / "absent.toml")


def test_a_bad_confinement_loads_and_refuses_at_the_run(tmp_path: Path) -> None:
    """Not a load error: every run must be refused (and recorded) instead."""
    path = _write(tmp_path, '[run]\nconfinement = "engnie"\n')
    cfg = load(path)
    assert cfg.confinement == "engnie"
    with pytest.raises(Refusal) as info:
        confinement_mode(cfg)
    r = info.value
    assert r.cls == "confinement-setting-invalid"
    assert "'engnie'" in r.message and str(path) in r.message
    assert 'exactly "engine" or "vendor"' in r.message
    assert f"edit {path}" in r.remediation


@pytest.mark.parametrize(("value", "shown"), [
    ("1", "1 (a TOML integer, not a string)"),
    ("true", "true (a TOML boolean, not a string)"),
    ("1.5", "1.5 (a TOML float, not a string)"),
    ('["engine"]', '["engine"] (a TOML array, not a string)'),
    ('{ mode = "engine" }', '{"mode": "engine"} (a TOML table, not a string)'),
    ("1979-05-27", "1979-05-27 (a TOML date, not a string)"),
])
def test_a_confinement_that_is_not_a_string_refuses_at_the_run(tmp_path: Path, value: str,
                                                               shown: str) -> None:
    """Not a load error either (it was: `run.confinement must be a str`, and no
    run was recorded): the same refusal as any other bad value."""
    path = _write(tmp_path, f"[run]\nconfinement = {value}\n")
    cfg = load(path)
    with pytest.raises(Refusal) as info:
        confinement_mode(cfg)
    r = info.value
    assert r.cls == "confinement-setting-invalid"
    assert f"run.confinement is {shown} in {path}" in r.message, r.message
    assert 'exactly "engine" or "vendor"' in r.message and "\n" not in r.message


@pytest.mark.parametrize("mode", CONFINEMENT_MODES)
def test_each_accepted_mode_passes(tmp_path: Path, mode: str) -> None:
    assert confinement_mode(load(_write(tmp_path, f'[run]\nconfinement = "{mode}"\n'))) == mode
    assert set(CONFINEMENT_MODES) == {"engine", "vendor"}


def test_given_names_what_the_file_sets(tmp_path: Path) -> None:
    assert load(_write(tmp_path, DEFAULT_TEXT)).given == {"run.confinement", "database.url"}
    assert load(_write(tmp_path, "[ssh]\ncommand_timeout = 5\n")).given == {
        "ssh.command_timeout"}
    assert load(_write(tmp_path, "")).given == frozenset()


def test_check_turns_the_confinement_refusal_into_a_bad_input(tmp_path: Path) -> None:
    assert check(load(_write(tmp_path, DEFAULT_TEXT))) == "engine"
    path = _write(tmp_path, "[run]\nconfinement = 1\n")
    with pytest.raises(UserError) as info:
        check(load(path))
    message = str(info.value)
    assert message.startswith(f"run.confinement is 1 (a TOML integer, not a string) in {path}")
    assert f'; fix: edit {path}: set confinement = "engine" under [run]' in message
    assert "\n" not in message


def test_effective_masks_passwords_and_names_each_source(tmp_path: Path) -> None:
    path = _write(tmp_path, '[database]\nurl = "postgresql://u:pw@h/d?password=pw2"\n'
                            '[codex]\nbase_url = "http://127.0.0.1:9/v1"\n')
    # load refuses credentials in codex.base_url; effective masks them anyway
    cfg = replace(load(path), codex_base_url="http://k:secret@127.0.0.1:9/v1")
    got = effective(cfg, workspace=tmp_path, key_path=tmp_path / "record.key",
                    sqlite_path=tmp_path / "saphan.db")
    assert ":pw@" not in str(got) and "pw2" not in str(got) and "secret" not in str(got)
    # libpq reads one password (the query's wins): shown once, masked
    assert got["store"] == "postgresql://u:***@h/d"
    rows = {r["key"]: r for r in got["settings"]}
    assert rows["database.url"] == {"key": "database.url", "source": "file",
                                    "value": "postgresql://u:***@h/d"}
    assert rows["codex.base_url"]["value"] == "http://k:***@127.0.0.1:9/v1"
    assert rows["ssh.connect_timeout"] == {"key": "ssh.connect_timeout", "source": "default",
                                           "value": 10}
    # Every key of the schema is shown, once.
    assert [r["key"] for r in got["settings"]] == [f"{s}.{k}" for s, keys in SCHEMA.items()
                                                   for k in keys]
    sqlite = effective(load(_write(tmp_path, '[database]\nurl = "sqlite:////var/x.db"\n')),
                       workspace=tmp_path, key_path=tmp_path / "k",
                       sqlite_path=tmp_path / "saphan.db")
    assert sqlite["store"] == "sqlite:////var/x.db"


@pytest.mark.parametrize("url", [
    "postgresql://:s3cretA@h/d",                      # no user name
    "postgresql://u@h/d?%70assword=s3cretA",          # a percent-encoded key
    "postgresql://u@h/d?sslpassword=s3cretA",         # the client key's passphrase
    "postgresql://u:s3cretA%zz@h/d",                  # what libpq cannot parse
])
def test_effective_shows_no_password_libpq_would_read(tmp_path: Path, url: str) -> None:
    path = _write(tmp_path, f'[database]\nurl = "{url}"\n')
    got = effective(load(path), workspace=tmp_path, key_path=tmp_path / "record.key",
                    sqlite_path=tmp_path / "saphan.db")
    assert "s3cretA" not in str(got), got
    rows = {r["key"]: r["value"] for r in got["settings"]}
    assert rows["database.url"] == got["store"] and "***" in got["store"]


@pytest.mark.parametrize("url", ["host=db password=s3cretA dbname=saphan",
                                 "mysql://u:s3cretA@db/saphan"])
def test_a_refused_database_url_is_not_echoed_whole(tmp_path: Path, url: str) -> None:
    path = _write(tmp_path, f'[database]\nurl = "{url}"\n')
    with pytest.raises(UserError) as info:
        load(path)
    message = str(info.value)
    assert "is neither" in message and "s3cretA" not in message, message
    assert "***" in message


def test_effective_masks_a_token_in_the_codex_endpoint(tmp_path: Path) -> None:
    """codex.base_url is no store URL (libpq would not parse it): its own
    masking keeps the endpoint readable, its userinfo password and query
    values hidden."""
    cfg = replace(load(_write(tmp_path, "")),
                  codex_base_url="http://k:s3cretA@127.0.0.1:9/v1?key=s3cretB")
    got = effective(cfg, workspace=tmp_path, key_path=tmp_path / "record.key",
                    sqlite_path=tmp_path / "saphan.db")
    rows = {r["key"]: r["value"] for r in got["settings"]}
    assert rows["codex.base_url"] == "http://k:***@127.0.0.1:9/v1?key=***"


@pytest.mark.parametrize(("url", "needle"), [
    ("http://user:secretpw@evil.example/v1?q=1", "is not an http(s) URL"),
    ("http://user:secretpw@127.0.0.1:9/v1", "carries credentials in the URL"),
    ("http://evil.example/v1", "plain http to evil.example"),
    ("ftp://h/v1", "is not an http(s) URL"),
])
def test_the_codex_endpoint_is_checked_on_load_its_password_masked(
    tmp_path: Path, url: str, needle: str,
) -> None:
    """codex.base_url goes through the slots' endpoint check when the file is
    read (`config check` and every run): before, a URL with a password (which
    then reached the record) or a query passed."""
    path = _write(tmp_path, f'[codex]\nbase_url = "{url}"\n')
    with pytest.raises(UserError) as info:
        load(path)
    message = str(info.value)
    assert needle in message and f"{path}: codex.base_url" in message, message
    assert "secretpw" not in message and "--endpoint" not in message, message
    assert load(_write(tmp_path, '[codex]\nbase_url = "https://api.example/v1"\n'))
