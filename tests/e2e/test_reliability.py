"""Outages and component kills mid-flow (docs/reliability.md), on one cluster with every
chapter that schedules GPUs (harness/clusters/reliability-e2e.yaml).

Each test puts work of every chapter in flight — a Kueue admission cycle (more Jobs than
quota), a Coscheduling gang with one member waiting at Permit, a Volcano gang for the
next session, HAMi vGPU pods whose Bind takes the node lock — then hurts the cluster
while it is in flight, starts more work afterwards (which only completes if every
informer resynced), and asserts what must hold however unlucky the timing:

- every Workload admitted exactly once (watched throughout), the ClusterQueue's admitted
  GPUs never over quota at any moment (from the Workloads' own condition times);
- every gang whole in the end, no pod ever bound to two nodes;
- no GPU given to two running pods (the node agent's Allocate record per pod, HAMi's
  per-GPU memory and share count);
- no HAMi node lock left held past its timeout;
- every component Ready, restarted only as the test expects.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import Cluster, fresh_namespace, running_cluster
from kubernetes import client
from scheduling_helpers import SCHEDULER

from demos import hami as hami_demo
from demos import kueue as kq
from gpulab import informer
from gpulab.framework.objects import GPU, make_pod, manifest
from gpulab.hami import annotations as ha
from gpulab.kueue import api as kueue_api
from gpulab.schedulerplugins import apis as cs
from gpulab.volcano import apis as va
from gpulab.volcano import objects as vo
from gpulab.volcano.client import VolcanoClient
from gpulab.wait import WaitTimeout, wait_for
from harness.labs import HAMI_IGNORE
from harness.local import LocalCluster, ProcessRecord, pid_alive
from harness.ports import port_in_use

Obj = dict[str, Any]
SPEC = "reliability-e2e"
POOL = "gpulab.io/pool"
FREEZE_SECONDS = 15  # longer than a watch's idle gap, shorter than the leader leases
QUOTA = 2  # GPUs of the ClusterQueue: each batch's 3 one-GPU Jobs queue behind it
GANG = 2  # members of each Coscheduling and Volcano gang, one GPU each
SETTLE = 150  # seconds all of a test's work has to finish after the last hurt
# the namespaces of the lab's own components (what a kill hits, what must stay Ready)
SYSTEM = ("kube-system", "kueue-system", "volcano-system", "gpulab-system")


LOCK_TIMEOUT = "20s"  # HAMi's --node-lock-timeout here (upstream's default: 5m)


@pytest.fixture(scope="module")
def rcluster() -> Iterator[Cluster]:
    """The cluster, with HAMi's extender started with ``--node-lock-timeout=20s``: a node
    lock whose release an outage swallowed (the device plugin's ReleaseNodeLock failing
    while kube-apiserver restarts, logged and not retried, as upstream's) then expires
    within the test instead of after upstream's 5 minutes."""
    with running_cluster(SPEC) as c:
        _set_node_lock_timeout(c.api, LOCK_TIMEOUT)
        yield c


def _set_node_lock_timeout(api: client.ApiClient, timeout: str) -> None:
    apps = client.AppsV1Api(api)
    dep = apps.read_namespaced_deployment("hami-scheduler", "gpulab-system")
    index = next(i for i, c in enumerate(dep.spec.template.spec.containers) if c.name == "extender")
    patch = [
        {
            "op": "add",
            "path": f"/spec/template/spec/containers/{index}/command/-",
            "value": f"--node-lock-timeout={timeout}",
        }
    ]
    apps.patch_namespaced_deployment("hami-scheduler", "gpulab-system", patch)

    def rolled_out() -> bool:
        d = apps.read_namespaced_deployment("hami-scheduler", "gpulab-system")
        st = d.status
        pods = (
            client.CoreV1Api(api)
            .list_namespaced_pod(
                "gpulab-system", label_selector="app.kubernetes.io/name=hami-scheduler"
            )
            .items
        )
        return (
            st.observed_generation == d.metadata.generation
            and st.updated_replicas == st.replicas == st.ready_replicas == 1
            and len(pods) == 1  # the old pod gone, not only terminating
        )

    wait_for(rolled_out, 120, "hami-scheduler rolled out with the short node lock timeout")


@dataclass
class Ledger:
    """What the pod and Workload watches saw for the whole test."""

    nodes: dict[str, set[str]] = field(default_factory=dict)  # pod -> nodes bound to
    admitted: dict[str, int] = field(default_factory=dict)  # workload -> times admitted
    reserved: set[str] = field(default_factory=set)  # workloads holding a reservation
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pod(self, pod: Obj) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            meta = pod["metadata"]  # by uid: a pod created again under its name is another
            key = f"{meta['namespace']}/{meta['name']} ({meta['uid'][:8]})"
            with self.lock:
                self.nodes.setdefault(key, set()).add(node)

    def workload(self, wl: Obj) -> None:
        """Counts each time a Workload gains its quota reservation (a finished one keeps
        it; an evicted one loses it, and would count again when readmitted)."""
        name = wl["metadata"]["name"]
        with self.lock:
            if kq.reason(wl, "QuotaReserved") is None:
                self.reserved.discard(name)
            elif name not in self.reserved:
                self.reserved.add(name)
                self.admitted[name] = self.admitted.get(name, 0) + 1

    def workload_gone(self, wl: Obj) -> None:
        with self.lock:
            self.reserved.discard(wl["metadata"]["name"])


def peak_usage(workloads: list[Obj]) -> int:
    """The most GPUs the Workloads held at once, from their own condition times: each
    holds its quota from QuotaReserved to Finished (Kueue's accounting). Read from the
    objects, not from a watch, which sees nothing while kube-apiserver is down and then
    relists in no particular order. At equal seconds a release counts before an
    admission: Kueue admits into quota that was released."""
    moments: list[tuple[str, int, int]] = []
    for wl in workloads:
        conditions = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
        reserved = conditions.get("QuotaReserved") or {}
        if reserved.get("status") != "True":
            continue
        gpus = _workload_gpus(wl)
        moments.append((reserved["lastTransitionTime"], 1, gpus))
        finished = conditions.get("Finished") or {}
        if finished.get("status") == "True":
            moments.append((finished["lastTransitionTime"], 0, -gpus))
    held = peak = 0
    for _when, _order, delta in sorted(moments):
        held += delta
        peak = max(peak, held)
    return peak


def _workload_gpus(wl: Obj) -> int:
    admission = (wl.get("status") or {}).get("admission") or {}
    total = 0
    for ps in admission.get("podSetAssignments") or []:
        total += int(str((ps.get("resourceUsage") or {}).get(GPU, "0")))
    return total


@contextlib.contextmanager
def watching(api: client.ApiClient, namespaces: list[str], ledger: Ledger) -> Iterator[None]:
    """Pod watches on the work namespaces and a Workload watch on Kueue's, for the block;
    the informers relist after an outage as any client-go informer would."""
    started = []
    for ns in namespaces:
        lw = informer.ListWatch(api, informer.PODS, namespace=ns)
        h = informer.Handlers(ledger.pod, lambda _o, n: ledger.pod(n), lambda _o: None)
        started.append(informer.Informer(lw, h).start())
    lw = informer.ListWatch(api, kq.kueue_resource("Workload"), namespace=namespaces[0])
    h = informer.Handlers(ledger.workload, lambda _o, n: ledger.workload(n), ledger.workload_gone)
    started.append(informer.Informer(lw, h).start())
    try:
        yield
    finally:
        for inf in started:
            inf.stop()


@dataclass
class Work:
    """One test's namespaces, one per chapter, and the work it put in flight."""

    cluster: Cluster
    kueue: str
    gang: str
    volcano: str
    hami: str
    ledger: Ledger = field(default_factory=Ledger)
    jobs: list[str] = field(default_factory=list)
    gangs: list[str] = field(default_factory=list)
    vcjobs: list[str] = field(default_factory=list)
    vgpu: list[str] = field(default_factory=list)
    bare: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (ns, pod) -> manifest
    readmitted: list[str] = field(default_factory=list)

    @property
    def api(self) -> client.ApiClient:
        return self.cluster.api

    def queues(self) -> None:
        cq = f"{self.kueue}-cq"
        for body in (
            kq.flavor(f"{self.kueue}-t4", {POOL: "kueue"}),
            kq.cluster_queue(cq, self.kueue, QUOTA, f"{self.kueue}-t4"),
            kq.local_queue("team", self.kueue, cq),
        ):
            kq.create(self.api, body)

    def start(self, batch: str) -> None:
        """Every chapter's work of one batch; the gangs' last members come in `finish`."""
        batch_api = client.BatchV1Api(self.api)
        for i in range(3):
            name = f"{batch}-job-{i}"
            batch_api.create_namespaced_job(self.kueue, kq.queued_job(name, "team", 1, 4))
            self.jobs.append(name)
        group = f"{batch}-gang"
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            cs.GROUP, cs.VERSION, self.gang, "podgroups", cs.pod_group(group, self.gang, GANG)
        )
        self.gangs.append(group)
        self._gang_member(group, 0)  # waits at Permit for the member `finish` adds
        job = vo.vcjob(f"{batch}-vc", [vo.task("w", GANG, gpus=1, cpu="100m", seconds=3600)])
        job["spec"]["tasks"][0]["template"]["spec"]["nodeSelector"] = {POOL: "volcano"}
        VolcanoClient(self.api).create_job(self.volcano, job)
        self.vcjobs.append(f"{batch}-vc")
        for i in range(2):
            name = f"{batch}-vgpu-{i}"
            self._create(self.hami, hami_demo.vgpu_pod(name, 3000, 20))
            self.vgpu.append(name)

    def finish(self) -> None:
        """The gangs' last members: the gangs waiting at Permit can now go whole."""
        for group in self.gangs:
            with contextlib.suppress(client.ApiException):  # added by an earlier batch
                self._gang_member(group, 1)

    def _gang_member(self, group: str, i: int) -> None:
        pod = make_pod(
            f"{group}-{i}",
            self.gang,
            requests={GPU: 1},
            scheduler=SCHEDULER,
            node_selector={POOL: "gang"},
            labels={cs.POD_GROUP_LABEL: group},
        )
        self._create(self.gang, manifest(pod))

    def _create(self, ns: str, pod: Obj) -> None:
        client.CoreV1Api(self.api).create_namespaced_pod(ns, pod)
        self.bare[(ns, pod["metadata"]["name"])] = pod

    def _replace_failed_admissions(self) -> None:
        """A bare pod kubelet failed at admission (its device plugin died between Bind and
        Allocate: UnexpectedAdmissionError) is deleted and created again, as an operator or
        a controller would. Until then a HAMi node lock it took stays held, as upstream's
        does, up to the lock timeout (5m): the dangling-holder rule frees it on deletion."""
        core = client.CoreV1Api(self.api)
        for (ns, name), body in self.bare.items():
            pod = core.read_namespaced_pod(name, ns)
            if pod.status.phase == "Failed" and pod.status.reason == "UnexpectedAdmissionError":
                core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
                wait_for(functools.partial(_absent, core, ns, name), 30, f"{ns}/{name} deleted")
                core.create_namespaced_pod(ns, body)
                self.readmitted.append(f"{ns}/{name}")

    def done(self) -> str | None:
        """What is not finished yet (None: everything)."""
        self._replace_failed_admissions()
        batch_api = client.BatchV1Api(self.api)
        for name in self.jobs:
            status = batch_api.read_namespaced_job(name, self.kueue).status
            if not status.succeeded:
                return f"Kueue Job {name} not succeeded"
        core = client.CoreV1Api(self.api)
        for ns, want in (
            (self.gang, {f"{g}-{i}" for g in self.gangs for i in range(GANG)}),
            (self.hami, set(self.vgpu)),
        ):
            running = {
                p.metadata.name
                for p in core.list_namespaced_pod(ns).items
                if p.status.phase == "Running"
            }
            if want - running:
                return f"{ns}: {sorted(want - running)} not Running"
        vc_running = [
            p for p in core.list_namespaced_pod(self.volcano).items if p.status.phase == "Running"
        ]
        if len(vc_running) < GANG * len(self.vcjobs):
            return f"{self.volcano}: {len(vc_running)} of {GANG * len(self.vcjobs)} Running"
        return None


def _absent(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@contextlib.contextmanager
def work(cluster: Cluster) -> Iterator[Work]:
    """A namespace per chapter (fresh, removed after), the Kueue queues, and the watches."""
    api = cluster.api
    with contextlib.ExitStack() as stack:
        names = [stack.enter_context(fresh_namespace(api, p)) for p in ("rk", "rg", "rv", "rh")]
        core = client.CoreV1Api(api)
        for ns in names[:3]:  # HAMi's webhook leaves the other chapters' pods alone
            core.patch_namespace(ns, {"metadata": {"labels": HAMI_IGNORE}})
        w = Work(cluster, *names)
        w.queues()
        stack.enter_context(watching(api, names, w.ledger))
        stack.callback(_delete_cluster_queue, api, w.kueue)
        stack.callback(_delete_vcjobs, api, w.volcano)
        yield w


def _delete_cluster_queue(api: client.ApiClient, ns: str) -> None:
    kq.delete_cluster_objects(api, ("ClusterQueue", f"{ns}-cq"), ("ResourceFlavor", f"{ns}-t4"))


def _delete_vcjobs(api: client.ApiClient, ns: str) -> None:
    """vcjobs go before their pods, else the job controller creates the pods again."""
    client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
        va.BATCH_GROUP, va.BATCH_VERSION, ns, "jobs"
    )


# ------------------------------------------------------------------- what must hold


def components(
    api: client.ApiClient, namespaces: tuple[str, ...] = SYSTEM
) -> dict[str, tuple[str, int, int]]:
    """Every container the pod runner runs for the lab's components (container IDs
    ``gpulab://<pid>``): <namespace>/<app>[/<node>]/<container> -> (pod uid, restarts,
    pid). Keyed by app (and node for a DaemonSet), not pod name: a replaced pod is the
    same component."""
    found = {}
    core = client.CoreV1Api(api)
    for ns in namespaces:
        for pod in core.list_namespaced_pod(ns).items:
            meta = pod.metadata
            if meta.deletion_timestamp:  # on its way out (a rollout's old pod)
                continue
            labels, owners = meta.labels or {}, meta.owner_references or []
            app = (
                labels.get("app.kubernetes.io/name")
                or labels.get("app")
                or (owners[0].name if owners else meta.name)
            )
            # a DaemonSet's pod is its node's; a Deployment's may come back on another
            daemon = any(o.kind == "DaemonSet" for o in owners)
            where = f"/{pod.spec.node_name}" if daemon else ""
            for status in pod.status.container_statuses or []:
                cid = status.container_id or ""
                if cid.startswith("gpulab://"):
                    key = f"{ns}/{app}{where}/{status.name}"
                    pid = int(cid.removeprefix("gpulab://"))
                    found[key] = (meta.uid, status.restart_count, pid)
    return found


def restarts_since(
    api: client.ApiClient,
    before: dict[str, tuple[str, int, int]],
    namespaces: tuple[str, ...] = SYSTEM,
    killed: Collection[str] = (),
) -> dict[str, int]:
    """Per component container, how often it restarted since ``before`` (a replaced pod
    counts once), once every container is Ready and each of ``killed`` has restarted."""
    waiting = [""]

    def counted() -> dict[str, int] | None:
        unready = _unready(api, namespaces)
        now = components(api, namespaces)
        out = {}
        for key, (uid, restarts, _pid) in before.items():
            if key not in now:
                waiting[0] = f"{key} has no running container"
                return None
            uid2, restarts2, _ = now[key]
            out[key] = 1 if uid2 != uid else restarts2 - restarts
        if unready or not all(out[key] for key in killed):
            waiting[0] = f"not Ready: {unready}; restarts: {out}"
            return None
        return out

    try:
        return wait_for(counted, 120, "every component Ready again")
    except WaitTimeout:
        pytest.fail(f"components not back after 120 s: {waiting[0]}")


def _unready(api: client.ApiClient, namespaces: tuple[str, ...]) -> list[str]:
    core = client.CoreV1Api(api)
    return [
        f"{ns}/{pod.metadata.name}"
        for ns in namespaces
        for pod in core.list_namespaced_pod(ns).items
        if pod.status.phase != "Succeeded" and not _ready(pod)
    ]


def _ready(pod: client.V1Pod) -> bool:
    statuses = pod.status.container_statuses or []
    return bool(statuses) and all(c.ready for c in statuses)


def settle(w: Work) -> None:
    """Every piece of work finished, then what must hold."""
    w.finish()
    left = [""]

    def finished() -> bool:
        left[0] = w.done() or ""
        return not left[0]

    try:
        wait_for(finished, SETTLE, "all work finished", 2.0)
    except WaitTimeout:
        pytest.fail(f"not finished {SETTLE}s after the last hurt: {left[0]}")
    ledger = w.ledger
    with ledger.lock:
        twice = {wl: n for wl, n in ledger.admitted.items() if n != 1}
        assert not twice, f"Workloads admitted more than once: {twice}"
        assert len(ledger.admitted) == len(w.jobs), ledger.admitted
        listed = client.CustomObjectsApi(w.api).list_namespaced_custom_object(
            kueue_api.GROUP, kueue_api.VERSION, w.kueue, "workloads"
        )
        peak = peak_usage(listed["items"])
        assert 0 < peak <= QUOTA, f"admitted GPUs peaked at {peak}"
        moved = {pod: nodes for pod, nodes in ledger.nodes.items() if len(nodes) > 1}
        assert not moved, f"pods bound to two nodes: {moved}"
    _no_gpu_twice(w)
    _hami_within_capacity(w)
    wait_for(lambda: not _held_locks(w.api), 30, "no HAMi node lock held")


def _no_gpu_twice(w: Work) -> None:
    """No GPU in two running pods' Allocate responses (the node agent's record)."""
    core = client.CoreV1Api(w.api)
    owner: dict[tuple[str, str], str] = {}
    for ns in (w.gang, w.volcano):
        for pod in core.list_namespaced_pod(ns).items:
            if pod.status.phase != "Running":
                continue
            container = pod.spec.containers[0].name
            envs = w.cluster.local.allocation(ns, pod.metadata.name, container)
            assert envs, f"{ns}/{pod.metadata.name} runs without an Allocate record"
            for gpu in envs["NVIDIA_VISIBLE_DEVICES"].split(","):
                key = (pod.spec.node_name, gpu)
                assert key not in owner, f"{key} given to {owner.get(key)} and {pod.metadata.name}"
                owner[key] = pod.metadata.name
    assert len(owner) == GANG * (len(w.gangs) + len(w.vcjobs))


def _hami_within_capacity(w: Work) -> None:
    """HAMi's shares of each GPU within its memory and its split count."""
    core = client.CoreV1Api(w.api)
    used: dict[str, list[int]] = {}
    for pod in core.list_namespaced_pod(w.hami).items:
        if pod.status.phase != "Running":
            continue
        value = (pod.metadata.annotations or {}).get(ha.DEVICES_ALLOCATED, "")
        for container in ha.decode_pod_devices(value):
            for d in container:
                mem_count = used.setdefault(d.uuid, [0, 0])
                mem_count[0] += d.usedmem
                mem_count[1] += 1
    assert sum(c for _m, c in used.values()) == len(w.vgpu)
    for node in core.list_node(label_selector="gpu=on").items:
        for dev in ha.decode_node_devices(node.metadata.annotations[ha.NODE_REGISTER]):
            mem, count = used.get(dev.id, [0, 0])
            assert mem <= dev.devmem and count <= dev.count, f"{dev.id}: {mem} MiB, {count} shares"


def _held_locks(api: client.ApiClient) -> list[str]:
    nodes = client.CoreV1Api(api).list_node().items
    return [n.metadata.name for n in nodes if ha.NODE_LOCK in (n.metadata.annotations or {})]


# ------------------------------------------------------------------- the hurts


def _process(local: LocalCluster, name: str) -> ProcessRecord:
    return next(p for p in local.processes() if p.name == name)


@contextlib.contextmanager
def frozen(local: LocalCluster, name: str) -> Iterator[None]:
    """``name`` stopped (SIGSTOP) for the block: alive, holding its sockets, answering
    nothing, as a process stalled on a dead disk or a long GC pause."""
    pid = _process(local, name).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def kill_and_restart(local: LocalCluster, name: str) -> None:
    """kill -9 a host process and start it again as its supervisor would (systemd for
    kube-apiserver and the node agents of a kubeadm node)."""
    rec = _process(local, name)
    os.kill(rec.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(rec.pid, rec.exe), 10, f"{name} to die")
    # a killed Go server's leader thread is a zombie before its other threads have
    # closed the process's sockets: start again once its ports are free
    wait_for(lambda: not any(port_in_use(p) for p in rec.ports), 10, f"{name}'s ports free")
    local.start_process(rec.name, rec.argv, rec.ports, rec.env, rec.service)


# ------------------------------------------------------------------- the tests


def test_control_plane_outages_mid_flow_lose_and_double_nothing(rcluster: Cluster) -> None:
    """kube-apiserver frozen, then etcd frozen, then kube-apiserver killed and started
    again, each with a batch of every chapter's work in flight; a last batch after the
    outages is placed only if every component's informers came back. No component needs
    more than one restart (a leader that lost its lease exits, as upstream's do)."""
    local = rcluster.local
    before = components(rcluster.api)
    with work(rcluster) as w:
        w.start("a")
        with frozen(local, "kube-apiserver"):
            time.sleep(FREEZE_SECONDS)
        w.start("b")
        with frozen(local, "etcd"):
            time.sleep(FREEZE_SECONDS)
        w.start("c")
        kill_and_restart(local, "kube-apiserver")
        local.wait_http(f"{local.server}/readyz", "kube-apiserver")
        w.start("d")
        settle(w)
    restarts = restarts_since(rcluster.api, before)
    assert all(n <= 1 for n in restarts.values()), restarts


def test_every_component_killed_mid_flow_is_restarted_once_and_loses_nothing(
    rcluster: Cluster,
) -> None:
    """kill -9 every component container (the pod runner restarts each, as kubelet does)
    and every node agent (started again, as systemd restarts kubelet), one after the
    other while a batch is in flight; a second batch once they are back. Not before:
    a vGPU pod created while HAMi's webhook is down is let through unmutated
    (failurePolicy Ignore, as upstream's chart) to default-scheduler, where it stays
    Unschedulable for want of nvidia.com/gpumem."""
    local = rcluster.local
    before = components(rcluster.api)
    assert len(before) >= 8, sorted(before)  # device plugins, HAMi, Kueue, Volcano, ...
    agents = [p.name for p in local.processes() if p.name.startswith("node-agent-")]
    with work(rcluster) as w:
        w.start("a")
        for _uid, _restarts, pid in before.values():
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        for name in agents:
            kill_and_restart(local, name)
        restarts = restarts_since(rcluster.api, before, killed=before)
        w.start("b")
        settle(w)
    assert restarts == dict.fromkeys(before, 1), restarts
    assert restarts_since(rcluster.api, before) == restarts  # none restarted again
