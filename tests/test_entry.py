"""entry.py: the console script's entry point. The custody check runs first,
before click parses a flag; then the CLI runs and its exit status is the
process's. `python -m saphan` comes through here too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import saphan
from conftest import Saphan, saphan_exe

SCRIPT = "#!{python}\nimport sys\nfrom saphan.entry import main\nsys.exit(main())\n"


def _script(tmp_path: Path, mode: int) -> Path:
    script = tmp_path / "saphan-entry"
    script.write_text(SCRIPT.format(python=sys.executable))
    script.chmod(mode)
    return script


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SAPHAN_HOME"] = str(tmp_path / "absent-home")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env(tmp_path),
                          stdin=subprocess.DEVNULL, check=False)


def test_importing_the_entry_point_loads_nothing_else() -> None:
    code = ("import sys, saphan.entry; print(' '.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('saphan', 'click'))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=True)
    assert p.stdout.split() == ["saphan", "saphan.entry"]


def test_a_script_in_custody_reaches_the_cli_with_its_exit_codes(tmp_path: Path) -> None:
    script = str(_script(tmp_path, 0o755))
    p = _run([script, "--version"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == f"saphan {saphan.__version__}"
    p = _run([script, "--no-such-flag"], tmp_path)
    assert p.returncode == 2 and "No such option" in p.stderr and "--no-such-flag" in p.stderr
    p = _run([script, "machine", "list"], tmp_path)
    assert p.returncode == 2 and "no saphan workspace" in p.stderr
    assert not (tmp_path / "absent-home").exists()


def test_custody_is_checked_before_any_flag_is_parsed(tmp_path: Path) -> None:
    script = str(_script(tmp_path, 0o775))  # group-writable: replaceable by the group
    for argv in (["--help"], ["--no-such-flag"], ["--version"], []):
        p = _run([script, *argv], tmp_path)
        assert p.returncode == 3, (argv, p.stdout, p.stderr)
        assert p.stdout == "", argv  # click never ran: no help, no usage, no version
        lines = p.stderr.splitlines()
        assert lines[0].startswith("refused [custody-binary-unsafe]: saphan's console script: ")
        assert f"{script} has mode 0775, so its group can write it" in lines[0]
        assert lines[1].startswith("fix: ")


def test_python_dash_m_saphan_is_the_same_entry(tmp_path: Path) -> None:
    by_module = _run([sys.executable, "-m", "saphan", "--version"], tmp_path)
    by_script = _run([saphan_exe(), "--version"], tmp_path)
    assert by_module.returncode == by_script.returncode == 0, by_module.stderr
    assert by_module.stdout == by_script.stdout


def test_the_console_script_exit_status_is_the_clis(home: Path) -> None:
    s = Saphan(home)
    assert s("runs", "list").code == 2  # no workspace: bad input
    s.ok("init")
    assert s("runs", "show", "last").code == 2
    assert s("policy", "check", str(home / "absent.json")).code == 3
