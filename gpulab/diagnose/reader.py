"""Read the object set a diagnosis needs from a live cluster. The only I/O of
`gpulab diagnose`: GETs and LISTs (it never writes), plus one TCP connect per webhook
whose clientConfig is a URL (does anything answer there?).

Works on any backend or kubeconfig: chapters whose API groups are not served are simply
empty (recorded in ``installed``), a Forbidden list is skipped.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.diagnose.objects import Obj, ObjectSet, Target, custom_mig_config
from gpulab.gpuoperator.api import MIG_PARTED_DEFAULT_CONFIGMAP
from gpulab.gpuoperator.migmanager import NODE_CONFIGMAP_LABELS

PROBE_TIMEOUT = 2.0
# (ObjectSet field, group, version, plural, namespaced)
CUSTOM = (
    ("workloads", "kueue.x-k8s.io", "v1beta2", "workloads", True),
    ("local_queues", "kueue.x-k8s.io", "v1beta2", "localqueues", True),
    ("cluster_queues", "kueue.x-k8s.io", "v1beta2", "clusterqueues", False),
    ("resource_flavors", "kueue.x-k8s.io", "v1beta2", "resourceflavors", False),
    ("volcano_podgroups", "scheduling.volcano.sh", "v1beta1", "podgroups", True),
    ("volcano_queues", "scheduling.volcano.sh", "v1beta1", "queues", False),
    ("volcano_jobs", "batch.volcano.sh", "v1alpha1", "jobs", True),
    ("coscheduling_podgroups", "scheduling.x-k8s.io", "v1alpha1", "podgroups", True),
    ("cluster_policies", "nvidia.com", "v1", "clusterpolicies", False),
)


def _plain(api: client.ApiClient, obj: Any) -> Obj:
    data = obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)
    data.get("metadata", {}).pop("managedFields", None)
    return data


def _items(api: client.ApiClient, call: Callable[[], Any]) -> list[Obj] | None:
    """The list's items as plain dicts; None when the API is absent or forbidden."""
    try:
        result = call()
    except ApiException as exc:
        if exc.status in (403, 404):
            return None
        raise
    items = result["items"] if isinstance(result, dict) else result.items
    return [_plain(api, i) for i in items]


def read(api: client.ApiClient, target: Target) -> ObjectSet:
    core = client.CoreV1Api(api)
    objs = ObjectSet(target)
    ns = target.namespace

    def all_or_ns(namespaced: Callable[..., Any], everywhere: Callable[..., Any], **kw: Any) -> Any:
        return (lambda: namespaced(ns, **kw)) if ns else (lambda: everywhere(**kw))

    objs.nodes = _items(api, core.list_node) or []
    objs.pods = _items(api, core.list_pod_for_all_namespaces) or []
    objs.namespaces = _items(api, core.list_namespace) or []
    events = (
        _items(api, all_or_ns(core.list_namespaced_event, core.list_event_for_all_namespaces)) or []
    )
    if ns:  # Events about Nodes live in "default"
        events += [
            e
            for e in _items(api, lambda: core.list_namespaced_event("default")) or []
            if (e.get("involvedObject") or {}).get("kind") == "Node"
        ]
    objs.events = events
    batch = client.BatchV1Api(api)
    objs.jobs = (
        _items(api, all_or_ns(batch.list_namespaced_job, batch.list_job_for_all_namespaces)) or []
    )
    objs.services = _items(api, core.list_service_for_all_namespaces) or []
    adm = client.AdmissionregistrationV1Api(api)
    objs.mutating_webhooks = _items(api, adm.list_mutating_webhook_configuration) or []
    objs.validating_webhooks = _items(api, adm.list_validating_webhook_configuration) or []
    coord = client.CoordinationV1Api(api)
    objs.leases = _items(api, lambda: coord.list_namespaced_lease("kube-system")) or []
    custom = client.CustomObjectsApi(api)
    for attr, group, version, plural, namespaced in CUSTOM:
        scoped = ns if namespaced else ""
        call = _custom_list(custom, group, version, plural, scoped)
        items = _items(api, call)
        if items is not None:
            setattr(objs, attr, items)
            if f"{group}/{version}" not in objs.installed:
                objs.installed.append(f"{group}/{version}")
    # the MIG manager's configs: the one the ClusterPolicy names (spec.migManager.config),
    # the operator's default and each node's <node>-mig-config
    custom_config = custom_mig_config(objs.cluster_policies)
    names = dict.fromkeys(n for n in (custom_config, MIG_PARTED_DEFAULT_CONFIGMAP) if n)
    selectors = [{"field_selector": f"metadata.name={n}"} for n in names]
    selectors.append(
        {"label_selector": ",".join(f"{k}={v}" for k, v in NODE_CONFIGMAP_LABELS.items())}
    )
    for selector in selectors:
        objs.configmaps += (
            _items(api, lambda s=selector: core.list_config_map_for_all_namespaces(**s)) or []
        )
    objs.probes = probe_webhooks(objs)
    return objs


def _custom_list(
    custom: client.CustomObjectsApi, group: str, version: str, plural: str, ns: str
) -> Callable[[], Any]:
    if ns:
        return lambda: custom.list_namespaced_custom_object(group, version, ns, plural)
    return lambda: custom.list_cluster_custom_object(group, version, plural)


def probe_webhooks(objs: ObjectSet) -> dict[str, str]:
    """url -> "ok" when a TCP connection to its host:port opens, else the error."""
    out: dict[str, str] = {}
    for config in objs.mutating_webhooks + objs.validating_webhooks:
        for hook in config.get("webhooks") or []:
            url = (hook.get("clientConfig") or {}).get("url")
            if url and url not in out:
                out[url] = probe(url)
    return out


def probe(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=PROBE_TIMEOUT):
            return "ok"
    except OSError as exc:
        return f"no answer ({exc.strerror or exc})"
