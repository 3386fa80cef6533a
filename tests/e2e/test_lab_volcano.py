"""lab-gang-deadlock-volcano on its own cluster (harness/clusters/labs-volcano.yaml: addon
volcano, two 4-GPU T4 nodes): the broken state (two PyTorch vcjobs whose gang,
minAvailable 2, is half their world of 4) is diagnosed naming the volcano link on the
PodGroup and on a running rank, every rank's pod carrying the pytorch plugin's
WORLD_SIZE=4 and its RANK; the documented fix (minAvailable 4 on both jobs) makes
`gpulab lab check` pass, through Volcano's own recovery (PodGroup Unknown -> the jobs'
Unknown policy restarts them -> enqueue lets one whole gang in); afterwards no object of
the lab has a broken link. The Volcano chapter's demo objects that fit this cluster
(demos/volcano.py: the elastic a-train, the over-capability c-big) get no false alarm
and the right one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import Cluster, running_cluster
from kubernetes import client, watch
from labs_helpers import first_broken, lab_check, progress
from urllib3.exceptions import ProtocolError

from gpulab.volcano import apis
from gpulab.volcano.client import VolcanoClient
from gpulab.wait import WaitTimeout, wait_for
from harness.labs import gang_deadlock_volcano as gv

pytestmark = pytest.mark.local_backend


@pytest.fixture(scope="module")
def labs_volcano() -> Iterator[Cluster]:
    with running_cluster(gv.SPEC) as c:
        yield c


def kubectl(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "gpulab", "kubectl", "--spec", gv.SPEC, *args],
        check=True,
        capture_output=True,
    )


def _running(api: client.ApiClient) -> dict[str, int]:
    pods = client.CoreV1Api(api).list_namespaced_pod(gv.NS).items
    return {g: gv.running_count(pods, g) for g in gv.GANGS}


def _ranks(api: client.ApiClient) -> dict[str, dict[str, str]]:
    """Per job, RANK -> WORLD_SIZE as the pytorch job plugin wrote them into the pods' env
    (what `kubectl get pod -o yaml` shows)."""
    out: dict[str, dict[str, str]] = {}
    for pod in client.CoreV1Api(api).list_namespaced_pod(gv.NS).items:
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        gang = (pod.metadata.annotations or {}).get(apis.JOB_NAME_KEY, "")
        out.setdefault(gang, {})[env.get("RANK", "?")] = env.get("WORLD_SIZE", "?")
    return out


def test_lab_gang_deadlock_volcano(labs_volcano: Cluster) -> None:
    api = labs_volcano.api
    backend = labs_volcano.backend
    gv.LAB.start(backend, progress)
    try:
        assert _running(api) == {"train-a": 2, "train-b": 2}
        assert _ranks(api) == {
            g: {str(r): str(gv.WORLD) for r in range(gv.WORLD)} for g in gv.GANGS
        }
        (case,) = gv.LAB.cases(api)
        link, answer = first_broken(api, *case.target)
        assert link == "volcano", answer
        assert "2 of a 4-rank world" in answer and "train-b (2/4)" in answer, answer
        assert "minAvailable" in answer and "Unknown -> RestartJob" in answer, answer
        link, answer = first_broken(api, "pod", f"{gv.NS}/train-b-master-0")
        assert link == "volcano" and "half of another job holds the rest: train-a" in answer
        assert lab_check(gv.NAME) == 1
        # both jobs keep half a world each for as long as one watches
        assert _running(api) == {"train-a": 2, "train-b": 2}

        # the documented fix, as the learner types it
        def fix() -> None:
            for gang in gv.GANGS:
                kubectl(
                    "-n", gv.NS, "patch", "vcjob", gang, "--type", "merge",
                    "-p", f'{{"spec":{{"minAvailable":{gv.WORLD}}}}}',
                )  # fmt: skip

        saw_unknown = _watch_recovery(api, fix)
        assert saw_unknown, "Volcano marked no half gang Unknown"
        assert lab_check(gv.NAME) == 0
        running = _running(api)
        assert sorted(running.values()) == [0, gv.WORLD], running
        vc = VolcanoClient(api)
        for gang in gv.GANGS:
            job = vc.job(gv.NS, gang) or {}
            assert job["spec"]["minAvailable"] == gv.WORLD
        restarted = [g for g in gv.GANGS if (vc.job(gv.NS, g) or {})["status"].get("retryCount")]
        assert restarted, "no job was restarted by its Unknown policy"
        last: dict[str, str] = {}

        def no_alarm(gang: str) -> bool:
            ref = f"{gv.NS}/{gv.podgroup_of(api, gang)}"
            link, last[gang] = first_broken(api, "podgroup", ref)
            return link is None

        for gang in gv.GANGS:  # the winner Running, the other waiting in enqueue: no alarm
            # the loser's PodGroup may first carry allocate's Unschedulable from the session
            # that restarted it; the next sessions' enqueue refusal says it waits its turn
            try:
                wait_for(lambda g=gang: no_alarm(g), 30, f"no broken link on {gang}", 1)
            except WaitTimeout:
                pytest.fail(last[gang])
        for pod in client.CoreV1Api(api).list_namespaced_pod(gv.NS).items:
            link, answer = first_broken(api, "pod", f"{gv.NS}/{pod.metadata.name}")
            assert link is None, answer
    finally:
        gv.LAB.stop(backend, progress)


def _watch_recovery(api: client.ApiClient, fix: Callable[[], None], timeout: float = 120) -> bool:
    """Apply ``fix`` and, until the lab is fixed, watch the PodGroups (a thread); True if
    one went Unknown on the way - Volcano's word for a gang whose running part cannot
    complete."""
    phases: list[str] = []
    w = watch.Watch()

    def follow() -> None:
        try:
            for ev in w.stream(
                client.CustomObjectsApi(api).list_namespaced_custom_object,
                apis.SCHEDULING_GROUP,
                apis.SCHEDULING_VERSION,
                gv.NS,
                "podgroups",
                timeout_seconds=int(timeout),
            ):
                phases.append(str((ev["object"].get("status") or {}).get("phase")))
        except ProtocolError:  # the stream outlived the test (stopped at its next event)
            pass

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(0.5)  # the watch is open
    try:
        fix()
        wait_for(lambda: all(s.fixed for s in gv.LAB.check(api)), timeout, "the lab fixed", 0.5)
    finally:
        w.stop()
    return apis.PG_UNKNOWN in phases


def test_no_false_alarm_on_the_volcano_demo_objects(labs_volcano: Cluster) -> None:
    """The Volcano chapter's queues and jobs as demos/volcano.py makes them, those that
    fit two 4-GPU nodes: a-train (elastic: 8 tasks x 2 GPUs, minAvailable 2, no job
    plugin) runs 4 tasks and leaves 4 Pending - the lab's broken shape without a fixed
    world, so not broken; c-big asks more than team-c's queue capability: the volcano link
    says so (the positive control)."""
    from demos import volcano as demo
    from demos.common import fresh_namespace

    api = labs_volcano.api
    vc = VolcanoClient(api)
    core = client.CoreV1Api(api)
    for ns in (demo.TEAM_A, demo.TEAM_C):
        fresh_namespace(api, ns)
    demo._queues(vc)
    try:
        vc.create_job(demo.TEAM_A, demo.a_train())
        vc.create_job(demo.TEAM_C, demo.c_big())
        wait_for(lambda: vc.bound(demo.TEAM_A, "a-train") == 4, 60, "a-train's 4 pods bound")
        wait_for(lambda: demo._unschedulable(vc), 30, "c-big's PodGroup to say why it waits")
        pods = [
            p
            for p in core.list_namespaced_pod(demo.TEAM_A).items
            if p.status.phase == "Running" and p.spec.node_name
        ]
        assert len(pods) == 4
        for p in pods:
            link, answer = first_broken(api, "pod", f"{demo.TEAM_A}/{p.metadata.name}")
            assert link is None, answer
        job = vc.job(demo.TEAM_C, "c-big") or {}
        link, answer = first_broken(api, "podgroup", f"{demo.TEAM_C}/{apis.pod_group_name(job)}")
        assert link == "volcano" and "capability 4" in answer, answer
    finally:
        for ns in (demo.TEAM_A, demo.TEAM_C):
            core.delete_namespace(ns)
        for ns in (demo.TEAM_A, demo.TEAM_C):
            wait_for(
                lambda n=ns: n not in {x.metadata.name for x in core.list_namespace().items},
                90,
                f"namespace {ns} to go",
                0.5,
            )
        for q in (demo.QUEUE_A, demo.QUEUE_B, demo.QUEUE_C):
            vc.delete_queue(q)
