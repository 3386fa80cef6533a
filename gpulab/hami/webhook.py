"""The mutating admission webhook: send GPU pods to hami-scheduler, default them, refuse.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/scheduler/webhook.go`` (``Handle``,
``fitResourceQuota``) and NVIDIA ``MutateAdmission`` in ``pkg/device/nvidia/device.go``
(``validateMemoryPercentage``, ``mutateContainerResource``, ``defaultExclusiveCoreIfNeeded``),
wrapped the way controller-runtime's ``admission.Webhook`` answers: always HTTP 200 with an
AdmissionReview; ``Errored`` / ``Denied`` / ``Allowed`` / ``PatchResponseFromRaw``.

Per container (init containers first), as v2.10:
- ``nvidia.com/gpumem-percentage`` outside 0..100 is an error;
- ``nvidia.com/priority`` → env ``CUDA_TASK_PRIORITY``; ``gpuCorePolicy`` other than
  ``default`` → env ``GPU_CORE_UTILIZATION_POLICY``;
- ``gpumem`` / ``gpucores`` / ``gpumem-percentage`` in limits without ``nvidia.com/gpu`` →
  ``nvidia.com/gpu: <defaultGPUNum>`` (1) in limits;
- ``nvidia.com/gpu`` without ``gpucores`` and without a memory request (or with
  ``gpumem-percentage: 100``) → ``nvidia.com/gpucores: 100`` in limits: a whole card;
- a GPU container → ``runtimeClassName`` if configured and unset; a container without
  GPUs gets ``NVIDIA_VISIBLE_DEVICES=none`` when ``overwriteEnv`` is on.
Then: privileged + GPUs → denied; GPUs → ``schedulerName``; a node already set → denied;
over a namespace's ResourceQuota (``limits.nvidia.com/gpumem`` / ``gpucores``) → denied.
``decide`` is pure (pod in, decision out); ``review`` is the envelope.
Difference, named: upstream answers with a JSON patch diffing the whole re-marshalled pod
(``PatchResponseFromRaw``); the lab emits only the operations for what it changed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.hami.config import NvidiaConfig
from gpulab.hami.device import RequestError, container_request, quantity

DEFAULT_SCHEDULER = "default-scheduler"
TASK_PRIORITY = "CUDA_TASK_PRIORITY"
CORE_LIMIT_SWITCH = "GPU_CORE_UTILIZATION_POLICY"
# The AdmissionReview versions controller-runtime answers, each in its own version.
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

# (namespace, memory MiB, cores %) → fits the namespace's ResourceQuota?
QuotaFit = Callable[[str, int, int], bool]


@dataclass(frozen=True)
class WebhookConfig:
    scheduler_name: str = ""  # --scheduler-name (empty: never set schedulerName)
    force_overwrite_default_scheduler: bool = True
    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)


@dataclass
class Decision:
    """A controller-runtime ``admission.Response``."""

    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] = field(default_factory=list)
    gpu: bool = False  # the pod asks for managed resources

    @property
    def reason(self) -> str:
        return "Forbidden" if self.code == 403 else ""


def allowed(message: str) -> Decision:
    return Decision(True, message)


def denied(message: str, gpu: bool = True) -> Decision:
    return Decision(False, message, code=403, gpu=gpu)


def errored(code: int, message: str) -> Decision:
    return Decision(False, message, code=code)


def _ptr(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): '/' in resource names becomes '~1'."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class _Container:
    """One container under mutation: its JSON and the patch operations made to it."""

    def __init__(self, key: str, idx: int, ctr: Mapping[str, Any], patch: list[dict[str, Any]]):
        self.key, self.idx, self.patch = key, idx, patch
        self.name = str(ctr.get("name", f"#{idx}"))
        self.env = list(ctr.get("env") or [])
        res = ctr.get("resources")
        self.resources = dict(res) if isinstance(res, Mapping) else None
        limits = (self.resources or {}).get("limits")
        self.limits = dict(limits) if isinstance(limits, Mapping) else None
        requests = (self.resources or {}).get("requests")
        self.requests = dict(requests) if isinstance(requests, Mapping) else {}

    def view(self) -> dict[str, Any]:
        """The container as it stands after the mutations so far."""
        return {"resources": {"limits": self.limits or {}, "requests": self.requests}}

    def add_env(self, name: str, value: str) -> None:
        var = {"name": name, "value": value}
        if not self.env:
            self.patch.append(
                {"op": "add", "path": _ptr("spec", self.key, self.idx, "env"), "value": [var]}
            )
        else:
            self.patch.append(
                {"op": "add", "path": _ptr("spec", self.key, self.idx, "env", "-"), "value": var}
            )
        self.env.append(var)

    def add_limit(self, name: str, value: str) -> None:
        base = ("spec", self.key, self.idx, "resources")
        if self.resources is None:
            self.patch.append({"op": "add", "path": _ptr(*base), "value": {}})
            self.resources = {}
        if self.limits is None:
            self.patch.append({"op": "add", "path": _ptr(*base, "limits"), "value": {}})
            self.limits = {}
        self.patch.append({"op": "add", "path": _ptr(*base, "limits", name), "value": value})
        self.limits[name] = value


def mutate_container(c: _Container, cfg: NvidiaConfig) -> bool:
    """NVIDIA ``MutateAdmission`` for one container: True if it asks for GPUs."""
    present, pct = quantity(c.view(), cfg.resource_memory_percentage_name)
    if present and pct is not None and not 0 <= pct <= 100:
        raise ValueError(
            f"invalid {cfg.resource_memory_percentage_name} value {pct} in container {c.name}: "
            "must be an integer between 0 and 100"
        )
    limits = c.limits or {}
    if cfg.resource_priority in limits:
        c.add_env(TASK_PRIORITY, str(quantity(c.view(), cfg.resource_priority)[1]))
    if cfg.gpu_core_policy not in ("", "default"):
        c.add_env(CORE_LIMIT_SWITCH, cfg.gpu_core_policy)

    # mutateContainerResource: limits only
    found = cfg.resource_count_name in limits
    shares = (cfg.resource_core_name, cfg.resource_memory_name, cfg.resource_memory_percentage_name)
    if not found and cfg.default_gpu_num > 0 and any(n in limits for n in shares):
        c.add_limit(cfg.resource_count_name, str(cfg.default_gpu_num))
        found = True
    if _exclusive_core_default(c, cfg):
        c.add_limit(cfg.resource_core_name, "100")
        found = True
    if not found and cfg.overwrite_env:
        c.add_env("NVIDIA_VISIBLE_DEVICES", "none")
    return found


def _exclusive_core_default(c: _Container, cfg: NvidiaConfig) -> bool:
    """``defaultExclusiveCoreIfNeeded``: a card-only request gets the whole card's cores."""
    view = c.view()
    if not quantity(view, cfg.resource_count_name)[0] or quantity(view, cfg.resource_core_name)[0]:
        return False
    present, pct = quantity(view, cfg.resource_memory_percentage_name)
    if present:
        return pct == 100
    return not quantity(view, cfg.resource_memory_name)[0]


def _privileged(container: Mapping[str, Any]) -> bool:
    sc = container.get("securityContext")
    return isinstance(sc, Mapping) and sc.get("privileged") is True


def _quota_fits(
    pod: Mapping[str, Any],
    containers: list[tuple[str, _Container]],
    cfg: NvidiaConfig,
    namespace: str,
    fits: QuotaFit,
) -> bool:
    """``fitResourceQuota``: max(sum over app containers, max over init containers)."""
    app_mem = app_cores = init_mem = init_cores = 0
    for key, c in containers:
        req = container_request(c.view(), cfg)
        if req.nums == 0:
            continue
        mem, cores = req.memreq * req.nums, req.coresreq * req.nums
        if key == "initContainers":
            init_mem, init_cores = max(init_mem, mem), max(init_cores, cores)
        else:
            app_mem, app_cores = app_mem + mem, app_cores + cores
    mem, cores = max(app_mem, init_mem), max(app_cores, init_cores)
    return (mem == 0 and cores == 0) or fits(namespace, mem, cores)


def decide(
    pod: Mapping[str, Any], cfg: WebhookConfig, namespace: str = "", fits: QuotaFit | None = None
) -> Decision:
    """``webhook.Handle`` for one pod."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return errored(400, "pod has no spec")
    lists = []
    for key in ("initContainers", "containers"):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            return errored(400, f"json: cannot unmarshal pod.spec.{key} into []v1.Container")
        lists.append((key, items))
    if not lists[1][1]:
        return denied("pod has no containers", gpu=False)
    current = spec.get("schedulerName") or ""
    if (
        current
        and (current != DEFAULT_SCHEDULER or not cfg.force_overwrite_default_scheduler)
        and (not cfg.scheduler_name or current != cfg.scheduler_name)
    ):
        return allowed("pod already has different scheduler assigned")

    patch: list[dict[str, Any]] = []
    containers: list[tuple[str, _Container]] = []
    gpu = False
    try:
        for key, items in lists:
            for idx, ctr in enumerate(items):
                c = _Container(key, idx, ctr, patch)
                containers.append((key, c))
                gpu = mutate_container(c, cfg.nvidia) or gpu
    except RequestError as exc:  # Go cannot decode such a pod at all
        return errored(400, str(exc))
    except ValueError as exc:
        return errored(500, str(exc))
    if gpu and spec.get("runtimeClassName") is None and cfg.nvidia.runtime_class_name:
        patch.append(
            {"op": "add", "path": "/spec/runtimeClassName", "value": cfg.nvidia.runtime_class_name}
        )

    privileged = next(
        (str(c.get("name", "")) for _, items in lists for c in items if _privileged(c)), None
    )
    if privileged is not None and gpu:
        return denied(f"container {privileged} is privileged")
    if gpu and cfg.scheduler_name:
        if current != cfg.scheduler_name:
            patch.append({"op": "add", "path": "/spec/schedulerName", "value": cfg.scheduler_name})
        if spec.get("nodeName"):
            return denied("pod has node assigned")
    if fits is not None and not _quota_fits(pod, containers, cfg.nvidia, namespace, fits):
        return denied("exceeding resource quota", gpu=gpu)
    return Decision(True, "", patch=patch, gpu=gpu)


def review(
    body: Any, cfg: WebhookConfig, fits: QuotaFit | None = None
) -> tuple[dict[str, Any], Decision]:
    """Answer one AdmissionReview as controller-runtime does: in the request's version
    (admission.k8s.io/v1beta1, what the chart's webhook asks the API server for, or v1);
    HTTP 200 always; a body it cannot decode gets an ``Errored(400)`` response with no uid."""
    if not isinstance(body, Mapping) or not isinstance(body.get("request"), Mapping):
        decision = errored(400, "couldn't decode the body as an AdmissionReview with a request")
        return {"response": _response("", decision)}, decision
    req = body["request"]
    uid = req.get("uid") if isinstance(req.get("uid"), str) else ""
    pod = req.get("object")
    if not isinstance(pod, Mapping):
        decision = errored(400, "there is no content to decode")
    elif pod.get("kind", "Pod") != "Pod":
        decision = errored(400, f"object of kind {pod.get('kind')!r} is not a Pod")
    else:
        meta = pod.get("metadata")
        namespace = str(req.get("namespace") or (meta or {}).get("namespace") or "default")
        decision = decide(pod, cfg, namespace, fits)
    version = body.get("apiVersion")
    answer = {
        "apiVersion": version if version in REVIEW_VERSIONS else REVIEW_VERSIONS[0],
        "kind": "AdmissionReview",
        "response": _response(str(uid), decision),
    }
    return answer, decision


def _response(uid: str, d: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": d.allowed}
    if d.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(d.patch).encode()).decode()
    status: dict[str, Any] = {"metadata": {}, "code": d.code}
    if d.reason:
        status["reason"] = d.reason
    if d.message:
        status["message"] = d.message
    response["status"] = status
    return response
