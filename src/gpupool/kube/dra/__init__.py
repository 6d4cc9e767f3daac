"""The kubelet DRA plugin (resource.k8s.io/v1): registration, NodePrepare/UnprepareResources,
CDI specs, the store of prepared claims and the node's ResourceSlices."""

DEFAULT_DRIVER = "gpu.gpupool.io"  # the driver name: DeviceClass selectors, CDI vendor, socket names
