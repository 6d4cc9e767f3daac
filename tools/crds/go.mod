module gpupool.dev/tools/crds

go 1.26.0

// Not built: pinned for its CRD files (manifests/base/crds), which the tests validate against.
require github.com/kubeflow/training-operator v1.9.3
