"""lab-device-plugin: two nodes whose GPUs kubelet stops offering.

    gpu-dp-0  its device plugin now registers its GPUs as ``nvidia.com/gpu.shared``: the
              node's config label selects ``lab-shared`` (time-slicing with
              ``renameByDefault: true``, upstream's config format), so pods asking for
              ``nvidia.com/gpu`` find capacity 4, allocatable 0, then capacity 0
    gpu-dp-1  its device plugin does not run: the node lost the label
              ``nvidia.com/gpu.present=true`` the DaemonSet selects (as when GPU feature
              discovery or the GPU Operator relabels a node), so kubelet marks the devices
              Unhealthy (allocatable 0) and, after the grace period, drops the capacity

A Deployment per node asks for its GPUs. Kubelet keeps a stopped plugin's resource for
``endpointStopGracePeriod`` (5 minutes, a constant in kubelet v1.36.3); lab convenience:
on the local backend the two nodes' node agents (the lab's kubelet device manager) are
restarted with ``--endpoint-stop-grace-period=20`` so the capacity drop shows within the
lab, and restarted with the default again by ``gpulab lab stop``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes import client

from gpulab.wait import wait_for
from harness.backends import SYSTEM_NAMESPACE
from harness.labs import (
    POOL_LABEL,
    SPEC,
    Case,
    CaseState,
    Namespace,
    Progress,
    create,
    deployment,
    newest_pod,
    running,
    wait_pending_reason,
)

NAME = "device-plugin"
NS = "lab-device-plugin"
CONFIGMAP = "nvidia-device-plugin-configs"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
PRESENT = "nvidia.com/gpu.present"
PLUGIN = "gpulab-device-plugin"
RENAMED, STOPPED = "gpu-dp-0", "gpu-dp-1"
LAB_CONFIG = "lab-shared"
GRACE = 20
FIELD_MANAGER = "gpulab-lab"
GPUS = 4
APPS = {
    "inference": ("wrong-name", RENAMED, 1),
    "trainer": ("not-running", STOPPED, GPUS),
}
SYMPTOMS = {
    "wrong-name": f"deploy/inference (1 nvidia.com/gpu on {RENAMED}) stays Pending; its node "
    "has 4 T4s and a running device plugin",
    "not-running": f"deploy/trainer (4 nvidia.com/gpu on {STOPPED}) stays Pending; `kubectl "
    "describe node` shows nvidia.com/gpu capacity 4, allocatable 0 (then capacity 0)",
}
FIXES = {
    "wrong-name": f"`kubectl label node {RENAMED} {CONFIG_LABEL}=default --overwrite`, then "
    f"restart its plugin (`kubectl -n {SYSTEM_NAMESPACE} delete pod -l "
    f"app.kubernetes.io/name={PLUGIN} --field-selector spec.nodeName={RENAMED}`): the init "
    "container links the selected config at start",
    "not-running": f"`kubectl label node {STOPPED} {PRESENT}=true`: the DaemonSet schedules "
    "its pod again, the plugin registers, allocatable is 4",
}


# upstream's config file format: time-slicing 2 ways, renamed by default
SHARED_CONFIG = """\
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""


class DevicePluginLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = "two nodes' GPUs stopped being offered to pods; find out why on each"
    hints = (
        f"`gpulab diagnose node {RENAMED}` and `gpulab diagnose node {STOPPED}`: the node "
        "side of the chain, resource by resource",
        "`kubectl get node NODE -o jsonpath='{.status.capacity}'` vs `.status.allocatable`: "
        "kubelet keeps a vanished plugin's resource at allocatable 0 for a grace period",
        f"`kubectl -n {SYSTEM_NAMESPACE} get pods -o wide -l app.kubernetes.io/name={PLUGIN}`: "
        "is there a plugin pod on each node? what selects the nodes it runs on?",
        f"`kubectl -n {SYSTEM_NAMESPACE} get cm {CONFIGMAP} -o yaml` and the node label "
        f"{CONFIG_LABEL}: which named config does each node's plugin run with?",
    )

    def start(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        self.stop(backend, progress)
        _grace_period(backend, GRACE, progress)
        core = client.CoreV1Api(api)
        Namespace(NS).create(api, NAME)
        core.patch_namespaced_config_map(
            CONFIGMAP,
            SYSTEM_NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
                "data": {LAB_CONFIG: SHARED_CONFIG},
            },
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        core.patch_node(RENAMED, {"metadata": {"labels": {CONFIG_LABEL: LAB_CONFIG}}})
        backend.restart(PLUGIN, RENAMED)
        core.patch_node(STOPPED, {"metadata": {"labels": {PRESENT: None}}})

        def withdrawn() -> bool:  # no pod may be bound to GPUs that are going away
            return all(
                (core.read_node(n).status.allocatable or {}).get("nvidia.com/gpu", "0") == "0"
                for n in (RENAMED, STOPPED)
            )

        wait_for(withdrawn, 60, f"nvidia.com/gpu to leave {RENAMED}'s and {STOPPED}'s allocatable")
        for app, (_case, node, gpus) in APPS.items():
            selector = {POOL_LABEL: NAME, "kubernetes.io/hostname": node}
            create(api, deployment(app, NS, gpus, node_selector=selector))
        for app in APPS:
            wait_pending_reason(api, NS, app)
        progress(f"lab {NAME}: deploy/inference and deploy/trainer in {NS} stay Pending")

    def cases(self, api: client.ApiClient) -> list[Case]:
        out = []
        for app, (case, _node, _gpus) in APPS.items():
            pod = newest_pod(api, NS, app)
            ref = f"{NS}/{pod.metadata.name}" if pod else f"{NS}/{app}"
            out.append(Case(case, SYMPTOMS[case], ("pod", ref), "node", FIXES[case]))
        return out

    def check(self, api: client.ApiClient) -> list[CaseState]:
        out = []
        for app, (case, node, _gpus) in APPS.items():
            pod = newest_pod(api, NS, app)
            ok = running(pod)
            state = "Running" if ok else "not Running"
            out.append(CaseState(case, ok, f"deploy/{app} on {node}: {state}"))
        return out

    def stop(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        core = client.CoreV1Api(api)
        Namespace(NS).delete(api)
        labels = core.read_node(RENAMED).metadata.labels or {}
        if labels.get(CONFIG_LABEL) == LAB_CONFIG:
            core.patch_node(RENAMED, {"metadata": {"labels": {CONFIG_LABEL: "default"}}})
            backend.restart(PLUGIN, RENAMED)
        core.patch_node(STOPPED, {"metadata": {"labels": {PRESENT: "true"}}})
        _grace_period(backend, None, progress)
        _wait_gpus(core, [RENAMED, STOPPED])


def _grace_period(backend: Any, seconds: int | None, progress: Progress) -> None:
    """Lab convenience (local backend): restart the lab nodes' node agents with a short
    ``--endpoint-stop-grace-period`` (None: kubelet's default again)."""
    local = getattr(backend, "restart_process", None)
    if local is None:
        progress("not the local backend: kubelet's own 5-minute grace period applies")
        return
    flag = "--endpoint-stop-grace-period="
    core = client.CoreV1Api(backend.api())
    since = dt.datetime.now(dt.UTC)
    restarted = []
    for node in (RENAMED, STOPPED):
        name = f"node-agent-{node}"
        rec = next(p for p in backend.processes() if p.name == name)
        argv = [a for a in rec.argv if not a.startswith(flag)]
        if seconds is not None:
            argv.append(f"{flag}{seconds}")
        if argv == rec.argv:
            continue
        backend.stop_process(name)
        backend.start_process(name, argv, rec.ports, rec.env, rec.service)
        restarted.append(node)
    # the running plugins register with the new agent (they watch kubelet.sock); until
    # then the node's status is the old agent's
    for node in restarted:
        wait_for(
            lambda n=node: _registered_since(core, n, since),
            60,
            f"the device plugin on {node} to register with the restarted node agent",
            0.5,
        )
    if seconds is not None:
        progress(f"lab convenience: node agents of {RENAMED}, {STOPPED} run with {flag}{seconds}")


def _registered_since(core: client.CoreV1Api, node: str, since: dt.datetime) -> bool:
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason=Register"
    ).items
    return any(
        e.reporting_component == "gpulab.io/node-agent"
        and (e.event_time or e.last_timestamp or since) > since
        for e in events
    )


def _wait_gpus(core: client.CoreV1Api, nodes: list[str], timeout: float = 90) -> None:
    def advertised() -> bool:
        return all(
            (core.read_node(n).status.allocatable or {}).get("nvidia.com/gpu") == str(GPUS)
            for n in nodes
        )

    wait_for(advertised, timeout, f"{', '.join(nodes)} to advertise {GPUS} GPUs again", 0.5)


LAB = DevicePluginLab()
