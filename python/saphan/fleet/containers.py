"""Container eligibility, as the design document defines it: a routing
precondition, never a confinement claim.

When a cast names an image digest, a machine is eligible only if its signed
record carries a probe-confirmed ``docker-oci`` row for exactly that digest
(kind ``docker-oci:sha256:<hex>``), fresh when the cast reads it: measured
within ``[cast] image_fresh_seconds`` (default 86400) of now. A stale row
counts as absent; a row for another digest does not qualify; a row that does
not verify is ``record-signature-invalid``. Nothing else is ``container-
ineligible``'s evidence. The run itself does not execute inside a container.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from saphan.errors import UserError
from saphan.refusals import Refusal

if TYPE_CHECKING:
    from saphan.config import Config
    from saphan.fleet.facts import FactReader
    from saphan.store.rows import Machine

#: a digest as casts and rows name it
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
#: the fact kind prefix of a probe-confirmed image row
KIND_PREFIX = "docker-oci:"


def check_digest(image: str) -> str:
    """``sha256:<64 hex>`` from ``--image`` (a bare digest, or REF@digest)."""
    digest = image.rsplit("@", 1)[-1]
    if not DIGEST.fullmatch(digest):
        raise UserError(f"--image {image!r} is not an image digest: give sha256:<64 lowercase "
                        "hex> (or REF@sha256:<64 hex>), the digest the machine was probed with")
    return digest


def kind(digest: str) -> str:
    return KIND_PREFIX + digest


def fresh_seconds(config: Config) -> int:
    return config.image_fresh_seconds


def ineligible(read: FactReader, m: Machine, image: str, fresh: int) -> str | None:
    """Why ``m`` is not eligible for ``image`` (None: a fresh row for exactly
    that digest verifies, as ``read`` — fleet/cast's verified reader — gives
    it). A row that does not verify raises its Refusal."""
    digest = check_digest(image)
    row = read(m, kind(digest))
    probe = f"`saphan machine probe-container {m.name} --image REF@{digest}`"
    if row is None:
        return f"image: no probe-confirmed docker-oci row for {digest} ({probe})"
    value, measured_at = row
    age = _age_seconds(measured_at)
    if age is None or age > fresh:
        return (f"image: the docker-oci row for {digest} was measured {measured_at}, "
                f"{'at an unreadable time' if age is None else f'{age:.0f} s ago'}, older "
                f"than the {fresh} s a cast accepts ({probe})")
    if value.get("digest") != digest:
        return f"image: the row for {digest} names {value.get('digest')!r}"
    return None


def refusal(image: str, passed_over: Sequence[dict[str, str]]) -> Refusal:
    """``container-ineligible``, naming for each machine what was missing."""
    from saphan import refusals

    listed = "; ".join(f"{p['machine']}/{p['slot']}: {p['why'].removeprefix('image: ')}"
                       for p in passed_over)
    return refusals.container_ineligible(
        f"no machine is eligible for image {image}: {listed}",
        "probe the image on a machine with its container runtime (`saphan machine "
        "probe-container M --image REF@DIGEST`); eligibility is a routing fact, not a "
        "boundary: the run does not execute inside a container")


def _age_seconds(measured_at: str) -> float | None:
    try:
        when = datetime.fromisoformat(measured_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (datetime.now(UTC) - when).total_seconds()
