"""A container image made here, for a real kubelet's pods when no registry can be reached.

`busybox_image` writes an OCI image layout archive (oci-layout, index.json, blobs/sha256/...)
whose one layer holds the machine's static busybox (Debian's busybox-static) as /bin/busybox,
with links for the commands pods use, and any files the caller adds (gpupool's runner zipapp at
the path the webhook's init container copies it from). `ctr images import` loads it into
containerd under its name. One image serves as the pod sandbox (`pause`: it sleeps until killed,
which is how containerd stops a sandbox), the runner image and the test pods' image. Its PATH
lists /usr/bin, where a pod that mounts the node's /usr finds python3.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import Dict, List, Mapping, Sequence, Tuple

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
# containerd's import names an image from this annotation of its manifest in index.json.
NAME_ANNOTATION = "io.containerd.image.name"
PT_INTERP = 3  # ELF program header type: the path of the dynamic loader
SLEEP_FOREVER = ["/bin/busybox", "sleep", "2147483647"]
APPLETS = ("sh", "cp", "cat", "echo", "env", "ls", "sleep", "grep", "test", "true")
PATH = "/usr/local/bin:/usr/bin:/bin"


class NoBusybox(RuntimeError):
    """No static busybox on this machine (Debian: apt-get install busybox-static)."""


def find_busybox() -> Path:
    """The machine's busybox, which must be static: nothing else is in the image."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.is_file() and _is_static(path):
            return path
    raise NoBusybox("no static busybox: apt-get install busybox-static (the kubelet node's image is built from it)")


def _is_static(path: Path) -> bool:
    """A 64-bit little-endian ELF file with no PT_INTERP program header (no dynamic loader): it
    runs in an image that holds no libc."""
    with open(path, "rb") as elf:
        head = elf.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return False
        phoff = int.from_bytes(head[0x20:0x28], "little")
        phentsize = int.from_bytes(head[0x36:0x38], "little")
        phnum = int.from_bytes(head[0x38:0x3A], "little")
        elf.seek(phoff)
        table = elf.read(phentsize * phnum)
    types = (int.from_bytes(table[i : i + 4], "little") for i in range(0, len(table), phentsize))
    return PT_INTERP not in types


def _layer(busybox: Path, files: Mapping[str, Path]) -> bytes:
    """The one layer: /bin/busybox and its applets' links, the empty folders a container wants,
    and `files` (path in the image: file here)."""
    out = io.BytesIO()
    folders = {"bin", "dev", "etc", "proc", "sys", "tmp", "usr", "var", "var/run"}
    for path in files:
        parents = PurePosixPath(path.lstrip("/")).parents
        folders.update(str(p) for p in parents if str(p) != ".")
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in sorted(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        for path, source in {"/bin/busybox": busybox, **files}.items():
            data = source.read_bytes()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return out.getvalue()


def _blob(blobs: Dict[str, bytes], data: bytes, media: str) -> Dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media, "digest": digest, "size": len(data)}


def busybox_image(name: str, out: Path, files: Mapping[str, Path] = {}, cmd: Sequence[str] = SLEEP_FOREVER) -> Path:
    """Write the OCI archive of image `name` (busybox, `files` added; `cmd` by default) to `out`;
    returns `out`."""
    blobs: Dict[str, bytes] = {}
    layer = _layer(find_busybox(), files)
    layer_descriptor = _blob(blobs, layer, LAYER_MEDIA)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": list(cmd), "Env": [f"PATH={PATH}"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA,
        "config": _blob(blobs, _json(config), CONFIG_MEDIA),
        "layers": [layer_descriptor],
    }
    manifest_descriptor = _blob(blobs, _json(manifest), MANIFEST_MEDIA)
    manifest_descriptor["annotations"] = {NAME_ANNOTATION: name}
    index = {"schemaVersion": 2, "manifests": [manifest_descriptor]}
    entries: List[Tuple[str, bytes]] = [
        ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
        ("index.json", _json(index)),
    ]
    entries += [(f"blobs/sha256/{digest.split(':', 1)[1]}", data) for digest, data in blobs.items()]
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in entries:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def have_busybox() -> bool:
    try:
        find_busybox()
    except NoBusybox:
        return False
    return True
