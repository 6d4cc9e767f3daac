"""The web dashboard at `/`: GPUs, leases, queue and enforcement of one pool, drawn on the server.

`install(app)` adds it to the API app (`create_app`), so the pool server and
the Kubernetes node agent both serve it. Read-only; the API's tokens.
"""

from __future__ import annotations

from .routes import COOKIE, DashboardState, install
from .view import JobRow, ReplicaRow, build

__all__ = ["COOKIE", "DashboardState", "JobRow", "ReplicaRow", "build", "install"]
