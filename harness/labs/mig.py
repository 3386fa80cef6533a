"""lab-mig: a MIG layout that is not applied, and a pod asking for a MIG profile the node
does not offer under its MIG strategy. On its own cluster (``harness/clusters/
labs-mig.yaml``) where the GPU Operator (gpu-operator v26.7.0, mig-parted v0.15.0,
docs/gpu-operator.md) deploys the device plugin, GFD and the MIG manager.

The team's inference pods ask for ``nvidia.com/mig-1g.10gb`` (written for the mixed MIG
strategy). The operator was installed with the Helm chart's default ``mig.strategy:
single``, and the node was labelled ``nvidia.com/mig.config=all-1g-10gb``: no such config
in ``default-mig-parted-config``, so the MIG manager sets ``mig.config.state=failed`` and
the GPUs stay whole. Two causes in turn:

    config     the node's mig.config names no config: relabel it ``all-1g.10gb`` (4 x
               1g.10gb on each A100-40GB); the MIG manager pauses the GPU clients, applies
               the layout and restarts them (state pending -> success)
    strategy   under ``single`` the device plugin advertises the 32 MIG devices as
               ``nvidia.com/gpu`` (``gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.10gb``), never
               ``nvidia.com/mig-1g.10gb``: set the ClusterPolicy's ``spec.mig.strategy`` to
               ``mixed`` (the operator re-renders the device plugin and GFD with it), or
               make the pod ask for ``nvidia.com/gpu`` on that product

Not a fix: deleting the pod (its Deployment makes the same one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import migparted
from gpulab.gpuoperator import nodelabels as nl
from gpulab.wait import wait_for
from harness.labs import (
    POOL_LABEL,
    Case,
    CaseState,
    Namespace,
    Progress,
    create,
    deployment,
    newest_pod,
    running,
    wait_pending_reason,
)

NAME = "mig"
NS = "lab-mig"
SPEC = "labs-mig"
NODE = "gpu-mig"
APP = "inference"
PROFILE = "1g.10gb"
RESOURCE = f"nvidia.com/mig-{PROFILE}"
CONFIG = "all-1g.10gb"
TYPO = "all-1g-10gb"  # the mistake: a dash for the dot
OPERATOR_NS = "gpu-operator"
POLICY_FILE = (
    Path(__file__).resolve().parents[2] / "manifests/gpu-operator/samples/clusterpolicy.yaml"
)
READY_TIMEOUT = 180.0
FIX_CONFIG = (
    f"`kubectl label node {NODE} {nl.MIG_CONFIG_LABEL}={CONFIG} --overwrite` (a config "
    f"of ConfigMap {OPERATOR_NS}/{cp.MIG_PARTED_DEFAULT_CONFIGMAP})"
)
FIX_STRATEGY = (
    "`kubectl patch clusterpolicy cluster-policy --type merge -p "
    '\'{"spec":{"mig":{"strategy":"mixed"}}}\'` (or the pod asks for nvidia.com/gpu with '
    "nodeSelector nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.10gb)"
)


def policy(strategy: str) -> dict[str, Any]:
    """The chapter's sample ClusterPolicy with the given MIG strategy (the lab installs the
    Helm chart's default, single)."""
    body = yaml.safe_load(POLICY_FILE.read_text())
    body["spec"]["mig"] = {"strategy": strategy}
    return body


def config_names(configmap: client.V1ConfigMap | None) -> set[str]:
    text = ((configmap.data or {}) if configmap else {}).get("config.yaml", "")
    try:
        return set(migparted.parse_spec(text).mig_configs) if text else set()
    except migparted.MigConfigError:
        return set()


class MigLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = f"inference pods ask for {RESOURCE}; the A100 node never offers it"
    hints = (
        f"`gpulab diagnose node {NODE}`: the mig link reads the node's "
        f"{nl.MIG_CONFIG_LABEL} and {nl.MIG_CONFIG_STATE_LABEL} labels and the MIG manager's "
        "Event on the node",
        f"`kubectl -n {OPERATOR_NS} get configmap {cp.MIG_PARTED_DEFAULT_CONFIGMAP} -o "
        "jsonpath='{.data.config\\.yaml}'`: which configs exist, and which rows match an "
        "A100-40GB (device-filter 0x20B010DE)?",
        "once the layout is applied: `kubectl get node gpu-mig -o jsonpath="
        "'{.status.allocatable}'` and its nvidia.com/mig.strategy and gpu.product labels: "
        "under which name does the device plugin advertise the MIG devices?",
        "`kubectl get clusterpolicy cluster-policy -o jsonpath='{.spec.mig}'`: the operator "
        "renders MIG_STRATEGY into the device plugin and GFD from it",
    )

    def start(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        self.stop(backend, progress)
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        try:
            custom.patch_cluster_custom_object(
                cp.GROUP, cp.VERSION, "clusterpolicies", "cluster-policy", policy("single")
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            progress("create ClusterPolicy cluster-policy (mig.strategy single)")
            custom.create_cluster_custom_object(
                cp.GROUP, cp.VERSION, "clusterpolicies", policy("single")
            )
        progress("waiting for the operator's operands and the node's 8 whole GPUs")

        def whole_gpus() -> bool:
            state = custom.get_cluster_custom_object(
                cp.GROUP, cp.VERSION, "clusterpolicies", "cluster-policy"
            ).get("status", {})
            node = core.read_node(NODE)
            lab = node.metadata.labels or {}
            return (
                state.get("state") == cp.READY
                and lab.get(nl.MIG_CONFIG_STATE_LABEL) == "success"
                and lab.get("nvidia.com/mig.strategy") == "single"
                and (node.status.allocatable or {}).get("nvidia.com/gpu") == "8"
            )

        wait_for(whole_gpus, READY_TIMEOUT, "ClusterPolicy ready, 8 GPUs on gpu-mig", 1)
        Namespace(NS).create(api, NAME)
        _label(core, TYPO)
        wait_for(lambda: _state(core) == "failed", 60, f"the MIG manager to refuse {TYPO}", 0.5)
        create(
            api,
            deployment(APP, NS, 1, resource=RESOURCE, node_selector={POOL_LABEL: NAME}),
        )
        wait_pending_reason(api, NS, APP)
        progress(f"lab {NAME}: node {NODE} labelled {nl.MIG_CONFIG_LABEL}={TYPO}, deploy/{APP}")

    def cases(self, api: client.ApiClient) -> list[Case]:
        pod = newest_pod(api, NS, APP)
        ref = f"{NS}/{pod.metadata.name}" if pod else f"{NS}/{APP}"
        return [
            Case(
                "config",
                f"node {NODE}: {nl.MIG_CONFIG_STATE_LABEL}=failed, its GPUs stay whole",
                ("node", NODE),
                "mig",
                FIX_CONFIG,
            ),
            Case(
                "strategy",
                f"deploy/{APP}'s pod asks for {RESOURCE} and stays Pending",
                ("pod", ref),
                "node",
                FIX_STRATEGY,
            ),
        ]

    def check(self, api: client.ApiClient) -> list[CaseState]:
        core = client.CoreV1Api(api)
        lab = core.read_node(NODE).metadata.labels or {}
        wanted, state = lab.get(nl.MIG_CONFIG_LABEL, "-"), lab.get(nl.MIG_CONFIG_STATE_LABEL, "-")
        try:
            cm = core.read_namespaced_config_map(cp.MIG_PARTED_DEFAULT_CONFIGMAP, OPERATOR_NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
            cm = None
        config_ok = wanted in config_names(cm) and wanted != nl.MIG_CONFIG_DISABLED
        pod = newest_pod(api, NS, APP)
        return [
            CaseState(
                "config",
                config_ok and state == "success",
                f"{nl.MIG_CONFIG_LABEL}={wanted}, state {state}",
            ),
            CaseState(
                "strategy",
                running(pod),
                f"{APP}: " + (f"Running on {pod.spec.node_name}" if running(pod) else "Pending"),
            ),
        ]

    def stop(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        Namespace(NS).delete(api)
        core = client.CoreV1Api(api)
        if (core.read_node(NODE).metadata.labels or {}).get(nl.MIG_CONFIG_LABEL) not in (
            None,
            nl.MIG_CONFIG_DISABLED,
        ):
            _label(core, nl.MIG_CONFIG_DISABLED)
            wait_for(lambda: _state(core) == "success", 120, "the MIG manager to disable MIG", 0.5)


def _label(core: client.CoreV1Api, value: str) -> None:
    core.patch_node(NODE, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: value}}})


def _state(core: client.CoreV1Api) -> str:
    return (core.read_node(NODE).metadata.labels or {}).get(nl.MIG_CONFIG_STATE_LABEL, "")


LAB = MigLab()
