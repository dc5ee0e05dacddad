"""A tiny OCI image built here, byte for byte the same every time: one
uncompressed layer holding a static busybox and a message, its config
running `cat /etc/probe-message`. Its manifest digest is known before the
runtime loads it (what `probe-container` pins)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path


def _info(name: str, **kw: object) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.mtime, t.uid, t.gid, t.uname, t.gname = 0, 0, 0, "", ""
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def _canon(o: object) -> bytes:
    return json.dumps(o, sort_keys=True, separators=(",", ":")).encode()


def _digest(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def build(busybox: Path, out: Path, ref: str, message: str) -> str:
    """Write an oci-archive to ``out``; return its manifest digest."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev"):
            tf.addfile(_info(d, type=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755))
        data = busybox.read_bytes()
        tf.addfile(_info("bin/busybox", size=len(data), mode=0o755), io.BytesIO(data))
        for app in ("sh", "cat", "echo"):
            tf.addfile(_info(f"bin/{app}", type=tarfile.SYMTYPE, linkname="busybox",
                             mode=0o777))
        msg = (message + "\n").encode()
        tf.addfile(_info("etc/probe-message", size=len(msg), mode=0o644), io.BytesIO(msg))
    layer = layer_buf.getvalue()
    config = _canon({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Cmd": ["/bin/cat", "/etc/probe-message"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]}})
    manifest = _canon({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer), "size": len(layer)}]})
    index = _canon({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": _digest(manifest), "size": len(manifest),
                       "annotations": {"org.opencontainers.image.ref.name": ref}}]})
    files = {"oci-layout": _canon({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for blob in (layer, config, manifest):
        files[f"blobs/sha256/{_digest(blob)[7:]}"] = blob
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("blobs", "blobs/sha256"):
            tf.addfile(_info(d, type=tarfile.DIRTYPE, mode=0o755))
        for name, data in sorted(files.items()):
            tf.addfile(_info(name, size=len(data), mode=0o644), io.BytesIO(data))
    return _digest(manifest)
