"""Kernelspecs that run an existing kernel under a gpupool lease: install, list, remove.

A gpupool kernelspec is the wrapped kernel's own (argv, env, language, logos) with the
provisioner named in its metadata and the share as the provisioner's config; jupyter_client
hides it where gpupool is not installed, rather than start it without a lease.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput, NotFound
from . import PROVISIONER_NAME
from .launch import KernelSettings

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

# Jupyter's rule for kernel names (jupyter_client.kernelspec._kernel_name_pat).
NAME_RE = re.compile(r"^[a-z0-9._-]{1,64}$", re.IGNORECASE)


def _manager() -> Any:
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        raise InvalidInput("jupyter_client is not installed: pip install 'gpupool[notebook]'") from None
    return KernelSpecManager()


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise InvalidInput(f"kernel name {name!r}: use 1-64 letters, digits, '.', '_' and '-', e.g. gpu-quarter")
    return name.lower()


def default_name(settings: KernelSettings, wrapped: str = "python3") -> str:
    """A kernel name that differs wherever the settings do: gpu-0.25-idle-10m, ir-gpu-8192mib-idle-never-team-a."""
    share = f"{settings.memory_mib}mib" if settings.memory_mib is not None else f"{settings.fraction or 1.0:g}"
    parts = [] if wrapped == "python3" else [wrapped]
    parts += ["gpu", share, "idle", settings.idle()]
    if settings.queue:
        parts.append(settings.queue)
    if settings.server:  # https://pool:7070 -> pool-7070
        parts.append(re.sub(r"[^a-z0-9.]+", "-", settings.server.lower().split("://", 1)[-1]).strip("-"))
    name = "-".join(parts)
    if not NAME_RE.match(name):
        raise InvalidInput(f"the default kernel name {name!r} is over 64 characters: give a NAME, e.g. gpu-quarter")
    return name


def install(
    settings: KernelSettings,
    wrapped: str = "python3",
    display_name: str = "",
    prefix: Optional[str] = None,
    system: bool = False,
) -> str:
    """Write kernelspec `settings.name` wrapping kernel `wrapped`; returns the folder written.

    In the user's kernels (the default), under `prefix`/share/jupyter, or with `system` in the
    first of Jupyter's system-wide folders (/usr/local/share/jupyter/kernels on Linux), where
    every user's Jupyter finds it."""
    manager = _manager()
    name = check_name(settings.name)
    if check_name(wrapped) == name:
        raise InvalidInput(f"kernel {name!r} cannot wrap itself: give another --kernel")
    from jupyter_client.kernelspec import NoSuchKernel

    try:
        inner = manager.get_kernel_spec(wrapped)
    except NoSuchKernel:
        known = ", ".join(sorted(manager.find_kernel_specs())) or "none"
        raise InvalidInput(f"no kernel {wrapped!r} to wrap (installed: {known}); give --kernel NAME") from None
    if _provisioner(inner.metadata) == PROVISIONER_NAME:
        raise InvalidInput(f"kernel {wrapped!r} is a gpupool kernel already: wrap the kernel it wraps")
    # No "supported_encryption": the proxy relays plain ZeroMQ, so the frontend must not ask for CURVE.
    metadata = {k: v for k, v in inner.metadata.items() if k not in ("kernel_provisioner", "supported_encryption")}
    metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONER_NAME, "config": settings.to_config()}
    metadata["gpupool"] = {"wraps": wrapped}
    spec = {
        "argv": inner.argv,
        "display_name": display_name or f"{inner.display_name} [gpupool {settings.label()}]",
        "language": inner.language,
        "interrupt_mode": inner.interrupt_mode,
        "env": inner.env,
        "metadata": metadata,
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        if inner.resource_dir and Path(inner.resource_dir).is_dir():  # the logos
            shutil.copytree(inner.resource_dir, folder, ignore=shutil.ignore_patterns("kernel.json"))
        folder.mkdir(exist_ok=True)
        (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
        try:
            return str(
                manager.install_kernel_spec(str(folder), name, user=prefix is None and not system, prefix=prefix)
            )
        except PermissionError as e:
            raise InvalidInput(f"cannot write {e.filename or 'the kernels folder'}: {_not_allowed(system)}") from None


def _not_allowed(system: bool) -> str:
    if system:
        return "--system installs for every user and needs root: run it with sudo, or leave out --system"
    return "choose a folder you may write (--prefix DIR) or run it as the user who owns that one"


def _provisioner(metadata: Dict[str, Any]) -> str:
    section = metadata.get("kernel_provisioner") if isinstance(metadata, dict) else None
    return str(section.get("provisioner_name", "")) if isinstance(section, dict) else ""


def installed() -> List[Tuple[str, str, KernelSettings, str]]:
    """(name, folder, settings, display name) of every gpupool kernelspec, by name."""
    found = []
    for name, folder in sorted(_manager().find_kernel_specs().items()):
        try:
            spec = json.loads((Path(folder) / "kernel.json").read_text())
        except (OSError, ValueError):
            continue
        metadata = spec.get("metadata") if isinstance(spec, dict) else None
        if not isinstance(metadata, dict) or _provisioner(metadata) != PROVISIONER_NAME:
            continue
        config = metadata["kernel_provisioner"].get("config") or {}
        settings = KernelSettings(
            name=str(config.get("kernel_name", name)),
            fraction=config.get("fraction"),
            memory_mib=config.get("memory_mib"),
            queue=str(config.get("queue", "")),
            idle_suspend_s=config.get("idle_suspend_s"),
            server=str(config.get("server", "")),
        )
        found.append((name, str(folder), settings, str(spec.get("display_name", name))))
    return found


def remove(name: str) -> str:
    """Remove gpupool kernelspec `name` (never another kind); returns the folder removed."""
    name = check_name(name)
    for found, folder, _, _ in installed():
        if found == name:
            try:
                shutil.rmtree(folder)
            except PermissionError:
                raise InvalidInput(
                    f"cannot remove {folder}: it is installed for every user; remove it as root (sudo)"
                ) from None
            return folder
    raise NotFound(f"no gpupool kernel {name!r} (gpupool kernel list shows them)")
