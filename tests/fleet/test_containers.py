"""fleet/containers.py: a machine is eligible for an image only with a
verified docker-oci row for exactly that digest, fresh when the cast reads
it; a stale row counts as absent, another digest's does not qualify, a
tampered row is record-signature-invalid. (The rows here are written by
the signing writer the probe uses, fleet/facts.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from saphan.context import Context
from saphan.errors import UserError
from saphan.fleet import containers, facts
from saphan.refusals import Refusal
from saphan.store.rows import Fact, Machine

DIGEST = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64


def _iso(ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _row(ctx: Context, digest: str, ago: float) -> Machine:
    m = ctx.machine("here")
    facts.write(ctx.store, ctx.record_key(), ctx.workspace.home, m, containers.kind(digest),
                {"digest": digest, "runtime": "podman"}, _iso(ago))
    return m


def _reader(ctx: Context) -> facts.FactReader:
    return lambda m, kind: ctx.verified_fact(m.name, kind)


@pytest.fixture
def here(ctx: Context) -> Machine:
    assert ctx.store.add_machine(Machine("here", "local", created_at="t"))
    return ctx.machine("here")


@pytest.mark.parametrize("image", [DIGEST, f"reg.example/app@{DIGEST}"])
def test_a_digest_is_read_from_an_image_reference(image: str) -> None:
    assert containers.check_digest(image) == DIGEST


@pytest.mark.parametrize("image", ["alpine", "alpine:3", "sha256:abc", "sha256:" + "A" * 64,
                                   f"x@{DIGEST}x", "sha512:" + "1" * 128])
def test_anything_but_a_sha256_digest_is_refused(image: str) -> None:
    with pytest.raises(UserError, match="not an image digest"):
        containers.check_digest(image)


def test_only_a_fresh_row_for_that_digest_qualifies(ctx: Context, here: Machine) -> None:
    assert containers.ineligible(_reader(ctx), here, DIGEST, 600) is not None  # no row at all
    _row(ctx, OTHER, 1)
    why = containers.ineligible(_reader(ctx), here, DIGEST, 600)
    assert why is not None and why.startswith(f"image: no probe-confirmed docker-oci row for "
                                              f"{DIGEST}")
    _row(ctx, DIGEST, 5)
    assert containers.ineligible(_reader(ctx), here, DIGEST, 600) is None
    _row(ctx, DIGEST, 700)  # measured again, but long ago: stale counts as absent
    why = containers.ineligible(_reader(ctx), here, DIGEST, 600)
    assert why is not None and "older than the 600 s a cast accepts" in why


def test_a_tampered_row_is_record_signature_invalid(ctx: Context, here: Machine) -> None:
    _row(ctx, DIGEST, 1)
    f = ctx.store.get_fact("here", containers.kind(DIGEST))
    assert f is not None
    ctx.store.put_fact(Fact(f.machine, f.kind, f.value_json.replace("podman", "docker"),
                            f.measured_at, f.signature))
    with pytest.raises(Refusal) as e:
        containers.ineligible(_reader(ctx), here, DIGEST, 600)
    assert e.value.cls == "record-signature-invalid"


def test_the_refusal_names_each_machine() -> None:
    r = containers.refusal(DIGEST, [{"machine": "a", "slot": "s", "why": "image: no row"},
                                    {"machine": "b", "slot": "t", "why": "image: stale"}])
    assert r.cls == "container-ineligible"
    assert r.message == f"no machine is eligible for image {DIGEST}: a/s: no row; b/t: stale"
    assert "not a boundary" in r.remediation
