"""Kubernetes manifests for a job spec: native Indexed Jobs, or Kubeflow training-operator kinds.

Pure: spec in, manifest dicts out; GPU limits come from `kube.resources.GpuAsk`.
"""

from .indexed import render as render_indexed
from .kubeflow import render as render_kubeflow

__all__ = ["render_indexed", "render_kubeflow"]
