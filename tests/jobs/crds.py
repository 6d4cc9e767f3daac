"""Validate kubeflow.org/v1 objects against the training operator's CRD schemas.

The CRDs are not vendored here: point GPUPOOL_KUBEFLOW_CRDS at a folder holding
kubeflow.org_tfjobs.yaml and kubeflow.org_pytorchjobs.yaml from the operator's release
(manifests/base/crds/ at github.com/kubeflow/training-operator, tag v1.9.0). Without them
the check is skipped, and says so (tests/crd_schemas.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from crd_schemas import CrdSource

KUBEFLOW = CrdSource(
    env="GPUPOOL_KUBEFLOW_CRDS",
    project="training-operator",
    where="kubeflow.org_tfjobs.yaml and kubeflow.org_pytorchjobs.yaml (see tests/jobs/crds.py)",
)


def crd_folder() -> Optional[Path]:
    return KUBEFLOW.folder()


def validate_custom(obj: Dict[str, Any]) -> None:
    """Raise AssertionError naming the first field the CRD rejects; skip without the CRDs."""
    KUBEFLOW.validate(obj)
