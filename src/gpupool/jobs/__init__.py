"""Jobs: `gpupool submit` specs run as (distributed) replicas, locally or on Kubernetes.

Owns: the job spec (`spec`), the replica plan and gang claim (`plan`), the replica env and the
GPUPOOL_JOB_* / GPUPOOL_REPLICA* names (`environment`), rendezvous env per framework
(`rendezvous`), restart and success rules (`lifecycle`), manifests (`manifests`) — all pure —
and the executors with their I/O (`executors`: the local supervisor, its state, processes and
ports; Kubernetes).
May import: core, floors 1 and 2 (client, runner, isolation ...) and its own floor 3 (kube's
resource model); PyYAML and the kubernetes client only where needed.
"""
