"""The embeddable Python API: the same operations as the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

import saphan
from saphan.errors import UserError

pytestmark = pytest.mark.usefixtures("bwrap_available")


def test_engine_end_to_end(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("api") / "ws"
    engine = saphan.Engine(home=home)
    created = engine.init()
    assert str(home / "record.key") in created
    assert engine.init() == []
    engine.add_machine("here", local=True)
    engine.add_slot("here", "s1", tool="command", max_sessions=2)
    wd = tmp_path / "wd"
    wd.mkdir()
    record = engine.run("here", "s1", ["sh", "-c", "echo hi > out.txt"], workdir=wd,
                        stream=False)
    assert isinstance(record, saphan.RunRecord)
    assert record.outcome == "exited" and record.exit_code == 0
    assert record.enforced_by is not None and record.enforced_by["mechanism"] == "bubblewrap"
    assert (wd / "out.txt").read_text() == "hi\n"
    assert [r.id for r in engine.runs()] == [record.id]
    assert engine.run_record(record.id[:10]).id == record.id

    with pytest.raises(saphan.Refusal) as e:
        engine.run("here", "s1", ["true"], workdir=tmp_path / "missing", stream=False)
    assert e.value.cls == "workdir-missing"
    assert e.value.run_id is not None
    assert engine.run_record(e.value.run_id).refusal_class == "workdir-missing"

    with pytest.raises(UserError, match="no slot 'nope'"):
        engine.run("here", "nope", ["true"], workdir=wd)
    engine.close()


def test_importing_saphan_does_no_work() -> None:
    import subprocess
    import sys

    code = ("import sys, saphan; "
            "print(sorted(m for m in sys.modules if m.startswith(('saphan', 'psycopg', 'paramiko', "
            "'click'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['saphan']"


@pytest.mark.parametrize("argv", [["--help"], ["runs", "list"]])
def test_fast_verbs_never_import_drivers(argv: list[str], tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    home = tmp_path / "ws"
    env = dict(os.environ, SAPHAN_HOME=str(home))
    saphan.Engine(home=home).init()
    code = (
        "import sys\n"
        f"sys.argv = ['saphan', *{argv!r}]\n"
        "from saphan.entry import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('psycopg', 'paramiko', 'hashlib') if m in sys.modules),"
        " file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_a_loop_run_through_the_api(tmp_path: Path,
                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """Lanes and a loop run from an embedding program: the engine's process
    is non-dumpable only while the run lasts, and gets its setting back."""
    from saphan.tools.instruction import Request
    from saphan.transport import local
    from tools.model_servers import ChatCompletionsServer

    engine = saphan.Engine(home=tmp_path_factory.mktemp("api") / "ws")
    engine.init()
    key = tmp_path / "lane.key"
    key.write_text("sk-api-0123456789abcdef\n")
    key.chmod(0o600)
    wd = tmp_path / "wd"
    wd.mkdir()
    script = [("calls", [("write_file", {"path": "note.txt", "content": "from the api\n"})]),
              ("calls", [("finish", {"summary": "done"})])]
    with ChatCompletionsServer(script) as srv:
        lane = engine.add_lane("L", base_url=f"{srv.base_url}/v1", model="m",
                               credential_file=str(key))
        assert [x.name for x in engine.lanes()] == ["L"] == [x.name for x in engine.check_lanes()]
        engine.add_machine("here", local=True)
        engine.add_slot("here", "lp", tool="loop")
        assert local.set_dumpable(True) is True  # this process starts dumpable
        record = engine.run("here", "lp", [], workdir=wd, stream=False,
                            request=Request(prompt="write a note", max_turns=5))
        assert local.set_dumpable(True) is True  # and is again afterwards
    assert lane.credential_file == str(key)
    assert record.outcome == "exited" and record.data["loop"]["summary"] == "done"
    assert (wd / "note.txt").read_text() == "from the api\n"
    assert engine.remove_lane("L").name == "L" and engine.lanes() == []
    engine.close()


def test_an_engine_that_only_reads_reconciles_nothing(tmp_path_factory: pytest.TempPathFactory
                                                       ) -> None:
    import subprocess

    from saphan.ids import new_run_id
    from saphan.liveness import boot_id, this_host

    home = tmp_path_factory.mktemp("ro") / "ws"
    writer = saphan.Engine(home=home)
    writer.init()
    writer.add_machine("here", local=True)
    writer.add_slot("here", "s1", tool="command")
    dead = subprocess.Popen(["true"])  # a pid that has ended
    dead.wait()
    rid = new_run_id()
    writer.store.reserve(run_id=rid, machine="here", slot="s1", capacity=1, tool="command",
                         workdir="/w", holder=(this_host(), dead.pid, 1, boot_id()))
    writer.close()

    reader = saphan.Engine(home=home, reconcile=False)
    (shown,) = reader.runs()
    assert shown.id == rid and shown.data["live"]["liveness"]["state"] == "dead"
    assert reader.store.get_run(rid).live  # type: ignore[union-attr]  # left as it is
    reader.close()

    again = saphan.Engine(home=home)  # the first use of the store reconciles
    assert again.runs()[0].outcome == "holder-dead"
    again.close()
