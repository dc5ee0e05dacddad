"""Text for the operator's terminal: what a model or a tool chose, escaped.

Shared by the loop's own lines (loop/agent.py, which runs jailed as
``python -I -m saphan.loop.agent``: this module imports nothing but ``re``)
and the readable view of claude and codex runs (run/view.py).
"""

from __future__ import annotations

import re

#: what a terminal would act on or reorder: C0 controls but newline and tab,
#: DEL, C1 controls (CSI ``\x9b``, OSC ``\x9d``, …), lone surrogates (which
#: cannot even be printed), and the bidirectional marks, embeddings, overrides
#: and isolates that make a line read other than it is (U+061C, U+200E/F,
#: U+202A to U+202E, U+2066 to U+2069)
_CONTROL = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` for the operator's terminal: every control character (ESC of
    an OSC 52 clipboard write or a colour code, CR, BEL, CSI ``\\x9b``, a
    right-to-left override, …) escaped as ``\\x1b``, ``\\x9b``, ``\\u202e``;
    newline and tab kept."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
