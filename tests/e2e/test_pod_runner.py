"""The local backend's pod runner: the lab's own pods really run (harness/podrunner).

Pods of image gpulab:dev bound to kwok nodes become host processes: these tests check the
process behind a pod, its status, restarts, deletion, volumes, env, logs, probes, Services
and the ServiceAccount it talks to the API server as.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.wait import wait_for
from harness.apply import apply
from harness.podrunner import network, runtime

# the pod runner is the local backend's kubelet
pytestmark = pytest.mark.local_backend

# A small HTTP server in the lab's image: GET / answers with what the pod sees.
SERVER = textwrap.dedent(
    """
    import http.server, json, os, sys
    port = int(sys.argv[1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({k: os.environ.get(k) for k in ("NODE", "GREETING", "SECRET_DIR")})
            if self.path.startswith("/file"):
                body = open(os.environ["DATA"]).read()
            self.send_response(200); self.end_headers(); self.wfile.write(body.encode())
        def log_message(self, *a):
            print("served", self.path, flush=True)
    print("listening on", sys.argv[2], port, flush=True)
    http.server.HTTPServer((sys.argv[2], port), H).serve_forever()
    """
)


def _pod(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"nodeName": "cpu-only", "terminationGracePeriodSeconds": 5, **spec},
    }


def _create(cluster, body: dict[str, Any]) -> None:
    client.CoreV1Api(cluster.api).create_namespaced_pod(body["metadata"]["namespace"], body)


def _read(cluster, ns: str, name: str) -> client.V1Pod:
    return client.CoreV1Api(cluster.api).read_namespaced_pod(name, ns)


def _ready(cluster, ns: str, name: str) -> client.V1Pod | None:
    pod = _read(cluster, ns, name)
    conds = pod.status.conditions or []
    return pod if any(c.type == "Ready" and c.status == "True" for c in conds) else None


def _pid(pod: client.V1Pod, container: int = 0) -> int:
    return int(pod.status.container_statuses[container].container_id.removeprefix("gpulab://"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _events(cluster, ns: str, name: str) -> list[tuple[str, str]]:
    items = client.CoreV1Api(cluster.api).list_namespaced_event(ns).items
    return [(e.reason, e.message or "") for e in items if e.involved_object.name == name]


def server_pod(ns: str, name: str = "web") -> dict[str, Any]:
    return _pod(
        ns,
        name,
        initContainers=[
            {
                "name": "prepare",
                "image": "gpulab:dev",
                "command": ["sh", "-c", "echo prepared-by-init > /data/file"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }
        ],
        containers=[
            {
                "name": "web",
                "image": "gpulab:dev",
                "command": ["python3", "-c", SERVER, "8080", "0.0.0.0"],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                "env": [
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "GREETING", "value": "hello from $(NODE)"},
                    {"name": "DATA", "value": "/data/file"},
                    {"name": "SECRET_DIR", "value": "/etc/conf"},
                ],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "conf", "mountPath": "/etc/conf"},
                ],
            }
        ],
        volumes=[
            {"name": "data", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "conf", "optional": True}},
        ],
    )


def test_a_lab_pod_runs_as_a_process_with_its_env_volumes_and_logs(cluster, namespace) -> None:
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="conf"), data={"k": "v"})
    )
    _create(cluster, server_pod(namespace))
    pod = wait_for(lambda: _ready(cluster, namespace, "web"), 60, "pod web to be Ready")
    ip = pod.status.pod_ip
    assert network.is_pod_address(cluster.local.block, ip)
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    pid = _pid(pod)
    assert _alive(pid)
    seen = httpx.get(f"http://{ip}:8080/").json()
    assert seen["NODE"] == "cpu-only"
    assert seen["GREETING"] == "hello from cpu-only"
    # the configMap volume is a directory on the host, named in the rewritten env
    assert Path(seen["SECRET_DIR"], "k").read_text() == "v"
    # the init container wrote into the emptyDir the app container reads
    assert httpx.get(f"http://{ip}:8080/file").text.strip() == "prepared-by-init"
    # kubectl logs, served by kwok from the runner's CRI log files
    logs = core.read_namespaced_pod_log("web", namespace, container="web")
    assert "listening on" in logs
    started = ("Started", f"Started container web (pid {pid})")
    wait_for(lambda: started in _events(cluster, namespace, "web"), 20, "the Started Event")


def test_a_killed_process_restarts_and_a_deleted_pod_stops_it(cluster, namespace) -> None:
    _create(cluster, server_pod(namespace))
    pod = wait_for(lambda: _ready(cluster, namespace, "web"), 60, "pod web to be Ready")
    first = _pid(pod)
    os.kill(first, 9)
    pod = wait_for(
        lambda: (
            (p := _ready(cluster, namespace, "web"))
            and p.status.container_statuses[0].restart_count == 1
            and p
        ),
        60,
        "web restarted once",
    )
    status = pod.status.container_statuses[0]
    assert status.last_state.terminated.exit_code == 137
    second = _pid(pod)
    assert second != first and _alive(second)
    client.CoreV1Api(cluster.api).delete_namespaced_pod("web", namespace)
    wait_for(lambda: not _alive(second), 30, "the process to stop with its pod")
    wait_for(
        lambda: not client.CoreV1Api(cluster.api).list_namespaced_pod(namespace).items,
        30,
        "the pod to be gone",
    )


def test_a_crashing_container_backs_off(cluster, namespace) -> None:
    _create(
        cluster,
        _pod(
            namespace,
            "crash",
            containers=[
                {"name": "c", "image": "gpulab:dev", "command": ["sh", "-c", "echo boom; exit 3"]}
            ],
        ),
    )
    pod = wait_for(
        lambda: (
            (p := _read(cluster, namespace, "crash")).status.container_statuses
            and (
                p.status.container_statuses[0].state.waiting or client.V1ContainerStateWaiting()
            ).reason
            == "CrashLoopBackOff"
            and p
        ),
        60,
        "CrashLoopBackOff",
    )
    status = pod.status.container_statuses[0]
    assert status.restart_count >= 1
    assert status.last_state.terminated.exit_code == 3
    assert "back-off" in status.state.waiting.message
    assert pod.status.phase == "Running"  # restartPolicy Always: kubelet keeps it Running
    wait_for(
        lambda: any(r == "BackOff" for r, _ in _events(cluster, namespace, "crash")),
        30,
        "the BackOff Event",
    )


def test_bad_pods_get_a_reason_and_leave_others_alone(cluster, namespace) -> None:
    _create(cluster, server_pod(namespace, "good") | {})
    pvc = _pod(
        namespace,
        "pvc",
        containers=[
            {
                "name": "c",
                "image": "gpulab:dev",
                "command": ["sleep", "60"],
                "volumeMounts": [{"name": "v", "mountPath": "/v"}],
            }
        ],
        volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "nope"}}],
    )
    missing = _pod(
        namespace,
        "missing",
        containers=[{"name": "c", "image": "gpulab:dev", "command": ["no-such-command"]}],
    )
    _create(cluster, pvc)
    _create(cluster, missing)

    def waiting(name: str, reason: str) -> client.V1ContainerStateWaiting | None:
        statuses = _read(cluster, namespace, name).status.container_statuses or []
        state = statuses[0].state.waiting if statuses else None
        return state if state is not None and state.reason == reason else None

    state = wait_for(lambda: waiting("pvc", "ContainerCreating"), 30, "pvc to wait on its volume")
    assert "persistentVolumeClaim" in state.message and "not supported" in state.message
    # Events are posted in the background (gpulab/trace.py): wait for them, bounded
    wait_for(
        lambda: any(r == "FailedMount" for r, _ in _events(cluster, namespace, "pvc")),
        30,
        "the FailedMount Event",
    )
    wait_for(lambda: waiting("missing", "CrashLoopBackOff"), 60, "missing to back off")
    last = _read(cluster, namespace, "missing").status.container_statuses[0].last_state.terminated
    assert last.reason == "StartError" and "executable file not found" in last.message
    wait_for(
        lambda: any("no-such-command" in m for _, m in _events(cluster, namespace, "missing")),
        30,
        "an Event naming the missing command",
    )
    wait_for(lambda: _ready(cluster, namespace, "good"), 60, "the good pod to be Ready anyway")


def test_a_service_reaches_its_ready_pod_through_the_proxy(cluster, namespace, tmp_path) -> None:
    _create(cluster, server_pod(namespace))
    (tmp_path / "svc.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web", "namespace": namespace},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
            }
        )
    )
    apply(cluster.api, [tmp_path / "svc.yaml"], lambda _m: None, cluster.local.apply_transform())
    cluster_ip = (
        client.CoreV1Api(cluster.api).read_namespaced_service("web", namespace).spec.cluster_ip
    )
    address = network.service_address(cluster.local.block, cluster_ip)
    wait_for(lambda: _ready(cluster, namespace, "web"), 60, "pod web to be Ready")

    def answers() -> bool:
        try:
            return httpx.get(f"http://{address}:80/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, 30, f"Service web at {address}:80")


def test_the_pod_talks_to_the_api_server_as_its_service_account(cluster, namespace) -> None:
    script = textwrap.dedent(
        """
        from kubernetes import client
        from gpulab.kube import api_client
        core = client.CoreV1Api(api_client(None))
        print("namespace pods:", len(core.list_namespaced_pod("NAMESPACE").items), flush=True)
        try:
            core.list_node()
        except client.ApiException as exc:
            print("nodes:", exc.status, flush=True)
        """
    ).replace("NAMESPACE", namespace)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    _create(
        cluster,
        _pod(
            namespace,
            "sa",
            restartPolicy="Never",
            containers=[{"name": "c", "image": "gpulab:dev", "command": ["python3", "-c", script]}],
        ),
    )
    wait_for(
        lambda: _read(cluster, namespace, "sa").status.phase == "Succeeded", 60, "pod sa to finish"
    )
    logs = client.CoreV1Api(cluster.api).read_namespaced_pod_log("sa", namespace)
    assert "namespace pods: 1" in logs  # allowed by its Role
    assert "nodes: 403" in logs  # the account has no right to list nodes


def test_down_leaves_no_pod_process_behind(cluster, namespace) -> None:
    """Processes carry the cluster marker `down` sweeps for (checked on this cluster's pods)."""
    _create(cluster, server_pod(namespace))
    pod = wait_for(lambda: _ready(cluster, namespace, "web"), 60, "pod web to be Ready")
    assert _pid(pod) in runtime.find_leftovers(cluster.local.dir)


def test_unknown_image_waits_with_a_reason(cluster, namespace) -> None:
    body = _pod(
        namespace,
        "mixed",
        containers=[
            {"name": "lab", "image": "gpulab:dev", "command": ["sleep", "60"]},
            {"name": "other", "image": "nginx:1.27"},
        ],
    )
    _create(cluster, body)

    def reason() -> str | None:
        try:
            statuses = _read(cluster, namespace, "mixed").status.container_statuses or []
        except ApiException:
            return None
        waiting = statuses[1].state.waiting if len(statuses) > 1 else None
        return waiting.message if waiting and waiting.reason == "ErrImagePull" else None

    message = wait_for(reason, 30, "ErrImagePull on the unknown image")
    assert "nginx:1.27" in message and "pod-images.yaml" in message


def test_a_daemonset_rollout_replaces_processes_one_node_at_a_time(cluster, namespace) -> None:
    from gpulab import informer

    apps = client.AppsV1Api(cluster.api)
    selector = {"nvidia.com/gpu.present": "true"}
    nodes = (
        client.CoreV1Api(cluster.api).list_node(label_selector="nvidia.com/gpu.present=true").items
    )
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": selector,
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "agent",
                            "image": "gpulab:dev",
                            "command": ["sleep", "3600"],
                            "env": [{"name": "VERSION", "value": "1"}],
                        }
                    ],
                },
            },
        },
    }
    apps.create_namespaced_daemon_set(namespace, ds)

    def ready_pods() -> list[dict[str, Any]]:
        return [
            p
            for p in pods.store.list()
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]

    lowest: list[int] = []
    rolling = [False]

    def observe(*_objs: Any) -> None:
        if rolling[0]:
            lowest.append(len(ready_pods()))

    pods = informer.Informer(
        informer.ListWatch(cluster.api, informer.PODS, namespace=namespace),
        informer.Handlers(on_add=observe, on_update=observe, on_delete=observe),
    ).start()
    try:
        wait_for(lambda: len(ready_pods()) == len(nodes), 90, "one Ready agent per GPU node")
        before = {p["status"]["containerStatuses"][0]["containerID"] for p in ready_pods()}
        rolling[0] = True
        ds["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "2"
        apps.patch_namespaced_daemon_set("agent", namespace, ds)

        def rolled() -> bool:
            current = apps.read_namespaced_daemon_set("agent", namespace)
            status = current.status
            return (
                status.observed_generation == current.metadata.generation
                and status.updated_number_scheduled == len(nodes)
                and status.number_ready == len(nodes)
                and len(ready_pods()) == len(nodes)
            )

        wait_for(rolled, 180, "the rollout to finish")
        after = {p["status"]["containerStatuses"][0]["containerID"] for p in ready_pods()}
    finally:
        pods.stop()
        apps.delete_namespaced_daemon_set("agent", namespace)
    assert not before & after  # every process was replaced
    assert not any(_alive(int(c.removeprefix("gpulab://"))) for c in before)
    assert min(lowest) == len(nodes) - 1  # one node at a time, and one at least
