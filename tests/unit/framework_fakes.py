"""Fakes the scheduling-framework unit tests share: informers, a binder, the API side."""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping
from typing import Any

from gpulab.framework import config
from gpulab.framework.cache import Cache
from gpulab.framework.queue import SchedulingQueue, build_queueing_hint_map
from gpulab.framework.runtime import Framework, Registry
from gpulab.framework.schedule_one import Scheduler
from gpulab.informer import PODS, Handlers, Resource, Store, key_of
from gpulab.trace import Tracer


class FakeInformers:
    """Stores per resource; ``add``/``update`` call the handlers plugins registered."""

    def __init__(self) -> None:
        self.stores: dict[Resource, Store] = {}
        self.handlers: dict[Resource, list[Handlers]] = {}

    def store(self, resource: Resource, handlers: Handlers | None = None) -> Store:
        if handlers is not None:
            self.handlers.setdefault(resource, []).append(handlers)
        return self.stores.setdefault(resource, Store())

    def add(self, resource: Resource, obj: dict) -> None:
        self.store(resource).apply("ADDED", obj)
        for h in self.handlers.get(resource, []):
            if h.on_add:
                h.on_add(obj)


class FakeBinder:
    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, Mapping[str, str]]] = {}
        self.lock = threading.Lock()
        self.event = threading.Event()

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        with self.lock:
            self.bound[pod["metadata"]["name"]] = (node, dict(annotations))
        self.event.set()


class FakeIO:
    """The scheduler's API side over the fake pod store: Events and status patches are
    recorded, a patched nominatedNodeName lands on the stored pod."""

    def __init__(self, informers: FakeInformers) -> None:
        self.pods = informers.store(PODS)
        self.events: list[tuple[str, str, str]] = []
        self.conditions: list[Mapping[str, str]] = []
        self.nominated: list[tuple[str, str]] = []  # (pod, nominatedNodeName written)
        self.lock = threading.Lock()

    def current_pod(self, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return self.pods.get(key_of(pod))

    def record_event(
        self, fwk: Any, pod: Any, reason: str, action: str, note: str, warning: bool
    ) -> None:
        with self.lock:
            self.events.append((pod["metadata"]["name"], reason, note))

    def patch_pod_status(
        self, pod: Any, condition: Mapping[str, str] | None, nominated_node_name: str | None
    ) -> None:
        with self.lock:
            if condition is not None:
                self.conditions.append(condition)
            if nominated_node_name is None:
                return
            self.nominated.append((pod["metadata"]["name"], nominated_node_name))
            stored = self.pods.get(key_of(pod))
            if stored is not None:
                status = {**stored.get("status", {}), "nominatedNodeName": nominated_node_name}
                self.pods.apply("MODIFIED", {**stored, "status": status})

    def notes(self, reason: str) -> dict[str, list[str]]:
        with self.lock:
            out: dict[str, list[str]] = {}
            for name, r, note in self.events:
                if r == reason:
                    out.setdefault(name, []).append(note)
            return out


def framework(
    profile: Mapping[str, Any],
    registry: Registry,
    informers: FakeInformers,
    binder: FakeBinder | None = None,
) -> Framework:
    cfg = config.parse(
        {"apiVersion": config.API_VERSION, "kind": config.KIND, "profiles": [dict(profile)]}
    )
    name = cfg.profiles[0].scheduler_name
    return Framework(
        cfg.profiles[0],
        registry,
        informers=informers,
        binder=binder,
        tracer=Tracer(name, stream=io.StringIO()),
    )


def scheduler(
    fwk: Framework, nodes: list[dict], informers: FakeInformers, **queue_args: Any
) -> tuple[Scheduler, FakeIO]:
    """A Scheduler over a cache holding ``nodes``, the queue built as the scheduler
    process builds it."""
    cache = Cache()
    for n in nodes:
        cache.AddNode(n)
    queue = SchedulingQueue(
        fwk.QueueSortFunc(),
        {fwk.profile_name: build_queueing_hint_map(fwk.EnqueueExtensions())},
        {fwk.profile_name: fwk.PreEnqueuePlugins()},
        **queue_args,
    )
    io_ = FakeIO(informers)
    return Scheduler({fwk.profile_name: fwk}, queue, cache, io_), io_
