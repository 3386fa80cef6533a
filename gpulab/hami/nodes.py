"""Registered nodes, their cards and what the pods on them use: the scheduler's node cache.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/scheduler/nodes.go`` (``nodeManager``: ``addNode``,
``rmNodeDevices``, ``rmNode``, ``ListNodes``) and the usage half of ``getNodesUsage`` in
``pkg/scheduler/scheduler.go``.

Deliberate difference, for speed: upstream rebuilds every node's usage from every pod on
each Filter (``getNodesUsage``); here each node keeps its cards' usage and is charged or
credited when a pod's shares come or go, and remembers the Fit results it computed per
request shape until its usage or registration changes (``version``). Same numbers, without
the full re-decode per Filter.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from gpulab.hami.annotations import MigAllocation, NodeDevice
from gpulab.hami.pods import PodInfo, Share
from gpulab.hami.score import CardUsage, NodeExtras, NodeResult

_CACHE_LIMIT = 64  # distinct request shapes remembered per node
_SHAPE_LIMIT = 4096  # distinct request shapes numbered before the numbering starts over


@dataclass
class NodeEntry:
    """One registered node (``NodeInfo`` plus its live usage)."""

    name: str
    devices: list[NodeDevice]
    extras: NodeExtras
    cards: list[CardUsage] = field(default_factory=list)
    by_id: dict[str, CardUsage] = field(default_factory=dict)
    version: int = 0
    results: dict[int, NodeResult] = field(default_factory=dict)  # by request shape

    def changed(self) -> None:
        self.version += 1
        self.results.clear()


def cards_of(devices: Sequence[NodeDevice]) -> list[CardUsage]:
    """``buildNodeUsage``: a card per registered device, nothing used yet."""
    return [
        CardUsage(
            d.id, d.index, d.type, d.count, d.devmem, d.devcore, d.numa, d.mode, d.health,
            mig_profiles=d.mig_profiles,
        )
        for d in devices
    ]  # fmt: skip


class NodeManager:
    def __init__(self) -> None:
        self._nodes: dict[str, NodeEntry] = {}
        self._shapes: dict[Hashable, int] = {}

    def shape(self, key: Hashable) -> int:
        """A number for a request shape (what a Fit result depends on besides the node),
        the same number for equal keys: the nodes' results are looked up by it."""
        number = self._shapes.get(key)
        if number is None:
            if len(self._shapes) >= _SHAPE_LIMIT:  # start over, forgetting every result
                self._shapes.clear()
                for entry in self._nodes.values():
                    entry.results.clear()
            number = self._shapes[key] = len(self._shapes)
        return number

    def get(self, name: str) -> NodeEntry | None:
        return self._nodes.get(name)

    def names(self) -> list[str]:
        return list(self._nodes)

    def entries(self) -> list[NodeEntry]:
        return list(self._nodes.values())

    def add(
        self, name: str, devices: list[NodeDevice], extras: NodeExtras, pods: Iterable[PodInfo]
    ) -> bool:
        """``addNode``: (re)register the node's cards and charge the pods already on it.
        True when the registration differs from what was held."""
        old = self._nodes.get(name)
        if old is not None and old.devices == devices and old.extras == extras:
            return False
        entry = NodeEntry(name, list(devices), extras, version=(old.version + 1) if old else 0)
        entry.cards = cards_of(devices)
        entry.by_id = {c.id: c for c in entry.cards}
        self._nodes[name] = entry
        for info in pods:
            self.charge(name, info.shares, +1, info.mig)
        return True

    def remove(self, name: str) -> bool:
        """``rmNode`` / ``rmNodeDevices`` (one vendor here)."""
        return self._nodes.pop(name, None) is not None

    def charge(
        self, node: str, shares: Sequence[Share], sign: int, mig: Sequence[MigAllocation] = ()
    ) -> None:
        """Add (``sign`` +1) or give back (-1) a pod's shares on ``node``'s cards, and its
        MIG placements on the MIG-mode cards; shares on cards the node does not register
        are ignored, as upstream logs and skips them."""
        entry = self._nodes.get(node)
        if entry is None or not shares:
            return
        for s in shares:
            card = entry.by_id.get(s.uuid)
            if card is not None:
                card.used += sign * s.slots
                card.usedmem += sign * s.usedmem
                card.usedcores += sign * s.usedcores
        for a in mig:
            card = entry.by_id.get(a.gpu_uuid)
            if card is None:
                continue
            if sign > 0:
                card.mig_in_use.append((a.start, a.size))
            elif (a.start, a.size) in card.mig_in_use:
                card.mig_in_use.remove((a.start, a.size))
        entry.changed()

    @staticmethod
    def remember(entry: NodeEntry, key: int, result: NodeResult) -> None:
        if len(entry.results) >= _CACHE_LIMIT:
            entry.results.clear()
        entry.results[key] = result
