"""A Queue as the session sees it.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/api/queue_info.go`` (``NewQueueInfo``:
weight, ``Reclaimable()`` - true unless ``spec.reclaimable`` is false).

Lab difference: no hierarchy attributes (``volcano.sh/hierarchy`` annotations,
``spec.parent`` beyond ``root``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass
class QueueInfo:
    uid: str  # QueueID: the queue's name
    name: str
    weight: int
    queue: Obj

    @classmethod
    def of(cls, queue: Mapping[str, Any]) -> QueueInfo:
        name = str((queue.get("metadata") or {}).get("name"))
        weight = int((queue.get("spec") or {}).get("weight") or 1)
        return cls(name, name, weight, dict(queue))

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.queue.get("spec") or {}

    @property
    def state(self) -> str:
        return str((self.queue.get("status") or {}).get("state") or "")

    @property
    def priority(self) -> int:
        return int(self.spec.get("priority") or 0)

    @property
    def creation_timestamp(self) -> str:
        return str((self.queue.get("metadata") or {}).get("creationTimestamp") or "")

    def reclaimable(self) -> bool:
        return self.spec.get("reclaimable") is not False

    def clone(self) -> QueueInfo:
        return QueueInfo(self.uid, self.name, self.weight, {**self.queue})
