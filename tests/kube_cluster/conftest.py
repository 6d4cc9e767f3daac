"""The `cluster` fixture (cluster_fixture.py): the local control plane with gpupool's components,
started once per session."""

from __future__ import annotations

from .cluster_fixture import cluster  # noqa: F401 - the fixture, for every test module here
