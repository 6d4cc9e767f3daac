"""deploy/examples/kueue: teams' queues on a cluster, from Kueue, counting gpupool.io/gpu units.

Checked three ways:
- the Kueue objects against Kueue's published CRD schemas (kueue.x-k8s.io/v1beta2), read from the
  folder GPUPOOL_KUEUE_CRDS names (no package on PyPI, npm or Debian ships them); without it those
  tests skip and say so;
- the core objects (Namespace, Job, Pod) against Kubernetes 1.34 to 1.37 (kubernetes-validate, strict);
- always: the rules Kueue's admission webhook adds to its schemas, the references between the
  objects, and that what Kueue counts for each example workload is what gpupool's webhook makes its
  pods hold.
"""

from __future__ import annotations

import copy
import re
import textwrap
from typing import Any, Dict, List, Mapping, Tuple

import pytest
import yaml
from crd_schemas import ROOT, CrdSource, GoModule

from gpupool.kube.mutate import MutateConfig, mutate
from gpupool.kube.resources import ALIASES, UNITS, UNITS_PER_GPU, USER_KEYS, parse_units
from gpupool.kube.validate import validate as webhook_verdict

from .conftest import apply_patch
from .test_deploy_render import DEPLOY, render
from .test_dra_manifests import VERSIONS, validate

EXAMPLES = DEPLOY / "examples" / "kueue"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Not an API object: settings for Kueue's own Configuration file.
CONFIGURATION = "kueue-configuration.yaml"
WORKLOAD_KINDS = ("Job", "Pod")

KUEUE = CrdSource(
    env="GPUPOOL_KUEUE_CRDS",
    project="Kueue",
    where=(
        "the kueue.x-k8s.io_*.yaml CRDs of a Kueue release >= v0.15 (config/components/crd/bases/ "
        "at github.com/kubernetes-sigs/kueue, or the release's manifests.yaml)"
    ),
    module=GoModule("sigs.k8s.io/kueue", ROOT / "tools" / "kube-cluster" / "kueue", "config/components/crd/bases"),
)

Obj = Dict[str, Any]


def objects() -> List[Tuple[str, Obj]]:
    """(file, object) for every API object in the examples (the Configuration excerpt left out)."""
    files = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name not in (CONFIGURATION, "kustomization.yaml"))
    assert files, f"no examples in {EXAMPLES}"
    return [(f.name, d) for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def of_kind(kind: str) -> List[Obj]:
    return [o for _, o in objects() if o["kind"] == kind]


def named(kind: str, name: str, namespace: str = "") -> Obj:
    found = [
        o for o in of_kind(kind) if o["metadata"]["name"] == name and o["metadata"].get("namespace", "") == namespace
    ]
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} found"
    return found[0]


def ident(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata'].get('namespace', '-')}/{obj['metadata']['name']}"


def configuration() -> Obj:
    return dict(yaml.safe_load((EXAMPLES / CONFIGURATION).read_text()))


def workloads() -> List[Obj]:
    return [o for _, o in objects() if o["kind"] in WORKLOAD_KINDS]


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a number (the suffixes the examples use)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|m)?", str(value))
    assert match, f"quantity {value!r}"
    scale = {None: 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[match.group(2)]
    return float(match.group(1)) * scale


# --- the files ------------------------------------------------------------------------------


def test_kustomization_renders_the_queues_and_leaves_the_workloads_out():
    rendered = render(EXAMPLES)
    assert sorted(ident(o) for o in rendered) == sorted(
        ident(o) for _, o in objects() if o["kind"] not in WORKLOAD_KINDS
    ), "kustomization.yaml: the queue setup only, every object of it"
    assert {o["apiVersion"] for o in rendered if o["kind"] != "Namespace"} == {KUEUE_API}
    assert not [o for o in rendered if o["kind"] in WORKLOAD_KINDS]


# --- against Kueue's CRDs (skips without them) ----------------------------------------------


@pytest.mark.parametrize("obj", [o for _, o in objects() if o["apiVersion"] == KUEUE_API], ids=ident)
def test_kueue_objects_pass_kueues_crds(obj):
    KUEUE.validate(obj)


def test_kueues_crds_refuse_a_misplaced_quota():
    """The CRD check bites: borrowingLimit one level too high is an unknown field."""
    queue = copy.deepcopy(named("ClusterQueue", "team-a"))
    queue["spec"]["resourceGroups"][0]["borrowingLimit"] = 100
    with pytest.raises(AssertionError, match="borrowingLimit"):
        KUEUE.validate(queue)


# --- against Kubernetes --------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_core_objects_pass_kubernetes(version):
    core = [o for _, o in objects() if not o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert {o["kind"] for o in core} == {"Namespace", "Job", "Pod"}
    for obj in core:
        validate(obj, version)


# --- Kueue's admission webhook and the references ------------------------------------------


@pytest.mark.parametrize("queue", of_kind("ClusterQueue"), ids=ident)
def test_cluster_queues_keep_kueues_webhook_rules(queue):
    """What Kueue's webhook checks beyond the schema (pkg/webhooks/clusterqueue_webhook.go)."""
    spec = queue["spec"]
    for group in spec["resourceGroups"]:
        for flavor in group["flavors"]:
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"], (
                f"{ident(queue)} flavor {flavor['name']}: resources in the order of coveredResources"
            )
            for res in flavor["resources"]:
                nominal = quantity(res["nominalQuota"])
                assert nominal >= 0
                assert quantity(res.get("borrowingLimit", 0)) >= 0
                assert quantity(res.get("lendingLimit", 0)) <= nominal, "lendingLimit above nominalQuota"
                if "borrowingLimit" in res or "lendingLimit" in res:
                    assert spec.get("cohortName"), "borrowing and lending need a cohort"
    preemption = spec["preemption"]
    if preemption.get("borrowWithinCohort", {}).get("policy", "Never") != "Never":
        assert preemption["reclaimWithinCohort"] != "Never"


def gpu_quota(queue: Obj) -> Dict[str, Any]:
    (gpu,) = [
        r for g in queue["spec"]["resourceGroups"] for f in g["flavors"] for r in f["resources"] if r["name"] == UNITS
    ]
    return dict(gpu)


@pytest.mark.parametrize("queue", of_kind("ClusterQueue"), ids=ident)
def test_gpu_quota_is_in_gpupool_units_and_reclaimed_from_borrowers(queue):
    gpu = gpu_quota(queue)
    for key in ("nominalQuota", "borrowingLimit", "lendingLimit"):
        if key in gpu:
            assert parse_units(gpu[key]) is not None, f"{key} {gpu[key]!r}: whole {UNITS} units"
    assert parse_units(gpu["nominalQuota"]) >= UNITS_PER_GPU, "a team's quota of at least one GPU"
    # gpupool's contract: a queue below its quota gets it back from borrowers, whatever their priority
    assert queue["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
    assert queue["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    assert queue["spec"]["fairSharing"]["weight"] > 0


def test_references_resolve():
    cohorts = {o["metadata"]["name"] for o in of_kind("Cohort")}
    flavors = {o["metadata"]["name"] for o in of_kind("ResourceFlavor")}
    namespaces = {o["metadata"]["name"] for o in of_kind("Namespace")}
    queues = {o["metadata"]["name"]: o for o in of_kind("ClusterQueue")}
    assert len(queues) == 2 and len({q["spec"]["cohortName"] for q in queues.values()}) == 1
    for queue in queues.values():
        assert queue["spec"]["cohortName"] in cohorts
        assert {f["name"] for g in queue["spec"]["resourceGroups"] for f in g["flavors"]} <= flavors
    for local in of_kind("LocalQueue"):
        namespace = local["metadata"]["namespace"]
        assert namespace in namespaces
        selector = queues[local["spec"]["clusterQueue"]]["spec"]["namespaceSelector"]["matchLabels"]
        assert selector == {"kubernetes.io/metadata.name": namespace}, f"{ident(local)}: its ClusterQueue admits it"
    priorities = {o["metadata"]["name"] for o in of_kind("WorkloadPriorityClass")}
    for work in workloads():
        labels = work["metadata"]["labels"]
        named("LocalQueue", labels[QUEUE_LABEL], work["metadata"]["namespace"])
        if PRIORITY_LABEL in labels:
            assert labels[PRIORITY_LABEL] in priorities


def test_the_flavor_is_the_nodes_that_run_gpupools_agent():
    (agent,) = [d for d in yaml.safe_load_all((DEPLOY / "agent.yaml").read_text()) if d and d["kind"] == "DaemonSet"]
    (flavor,) = of_kind("ResourceFlavor")
    assert flavor["spec"]["nodeLabels"] == agent["spec"]["template"]["spec"]["nodeSelector"]


# --- what Kueue counts ----------------------------------------------------------------------


def excluded(name: str) -> bool:
    prefixes = configuration()["resources"]["excludeResourcePrefixes"]
    return any(name.startswith(p) for p in prefixes)


def kueue_counts(pod_spec: Mapping[str, Any]) -> Dict[str, float]:
    """What Kueue counts for one pod: requests, limits where requests are missing
    (UseLimitsAsMissingRequestsInPod), less the excluded prefixes, summed over the containers."""
    total: Dict[str, float] = {}
    for container in pod_spec["containers"]:
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in asked.items():
            if not excluded(name):
                total[name] = total.get(name, 0) + quantity(value)
    return total


def pod_of(work: Obj) -> Obj:
    """The pod a workload makes (a Job's from its template), before any webhook."""
    if work["kind"] == "Pod":
        return copy.deepcopy(work)
    template = copy.deepcopy(work["spec"]["template"])
    template["metadata"]["namespace"] = work["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", **template}


def translated(pod: Obj) -> Obj:
    """The pod as gpupool's mutating webhook leaves it, which its validating webhook allows."""
    mutation = mutate(pod, MutateConfig())
    assert mutation.patch, f"gpupool's webhook left {ident(pod)} untranslated"
    out = dict(apply_patch(pod, mutation.patch))
    verdict = webhook_verdict(out)
    assert verdict.allowed, verdict.message
    return out


def held_units(pod: Obj) -> int:
    return sum(int(c["resources"]["limits"].get(UNITS, 0)) for c in pod["spec"]["containers"])


@pytest.mark.parametrize("work", workloads(), ids=ident)
def test_kueue_counts_the_units_gpupool_pods_hold(work):
    pod = translated(pod_of(work))
    # a Job is admitted on its template, before gpupool's webhook; a bare pod after it
    counted_on = work["spec"]["template"]["spec"] if work["kind"] == "Job" else pod["spec"]
    counted = kueue_counts(counted_on)
    replicas = work["spec"].get("parallelism", 1) if work["kind"] == "Job" else 1
    assert counted.get(UNITS, 0) == held_units(pod) > 0, (
        f"{ident(work)}: Kueue counts {counted.get(UNITS, 0):g} {UNITS}, its pods hold {held_units(pod)}"
    )
    queue = named(
        "ClusterQueue",
        named("LocalQueue", work["metadata"]["labels"][QUEUE_LABEL], pod["metadata"]["namespace"])["spec"][
            "clusterQueue"
        ],
    )
    covered = {r for g in queue["spec"]["resourceGroups"] for r in g["coveredResources"]}
    assert set(counted) <= covered, f"{ident(work)} asks for {set(counted) - covered}, which Kueue would refuse"
    gpu = gpu_quota(queue)
    most = parse_units(gpu["nominalQuota"]) + parse_units(gpu.get("borrowingLimit", 0))
    assert replicas * counted[UNITS] <= most, f"{ident(work)} could never be admitted in {ident(queue)}"


def test_kueue_ignores_the_users_gpu_names_and_counts_the_units():
    names = list(USER_KEYS) + list(ALIASES)
    assert all(excluded(n) for n in names), [n for n in names if not excluded(n)]
    assert not excluded(UNITS)
    config = configuration()
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and config["kind"] == "Configuration"
    assert "quotaCheckStrategy" not in config["resources"], "Kueue refuses it beside excludeResourcePrefixes"
    # fair sharing on (the block's presence): idle quota lent by the ClusterQueues' weights
    assert config["fairSharing"]["preemptionStrategies"]


def test_a_job_without_units_would_be_counted_as_no_gpu():
    """Why the Jobs state the units: Kueue sees the template, with the user's names excluded."""
    (job, *_) = of_kind("Job")
    container = copy.deepcopy(job["spec"]["template"]["spec"]["containers"][0])
    del container["resources"]["limits"][UNITS]
    assert UNITS not in kueue_counts({"containers": [container]})


def test_the_crd_check_reads_a_folder_of_crds(tmp_path, monkeypatch):
    """The CRD machinery itself, on a small CRD of its own (so it is tested where Kueue's are not at hand)."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "spec": {
            "group": "example.gpupool.io",
            "names": {"kind": "Queue"},
            "versions": [
                {"name": "v1alpha1", "served": False},
                {
                    "name": "v1",
                    "served": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "properties": {"quota": {"x-kubernetes-int-or-string": True}},
                                },
                            },
                        }
                    },
                },
            ],
        },
    }
    (tmp_path / "manifests.yaml").write_text(
        "---\n" + yaml.safe_dump({"kind": "Namespace"}) + "---\n" + yaml.safe_dump(crd)
    )
    source = CrdSource(env="GPUPOOL_TEST_CRDS", project="Example", where="example CRDs")
    monkeypatch.setenv("GPUPOOL_TEST_CRDS", str(tmp_path))
    good = {"apiVersion": "example.gpupool.io/v1", "kind": "Queue", "metadata": {"name": "q"}, "spec": {"quota": "1.5"}}
    source.validate(good)
    with pytest.raises(AssertionError, match="spec: Additional properties"):
        source.validate({**good, "spec": {"quota": 1, "qouta": 2}})
    with pytest.raises(AssertionError, match="quota"):
        source.validate({**good, "spec": {"quota": [1]}})
    with pytest.raises(AssertionError, match=r"does not serve v1alpha1"):
        source.validate({**good, "apiVersion": "example.gpupool.io/v1alpha1"})
    with pytest.raises(AssertionError, match="no CRD"):
        source.validate({**good, "kind": "Cohort"})


def test_guide_job_is_the_example():
    """The Kubernetes guide's Kueue Job snippet says what deploy/examples/kueue/job-half-gpu.yaml does."""
    text = (DEPLOY.parent / "docs" / "guides" / "kubernetes.md").read_text()
    section = text.split("## Teams on a cluster: Kueue", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "no yaml block in the Kubernetes guide's Kueue section"
    snippet = yaml.safe_load(textwrap.dedent(block.group(1)))
    job = named("Job", "train-half-gpu", "team-a")
    assert snippet["metadata"]["labels"] == job["metadata"]["labels"]
    assert snippet["spec"]["suspend"] is job["spec"]["suspend"] is True
    template = job["spec"]["template"]
    assert snippet["spec"]["template"]["metadata"] == template["metadata"]
    (mine,), (theirs,) = snippet["spec"]["template"]["spec"]["containers"], template["spec"]["containers"]
    assert {k: v for k, v in theirs["resources"]["limits"].items() if k.startswith("gpupool.io/")} == mine["resources"][
        "limits"
    ]
