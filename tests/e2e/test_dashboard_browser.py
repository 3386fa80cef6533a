"""The dashboard in a real browser (Debian's headless Chromium driven by Playwright) on the
HAMi cluster (harness/clusters/dashboard-e2e.yaml): the page follows the cluster live.

Each test leaves a screenshot in tests/artifacts/ and fails on any console error.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import Cluster, fresh_namespace, running_cluster
from kubernetes import client
from kubernetes.client.rest import ApiException
from playwright.sync_api import BrowserContext, Page

from demos.hami import vgpu_pod
from gpulab.dashboard import headless, server
from gpulab.dashboard.hub import Hub
from gpulab.fakegpu import faults
from gpulab.fakegpu.profiles import gpu_uuid
from gpulab.hami import annotations as ha
from gpulab.hami.commands import FILTER_RESULT, explain_rows
from gpulab.wait import wait_for
from harness.ports import free_port

SPEC = "dashboard-e2e"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
KUEUE_CRDS = Path(__file__).resolve().parents[2] / "manifests" / "kueue" / "crds"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(SPEC) as c:
        yield c


@pytest.fixture(scope="module")
def dashboard(cluster: Cluster) -> Iterator[server.Dashboard]:
    hub = Hub(cluster.api, str(cluster.api.configuration.host)).start()
    page = server.start(hub, free_port())
    yield page
    page.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    with headless.browser() as ctx:  # fails (never skips) without Debian's chromium
        yield ctx


@pytest.fixture
def page(
    browser: BrowserContext, dashboard: server.Dashboard, request: pytest.FixtureRequest
) -> Iterator[Page]:
    """The dashboard, open and synced; a screenshot after the test; no console errors."""
    p = browser.new_page()
    errors: list[str] = []
    p.on("console", lambda m: m.type == "error" and errors.append(m.text))
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(dashboard.url)
    p.wait_for_function("window.gpulab && window.gpulab.snapshots > 0", timeout=15_000)
    p.wait_for_selector("#state.live", timeout=15_000)
    try:
        yield p
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        p.screenshot(path=str(ARTIFACTS / f"dashboard-{request.node.name}.png"), full_page=True)
        p.close()
    assert errors == [], f"console errors: {errors}"


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster.api, "dash") as name:
        yield name


def read_pod(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return api.sanitize_for_serialization(client.CoreV1Api(api).read_namespaced_pod(name, ns))


def placed(api: client.ApiClient, ns: str, name: str) -> tuple[str, str]:
    """(node, GPU UUID) once the extender has written the pod's allocation."""

    def allocation() -> tuple[str, str] | None:
        annos = read_pod(api, ns, name)["metadata"].get("annotations") or {}
        value, node = annos.get(ha.DEVICES_ALLOCATED), annos.get(ha.ASSIGNED_NODE)
        if not value or not node:
            return None
        return node, ha.decode_pod_devices(value)[0][0].uuid

    return wait_for(allocation, 60, f"{ns}/{name}'s allocation", interval=0.05)


def test_vgpu_slices_appear_in_their_gpu_box(cluster: Cluster, ns: str, page: Page) -> None:
    core = client.CoreV1Api(cluster.api)
    for i in range(3):
        name = f"vgpu-{i}"
        core.create_namespaced_pod(ns, vgpu_pod(name, 3000, 30, "binpack"))
        node, uuid = placed(cluster.api, ns, name)
        box = f'.node[data-node="{node}"] .gpu[data-uuid="{uuid}"]'
        # the update latency (API write -> slice on the page) is measured by
        # `make bench-dashboard`; here only where it lands, with room for a loaded machine
        page.wait_for_selector(f'{box} .slice[data-pod="{ns}/{name}"]', timeout=10_000)
        assert page.locator(f'.slice[data-pod="{ns}/{name}"]').count() == 1  # nowhere else
        assert "30%" in page.locator(f'{box} .slice[data-pod="{ns}/{name}"]').inner_text()
    slices = page.locator(f'.slice[data-pod^="{ns}/"]')
    assert slices.count() == 3
    core.delete_namespaced_pod("vgpu-0", ns, grace_period_seconds=0)
    page.wait_for_selector(f'.slice[data-pod="{ns}/vgpu-0"]', state="detached", timeout=5_000)
    assert slices.count() == 2  # the others stay


def test_an_xid_turns_the_gpu_red_until_the_plugin_restarts(cluster: Cluster, page: Page) -> None:
    node, index = "gpu-t4", 2
    sick = f'.node[data-node="{node}"] .gpu[data-uuid="{gpu_uuid(node, index)}"]'
    page.wait_for_selector(f"{sick}:not(.sick)")
    cluster.local.inject_fault(node, index, faults.XID_FALLEN_OFF_BUS)
    try:
        page.wait_for_selector(f"{sick}.sick", timeout=30_000)
        assert "Xid" in page.locator(f"{sick} .health").inner_text()
        assert page.locator(f'.node[data-node="{node}"] .gpu.sick').count() == 1
    finally:
        cluster.local.clear_faults(node)
    # upstream keeps a device unhealthy until the plugin restarts
    cluster.local.restart("hami-device-plugin", node)
    page.wait_for_selector(f"{sick}:not(.sick)", timeout=60_000)


def test_a_pending_pod_shows_its_reason_and_the_filter_table(
    cluster: Cluster, ns: str, page: Page
) -> None:
    client.CoreV1Api(cluster.api).create_namespaced_pod(ns, vgpu_pod("too-big", 50000, 10))
    row = page.locator(f'tr.pending-pod[data-pod="{ns}/too-big"]')
    row.wait_for(timeout=60_000)
    page.wait_for_function(
        f"""document.querySelector('tr.pending-pod[data-pod="{ns}/too-big"]')
            .innerText.includes('CardInsufficientMemory')""",
        timeout=60_000,
    )
    assert "hami-scheduler" in row.inner_text()
    row.click()
    page.wait_for_selector("#explain table.filter")
    shown = [
        [c.strip() for c in r.locator("td").all_inner_texts()]
        for r in page.locator("#explain table.filter tbody tr").all()
    ]
    record = read_pod(cluster.api, ns, "too-big")["metadata"]["annotations"][FILTER_RESULT]
    assert shown == [list(r) for r in explain_rows(json.loads(record))]  # as `gpulab explain`
    assert {r[0] for r in shown} == {"gpu-t4", "gpu-a100"} and all(r[1] == "no" for r in shown)


def test_the_sequence_diagram_gains_filter_bind_allocate(
    cluster: Cluster, ns: str, page: Page, dashboard: server.Dashboard
) -> None:
    client.CoreV1Api(cluster.api).create_namespaced_pod(ns, vgpu_pod("traced", 2000, 20))
    placed(cluster.api, ns, "traced")
    select = page.locator("#chain select")
    page.wait_for_function(
        f"[...document.querySelectorAll('#chain option')].some(o => o.value === '{ns}')"
    )
    select.select_option(ns)
    labels = page.locator("#diagram .messageText")
    for step in ("Webhook", "Filter", "Bind", "Allocate"):
        page.wait_for_function(
            f"""[...document.querySelectorAll('#diagram .messageText')]
                .some(t => t.textContent.startsWith('{step} '))""",
            timeout=30_000,
        )
    # the diagram is redrawn for the selected namespace: its Filter calls are this pod's
    # (wait: under load the redraw may come after the steps of the previous view)
    page.wait_for_function(
        f"""(fs => fs.length > 0 && fs.every(t => t.textContent.includes(' {ns}/')))(
            [...document.querySelectorAll('#diagram .messageText')]
                .filter(t => t.textContent.startsWith('Filter ')))""",
        timeout=30_000,
    )
    assert all(f" {ns}/" in t for t in labels.all_text_contents() if t.startswith("Filter "))
    lanes = set(page.locator("#diagram .actor").all_text_contents())
    assert {"kube-scheduler", "hami-extender", "kubelet", "device-plugin"} <= lanes
    # the exported diagram draws caller -> callee
    text = httpx.get(f"{dashboard.url}api/diagram", params={"namespace": ns}).text
    assert re.search(r"kube_scheduler->>hami_extender: Filter ", text)
    assert re.search(r"kube_scheduler->>hami_extender: Bind ", text)
    assert re.search(r"kubelet->>device_plugin: Allocate ", text)


@contextlib.contextmanager
def kueue_crds(api: client.ApiClient) -> Iterator[None]:
    """Kueue's CRDs (the release's, without the conversion webhook: no Kueue controller
    runs here and the dashboard reads the storage version)."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(KUEUE_CRDS.glob("*.yaml")):
        crd = copy.deepcopy(yaml.safe_load(path.read_text()))
        crd["spec"].pop("conversion", None)
        ext.create_custom_resource_definition(crd)
        names.append(crd["metadata"]["name"])
    try:
        yield
    finally:
        for name in names:
            ext.delete_custom_resource_definition(name)


def test_panels_without_their_crds_say_not_installed_then_appear_with_them(
    cluster: Cluster, page: Page
) -> None:
    for panel in ("kueue", "volcano", "podgroups", "operator"):
        page.wait_for_selector(f'.not-installed[data-panel="{panel}"]')
    with kueue_crds(cluster.api):
        page.wait_for_selector('.not-installed[data-panel="kueue"]', state="detached")
        custom = client.CustomObjectsApi(cluster.api)
        group, version = "kueue.x-k8s.io", "v1beta2"
        cq = {
            "apiVersion": f"{group}/{version}",
            "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "a100",
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}],
                            }
                        ],
                    }
                ],
            },
        }
        wait_for(lambda: _created(custom, group, version, cq), 30, "the ClusterQueue CRD to serve")
        # what Kueue's ClusterQueue controller writes (updateCqStatusIfChanged)
        usage = [{"name": "nvidia.com/gpu", "total": "3", "borrowed": "0"}]
        custom.patch_cluster_custom_object_status(
            group,
            version,
            "clusterqueues",
            "team-a",
            {"status": {"flavorsUsage": [{"name": "a100", "resources": usage}]}},
        )
        usage_cell = page.locator('.cq[data-cq="team-a"] tr[data-flavor="a100"] .usage')
        usage_cell.wait_for(timeout=15_000)
        page.wait_for_function(
            """document.querySelector('.cq[data-cq="team-a"] .usage')
               .textContent.trim() === '3 / 4'""",
            timeout=15_000,
        )
        for panel in ("volcano", "podgroups", "operator"):
            assert page.locator(f'.not-installed[data-panel="{panel}"]').count() == 1
    page.wait_for_selector('.not-installed[data-panel="kueue"]', timeout=30_000)


def _created(custom: client.CustomObjectsApi, group: str, version: str, body: Any) -> bool:
    try:
        custom.create_cluster_custom_object(group, version, "clusterqueues", body)
    except ApiException as exc:
        if exc.status == 404:  # the new CRD is not served yet
            return False
        raise
    return True


def test_the_api_server_going_away_shows_a_banner_and_the_page_catches_up(
    cluster: Cluster, ns: str, page: Page
) -> None:
    assert page.locator("#banner").count() == 0
    record = cluster.local.stop_process("kube-apiserver")
    try:
        page.wait_for_selector("#banner", timeout=30_000)
        assert "API server is unreachable" in page.locator("#banner").inner_text()
        page.wait_for_selector("#state.down")
    finally:
        cluster.local.start_process(
            record.name, record.argv, record.ports, record.env, record.service
        )
    page.wait_for_selector("#banner", state="detached", timeout=60_000)
    page.wait_for_selector("#state.live")
    # caught up: a pod created now shows up as the cluster has it
    client.CoreV1Api(cluster.api).create_namespaced_pod(ns, vgpu_pod("after", 1000, 10))
    node, uuid = placed(cluster.api, ns, "after")
    page.wait_for_selector(
        f'.node[data-node="{node}"] .gpu[data-uuid="{uuid}"] .slice[data-pod="{ns}/after"]',
        timeout=5_000,
    )
