"""A lab admission-check controller, ``gpulab.io/gpus-healthy``: a Workload that holds
quota is admitted only once every node of its assigned flavors reports all its GPUs
healthy (``nvidia.com/gpu`` allocatable equals capacity, as the device plugin's
ListAndWatch reports them). Lab convenience: upstream ships no such check; it stands
where a real check controller (ProvisioningRequest, MultiKueue) would.

It follows the contract of kubernetes-sigs/kueue v0.19.2 for check controllers
(apis/kueue/v1beta2/admissioncheck_types.go, pkg/controller/admissionchecks/
provisioning as the model): it marks its AdmissionChecks ``Active``, and moves the
Workload's ``status.admissionChecks[]`` state for its checks from ``Pending`` to
``Ready`` (the workload controller then sets Admitted, see ``SyncAdmittedCondition``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from gpulab.informer import NODES
from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.controllers.client import ADMISSION_CHECKS, WORKLOADS
from gpulab.kueue.model import Flavor, condition_true
from gpulab.trace import ObjectRef

if TYPE_CHECKING:
    from gpulab.kueue.controllers.manager import Manager

_log = logging.getLogger("gpulab.kueue.gpus-healthy")
CONTROLLER = "gpulab.io/gpus-healthy"
GPU = "nvidia.com/gpu"


def gpus_healthy(flavors: list[Flavor], nodes: list[Mapping[str, Any]]) -> tuple[bool, str]:
    """(healthy, message) for the GPU nodes the flavors select. Pure."""
    selected = []
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        status = node.get("status") or {}
        capacity = int((status.get("capacity") or {}).get(GPU, "0") or 0)
        if capacity == 0:
            continue
        if any(all(labels.get(k) == v for k, v in f.node_labels.items()) for f in flavors):
            allocatable = int((status.get("allocatable") or {}).get(GPU, "0") or 0)
            selected.append((node["metadata"]["name"], allocatable, capacity))
    if not selected:
        names = ", ".join(f.name for f in flavors)
        return False, f"no node with {GPU} matches flavor(s) {names}"
    sick = [f"{n} has {a}/{c} healthy" for n, a, c in selected if a < c]
    if sick:
        return False, f"waiting for healthy GPUs: {'; '.join(sick)}"
    return True, f"all GPUs healthy on {len(selected)} node(s)"


class GpusHealthyController:
    def __init__(self, manager: Manager) -> None:
        self.m = manager

    def _mine(self) -> set[str]:
        with self.m.lock:
            checks = list(self.m.cache.admission_checks.items())
        return {name for name, info in checks if info.controller == CONTROLLER}

    def reconcile(self, key: str) -> None:
        kind, _, name = key.partition(":")
        if kind == "AdmissionCheck":
            self._admission_check(name)
        elif kind == "Workload":
            self._workload(name)
        else:  # nodes changed: every Workload waiting on one of our checks
            mine = self._mine()
            for wl in self.m.store(WORKLOADS).list():
                if any(
                    c.get("name") in mine and c.get("state") == api.CHECK_PENDING
                    for c in wlutil.admission_checks(wl)
                ):
                    self._workload(f"{wl['metadata']['namespace']}/{wl['metadata']['name']}")

    def _admission_check(self, name: str) -> None:
        ac = self.m.store(ADMISSION_CHECKS).get(name)
        if ac is None or (ac.get("spec") or {}).get("controllerName") != CONTROLLER:
            return
        if condition_true(ac, api.CQ_ACTIVE):
            return
        new = copy.deepcopy(ac)
        wlutil.set_condition(
            new,
            api.CQ_ACTIVE,
            "True",
            "Active",
            "The admission check is active",
            wlutil.now_rfc3339(),
        )
        try:
            self.m.kube.replace_status(ADMISSION_CHECKS, new)
        except ApiException as exc:
            _log.info("AdmissionCheck %s status not written: %s", name, exc.status)
            return
        self.m.tracer.step("Reconcile", ObjectRef.of(new), f"AdmissionCheck {name} is active")

    def _workload(self, key: str) -> None:
        m = self.m
        wl = m.store(WORKLOADS).get(key)
        mine = self._mine()
        if wl is None or not wlutil.has_quota_reservation(wl):
            return
        pending = [
            c["name"]
            for c in wlutil.admission_checks(wl)
            if c.get("name") in mine and c.get("state") == api.CHECK_PENDING
        ]
        if not pending:
            return
        flavors = [m.cache.flavors[f] for f in wlutil.flavors_of(wl) if f in m.cache.flavors]
        healthy, message = gpus_healthy(flavors, m.store(NODES).list())
        state = api.CHECK_READY if healthy else api.CHECK_PENDING
        now = wlutil.now_rfc3339()

        def mutate(w: MutableMapping[str, Any]) -> bool:
            changed = False
            for c in wlutil.admission_checks(w):
                if c.get("name") in pending and (c.get("state"), c.get("message")) != (
                    state,
                    message,
                ):
                    if c.get("state") != state:
                        c["lastTransitionTime"] = now
                    c.update(state=state, message=message)
                    changed = True
            if changed:
                w["status"]["admissionChecks"] = wlutil.admission_checks(w)
            return changed

        written = m.scheduler.update_status(key, mutate)
        if written is not None:
            m.tracer.step(
                "Reconcile",
                ObjectRef.of(written),
                f"AdmissionCheck {', '.join(pending)}: {state}: {message}",
                warning=not healthy,
            )
