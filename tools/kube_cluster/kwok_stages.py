"""kwok's stages for the test bed: how a simulated node and its pods move, as kwok Stage objects.

kwok plays the kubelet of each node whose annotation is `NODE_ANNOTATION`: a node goes Ready
keeping the capacity, allocatable and addresses it was created with; every pod bound to it goes
Running; a pod owned by a Job then ends Succeeded, or Failed with exit code 1 where it carries
`FAIL_ANNOTATION: "true"`, after the Go duration in `RUN_FOR_ANNOTATION` (none: at once); a
deleted pod goes. The templates are Go text/template over the object, with kwok's functions
(Now, NodeConditions, NodeIPsWith, PodIPsWith, YAML, Quote).
"""

from __future__ import annotations

from typing import Any, Dict, List

API_VERSION = "kwok.x-k8s.io/v1alpha1"
NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
FAIL_ANNOTATION = "gpupool.test/fail"
RUN_FOR_ANNOTATION = "gpupool.test/run-for"

NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
OWNED_BY_JOB = {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}
RUNNING = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
RUN_FOR = {"durationFrom": {"jq": {"expression": f'.metadata.annotations["{RUN_FOR_ANNOTATION}"]'}}}

NODE_HEARTBEAT = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""


# A node made Ready: the heartbeat's conditions, then the addresses, capacity and info it keeps.
NODE_READY = (
    NODE_HEARTBEAT
    + """\
{{ with .status.addresses }}
addresses:
{{ YAML . 1 }}
{{ end }}
{{ with .status.allocatable }}
allocatable:
{{ YAML . 1 }}
{{ end }}
{{ with .status.capacity }}
capacity:
{{ YAML . 1 }}
{{ end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: ""
  kubeProxyVersion: ""
  osImage: ""
  bootID: ""
  machineID: ""
  systemUUID: ""
phase: Running
"""
)

POD_RUNNING = """\
{{ $now := Now }}
conditions:
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
{{ range .spec.readinessGates }}
- {lastTransitionTime: {{ $now | Quote }}, status: "True", type: {{ .conditionType | Quote }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state: {running: {startedAt: {{ $now | Quote }}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def pod_ended(phase: str, exit_code: int, reason: str) -> str:
    """The status template of a pod whose containers all ended with `exit_code`."""
    return f"""\
{{{{ $now := Now }}}}
conditions:
- {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "False", type: Ready, reason: PodCompleted}}
- {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "False", type: ContainersReady, reason: PodCompleted}}
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  restartCount: 0
  started: false
  state: {{terminated: {{exitCode: {exit_code}, reason: {reason}, startedAt: {{{{ $now | Quote }}}}, finishedAt: {{{{ $now | Quote }}}}}}}}
{{{{ end }}}}
phase: {phase}
"""


def stage(name: str, kind: str, selector: List[Dict[str, Any]], next_: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    """One kwok Stage for objects of `kind` (core group) matching every expression of `selector`."""
    spec: Dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "next": next_,
        **extra,
    }
    return {"apiVersion": API_VERSION, "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def stages() -> List[Dict[str, Any]]:
    """Every stage the test bed's kwok runs."""
    not_ready = {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }
    ready = {**not_ready, "operator": "In"}
    fails = {"key": f'.metadata.annotations["{FAIL_ANNOTATION}"]', "operator": "In", "values": ["true"]}
    succeeds = {**fails, "operator": "NotIn"}
    return [
        stage("node-ready", "Node", [not_ready], {"statusTemplate": NODE_READY}),
        # The node's Lease is kwok's own (--node-lease-duration-seconds); the status is renewed
        # now and then as a kubelet does.
        stage(
            "node-heartbeat",
            "Node",
            [ready],
            {"statusTemplate": NODE_HEARTBEAT},
            delay={"durationMilliseconds": 60000, "jitterDurationMilliseconds": 90000},
        ),
        stage(
            "pod-running",
            "Pod",
            [NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}],
            {"statusTemplate": POD_RUNNING},
        ),
        stage(
            "pod-succeeded",
            "Pod",
            [NOT_DELETED, RUNNING, OWNED_BY_JOB, succeeds],
            {"statusTemplate": pod_ended("Succeeded", 0, "Completed")},
            delay=RUN_FOR,
        ),
        stage(
            "pod-failed",
            "Pod",
            [NOT_DELETED, RUNNING, OWNED_BY_JOB, fails],
            {"statusTemplate": pod_ended("Failed", 1, "Error")},
            delay=RUN_FOR,
        ),
        stage("pod-deleted", "Pod", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}], {"delete": True}),
    ]
