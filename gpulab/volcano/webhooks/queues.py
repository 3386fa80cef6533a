"""Admission of Queues: defaults on create, protection on delete.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/webhooks/admission/queues``:
``mutate/mutate_queue.go`` (``/queues/mutate``, CREATE: ``spec.reclaimable`` defaults to
true, ``spec.weight`` to 1) and ``validate/validate_queue.go`` ``validateQueueDeleting``
(``/queues/validate``, DELETE: "`default` queue can not be deleted", the same for
``root``).

Lab difference: CREATE / UPDATE are not validated beyond the CRD schema (no hierarchy,
guarantee / deserved / capability cross-checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.volcano import apis

Obj = dict[str, Any]


def mutate_patch(queue: Mapping[str, Any]) -> list[Obj]:
    spec = queue.get("spec") or {}
    patch: list[Obj] = []
    if spec.get("reclaimable") is None:
        patch.append({"op": "add", "path": "/spec/reclaimable", "value": True})
    if not spec.get("weight"):
        patch.append({"op": "add", "path": "/spec/weight", "value": 1})
    return patch


def validate_delete(name: str) -> str:
    if name in (apis.DEFAULT_QUEUE, apis.ROOT_QUEUE):
        return f"`{name}` queue can not be deleted"
    return ""
