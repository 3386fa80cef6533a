"""What the scheduling-chapter e2e tests share: their cluster, pods in and out, Events."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conftest import Cluster, running_cluster
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.framework.objects import manifest
from gpulab.wait import wait_for

SPEC = "scheduling-e2e"
SCHEDULER = "gpulab-scheduler"
Obj = dict[str, Any]


def scheduling_cluster() -> Iterator[Cluster]:
    with running_cluster(SPEC) as c:
        yield c


def create_pod(api: client.ApiClient, pod: Mapping[str, Any]) -> Obj:
    ns = pod["metadata"]["namespace"]
    created = client.CoreV1Api(api).create_namespaced_pod(ns, manifest(pod))
    return api.sanitize_for_serialization(created)


def read_pod(api: client.ApiClient, ns: str, name: str) -> Obj | None:
    try:
        return api.sanitize_for_serialization(client.CoreV1Api(api).read_namespaced_pod(name, ns))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_bound(api: client.ApiClient, ns: str, name: str, timeout: float = 30) -> Obj:
    return wait_for(
        lambda: (p := read_pod(api, ns, name)) and p["spec"].get("nodeName") and p,
        timeout,
        f"pod {ns}/{name} to be bound",
    )


def events_about(api: client.ApiClient, ns: str, name: str, reason: str) -> list[Obj]:
    """core/v1 view of the Events about pod ``name`` with ``reason`` (any API wrote them)."""
    events = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},reason={reason}"
    )
    return api.sanitize_for_serialization(events)["items"]


def wait_event(api: client.ApiClient, ns: str, name: str, reason: str, timeout: float = 30) -> Obj:
    return wait_for(
        lambda: (evs := events_about(api, ns, name, reason)) and evs[-1],
        timeout,
        f"a {reason} Event about pod {ns}/{name}",
    )


def delete_pods(api: client.ApiClient, ns: str, timeout: float = 60) -> None:
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout, f"pods of {ns} to go")
