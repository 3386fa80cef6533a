"""ImageLocality: prefer nodes that already have the pod's container images.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/imagelocality/
image_locality.go``: for each container (and init container, and image volume) whose
image the node lists in ``status.images`` (names as the node reports them, a bare
``name`` read as ``name:latest``), the image size scaled by the share of nodes that have
it; the sum is clamped to [23 MB, 1000 MB x containers] and scaled to 0..100.

The image states (size, how many nodes have it) are worked out once per scheduling cycle
from the snapshot, as the scheduler cache keeps them upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.interface import MAX_NODE_SCORE, SUCCESS, CycleState, Status
from gpulab.framework.snapshot import NodeInfo, Snapshot

NAME = "ImageLocality"
STATE_KEY = NAME + "/imageStates"
MB = 1024 * 1024
MIN_THRESHOLD = 23 * MB
MAX_CONTAINER_THRESHOLD = 1000 * MB

Obj = Mapping[str, Any]
ImageStates = dict[str, tuple[int, int]]  # image name -> (size in bytes, nodes having it)


def normalized_image_name(name: str) -> str:
    """normalizedImageName: a name without a tag gets ":latest"."""
    return name if name.rfind(":") > name.rfind("/") else name + ":latest"


def image_states(snapshot: Snapshot) -> ImageStates:
    nodes: dict[str, set[str]] = {}
    sizes: dict[str, int] = {}
    for info in snapshot:
        for image in (info.node.get("status") or {}).get("images") or []:
            for name in image.get("names") or []:
                sizes[name] = int(image.get("sizeBytes") or 0)
                nodes.setdefault(name, set()).add(info.name)
    return {name: (sizes[name], len(holders)) for name, holders in nodes.items()}


def _images_of(pod: Obj) -> list[str]:
    spec = pod.get("spec") or {}
    images = [c.get("image") or "" for c in spec.get("initContainers") or []]
    images += [c.get("image") or "" for c in spec.get("containers") or []]
    images += [
        (v.get("image") or {}).get("reference") or ""
        for v in spec.get("volumes") or []
        if v.get("image")
    ]
    return images


def sum_image_scores(node: NodeInfo, pod: Obj, states: ImageStates, total_nodes: int) -> int:
    """sumImageScores: each image the node has, its size times the share of nodes
    that have it."""
    have = {
        name
        for image in (node.node.get("status") or {}).get("images") or []
        for name in image.get("names") or []
    }
    total = 0
    for image in _images_of(pod):
        name = normalized_image_name(image)
        if name in have:
            size, holders = states[name]
            total += int(size * (holders / total_nodes))
    return total


def calculate_priority(sum_scores: int, containers: int) -> int:
    max_threshold = MAX_CONTAINER_THRESHOLD * containers
    clamped = min(max(sum_scores, MIN_THRESHOLD), max_threshold)
    return MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) // (max_threshold - MIN_THRESHOLD)


class ImageLocality:
    name = NAME

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        snapshot: Snapshot = self.handle.snapshot()
        states = state.get(STATE_KEY)
        if states is None:
            states = image_states(snapshot)
            state.write(STATE_KEY, states)
        spec = pod.get("spec") or {}
        containers = len(spec.get("initContainers") or []) + len(spec.get("containers") or [])
        total = sum_image_scores(node, pod, states, len(snapshot))
        return calculate_priority(total, containers), SUCCESS


def new(args: Mapping[str, Any], handle: Any) -> ImageLocality:
    return ImageLocality(handle)
