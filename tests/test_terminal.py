"""terminal.py: model and tool text escaped for the operator's terminal."""

from __future__ import annotations

import subprocess
import sys

from saphan.terminal import terminal_safe


def test_controls_are_escaped_newline_and_tab_kept() -> None:
    assert terminal_safe("a\x1b]52;c;aGk=\x07b\x1b[31mred\x1b[0m\tx\ny\r\x9b\x7f\x00\ud800é") == (
        "a\\x1b]52;c;aGk=\\x07b\\x1b[31mred\\x1b[0m\tx\ny\\r\\x9b\\x7f\\x00\\ud800é")


def test_bidi_controls_are_escaped() -> None:
    """A right-to-left override (or embedding, isolate, mark) makes a line
    read other than it is: `rm -rf \u202e/ fi` shows reversed."""
    assert terminal_safe("x\u202ey\u202c \u2066z\u2069 \u200e\u200f\u061c \u202a\u202b\u202d "
                         "\u2067\u2068") == (
        "x\\u202ey\\u202c \\u2066z\\u2069 \\u200e\\u200f\\u061c \\u202a\\u202b\\u202d "
        "\\u2067\\u2068")
    assert terminal_safe("שלום عربي 日本語 e\u0301") == "שלום عربي 日本語 e\u0301"


def test_the_loop_uses_it_and_stays_import_light() -> None:
    """The jailed loop (`python -I -m saphan.loop.agent`) imports this module
    and nothing else of saphan before it has read its key."""
    from saphan.loop import agent

    assert agent.terminal_safe is terminal_safe
    got = subprocess.run(
        [sys.executable, "-I", "-c", "import sys, saphan.loop.agent; print(' '.join(sorted("
         "m for m in sys.modules if m.startswith('saphan'))))"],
        capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert got == ["saphan", "saphan.loop", "saphan.loop.agent", "saphan.terminal"]
