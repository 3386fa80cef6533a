"""The queue controller: a Queue's state (Open / Closing / Closed) and its PodGroup counts.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/controllers/queue``:
- ``state/{open,closed,closing,unknown}.go``: the state machine over the actions
  ``OpenQueue``, ``CloseQueue`` and ``SyncQueue`` (a queue closed while it still holds
  PodGroups is ``Closing`` until they are gone; a state set directly in
  ``status.state`` is honoured on the next sync);
- ``queue_controller_action.go`` ``syncQueue``: ``spec.parent`` defaults to ``root``;
  PodGroups are counted by phase; the state is written back (server-side apply of
  ``status.state``); ``queue_controller.go`` ``handleCommand``: a bus.volcano.sh Command
  naming a Queue (what ``vcctl queue operate -a close`` creates) is deleted and its action
  applied;
- ``pkg/controllers/metrics/queue.go``: the counts are the gauges
  ``volcano_queue_pod_group_{inqueue,pending,running,unknown,completed}_count``. Since
  v1.11 upstream no longer writes them into the Queue's status; the lab does the same.

Lab differences: no hierarchical queues (a queue's state does not follow its parent's);
``status.state`` is merge-patched (upstream: ApplyStatus).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Gauge

from gpulab.informer import Handlers, Informer, ListWatch
from gpulab.trace import ObjectRef, Tracer
from gpulab.volcano import apis
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger(__name__)

Obj = Mapping[str, Any]
PHASES = (apis.PG_INQUEUE, apis.PG_PENDING, apis.PG_RUNNING, apis.PG_UNKNOWN, apis.PG_COMPLETED)


def next_state(current: str, spec_state: str, action: str, has_podgroups: bool) -> str:
    """The state a queue moves to (``current`` picks the state object; ``spec_state`` is
    what ``status.state`` said when the request was handled)."""
    closed_or_closing = apis.QUEUE_CLOSING if has_podgroups else apis.QUEUE_CLOSED
    if action == apis.OPEN_QUEUE:
        return apis.QUEUE_OPEN
    if action == apis.CLOSE_QUEUE:
        return apis.QUEUE_CLOSED if current == apis.QUEUE_CLOSED else closed_or_closing
    if current in ("", apis.QUEUE_OPEN):
        if spec_state in ("", apis.QUEUE_OPEN):
            return apis.QUEUE_OPEN
        return closed_or_closing if spec_state == apis.QUEUE_CLOSED else apis.QUEUE_UNKNOWN
    if current == apis.QUEUE_CLOSED:
        return (
            spec_state if spec_state in (apis.QUEUE_OPEN, apis.QUEUE_CLOSED) else apis.QUEUE_UNKNOWN
        )
    if current == apis.QUEUE_CLOSING:
        if spec_state == apis.QUEUE_OPEN:
            return apis.QUEUE_OPEN
        return closed_or_closing if spec_state == apis.QUEUE_CLOSING else apis.QUEUE_UNKNOWN
    # Unknown
    if spec_state == apis.QUEUE_OPEN:
        return apis.QUEUE_OPEN
    return closed_or_closing if spec_state == apis.QUEUE_CLOSED else apis.QUEUE_UNKNOWN


def pod_group_counts(podgroups: Iterable[Obj], queue: str) -> dict[str, int]:
    counts = dict.fromkeys(PHASES, 0)
    for pg in podgroups:
        if ((pg.get("spec") or {}).get("queue") or apis.DEFAULT_QUEUE) != queue:
            continue
        phase = (pg.get("status") or {}).get("phase") or ""
        if phase in counts:
            counts[phase] += 1
    return counts


class QueueController:
    def __init__(self, api: client.ApiClient, tracer: Tracer, registry: CollectorRegistry) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.tracer = tracer
        self.queue = WorkQueue()
        self.gauges = {
            phase: Gauge(
                f"volcano_queue_pod_group_{phase.lower()}_count",
                f"The number of {phase} PodGroup in this queue",
                ["queue_name"],
                registry=registry,
            )
            for phase in PHASES
        }
        self.queues = Informer(
            ListWatch(api, apis.QUEUES),
            Handlers(self._add_queue, lambda _o, n: self._add_queue(n)),
            name="informer-queues",
        )
        self.podgroups = Informer(
            ListWatch(api, apis.PODGROUPS),
            Handlers(self._pg, self._pg_updated, self._pg),
            name="informer-queue-podgroups",
        )
        self.commands = Informer(
            ListWatch(api, apis.COMMANDS), Handlers(self._command), name="informer-queue-commands"
        )

    # -- handlers only enqueue ----------------------------------------------------------

    def _add_queue(self, queue: Obj) -> None:
        self.queue.add(_key(queue["metadata"]["name"], apis.SYNC_QUEUE))

    def _pg(self, pg: Obj) -> None:
        name = (pg.get("spec") or {}).get("queue") or apis.DEFAULT_QUEUE
        self.queue.add(_key(name, apis.SYNC_QUEUE))

    def _pg_updated(self, old: Obj, new: Obj) -> None:
        if (old.get("status") or {}).get("phase") != (new.get("status") or {}).get("phase"):
            self._pg(new)

    def _command(self, cmd: Obj) -> None:
        target = cmd.get("target") or {}
        if target.get("kind") == "Queue":
            meta = cmd["metadata"]
            self.queue.add(
                _key(target["name"], str(cmd.get("action")), meta["namespace"], meta["name"])
            )

    # -- reconcile ----------------------------------------------------------------------

    def reconcile(self, key: str) -> float | None:
        name, action, cmd_ns, cmd_name = _split(key)
        if cmd_name:  # handleCommand: the command is consumed first
            try:
                self.custom.delete_namespaced_custom_object(
                    apis.BUS_GROUP, apis.BUS_VERSION, cmd_ns, "commands", cmd_name
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        queue = self.queues.store.get(name)
        if queue is None:
            return None
        if not (queue.get("spec") or {}).get("parent") and name != apis.ROOT_QUEUE:
            patch = [{"op": "add", "path": "/spec/parent", "value": apis.ROOT_QUEUE}]
            self.custom.patch_cluster_custom_object(
                apis.SCHEDULING_GROUP,
                apis.SCHEDULING_VERSION,
                "queues",
                name,
                patch,
                _content_type="application/json-patch+json",
            )
        counts = pod_group_counts(self.podgroups.store.list(), name)
        for phase, n in counts.items():
            self.gauges[phase].labels(name).set(n)
        current = (queue.get("status") or {}).get("state") or ""
        state = next_state(current, current, action, any(counts.values()))
        if state != current:
            self.custom.patch_cluster_custom_object_status(
                apis.SCHEDULING_GROUP,
                apis.SCHEDULING_VERSION,
                "queues",
                name,
                {"status": {"state": state}},
            )
            if action in (apis.OPEN_QUEUE, apis.CLOSE_QUEUE):
                verb = "Open" if action == apis.OPEN_QUEUE else "Close"
                self.tracer.step(
                    action, ObjectRef("Queue", name, api_version=_api()), f"{verb} queue succeed"
                )
        return None

    def run(self, stop: threading.Event) -> None:
        for informer in (self.queues, self.podgroups, self.commands):
            informer.start()
        threading.Thread(
            target=run_worker, args=(self.queue, self.reconcile, "queue-controller"), daemon=True
        ).start()
        stop.wait()
        self.queue.shutdown()
        for informer in (self.queues, self.podgroups, self.commands):
            informer.stop()

    def has_synced(self) -> bool:
        return all(i.has_synced() for i in (self.queues, self.podgroups, self.commands))


def _api() -> str:
    return f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}"


def _key(queue: str, action: str, cmd_ns: str = "", cmd_name: str = "") -> str:
    return "\x00".join((queue, action, cmd_ns, cmd_name))


def _split(key: str) -> tuple[str, str, str, str]:
    queue, action, cmd_ns, cmd_name = key.split("\x00")
    return queue, action, cmd_ns, cmd_name
