"""saphan: run coding agents inside operating-system write boundaries.

The public API is :class:`saphan.Engine`; every "cannot" it meets is raised as
:class:`saphan.Refusal`. Nothing is imported here until it is asked for, so
``saphan --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from saphan.engine import Engine
    from saphan.records import RunRecord
    from saphan.refusals import Refusal

__all__ = ["Engine", "Refusal", "RunRecord", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from saphan.engine import Engine

        return Engine
    if name == "Refusal":
        from saphan.refusals import Refusal

        return Refusal
    if name == "RunRecord":
        from saphan.records import RunRecord

        return RunRecord
    raise AttributeError(f"module 'saphan' has no attribute {name!r}")
