"""The troubleshooting labs: a broken scenario each, on the labs cluster
(``harness/clusters/labs.yaml``), in the lab's own namespace and on its own nodes; lab-mig
on its own (``labs-mig.yaml``: the GPU Operator deploys its device plugin itself).

    gpulab lab start NAME   set the scenario up, print the symptom
    gpulab lab hint NAME    the next hint (``--all`` for every one)
    gpulab lab check NAME   fixed or not, per case (exit 0 when every case is fixed)
    gpulab lab stop NAME    remove what the lab made and undo what it broke

A lab is a :class:`Lab`: cases (each a symptom the learner meets and the link
`gpulab diagnose` must name), hints and the documented solution. Labs use the
:class:`~harness.backends.Backend` interface only (``inject_fault`` for an Xid).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.wait import wait_for

SPEC = "labs"
POOL_LABEL = "gpulab.io/lab-pool"
LAB_LABEL = "gpulab.io/lab"
Progress = Callable[[str], None]
Obj = dict[str, Any]

# lab name -> module in this package
LABS = {
    "unschedulable": "harness.labs.unschedulable",
    "device-plugin": "harness.labs.device_plugin",
    "gang-deadlock": "harness.labs.gang_deadlock",
    "gang-deadlock-volcano": "harness.labs.gang_deadlock_volcano",
    "queue-quota": "harness.labs.queue_quota",
    "mig": "harness.labs.mig",
}


@dataclass(frozen=True)
class Case:
    """One broken thing: the object to diagnose, the link `gpulab diagnose` names for it,
    what the learner sees, and the fix (the solution section of docs/workshop.md)."""

    name: str
    symptom: str
    target: tuple[str, str]  # (diagnose kind, ref), e.g. ("pod", "lab-x/app-abc")
    link: str  # the first broken link's name
    fix: str


@dataclass(frozen=True)
class CaseState:
    case: str
    fixed: bool
    detail: str


class Lab(Protocol):
    name: str
    namespace: str
    spec: str  # the cluster spec it runs on: SPEC, or its own (lab-mig: the GPU Operator's)
    summary: str
    hints: tuple[str, ...]

    def start(self, backend: Any, progress: Progress) -> None: ...

    def cases(self, api: client.ApiClient) -> list[Case]:
        """The cases with their live targets (pod names are known only once running)."""
        ...

    def check(self, api: client.ApiClient) -> list[CaseState]: ...

    def stop(self, backend: Any, progress: Progress) -> None: ...


def load(name: str) -> Lab:
    from harness.errors import HarnessError

    if name not in LABS:
        raise HarnessError(f"no lab {name!r}; labs: {', '.join(LABS)}")
    return importlib.import_module(LABS[name]).LAB


# ---------------------------------------------------------------- shared steps


# HAMi's documented opt-out: its webhook leaves pods of such namespaces alone, so only the
# HAMi case's pods go to hami-scheduler on the labs cluster
HAMI_IGNORE = {"hami.io/webhook": "ignore"}


@dataclass
class Namespace:
    """The lab's namespace, labelled as the lab's (``gpulab lab stop`` deletes it) and,
    unless ``hami`` is set, out of HAMi's webhook."""

    name: str
    hami: bool = False

    def create(self, api: client.ApiClient, lab: str) -> None:
        core = client.CoreV1Api(api)
        self.delete(api)
        body = client.V1Namespace(
            metadata=client.V1ObjectMeta(
                name=self.name, labels={LAB_LABEL: lab, **({} if self.hami else HAMI_IGNORE)}
            )
        )
        core.create_namespace(body)
        wait_for(
            lambda: core.list_namespaced_service_account(self.name).items,
            30,
            f"the default ServiceAccount of {self.name}",
        )

    def delete(self, api: client.ApiClient, timeout: float = 90) -> None:
        core = client.CoreV1Api(api)
        try:
            core.delete_namespace(self.name, propagation_policy="Foreground")
        except ApiException as exc:
            if exc.status == 404:
                return
            raise

        def gone() -> bool:
            try:
                core.read_namespace(self.name)
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, timeout, f"namespace {self.name} to go", 0.5)


def deployment(
    name: str,
    namespace: str,
    gpus: int,
    *,
    resource: str = "nvidia.com/gpu",
    node_selector: dict[str, str] | None = None,
    tolerations: list[Obj] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler: str | None = None,
    extra: dict[str, str] | None = None,
) -> Obj:
    """A one-replica Deployment asking for ``gpus`` of ``resource``: what the learner edits
    (a pod's resources or selectors cannot change; its Deployment's can)."""
    pod_spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {resource: str(gpus), **(extra or {})}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": pod_spec,
            },
        },
    }


def create(api: client.ApiClient, obj: Obj) -> None:
    from kubernetes import utils

    utils.create_from_dict(api, obj)


def pods_of(api: client.ApiClient, namespace: str, selector: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def newest_pod(api: client.ApiClient, namespace: str, app: str) -> client.V1Pod | None:
    """The app's newest live pod (a Failed one, e.g. kubelet's UnexpectedAdmissionError,
    is replaced by its ReplicaSet)."""
    pods = [p for p in pods_of(api, namespace, f"app={app}") if p.status.phase != "Failed"]
    return max(pods, key=lambda p: p.metadata.creation_timestamp, default=None)


def running(pod: client.V1Pod | None) -> bool:
    return pod is not None and pod.status.phase == "Running" and bool(pod.spec.node_name)


def wait_pending_reason(
    api: client.ApiClient, namespace: str, app: str, timeout: float = 60
) -> None:
    """Until the app's pod has been looked at by its scheduler (a FailedScheduling Event or
    a PodScheduled=False condition): the symptom is then visible."""

    def seen() -> bool:
        pod = newest_pod(api, namespace, app)
        if pod is None:
            return False
        return any(
            c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or []
        )

    wait_for(seen, timeout, f"the scheduler to report on {namespace}/{app}", 0.5)
