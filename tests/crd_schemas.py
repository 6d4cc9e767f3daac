"""Validate custom objects against a project's published CRD schemas, read from a folder.

CRDs are not vendored here. Each project's CRDs come from its Go module at the version a
committed go.mod pins (tools/crds/, or the test bed's Kueue module), downloaded through the Go
module proxy into the module cache; an environment variable naming a folder of the project's
CRD files as released (any *.yaml in it, one CRD or many per file, so a release's all-in-one
manifests.yaml serves as well as the CRD bases) takes precedence. With neither (no `go`, no
proxy) the check skips and says where to get the files; a folder without the CRD, or whose CRD
does not serve the object's version, fails.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest
import yaml

CrdIndex = Dict[Tuple[str, str], Dict[str, Any]]  # (group, kind) -> the CRD
ROOT = Path(__file__).resolve().parents[1]
GO_DOWNLOAD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class GoModule:
    """A project's CRDs inside its Go module, at the version the go.mod in `pins` requires."""

    path: str  # e.g. github.com/kubeflow/training-operator
    pins: Path  # the folder whose go.mod/go.sum pin it
    crds: str  # the CRD folder inside the module

    def folder(self) -> Optional[Path]:
        return _module_folder(self.path, str(self.pins), self.crds)


@functools.cache
def _module_folder(module: str, pins: str, crds: str) -> Optional[Path]:
    """The CRD folder of `module` in the Go module cache, downloaded (and checked against go.sum)
    where missing; None without `go` or when the download fails."""
    if shutil.which("go") is None:
        return None
    try:
        done = subprocess.run(
            ["go", "mod", "download", "-json", module],
            cwd=pins,
            capture_output=True,
            text=True,
            timeout=GO_DOWNLOAD_TIMEOUT_S,
            env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
        )
        folder = Path(json.loads(done.stdout)["Dir"]) / crds
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None
    return folder if done.returncode == 0 and folder.is_dir() else None


@dataclass(frozen=True)
class CrdSource:
    """One project's CRDs: the variable naming their folder, and where to get them."""

    env: str  # e.g. GPUPOOL_KUEUE_CRDS
    project: str  # e.g. "Kueue"
    where: str  # the files to put there, for the skip message
    module: Optional[GoModule] = None  # where they come from without the variable

    def folder(self) -> Optional[Path]:
        folder = os.environ.get(self.env)
        if folder:
            return Path(folder) if Path(folder).is_dir() else None
        return self.module.folder() if self.module else None

    def schema(self, api_version: str, kind: str) -> Dict[str, Any]:
        """The openAPIV3Schema of `kind` in `api_version` (group/version); skips without the folder."""
        folder = self.folder()
        if folder is None:
            pytest.skip(
                f"{self.project} CRDs not at hand (no Go module download): set {self.env} to a folder with {self.where}"
            )
        group, _, version = api_version.rpartition("/")
        crd = _index(str(folder)).get((group, kind))
        if crd is None:
            raise AssertionError(f"no CRD for {group} {kind} in {folder} ({self.env})")
        served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served", True)}
        if version not in served:
            raise AssertionError(f"the {kind} CRD in {folder} does not serve {version} (it serves {sorted(served)})")
        return dict(served[version]["schema"]["openAPIV3Schema"])

    def validate(self, obj: Dict[str, Any]) -> None:
        """Raise AssertionError naming the first field the CRD's schema rejects."""
        import jsonschema

        checker = jsonschema.Draft7Validator(strict(self.schema(obj["apiVersion"], obj["kind"])))
        errors = sorted(checker.iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            where = ".".join(str(p) for p in first.path)
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {where}: {first.message}")


@functools.cache
def _index(folder: str) -> CrdIndex:
    """Every CustomResourceDefinition in the folder's YAML files, by group and kind."""
    found: CrdIndex = {}
    for path in sorted(Path(folder).glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                spec = doc["spec"]
                found[(spec["group"], spec["names"]["kind"])] = doc
    return found


def strict(node: Any) -> Any:
    """A structural schema made strict: unknown fields are errors (the API server prunes them
    silently, which would hide a misspelt field), except under x-kubernetes-preserve-unknown-fields.
    Its CEL rules (x-kubernetes-validations) are not evaluated."""
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        if out.get("x-kubernetes-int-or-string"):
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node
