"""Volcano's framework pieces without a cluster: configuration, Statement, PodGroup phase,
the tier walks, backfill and preempt, the snapshot's overlay, the scheduler's reload."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from volcano_helpers import LAB_CONF, FakeCache, gpu_nodes, run

from gpulab.framework.snapshot import new_snapshot
from gpulab.trace import Tracer
from gpulab.volcano import apis
from gpulab.volcano.objects import podgroup, queue, task_pod
from gpulab.volcano.scheduler import conf, snapshot
from gpulab.volcano.scheduler.actions import ACTIONS
from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo, TaskStatus
from gpulab.volcano.scheduler.api.resource_info import Resource
from gpulab.volcano.scheduler.framework.session import Session, pod_group_phase
from gpulab.volcano.scheduler.framework.statement import Statement
from gpulab.volcano.scheduler.plugins import PLUGINS
from gpulab.volcano.scheduler.scheduler import Scheduler

GPU = "nvidia.com/gpu"


def load(text: str) -> conf.SchedulerConfiguration:
    return conf.unmarshal_scheduler_conf(text, ACTIONS, PLUGINS)


def test_the_default_and_the_lab_configuration_load() -> None:
    default = load(conf.DEFAULT_SCHEDULER_CONF)
    assert default.actions == ("enqueue", "allocate", "backfill")
    assert default.plugin_names()[:3] == ["priority", "gang", "conformance"]
    lab = load(LAB_CONF)
    gang = lab.tiers[0].plugins[1]
    assert not gang.enabled("enablePreemptable") and gang.enabled("enableReclaimable")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('actions: "enqueue, alocate"\ntiers: []', "failed to find Action 'alocate'"),
        (
            'actions: "allocate"\ntiers:\n- plugins:\n  - name: gnag',
            "tiers[0]: failed to find Plugin 'gnag'",
        ),
        (
            'actions: "allocate"\ntiers:\n- plugins:\n  - name: drf\n    enableHierarchy: true\n'
            "  - name: proportion",
            "proportion and drf with hierarchy enabled conflicts",
        ),
        ("actions: [", "not YAML"),
    ],
)
def test_a_bad_configuration_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(conf.ConfError, match=message.replace("[", r"\[")):
        load(text)


def test_the_scheduler_keeps_its_last_good_configuration(tmp_path: Path) -> None:
    path = tmp_path / "volcano-scheduler.conf"
    path.write_text(LAB_CONF)
    out = io.StringIO()
    scheduler = Scheduler(FakeCache(), Tracer("volcano", stream=out), path)  # type: ignore[arg-type]
    scheduler.load_scheduler_conf()
    assert "reclaim" in scheduler.conf.actions
    path.write_text(LAB_CONF.replace("backfill, reclaim", "backfill, reclame"))
    scheduler.load_scheduler_conf()
    assert "reclaim" in scheduler.conf.actions  # unchanged
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "failed to find Action 'reclame'" in lines[-1]["message"]
    assert "keeping the previous configuration" in lines[-1]["message"]
    path.write_text(LAB_CONF.replace("backfill, reclaim", "backfill"))
    scheduler.load_scheduler_conf()
    assert scheduler.conf.actions == ("enqueue", "allocate", "backfill")


def session_of(pods: list, groups: list, nodes: list, queues: list) -> Session:
    from gpulab.volcano.scheduler.framework.framework import open_session

    info = snapshot.build(pods, groups, nodes, queues)
    return open_session(FakeCache(), info, load(LAB_CONF))


def test_a_discarded_statement_gives_the_node_back() -> None:
    pods = [task_pod("g", "w", i, requests={GPU: 4}) for i in range(2)]
    ssn = session_of(pods, [podgroup("g", min_member=2)], gpu_nodes(1), [queue("default")])
    node = ssn.nodes["gpu-0"]
    job = ssn.jobs["default/g"]
    stmt = Statement(ssn)
    for task in list(job.tasks_in(TaskStatus.PENDING)):
        stmt.allocate(task, node)
    assert node.idle.get(GPU) == 0 and job.count(TaskStatus.ALLOCATED) == 2
    stmt.discard()
    assert node.idle.get(GPU) == 8000 and job.count(TaskStatus.PENDING) == 2
    assert all(
        t.last_transaction and t.last_transaction.status == TaskStatus.ALLOCATED
        for t in job.tasks.values()
    )


def test_a_committed_statement_dispatches_every_allocated_task() -> None:
    pods = [task_pod("g", "w", i, requests={GPU: 4}) for i in range(2)]
    ssn = session_of(pods, [podgroup("g", min_member=2)], gpu_nodes(1), [queue("default")])
    stmt = Statement(ssn)
    for task in list(ssn.jobs["default/g"].tasks_in(TaskStatus.PENDING)):
        stmt.allocate(task, ssn.nodes["gpu-0"])
    stmt.commit()
    assert sorted(ssn.cache.binds) == [("g-w-0", "gpu-0"), ("g-w-1", "gpu-0")]  # type: ignore[attr-defined]
    assert ssn.jobs["default/g"].count(TaskStatus.BINDING) == 2


def job_with(*statuses: TaskStatus, min_member: int = 2, phase: str = apis.PG_INQUEUE) -> JobInfo:
    job = JobInfo("ns/j")
    job.set_pod_group(podgroup("j", min_member=min_member, phase=phase))
    for i, status in enumerate(statuses):
        task = TaskInfo.of(task_pod("j", "w", i, requests={GPU: 1}))
        task.status = status
        job.add_task_info(task)
    return job


@pytest.mark.parametrize(
    ("statuses", "phase", "unschedulable", "want"),
    [
        ((TaskStatus.RUNNING, TaskStatus.RUNNING), apis.PG_INQUEUE, False, apis.PG_RUNNING),
        ((TaskStatus.SUCCEEDED, TaskStatus.FAILED), apis.PG_RUNNING, False, apis.PG_COMPLETED),
        ((TaskStatus.RUNNING, TaskStatus.PENDING), apis.PG_INQUEUE, False, apis.PG_INQUEUE),
        ((TaskStatus.PENDING, TaskStatus.PENDING), apis.PG_PENDING, False, apis.PG_PENDING),
        ((TaskStatus.RUNNING, TaskStatus.PENDING), apis.PG_RUNNING, True, apis.PG_UNKNOWN),
        ((TaskStatus.BINDING, TaskStatus.BINDING), apis.PG_RUNNING, False, apis.PG_PENDING),
    ],
)
def test_pod_group_phase(
    statuses: tuple[TaskStatus, ...], phase: str, unschedulable: bool, want: str
) -> None:
    assert pod_group_phase(job_with(*statuses, phase=phase), unschedulable) == want


def test_job_valid_needs_enough_pods_for_the_gang() -> None:
    pg = podgroup("g", min_member=3, phase=apis.PG_INQUEUE)
    pods = [task_pod("g", "w", i, requests={GPU: 1}) for i in range(2)]
    ssn, cache = run(pods, [pg], gpu_nodes(1), [queue("default")], actions=["allocate"])
    assert cache.binds == []
    result = ssn.job_valid(ssn.jobs["default/g"])
    assert result is not None and result.reason == apis.NOT_ENOUGH_PODS_REASON
    assert result.message == "Not enough valid tasks for gang-scheduling, valid: 2, min: 3"


def test_backfill_places_best_effort_tasks() -> None:
    pg = podgroup("be", min_member=1, phase=apis.PG_INQUEUE)
    pods = [task_pod("be", "w", 0)]
    _, cache = run(pods, [pg], gpu_nodes(1), [queue("default")], actions=["backfill"])
    assert cache.binds == [("be-w-0", "gpu-0")]


def test_preempt_evicts_a_lower_priority_job_in_the_same_queue() -> None:
    low = podgroup("low", min_member=1, phase=apis.PG_RUNNING, priority_class="low")
    low_pods = [task_pod("low", "w", i, requests={GPU: 4}, node="gpu-0") for i in range(2)]
    high = podgroup("high", min_member=1, phase=apis.PG_INQUEUE, priority_class="high")
    high_pods = [task_pod("high", "w", 0, requests={GPU: 4})]
    info = snapshot.build(
        [*low_pods, *high_pods],
        [low, high],
        gpu_nodes(1),
        [queue("default")],
        priority_classes={"low": 1, "high": 100},
    )
    from gpulab.volcano.scheduler.framework.framework import close_session, open_session

    cache = FakeCache()
    cfg = load(
        LAB_CONF.replace("backfill, reclaim", "backfill, preempt").replace(
            "enablePreemptable: false", "enablePreemptable: true"
        )
    )
    ssn = open_session(cache, info, cfg)
    ACTIONS["preempt"]().execute(ssn)
    close_session(ssn)
    # gang lets one of low's two tasks go (minAvailable 1); priority: only lower priority
    assert len(cache.evictions) == 1 and cache.evictions[0][0].startswith("low-w-")
    assert cache.evictions[0][1] == "preempt"


def test_an_empty_intersection_lets_the_next_plugin_of_the_tier_decide() -> None:
    """Reclaimable in the lab's first tier (gang, conformance, proportion), as v1.15.1
    walks it: gang offers only the system-critical job's spare task, conformance only
    the others; their empty intersection is Go's nil, so proportion starts afresh and its
    victims are taken alone - the gang at its minimum loses tasks (volcano-sh/volcano
    #5963)."""
    crit = podgroup("crit", min_member=1, queue="qa", phase=apis.PG_RUNNING)
    crit_pods = [task_pod("crit", "w", i, requests={GPU: 1}, node="gpu-0") for i in range(2)]
    for pod in crit_pods:
        pod["spec"]["priorityClassName"] = "system-cluster-critical"
    full = podgroup("full", min_member=6, queue="qa", phase=apis.PG_RUNNING)
    full_pods = [task_pod("full", "w", i, requests={GPU: 1}, node="gpu-0") for i in range(6)]
    new = podgroup("new", min_member=1, queue="qb", phase=apis.PG_INQUEUE)
    new_pods = [task_pod("new", "w", 0, requests={GPU: 2})]
    ssn = session_of(
        [*crit_pods, *full_pods, *new_pods],
        [crit, full, new],
        gpu_nodes(1),
        [queue("qa"), queue("qb")],
    )
    (reclaimer,) = ssn.jobs["default/new"].tasks.values()
    reclaimees = [
        *ssn.jobs["default/full"].tasks.values(),
        *ssn.jobs["default/crit"].tasks.values(),
    ]
    fns = ssn.fns["reclaimable"]
    by_gang, _ = fns["gang"](reclaimer, reclaimees)
    by_conformance, _ = fns["conformance"](reclaimer, reclaimees)
    by_proportion, _ = fns["proportion"](reclaimer, reclaimees)
    assert [t.job for t in by_gang] == ["default/crit"]
    assert {t.job for t in by_conformance} == {"default/full"}
    assert [t.name for t in by_proportion] == ["full-w-0", "full-w-1"]  # qa: 8 of deserved 6
    assert ssn.reclaimable(reclaimer, reclaimees) == by_proportion


def test_the_overlay_keeps_what_the_cache_did() -> None:
    pods = [
        task_pod("g", "w", 0, requests={GPU: 2}),
        task_pod("g", "w", 1, requests={GPU: 2}, node="gpu-0"),
    ]
    binding = {pods[0]["metadata"]["uid"]: "gpu-0"}
    releasing = {pods[1]["metadata"]["uid"]}
    info = snapshot.build(
        pods,
        [podgroup("g", min_member=1)],
        gpu_nodes(1),
        [queue("default")],
        overlay=snapshot.Overlay(binding, releasing),
    )
    job = info.jobs["default/g"]
    assert job.count(TaskStatus.BINDING) == 1 and job.count(TaskStatus.RELEASING) == 1
    node = info.nodes["gpu-0"]
    assert node.used.get(GPU) == 4000 and node.releasing.get(GPU) == 2000
    assert len(new_snapshot([node.node], info.pods).get("gpu-0").pods) == 2


def test_a_pod_of_another_scheduler_counts_only_when_bound() -> None:
    """Both jobs have a PodGroup: only the scheduler-name filter keeps the other
    scheduler's unbound pod out of its job (and its bound pod in, on its node)."""
    mine = task_pod("g", "w", 0, requests={GPU: 1})
    other = task_pod("o", "w", 0, requests={GPU: 1}, scheduler="default-scheduler")
    bound = task_pod("o", "w", 1, requests={GPU: 3}, scheduler="default-scheduler", node="gpu-0")
    pgs = [podgroup("g"), podgroup("o")]
    info = snapshot.build([mine, other, bound], pgs, gpu_nodes(1), [queue("default")])
    assert sorted(t.name for t in info.jobs["default/g"].tasks.values()) == ["g-w-0"]
    assert sorted(t.name for t in info.jobs["default/o"].tasks.values()) == ["o-w-1"]
    assert info.nodes["gpu-0"].idle.get(GPU) == 5000


def test_resources_follow_volcano_units() -> None:
    r = Resource.from_list(
        {"cpu": "1500m", "memory": "1Gi", GPU: "2", "pods": "110", "count/pods": "1"}
    )
    assert (r.milli_cpu, r.memory, r.get(GPU), r.get("pods"), r.max_task_num) == (
        1500,
        2**30,
        2000,
        110,
        110,
    )
    assert r.to_list() == {"cpu": "1500m", "memory": "1Gi", GPU: "2", "pods": "110"}
    assert Resource.from_list({"pods": "1"}).is_empty()
    fits, short = Resource.from_list({GPU: 3}).less_equal_with_names(Resource.from_list({GPU: 2}))
    assert not fits and short == [GPU]
