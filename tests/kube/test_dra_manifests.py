"""deploy/dra (the DRA component) and deploy/examples/dra, rendered by kubectl's own kustomize and
checked against the API schemas of Kubernetes 1.34 to 1.37 (resource.k8s.io/v1 is GA from 1.34)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import yaml

from gpupool.cli.main import build_parser
from gpupool.core.model import Device
from gpupool.kube.dra import DEFAULT_DRIVER as DRIVER
from gpupool.kube.dra.allocation import MEMORY
from gpupool.kube.dra.cdi import DEFAULT_CDI_DIR
from gpupool.kube.dra.registration import kubelet_root, registration_socket, service_socket
from gpupool.kube.dra.slices import SHARE_STEP_MIB, device_entry

from .test_deploy_render import DEPLOY, fresh_copy, render, with_certs

EXAMPLES = DEPLOY / "examples" / "dra"
VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
KUBELET_ROOT = "/var/lib/kubelet"


def add_dra(deploy: Path) -> Path:
    """`- dra` added to the components of a copy of deploy/."""
    path = deploy / "kustomization.yaml"
    kust = yaml.safe_load(path.read_text())
    assert "dra" not in (kust["components"] or []), (
        "deploy/ enables dra by default: the device-plugin path must stay the default"
    )
    kust["components"] = [*(kust["components"] or []), "dra"]
    path.write_text(yaml.safe_dump(kust, sort_keys=False))
    return deploy


@pytest.fixture(scope="module")
def rendered_fresh(tmp_path_factory) -> List[Dict[str, Any]]:
    """deploy/ of a fresh checkout (no deploy/certs.sh yet) with `- dra` added."""
    return render(add_dra(fresh_copy(tmp_path_factory.mktemp("dra-fresh") / "deploy")))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> List[Dict[str, Any]]:
    """deploy/ after deploy/certs.sh (its TLS component written and added), with `- dra` added."""
    target = with_certs(tmp_path_factory.mktemp("dra") / "deploy")
    assert yaml.safe_load((target / "kustomization.yaml").read_text())["components"] == ["tls"]
    return render(add_dra(target))


def one(objects: List[Dict[str, Any]], kind: str, name: str) -> Dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def agent_container(objects: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    pod = one(objects, "DaemonSet", "gpupool-agent")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "agent"]
    return pod, container


def flag(args: List[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) == 1, f"{name}: {values}"
    return values[0]


def host_path_of(pod: Dict[str, Any], container: Dict[str, Any], mount_path: str) -> str:
    """The host folder the container sees at mount_path (a hostPath volume mounted there)."""
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == mount_path]
    assert not mount.get("readOnly"), f"{mount_path} is mounted read-only"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "hostPath" in volume, f"{mount_path} is not a hostPath volume"
    return str(volume["hostPath"]["path"])


def examples() -> List[Tuple[str, Dict[str, Any]]]:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files, f"no examples in {EXAMPLES}"
    return [(f.name, d) for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def example(file: str, kind: str) -> Dict[str, Any]:
    (found,) = [d for name, d in examples() if name == file and d["kind"] == kind]
    return found


def validate(obj: Dict[str, Any], version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as err:
        raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {str(err).splitlines()[0]}") from None
    except kv.SchemaNotFoundError:
        pytest.skip(
            f"kubernetes-validate {kv.__version__} has no schema for {obj['apiVersion']} {obj['kind']} in {version}"
        )
    except Exception as err:  # VersionNotSupportedError: no schemas at all for this release in the wheel
        pytest.skip(f"kubernetes-validate {kv.__version__} has no schemas for {version}: {type(err).__name__}")


# --- the component ---------------------------------------------------------------------------


def test_component_renders_alone_without_namespacing_the_deviceclass():
    """`kubectl kustomize deploy/dra`: what the component adds of its own (the agent patch needs deploy/)."""
    objects = render(DEPLOY / "dra")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == [
        ("ClusterRole", "gpupool-agent-dra"),
        ("ClusterRoleBinding", "gpupool-agent-dra"),
        ("DeviceClass", DRIVER),
    ]


def test_agent_runs_the_dra_plugin_beside_the_device_plugin(rendered):
    pod, container = agent_container(rendered)
    args = container["args"]
    assert "--dra" in args
    assert flag(args, "--driver") == DRIVER
    # the rendered command line is one the agent accepts, and means DRA for our driver, both plugins
    parsed = build_parser().parse_args(container["command"][1:] + args)
    assert parsed.dra and parsed.driver == DRIVER and not parsed.no_device_plugin
    assert parsed.cdi_dir == DEFAULT_CDI_DIR
    # the sockets the agent makes from its --kubelet-dir lie in the kubelet folders mounted from the host
    root = kubelet_root(parsed.kubelet_dir)
    assert root == KUBELET_ROOT
    for socket, folder in (
        (registration_socket(root, DRIVER), "plugins_registry"),
        (service_socket(root, DRIVER), "plugins"),
    ):
        assert socket.startswith(f"{KUBELET_ROOT}/{folder}/"), socket
    # the device plugin stays: the same agent serves gpupool.io/gpu pods and DRA claims from one pool
    assert flag(args, "--kubelet-dir") == f"{KUBELET_ROOT}/device-plugins"
    assert host_path_of(pod, container, f"{KUBELET_ROOT}/device-plugins") == f"{KUBELET_ROOT}/device-plugins"
    # where the kubelet looks for DRA plugins: registration and the driver's service socket
    for folder in ("plugins_registry", "plugins"):
        assert host_path_of(pod, container, f"{KUBELET_ROOT}/{folder}") == f"{KUBELET_ROOT}/{folder}"
    # CDI specs where containerd and CRI-O read them
    assert host_path_of(pod, container, parsed.cdi_dir) == "/var/run/cdi"
    # the node's name for its ResourceSlices
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]


def test_deviceclass_selects_the_driver_the_agent_serves(rendered):
    _, container = agent_container(rendered)
    driver = flag(container["args"], "--driver")
    dc = one(rendered, "DeviceClass", DRIVER)
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert "namespace" not in dc["metadata"], "DeviceClass is cluster-scoped"
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{driver}"'}}]


def test_rbac_lets_the_agent_publish_slices_and_read_claims(rendered):
    pod, _ = agent_container(rendered)
    binding = one(rendered, "ClusterRoleBinding", "gpupool-agent-dra")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "gpupool-system"}
    ]
    role = one(rendered, "ClusterRole", binding["roleRef"]["name"])

    def verbs(group: str, resource: str) -> set:
        return {v for r in role["rules"] if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}

    assert verbs("resource.k8s.io", "resourceslices") == {"get", "list", "watch", "create", "update", "patch", "delete"}
    assert verbs("resource.k8s.io", "resourceclaims") == {"get", "list", "watch"}
    assert verbs("", "nodes") == {"get"}
    # least privilege: nothing beyond those
    assert {res for r in role["rules"] for res in r["resources"]} == {"resourceslices", "resourceclaims", "nodes"}


def test_the_device_plugin_path_is_untouched(rendered, tmp_path):
    """The component only adds: every object of plain deploy/ renders the same, but the agent."""
    plain = {(o["kind"], o["metadata"]["name"]) for o in render(with_certs(tmp_path / "deploy"))}
    with_dra = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    assert with_dra - plain == {
        ("ClusterRole", "gpupool-agent-dra"),
        ("ClusterRoleBinding", "gpupool-agent-dra"),
        ("DeviceClass", DRIVER),
    }
    assert plain <= with_dra


@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_objects_pass_each_releases_schema(rendered, version):
    for obj in rendered:
        validate(obj, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_fresh_checkout_renders_the_component_too(rendered, rendered_fresh, version):
    """Before deploy/certs.sh: the same objects less the TLS Secrets, each valid."""
    fresh = {(o["kind"], o["metadata"]["name"]) for o in rendered_fresh}
    with_tls = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    assert with_tls - fresh == {
        ("Secret", "gpupool-webhook-tls"),
        ("Secret", "gpupool-agent-ca"),
        ("Secret", "gpupool-agent-token"),
    }
    assert fresh <= with_tls
    for obj in rendered_fresh:
        validate(obj, version)


# --- the examples ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_examples_pass_each_releases_schema(version):
    for _, obj in examples():
        validate(obj, version)


def test_examples_are_the_four_claims():
    templates = {d["metadata"]["name"] for _, d in examples() if d["kind"] == "ResourceClaimTemplate"}
    assert templates == {"gpu-8gib", "half-gpu", "two-gpus", "a100-or-h100"}


def test_every_pod_uses_a_claim_of_its_own_file_on_the_gpupool_class(rendered):
    deviceclass = one(rendered, "DeviceClass", DRIVER)["metadata"]["name"]
    pods = [(name, d) for name, d in examples() if d["kind"] == "Pod"]
    assert len(pods) == 4
    for file, pod in pods:
        template_names = {
            d["metadata"]["name"] for n, d in examples() if n == file and d["kind"] == "ResourceClaimTemplate"
        }
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["spec"]["resourceClaims"]}
        assert set(claims.values()) <= template_names, file
        for container in pod["spec"]["containers"]:
            assert {c["name"] for c in container["resources"]["claims"]} <= set(claims), file
        assert pod["metadata"]["namespace"] == example(file, "ResourceClaimTemplate")["metadata"]["namespace"]
    for _, d in examples():
        if d["kind"] == "ResourceClaimTemplate":
            for request in d["spec"]["spec"]["devices"]["requests"]:
                for sub in [request["exactly"]] if "exactly" in request else request["firstAvailable"]:
                    assert sub["deviceClassName"] == deviceclass


def requests_of(file: str) -> List[Dict[str, Any]]:
    return example(file, "ResourceClaimTemplate")["spec"]["spec"]["devices"]["requests"]


def test_8gib_is_a_share_of_one_gpu_by_consumable_capacity():
    (request,) = requests_of("gpu-8gib.yaml")
    exactly = request["exactly"]
    assert exactly.get("allocationMode", "ExactCount") == "ExactCount" and exactly.get("count", 1) == 1
    assert exactly["capacity"] == {"requests": {"memory": "8Gi"}}


def test_two_whole_gpus_is_exactly_two_devices_without_a_share():
    (request,) = requests_of("two-gpus.yaml")
    exactly = request["exactly"]
    assert exactly["allocationMode"] == "ExactCount" and exactly["count"] == 2
    assert "capacity" not in exactly  # the requestPolicy default: the whole GPU


def test_a100_or_h100_selects_on_the_product_name():
    (request,) = requests_of("a100-or-h100.yaml")
    (selector,) = request["exactly"]["selectors"]
    expr = selector["cel"]["expression"]
    assert expr == f'device.attributes["{DRIVER}"].productName.matches("A100|H100")'
    pattern = re.search(r'matches\("([^"]+)"\)', expr).group(1)
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA A100-PCIE-40GB"):
        assert re.search(pattern, name), name
    for name in ("NVIDIA H200", "NVIDIA L4", "Tesla T4"):
        assert not re.search(pattern, name), name


def gib(quantity: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", quantity)
    assert match, quantity
    return float(match.group(1)) / (1024 if match.group(2) == "Mi" else 1)


def test_half_gpu_asks_half_of_each_memory_class_largest_first():
    (request,) = requests_of("half-gpu.yaml")
    subs = request["firstAvailable"]
    assert len(subs) >= 2
    floors = []
    for sub in subs:
        (selector,) = sub["selectors"]
        expr = selector["cel"]["expression"]
        match = re.fullmatch(
            rf'device\.capacity\["{re.escape(DRIVER)}"\]\.memory\.compareTo\(quantity\("([^"]+)"\)\) >= 0', expr
        )
        assert match, expr
        floor = gib(match.group(1))
        share = gib(sub["capacity"]["requests"]["memory"])
        # two such shares fit any GPU this sub-request can land on, and neither is less than half its floor
        assert share * 2 == floor, sub["name"]
        floors.append(floor)
    # the scheduler takes the first that fits: the largest class first, or a big GPU would get a small half
    assert floors == sorted(floors, reverse=True)
    # an H100 80GB as NVML shows it less the driver reserve (81,559 MiB) lands in a class, and gets
    # no more than half of it
    h100 = 81559 / 1024
    fit = next(f for f in floors if h100 >= f)
    assert fit / 2 <= h100 / 2 and fit / 2 >= h100 / 2 * 0.9


def guide_dra_yaml() -> List[Dict[str, Any]]:
    text = (DEPLOY.parent / "docs" / "guides" / "kubernetes-dra.md").read_text()
    section = text.split("## A pod holding 8 GiB of one GPU", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return [d for d in yaml.safe_load_all(block) if d]


@pytest.mark.parametrize("version", VERSIONS)
def test_guide_claim_is_the_example_and_valid(version):
    template, pod = guide_dra_yaml()
    example_template = example("gpu-8gib.yaml", "ResourceClaimTemplate")
    assert template["metadata"] == example_template["metadata"]
    (request,), (example_request,) = template["spec"]["spec"]["devices"]["requests"], requests_of("gpu-8gib.yaml")
    assert request["exactly"]["capacity"] == example_request["exactly"]["capacity"]
    assert request["exactly"]["deviceClassName"] == example_request["exactly"]["deviceClassName"] == DRIVER
    assert pod["spec"]["resourceClaims"] == example("gpu-8gib.yaml", "Pod")["spec"]["resourceClaims"]
    validate(template, version)
    validate(pod, version)


def test_examples_name_only_what_the_agent_publishes():
    """Attributes and capacities in the examples' CEL and capacity requests are those of the slice,
    and every share is whole steps of the requestPolicy (the scheduler would round it up)."""
    entry = device_entry(
        Device(uuid="GPU-1", index=0, name="NVIDIA H100 80GB HBM3", memory_mib=81559),
        {"driverVersion": "570.86.15", "cudaComputeCapability": "9.0"},
    )
    text = "\n".join(f.read_text() for f in sorted(EXAMPLES.glob("*.yaml")))
    attributes = set(re.findall(rf'device\.attributes\["{re.escape(DRIVER)}"\]\.(\w+)', text))
    capacities = set(re.findall(rf'device\.capacity\["{re.escape(DRIVER)}"\]\.(\w+)', text))
    assert attributes == {"productName"} and attributes <= set(entry["attributes"])
    assert capacities == {MEMORY} and capacities <= set(entry["capacity"])
    assert not re.search(r'device\.(attributes|capacity)\["(?!' + re.escape(DRIVER) + '")', text)  # no other domain
    shares = []
    for _, d in examples():
        if d["kind"] == "ResourceClaimTemplate":
            for request in d["spec"]["spec"]["devices"]["requests"]:
                for sub in [request["exactly"]] if "exactly" in request else request["firstAvailable"]:
                    asked = (sub.get("capacity") or {}).get("requests") or {}
                    assert set(asked) <= set(entry["capacity"]), asked
                    shares += [gib(q) * 1024 for q in asked.values()]
    assert shares and all(mib % SHARE_STEP_MIB == 0 for mib in shares), shares
