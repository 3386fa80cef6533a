"""List-then-watch of one resource on a background thread, feeding one event queue.

What controller-runtime's informers do for upstream Kueue: a full listing first (a
``SYNC`` event, also sent again after a relist), then ADDED / MODIFIED / DELETED events.
The manager owns the object stores; informers only deliver.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from gpulab.kueue.controllers.client import KubeClient, Resource

_log = logging.getLogger("gpulab.kueue.informer")

SYNC = "SYNC"


@dataclass(frozen=True)
class Event:
    resource: Resource
    type: str  # SYNC | ADDED | MODIFIED | DELETED
    obj: dict[str, Any] = field(default_factory=dict)
    items: tuple[dict[str, Any], ...] = ()


class Informer:
    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        events: queue.Queue[Event],
        stop: threading.Event,
    ) -> None:
        self._kube = kube
        self.resource = resource
        self._events = events
        self._stop = stop
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{resource.plural}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                items, rv = self._kube.list(self.resource)
                self._events.put(Event(self.resource, SYNC, items=tuple(items)))
                self._watch(rv)
            except ApiException as exc:
                _log.warning("%s: %s %s; relisting", self.resource.plural, exc.status, exc.reason)
                self._stop.wait(1.0)
            except Exception as exc:  # the API server may restart; keep the controller alive
                _log.warning("%s: %s; relisting", self.resource.plural, exc)
                self._stop.wait(1.0)

    def _watch(self, rv: str) -> None:
        while not self._stop.is_set():
            for ev in self._kube.watch(self.resource, rv):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    # 410 Gone: our resourceVersion is too old; list again.
                    _log.info("%s watch: %s", self.resource.plural, obj.get("message"))
                    return
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if ev["type"] == "BOOKMARK":
                    continue
                self._events.put(Event(self.resource, ev["type"], obj=obj))
                if self._stop.is_set():
                    return
