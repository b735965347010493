"""A deployment as things to run: one launch line per instance kind (the engine flags come
from ``slotune.tuner.export``, the one table of them), the router's command and settings,
and Kubernetes manifests (a Deployment and a Service per instance kind, plus the router).

Disaggregation adds each engine's own transfer settings: vLLM's NIXL connector
(``--kv-transfer-config``), SGLang's ``--disaggregation-mode``. The router is SGLang's
(``sglang_router.launch_router``; vLLM's router is its fork and takes the same flags).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from slotune.cluster.report import instance_kinds
from slotune.cluster.spec import ClusterSpec, InstanceSpec

ENGINES = ("vllm", "sglang")
PORT = 8000
ROUTER_PORT = 8080  # its Prometheus metrics on 29000, the router's default
ROLE_LABEL = "slotune.io/role"  # mixed | prefill | decode: how the router finds its pods
IMAGES = {"vllm": "vllm/vllm-openai:latest", "sglang": "lmsysorg/sglang:latest"}
ROUTER_IMAGE = "lmsysorg/sglang:latest"

_ROUTER_POLICY = {
    "round-robin": ("round_robin", None),
    "prefix-aware": ("cache_aware", None),
    "least-outstanding": (
        "power_of_two",
        "the router has no least-outstanding policy: power_of_two (the less loaded of two "
        "random workers) is the nearest",
    ),
    "least-kv": (
        "power_of_two",
        "the router has no least-KV-load policy: power_of_two (the less loaded of two "
        "random workers) is the nearest",
    ),
}


def kind_name(inst: InstanceSpec, k: int) -> str:
    """A DNS-1035 name for instance kind ``k``: ``prefill-tp2``, ``mixed-tp1-pp2``..."""
    pp = f"-pp{inst.pp}" if inst.pp > 1 else ""
    return f"{inst.role}-tp{inst.tp}{pp}" + (f"-{k}" if k else "")


def _pipeline_args(inst: InstanceSpec, engine: str) -> list[str]:
    if inst.pp <= 1:
        return []
    return ["--pipeline-parallel-size" if engine == "vllm" else "--pp-size", str(inst.pp)]


def _kinds(spec: ClusterSpec) -> list[tuple[str, InstanceSpec, int]]:
    names: dict[str, int] = {}
    out = []
    for inst, n in instance_kinds(spec):
        base = kind_name(inst, 0)
        k = names.get(base, 0)
        names[base] = k + 1
        out.append((kind_name(inst, k), inst, n))
    return out


def _engine_line(inst: InstanceSpec, engine: str) -> str:
    """The launch line of ``slotune.tuner.export`` for one instance (comments first)."""
    from slotune.tuner.export import export

    best = {
        "config": inst.config.to_dict(),
        "gpu": inst.gpu,
        "model": inst.model,
        "tp": inst.tp,
        "ep": inst.ep,
        "quantization": inst.quantization,
    }
    return export(best, "command", target=engine)


def _disaggregation_args(inst: InstanceSpec, engine: str) -> list[str]:
    if inst.role == "mixed":
        return []
    if engine == "vllm":
        connector = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        return ["--kv-transfer-config", json.dumps(connector, separators=(",", ":"))]
    return ["--disaggregation-mode", inst.role, "--disaggregation-transfer-backend", "nixl"]


def launch_lines(spec: ClusterSpec, engine: str) -> dict[str, str]:
    """Instance kind -> its shell command (with ``# comments``), serving on ``PORT``."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: choose one of {', '.join(ENGINES)}")
    out = {}
    for name, inst, _ in _kinds(spec):
        text = _engine_line(inst, engine)
        extra = [*_pipeline_args(inst, engine), *_disaggregation_args(inst, engine)]
        extra += ["--port", str(PORT)]
        lines = text.splitlines()
        lines[-1] += " " + " ".join(shlex.quote(w) for w in extra)
        out[name] = "\n".join(lines)
    return out


def router_settings(spec: ClusterSpec) -> dict[str, Any]:
    policy, comment = _ROUTER_POLICY[spec.router.policy]
    settings: dict[str, Any] = {"policy": policy}
    if policy == "cache_aware":
        settings.update(
            cache_threshold=spec.router.cache_threshold,
            balance_abs_threshold=spec.router.balance_abs,
            balance_rel_threshold=spec.router.balance_rel,
        )
    if spec.disaggregated:
        settings["pd_disaggregation"] = True
    if comment:
        settings["note"] = comment
    return settings


def router_command(spec: ClusterSpec, kubernetes: bool = False) -> str:
    """The router's launch line, comments first. Its workers: one URL per instance
    (hostnames ``KIND-I`` to replace), or with ``kubernetes`` the pods it discovers by
    their ``ROLE_LABEL``."""
    settings = router_settings(spec)
    words = ["python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0"]
    words += ["--port", str(ROUTER_PORT)]
    if spec.disaggregated:
        words.append("--pd-disaggregation")
    if kubernetes:
        words += ["--service-discovery", "--service-discovery-port", str(PORT)]
        if spec.disaggregated:
            words += ["--prefill-selector", f"{ROLE_LABEL}=prefill"]
            words += ["--decode-selector", f"{ROLE_LABEL}=decode"]
        else:
            words += ["--selector", f"{ROLE_LABEL}=mixed"]
    else:
        urls = {
            role: [
                f"http://{name}-{i}:{PORT}"
                for name, inst, n in _kinds(spec)
                if inst.role == role
                for i in range(n)
            ]
            for role in ("mixed", "prefill", "decode")
        }
        if spec.disaggregated:
            for role in ("prefill", "decode"):
                for url in urls[role]:
                    words += [f"--{role}", url]
        else:
            words += ["--worker-urls", *urls["mixed"]]
    words += ["--policy", settings["policy"]]
    for key in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold"):
        if key in settings:
            words += [f"--{key.replace('_', '-')}", str(settings[key])]
    line = " ".join(shlex.quote(w) for w in words)
    note = settings.get("note")
    return f"# {note}\n{line}" if note else line


def _command_words(line: str) -> list[str]:
    """The launch line's words, without its comment lines."""
    return shlex.split("\n".join(x for x in line.splitlines() if not x.startswith("#")))


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "slotune-deployment", "app.kubernetes.io/component": name}


def _rbac() -> list[dict[str, Any]]:
    """What the router's service discovery needs: to watch the pods of its namespace."""
    meta = {"name": "slotune-router"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "subjects": [{"kind": "ServiceAccount", "name": "slotune-router"}],
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "slotune-router",
            },
        },
    ]


def _deployment(
    name: str,
    replicas: int,
    words: list[str],
    image: str,
    gpus: int,
    port: int = PORT,
    metrics_port: int = PORT,
    role: str | None = None,
) -> dict[str, Any]:
    def probe(**timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": port}, **timing}

    container: dict[str, Any] = {
        "name": "engine",
        "image": image,
        "command": words[:1],
        "args": words[1:],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": probe(initialDelaySeconds=30, periodSeconds=10),
        "livenessProbe": probe(initialDelaySeconds=300, periodSeconds=30),
        "startupProbe": probe(periodSeconds=10, failureThreshold=120),
    }
    if gpus:
        container["resources"] = {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {"nvidia.com/gpu": gpus},
        }
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    pod: dict[str, Any] = {"containers": [container]}
    if gpus:
        pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    else:
        pod["serviceAccountName"] = "slotune-router"
    pod_labels = {**_labels(name), **({ROLE_LABEL: role} if role else {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _labels(name)},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(metrics_port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod,
            },
        },
    }


def _service(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "selector": _labels(name),
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }


def manifests(spec: ClusterSpec, engine: str) -> list[dict[str, Any]]:
    """A Deployment (its replicas the kind's count, ``nvidia.com/gpu`` its TP, probes on
    ``/health``, Prometheus scrape annotations) and a Service per instance kind; the
    router's, with the service account its pod discovery needs."""
    docs: list[dict[str, Any]] = []
    lines = launch_lines(spec, engine)
    for name, inst, n in _kinds(spec):
        words = _command_words(lines[name])
        gpus = inst.num_gpus
        docs.append(_deployment(name, n, words, IMAGES[engine], gpus, role=inst.role))
        docs.append(_service(name, PORT))
    router = _command_words(router_command(spec, kubernetes=True))
    docs += _rbac()
    docs.append(_deployment("router", 1, router, ROUTER_IMAGE, 0, ROUTER_PORT, 29000))
    docs.append(_service("router", ROUTER_PORT))
    return docs


def manifests_yaml(spec: ClusterSpec, engine: str) -> str:
    import yaml

    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in manifests(spec, engine))
