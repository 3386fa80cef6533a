"""kueuectl (kueue v0.19.2 cmd/kueuectl): tables golden against upstream's own test
outputs (cmd/kueuectl/app/list/*_test.go), the filters, and what stop/resume patch."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from gpulab.kueue import kueuectl

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def ts(seconds_ago: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload(
    name: str,
    lq: str,
    age: float,
    conds: dict[str, tuple[str, float]] | None = None,
    cq: str = "",
    owner: str = "",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "creationTimestamp": ts(age)}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": f"u-{owner}"}
        ]
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "lastTransitionTime": ts(ago)}
            for t, (s, ago) in (conds or {}).items()
        ]
    }
    if cq:
        status["admission"] = {"clusterQueue": cq}
    return {"metadata": meta, "spec": {"queueName": lq}, "status": status}


class FakeClient:
    def __init__(self, pending: dict[str, list[dict[str, Any]]]) -> None:
        self.pending = pending

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        assert plural == "localqueues"
        return {"spec": {"clusterQueue": name.replace("lq", "cq")}}

    def pending_workloads(self, cq: str) -> list[dict[str, Any]] | None:
        return self.pending.get(cq)

    def resources(self, group_version: str) -> list[dict[str, Any]] | None:
        assert group_version == "batch/v1"
        return [{"name": "jobs", "singularName": "job", "kind": "Job"}]


def test_list_workload_table_is_upstreams() -> None:
    """ "should print workload list with all status flag" (list_workload_test.go)."""
    h = 3600.0
    wls = [
        workload("wl1", "lq1", 1 * h, owner="j1"),
        workload("wl2", "lq2", 2 * h, {"Admitted": ("True", 1 * h)}, cq="cq2", owner="j2"),
        workload("wl3", "lq3", 2 * h, {"Admitted": ("False", 1 * h)}, owner="j3"),
        workload(
            "wl4",
            "lq4",
            3 * h,
            {"Admitted": ("True", 2 * h), "Finished": ("True", 1 * h)},
            cq="cq4",
            owner="j4",
        ),
        workload(
            "wl5",
            "lq5",
            3 * h,
            {"Admitted": ("True", 2 * h), "Finished": ("False", 1 * h)},
            cq="cq5",
            owner="j5",
        ),
    ]
    kc = FakeClient({})
    rows = kueuectl.workload_rows(kc, wls, NOW, with_namespace=False)  # type: ignore[arg-type]
    # upstream's fake discovery has no batch/v1: JOB TYPE stays empty there
    rows = [[r[0], "", *r[2:]] for r in rows]
    # upstream's expected output, verbatim (its lines are wider than ours)
    assert kueuectl.table(kueuectl.WORKLOAD_COLUMNS, rows) == (
        "NAME   JOB TYPE   JOB NAME   LOCALQUEUE   CLUSTERQUEUE   STATUS     POSITION IN QUEUE   EXEC TIME   AGE\n"  # noqa: E501
        "wl1               j1         lq1          cq1            PENDING                                    60m\n"  # noqa: E501
        "wl2               j2         lq2          cq2            ADMITTED                       60m         120m\n"  # noqa: E501
        "wl3               j3         lq3          cq3            PENDING                                    120m\n"  # noqa: E501
        "wl4               j4         lq4          cq4            FINISHED                       60m         3h\n"  # noqa: E501
        "wl5               j5         lq5          cq5            ADMITTED                       120m        3h\n"  # noqa: E501
    )


def test_position_in_queue_comes_from_the_visibility_api() -> None:
    wls = [workload("a", "lq1", 30, owner="ja"), workload("b", "lq1", 20, owner="jb")]
    summary = [
        {"metadata": {"name": "b", "namespace": "default"}, "positionInLocalQueue": 0},
        {"metadata": {"name": "a", "namespace": "default"}, "positionInLocalQueue": 1},
    ]
    rows = kueuectl.workload_rows(FakeClient({"cq1": summary}), wls, NOW, True)  # type: ignore[arg-type]
    assert [(r[0], r[1], r[2], r[5], r[7]) for r in rows] == [
        ("default", "a", "job", "cq1", "1"),
        ("default", "b", "job", "cq1", "0"),
    ]


def test_cluster_and_local_queue_tables_are_upstreams() -> None:
    h = 3600.0
    cq = {
        "metadata": {"name": "cq1", "creationTimestamp": ts(h)},
        "spec": {"cohortName": "cohort1"},
        "status": {
            "pendingWorkloads": 1,
            "admittedWorkloads": 2,
            "conditions": [{"type": "Active", "status": "True"}],
        },
    }
    assert kueuectl.table(
        kueuectl.CLUSTER_QUEUE_COLUMNS, kueuectl.cluster_queue_rows([cq], NOW)
    ) == (
        "NAME   COHORT    PENDING WORKLOADS   ADMITTED WORKLOADS   ACTIVE   AGE\n"
        "cq1    cohort1   1                   2                    true     60m\n"
    )
    lq = {
        "metadata": {"name": "lq1", "namespace": "ns", "creationTimestamp": ts(h)},
        "spec": {"clusterQueue": "cq1"},
        "status": {"pendingWorkloads": 1, "admittedWorkloads": 1},
    }
    assert kueuectl.table(
        kueuectl.LOCAL_QUEUE_COLUMNS, kueuectl.local_queue_rows([lq], NOW, False)
    ) == (
        "NAME   CLUSTERQUEUE   PENDING WORKLOADS   ADMITTED WORKLOADS   AGE\n"
        "lq1    cq1            1                   1                    60m\n"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 60, "3h1m"),
        (50 * 3600, "2d2h"),
        (400 * 86400, "400d"),
    ],
)
def test_human_duration(seconds: float, text: str) -> None:
    assert kueuectl.human_duration(seconds) == text


def test_filters_and_patches() -> None:
    pending = workload("p", "lq1", 10)
    admitted = workload(
        "a", "lq2", 10, {"Admitted": ("True", 5), "QuotaReserved": ("True", 5)}, cq="cq2"
    )
    reserved = workload("r", "lq2", 10, {"QuotaReserved": ("True", 5)}, cq="cq2")
    items = [pending, admitted, reserved]
    assert kueuectl.filter_workloads(items, "", "cq2", set()) == [admitted, reserved]
    assert kueuectl.filter_workloads(items, "lq1", "", set()) == [pending]
    assert kueuectl.filter_workloads(items, "", "", {"quotareserved"}) == [reserved]
    assert kueuectl.filter_workloads(items, "", "", {"pending", "admitted"}) == [pending, admitted]
    assert kueuectl.stop_resume_patch("workload", True, False) == {"spec": {"active": False}}
    assert kueuectl.stop_resume_patch("workload", False, False) == {"spec": {"active": True}}
    assert kueuectl.stop_resume_patch("clusterqueue", True, False) == {
        "spec": {"stopPolicy": "HoldAndDrain"}
    }
    assert kueuectl.stop_resume_patch("localqueue", True, True) == {"spec": {"stopPolicy": "Hold"}}
    assert kueuectl.stop_resume_patch("localqueue", False, False) == {
        "spec": {"stopPolicy": "None"}
    }


def test_command_names_and_flags_are_upstreams() -> None:
    parser = argparse.ArgumentParser()
    kueuectl.build(parser)
    args = parser.parse_args(["list", "kwl", "-A", "-c", "cq", "-q", "lq", "--status", "pending"])
    assert (
        args.resource,
        args.all_namespaces,
        args.clusterqueue,
        args.localqueue,
        args.status,
    ) == ("workload", True, "cq", "lq", ["pending"])
    args = parser.parse_args(
        ["stop", "cq", "team", "--keep-already-running", "--dry-run", "server"]
    )
    assert (args.verb, args.resource, args.name, args.keep_already_running, args.dry_run) == (
        "stop",
        "clusterqueue",
        "team",
        True,
        "server",
    )
    args = parser.parse_args(["list", "cq", "--active", "false"])
    assert args.active is False
    with pytest.raises(SystemExit):
        parser.parse_args(["stop", "workload", "w", "--keep-already-running"])


def test_stop_prints_as_the_name_printer() -> None:
    out = io.StringIO()
    kueuectl._print_name(
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "w"}},
        out,
        "stopped",
    )
    assert out.getvalue() == "workload.kueue.x-k8s.io/w stopped\n"
