"""Validate kubeflow.org/v1 objects against the training operator's CRD schemas.

The CRDs are not vendored here: point GPUPOOL_KUBEFLOW_CRDS at a folder holding
kubeflow.org_tfjobs.yaml and kubeflow.org_pytorchjobs.yaml from the operator's release
(manifests/base/crds/ at github.com/kubeflow/training-operator, tag v1.9.0). Without them
the check is skipped, and says so.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import yaml

PLURALS = {"TFJob": "tfjobs", "PyTorchJob": "pytorchjobs"}


def crd_folder() -> Optional[Path]:
    folder = os.environ.get("GPUPOOL_KUBEFLOW_CRDS")
    return Path(folder) if folder and Path(folder).is_dir() else None


@functools.cache
def schema(kind: str) -> Dict[str, Any]:
    folder = crd_folder()
    if folder is None:
        pytest.skip("training-operator CRDs not at hand: set GPUPOOL_KUBEFLOW_CRDS (see tests/jobs/crds.py)")
    path = folder / f"kubeflow.org_{PLURALS[kind]}.yaml"
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


def _strict(node: Any) -> Any:
    """A structural schema made strict: unknown fields are errors (the API server prunes them
    silently, which would hide a misspelt field), except under x-kubernetes-preserve-unknown-fields."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        if out.get("x-kubernetes-int-or-string"):
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def validate_custom(obj: Dict[str, Any]) -> None:
    """Raise AssertionError naming the first field the CRD rejects."""
    import jsonschema

    checker = jsonschema.Draft7Validator(_strict(schema(obj["kind"])))
    errors = sorted(checker.iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.path)
        raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {where}: {first.message}")
