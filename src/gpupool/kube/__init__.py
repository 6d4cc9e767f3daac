"""Kubernetes face of gpupool: resource model, admission webhooks, scheduler extender,
device plugin and node agent. Heavy imports (grpc, kubernetes) stay in the modules that need them.

Owns: the `gpupool.io/*` resource and annotation names (`resources`, `annotations`: defined
once), the webhooks, the extender, the device plugin, the node agent and deploy manifests.
May import: core, floors 1 and 2 (the agent reuses the server) and its own floor 3.
"""
