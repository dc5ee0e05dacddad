"""The loop as one file for a runner: a zipapp of saphan's own Python
modules (the loop and what it imports — the standard library only), built
the same byte for byte from the same saphan, so it is delivered and pinned
like any single executable (``saphan machine deliver FAR --agent loop``).

On the runner it runs under the Python the slot names (``--agent-path``,
absolute; nothing is looked up on the far PATH): ``PYTHON -I
<far agents dir>/loop SPEC``. ``--version`` prints :func:`version`; the
native extension and the launcher are not in it (the loop needs neither).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

#: the zipapp's entry point: the loop's main, or its version line
MAIN = b"""\
import sys
if sys.argv[1:] == ["--version"]:
    from saphan.loop.zipapp import version
    print(version())
    sys.exit(0)
from saphan.loop.agent import main
sys.exit(main(sys.argv[1:]))
"""

#: every entry carries this time, so the bytes depend on the sources only
_EPOCH = (1980, 1, 1, 0, 0, 0)


def version() -> str:
    from saphan import __version__

    return f"saphan-loop {__version__}"


def build() -> bytes:
    """The zipapp's bytes: a ``#!/usr/bin/env python3`` line (only the
    install check runs it that way), then a zip of every ``.py`` file of
    the saphan package, sorted, with fixed times and modes."""
    root = Path(__file__).resolve().parent.parent
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).as_posix()
            if "__pycache__" in rel:
                continue
            info = zipfile.ZipInfo(rel, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())
        info = zipfile.ZipInfo("__main__.py", date_time=_EPOCH)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, MAIN)
    return buf.getvalue()
