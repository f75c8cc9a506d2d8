"""The Kubernetes manifests: valid against the Kubernetes API schemas (strict: unknown fields fail),
one agent container per GPU wired consistently to its socket, probes and metrics port, least
privilege, and the probe command really answers for an agent started the way the container starts it."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.deploy_files import DEPLOY

from freeride.agent.config import declared

K8S = DEPLOY / "kubernetes"
SCHEMAS = Path(__file__).parent / "schemas"
# The oldest Kubernetes we support and the newest whose schemas kubernetes-validate ships.
VERSIONS = ("1.30.0", "1.36.0")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _parsed() -> str:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.load_all((K8S / name).read_text(), Loader=_LOADER) if d]
    return json.dumps(docs)


def _documents() -> list[dict[str, Any]]:
    """The manifests `kubectl apply -k deploy/kubernetes` applies (a fresh copy: tests may edit it)."""
    docs: list[dict[str, Any]] = json.loads(_parsed())
    return docs


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _documents() if d["kind"] == kind]
    return doc


def _agents(ds: dict[str, Any]) -> list[dict[str, Any]]:
    return list(ds["spec"]["template"]["spec"]["containers"])


@pytest.mark.parametrize("version", VERSIONS)
def test_core_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    core = [d for d in _documents() if d["kind"] != "ServiceMonitor"]
    assert {d["kind"] for d in core} == {"Namespace", "ConfigMap", "DaemonSet", "Service"}
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_example_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    """deploy/kubernetes/examples/ (e.g. Redis for work pools) is applied by hand: it must be as valid."""
    examples = sorted((K8S / "examples").glob("*.yaml"))
    assert examples, "no example manifests"
    for path in examples:
        for doc in yaml.load_all(path.read_text(), Loader=_LOADER):
            if doc:
                kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_field_is_caught_by_the_schema_check() -> None:
    ds = _one("DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFilesytem"):
        kubernetes_validate.validate(ds, VERSIONS[0], strict=True)


def test_servicemonitor_validates_against_the_operator_schema() -> None:
    schema = json.loads((SCHEMAS / "servicemonitor-monitoring-v1.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_one("ServiceMonitor"), schema, cls=jsonschema.Draft202012Validator)


def test_one_agent_container_per_gpu_each_with_its_own_socket_state_probes_and_port() -> None:
    ds = _one("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    gpus = int(pod["nodeSelector"]["nvidia.com/gpu.count"])
    agents = _agents(ds)
    assert [c["name"] for c in agents] == [f"agent-gpu{i}" for i in range(gpus)]
    for i, c in enumerate(agents):
        sock = f"/run/freeride/agent-gpu{i}.sock"
        assert c["command"] + c["args"] == ["freeride", "agent", "--gpu", str(i), "--state-dir",
                                            f"/var/lib/freeride/gpu{i}", "--socket", sock]
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["exec"]["command"][:4] == ["freeride", "health", "--agent", sock]
        env = {e["name"]: e["value"] for e in c["env"]}
        (port,) = c["ports"]
        assert port == {"name": f"metrics-gpu{i}", "containerPort": int(env["FREERIDE_METRICS_PORT"]),
                        "protocol": "TCP"}
    prepare = " ".join(pod["initContainers"][0]["command"])
    assert f"seq 0 {gpus - 1}" in prepare  # every GPU's state directory handed to the agents' user


def test_least_privilege() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        # The GPUs belong to the training pods: an agent that requested one would take it away.
        assert not any("nvidia.com/gpu" in c["resources"].get(k, {}) for k in ("requests", "limits"))
        assert "memory" in c["resources"]["limits"] and "cpu" not in c["resources"]["limits"]
    (init,) = pod["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def test_metrics_service_and_monitor_cover_every_agent() -> None:
    ds, svc, mon = _one("DaemonSet"), _one("Service"), _one("ServiceMonitor")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] in mon["spec"]["namespaceSelector"]["matchNames"]
    container_ports = {p["name"]: p["containerPort"] for c in _agents(ds) for p in c["ports"]}
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == container_ports
    assert all(p["targetPort"] == p["name"] for p in svc["spec"]["ports"])
    assert [e["port"] for e in mon["spec"]["endpoints"]] == list(container_ports)


def test_configmap_sets_only_agent_variables_and_the_grace_period_covers_the_checkpoints() -> None:
    data = _one("ConfigMap")["data"]
    known = {d.env for d in declared()}
    known |= {"FREERIDE_LOG_LEVEL", "FREERIDE_SOCKET_DIR"}  # read by the CLI and the socket lookup
    assert {k for k in data if k.startswith("FREERIDE_")} <= known
    for key in ("FREERIDE_GPU", "FREERIDE_STATE_DIR", "FREERIDE_SOCKET"):
        assert key not in data, f"{key} is per container"
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= float(data["FREERIDE_SHUTDOWN_GRACE_S"]) + 10


def test_agent_started_like_the_container_answers_its_probe_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """Container agent-gpu5's command, args and environment, with the host paths under tmp_path.

    The kubelet runs the exec probe inside the container; here it runs beside the agent, against
    the same socket. Readiness is awaited through NOTIFY_SOCKET (the agent's READY=1), not by polling.
    """
    ds, data = _one("DaemonSet"), _one("ConfigMap")["data"]
    (c,) = [c for c in _agents(ds) if c["name"] == "agent-gpu5"]
    mounts = {"/run/freeride": str(tmp_path / "run"), "/var/lib/freeride": str(tmp_path / "lib")}

    def host(word: str) -> str:
        for inside, outside in mounts.items():
            word = word.replace(inside, outside)
        return word

    def run_as_container(argv: list[str]) -> list[str]:
        assert argv[0] == "freeride"
        return [sys.executable, "-m", "freeride", *(host(w) for w in argv[1:])]

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **{k: host(v) for k, v in data.items()},
           **{e["name"]: e["value"] for e in c["env"]}}
    for key in ("FREERIDE_METRICS_PORT", "FREERIDE_METRICS_ADDR"):  # fixed ports would clash on a shared runner
        env.pop(key)
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    (tmp_path / "lib" / "gpu5").mkdir(parents=True)  # the init container's job
    probe = run_as_container(c["readinessProbe"]["exec"]["command"])
    notify = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(notify))
        listener.settimeout(60)  # bounds a hang only
        log_path = tmp_path / "agent.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(run_as_container(c["command"] + c["args"]),
                                    env={**env, "NOTIFY_SOCKET": str(notify)},
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            assert listener.recv(4096).startswith(b"READY=1"), log_path.read_text()
            answer = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
            assert answer.returncode == 0, answer.stderr
            assert answer.stdout.strip() == f"unix:{tmp_path}/run/agent-gpu5.sock: SERVING"
            proc.send_signal(signal.SIGTERM)  # what the kubelet sends first
            code = proc.wait(timeout=ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 0, log_path.read_text()
    after = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
    assert after.returncode != 0 and "no agent answers" in after.stderr  # a stopped agent fails its probe
