"""A real Kubernetes control plane on loopback, built from upstream Go modules: gpupool's test bed.

`controlplane` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
(simulated GPU nodes) from the binaries tools/kube-cluster/build.sh builds; `python -m
tools.kube_cluster up|down` is `make cluster-up`/`make cluster-down`; the `cluster` tests use the
same code as a pytest fixture (tests/kube_cluster/conftest.py).
"""
