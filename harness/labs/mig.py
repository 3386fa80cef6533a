"""lab-mig: a MIG layout that is not applied, and a pod asking for a MIG profile the node
does not offer under its MIG strategy. On its own cluster (``harness/clusters/
labs-mig.yaml``) where the GPU Operator (gpu-operator v26.7.0, mig-parted v0.15.0,
docs/gpu-operator.md) deploys the device plugin, GFD and the MIG manager.

The team's inference pods ask for ``nvidia.com/mig-1g.10gb`` (written for the mixed MIG
strategy). The operator was installed with the Helm chart's default ``mig.strategy:
single``, and the node was labelled ``nvidia.com/mig.config=all-1g-10gb``: no such config
in the one the MIG manager built from the node's GPUs (ConfigMap ``gpu-mig-mig-config``;
``default-mig-parted-config`` is only its fallback, for GPUs NVML lists no MIG profile
of), so the MIG manager sets ``mig.config.state=failed`` and the GPUs stay whole. Two
causes in turn on ``gpu-mig``:

    config     the node's mig.config names no config: relabel it ``all-1g.10gb`` (4 x
               1g.10gb, the most an A100-40GB holds); the MIG manager pauses the GPU
               clients, applies the layout and restarts them (state pending -> success)
    strategy   under ``single`` the device plugin advertises the 32 MIG devices as
               ``nvidia.com/gpu`` (``gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.10gb``), never
               ``nvidia.com/mig-1g.10gb``: set the ClusterPolicy's ``spec.mig.strategy`` to
               ``mixed`` (the operator re-renders the device plugin and GFD with it), or
               make the pod ask for ``nvidia.com/gpu`` on that product

On ``gpu-mig-b`` the device plugin is not the operator's (``nvidia.com/gpu.deploy.
device-plugin=false``; the device-plugin chapter's DaemonSet with its own config
``mig-mixed`` runs there instead), and the node was repartitioned to ``all-1g.10gb``:

    not-paused the MIG manager pauses the GPU clients the operator deploys and any
               DaemonSet whose pods select ``nvidia.com/gpu.deploy.client`` (a label the
               operator puts on GPU nodes); the standalone plugin does neither, so it kept
               the 8 whole GPUs it listed at its start (NVML is read once) and
               ``deploy/batch``, asking for ``nvidia.com/mig-1g.10gb``, stays Pending:
               restart that plugin pod; for good, give its DaemonSet the nodeSelector
               ``nvidia.com/gpu.deploy.client: "true"`` so the MIG manager pauses it
               around every change (or let the operator deploy the plugin)

Not a fix: deleting the pods (their Deployments make the same ones).
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import migparted
from gpulab.gpuoperator import nodelabels as nl
from gpulab.gpuoperator.migmanager import CLIENT_LABEL, node_configmap_name
from gpulab.wait import WaitTimeout, wait_for
from harness.apply import MANIFESTS, load_documents
from harness.backends import SYSTEM_NAMESPACE
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
NODE_B, APP_B = "gpu-mig-b", "batch"
STANDALONE = "gpulab-device-plugin"  # the device-plugin chapter's DaemonSet (gpulab-system)
PLUGIN_DEPLOY_LABEL = nl.DEPLOY_PREFIX + "device-plugin"
PROFILE = "1g.10gb"
RESOURCE = f"nvidia.com/mig-{PROFILE}"
CONFIG = "all-1g.10gb"
TYPO = "all-1g-10gb"  # the mistake: a dash for the dot
PLUGIN_SETTLE = 20  # seconds a restarted standalone plugin gets to register its GPUs
OPERATOR_NS = "gpu-operator"
POLICY_FILE = MANIFESTS / "gpu-operator/samples/clusterpolicy.yaml"
# the operator walks its states one reconcile at a time: on a 2-core machine running kind
# clusters beside it (make test) that took over 180 s once
READY_TIMEOUT = 300.0
NODE_CONFIGMAP = node_configmap_name(NODE)  # what the MIG manager built from gpu-mig's GPUs
FIX_CONFIG = (
    f"`kubectl label node {NODE} {nl.MIG_CONFIG_LABEL}={CONFIG} --overwrite` (a config "
    f"of ConfigMap {OPERATOR_NS}/{NODE_CONFIGMAP}, which the MIG manager built from the "
    "node's GPUs)"
)
FIX_STRATEGY = (
    "`kubectl patch clusterpolicy cluster-policy --type merge -p "
    '\'{"spec":{"mig":{"strategy":"mixed"}}}\'` (or the pod asks for nvidia.com/gpu with '
    "nodeSelector nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.10gb)"
)

CLIENT_SELECTOR = {"spec": {"template": {"spec": {"nodeSelector": {CLIENT_LABEL: "true"}}}}}
FIX_NOT_PAUSED = (
    f"`kubectl -n {SYSTEM_NAMESPACE} delete pod -l app.kubernetes.io/name={STANDALONE} "
    f"--field-selector spec.nodeName={NODE_B}` (it lists the MIG devices at its start); for "
    f"good, `kubectl -n {SYSTEM_NAMESPACE} patch daemonset {STANDALONE} --type merge -p "
    f"'{json.dumps(CLIENT_SELECTOR)}'`: the MIG manager pauses a DaemonSet whose pods select "
    f"{CLIENT_LABEL} around every change (or let the operator deploy the plugin: `kubectl "
    f"label node {NODE_B} {PLUGIN_DEPLOY_LABEL}=true --overwrite`)"
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


def standalone_plugin() -> list[dict[str, Any]]:
    """The device-plugin chapter's manifests (manifests/device-plugin/), its DaemonSet
    restricted to GPU nodes where the operator does not deploy its own plugin."""
    docs = load_documents([MANIFESTS / "device-plugin"])
    for doc in docs:
        if doc["kind"] == "DaemonSet":
            doc["spec"]["template"]["spec"]["nodeSelector"] = {
                nl.COMMON_GPU_LABEL: "true",
                PLUGIN_DEPLOY_LABEL: "false",
            }
    return docs


class MigLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = f"two teams' pods ask for {RESOURCE}; neither A100 node offers it"
    hints = (
        f"`gpulab diagnose node {NODE}`: the mig link reads the node's "
        f"{nl.MIG_CONFIG_LABEL} and {nl.MIG_CONFIG_STATE_LABEL} labels and the MIG manager's "
        "Event on the node",
        f"`kubectl -n {OPERATOR_NS} get configmap {NODE_CONFIGMAP} -o "
        "jsonpath='{.data.config\\.yaml}'`: the configs the MIG manager built from the "
        f"node's GPUs (it reads {cp.MIG_PARTED_DEFAULT_CONFIGMAP} only when NVML lists no "
        "MIG profile) - which one did the label mean?",
        "once the layout is applied: `kubectl get node gpu-mig -o jsonpath="
        "'{.status.allocatable}'` and its nvidia.com/mig.strategy and gpu.product labels: "
        "under which name does the device plugin advertise the MIG devices?",
        "`kubectl get clusterpolicy cluster-policy -o jsonpath='{.spec.mig}'`: the operator "
        "renders MIG_STRATEGY into the device plugin and GFD from it",
        f"{NODE_B}: `kubectl get pods -A -o wide --field-selector spec.nodeName={NODE_B}`: "
        "which device plugin runs there, who deployed it, and when did it start compared "
        f"with the node's {nl.MIG_CONFIG_STATE_LABEL}=success (`kubectl get events "
        "--field-selector reason=setState`)?",
        "the MIG manager pauses the operator's GPU clients and waits for every DaemonSet "
        f"pod whose nodeSelector has {CLIENT_LABEL} (`kubectl get node {NODE_B} -L "
        f"{CLIENT_LABEL}`): does the standalone plugin's DaemonSet have it?",
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
        _standalone_fresh(api, progress)
        progress("waiting for the operator's operands and both nodes' 8 whole GPUs")

        seen: dict[str, object] = {}
        restarted = [time.monotonic()]

        def whole_gpus() -> bool:
            state = custom.get_cluster_custom_object(
                cp.GROUP, cp.VERSION, "clusterpolicies", "cluster-policy"
            ).get("status", {})
            nodes = [core.read_node(n) for n in (NODE, NODE_B)]
            seen["ClusterPolicy state"] = state.get("state")
            seen.update({f"{n.metadata.name} whole GPUs": _whole(n) for n in nodes})
            seen["mig.strategy"] = (nodes[0].metadata.labels or {}).get("nvidia.com/mig.strategy")
            if (
                state.get("state") == cp.READY
                and not _whole(nodes[1])
                and _state(core, NODE_B) == "success"
                and time.monotonic() - restarted[0] > PLUGIN_SETTLE
            ):
                # the standalone plugin reads NVML once, at its start: if it started before
                # the driver put NODE_B's GPUs back whole (a cluster brought up again keeps
                # the last run's MIG layout until then), it lists MIG devices: start it again
                _restart_standalone(api)
                restarted[0] = time.monotonic()
            return (
                state.get("state") == cp.READY
                and all(_whole(n) for n in nodes)
                and seen["mig.strategy"] == "single"
            )

        try:
            wait_for(whole_gpus, READY_TIMEOUT, "ClusterPolicy ready, 8 GPUs on each node", 1)
        except WaitTimeout as exc:  # say which part was missing, not only that time ran out
            raise WaitTimeout(f"{exc}; last seen: {seen}") from exc
        Namespace(NS).create(api, NAME)
        _label(core, NODE, TYPO)
        wait_for(
            lambda: _state(core, NODE) == "failed", 60, f"the MIG manager to refuse {TYPO}", 0.5
        )
        _label(core, NODE_B, CONFIG)
        wait_for(lambda: _state(core, NODE_B) == "success", 120, f"{CONFIG} on {NODE_B}", 0.5)
        for app, pool in ((APP, NAME), (APP_B, "mig-b")):
            create(api, deployment(app, NS, 1, resource=RESOURCE, node_selector={POOL_LABEL: pool}))
        for app in (APP, APP_B):
            wait_pending_reason(api, NS, app)
        # the symptoms only: the label's value and which plugin serves NODE_B are for the
        # attendees to find (cases() says what they see)
        progress(
            f"lab {NAME}: {NODE} and {NODE_B} were given a {nl.MIG_CONFIG_LABEL}; "
            f"deploy/{APP}, deploy/{APP_B} in {NS}"
        )

    def cases(self, api: client.ApiClient) -> list[Case]:
        refs = {}
        for app in (APP, APP_B):
            pod = newest_pod(api, NS, app)
            refs[app] = f"{NS}/{pod.metadata.name}" if pod else f"{NS}/{app}"
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
                ("pod", refs[APP]),
                "node",
                FIX_STRATEGY,
            ),
            Case(
                "not-paused",
                f"deploy/{APP_B}'s pod asks for {RESOURCE} and stays Pending, although "
                f"{NODE_B} was repartitioned to {CONFIG} (state success)",
                ("pod", refs[APP_B]),
                "node",
                FIX_NOT_PAUSED,
            ),
        ]

    def check(self, api: client.ApiClient) -> list[CaseState]:
        core = client.CoreV1Api(api)
        lab = core.read_node(NODE).metadata.labels or {}
        wanted, state = lab.get(nl.MIG_CONFIG_LABEL, "-"), lab.get(nl.MIG_CONFIG_STATE_LABEL, "-")
        try:
            cm = core.read_namespaced_config_map(NODE_CONFIGMAP, OPERATOR_NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
            cm = None
        config_ok = wanted in config_names(cm) and wanted != nl.MIG_CONFIG_DISABLED
        out = [
            CaseState(
                "config",
                config_ok and state == "success",
                f"{nl.MIG_CONFIG_LABEL}={wanted}, state {state}",
            )
        ]
        for case, app in (("strategy", APP), ("not-paused", APP_B)):
            pod = newest_pod(api, NS, app)
            where = f"Running on {pod.spec.node_name}" if pod and running(pod) else "Pending"
            out.append(CaseState(case, running(pod), f"{app}: {where}"))
        return out

    def stop(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        Namespace(NS).delete(api)
        core = client.CoreV1Api(api)
        changed = []
        for node in (NODE, NODE_B):
            if (core.read_node(node).metadata.labels or {}).get(nl.MIG_CONFIG_LABEL) not in (
                None,
                nl.MIG_CONFIG_DISABLED,
            ):
                _label(core, node, nl.MIG_CONFIG_DISABLED)
                changed.append(node)
        wait_for(
            lambda: all(_state(core, n) == "success" for n in changed),
            120,
            "the MIG manager to disable MIG",
            0.5,
        )


def _whole(node: client.V1Node) -> bool:
    return (node.status.allocatable or {}).get("nvidia.com/gpu") == "8" and (
        node.metadata.labels or {}
    ).get(nl.MIG_CONFIG_STATE_LABEL) == "success"


def _standalone_fresh(api: client.ApiClient, progress: Progress) -> None:
    """The standalone device plugin on NODE_B, as the device-plugin chapter deploys it
    (without the gpu.deploy.client selector a learner may have given it), started now (it
    reads NVML once: at the layout the node has now, whole GPUs after stop)."""
    apps = client.AppsV1Api(api)
    try:
        ds = apps.read_namespaced_daemon_set(STANDALONE, SYSTEM_NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
        progress(f"prepare {NODE_B}'s device plugin")
        for doc in standalone_plugin():
            try:
                create(api, doc)
            except utils.FailToCreateError as err:
                if any(e.status != 409 for e in err.api_exceptions):
                    raise
        return
    if CLIENT_LABEL in (ds.spec.template.spec.node_selector or {}):
        progress(f"reset {NODE_B}'s device plugin")
        unselect = {"spec": {"template": {"spec": {"nodeSelector": {CLIENT_LABEL: None}}}}}
        apps.patch_namespaced_daemon_set(STANDALONE, SYSTEM_NAMESPACE, unselect)
    _restart_standalone(api)


def _restart_standalone(api: client.ApiClient) -> None:
    """Delete the standalone plugin's pod on NODE_B: its DaemonSet starts it again."""
    client.CoreV1Api(api).delete_collection_namespaced_pod(
        SYSTEM_NAMESPACE,
        label_selector=f"app.kubernetes.io/name={STANDALONE}",
        field_selector=f"spec.nodeName={NODE_B}",
    )


def _label(core: client.CoreV1Api, node: str, value: str) -> None:
    """Set the node's mig.config and drop the state of the previous one, so waiting for a
    state waits for the MIG manager's answer to this value."""
    labels = {nl.MIG_CONFIG_LABEL: value, nl.MIG_CONFIG_STATE_LABEL: None}
    core.patch_node(node, {"metadata": {"labels": labels}})


def _state(core: client.CoreV1Api, node: str) -> str:
    return (core.read_node(node).metadata.labels or {}).get(nl.MIG_CONFIG_STATE_LABEL, "")


LAB = MigLab()
