"""Validate kubeflow.org/v1 objects against the training operator's CRD schemas.

The CRDs are not vendored here: they come from the operator's Go module at the version
tools/crds/go.mod pins (manifests/base/crds/), or from a folder GPUPOOL_KUBEFLOW_CRDS names
holding kubeflow.org_tfjobs.yaml and kubeflow.org_pytorchjobs.yaml. Without either the check is
skipped, and says so (tests/crd_schemas.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from crd_schemas import ROOT, CrdSource, GoModule

KUBEFLOW = CrdSource(
    env="GPUPOOL_KUBEFLOW_CRDS",
    project="training-operator",
    where="kubeflow.org_tfjobs.yaml and kubeflow.org_pytorchjobs.yaml (see tests/jobs/crds.py)",
    module=GoModule("github.com/kubeflow/training-operator", ROOT / "tools" / "crds", "manifests/base/crds"),
)


def crd_folder() -> Optional[Path]:
    return KUBEFLOW.folder()


def validate_custom(obj: Dict[str, Any]) -> None:
    """Raise AssertionError naming the first field the CRD rejects; skip without the CRDs."""
    KUBEFLOW.validate(obj)
