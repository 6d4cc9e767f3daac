"""Jobs: `gpupool submit` specs run as (distributed) replicas, locally or on Kubernetes.

Owns, pure (data, rules, rendering; no processes or state files): the job spec (`spec`, its
YAML layout validated by the pydantic models of `spec_model`), the replica plan and gang claim (`plan`), the replica env and the GPUPOOL_JOB_* / GPUPOOL_REPLICA*
names (`environment`), restart and success rules (`lifecycle`), the one job/replica state
(`phase`), rendezvous env per framework and Horovod's KV store (`rendezvous`), manifests
(`manifests`).
Executors, each owning its I/O (`executors`): the local one as a package (`executors/local/`: the
executor, the per-job supervisor, its state files, processes, ports and the dashboard reader);
Kubernetes and Kubeflow (`executors/kubernetes.py`, API objects read in `kube_status`).
May import: core, floors 1 and 2 (client, runner, isolation ...) and its own floor 3 (kube's
resource model); PyYAML, pydantic (`spec_model`) and the kubernetes client only where needed. The pure part never
imports `executors`.
"""
