"""Which Kubernetes versions have which Job features: rendering leaves out what a version lacks.

Pure. A version is (major, minor); `None` means "the newest", as `--dry-run` renders when no
`--kube-version` is given.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from ...core.errors import InvalidInput

KubeVersion = Tuple[int, int]

OLDEST = (1, 28)  # the oldest release the manifests are tested against (tests/jobs/test_manifests_versions.py)
# Job.spec.successPolicy: alpha in 1.30 (off unless the JobSuccessPolicy gate is on), beta and on in
# 1.31, GA in 1.33. Older API servers reject the field (kubectl's strict field validation).
SUCCESS_POLICY = (1, 31)
# PodFailurePolicyRule.onPodConditions: a required field (an empty list will do) before 1.29.
OPTIONAL_POD_CONDITIONS = (1, 29)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:[.+-].*)?$")


def parse_kube_version(text: str) -> KubeVersion:
    """'1.29', 'v1.29.3' or a server's gitVersion ('v1.30.2-gke.1587003') as (1, 29)."""
    match = _VERSION_RE.match(str(text).strip())
    if not match:
        raise InvalidInput(f"--kube-version {text!r} is not a Kubernetes version: use e.g. 1.29 or v1.31.2")
    version = (int(match.group(1)), int(match.group(2)))
    if version < OLDEST:
        raise InvalidInput(
            f"--kube-version {text!r}: Kubernetes before {OLDEST[0]}.{OLDEST[1]} is not supported "
            f"(Indexed Jobs with pod failure policies); upgrade the cluster"
        )
    return version


def has(version: Optional[KubeVersion], feature: KubeVersion) -> bool:
    """Whether a cluster of `version` (None: the newest) has a feature introduced in `feature`."""
    return version is None or version >= feature
