"""The scheduler process: informers feed the cache and the queue; one loop schedules.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/scheduler.go`` (``New`` builds a framework per
profile, ``Run`` starts the queue's flush loops and calls ``ScheduleOne`` until stopped)
and ``eventhandlers.go`` (``addAllEventHandlers``: unscheduled pods of our profiles go to
the queue, bound pods and nodes to the cache, and each change is a cluster event - Node
adds, deletes and ``NodeSchedulingPropertiesChange``, AssignedPod adds, deletes and
``PodSchedulingPropertiesChange``, the custom resources plugins registered - handed to
the queue with the objects before and after, for the plugins' queueing hints; a deleted
pod waiting at Permit is rejected; a pod whose nominatedNodeName goes away is an
AssignedPodDelete for pods of no higher priority). The pod informer leaves finished pods
out (``status.phase!=Succeeded,status.phase!=Failed``), as upstream's.

This is the I/O edge of gpulab/framework: list+watch through gpulab.informer, Events
through the events.k8s.io API (reportingController = the profile's scheduler name, as
kube-scheduler's recorder), the pod's PodScheduled condition and nominatedNodeName
through the status subresource, Bindings through gpulab.framework.binding. Each queueing
hint decision about a pod is a ``QueueingHint`` trace step on it (upstream: a log line
at verbosity 5), e.g. "NodeUpdateNodeLabel: no rejector (Coscheduling) registered for
it; stays in unschedulablePods".

Lab differences: no leader election, no metrics; /healthz and /readyz over plain HTTP;
custom resources a plugin watches are named in events as upstream's
``<plural>.<version>.<group>``.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import http.server
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from gpulab.framework.binding import KubeBinder
from gpulab.framework.cache import Cache
from gpulab.framework.config import SchedulerConfiguration
from gpulab.framework.events import (
    EVENT_ASSIGNED_POD_ADD,
    EVENT_ASSIGNED_POD_DELETE,
    EVENT_NODE_ADD,
    EVENT_NODE_DELETE,
    ActionType,
    ClusterEvent,
    node_scheduling_properties_change,
    pod_scheduling_properties_change,
)
from gpulab.framework.interface import QueuedPodInfo
from gpulab.framework.plugins.queuesort import pod_priority
from gpulab.framework.queue import (
    ACTIVE_Q,
    BACKOFF_Q,
    UNSCHEDULABLE_Q,
    SchedulingQueue,
    build_queueing_hint_map,
    scheduler_name,
)
from gpulab.framework.runtime import Framework, Registry
from gpulab.framework.schedule_one import Scheduler
from gpulab.framework.snapshot import node_name_of, pod_key, pod_uid
from gpulab.informer import (
    NODES,
    PODS,
    Handlers,
    Informer,
    ListWatch,
    Resource,
    Store,
    resource_version,
)
from gpulab.probes import GetOnly
from gpulab.trace import Tracer

_log = logging.getLogger(__name__)

Obj = Mapping[str, Any]
SYNC_WARN_EVERY = 10.0  # seconds between "waiting for caches" lines
NOT_FINISHED = "status.phase!=Succeeded,status.phase!=Failed"


_OUTCOMES = {
    UNSCHEDULABLE_Q: "stays in unschedulablePods",
    BACKOFF_Q: "moved to backoffQ",
    ACTIVE_Q: "moved to activeQ",
}


def _priority_at_most(priority: int) -> Callable[[Obj], bool]:
    """getLEPriorityPreCheck."""
    return lambda pod: pod_priority(pod) <= priority


def event_resource(resource: Resource) -> str:
    """How upstream names a custom resource in ClusterEvents."""
    return f"{resource.plural}.{resource.version}.{resource.group}"


class SchedulerInformers:
    """The informers of one scheduler process; plugins add theirs (and handlers on the
    scheduler's own, as upstream plugins do on the shared informer factory)."""

    def __init__(self, api: client.ApiClient, on_event: Any) -> None:
        self.api = api
        self._on_event = on_event
        self._informers: dict[Resource, Informer] = {}
        self._extra: dict[Resource, list[Handlers]] = {}
        self.event_resources: set[str] = set()  # the custom resources plugins registered

    def add(self, informer: Informer) -> Informer:
        """Register ``informer``; handlers added later through :meth:`store` run after its
        own."""
        resource = informer.lw.resource
        own = informer.handlers
        extra = self._extra.setdefault(resource, [])

        def fan_out(attr: str) -> Any:
            def call(*objs: Obj) -> None:
                for h in (own, *extra):
                    fn = getattr(h, attr)
                    if fn is not None:
                        fn(*objs)

            return call

        informer.handlers = Handlers(fan_out("on_add"), fan_out("on_update"), fan_out("on_delete"))
        self._informers[resource] = informer
        return informer

    def store(self, resource: Resource, handlers: Handlers | None = None) -> Store:
        """The store of ``resource`` (an informer is created for it; if a plugin registered
        events of the resource, its adds, updates and deletes become cluster events),
        plus ``handlers`` to call."""
        if resource not in self._informers:
            name = event_resource(resource)

            def emit(action: ActionType, old: Obj | None, new: Obj | None) -> None:
                if name in self.event_resources:
                    self._on_event(ClusterEvent(name, action), old, new)

            def updated(old: Obj, new: Obj) -> None:
                if resource_version(old) != resource_version(new):
                    emit(ActionType.UPDATE, old, new)

            events = Handlers(
                on_add=lambda o: emit(ActionType.ADD, None, o),
                on_update=updated,
                on_delete=lambda o: emit(ActionType.DELETE, o, None),
            )
            self.add(Informer(ListWatch(self.api, resource), events, name=f"informer-{name}"))
        if handlers is not None:
            self._extra[resource].append(handlers)
        return self._informers[resource].store

    def start(self) -> None:
        for informer in self._informers.values():
            informer.start()

    def wait_for_sync(self, timeout: float) -> list[str]:
        """Resources whose first listing has not arrived within ``timeout``."""
        deadline = time.monotonic() + timeout
        return [
            r.plural
            for r, inf in self._informers.items()
            if not inf.wait_for_sync(max(0.0, deadline - time.monotonic()))
        ]

    def synced(self) -> list[str]:
        """The resources watched, in the order their informers were added."""
        return [r.plural for r in self._informers]

    def stop(self) -> None:
        for informer in self._informers.values():
            informer.stop()


class KubeSchedulerIO:
    """SchedulerIO over the API server: Events posted from a background thread (the
    scheduling loop never waits for them), the PodScheduled condition patched."""

    def __init__(self, api: client.ApiClient, pods: Store) -> None:
        self._core = client.CoreV1Api(api)
        self._events = client.EventsV1Api(api)
        self._pods = pods
        self._poster = concurrent.futures.ThreadPoolExecutor(1, "scheduler-events")
        self._host = socket.gethostname()

    def current_pod(self, pod: Obj) -> Obj | None:
        return self._pods.get(pod_key(pod))

    def record_event(
        self, fwk: Framework, pod: Obj, reason: str, action: str, note: str, warning: bool
    ) -> None:
        meta = pod.get("metadata") or {}
        now = dt.datetime.now(dt.UTC)
        body = client.EventsV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{meta.get('name')}.{time.time_ns():x}", namespace=meta.get("namespace")
            ),
            event_time=now,
            reporting_controller=fwk.profile_name,
            reporting_instance=f"{fwk.profile_name}-{self._host}"[:128],
            action=action,
            reason=reason,
            type="Warning" if warning else "Normal",
            note=note[:1024],
            regarding=client.V1ObjectReference(
                kind="Pod",
                api_version="v1",
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
            ),
        )
        _log.info("%s %s: %s", reason, pod_key(pod), note)
        self._poster.submit(self._post, body)

    def _post(self, body: client.EventsV1Event) -> None:
        try:
            self._events.create_namespaced_event(body.metadata.namespace, body)
        except Exception as exc:  # the API server may be away; never stop scheduling
            _log.warning("could not post Event %s: %s", body.reason, exc)

    def patch_pod_status(
        self, pod: Obj, condition: Mapping[str, str] | None, nominated_node_name: str | None
    ) -> None:
        meta = pod.get("metadata") or {}
        status: dict[str, Any] = {}
        if condition is not None:
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status["conditions"] = [{**condition, "lastTransitionTime": now}]
        if nominated_node_name is not None:
            status["nominatedNodeName"] = nominated_node_name or None  # null removes it
        body = {"status": status}
        self._core.patch_namespaced_pod_status(
            meta["name"],
            meta["namespace"],
            body,
            _content_type="application/strategic-merge-patch+json",
        )


def serve_healthz(sock: socket.socket, ready: threading.Event) -> http.server.HTTPServer:
    """/healthz (and /readyz): 200 once the informers have synced, else 503 (what
    kube-scheduler's health endpoints answer; plain HTTP here)."""

    class Handler(GetOnly):
        def do_GET(self) -> None:
            if self.path not in ("/healthz", "/readyz"):
                self.send_error(404)
                return
            ok = ready.is_set()
            body = b"ok" if ok else b"informers not synced"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # probes every few seconds: no noise
            pass

    server = http.server.ThreadingHTTPServer(
        sock.getsockname()[:2], Handler, bind_and_activate=False
    )
    server.socket.close()
    server.socket = sock
    server.server_activate()
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server


class SchedulerProcess:
    """Everything one ``gpulab scheduler`` runs: informers, frameworks, queue, loops."""

    def __init__(
        self,
        config: SchedulerConfiguration,
        registry: Registry,
        api: client.ApiClient,
        component: str,
    ) -> None:
        self.api = api
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.informers = SchedulerInformers(api, self._on_cluster_event)
        self.cache = Cache()
        self.tracer = Tracer(component, api)
        # the scheduler's own informers first: plugins add handlers to them
        pods = self.informers.add(
            Informer(
                ListWatch(api, PODS, field_selector=NOT_FINISHED),
                Handlers(self._pod_added, self._pod_updated, self._pod_deleted),
                name="informer-pods",
            )
        )
        self.informers.add(
            Informer(
                ListWatch(api, NODES),
                Handlers(self._node_added, self._node_updated, self._node_deleted),
                name="informer-nodes",
            )
        )
        binder = KubeBinder(api)
        self.profiles: dict[str, Framework] = {}
        waiting = None
        for profile in config.profiles:
            fwk = Framework(
                profile,
                registry,
                informers=self.informers,
                binder=binder,
                tracer=self.tracer,
                waiting_pods=waiting,
            )
            waiting = fwk.waiting_pods  # one waitingPods map shared by all profiles
            self.profiles[profile.scheduler_name] = fwk
        first = next(iter(self.profiles.values()))
        hints = {
            name: build_queueing_hint_map(fwk.EnqueueExtensions())
            for name, fwk in self.profiles.items()
        }
        self.informers.event_resources = {event.resource for m in hints.values() for event, _ in m}
        self.queue = SchedulingQueue(
            first.QueueSortFunc(),
            hints,
            {name: fwk.PreEnqueuePlugins() for name, fwk in self.profiles.items()},
            config.pod_initial_backoff_seconds,
            config.pod_max_backoff_seconds,
            on_hint=self._trace_hint,
        )
        self.scheduler = Scheduler(
            self.profiles,
            self.queue,
            self.cache,
            KubeSchedulerIO(api, pods.store),
            config.percentage_of_nodes_to_score,
        )

    def _trace_hint(self, qpi: QueuedPodInfo, event: ClusterEvent, where: str, why: str) -> None:
        """A queueing decision about a pod, as a trace step on it."""
        fwk = self.profiles.get(scheduler_name(qpi.pod))
        if fwk is None:
            return
        outcome = _OUTCOMES.get(where, where)
        fwk.trace("QueueingHint", qpi.pod, f"{event}: {why}; {outcome}", event=event.label)

    # ------------------------------------------------------------------ event handlers

    def _responsible(self, pod: Obj) -> bool:
        return scheduler_name(pod) in self.profiles

    def _on_cluster_event(
        self,
        event: ClusterEvent,
        old: Obj | None,
        new: Obj | None,
        pre_check: Callable[[Obj], bool] | None = None,
    ) -> None:
        moved = self.queue.MoveAllToActiveOrBackoffQueue(event, old, new, pre_check)
        if moved:
            _log.debug("%s moved %s", event, moved)

    def _pod_added(self, pod: Obj) -> None:
        if node_name_of(pod):
            self.cache.AddPod(pod)
            self._on_cluster_event(EVENT_ASSIGNED_POD_ADD, None, pod)
        elif self._responsible(pod):
            self.queue.Add(pod)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if resource_version(old) == resource_version(new):
            return
        if node_name_of(old):  # updateAssignedPodInCache
            self.cache.UpdatePod(old, new)
            for event in pod_scheduling_properties_change(new, old):
                self._on_cluster_event(event, old, new)
        elif node_name_of(new):  # just bound: it leaves the queue, joins the cache
            self.cache.AddPod(new)
            self._on_cluster_event(EVENT_ASSIGNED_POD_ADD, None, new)
            if self._responsible(old):
                self.queue.Delete(old)
        elif self._responsible(old):  # updatePodInSchedulingQueue
            if self.cache.IsAssumedPod(new):
                meta_old, meta_new = old.get("metadata") or {}, new.get("metadata") or {}
                if meta_new.get("deletionTimestamp") and not meta_old.get("deletionTimestamp"):
                    self._assumed_pod_deleted(new)
                return
            self.queue.Update(old, new)
            nominated = (old.get("status") or {}).get("nominatedNodeName")
            if nominated and nominated != (new.get("status") or {}).get("nominatedNodeName"):
                # the node it was nominated to is free for pods of no higher priority
                self._on_cluster_event(
                    EVENT_ASSIGNED_POD_DELETE, old, None, _priority_at_most(pod_priority(old))
                )

    def _pod_deleted(self, pod: Obj) -> None:
        if node_name_of(pod):
            self.cache.RemovePod(pod)
            self._on_cluster_event(EVENT_ASSIGNED_POD_DELETE, pod, None)
            return
        if not self._responsible(pod):
            return
        self.queue.Delete(pod)
        if self.cache.IsAssumedPod(pod):
            self._assumed_pod_deleted(pod)
        elif (pod.get("status") or {}).get("nominatedNodeName"):
            self._on_cluster_event(
                EVENT_ASSIGNED_POD_DELETE, pod, None, _priority_at_most(pod_priority(pod))
            )

    def _assumed_pod_deleted(self, pod: Obj) -> None:
        """handleAssumedPodDeletion: a pod waiting at Permit is rejected (its binding
        cycle forgets it); any other assumed pod is forgotten here."""
        assumed = self.cache.GetPod(pod)
        if assumed is None:
            return
        fwk = self.profiles[scheduler_name(assumed)]
        if not fwk.RejectWaitingPod(pod_uid(assumed)):
            self.cache.ForgetPod(assumed)
        self._on_cluster_event(EVENT_ASSIGNED_POD_DELETE, assumed, None)

    def _node_added(self, node: Obj) -> None:
        self.cache.AddNode(node)
        self._on_cluster_event(EVENT_NODE_ADD, None, node)

    def _node_updated(self, old: Obj, new: Obj) -> None:
        self.cache.UpdateNode(new)
        for event in node_scheduling_properties_change(new, old):
            self._on_cluster_event(event, old, new)

    def _node_deleted(self, node: Obj) -> None:
        self._on_cluster_event(EVENT_NODE_DELETE, node, None)
        self.cache.RemoveNode(node)

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        """Sync the informers, then schedule until :meth:`stop`."""
        self.informers.start()
        # kube-scheduler's WaitForCacheSync blocks until every cache has synced (its
        # /readyz fails meanwhile): a scheduler without, say, the right to list PodGroups
        # stays not Ready and says why, rather than scheduling on a partial view
        while missing := self.informers.wait_for_sync(SYNC_WARN_EVERY):
            if self.stop_event.is_set():
                return
            _log.warning("waiting for caches to sync: %s", ", ".join(missing))
        self.ready.set()
        names = ", ".join(self.profiles)
        first = next(iter(self.profiles.values()))
        first.trace_start(
            "WaitForCacheSync",
            f"informers synced: {', '.join(self.informers.synced())}; scheduling pods of {names}",
        )
        threading.Thread(target=self.queue.run, args=(self.stop_event,), daemon=True).start()
        while not self.stop_event.is_set():
            try:
                self.scheduler.ScheduleOne(timeout=0.5)
            except Exception:  # one pod's bug must not stop the scheduler
                _log.exception("ScheduleOne failed")

    def stop(self) -> None:
        self.stop_event.set()
        self.queue.Close()
        self.informers.stop()
        self.tracer.flush(timeout=2)
