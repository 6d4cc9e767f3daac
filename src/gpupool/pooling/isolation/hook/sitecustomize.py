"""gpupool post-import hook: holds PyTorch and TensorFlow to the memory share of the lease.

`gpupool run` puts the folder of this file first on the child's PYTHONPATH,
so Python imports it at start-up as `sitecustomize`. It is self-contained
(standard library only, no gpupool import) because the child's Python may not
have gpupool installed. It then:

1. runs the `sitecustomize` this one shadows, if there is one;
2. installs a meta-path finder that, after `torch` or `tensorflow` finished
   importing, applies the per-GPU allocator caps from the env contract
   (GPUPOOL_ALLOCATOR_FRACTION / GPUPOOL_ALLOCATOR_LIMIT_MIB, visible order:
   the grant less the CUDA context reserve, computed by gpupool's
   isolation/env.py; an older runner's GPUPOOL_MEMORY_FRACTION /
   GPUPOOL_MEMORY_LIMIT_MIB, the whole grant, serve when those are absent).

It never breaks an import: every failure is swallowed (and printed when
GPUPOOL_HOOK_DEBUG=1, the test seam that also reports what was applied).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, Dict, List, Optional, Sequence, Set

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEBUG = os.environ.get("GPUPOOL_HOOK_DEBUG", "") not in ("", "0", "false", "no")


def _say(message: str) -> None:
    if _DEBUG:
        sys.stderr.write("gpupool-hook: %s\n" % message)
        sys.stderr.flush()


# The names are defined in gpupool/pooling/isolation/env.py; this file cannot import it.
FRACTION_ENVS = ("GPUPOOL_ALLOCATOR_FRACTION", "GPUPOOL_MEMORY_FRACTION")
LIMIT_ENVS = ("GPUPOOL_ALLOCATOR_LIMIT_MIB", "GPUPOOL_MEMORY_LIMIT_MIB")


def _first(names: Sequence[str]) -> str:
    """The first of `names` that is set (the allocator cap, else the whole grant)."""
    for name in names:
        if os.environ.get(name, "").strip():
            return name
    return names[-1]


def _floats(name: str) -> List[float]:
    text = os.environ.get(name, "").strip()
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _say("ignoring malformed %s=%r" % (name, text))
        return []


def _apply_torch(torch: Any) -> None:
    """Cap the caching allocator of every visible GPU at the lease's fraction."""
    name = _first(FRACTION_ENVS)
    fractions = _floats(name)
    if not fractions:
        _say("torch: skipped (no %s)" % name)
        return
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        _say("torch: skipped (no CUDA); would set memory fraction %s" % ",".join("%g" % f for f in fractions))
        return

    def apply() -> None:
        count = cuda.device_count()
        for index, fraction in enumerate(fractions[:count]):
            cuda.set_per_process_memory_fraction(min(max(fraction, 0.0), 1.0), index)
            _say("torch: applied memory fraction %g on cuda:%d" % (fraction, index))

    # Applying now would initialise CUDA at import time and break fork-based
    # workers; torch's own lazy-call queue runs it when CUDA starts instead.
    lazy = getattr(cuda, "_lazy_call", None)
    if lazy is not None and not (hasattr(cuda, "is_initialized") and cuda.is_initialized()):
        lazy(apply)
        _say("torch: memory fraction %s queued for CUDA initialisation" % ",".join("%g" % f for f in fractions))
    else:
        apply()


def _apply_tensorflow(tf: Any) -> None:
    """Give every visible GPU one logical device capped at the lease's MiB (before TF initialises GPUs)."""
    name = _first(LIMIT_ENVS)
    limits = _floats(name)
    if not limits:
        _say("tensorflow: skipped (no %s)" % name)
        return
    config = getattr(tf, "config", None)
    if config is None:
        _say("tensorflow: skipped (no tf.config)")
        return
    gpus = config.list_physical_devices("GPU")
    if not gpus:
        _say("tensorflow: skipped (no GPU); would set memory limit %s MiB" % ",".join("%d" % m for m in limits))
        return
    for gpu, limit in zip(gpus, limits):
        try:
            config.set_logical_device_configuration(gpu, [config.LogicalDeviceConfiguration(memory_limit=int(limit))])
            _say("tensorflow: applied memory limit %d MiB on %s" % (int(limit), getattr(gpu, "name", gpu)))
        except RuntimeError as err:  # GPUs already initialised: too late to limit
            sys.stderr.write("gpupool-hook: warning: tensorflow memory limit not applied: %s\n" % err)


_HOOKS: Dict[str, Callable[[Any], None]] = {"torch": _apply_torch, "tensorflow": _apply_tensorflow}


def _run_hook(name: str, module: ModuleType) -> None:
    try:
        _HOOKS[name](module)
    except Exception as err:  # a limit we could not set must not break the user's import
        _say("%s: hook failed: %r" % (name, err))


class _PostImportFinder:
    """Finds nothing itself; wraps the real loader of hooked modules to run the hook after exec."""

    def __init__(self) -> None:
        self._busy: Set[str] = set()

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _HOOKS or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader  # any loader with exec_module; patched on the instance below
        original: Callable[[ModuleType], None] = loader.exec_module

        def exec_module(
            module: ModuleType, _original: Callable[[ModuleType], None] = original, _name: str = fullname
        ) -> None:
            _original(module)
            _run_hook(_name, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            return spec
        return spec


def _chain_sitecustomize() -> None:
    """Run the sitecustomize this file shadows (distro or venv), as Python would have."""
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:  # as `import sitecustomize` would run it; what it registers keeps it alive
        spec.loader.exec_module(module)
    except Exception as err:
        sys.stderr.write("gpupool-hook: warning: %s failed: %r\n" % (spec.origin, err))


def _install() -> None:
    _chain_sitecustomize()
    for name in _HOOKS:
        if name in sys.modules:  # imported by the chained sitecustomize already
            _run_hook(name, sys.modules[name])
    sys.meta_path.insert(0, _PostImportFinder())
    _say(
        "installed (fractions=%s, limits_mib=%s)"
        % (os.environ.get(_first(FRACTION_ENVS), ""), os.environ.get(_first(LIMIT_ENVS), ""))
    )


_install()
