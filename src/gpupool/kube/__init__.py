"""Kubernetes face of gpupool: resource model, admission webhooks, scheduler extender,
device plugin and node agent. Heavy imports (grpc, kubernetes) stay in the modules that need them."""
