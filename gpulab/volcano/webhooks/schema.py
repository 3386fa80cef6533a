"""Decoding what kube-apiserver posts: the AdmissionReview, then the object in it, with the
field types Go's decoder would insist on.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/webhooks/router/server.go`` (``serve``: the body
decoded into an ``admissionv1.AdmissionReview``; a body that does not decode is answered
with ``util.ToAdmissionResponse(err)``: ``allowed: false`` and the error as the result's
message) and ``pkg/webhooks/schema/schema.go`` (``DecodeJob``, ``DecodeQueue``,
``DecodePodGroup``: the request's resource must be the route's - "expect resource to be
{batch.volcano.sh v1alpha1 jobs}" - and the raw object decodes into the typed struct).

The Go structs are written here as data (:data:`JOB`, :data:`QUEUE`, :data:`POD_GROUP`,
:data:`REVIEW`): only the fields the lab reads are typed, every other field passes, as
Go's decoder ignores what its struct does not name. A value of the wrong JSON type is
refused with Go's wording (``json: cannot unmarshal string into Go struct field
JobSpec.spec.minAvailable of type int32``); ``null`` is the zero value, as in Go.

Lab differences: a refusal for what does not decode, or for an operation the route does
not take, carries ``code: 400`` (upstream leaves the code unset: kube-apiserver answers
403); a body that is not JSON, nests deeper than the parser goes, or is no AdmissionReview at
all is answered inside an AdmissionReview too (upstream's handler dereferences the
missing request and the connection drops); an object whose ``apiVersion``/``kind`` name
another type is refused (upstream decodes it into an empty Job).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.kueue.api import quantity
from gpulab.volcano import apis
from gpulab.volcano.controllers.job.helpers import parse_duration

Obj = dict[str, Any]
QUANTITY_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"  # resource.ErrFormatWrong
_INT_BITS = {"int32": 32, "int64": 64, "int": 64}


class DecodeError(ValueError):
    """What Go's decoder would have said; the message goes into the refusal."""


# -- the types ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scalar:
    go_type: str  # string, bool, int32, int64, int


@dataclass(frozen=True)
class Quantity:
    go_type: str = "resource.Quantity"


@dataclass(frozen=True)
class Duration:
    go_type: str = "v1.Duration"


@dataclass(frozen=True)
class Raw:
    """runtime.RawExtension, or a part of an object the lab never reads: any JSON."""

    go_type: str = "runtime.RawExtension"


@dataclass(frozen=True)
class ListOf:
    item: Spec

    @property
    def go_type(self) -> str:
        return f"[]{self.item.go_type}"


@dataclass(frozen=True)
class MapOf:
    value: Spec

    @property
    def go_type(self) -> str:
        return f"map[string]{self.value.go_type}"


@dataclass(frozen=True)
class Struct:
    go_type: str  # package.Name, as Go prints it
    fields: Mapping[str, Spec] = field(default_factory=dict)


Spec = Scalar | Quantity | Duration | Raw | ListOf | MapOf | Struct

STRING, BOOL, INT32, INT64 = Scalar("string"), Scalar("bool"), Scalar("int32"), Scalar("int64")
RESOURCES = MapOf(Quantity())
LABELS = MapOf(STRING)
OBJECT_META = Struct(
    "v1.ObjectMeta",
    {
        "name": STRING,
        "generateName": STRING,
        "namespace": STRING,
        "uid": STRING,
        "resourceVersion": STRING,
        "labels": LABELS,
        "annotations": LABELS,
        "ownerReferences": ListOf(
            Struct(
                "v1.OwnerReference",
                {"apiVersion": STRING, "kind": STRING, "name": STRING, "uid": STRING},
            )
        ),
    },
)
POD_SPEC = Struct(
    "v1.PodSpec",
    {
        "hostNetwork": BOOL,
        "dnsPolicy": STRING,
        "schedulerName": STRING,
        "priorityClassName": STRING,
        "hostname": STRING,
        "subdomain": STRING,
        "containers": ListOf(Raw("v1.Container")),
        "initContainers": ListOf(Raw("v1.Container")),
    },
)
POLICY = Struct(
    "v1alpha1.LifecyclePolicy",
    {
        "action": STRING,
        "event": STRING,
        "events": ListOf(STRING),
        "exitCode": INT32,
        "timeout": Duration(),
    },
)
TASK = Struct(
    "v1alpha1.TaskSpec",
    {
        "name": STRING,
        "replicas": INT32,
        "minAvailable": INT32,
        "maxRetry": INT32,
        "template": Struct("v1.PodTemplateSpec", {"metadata": OBJECT_META, "spec": POD_SPEC}),
        "policies": ListOf(POLICY),
        "topologyPolicy": STRING,
    },
)
JOB = Struct(
    "v1alpha1.Job",
    {
        "apiVersion": STRING,
        "kind": STRING,
        "metadata": OBJECT_META,
        "spec": Struct(
            "v1alpha1.JobSpec",
            {
                "schedulerName": STRING,
                "minAvailable": INT32,
                "tasks": ListOf(TASK),
                "policies": ListOf(POLICY),
                "plugins": MapOf(ListOf(STRING)),
                "queue": STRING,
                "maxRetry": INT32,
                "ttlSecondsAfterFinished": INT32,
                "priorityClassName": STRING,
                "minSuccess": INT32,
            },
        ),
    },
)
QUEUE = Struct(
    "v1beta1.Queue",
    {
        "apiVersion": STRING,
        "kind": STRING,
        "metadata": OBJECT_META,
        "spec": Struct(
            "v1beta1.QueueSpec",
            {
                "weight": INT32,
                "capability": RESOURCES,
                "deserved": RESOURCES,
                "guarantee": Struct("v1beta1.Guarantee", {"resource": RESOURCES}),
                "reclaimable": BOOL,
                "parent": STRING,
                "priority": INT32,
                "type": STRING,
            },
        ),
        "status": Struct("v1beta1.QueueStatus", {"state": STRING, "allocated": RESOURCES}),
    },
)
NETWORK_TOPOLOGY = Struct(
    "v1beta1.NetworkTopologySpec",
    {"mode": STRING, "highestTierAllowed": Scalar("int"), "highestTierName": STRING},
)
POD_GROUP = Struct(
    "v1beta1.PodGroup",
    {
        "apiVersion": STRING,
        "kind": STRING,
        "metadata": OBJECT_META,
        "spec": Struct(
            "v1beta1.PodGroupSpec",
            {
                "minMember": INT32,
                "minTaskMember": MapOf(INT32),
                "queue": STRING,
                "priorityClassName": STRING,
                "minResources": RESOURCES,
                "networkTopology": NETWORK_TOPOLOGY,
                "subGroupPolicy": ListOf(
                    Struct(
                        "v1beta1.SubGroupPolicySpec",
                        {"name": STRING, "networkTopology": NETWORK_TOPOLOGY},
                    )
                ),
            },
        ),
    },
)
_GVK = Struct("v1.GroupVersionKind", {"group": STRING, "version": STRING, "kind": STRING})
_GVR = Struct("v1.GroupVersionResource", {"group": STRING, "version": STRING, "resource": STRING})
REVIEW = Struct(
    "v1.AdmissionReview",
    {
        "apiVersion": STRING,
        "kind": STRING,
        "request": Struct(
            "v1.AdmissionRequest",
            {
                "uid": STRING,
                "kind": _GVK,
                "resource": _GVR,
                "subResource": STRING,
                "requestKind": _GVK,
                "requestResource": _GVR,
                "name": STRING,
                "namespace": STRING,
                "operation": STRING,
                "userInfo": Struct(
                    "v1.UserInfo",
                    {"username": STRING, "uid": STRING, "groups": ListOf(STRING)},
                ),
                "object": Raw(),
                "oldObject": Raw(),
                "dryRun": BOOL,
                "options": Raw(),
            },
        ),
    },
)


@dataclass(frozen=True)
class Kind:
    """What a route decodes: the resource it must be asked about and the object's type."""

    group: str
    version: str
    resource: str
    kind: str
    spec: Struct

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


JOBS = Kind(apis.BATCH_GROUP, apis.BATCH_VERSION, "jobs", "Job", JOB)
QUEUES = Kind(apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, "queues", "Queue", QUEUE)
PODGROUPS = Kind(apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, "podgroups", "PodGroup", POD_GROUP)


# -- decoding -------------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    """How Go's decoder names a JSON value it cannot store."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _type_error(value: Any, spec: Spec, path: tuple[str, ...], struct: str | None) -> DecodeError:
    what = _json_type(value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        what = what.split(" ")[0]
    if struct is None:
        return DecodeError(f"json: cannot unmarshal {what} into Go value of type {spec.go_type}")
    where = f"{struct}.{'.'.join(path)}"
    return DecodeError(
        f"json: cannot unmarshal {what} into Go struct field {where} of type {spec.go_type}"
    )


def _zero(spec: Spec) -> Any:
    """The value Go's decoder leaves for a JSON ``null`` inside a list or a map."""
    if isinstance(spec, Scalar):
        return {"string": "", "bool": False}.get(spec.go_type, 0)
    if isinstance(spec, Quantity):
        return "0"
    if isinstance(spec, Struct | MapOf):
        return {}
    return [] if isinstance(spec, ListOf) else None


def convert(value: Any, spec: Spec, path: tuple[str, ...] = (), struct: str | None = None) -> Any:
    """``value`` as ``spec`` (a ``null`` list item or map value becomes the type's zero
    value, as in Go); DecodeError where it would not decode."""
    if value is None or isinstance(spec, Raw):
        return value
    if isinstance(spec, Scalar):
        _check_scalar(value, spec, path, struct)
    elif isinstance(spec, Quantity):
        _check_quantity(value, spec, path, struct)
    elif isinstance(spec, Duration):
        if not isinstance(value, str):
            raise _type_error(value, STRING, path, struct)
        try:
            parse_duration(value)
        except ValueError as exc:
            raise DecodeError(f"{'.'.join(path)}: {exc}") from None
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            raise _type_error(value, spec, path, struct)
        return [
            _zero(spec.item) if item is None else convert(item, spec.item, path, struct)
            for item in value
        ]
    elif isinstance(spec, MapOf):
        if not isinstance(value, dict):
            raise _type_error(value, spec, path, struct)
        return {
            key: _zero(spec.value) if item is None else convert(item, spec.value, path, struct)
            for key, item in value.items()
        }
    else:
        if not isinstance(value, dict):
            raise _type_error(value, spec, path, struct)
        name = spec.go_type.rsplit(".", 1)[-1]
        out = dict(value)
        for key, sub in spec.fields.items():
            if key in value:
                out[key] = convert(value[key], sub, (*path, key), name)
        return out
    return value


def _check_scalar(value: Any, spec: Scalar, path: tuple[str, ...], struct: str | None) -> None:
    if spec.go_type == "string":
        ok = isinstance(value, str)
    elif spec.go_type == "bool":
        ok = isinstance(value, bool)
    else:
        bits = _INT_BITS[spec.go_type]
        ok = (
            isinstance(value, int)
            and not isinstance(value, bool)
            and -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)
        )
    if not ok:
        raise _type_error(value, spec, path, struct)


def _check_quantity(value: Any, spec: Quantity, path: tuple[str, ...], struct: str | None) -> None:
    """resource.Quantity's UnmarshalJSON: a string or a number, parsed as a quantity."""
    text = value if isinstance(value, str) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        text = str(value)
    if text is not None:
        try:
            parsed = quantity(text.strip())
        except (ValueError, ArithmeticError):
            parsed = None
        if parsed is not None and parsed.is_finite():
            return
    where = f"{struct}.{'.'.join(path)}" if struct else "value"
    raise DecodeError(
        f"json: cannot unmarshal {_json_type(value).split(' ')[0]} into Go struct field "
        f"{where} of type {spec.go_type}: quantities must match the regular expression "
        f"'{QUANTITY_PATTERN}'"
    )


def review_request(body: Any) -> Obj:
    """The AdmissionRequest of a decoded body; DecodeError if the body is no review."""
    review = convert(body, REVIEW)
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        raise DecodeError("the AdmissionReview carries no request")
    return request


def gvr_text(group: str, version: str, resource: str) -> str:
    """metav1.GroupVersionResource as Go's %s prints a struct."""
    return f"{{{group} {version} {resource}}}"


def decode(request: Mapping[str, Any], key: str, kind: Kind) -> Obj:
    """DecodeJob / DecodeQueue / DecodePodGroup of ``request[key]`` (object, oldObject)."""
    resource = request.get("resource") or {}
    asked = (resource.get("group") or "", resource.get("version") or "", resource.get("resource"))
    if asked != (kind.group, kind.version, kind.resource):
        raise DecodeError(
            f"expect resource to be {gvr_text(kind.group, kind.version, kind.resource)}"
        )
    obj = request.get(key)
    if not isinstance(obj, dict):
        raise DecodeError(
            f"couldn't get version/kind; json parse error: the request's {key} is "
            f"{'missing' if obj is None else _json_type(obj).split(' ')[0]}, not an object"
        )
    obj = convert(obj, kind.spec)
    api_version, obj_kind = obj.get("apiVersion") or "", obj.get("kind") or ""
    if (api_version and api_version != kind.api_version) or (obj_kind and obj_kind != kind.kind):
        raise DecodeError(
            f"the {key} is a {api_version or '?'} {obj_kind or '?'}, "
            f"expected {kind.api_version} {kind.kind}"
        )
    return obj
