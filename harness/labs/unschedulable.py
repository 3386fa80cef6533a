"""lab-unschedulable: five GPU pods that stay Pending, each for its own reason.

    big-trainer  asks 16 GPUs; the largest A100 node has 8            (filter)
    h100-job     its only fitting node carries a taint it does not tolerate (filter)
    v100-job     selects a GPU product no node has                    (filter)
    a100-job     fits only gpu-a100, whose 8 GPUs all went Unhealthy after an Xid 79
                 (the device plugin's health check took them out of allocatable) (node)
    vgpu-job     a HAMi vGPU pod whose nvidia.com/use-gputype matches no GPU type: the
                 HAMi extender's Filter finds CardTypeMismatch on every card (filter)

Each is a one-replica Deployment (the learner edits the Deployment: a pod's resources and
selectors cannot change) in namespace ``lab-unschedulable``, except the HAMi one, whose
namespace ``lab-unschedulable-hami`` is the only lab namespace HAMi's webhook does not
skip. The Xid is injected through the backend (the local backend's NVML shim), so this
lab runs where faults reach the GPUs.
"""

from __future__ import annotations

from kubernetes import client

from harness.labs import (
    POOL_LABEL,
    SPEC,
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

NAME = "unschedulable"
NS = "lab-unschedulable"
HAMI_NS = "lab-unschedulable-hami"
HAMI_APP = "vgpu-job"
WRONG_TYPE = "A100"  # the HAMi node's cards are Tesla T4s
HAMI_TYPE_KEY = "nvidia.com/use-gputype"
PRODUCT = "nvidia.com/gpu.product"
A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"
ABSENT = "Tesla-V100-SXM2-16GB"
XID_NODE, XID_GPUS = "gpu-a100", 8
TAINTED = "gpu-h100"
TAINT = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}
POOL = {POOL_LABEL: NAME}

APPS = {
    "big-trainer": ("too-many", 16, {PRODUCT: A100}),
    "h100-job": ("taint", 2, {PRODUCT: H100}),
    "v100-job": ("selector", 1, {PRODUCT: ABSENT}),
    "a100-job": ("xid", 2, {PRODUCT: A100}),
}
FIXES = {
    "too-many": "ask for what one node has: `kubectl -n lab-unschedulable set resources "
    "deploy/big-trainer --limits=nvidia.com/gpu=4`",
    "taint": "tolerate the taint: add `tolerations: [{key: dedicated, value: inference, "
    "effect: NoSchedule}]` to deploy/h100-job's pod template (or `kubectl taint node "
    "gpu-h100 dedicated-` if the node should take any pod)",
    "selector": f"select a product that exists: `kubectl -n lab-unschedulable patch "
    f'deploy/v100-job -p \'{{"spec":{{"template":{{"spec":{{"nodeSelector":'
    f'{{"{PRODUCT}":"{A100}"}}}}}}}}}}\'`',
    "gputype": f"match a registered GPU type: `kubectl -n {HAMI_NS} patch deploy/{HAMI_APP} "
    '-p \'{"spec":{"template":{"metadata":{"annotations":'
    '{"nvidia.com/use-gputype":"T4"}}}}}\'` (a substring of NVIDIA-Tesla T4)',
    "xid": "clear the fault (`gpulab fake-gpu clear --node gpu-a100`; on real hardware: drain "
    "and reset the GPUs), then restart the node's device plugin, which alone marks GPUs "
    "Healthy again: `kubectl -n gpulab-system delete pod -l "
    "app.kubernetes.io/name=gpulab-device-plugin --field-selector spec.nodeName=gpu-a100`",
}
SYMPTOMS = {
    "too-many": "deploy/big-trainer's pod stays Pending",
    "taint": "deploy/h100-job's pod stays Pending although gpu-h100 has 8 free GPUs",
    "selector": "deploy/v100-job's pod stays Pending",
    "xid": "deploy/a100-job's pod stays Pending although nothing runs on gpu-a100",
    "gputype": f"deploy/{HAMI_APP} (namespace {HAMI_NS}, a HAMi vGPU pod) stays Pending",
}
LINKS = {
    "too-many": "filter",
    "taint": "filter",
    "selector": "filter",
    "xid": "node",
    "gputype": "filter",
}


class UnschedulableLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = "five GPU pods stay Pending; find each one's reason with `gpulab diagnose`"
    hints = (
        "`gpulab diagnose pod lab-unschedulable/<pod>` walks each pod's chain; read the "
        "filter link's per-node lines",
        "`kubectl describe pod` shows kube-scheduler's FailedScheduling: '0/N nodes are "
        "available: ...' counts nodes per reason, it does not name them",
        "`kubectl get nodes -L nvidia.com/gpu.product` lists the products; "
        "`kubectl describe node gpu-h100 | grep Taints` shows its taint",
        "compare a node's capacity and allocatable for nvidia.com/gpu: a gap means devices "
        "the device plugin reports Unhealthy (`kubectl get events -A "
        "--field-selector involvedObject.kind=Node`)",
        "a HAMi pod's Filter table: `gpulab explain pod NAME -n lab-unschedulable-hami "
        "--kubeconfig <labs kubeconfig>`; `kubectl get node gpu-hami -o "
        "jsonpath='{.metadata.annotations}'` shows the registered GPU types "
        "(hami.io/node-nvidia-register)",
    )

    def start(self, backend: object, progress: Progress) -> None:
        api = backend.api()  # type: ignore[attr-defined]
        self.stop(backend, progress)
        Namespace(NS).create(api, NAME)
        core = client.CoreV1Api(api)
        node = core.read_node(TAINTED)
        taints = [t for t in node.spec.taints or [] if t.key != TAINT["key"]]
        core.patch_node(TAINTED, {"spec": {"taints": [*map(_taint_dict, taints), TAINT]}})
        for gpu in range(XID_GPUS):
            backend.inject_fault(XID_NODE, gpu, 79)  # type: ignore[attr-defined]
        _wait_allocatable(core, XID_NODE, 0)
        for app, (_case, gpus, selector) in APPS.items():
            create(api, deployment(app, NS, gpus, node_selector={**POOL, **selector}))
        Namespace(HAMI_NS, hami=True).create(api, NAME)
        create(api, hami_deployment(WRONG_TYPE))
        for app in APPS:
            wait_pending_reason(api, NS, app)
        wait_pending_reason(api, HAMI_NS, HAMI_APP)
        progress(f"lab {NAME}: 5 Deployments in namespaces {NS}, {HAMI_NS}; each pod stays Pending")

    def cases(self, api: client.ApiClient) -> list[Case]:
        out = []
        for app, (case, _gpus, _sel) in APPS.items():
            pod = newest_pod(api, NS, app)
            ref = f"{NS}/{pod.metadata.name}" if pod else f"{NS}/{app}"
            out.append(Case(case, SYMPTOMS[case], ("pod", ref), LINKS[case], FIXES[case]))
        pod = newest_pod(api, HAMI_NS, HAMI_APP)
        ref = f"{HAMI_NS}/{pod.metadata.name if pod else HAMI_APP}"
        out.append(Case("gputype", SYMPTOMS["gputype"], ("pod", ref), "filter", FIXES["gputype"]))
        return out

    def check(self, api: client.ApiClient) -> list[CaseState]:
        out = []
        for app, (case, _gpus, _sel) in APPS.items():
            pod = newest_pod(api, NS, app)
            ok = running(pod)
            where = f"Running on {pod.spec.node_name}" if ok and pod else "not Running"
            out.append(CaseState(case, ok, f"deploy/{app}: {where}"))
        pod = newest_pod(api, HAMI_NS, HAMI_APP)
        ok = running(pod)
        where = f"Running on {pod.spec.node_name}" if ok and pod else "not Running"
        out.append(CaseState("gputype", ok, f"deploy/{HAMI_APP}: {where}"))
        return out

    def stop(self, backend: object, progress: Progress) -> None:
        api = backend.api()  # type: ignore[attr-defined]
        Namespace(NS).delete(api)
        Namespace(HAMI_NS).delete(api)
        core = client.CoreV1Api(api)
        node = core.read_node(TAINTED)
        keep = [_taint_dict(t) for t in node.spec.taints or [] if t.key != TAINT["key"]]
        core.patch_node(TAINTED, {"spec": {"taints": keep}})
        backend.clear_faults(XID_NODE)  # type: ignore[attr-defined]
        if _allocatable(core, XID_NODE) < XID_GPUS:
            backend.restart("gpulab-device-plugin", XID_NODE)  # type: ignore[attr-defined]
            _wait_allocatable(core, XID_NODE, XID_GPUS)


def hami_deployment(gpu_type: str) -> dict:
    """A vGPU pod (1 GPU share, 2000 MiB) of one GPU type, HAMi's nvidia.com/use-gputype."""
    return deployment(
        HAMI_APP,
        HAMI_NS,
        1,
        node_selector={POOL_LABEL: HAMI_NS.removeprefix("lab-")},
        annotations={HAMI_TYPE_KEY: gpu_type},
        extra={"nvidia.com/gpumem": "2000"},
    )


def _taint_dict(t: client.V1Taint) -> dict[str, str]:
    return {k: v for k, v in {"key": t.key, "value": t.value, "effect": t.effect}.items() if v}


def _allocatable(core: client.CoreV1Api, node: str) -> int:
    return int((core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu", "0"))


def _wait_allocatable(core: client.CoreV1Api, node: str, want: int, timeout: float = 60) -> None:
    from gpulab.wait import wait_for

    wait_for(
        lambda: _allocatable(core, node) == want,
        timeout,
        f"{node} to advertise {want} allocatable GPUs",
        0.5,
    )


LAB = UnschedulableLab()
