"""Refusals are data: one closed table of classes, one exception type.

Every "cannot" in saphan is a :class:`Refusal` carrying a class from
:data:`CLASSES`, a message with the measured numbers, and a remediation. The
CLI prints it as ``refused [class]: message`` / ``fix: remediation`` and exits
with :data:`EXIT_CODE`; a run that was refused stores the class on its row.
docs/refusals.md carries the same table; tests/test_refusals.py holds the two
against each other.
"""

from __future__ import annotations

from saphan.errors import REFUSAL_EXIT_CODE as EXIT_CODE
from saphan.errors import Refusal
from saphan.refusal_table import CLASSES

__all__ = ["CLASSES", "EXIT_CODE", "Refusal"]
