"""The labs' pure parts: what each lab creates is what its story says (the e2e tests in
tests/e2e/test_labs.py run them on the labs cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.deviceplugin.config import parse
from harness.errors import HarnessError
from harness.labs import LABS, deployment, load
from harness.spec import load as load_spec


@pytest.mark.parametrize("name", list(LABS))
def test_every_lab_has_its_namespace_hints_and_a_make_target(name: str) -> None:
    lab = load(name)
    assert lab.name == name
    assert lab.namespace.startswith("lab-")
    assert len(lab.hints) >= 3
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    assert name in makefile.split("LABS :=", 1)[1].splitlines()[0]


def test_an_unknown_lab_names_the_labs() -> None:
    with pytest.raises(HarnessError, match="no lab 'nope'; labs: unschedulable"):
        load("nope")


def test_each_lab_pool_is_a_node_of_its_cluster() -> None:
    assert {load(name).spec for name in LABS} == {"labs", "labs-mig", "labs-volcano"}
    volcano = load_spec("labs-volcano")
    assert list(volcano.addons) == ["volcano"]
    assert {n.labels.get("gpulab.io/lab-pool") for n in volcano.nodes} == {
        "gang-deadlock-volcano",
        None,
    }
    mig = load_spec("labs-mig")
    assert mig.addons == ("gpu-operator",) or list(mig.addons) == ["gpu-operator"]
    assert [n.labels.get("gpulab.io/lab-pool") for n in mig.nodes] == ["mig", "mig-b"]
    pools = {n.labels.get("gpulab.io/lab-pool") for n in load_spec("labs").nodes}
    assert {
        "unschedulable",
        "unschedulable-hami",
        "device-plugin",
        "gang-deadlock",
        "queue-quota",
    } <= pools


def test_the_renaming_config_is_upstreams_format_and_renames() -> None:
    from harness.labs.device_plugin import SHARED_CONFIG

    config = parse(SHARED_CONFIG)
    assert config.time_slicing.rename_by_default
    assert [r.rename for r in config.time_slicing.resources] == ["nvidia.com/gpu.shared"]


def test_gang_workers_mix_priorities_and_use_gpulab_scheduler() -> None:
    from harness.labs import gang_deadlock as g

    workers = [g.worker("train-a", r) for r in range(g.WORKERS)]
    assert [w["spec"].get("priorityClassName") for w in workers] == [
        g.PRIORITY_CLASS,
        g.PRIORITY_CLASS,
        None,
        None,
    ]
    assert {w["spec"]["schedulerName"] for w in workers} == {"gpulab-scheduler"}
    assert workers[0]["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "train-a"


def test_queue_quota_jobs() -> None:
    from harness.labs import queue_quota as q

    queued, unqueued = q.job("job-a", "team-a", 1), q.job("job-d", None, 1)
    assert queued["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert unqueued["metadata"]["labels"] == {}
    assert unqueued["spec"]["template"]["spec"]["nodeSelector"] == {
        "gpulab.io/lab-pool": "queue-quota"
    }
    cq = q.cluster_queue(q.CQ_A, q.MISSING_FLAVOR, 2)
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["name"] == "spot-gpu"


def test_unschedulable_cases_and_the_hami_pod() -> None:
    from harness.labs import unschedulable as u

    assert set(u.FIXES) == set(u.SYMPTOMS) == set(u.LINKS)
    pod = u.hami_deployment("A100")["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"nvidia.com/use-gputype": "A100"}
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}
    plain = deployment("x", "ns", 16, node_selector={"a": "b"})["spec"]["template"]["spec"]
    assert plain["nodeSelector"] == {"a": "b"}
    assert "schedulerName" not in plain


def test_mig_lab_objects() -> None:
    """The ClusterPolicy is the chapter's sample with the Helm chart's default strategy;
    the typo names no config of the shipped mig-parted ConfigMap, the fix names one; the
    pod asks for the mixed strategy's resource on the lab's node."""
    import yaml
    from kubernetes import client

    from harness.labs import mig

    assert mig.policy("single")["spec"]["mig"] == {"strategy": "single"}
    assert mig.policy("single")["metadata"]["name"] == "cluster-policy"
    shipped = Path(__file__).parents[2] / (
        "manifests/gpu-operator/assets/state-mig-manager/0400_configmap.yaml"
    )
    cm = client.V1ConfigMap(data=yaml.safe_load(shipped.read_text())["data"])
    names = mig.config_names(cm)
    assert mig.CONFIG in names and mig.TYPO not in names
    assert mig.config_names(client.V1ConfigMap(data={"config.yaml": "version: v1\n: ["})) == set()
    app = deployment(mig.APP, mig.NS, 1, resource=mig.RESOURCE, node_selector={"p": "mig"})
    limits = app["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "1"}
    (ds,) = [d for d in mig.standalone_plugin() if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.device-plugin": "false",
    }
    # the operator leaves gpu-mig-b's plugin to that DaemonSet, whose config is mixed
    node_b = load_spec("labs-mig").nodes[1]
    assert node_b.labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
    assert node_b.device_plugin.mig_strategy == "mixed"


def test_the_volcano_gangs_are_half_their_pytorch_world() -> None:
    """lab-gang-deadlock-volcano's mistake: minAvailable 2 of a world of 4 (pytorch plugin:
    master + worker replicas), each job alone fits the lab's 8 GPUs, both do not; the fix
    is minAvailable = world, and the Unknown policy is what recovers a half gang."""
    from gpulab.diagnose.chain import job_world
    from harness.labs import gang_deadlock_volcano as gv

    job = gv.job("train-a")
    assert job["spec"]["minAvailable"] == 2
    assert job_world(job) == ("pytorch", 4, "master 1 + worker 3")
    gpus = sum(
        int(t["replicas"])
        * int(t["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        for t in job["spec"]["tasks"]
    )
    nodes = [n for n in load_spec(gv.SPEC).nodes if n.labels.get("gpulab.io/lab-pool")]
    assert gpus == 8 == 4 * len(nodes) and {n.profile for n in nodes} == {"t4-x4"}
    assert {"event": "Unknown", "action": "RestartJob"} in job["spec"]["policies"]
    assert gv.job("train-a", min_available=4)["spec"]["tasks"][1]["minAvailable"] == 3
