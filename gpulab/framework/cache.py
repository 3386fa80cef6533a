"""The scheduler cache: nodes and the pods holding them, plus pods it assumed.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/backend/cache/cache.go`` (``AssumePod`` when
a pod passes Reserve - its resources count before the Binding exists; ``ForgetPod`` when
the attempt fails after all; ``AddPod`` from the informer confirms an assumed pod;
``UpdateSnapshot`` at the start of each scheduling cycle).

Lab differences: assumed pods never expire (upstream's default TTL is 0 as well, i.e.
never, so ``FinishBinding`` has nothing to do here and is left out); the snapshot is
rebuilt in full each cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.framework.snapshot import (
    PodInfo,
    Snapshot,
    holds_node,
    new_snapshot,
    pod_uid,
)

Obj = Mapping[str, Any]


@dataclass
class _PodState:
    info: PodInfo
    assumed: bool = False


class Cache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, Obj] = {}
        self._pods: dict[str, _PodState] = {}

    # ------------------------------------------------------------------ pods

    def AssumePod(self, pod: Obj) -> None:
        """Count ``pod`` (with ``spec.nodeName`` set) on its node before it is bound."""
        uid = pod_uid(pod)
        with self._lock:
            if uid in self._pods:
                raise ValueError(f"pod {uid} is in the cache, so can't be assumed")
            self._pods[uid] = _PodState(PodInfo.of(pod), assumed=True)

    def ForgetPod(self, pod: Obj) -> None:
        """Undo AssumePod: the attempt failed, the node's resources are free again."""
        with self._lock:
            state = self._pods.get(pod_uid(pod))
            if state is not None and state.assumed:
                del self._pods[pod_uid(pod)]

    def GetPod(self, pod: Obj) -> Obj | None:
        """The cache's copy of ``pod`` (an assumed pod carries its node), or None."""
        with self._lock:
            state = self._pods.get(pod_uid(pod))
            return None if state is None else state.info.pod

    def IsAssumedPod(self, pod: Obj) -> bool:
        with self._lock:
            state = self._pods.get(pod_uid(pod))
            return state is not None and state.assumed

    def AddPod(self, pod: Obj) -> None:
        """A bound pod seen by the informer (confirms it if we assumed it)."""
        if not holds_node(pod):
            return
        with self._lock:
            self._pods[pod_uid(pod)] = _PodState(PodInfo.of(pod))

    def UpdatePod(self, old: Obj, new: Obj) -> None:
        if holds_node(new):
            self.AddPod(new)
        else:
            self.RemovePod(old)

    def RemovePod(self, pod: Obj) -> None:
        with self._lock:
            self._pods.pop(pod_uid(pod), None)

    # ------------------------------------------------------------------ nodes

    def AddNode(self, node: Obj) -> None:
        with self._lock:
            self._nodes[str((node.get("metadata") or {}).get("name"))] = node

    UpdateNode = AddNode

    def RemoveNode(self, node: Obj) -> None:
        with self._lock:
            self._nodes.pop(str((node.get("metadata") or {}).get("name")), None)

    # ------------------------------------------------------------------ snapshot

    def UpdateSnapshot(self) -> Snapshot:
        with self._lock:
            return new_snapshot(list(self._nodes.values()), [s.info for s in self._pods.values()])
