"""The Kubernetes manifests (deploy/kubernetes) as the cluster would get them: each overlay rendered by
``kubectl kustomize`` and checked object by object (security, probes, resources, GPU scheduling, network
policies, RBAC, settings names), and the Dockerfiles (deploy/docker) checked as text: no container engine
here, so none is built."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kube
from kubernetes.client import models as kube_models

from control_plane.autoscaler.kube import deployment_name
from sluice.settings import ENV_PREFIX, SettingsError, env_names, load_settings
from sluice.weights_digest import weights_digest

ROOT = Path(__file__).resolve().parents[2]
KUBE_DIR = ROOT / "deploy" / "kubernetes"
DOCKER_DIR = ROOT / "deploy" / "docker"
# The Terraform root every environment is planned from, and its per-environment inputs (envs/<env>.tfvars).
TERRAFORM_ROOT = ROOT / "deploy" / "terraform" / "sluice"
OVERLAYS = ["dev", "prod"]
REPLICA_PORTS = {8000, 8001, 8002}
TRITON_IMAGE = re.compile(r"^nvcr\.io/nvidia/tritonserver:[0-9.]+-trtllm-python-py3$")
# What control_plane/autoscaler/kube.py calls: read/patch deployments/scale, patch pods (and get/list to
# find them); nothing more.
ACTUATOR_RULES = {("apps", "deployments/scale"): {"get", "patch"}, ("", "pods"): {"get", "list", "patch"}}
# The overlays' placeholder for the AWS account, and what the operator puts there (docs/operations.md step 6).
ACCOUNT_PLACEHOLDER = "ACCOUNT_ID"
EXAMPLE_ACCOUNT = "123456789012"

Obj = dict[str, Any]


@cache
def rendered(overlay: str) -> tuple[Obj, ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered")
    out = subprocess.run(
        [kubectl, "kustomize", str(KUBE_DIR / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{out.stderr}"
    return tuple(obj for obj in yaml.safe_load_all(out.stdout) if obj)


def of_kind(objs: tuple[Obj, ...], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(objs: tuple[Obj, ...]) -> Iterator[tuple[Obj, Obj]]:
    """(object, pod spec) of every Deployment and Job."""
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            yield o, o["spec"]["template"]["spec"]


def replica_deployments(objs: tuple[Obj, ...]) -> list[Obj]:
    return [
        o
        for o in of_kind(objs, "Deployment")
        if o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "replica"
    ]


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def objs(overlay: str) -> tuple[Obj, ...]:
    return rendered(overlay)


def test_every_object_matches_the_kubernetes_api_schema(objs: tuple[Obj, ...]) -> None:
    """Against the official client's models (the API's OpenAPI types): no field the API does not know
    (a typo the API server would drop or refuse), no required field missing, every value of its type."""
    for obj in objs:
        type_name = obj["apiVersion"].split("/")[-1].capitalize() + obj["kind"]
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert unknown_fields(obj, type_name, where) == []
        kube.ApiClient().deserialize(_Response(obj), type_name)  # ValueError: a required field missing


def test_every_container_is_bounded_and_unprivileged(objs: tuple[Obj, ...]) -> None:
    for obj, pod in workloads(objs):
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["securityContext"].get("runAsUser", 0) != 0, where
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), where
        for c in pod.get("initContainers", []) + pod["containers"]:
            at = f"{where} container {c['name']}"
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"].get(bound, {})), f"{at}: {bound}"
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, at
            assert sc["allowPrivilegeEscalation"] is False, at
            assert sc["readOnlyRootFilesystem"] is True, at
            assert sc["capabilities"]["drop"] == ["ALL"], at
            assert not sc.get("privileged") and "add" not in sc["capabilities"], at


def test_long_running_containers_have_readiness_probes(objs: tuple[Obj, ...]) -> None:
    for obj in of_kind(objs, "Deployment"):
        for c in obj["spec"]["template"]["spec"]["containers"]:
            assert "readinessProbe" in c, f"{obj['metadata']['name']} container {c['name']}"
    gateway = named(objs, "Deployment", "sluice-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_replicas_run_on_gpu_nodes_and_are_ready_when_their_version_is(objs: tuple[Obj, ...]) -> None:
    replicas = replica_deployments(objs)
    assert replicas, "no replica Deployment"
    for obj in replicas:
        pod = obj["spec"]["template"]["spec"]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        model, version = labels["sluice.io/model"], labels["sluice.io/version"]
        assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in (
            pod["tolerations"]
        )
        assert pod["nodeSelector"] == {"sluice.io/role": "replica"}
        triton = next(c for c in pod["containers"] if c["name"] == "triton")
        assert TRITON_IMAGE.match(triton["image"]), triton["image"]
        assert triton["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"
        ready = triton["readinessProbe"]["httpGet"]
        assert ready["path"] == f"/v2/models/{model}/versions/{version}/ready"
        startup = triton["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "a cold start takes minutes"
        assert "preStop" in triton["lifecycle"]
        assert pod["terminationGracePeriodSeconds"] > 60
        # The autoscaler finds it by SLUICE_AUTOSCALER_KUBE_DEPLOYMENT filled with its labels, and owns
        # its count (an apply must not reset it).
        assert obj["metadata"]["name"] == deployment_name(
            config(objs)["SLUICE_AUTOSCALER_KUBE_DEPLOYMENT"], model, version
        )
        assert "replicas" not in obj["spec"]


def test_replica_init_containers_fetch_through_the_weight_store(objs: tuple[Obj, ...]) -> None:
    for obj in replica_deployments(objs):
        pod = obj["spec"]["template"]["spec"]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        model, version = labels["sluice.io/model"], labels["sluice.io/version"]
        fetch = pod["initContainers"][0]
        command = " ".join(fetch["command"] + fetch.get("args", []))
        assert "python -m sluice.weight_store --quiet fetch" in command
        uri = next(e["value"] for e in fetch["env"] if e["name"] == "ARTIFACT_URI")
        # Where `sluice build-engine` puts the version's artifact by default: a copied template that
        # kept another version's URI would serve the wrong weights (the digest check would refuse it).
        assert re.fullmatch(rf"s3://[a-z0-9.-]+/engines/{model}/{version}/?", uri), uri
        env = {e["name"]: e.get("value") for e in pod["initContainers"][1]["env"]}
        assert (env["MODEL_NAME"], env["MODEL_VERSION"]) == (model, version)
        registrar = next(c for c in pod["containers"] if c["name"] == "registrar")
        assert f'"$POD_NAME" {model} {version} ' in " ".join(registrar["args"])
        mounts = {m["name"]: m["mountPath"] for m in fetch["volumeMounts"]}
        cache_dir = next(e["value"] for e in fetch["env"] if e["name"] == "SLUICE_WEIGHT_CACHE_DIR")
        assert cache_dir.startswith(mounts["weight-cache"] + "/")
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes["weight-cache"] or "hostPath" in volumes["weight-cache"]
        # The render script the next init container runs is shipped beside the manifests, and imports.
        render = pod["initContainers"][1]
        assert render["command"] == ["python", "/opt/sluice-scripts/render_repository.py"]
        assert (KUBE_DIR / "base" / "render_repository.py").is_file()


@pytest.mark.parametrize("digest_ok", [True, False])
def test_render_init_container_script_renders_the_cached_artifact(tmp_path: Path, digest_ok: bool) -> None:
    """The replica's render step as its init container runs it, on the dev checkpoint as a cpu artifact:
    the repository is written when the registry's digest matches, refused (exit 1, nothing served) when
    it does not."""
    checkpoint = ROOT / ".sluice" / "models" / "sluice-tiny"
    if not (checkpoint / "config.json").is_file():
        pytest.skip(f"no dev checkpoint at {checkpoint} (make installs it)")
    (tmp_path / "artifact-dir").write_text(f"{checkpoint}\n")
    digest = weights_digest(checkpoint) if digest_ok else "0" * 64
    env = {
        "PATH": "/usr/bin:/bin",
        "ARTIFACT_DIR_FILE": str(tmp_path / "artifact-dir"),
        "REPOSITORY_DIR": str(tmp_path / "repository"),
        "MODEL_NAME": "sluice-tiny",
        "MODEL_VERSION": "1",
        "BUILD_CONFIG_JSON": '{"target": "cpu"}',
        "WEIGHTS_DIGEST": digest,
    }
    script = KUBE_DIR / "base" / "render_repository.py"
    out = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    config = tmp_path / "repository" / "sluice-tiny" / "config.pbtxt"
    if digest_ok:
        assert out.returncode == 0, out.stderr
        assert digest in config.read_text()
    else:
        assert out.returncode == 1 and "weights digest" in out.stderr, out.stderr
        assert not config.exists()


def test_gpu_workloads_are_the_only_ones_on_gpu_nodes(objs: tuple[Obj, ...]) -> None:
    for obj, pod in workloads(objs):
        wants_gpu = any("nvidia.com/gpu" in c["resources"]["limits"] for c in pod["containers"])
        tolerates = any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", []))
        assert wants_gpu == tolerates, obj["metadata"]["name"]
    job = named(objs, "Job", "sluice-build-engine-example")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sluice", "build-engine"]
    assert job["spec"]["suspend"] is True, "an apply must not start a build"


def test_network_policies_deny_by_default_and_fence_replicas_and_datastores(
    objs: tuple[Obj, ...], overlay: str
) -> None:
    policies = of_kind(objs, "NetworkPolicy")
    deny = [
        p
        for p in policies
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no default-deny policy"

    # Ingress to replicas: only from gateway and control-plane pods, only on Triton's ports.
    replica_labels = replica_deployments(objs)[0]["spec"]["template"]["metadata"]["labels"]
    to_replicas = [
        p for p in policies if "Ingress" in p["spec"]["policyTypes"] and selects(p, replica_labels)
    ]
    assert any(p["spec"].get("ingress") for p in to_replicas), "nothing may reach replicas"
    for p in to_replicas:
        for rule in p["spec"].get("ingress", []):
            assert rule.get("from"), f"{p['metadata']['name']}: ingress from anywhere"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, f"{p['metadata']['name']}: {peer}"
                assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] in (
                    "gateway",
                    "control-plane",
                )
            assert ports_of(rule) <= REPLICA_PORTS

    # Egress to PostgreSQL and Redis: only to the VPC, only from labelled Sluice pods.
    datastore_ports = {5432, 6379}
    for p in policies:
        for rule in p["spec"].get("egress", []):
            if ports_of(rule) & datastore_ports:
                assert p["spec"]["podSelector"] == {"matchLabels": {"sluice.io/datastore-client": "true"}}
                assert ports_of(rule) == datastore_ports
                assert [peer["ipBlock"]["cidr"] for peer in rule["to"]] == [vpc_cidr(overlay)]
    labelled = {
        o["metadata"]["name"]
        for o, pod in workloads(objs)
        if o["spec"]["template"]["metadata"]["labels"].get("sluice.io/datastore-client") == "true"
    }
    assert labelled == {"sluice-gateway", "sluice-control-plane"}


def test_hpa_and_disruption_budgets_exist_with_overlay_bounds(objs: tuple[Obj, ...]) -> None:
    hpa = named(objs, "HorizontalPodAutoscaler", "sluice-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "sluice-gateway"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in named(objs, "Deployment", "sluice-gateway")["spec"], "the HPA owns the count"
    pdbs = {p["metadata"]["name"] for p in of_kind(objs, "PodDisruptionBudget")}
    assert {"sluice-gateway", "sluice-control-plane", "sluice-replica-sluice-tiny-1"} <= pdbs
    assert named(objs, "Service", "sluice-control-plane")["spec"]["ports"][0]["port"] == 8090


def test_overlays_differ_where_they_should() -> None:
    dev, prod = rendered("dev"), rendered("prod")
    hpa_dev = named(dev, "HorizontalPodAutoscaler", "sluice-gateway")["spec"]
    hpa_prod = named(prod, "HorizontalPodAutoscaler", "sluice-gateway")["spec"]
    assert hpa_dev["minReplicas"] == 1 and hpa_prod["minReplicas"] >= 3
    assert hpa_prod["maxReplicas"] > hpa_dev["maxReplicas"]
    assert named(prod, "PodDisruptionBudget", "sluice-gateway")["spec"]["minAvailable"] >= 2
    cpu = [
        named(o, "Deployment", "sluice-gateway")["spec"]["template"]["spec"]["containers"][0]["resources"][
            "requests"
        ]["cpu"]
        for o in (dev, prod)
    ]
    assert cpu == ["500m", "2"]
    for objs, env in ((dev, "dev"), (prod, "prod")):
        for sa in of_kind(objs, "ServiceAccount"):
            arn = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
            assert re.fullmatch(rf"arn:aws:iam::ACCOUNT_ID:role/sluice-{env}-[a-z-]+", arn), arn


def test_every_sluice_env_name_is_a_setting(objs: tuple[Obj, ...]) -> None:
    known = set(env_names())
    used = set(config(objs))
    for _, pod in workloads(objs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            used |= {e["name"] for e in c.get("env", [])}
            for source in c.get("envFrom", []):
                assert source["configMapRef"]["name"] == config_name(objs)
    sluice_names = {n for n in used if n.startswith("SLUICE_")}
    assert sluice_names, "no SLUICE_* name found"
    assert sluice_names <= known, f"not settings: {sorted(sluice_names - known)}"
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for _, pod in workloads(objs)
        for c in pod["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert {"SLUICE_DATABASE_URL", "SLUICE_REDIS_URL", "SLUICE_ADMIN_TOKEN"} <= set(secrets)
    assert not of_kind(objs, "Secret"), "secrets are created out of band, never in the repository"


SECRET_VALUES = {
    "SLUICE_DATABASE_URL": "postgresql://sluice:pw@db.internal:5432/sluice?sslmode=require",
    "SLUICE_REDIS_URL": "rediss://:token@redis.internal:6379/0",
    "SLUICE_ADMIN_TOKEN": "sladm-example",
}


def container_environ(objs: tuple[Obj, ...], container: Obj, account: str) -> dict[str, str]:
    """A container's SLUICE_* environment as the cluster would give it: the ConfigMap, its own values, a
    URL of the right scheme per Secret; the overlay's account placeholder replaced by ``account``."""
    environ = dict(config(objs)) if container.get("envFrom") else {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {})
        if "value" in e:
            environ[e["name"]] = e["value"]
        elif "secretKeyRef" in ref and not ref["secretKeyRef"].get("optional"):
            environ[e["name"]] = SECRET_VALUES[e["name"]]
        elif "configMapKeyRef" in ref:
            environ[e["name"]] = config(objs)[ref["configMapKeyRef"]["key"]]
    return {
        name: value.replace(ACCOUNT_PLACEHOLDER, account)
        for name, value in environ.items()
        if name.startswith(ENV_PREFIX)
    }


def load_with(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
            m.delenv(name)
        for name, value in environ.items():
            m.setenv(name, value)
        load_settings()  # SettingsError names the variable at fault


def test_each_process_settings_load_from_its_environment(
    objs: tuple[Obj, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values too, not just the names: each Deployment container's SLUICE_* environment, once the
    operator has put the account in (docs/operations.md step 6), passes Settings' checks."""
    for obj in of_kind(objs, "Deployment"):
        for c in obj["spec"]["template"]["spec"]["containers"]:
            load_with(monkeypatch, container_environ(objs, c, EXAMPLE_ACCOUNT))


def test_gateways_share_the_files_bucket_and_send_telemetry_to_stdout_and_redis(
    objs: tuple[Obj, ...], overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's gateways must share one files store (the default, a directory per pod, would show each
    gateway only its own files) and one telemetry stream: SLUICE_FILES_URL is the environment's files
    bucket as Terraform names it by default, and a gateway whose overlay still holds the account
    placeholder refuses to start, naming SLUICE_FILES_URL, rather than run with a wrong store."""
    gateway = named(objs, "Deployment", "sluice-gateway")["spec"]["template"]["spec"]["containers"][0]
    environ = container_environ(objs, gateway, EXAMPLE_ACCOUNT)
    # The root: bucket "${local.name}-files-<account id>", local.name "sluice-${var.environment}", prefix
    # files; envs/<overlay>.tfvars: environment = "<overlay>".
    assert environ["SLUICE_FILES_URL"] == f"s3://sluice-{overlay}-files-{EXAMPLE_ACCOUNT}/files"
    main_tf = (TERRAFORM_ROOT / "main.tf").read_text()
    assert (
        'name = "sluice-${var.environment}"' in main_tf
        and '"${local.name}-files-${data.aws_caller_identity' in main_tf
    )
    assert terraform_input(overlay, "environment") == f'"{overlay}"'
    assert environ["SLUICE_TELEMETRY_SINKS"] == "stdout,redis"
    redis = next(e for e in gateway["env"] if e["name"] == "SLUICE_REDIS_URL")
    assert not redis["valueFrom"]["secretKeyRef"].get("optional"), "the redis sink needs SLUICE_REDIS_URL"
    with pytest.raises(SettingsError, match="SLUICE_FILES_URL="):
        load_with(monkeypatch, container_environ(objs, gateway, ACCOUNT_PLACEHOLDER))


def test_rbac_allows_exactly_what_the_actuator_calls(objs: tuple[Obj, ...]) -> None:
    assert not of_kind(objs, "ClusterRole") and not of_kind(objs, "ClusterRoleBinding")
    role = named(objs, "Role", "sluice-control-plane-actuator")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == ACTUATOR_RULES
    binding = named(objs, "RoleBinding", "sluice-control-plane-actuator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sluice-control-plane", "namespace": "sluice"}
    ]
    deployment = named(objs, "Deployment", "sluice-control-plane")["spec"]["template"]["spec"]
    assert deployment["serviceAccountName"] == "sluice-control-plane"
    sa = named(objs, "ServiceAccount", "sluice-control-plane")
    assert "eks.amazonaws.com/role-arn" in sa["metadata"]["annotations"]
    for other in ("sluice-gateway", "sluice-replica", "sluice-build"):
        assert named(objs, "ServiceAccount", other)["automountServiceAccountToken"] is False


# ---------------------------------------------------------------- Dockerfiles


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def entry_module(args: str) -> str:
    """The Python module an ENTRYPOINT (exec form) runs: ``python -m X``, or a console script's."""
    argv = json.loads(args)
    if argv[:2] in (["python", "-m"], ["python3", "-m"]):
        return str(argv[2])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] in scripts, f"{argv[0]} is neither python -m nor a console script"
    return str(scripts[argv[0]].split(":")[0])


@pytest.mark.parametrize("name", ["gateway", "control-plane", "cpu-replica", "build-engine"])
def test_dockerfile_is_multistage_non_root_and_runs_a_real_module(name: str) -> None:
    path = DOCKER_DIR / f"{name}.Dockerfile"
    steps = dockerfile_instructions(path)
    words = [w for w, _ in steps]
    first = next(w for w in words if w != "ARG")
    assert first == "FROM", f"{path.name}: the first instruction is {first}"
    assert words.count("FROM") >= 2, f"{path.name}: not multi-stage"
    users = [a for w, a in steps if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"{path.name}: runs as root"
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "FROM"), (
        "USER before the last FROM"
    )
    entry = [a for w, a in steps if w == "ENTRYPOINT"]
    assert len(entry) == 1, f"{path.name}: one exec-form ENTRYPOINT expected"
    module = entry_module(entry[0])
    assert find_spec(module) is not None, f"{path.name}: no module {module}"
    text = path.read_text()
    assert not re.search(r"(?i)(password|secret|token|aws_access_key)\s*=", text), f"{path.name}: a secret?"
    for w, args in steps:
        if w == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for source in sources:
                assert not source.startswith("."), f"{path.name} copies {source} (state, virtualenvs)"
                assert list(ROOT.glob(source)), f"{path.name}: COPY {source} matches nothing"


# ---------------------------------------------------------------- helpers


def selects(policy: Obj, labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", "only In is understood here"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def ports_of(rule: Obj) -> set[int]:
    ports: set[int] = set()
    for p in rule.get("ports", []):
        ports.update(range(p["port"], p.get("endPort", p["port"]) + 1))
    return ports


def config_name(objs: tuple[Obj, ...]) -> str:
    names = [
        c["metadata"]["name"]
        for c in of_kind(objs, "ConfigMap")
        if c["metadata"]["name"].startswith("sluice-config")
    ]
    assert len(names) == 1, names
    return names[0]


def config(objs: tuple[Obj, ...]) -> dict[str, str]:
    return dict(named(objs, "ConfigMap", config_name(objs))["data"])


def terraform_input(overlay: str, name: str) -> str | None:
    """A value as the environment's var file (envs/<overlay>.tfvars) writes it, quotes kept; None when
    the file does not set it."""
    text = (TERRAFORM_ROOT / "envs" / f"{overlay}.tfvars").read_text()
    m = re.search(rf"^\s*{re.escape(name)}\s*=\s*(.+?)\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


def vpc_cidr(overlay: str) -> str:
    """The VPC CIDR Terraform gives that environment (``cidr = "..."`` in its var file)."""
    cidr = terraform_input(overlay, "cidr")
    assert cidr is not None, f"envs/{overlay}.tfvars sets no cidr"
    return cidr.strip('"')


class _Response:
    """What ``ApiClient.deserialize`` reads: an API response's JSON body."""

    def __init__(self, obj: Obj) -> None:
        self.data = json.dumps(obj)


_PRIMITIVES = {"str", "int", "float", "bool", "object", "datetime", "date"}


def unknown_fields(data: Any, type_name: str, path: str) -> list[str]:
    """Every key under ``data`` that the client model ``type_name`` (e.g. V1Deployment) does not have."""
    if type_name.startswith("list["):
        return [e for i, x in enumerate(data) for e in unknown_fields(x, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("dict("):
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        return [e for k, v in data.items() for e in unknown_fields(v, inner, f"{path}.{k}")]
    if type_name in _PRIMITIVES:
        return []
    model = getattr(kube_models, type_name)
    if not isinstance(data, dict):
        return [f"{path}: {type_name} expected, got {type(data).__name__}"]
    attribute_by_key = {key: attr for attr, key in model.attribute_map.items()}
    errors = []
    for key, value in data.items():
        if key not in attribute_by_key:
            errors.append(f"{path}.{key}: no such field in {type_name}")
        else:
            errors += unknown_fields(value, model.openapi_types[attribute_by_key[key]], f"{path}.{key}")
    return errors
