"""The object controls: what one state's objects are made to be on each step.

Mirrors NVIDIA gpu-operator v26.7.0 ``controllers/object_controls.go``: for every kind
(``ServiceAccount``, ``Role``, ``RoleBinding``, ``ClusterRole``, ``ClusterRoleBinding``,
``ConfigMaps``, ``DaemonSet``, ``Service``, ``RuntimeClasses``) the control deletes the
object when its state is disabled (``disabled``), creates it when missing, updates it
when it changed, and reports ``ready``; a DaemonSet is created only once there are GPU
nodes, is compared by its ``nvidia.com/last-applied-hash`` (``isDaemonsetSpecChanged``;
an update reports ``notReady``) and is as ready as ``isDaemonSetReady`` says; the
default mig-parted and GPU-clients ConfigMaps are left out when the ClusterPolicy names
custom ones; the ``nvidia-cdi`` and ``nvidia-legacy`` RuntimeClasses exist only while CDI
is enabled. ``resource_manager.go``'s ``addResourcesControls`` becomes
:func:`add_resources_controls`.

Deliberate differences: reads come from the informers' caches (controller-runtime's
client reads DaemonSets from its cache too) and every kind is compared by the hash
annotation, so a pass with nothing to change makes no API call (upstream Creates and
Updates the RBAC objects, ConfigMaps and Services on every pass); an OnDelete
DaemonSet's readiness is read from its status counters (updatedNumberScheduled,
numberReady) rather than from ControllerRevision hashes on its pods.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.gpuoperator import api, render
from gpulab.gpuoperator.states import ClusterPolicyController, Control
from gpulab.informer import Resource, Store

Obj = dict[str, Any]

RESOURCES = {
    "ServiceAccount": Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    "ConfigMap": Resource("", "v1", "configmaps", "ConfigMap"),
    "Service": Resource("", "v1", "services", "Service"),
    "Role": Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    "RoleBinding": Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    "ClusterRole": Resource(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
    ),
    "ClusterRoleBinding": Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    "DaemonSet": Resource("apps", "v1", "daemonsets", "DaemonSet"),
    "RuntimeClass": Resource("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
}


class Cluster(Protocol):
    """What the controls read and write (``client.Client``); fakes in unit tests."""

    def cached(self, kind: str, namespace: str | None, name: str) -> Obj | None: ...

    def create(self, kind: str, obj: Obj) -> Obj: ...

    def replace(self, kind: str, obj: Obj) -> Obj: ...

    def delete(self, kind: str, namespace: str | None, name: str) -> None: ...


def daemonset_ready(ds: Mapping[str, Any]) -> str:
    """``isDaemonSetReady``: nothing to schedule is ready; an unavailable pod is not;
    a RollingUpdate DaemonSet is ready once its latest generation is observed and every
    pod is updated and available (``isDaemonSetRollingUpdateComplete``); an OnDelete one
    once every pod runs the current template and is ready."""
    status = ds.get("status") or {}
    desired = status.get("desiredNumberScheduled", 0)
    if desired == 0:
        return api.READY
    if status.get("numberUnavailable", 0):
        return api.NOT_READY
    strategy = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("type")
    if strategy != "OnDelete":
        complete = (
            status.get("observedGeneration", 0) >= (ds.get("metadata") or {}).get("generation", 0)
            and status.get("updatedNumberScheduled", 0) == desired
            and status.get("numberAvailable", 0) == desired
        )
        return api.READY if complete else api.NOT_READY
    updated = status.get("updatedNumberScheduled", 0) == desired
    return api.READY if updated and status.get("numberReady", 0) == desired else api.NOT_READY


def daemonset_why(ds: Mapping[str, Any]) -> str:
    """Why ``daemonset_ready`` said what it said, for the trace (empty when every pod is
    there): a DaemonSet whose nodeSelector matches no node yet is ready - and turns
    notReady once a node gets the label, until its pod runs."""
    status = ds.get("status") or {}
    name = (ds.get("metadata") or {}).get("name")
    desired = status.get("desiredNumberScheduled", 0)
    if desired == 0:
        return f"DaemonSet {name}: no node selected yet, nothing to wait for"
    unavailable = status.get("numberUnavailable", 0)
    if unavailable:
        return f"DaemonSet {name}: {unavailable} of {desired} pod(s) not available yet"
    if daemonset_ready(ds) != api.READY:
        return f"DaemonSet {name}: {status.get('updatedNumberScheduled', 0)}/{desired} updated"
    return ""


def _hash(obj: Mapping[str, Any] | None) -> str | None:
    return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(
        render.HASH_ANNOTATION
    )


def _custom_configmap_wins(name: str, spec: Mapping[str, Any]) -> bool:
    """createConfigMap: the default mig-parted / GPU-clients ConfigMap is not created when
    the ClusterPolicy names a custom one."""
    mig = api.component(spec, "migManager")
    if name == api.MIG_PARTED_DEFAULT_CONFIGMAP:
        return api.configmap_name(mig.get("config"), name)[1]
    if name == api.MIG_DEFAULT_GPU_CLIENTS_CONFIGMAP:
        return api.configmap_name(mig.get("gpuClientsConfig"), name)[1]
    return False


Observer = Callable[[str, str, Obj], None]
"""Told each change a control makes: (verb, kind, object) - the trace."""


def object_control(
    doc: Obj, cluster: Cluster, namespace: str, image: str, observe: Observer
) -> Control:
    """The control of one asset document (``ServiceAccount()``, ``DaemonSet()`` ...)."""
    kind = doc["kind"]

    def control(n: ClusterPolicyController) -> str:
        obj = render.render(doc, render.Context(namespace, image, n.singleton))
        meta = obj["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        current = cluster.cached(kind, ns, name)
        if not n.state_enabled():
            if current is not None:
                cluster.delete(kind, ns, name)
                observe("deleted", kind, current)
            return api.DISABLED
        if (
            kind == "RuntimeClass"
            and name in render.CDI_RUNTIME_CLASSES
            and not api.enabled(n.spec, "cdi")
        ):  # RuntimeClasses: these two exist only while CDI is enabled
            if current is not None:
                cluster.delete(kind, ns, name)
                observe("deleted", kind, current)
            return api.READY
        if kind == "DaemonSet" and not n.has_gpu_nodes:
            return api.READY  # "No GPU node in the cluster, do not create DaemonSets"
        if kind == "ConfigMap" and _custom_configmap_wins(name, n.spec):
            return api.READY
        if current is None:
            cluster.create(kind, obj)
            observe("created", kind, obj)
            if kind == "DaemonSet":
                n.why[n.state] = f"DaemonSet {name} created"
            return api.NOT_READY if kind == "DaemonSet" else api.READY
        if _hash(current) != _hash(obj) and kind != "ServiceAccount":
            meta["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            if kind == "Service":
                obj["spec"]["clusterIP"] = (current.get("spec") or {}).get("clusterIP")
            cluster.replace(kind, obj)
            observe("updated", kind, obj)
            if kind == "DaemonSet":
                n.why[n.state] = f"DaemonSet {name} updated"
            return api.NOT_READY if kind == "DaemonSet" else api.READY
        if kind != "DaemonSet":
            return api.READY
        n.why[n.state] = daemonset_why(current)
        return daemonset_ready(current)

    return control


def add_resources_controls(
    docs: list[Obj], cluster: Cluster, namespace: str, image: str, observe: Observer
) -> list[Control]:
    """``addResourcesControls``: one control per object of the state, in file order
    (kinds the lab does not manage are refused by name)."""
    unknown = sorted({d["kind"] for d in docs} - set(RESOURCES))
    if unknown:
        raise render.AssetError(f"assets of kinds {unknown} are not managed by the operator")
    return [object_control(d, cluster, namespace, image, observe) for d in docs]


# ---------------------------------------------------------------- the real cluster


class KubeCluster:
    """Reads from the informers' stores, writes to the API server (raw JSON)."""

    def __init__(self, api_client: client.ApiClient, stores: Mapping[str, Store]) -> None:
        self.api = api_client
        self.stores = stores

    def cached(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        key = f"{namespace}/{name}" if namespace and RESOURCES[kind].namespaced else name
        return self.stores[kind].get(key)

    def _call(self, method: str, path: str, body: Any = None) -> Obj:
        response = self.api.call_api(
            path,
            method,
            body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
        )
        return json.loads(response.data or b"{}")

    def _path(self, kind: str, namespace: str | None, name: str | None = None) -> str:
        base = RESOURCES[kind].path(namespace)
        return f"{base}/{name}" if name else base

    def create(self, kind: str, obj: Obj) -> Obj:
        res = RESOURCES[kind]
        body = {"apiVersion": res.api_version, "kind": kind, **obj}
        return self._call("POST", self._path(kind, obj["metadata"].get("namespace")), body)

    def replace(self, kind: str, obj: Obj) -> Obj:
        res = RESOURCES[kind]
        body = {"apiVersion": res.api_version, "kind": kind, **obj}
        meta = obj["metadata"]
        return self._call("PUT", self._path(kind, meta.get("namespace"), meta["name"]), body)

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        try:
            self._call("DELETE", self._path(kind, namespace, name))
        except ApiException as exc:
            if exc.status != 404:
                raise
