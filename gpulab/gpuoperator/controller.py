"""The ClusterPolicy controller and the node-labelling controller, and their manager.

Mirrors NVIDIA gpu-operator v26.7.0:
- ``controllers/clusterpolicy_controller.go``: ``Reconcile`` (fetch the ClusterPolicy;
  only the singleton - the oldest - is reconciled, every other one is ``ignored``;
  ``clusterPolicyCtrl.init`` discovers the GPU nodes; the state walk of
  :mod:`gpulab.gpuoperator.states`; ``updateCRState`` and the conditions; requeue after
  5 s while a state is not ready) and ``SetupWithManager`` (one worker, a
  100 ms-3 s exponential back-off, watches on ClusterPolicies with a changed generation,
  on GPU nodes (``addWatchNewGPUNode``) and on the DaemonSets it owns);
- ``controllers/nodelabeling_controller.go``: ``NodeLabelingReconciler`` (all node label
  writes, :mod:`gpulab.gpuoperator.nodelabels`), on the singleton key ``cluster``;
- ``controllers/operator_metrics.go``: the ``gpu_operator_*`` metrics the lab sets;
- ``cmd/gpu-operator/main.go``: the manager's cache scoped to the operator's namespace,
  the metrics (``--metrics-bind-address``) and probe (``--health-probe-bind-address``)
  endpoints.

The manager is the lab's: one :class:`gpulab.informer.Informer` per kind (the cache),
one :class:`gpulab.workqueue.WorkQueue` and worker per controller (controller-runtime's
Reconcile contract: idempotent, returns the requeue delay, an exception backs off).

Deliberate differences: ``NewClusterPolicyReconciler`` is the lab's constructor (v26.7.0
builds the struct in main.go; the name is the one the chapter's seed uses); an ignored
ClusterPolicy gets ``status.state: ignored`` written and a trace Event saying which one is
active (upstream sets the state on its in-memory copy only and records no Event, so
kubectl shows no state); the GPUCluster/NVIDIADriver CRDs, OpenShift, precompiled and
driver-upgrade paths are not simulated.
"""

from __future__ import annotations

import datetime as dt
import http.server
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from gpulab.gpuoperator import api, controls, nodelabels, render, states
from gpulab.informer import NODES, Handlers, Informer, ListWatch, Obj, Resource, Store, key_of
from gpulab.kube import own_pod
from gpulab.probes import GetOnly
from gpulab.trace import ObjectRef, Tracer
from gpulab.wait import retry_call
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger("gpulab.gpuoperator")

NODE_LABELING_KEY = "cluster"  # nodeLabelingControllerSingletonName
MIN_DELAY, MAX_DELAY = 0.1, 3.0  # minDelayCR, maxDelayCR
CACHE_SYNC_TIMEOUT = 60.0

# reconciliationStatus values
STATUS_SUCCESS, STATUS_NOT_READY, STATUS_UNAVAILABLE = 1, 0, -1


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _generation(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def policy_ref(policy: Mapping[str, Any]) -> ObjectRef:
    meta = policy.get("metadata") or {}
    return ObjectRef(api.KIND, str(meta.get("name")), uid=meta.get("uid"),
                     api_version=f"{api.GROUP}/{api.VERSION}")  # fmt: skip


# ---------------------------------------------------------------- the manager


@dataclass
class Manager:
    """``ctrl.Manager``: the shared cache (an informer per kind, started lazily) and the
    controllers' workers; ``start`` waits for every cache to sync before any Reconcile."""

    api: client.ApiClient
    namespace: str
    informers: dict[str, Informer] = field(default_factory=dict)
    _handlers: dict[str, list[Handlers]] = field(default_factory=dict)
    _workers: list[tuple[WorkQueue, Callable[[str], float | None], str]] = field(
        default_factory=list
    )
    _threads: list[threading.Thread] = field(default_factory=list)
    synced: threading.Event = field(default_factory=threading.Event)

    def cache(self, kind: str, resource: Resource) -> Store:
        """The store of ``kind``, cached from the operator's namespace when namespaced."""
        if kind not in self.informers:
            namespace = self.namespace if resource.namespaced else None
            handlers = Handlers(
                on_add=lambda o, k=kind: self._fan(k, "on_add", o),
                on_update=lambda old, new, k=kind: self._fan(k, "on_update", old, new),
                on_delete=lambda o, k=kind: self._fan(k, "on_delete", o),
            )
            self.informers[kind] = Informer(
                ListWatch(self.api, resource, namespace=namespace), handlers, name=f"cache-{kind}"
            )
        return self.informers[kind].store

    def watch(self, kind: str, resource: Resource, handlers: Handlers) -> None:
        """``c.Watch(source.Kind(mgr.GetCache(), ...))``."""
        self.cache(kind, resource)
        self._handlers.setdefault(kind, []).append(handlers)

    def _fan(self, kind: str, hook: str, *args: Obj) -> None:
        for h in self._handlers.get(kind, []):
            fn = getattr(h, hook)
            if fn is not None:
                fn(*args)

    def add_controller(
        self, queue: WorkQueue, reconcile: Callable[[str], float | None], name: str
    ) -> None:
        self._workers.append((queue, reconcile, name))

    def start(self) -> None:
        for inf in self.informers.values():
            inf.start()
        for kind, inf in self.informers.items():
            if not inf.wait_for_sync(CACHE_SYNC_TIMEOUT):
                raise RuntimeError(f"the {kind} cache did not sync in {CACHE_SYNC_TIMEOUT:g}s")
        self.synced.set()
        for queue, reconcile, name in self._workers:
            thread = threading.Thread(
                target=run_worker, args=(queue, reconcile, name), name=name, daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        for queue, _reconcile, _name in self._workers:
            queue.shutdown()
        for inf in self.informers.values():
            inf.stop()


# ---------------------------------------------------------------- metrics


class OperatorMetrics:
    """``InitOperatorMetrics``: the gauges and counters the lab's Reconcile sets."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ns = "gpu_operator"
        self.gpu_nodes_total = Gauge(
            "gpu_nodes_total", "Number of nodes with GPUs", namespace=ns, registry=self.registry
        )
        self.last_success = Gauge(
            "reconciliation_last_success_ts_seconds",
            "Timestamp (in seconds) of the last reconciliation loop success",
            namespace=ns,
            registry=self.registry,
        )
        self.status = Gauge(
            "reconciliation_status",
            "1 if the reconciliation is currently successful, 0 if the operands are not "
            "ready, -1 if the cluster policy is unavailable, -2 if an error occurred within "
            "the operator.",
            namespace=ns,
            registry=self.registry,
        )
        self.total = Counter(
            "reconciliation", "Total number of reconciliation", namespace=ns,
            registry=self.registry,
        )  # fmt: skip
        self.failed = Counter(
            "reconciliation_failed", "Number of failed reconciliation", namespace=ns,
            registry=self.registry,
        )  # fmt: skip
        self.has_nfd_labels = Gauge(
            "reconciliation_has_nfd_labels",
            "1 if NFD mandatory kernel labels have been found, 0 otherwise",
            namespace=ns,
            registry=self.registry,
        )


# ---------------------------------------------------------------- ClusterPolicy controller


class ClusterPolicyReconciler:
    """``ClusterPolicyReconciler``: reconciles the singleton ClusterPolicy."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        image: str,
        tracer: Tracer,
        metrics: OperatorMetrics,
    ) -> None:
        self.api = api_client
        self.custom = client.CustomObjectsApi(api_client)  # the status writes
        self.namespace = namespace
        self.image = image
        self.tracer = tracer
        self.metrics = metrics
        self.queue = WorkQueue(base_delay=MIN_DELAY, max_delay=MAX_DELAY)
        self.ctrl = states.ClusterPolicyController()
        self.policies: Store = Store()
        self.nodes: Store = Store()
        self.cluster: controls.Cluster | None = None
        self._last: dict[str, str] = {}  # state -> status of the previous pass (the trace)

    # ------------------------------------------------------------ setup

    def SetupWithManager(self, mgr: Manager) -> None:
        self.policies = mgr.cache(api.KIND, api.CLUSTERPOLICIES)
        self.nodes = mgr.cache("Node", NODES)
        stores = {kind: mgr.cache(kind, res) for kind, res in controls.RESOURCES.items()}
        self.cluster = controls.KubeCluster(self.api, stores)
        mgr.watch(
            api.KIND,
            api.CLUSTERPOLICIES,
            Handlers(
                on_add=lambda p: self.queue.add(key_of(p)),
                # predicate.GenerationChangedPredicate
                on_update=lambda old, new: (
                    _generation(old) != _generation(new) and self.queue.add(key_of(new))
                ),
                on_delete=lambda p: self.queue.add(key_of(p)),
            ),
        )
        mgr.watch(
            "Node",
            NODES,
            Handlers(
                on_add=lambda n: nodelabels.has_gpu_labels(_labels(n)) and self._enqueue_all(),
                on_update=lambda old, new: (
                    nodelabels.cluster_policy_wanted(_labels(old), _labels(new))
                    and self._enqueue_all()
                ),
            ),
        )
        mgr.watch(
            "DaemonSet",
            controls.RESOURCES["DaemonSet"],
            Handlers(  # handler.EnqueueRequestForOwner(..., OnlyControllerOwner())
                on_add=self._enqueue_owner,
                on_update=lambda _old, new: self._enqueue_owner(new),
                on_delete=self._enqueue_owner,
            ),
        )
        mgr.add_controller(self.queue, self.Reconcile, "clusterpolicy-controller")
        for state in states.STATES:  # clusterPolicyCtrl.init: addState, once
            docs = render.load_state(state)
            self.ctrl.add_state(
                state,
                controls.add_resources_controls(
                    docs, self.cluster, self.namespace, self.image, self._observe
                ),
            )

    def _enqueue_all(self) -> None:
        """``enqueueAllClusterPolicies``."""
        for policy in self.policies.list():
            self.queue.add(key_of(policy))

    def _enqueue_owner(self, obj: Obj) -> None:
        for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if owner.get("kind") == api.KIND and owner.get("controller"):
                self.queue.add(str(owner.get("name")))

    def _observe(self, verb: str, kind: str, obj: Obj) -> None:
        """A control changed an object: one trace step named after the control."""
        meta = obj.get("metadata") or {}
        ref = ObjectRef(kind, meta.get("name", ""), namespace=meta.get("namespace"),
                        api_version=controls.RESOURCES[kind].api_version)  # fmt: skip
        self.tracer.step(kind, ref, f"{verb} for {self.ctrl.state} (ClusterPolicy "
                         f"{(self.ctrl.singleton.get('metadata') or {}).get('name')})",
                         state=self.ctrl.state)  # fmt: skip

    # ------------------------------------------------------------ Reconcile

    def Reconcile(self, name: str) -> float | None:
        instance = self.policies.get(name)
        if instance is None:  # deleted: its objects go with it (owner references)
            self.metrics.status.set(STATUS_UNAVAILABLE)
            return None
        active = api.singleton(self.policies.list())
        if active is not None and (active.get("metadata") or {}).get("name") != name:
            self._ignore(instance, active)
            return None
        self._init(instance)
        self.metrics.total.inc()
        try:
            result = states.walk(self.ctrl, self._on_step)
        except ApiException as exc:
            state = self.ctrl.state_names[min(self.ctrl.idx, len(self.ctrl.state_names) - 1)]
            message = f"Failed to reconcile {state}: {exc.status} {exc.reason}"
            self.metrics.status.set(STATUS_NOT_READY)
            self.metrics.failed.inc()
            self._update_status(name, api.NOT_READY, (api.COND_ERROR, api.RECONCILE_FAILED,
                                                      message))  # fmt: skip
            self.tracer.step("Reconcile", policy_ref(instance), message, warning=True)
            raise
        end = states.outcome(result, self.ctrl.has_nfd_labels, self.ctrl.has_gpu_nodes)
        self._update_status(name, end.state, end.condition)
        if end.state == api.READY:
            self.metrics.status.set(STATUS_SUCCESS)
            self.metrics.last_success.set(time.time())
        else:
            self.metrics.status.set(STATUS_NOT_READY)
            self.metrics.failed.inc()
        requeue = f"; requeue after {end.requeue_after:g}s" if end.requeue_after else ""
        why = (
            f"states not ready: {', '.join(result.not_ready)}"
            if result.not_ready
            else end.condition[2]
        )
        self.tracer.step(
            "Reconcile",
            policy_ref(instance),
            f"status.state {end.state}: {why}{requeue}",
            state=end.state,
            not_ready=result.not_ready,
        )
        return end.requeue_after

    def _init(self, instance: Obj) -> None:
        """``clusterPolicyCtrl.init``: the singleton, and ``discoverGPUNodes`` (labels are
        the NodeLabelingReconciler's to write)."""
        self.ctrl.singleton = instance
        nodes = self.nodes.list()
        self.ctrl.has_nfd_labels = any(nodelabels.has_nfd_labels(_labels(n)) for n in nodes)
        gpu_nodes = sum(nodelabels.has_common_gpu_label(_labels(n)) for n in nodes)
        self.ctrl.has_gpu_nodes = gpu_nodes > 0
        self.metrics.gpu_nodes_total.set(gpu_nodes)
        self.metrics.has_nfd_labels.set(1 if self.ctrl.has_nfd_labels else 0)

    def _on_step(self, state: str, status: str) -> None:
        """ "ClusterPolicy step completed": traced when a state's status changes."""
        if self._last.get(state) == status:
            return
        self._last[state] = status
        why = self.ctrl.why.get(state)  # a DaemonSet's readiness changes with its nodes
        self.tracer.step(
            "step", policy_ref(self.ctrl.singleton),
            f"{state}: {status}" + (f" ({why})" if why else ""), state=state, status=status,
        )  # fmt: skip

    def _ignore(self, instance: Obj, active: Obj) -> None:
        name = (instance.get("metadata") or {}).get("name")
        winner = (active.get("metadata") or {}).get("name")
        if (instance.get("status") or {}).get("state") != api.IGNORED:
            self._update_status(str(name), api.IGNORED, None)
        self.tracer.step(
            "Reconcile",
            policy_ref(instance),
            f"ignored: ClusterPolicy {winner} is the active one (the oldest); only one "
            "ClusterPolicy is reconciled",
            warning=True,
            active=winner,
        )

    def _update_status(self, name: str, state: str, condition: tuple[str, str, str] | None) -> None:
        """``updateCRState`` + ``SetConditionsReady``/``SetConditionsError``: read the
        latest, change what differs, PUT the status subresource; retried on a conflict."""
        custom = self.custom

        def write() -> None:
            current = custom.get_cluster_custom_object(
                api.GROUP, api.VERSION, api.CLUSTERPOLICIES.plural, name
            )
            status = dict(current.get("status") or {})
            wanted = {**status, "state": state, "namespace": self.namespace}
            if condition is not None:
                kind, reason, message = condition
                wanted["conditions"] = states.conditions(
                    status.get("conditions") or [], kind, reason, message, _now()
                )
            if wanted == status:
                return
            current["status"] = wanted
            custom.replace_cluster_custom_object_status(
                api.GROUP, api.VERSION, api.CLUSTERPOLICIES.plural, name, current
            )

        try:
            retry_call(write, lambda e: isinstance(e, ApiException) and e.status == 409, attempts=5)
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile
                raise


def NewClusterPolicyReconciler(
    api_client: client.ApiClient,
    namespace: str,
    image: str,
    tracer: Tracer,
    metrics: OperatorMetrics,
) -> ClusterPolicyReconciler:
    """The reconciler main() sets up (``&controllers.ClusterPolicyReconciler{...}``)."""
    return ClusterPolicyReconciler(api_client, namespace, image, tracer, metrics)


# ---------------------------------------------------------------- node labelling


class NodeLabelingReconciler:
    """``NodeLabelingReconciler``: every GPU node labelled for the active ClusterPolicy."""

    def __init__(self, api_client: client.ApiClient, tracer: Tracer) -> None:
        self.api = api_client
        self.tracer = tracer
        self.queue = WorkQueue(base_delay=MIN_DELAY, max_delay=MAX_DELAY)
        self.policies: Store = Store()
        self.nodes: Store = Store()

    def SetupWithManager(self, mgr: Manager) -> None:
        self.policies = mgr.cache(api.KIND, api.CLUSTERPOLICIES)
        self.nodes = mgr.cache("Node", NODES)
        enqueue = lambda *_: self.queue.add(NODE_LABELING_KEY)  # noqa: E731
        mgr.watch(
            api.KIND,
            api.CLUSTERPOLICIES,
            Handlers(  # singletonCRPredicate
                on_add=enqueue,
                on_update=lambda old, new: _generation(old) != _generation(new) and enqueue(),
                on_delete=enqueue,
            ),
        )
        mgr.watch(
            "Node",
            NODES,
            Handlers(
                on_add=lambda n: nodelabels.has_gpu_labels(_labels(n)) and enqueue(),
                on_update=lambda old, new: (
                    nodelabels.relabel_needed(_labels(old), _labels(new)) and enqueue()
                ),
            ),
        )
        mgr.add_controller(self.queue, self.Reconcile, "node-labeling-controller")

    def Reconcile(self, _key: str) -> float | None:
        policy = api.singleton(self.policies.list())
        if policy is None:
            return None  # "No ClusterPolicy or GPUCluster CR exists, skipping node labeling"
        core = client.CoreV1Api(self.api)
        spec = api.spec_of(policy)
        for node in self.nodes.list():
            labels = _labels(node)
            wanted = nodelabels.gpu_node_labels(labels, spec)
            patch = nodelabels.label_patch(labels, wanted)
            if not patch:
                continue
            name = node["metadata"]["name"]
            core.patch_node(name, {"metadata": {"labels": patch}})
            shown = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in patch.items())
            self.tracer.step("labelGPUNodes", ObjectRef("Node", name), shown, labels=patch)
        return None


# ---------------------------------------------------------------- main


def _split(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host or "0.0.0.0"), int(port or default_port)


class _Probes(GetOnly):
    synced: threading.Event

    def do_GET(self) -> None:
        ok = self.path == "/healthz" or (self.path == "/readyz" and self.synced.is_set())
        body = b"ok" if ok else b"not ready"
        self.send_response(200 if ok else 503 if self.path == "/readyz" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


def serve_probes(address: str, synced: threading.Event) -> http.server.ThreadingHTTPServer:
    """``/healthz`` (always) and ``/readyz`` (once the caches synced)."""
    handler = type("Probes", (_Probes,), {"synced": synced})
    server = http.server.ThreadingHTTPServer(_split(address, 8081), handler)
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server


def run(
    api_client: client.ApiClient,
    namespace: str,
    image: str,
    metrics_address: str,
    probe_address: str,
    stop: threading.Event,
) -> None:
    """main(): the manager with both controllers, until ``stop``."""
    cfg = api_client.configuration
    cfg.connection_pool_maxsize = 32  # one watch per cached kind, and the writes
    api_client = client.ApiClient(cfg)
    tracer = Tracer("gpu-operator", api_client)
    metrics = OperatorMetrics()
    host, port = _split(metrics_address, 8080)
    start_http_server(port, host, registry=metrics.registry)
    mgr = Manager(api_client, namespace)
    probes = serve_probes(probe_address, mgr.synced)
    # main's steps, as Events on the operator's own pod (where the manifest names it)
    pod = own_pod()
    me = ObjectRef("Pod", pod[1], pod[0]) if pod else None
    tracer.step("NewManager", me, f"ctrl.NewManager: cache scoped to namespace {namespace}; "
                f"metrics on {metrics_address}, probes on {probe_address}")  # fmt: skip
    NewClusterPolicyReconciler(api_client, namespace, image, tracer, metrics).SetupWithManager(mgr)
    NodeLabelingReconciler(api_client, tracer).SetupWithManager(mgr)
    tracer.step("SetupWithManager", me, "ClusterPolicyReconciler and NodeLabelingReconciler: "
                f"watches on {', '.join(mgr.informers)}")  # fmt: skip
    try:
        mgr.start()
        tracer.step("Start", me, f"mgr.Start: {len(mgr.informers)} caches synced, the "
                    "controllers' workers started: Reconcile runs from now on")  # fmt: skip
        _log.info("gpu-operator: caches synced, controllers started in namespace %s", namespace)
        stop.wait()
    finally:
        mgr.stop()
        probes.shutdown()
        tracer.flush(timeout=2)
