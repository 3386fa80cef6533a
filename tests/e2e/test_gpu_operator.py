"""The GPU Operator chapter end to end, on its own cluster (harness/clusters/gpu-operator-e2e.yaml):
the operator deployed as a Deployment, a ClusterPolicy, the operands running as pods
(the local backend's pod runner), the MIG manager changing MIG through the NVML shim.

The tests run in order on one cluster: the ClusterPolicy is created once (fixture
``policy``); the MIG tests build on each other's layout; disabling the device plugin
and the demo (which brings the cluster down) come last.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from conftest import Cluster, run_demo_from_stopped, running_cluster
from golden import assert_shape
from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import gpu_operator as demo
from gpulab import trace
from gpulab.fakegpu import paths, profiles
from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import migparted, render, states
from gpulab.gpuoperator import nodelabels as nl
from gpulab.informer import NODES, Handlers, Informer, ListWatch
from gpulab.wait import WaitTimeout, wait_for
from harness.apply import MANIFESTS
from harness.podrunner import volumes

SPEC = "gpu-operator-e2e"
NS = "gpu-operator"
A100, T4 = "gpu-a100", "gpu-t4"
PLURAL = "clusterpolicies"
MIG_STATE = nl.MIG_CONFIG_STATE_LABEL
DP_LABEL = nl.DEPLOY_PREFIX + "device-plugin"
CUSTOM_MIG = """version: v1
mig-configs:
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 4}
  all-3g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
  too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 3}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(SPEC) as c:
        yield c


def _custom(c: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(c.api)


def _core(c: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(c.api)


def _policy(c: Cluster, name: str) -> dict[str, Any]:
    return _custom(c).get_cluster_custom_object(cp.GROUP, cp.VERSION, PLURAL, name)


def _state(c: Cluster, name: str) -> str | None:
    return (_policy(c, name).get("status") or {}).get("state")


def _labels(c: Cluster, node: str) -> dict[str, str]:
    return dict(_core(c).read_node(node).metadata.labels or {})


def _allocatable(c: Cluster, node: str) -> dict[str, str]:
    return dict(_core(c).read_node(node).status.allocatable or {})


def _create(c: Cluster, body: dict[str, Any]) -> None:
    """Create as `kubectl create` does: the API server validates fields strictly."""
    _custom(c).api_client.call_api(
        f"/apis/{cp.GROUP}/{cp.VERSION}/{PLURAL}",
        "POST",
        query_params=[("fieldValidation", "Strict")],
        body=body,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _preload_content=False,
    )


def _node_events(
    c: Cluster, component: str, node: str, since: dt.datetime
) -> list[trace.TraceEvent]:
    events = _core(c).list_namespaced_event("default").items
    out = [trace.to_trace_event(c.api.sanitize_for_serialization(e)) for e in events]
    return sorted(
        (
            e
            for e in out
            if e.component == component and e.regarding == f"Node {node}" and e.time >= since
        ),
        key=lambda e: e.time,
    )


class LabelHistory:
    """Every value the watched labels of a node take (the watch sees each transition)."""

    def __init__(self, c: Cluster, node: str, keys: tuple[str, ...]) -> None:
        self.values: dict[str, list[str]] = {k: [] for k in keys}
        self.lock = threading.Lock()

        def record(obj: dict) -> None:
            labels = obj["metadata"].get("labels") or {}
            with self.lock:
                for k, seen in self.values.items():
                    if not seen or seen[-1] != labels.get(k, ""):
                        seen.append(labels.get(k, ""))

        self.informer = Informer(
            ListWatch(c.api, NODES, field_selector=f"metadata.name={node}"),
            Handlers(on_add=record, on_update=lambda _o, n: record(n)),
        ).start()
        assert self.informer.wait_for_sync(30)

    def __enter__(self) -> LabelHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.informer.stop()

    def of(self, key: str) -> list[str]:
        with self.lock:
            return list(self.values[key])


@pytest.fixture(scope="module")
def policy(cluster: Cluster) -> str:
    """The lab's ClusterPolicy (samples/clusterpolicy.yaml), ready, the GPUs advertised."""
    body = yaml.safe_load((MANIFESTS / "gpu-operator/samples/clusterpolicy.yaml").read_text())
    _create(cluster, body)
    name = body["metadata"]["name"]
    wait_for(
        lambda: (
            _state(cluster, name) == cp.READY
            and _allocatable(cluster, A100).get("nvidia.com/gpu") == "8"
            and _allocatable(cluster, T4).get("nvidia.com/gpu") == "1"
        ),
        180,
        f"ClusterPolicy {name} ready and the GPUs advertised",
        0.5,
    )
    return name


# --------------------------------------------------------------------------- the CRD


@pytest.mark.parametrize(
    ("spec_patch", "error"),
    [
        ({"devicePlugin": {"enabeld": True}}, 'unknown field "spec.devicePlugin.enabeld"'),
        ({"devicePlugin": {"enabled": "yes"}},
         "spec.devicePlugin.enabled in body must be of type boolean"),
        ({"mig": {"strategy": "double"}}, 'spec.mig.strategy: Unsupported value: "double"'),
        ({"daemonsets": {"updateStrategy": "Sometimes"}},
         "spec.daemonsets.updateStrategy: Unsupported value"),
    ],
)  # fmt: skip
def test_the_api_server_rejects_unknown_fields_and_wrong_values(
    cluster: Cluster, spec_patch: dict, error: str
) -> None:
    required = {k: {} for k in ("operator", "daemonsets", "driver", "toolkit", "devicePlugin",
                                "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd")}  # fmt: skip
    body = {"apiVersion": "nvidia.com/v1", "kind": cp.KIND, "metadata": {"name": "bad"},
            "spec": {**required, **spec_patch}}  # fmt: skip
    with pytest.raises(ApiException) as exc:
        _create(cluster, body)
    assert exc.value.status in (400, 422)
    assert error in json.loads(exc.value.body)["message"]


def test_the_crd_is_cluster_scoped_with_status_and_upstreams_columns(cluster: Cluster) -> None:
    crd = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(
        "clusterpolicies.nvidia.com"
    )
    (version,) = crd.spec.versions
    assert crd.spec.scope == "Cluster" and version.name == "v1"
    assert version.subresources.status == {}
    assert [(c.name, c.json_path) for c in version.additional_printer_columns] == [
        ("Status", ".status.state"),
        ("Age", ".metadata.creationTimestamp"),
    ]


# --------------------------------------------------------------------------- Reconcile


def test_the_clusterpolicy_is_ready_with_upstreams_conditions(
    cluster: Cluster, policy: str
) -> None:
    status = _policy(cluster, policy)["status"]
    assert status["namespace"] == NS
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("True", "Reconciled")
    assert (conditions["Error"]["status"], conditions["Error"]["reason"]) == ("False", "Ready")
    daemonsets = client.AppsV1Api(cluster.api).list_namespaced_daemon_set(NS).items
    assert {d.metadata.name for d in daemonsets} == {
        "nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset",
        "nvidia-operator-validator", "nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter",
        "gpu-feature-discovery", "nvidia-mig-manager",
    }  # fmt: skip
    for ds in daemonsets:
        (owner,) = ds.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == (cp.KIND, policy, True)
        assert ds.status.number_ready == ds.status.desired_number_scheduled >= 1
        assert ds.metadata.annotations[render.HASH_ANNOTATION]
    # the first pass stepped through every state, in upstream's order: the first Event of
    # each state (eventTime: when the series began) in time order
    events = sorted(
        (e for e in _core(cluster).list_namespaced_event("default").items
         if e.reporting_component == "gpulab.io/gpu-operator" and e.reason == "step"
         and e.involved_object.name == policy),
        key=lambda e: e.event_time,
    )  # fmt: skip
    first_seen: list[str] = []
    for e in events:
        state = e.message.split(":")[0]
        if state not in first_seen:
            first_seen.append(state)
    assert first_seen == list(states.STATES)
    # pre-requisites: the RuntimeClasses, the CDI ones too (CDI is on by default)
    classes = client.NodeV1Api(cluster.api).list_runtime_class().items
    assert {c.metadata.name: c.handler for c in classes} == {
        "nvidia": "nvidia", "nvidia-cdi": "nvidia-cdi", "nvidia-legacy": "nvidia-legacy",
    }  # fmt: skip


def test_gpu_nodes_are_labelled_for_their_operands(cluster: Cluster, policy: str) -> None:
    a100, t4 = _labels(cluster, A100), _labels(cluster, T4)
    for labels in (a100, t4):
        assert labels[nl.COMMON_GPU_LABEL] == "true"
        for operand in ("driver", "container-toolkit", "operator-validator", "device-plugin",
                        "dcgm-exporter", "gpu-feature-discovery"):  # fmt: skip
            assert labels[nl.DEPLOY_PREFIX + operand] == "true"
    # GFD found MIG-capable GPUs on the A100 only: the MIG manager and its default config
    assert a100[nl.MIG_CAPABLE_LABEL] == "true" and t4[nl.MIG_CAPABLE_LABEL] == "false"
    assert a100[nl.MIG_MANAGER_LABEL] == "true" and nl.MIG_MANAGER_LABEL not in t4
    assert a100[nl.MIG_CONFIG_LABEL] == "all-disabled"
    # the MIG manager reports its first pass after its pod is Ready, which is all the
    # ClusterPolicy waits for (upstream's state-mig-manager), so this one is awaited
    wait_for(lambda: _labels(cluster, A100).get(MIG_STATE) == "success", 60, "mig.config.state")
    assert not any(k.startswith(nl.DEPLOY_PREFIX) for k in _labels(cluster, "cpu-only"))


def test_a_removed_gpu_present_label_is_put_back(cluster: Cluster, policy: str) -> None:
    _core(cluster).patch_node(T4, {"metadata": {"labels": {nl.COMMON_GPU_LABEL: None}}})
    wait_for(lambda: _labels(cluster, T4).get(nl.COMMON_GPU_LABEL) == "true", 30,
             "the operator to label gpu-t4 again (NFD still finds its GPU)")  # fmt: skip


@pytest.mark.local_backend
def test_operands_started_after_the_validators_markers(cluster: Cluster, policy: str) -> None:
    """The order on a node comes from the init containers waiting for the markers: the
    device plugin's container started after toolkit-ready was written."""
    for node in (A100, T4):
        marks = volumes.host_path(cluster.local.dir, node, "/run/nvidia/validations")
        for name in ("driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"):
            assert (marks / name).is_file(), f"{node}: no {name}"
        assert "IS_HOST_DRIVER=false" in (marks / "driver-ready").read_text()
        toolkit_ready = dt.datetime.fromtimestamp(
            int((marks / "toolkit-ready").stat().st_mtime), dt.UTC
        )
        (pod,) = (
            _core(cluster)
            .list_namespaced_pod(
                NS,
                label_selector="app=nvidia-device-plugin-daemonset",
                field_selector=f"spec.nodeName={node}",
            )
            .items
        )
        started = pod.status.container_statuses[0].state.running.started_at
        assert started >= toolkit_ready


def test_a_second_clusterpolicy_is_ignored(cluster: Cluster, policy: str) -> None:
    """Upstream's bundle sample applies unchanged, and, being newer, is ignored."""
    sample = yaml.safe_load(
        (MANIFESTS / "gpu-operator/samples/clusterpolicy-bundle-sample.yaml").read_text()
    )
    name = sample["metadata"]["name"]
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    _create(cluster, sample)
    try:
        wait_for(lambda: _state(cluster, name) == cp.IGNORED, 30, f"{name} ignored")

        def event() -> trace.TraceEvent | None:
            for e in _core(cluster).list_namespaced_event("default").items:
                ev = trace.to_trace_event(cluster.api.sanitize_for_serialization(e))
                if (
                    ev.regarding == f"{cp.KIND} {name}"
                    and ev.step == "Reconcile"
                    and ev.time >= since
                ):
                    return ev
            return None

        ev = wait_for(event, 30, "the Reconcile Event on the ignored ClusterPolicy")
        assert ev.warning and f"ClusterPolicy {policy} is the active one" in ev.note
        assert _state(cluster, policy) == cp.READY
        # its settings are not applied: it enables the standalone DCGM, the active one not
        with pytest.raises(WaitTimeout):
            wait_for(
                lambda: client.AppsV1Api(cluster.api).list_namespaced_daemon_set(
                    NS, field_selector="metadata.name=nvidia-dcgm").items,
                5,
                "an nvidia-dcgm DaemonSet that must not come",
            )  # fmt: skip
    finally:
        _custom(cluster).delete_cluster_custom_object(cp.GROUP, cp.VERSION, PLURAL, name)


def test_a_users_false_keeps_an_operand_off_the_node(cluster: Cluster, policy: str) -> None:
    key = nl.DEPLOY_PREFIX + "dcgm-exporter"

    def exporter_on_t4() -> list:
        return (
            _core(cluster)
            .list_namespaced_pod(
                NS, label_selector="app=nvidia-dcgm-exporter", field_selector=f"spec.nodeName={T4}"
            )
            .items
        )

    _core(cluster).patch_node(T4, {"metadata": {"labels": {key: "false"}}})
    try:
        wait_for(lambda: not exporter_on_t4(), 60, "dcgm-exporter to leave gpu-t4")
        # a node event the labelling controller reacts to: it must keep the user's false
        _core(cluster).patch_node(T4, {"metadata": {"labels": {nl.COMMON_GPU_LABEL: None}}})
        wait_for(lambda: _labels(cluster, T4).get(nl.COMMON_GPU_LABEL) == "true", 30, "relabel")
        assert _labels(cluster, T4)[key] == "false"
    finally:
        # removing a deploy label triggers no relabelling (nor does it upstream): the next
        # node change the labelling controller watches does
        patch = {key: None, nl.COMMON_GPU_LABEL: None}
        _core(cluster).patch_node(T4, {"metadata": {"labels": patch}})
    wait_for(lambda: _labels(cluster, T4).get(key) == "true", 30, "the operator to set it again")
    wait_for(exporter_on_t4, 60, "dcgm-exporter back on gpu-t4")


# --------------------------------------------------------------------------- dcgm-exporter


def _metrics(cluster: Cluster, node: str) -> str:
    (pod,) = (
        _core(cluster)
        .list_namespaced_pod(
            NS, label_selector="app=nvidia-dcgm-exporter", field_selector=f"spec.nodeName={node}"
        )
        .items
    )
    wait_for(
        lambda: _core(cluster).read_namespaced_pod(pod.metadata.name, NS).status.pod_ip,
        30,
        "pod IP",
    )
    ip = _core(cluster).read_namespaced_pod(pod.metadata.name, NS).status.pod_ip
    return httpx.get(f"http://{ip}:9400/metrics", timeout=5).text


def _series(text: str, field: str) -> dict[str, str]:
    """{UUID: value} of one field's GPU-level series."""
    out = {}
    for line in text.splitlines():
        if line.startswith(field + "{") and "GPU_I_ID" not in line:
            labels, value = line[len(field) + 1 :].rsplit("} ", 1)
            out[dict(kv.split("=", 1) for kv in labels.split(","))["UUID"].strip('"')] = value
    return out


@pytest.mark.local_backend
def test_dcgm_exporter_serves_dcgm_fields_per_gpu(cluster: Cluster, policy: str) -> None:
    profile = profiles.load("a100-sxm4-40gb-x8")
    text = _metrics(cluster, A100)
    uuids = {profiles.gpu_uuid(A100, g.index) for g in profile.gpus}
    for field in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_FREE",
                  "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"):  # fmt: skip
        assert set(_series(text, field)) == uuids, field
        assert f"# TYPE {field} gauge" in text
    assert set(_series(text, "DCGM_FI_DEV_FB_FREE").values()) == {"40960"}
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    assert 'modelName="NVIDIA A100-SXM4-40GB"' in line and f'Hostname="{A100}"' in line
    assert 'DCGM_FI_DRIVER_VERSION="550.54.15"' in line
    # an Xid reaches the exporter through NVML's event API (31: an application error the
    # device plugin does not count as a GPU failure)
    cluster.local.inject_fault(A100, 3, 31)
    uuid = profiles.gpu_uuid(A100, 3)
    wait_for(
        lambda: _series(_metrics(cluster, A100), "DCGM_FI_DEV_XID_ERRORS")[uuid] == "31",
        20,
        "Xid 31",
    )


# --------------------------------------------------------------------------- MIG


def _mig_state_file(cluster: Cluster) -> str:
    root = volumes.host_path(cluster.local.dir, A100, paths.NODE_STATE_DIR) / A100
    path = root / paths.MIG_STATE_NAME
    return path.read_text() if path.exists() else ""


@pytest.mark.local_backend
def test_mig_config_pending_then_success_and_the_node_advertises_mig_devices(
    cluster: Cluster, policy: str
) -> None:
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with LabelHistory(cluster, A100, (MIG_STATE, DP_LABEL)) as history:
        _core(cluster).patch_node(
            A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: "all-1g.10gb"}}}
        )
        wait_for(
            lambda: (
                history.of(MIG_STATE)[-1] == "success"
                and _allocatable(cluster, A100).get("nvidia.com/mig-1g.10gb") == "32"
            ),
            120,
            "all-1g.10gb applied and advertised",
            0.5,
        )
        assert history.of(MIG_STATE)[-2:] == ["pending", "success"]
        assert history.of(DP_LABEL)[-3:] == ["true", "paused-for-mig-change", "true"]
    steps = [e.step for e in _node_events(cluster, "nvidia-mig-manager", A100, since)]
    assert steps[:2] == ["Reconfigure", "validateMigConfig"]
    for step in ("shutdownKubernetesGPUClients", "waitForPodsToBeDeleted", "applyMigModeChange",
                 "applyMigConfig", "restartKubernetesGPUClients"):  # fmt: skip
        assert step in steps
    notes = " ".join(e.note for e in _node_events(cluster, "nvidia-mig-manager", A100, since))
    assert "nvmlDeviceSetMigMode(1)" in notes and "nvmlDeviceCreateGpuInstance(1g.10gb) x4" in notes
    # the layout lives in the shim's state: the device plugin read it when it restarted
    assert "gpu.7.mig_count=4" in _mig_state_file(cluster)
    assert _allocatable(cluster, A100).get("nvidia.com/gpu") == "0"
    # the config in force is the one the MIG manager built from the A100s' MIG profiles
    generated = _core(cluster).read_namespaced_config_map(f"{A100}-mig-config", NS)
    (owner,) = generated.metadata.owner_references
    assert owner.kind == "Pod" and owner.name.startswith("nvidia-mig-manager-")
    assert generated.metadata.labels == {"app.kubernetes.io/component": "nvidia-mig-manager",
                                         "nvidia.com/node-name": A100}  # fmt: skip
    spec = migparted.parse_spec(generated.data["config.yaml"])
    assert spec.mig_configs["all-1g.10gb"][0].mig_devices == {"1g.10gb": 4}
    assert spec.mig_configs["all-balanced"][0].mig_devices == {
        "1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1,
    }  # fmt: skip


@pytest.mark.local_backend
def test_dcgm_exporter_on_the_mig_node_reports_each_mig_device_only(
    cluster: Cluster, policy: str
) -> None:
    """After all-1g.10gb (the test before): 32 MIG devices, 32 rows per field, no
    whole-GPU row (dcgm-exporter's default -d f)."""

    def rows() -> list[str] | None:
        try:
            text = _metrics(cluster, A100)
        except (httpx.HTTPError, ValueError):
            return None  # the exporter is restarting after the MIG change
        found = [x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_FB_FREE{")]
        return found if len(found) == 32 else None

    found = wait_for(rows, 60, "dcgm-exporter on the MIG layout")
    assert all('GPU_I_PROFILE="1g.10gb"' in r and "GPU_I_ID=" in r for r in found)
    assert not _series(_metrics(cluster, A100), "DCGM_FI_DEV_GPU_TEMP")  # no GPU row at all


def _unchanged(cluster: Cluster, before: dict[str, str], history: LabelHistory) -> None:
    after = _labels(cluster, A100)

    def strip(labels: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in labels.items() if not k.startswith(nl.MIG_CONFIG_LABEL)}

    assert strip(after) == strip(before)
    assert "paused-for-mig-change" not in history.of(DP_LABEL)
    assert "pending" not in history.of(MIG_STATE)
    assert _allocatable(cluster, A100).get("nvidia.com/mig-1g.10gb") == "32"


def _failed(cluster: Cluster, since: dt.datetime, reason: str) -> str:
    """Wait for the MIG manager's failed state with ``reason`` (a later failure than an
    earlier test's: a wrong reason times out); returns the Event's note."""

    def failed() -> trace.TraceEvent | None:
        return next(
            (e for e in _node_events(cluster, "nvidia-mig-manager", A100, since)
             if e.step == "setState" and e.warning and reason in e.note),
            None,
        )  # fmt: skip

    ev = wait_for(failed, 90, f"the MIG manager's failed state ({reason})")
    assert _labels(cluster, A100)[MIG_STATE] == "failed"
    assert "\n" not in ev.note
    return ev.note


@pytest.mark.local_backend
def test_an_unknown_mig_config_fails_and_nothing_else_changes(
    cluster: Cluster, policy: str
) -> None:
    before, layout = _labels(cluster, A100), _mig_state_file(cluster)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with LabelHistory(cluster, A100, (MIG_STATE, DP_LABEL)) as history:
        _core(cluster).patch_node(
            A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: "all-bogus"}}}
        )
        note = _failed(cluster, since, "not present")
        assert note.endswith("failed: selected mig-config not present: all-bogus")
        _unchanged(cluster, before, history)
    assert _mig_state_file(cluster) == layout


def _use_mig_configmap(cluster: Cluster, policy: str, name: str | None) -> None:
    """Point the ClusterPolicy at a mig-parted ConfigMap (None: the default one) and wait
    for the MIG manager's new pod."""
    old = {
        p.metadata.uid
        for p in _core(cluster)
        .list_namespaced_pod(NS, label_selector="app=nvidia-mig-manager")
        .items
    }
    _custom(cluster).patch_cluster_custom_object(
        cp.GROUP, cp.VERSION, PLURAL, policy, {"spec": {"migManager": {"config": {"name": name}}}}
    )

    def new_pod_ready() -> bool:
        pods = _core(cluster).list_namespaced_pod(NS, label_selector="app=nvidia-mig-manager").items
        return any(
            p.metadata.uid not in old
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            for p in pods
        )

    wait_for(new_pod_ready, 90, "the MIG manager to restart on the new config")


def _relabel(cluster: Cluster, config: str, until: str) -> None:
    _core(cluster).patch_node(A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: config}}})
    wait_for(lambda: _labels(cluster, A100).get(MIG_STATE) == until, 90, f"{config}: {until}")


@pytest.mark.local_backend
def test_a_layout_the_gpu_cannot_hold_fails_after_the_pause_and_a_broken_configmap_before_it(
    cluster: Cluster, policy: str
) -> None:
    """mig-parted v0.15.0: a layout that does not fit fails in applyMigConfig, after the
    GPU clients were paused; setState resumes them only until a change has succeeded in
    the MIG manager's process - after that a failed change leaves the device plugin
    paused. A ConfigMap that does not parse fails before anything changes."""
    core = _core(cluster)
    broken = "version: v1\nmig-configs: {too-big: [\n"
    for cm, text in (
        ("custom-mig-parted-config", CUSTOM_MIG),
        ("broken-mig-parted-config", broken),
    ):
        core.create_namespaced_config_map(
            NS,
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name=cm), data={"config.yaml": text}),
        )
    layout = _mig_state_file(cluster)
    try:
        _use_mig_configmap(cluster, policy, "custom-mig-parted-config")  # a new process
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        with LabelHistory(cluster, A100, (MIG_STATE, DP_LABEL)) as history:
            core.patch_node(A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: "too-big"}}})
            note = _failed(cluster, since, "too-big")
            assert note.endswith(
                "too-big: GPU 0 (NVIDIA A100-SXM4-40GB) holds at most 2 x 3g.20gb, not 3"
            )
            assert history.of(MIG_STATE)[-2:] == ["pending", "failed"]
            assert history.of(DP_LABEL)[-3:] == ["true", "paused-for-mig-change", "true"]
        assert _mig_state_file(cluster) == layout  # (lab) the old layout restored
        wait_for(lambda: _allocatable(cluster, A100).get("nvidia.com/mig-1g.10gb") == "32", 60,
                 "the device plugin back on all-1g.10gb")  # fmt: skip
        # a change that succeeds sets NoRestartK8sDaemonsetsOnExit ...
        _relabel(cluster, "all-3g.20gb", "success")
        wait_for(lambda: _allocatable(cluster, A100).get("nvidia.com/mig-3g.20gb") == "16", 60,
                 "all-3g.20gb advertised")  # fmt: skip
        # ... so the next failure leaves the clients paused: the device plugin is gone
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        core.patch_node(A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: "too-big"}}})
        _failed(cluster, since, "too-big")
        assert _labels(cluster, A100)[DP_LABEL] == "paused-for-mig-change"
        wait_for(
            lambda: not core.list_namespaced_pod(
                NS, label_selector="app=nvidia-device-plugin-daemonset",
                field_selector=f"spec.nodeName={A100}").items,
            60,
            "the device plugin to stay away from the node",
        )  # fmt: skip
        assert _allocatable(cluster, A100).get("nvidia.com/mig-3g.20gb") == "0"
        # the way out: a config that applies
        _relabel(cluster, "all-1g.10gb", "success")
        assert _labels(cluster, A100)[DP_LABEL] == "true"
        wait_for(lambda: _allocatable(cluster, A100).get("nvidia.com/mig-1g.10gb") == "32", 60,
                 "the device plugin back on all-1g.10gb")  # fmt: skip
        # the new MIG manager pod reads the broken file at the node's current label
        before = _labels(cluster, A100)
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        with LabelHistory(cluster, A100, (MIG_STATE, DP_LABEL)) as history:
            _use_mig_configmap(cluster, policy, "broken-mig-parted-config")
            note = _failed(cluster, since, "unmarshal error")
            assert "unmarshal error: not valid YAML at line 3" in note
            _unchanged(cluster, before, history)
    finally:
        _use_mig_configmap(cluster, policy, None)
        core.patch_node(A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: "all-1g.10gb"}}})
        wait_for(
            lambda: _labels(cluster, A100).get(MIG_STATE) == "success", 60, "all-1g.10gb again"
        )


# --------------------------------------------------------------------------- disabling


def test_disabling_the_device_plugin_deletes_it_and_the_gpus_leave_allocatable(
    cluster: Cluster, policy: str
) -> None:
    apps = client.AppsV1Api(cluster.api)
    _custom(cluster).patch_cluster_custom_object(
        cp.GROUP, cp.VERSION, PLURAL, policy, {"spec": {"devicePlugin": {"enabled": False}}}
    )
    try:
        wait_for(
            lambda: not apps.list_namespaced_daemon_set(
                NS, field_selector="metadata.name=nvidia-device-plugin-daemonset").items,
            60,
            "the device plugin DaemonSet to be deleted",
        )  # fmt: skip
        wait_for(
            lambda: all(v == "0" for n in (A100, T4) for r, v in _allocatable(cluster, n).items()
                        if r.startswith("nvidia.com/")),
            60,
            "the GPUs to leave allocatable",
        )  # fmt: skip
        assert not _core(cluster).list_namespaced_service_account(
            NS, field_selector="metadata.name=nvidia-device-plugin").items  # fmt: skip
        validator = apps.read_namespaced_daemon_set("nvidia-operator-validator", NS)
        inits = [c.name for c in validator.spec.template.spec.init_containers]
        assert "plugin-validation" not in inits
        wait_for(lambda: _state(cluster, policy) == cp.READY, 90, "ready without the plugin")
    finally:
        _custom(cluster).patch_cluster_custom_object(
            cp.GROUP, cp.VERSION, PLURAL, policy, {"spec": {"devicePlugin": {"enabled": True}}}
        )
    wait_for(
        lambda: _allocatable(cluster, T4).get("nvidia.com/gpu") == "1", 90, "gpu-t4's GPU back"
    )


@pytest.mark.local_backend
def test_the_demo_passes_from_a_stopped_cluster(cluster: Cluster) -> None:
    """`gpulab down; make demo-gpu-operator`, on a cluster of the demo's shape (last: it
    replaces this module's cluster); the chapter's steps in their order
    (tests/e2e/golden/gpu-operator.yaml)."""
    assert_shape("gpu-operator", run_demo_from_stopped(SPEC, demo.run))
