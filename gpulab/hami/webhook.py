"""The mutating admission webhook: route GPU pods to hami-scheduler, default, reject.

Mirrors HAMi ``pkg/scheduler/webhook.go`` (``Handle``) and the NVIDIA part of
``MutateAdmission`` in ``pkg/device/nvidia/device.go``. ``decide`` is pure (pod in,
decision out); ``review`` wraps it in the admission.k8s.io/v1 AdmissionReview envelope.

Differences from HAMi, on purpose: a container asking for gpumem/gpucores without
``nvidia.com/gpu`` is rejected unless ``--default-gpu-count`` is set (HAMi adds its
default of 1); ``--default-mem``/``--default-cores`` are written into the pod so
``kubectl get pod -o yaml`` shows what the scheduler will charge.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.hami import device

DEFAULT_SCHEDULER = "default-scheduler"


class ReviewError(ValueError):
    """The body is not an AdmissionReview the webhook can answer (HTTP 400)."""


@dataclass(frozen=True)
class WebhookConfig:
    scheduler_name: str = "hami-scheduler"
    default_gpu_count: int = 0
    default_mem: int = 0
    default_cores: int = 0
    # HAMi's --force-overwrite-default-scheduler (default true): the API server has
    # already defaulted schedulerName to default-scheduler when the webhook runs.
    force_overwrite_default_scheduler: bool = True


@dataclass
class Decision:
    allowed: bool
    message: str = ""
    patch: list[dict[str, Any]] = field(default_factory=list)
    code: int = 200
    gpu: bool = False  # the pod asks for managed resources


def _ptr(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): '/' in resource names becomes '~1'."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _has_managed(container: Mapping[str, Any]) -> bool:
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        return False
    return any(
        isinstance(res.get(section), Mapping)
        and any(name in res[section] for name in device.MANAGED_RESOURCES)
        for section in ("limits", "requests")
    )


def _privileged(container: Mapping[str, Any]) -> bool:
    sc = container.get("securityContext")
    return isinstance(sc, Mapping) and sc.get("privileged") is True


def _container_lists(spec: Mapping[str, Any]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    out = []
    for key in ("initContainers", "containers"):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            raise ReviewError(f"pod.spec.{key} must be a list of objects")
        out.append((key, items))
    return out


def _set_resource(
    patch: list[dict[str, Any]],
    key: str,
    idx: int,
    container: Mapping[str, Any],
    name: str,
    value: str,
) -> None:
    """Add ``name`` to limits and requests (extended resources need them equal).

    Only called for containers that already ask for a managed resource, so
    ``resources`` exists; a missing limits/requests map is created first, once.
    """
    res = container["resources"]
    for section in ("limits", "requests"):
        if not isinstance(res.get(section), Mapping) and not any(
            p["path"] == _ptr("spec", key, idx, "resources", section) for p in patch
        ):
            patch.append(
                {"op": "add", "path": _ptr("spec", key, idx, "resources", section), "value": {}}
            )
        patch.append(
            {
                "op": "add",
                "path": _ptr("spec", key, idx, "resources", section, name),
                "value": value,
            }
        )


def decide(pod: Mapping[str, Any], cfg: WebhookConfig) -> Decision:
    """``webhook.Handle`` for one pod."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return Decision(False, "pod has no spec", code=400)
    lists = _container_lists(spec)
    if not any(items for key, items in lists if key == "containers"):
        return Decision(False, "pod has no containers", code=403)
    current = spec.get("schedulerName") or ""
    if (
        current
        and (current != DEFAULT_SCHEDULER or not cfg.force_overwrite_default_scheduler)
        and current != cfg.scheduler_name
    ):
        return Decision(True, f"pod already has different scheduler assigned ({current})")

    patch: list[dict[str, Any]] = []
    gpu = False
    privileged = ""
    for key, items in lists:
        for idx, ctr in enumerate(items):
            name = str(ctr.get("name", f"#{idx}"))
            if _privileged(ctr) and not privileged:
                privileged = name
            if not _has_managed(ctr):
                continue
            gpu = True
            try:
                count = device.resource_value(ctr, device.RESOURCE_COUNT)
                mem = device.resource_value(ctr, device.RESOURCE_MEM)
                pct = device.resource_value(ctr, device.RESOURCE_MEM_PERCENTAGE)
                cores = device.resource_value(ctr, device.RESOURCE_CORES)
            except device.RequestError as exc:
                return Decision(False, f"container {name}: {exc}", code=400, gpu=True)
            if count is None:
                if cfg.default_gpu_count <= 0:
                    return Decision(
                        False,
                        f"container {name} asks for nvidia.com/gpumem/gpucores without "
                        f"nvidia.com/gpu: set resources.limits[nvidia.com/gpu] (how many vGPUs)",
                        code=403,
                        gpu=True,
                    )
                _set_resource(
                    patch, key, idx, ctr, device.RESOURCE_COUNT, str(cfg.default_gpu_count)
                )
            if mem is None and pct is None and cfg.default_mem > 0:
                _set_resource(patch, key, idx, ctr, device.RESOURCE_MEM, str(cfg.default_mem))
            if cores is None and cfg.default_cores > 0:
                _set_resource(patch, key, idx, ctr, device.RESOURCE_CORES, str(cfg.default_cores))

    if not gpu:
        return Decision(True, "no GPU resource found")
    if privileged:
        return Decision(False, f"container {privileged} is privileged", code=403, gpu=True)
    if cfg.scheduler_name:
        if spec.get("nodeName"):
            return Decision(False, "pod has node assigned", code=403, gpu=True)
        if current != cfg.scheduler_name:
            patch.append({"op": "add", "path": "/spec/schedulerName", "value": cfg.scheduler_name})
    return Decision(True, "", patch=patch, gpu=True)


def review(body: Any, cfg: WebhookConfig) -> tuple[dict[str, Any], Decision]:
    """Answer one AdmissionReview (admission.k8s.io/v1). ReviewError if it is not one."""
    if not isinstance(body, Mapping) or not isinstance(body.get("request"), Mapping):
        raise ReviewError("body is not an AdmissionReview with a request")
    req = body["request"]
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("AdmissionReview.request.uid is missing")
    kind = req.get("kind") or {}
    pod = req.get("object")
    if (
        not isinstance(kind, Mapping)
        or kind.get("kind") != "Pod"
        or req.get("operation") != "CREATE"
    ):
        decision = Decision(True, "not a pod creation")
    elif not isinstance(pod, Mapping):
        decision = Decision(False, "AdmissionReview.request.object is not a pod", code=400)
    else:
        try:
            decision = decide(pod, cfg)
        except ReviewError as exc:
            decision = Decision(False, str(exc), code=400)
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "reason": "Forbidden" if decision.code == 403 else "BadRequest",
            "message": decision.message,
        }
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }
    return answer, decision
