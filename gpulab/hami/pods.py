"""Which pods hold which card shares: the scheduler's pod cache.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device/pods.go`` (``PodManager``: ``AddPod``,
``TakeAndDeletePod``, ``UpdatePodDevice``) and ``pkg/device/initContainer.go``
(``CollapseInitContainerUsage``, ``AppContainersOnlyDeviceUsage``): a pod's effective use
of a card is the larger of its init containers' peak (they run one after the other) and its
app containers' sum (they run together); once every init container has succeeded the pod
shrinks to its app containers' use. Pods are keyed by UID, as upstream.

The collapse functions are pure; ``PodManager`` is a dict with an index by node, called
under the scheduler's lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpulab.hami.annotations import ContainerDevice, MigAllocation


class Share(NamedTuple):
    """A pod's effective use of one card (a collapsed ``ContainerDevice`` with ``Slots``)."""

    uuid: str
    usedmem: int
    usedcores: int
    slots: int


def collapse_init_usage(
    containers: Sequence[Sequence[ContainerDevice]], n_init: int
) -> list[Share]:
    """``CollapseInitContainerUsage``: per card, max(init peak, app sum); slots =
    max(1 for any init use, the number of app containers using it, 1)."""
    init: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for idx, ctr in enumerate(containers):
        for d in ctr:
            if idx < n_init:
                cur = init.setdefault(d.uuid, [0, 0, 1])
                cur[0], cur[1] = max(cur[0], d.usedmem), max(cur[1], d.usedcores)
            else:
                cur = app.setdefault(d.uuid, [0, 0, 0])
                cur[0] += d.usedmem
                cur[1] += d.usedcores
                cur[2] += 1
    shares = []
    for uuid in sorted(init.keys() | app.keys()):
        i, a = init.get(uuid, [0, 0, 0]), app.get(uuid, [0, 0, 0])
        shares.append(Share(uuid, max(i[0], a[0]), max(i[1], a[1]), max(i[2], a[2], 1)))
    return shares


def app_only_usage(containers: Sequence[Sequence[ContainerDevice]], n_init: int) -> list[Share]:
    """``AppContainersOnlyDeviceUsage``: the shares once the init containers are done."""
    return collapse_init_usage(containers[n_init:], 0)


@dataclass
class PodInfo:
    """``device.PodInfo``: one pod and the card shares it holds on its node."""

    uid: str
    namespace: str
    name: str
    node: str
    shares: list[Share]
    init_released: bool = False
    pod: dict = field(default_factory=dict, repr=False)
    mig: list[MigAllocation] = field(default_factory=list)  # its MIG reservations


class PodManager:
    def __init__(self) -> None:
        self._pods: dict[str, PodInfo] = {}
        self._by_node: dict[str, set[str]] = {}

    def get(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def add(self, info: PodInfo) -> PodInfo | None:
        """``AddPod``; returns the entry it replaced (so its shares can be given back)."""
        old = self._pods.get(info.uid)
        if old is not None and old.init_released:
            # usage already shrank after the init containers: a re-add keeps it shrunk
            info.shares, info.init_released = old.shares, True
        self._pods[info.uid] = info
        if old is not None and old.node != info.node:
            self._by_node.get(old.node, set()).discard(info.uid)
        self._by_node.setdefault(info.node, set()).add(info.uid)
        return old

    def take(self, uid: str) -> PodInfo | None:
        """``TakeAndDeletePod``."""
        info = self._pods.pop(uid, None)
        if info is not None:
            self._by_node.get(info.node, set()).discard(uid)
        return info

    def on_node(self, node: str) -> Iterator[PodInfo]:
        for uid in self._by_node.get(node, ()):
            yield self._pods[uid]

    def all(self) -> list[PodInfo]:
        return list(self._pods.values())

    def __len__(self) -> int:
        return len(self._pods)
