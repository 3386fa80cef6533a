"""vc-webhook-manager's decisions without a server: queue CREATE / UPDATE / DELETE
validation (validate_queue.go), PodGroup validation (validate_podgroup.go) and the
decoder's refusals (schema.go + Go's json), with upstream's messages."""

from __future__ import annotations

from typing import Any

import pytest

from gpulab.informer import Store
from gpulab.volcano import objects as vo
from gpulab.volcano.webhooks import podgroups, queues, schema

GPU = "nvidia.com/gpu"


def q(name: str, parent: str = "", **spec: Any) -> dict[str, Any]:
    body = vo.queue(name)
    body["spec"].update(spec)
    if parent:
        body["spec"]["parent"] = parent
    return body


def store(*items: dict[str, Any]) -> Store:
    s = Store()
    s.replace([vo.queue("default"), vo.queue("root"), *items])
    return s


def admit(queue: dict[str, Any], known: Store, old: dict[str, Any] | None = None) -> str:
    return queues.validate_create_update(queue, old, "UPDATE" if old else "CREATE", known)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"guarantee": {"resource": {GPU: "4"}}, "deserved": {GPU: "2"}},
            'requestBody.spec.deserved.nvidia.com/gpu: Invalid value: "2": '
            "deserved[nvidia.com/gpu]=2 must be >= guarantee[nvidia.com/gpu]=4",
        ),
        (
            {"guarantee": {"resource": {"cpu": "2"}}},
            'requestBody.spec.deserved.cpu: Invalid value: "<nil>": '
            "deserved[cpu] must be >= guarantee[cpu]=2",
        ),
        (
            {"capability": {GPU: "4"}, "deserved": {GPU: "8"}},
            'requestBody.spec.deserved.nvidia.com/gpu: Invalid value: "8": '
            "deserved[nvidia.com/gpu]=8 must be <= capability[nvidia.com/gpu]=4",
        ),
        (
            {"capability": {GPU: "-1", "cpu": "-500m"}},
            '[requestBody.spec.capability.cpu: Invalid value: "-500m": must be greater than or '
            'equal to 0, requestBody.spec.capability.nvidia.com/gpu: Invalid value: "-1": must '
            "be greater than or equal to 0]",
        ),
        (
            {"deserved": {GPU: "1500m"}},
            'requestBody.spec.deserved.nvidia.com/gpu: Invalid value: "1500m": must be an integer',
        ),
    ],
)
def test_a_queues_resources_must_nest(spec: dict[str, Any], message: str) -> None:
    assert admit(q("team", **spec), store()) == message


def test_guarantee_deserved_and_capability_in_order_are_admitted() -> None:
    fine = q(
        "team",
        guarantee={"resource": {GPU: "2"}},
        deserved={GPU: "4"},
        capability={GPU: "8"},
    )
    assert admit(fine, store()) == ""


def test_a_queue_state_must_be_open_or_closed() -> None:
    bad = q("team")
    bad["status"] = {"state": "Closing"}
    assert admit(bad, store()) == (
        'requestBody.spec.state: Invalid value: "Closing": queue state must be in [Open Closed]'
    )


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {queues.HIERARCHY: "root/sci", queues.HIERARCHY_WEIGHTS: "1"},
            'requestBody.metadata.annotations: Invalid value: "root/sci": volcano.sh/hierarchy '
            "must have the same length with volcano.sh/hierarchy-weights",
        ),
        (
            {queues.HIERARCHY: "root/sci", queues.HIERARCHY_WEIGHTS: "1/x"},
            'requestBody.metadata.annotations: Invalid value: "1/x": x in the 1/x is invalid '
            'number: strconv.ParseFloat: parsing "x": invalid syntax',
        ),
        (
            {queues.HIERARCHY: "root/sci", queues.HIERARCHY_WEIGHTS: "1/0"},
            'requestBody.metadata.annotations: Invalid value: "1/0": 0 in the 1/0 must be '
            "larger than 0",
        ),
        (
            {queues.HIERARCHY: "root/sci", queues.HIERARCHY_WEIGHTS: "1/2"},
            'requestBody.metadata.annotations: Invalid value: "root/sci": root/sci is not '
            "allowed to be in the sub path of root/sci/dev of queue dev",
        ),
    ],
)
def test_the_hierarchy_annotations(annotations: dict[str, str], message: str) -> None:
    dev = q("dev")
    dev["metadata"]["annotations"] = {queues.HIERARCHY: "root/sci/dev"}
    sci = q("sci")
    sci["metadata"]["annotations"] = annotations
    assert admit(sci, store(dev)) == message


def test_a_parent_must_exist_and_not_be_itself_or_too_deep() -> None:
    assert admit(q("a", "a"), store()) == "queue a cannot use itself as parent"
    assert admit(q("a", "ghost"), store()) == (
        'failed to get parent queue ghost of queue a: queue.scheduling.volcano.sh "ghost" not found'
    )
    chain = [q("l1"), q("l2", "l1"), q("l3", "l2"), q("l4", "l3"), q("l5", "l4")]
    assert admit(q("l6", "l5"), store(*chain)) == "queue l6 exceeds the maximum allowed depth of 5"
    assert admit(q("l5b", "l4"), store(*chain)) == ""


def test_a_queue_holding_pods_cannot_become_a_parent() -> None:
    busy = q("busy")
    busy["status"] = {"state": "Open", "allocated": {"pods": "3", GPU: "4"}}
    assert admit(q("child", "busy"), store(busy)) == (
        "queue busy cannot be the parent queue of queue child because it has allocated Pods: 3"
    )


def test_hierarchical_resources() -> None:
    parent = q("p", capability={GPU: "8"}, deserved={GPU: "8"}, guarantee={"resource": {GPU: "4"}})
    sibling = q("s", "p", deserved={GPU: "6"}, guarantee={"resource": {GPU: "2"}})
    known = store(parent, sibling)
    assert admit(q("c", "p", capability={GPU: "16"}), known) == (
        "queue c capability[nvidia.com/gpu]=16000.00 exceeds its ancestor's capability=8000.00"
    )
    assert admit(q("c", "p", deserved={GPU: "4"}, guarantee={"resource": {GPU: "1"}}), known) == (
        "parent queue p validation failed: sum of children's deserved (cpu 0.00, memory 0.00, "
        "nvidia.com/gpu 10000.00) exceeds parent's deserved limit (cpu 0.00, memory 0.00, "
        "nvidia.com/gpu 8000.00)"
    )
    assert admit(q("c", "p", deserved={GPU: "2"}, guarantee={"resource": {GPU: "2"}}), known) == ""
    # the parent shrinks below a child's capability
    child = q("c", "p", capability={GPU: "6"})
    shrunk = q("p", capability={GPU: "4"}, deserved={GPU: "4"}, guarantee={"resource": {GPU: "4"}})
    assert admit(shrunk, store(parent, child), old=parent) == (
        "queue p capability[nvidia.com/gpu]=4000.00 is smaller than its descendants' max "
        "capability=6000.00"
    )


def test_the_root_queue_keeps_its_resources_and_default_stays() -> None:
    root = q("root")
    grown = q("root", capability={GPU: "8"})
    assert admit(grown, store(), old=root) == (
        "root queue's resource attributes (capability, deserved, guarantee) cannot be modified"
    )
    known = store(q("p"), q("c1", "p"), q("c2", "p"))
    assert queues.validate_delete("p", known) == (
        "queue p can not be deleted because it has 2 child queues: c1, c2"
    )
    assert queues.validate_delete("ghost", known) == (
        'queue.scheduling.volcano.sh "ghost" not found'
    )
    assert queues.validate_delete("root", known) == "`root` queue can not be deleted"


def test_pod_group_admission() -> None:
    known = store(vo.queue("closed", state="Closed"))
    assert podgroups.validate_create(vo.podgroup("pg", queue="default"), known.get) == ""
    assert podgroups.validate_create(vo.podgroup("pg", queue="ghost"), known.get) == (
        'unable to find queue: queue.scheduling.volcano.sh "ghost" not found'
    )
    closed = podgroups.validate_create(vo.podgroup("pg", queue="closed"), known.get)
    assert closed == (
        "can only submit PodGroup to queue with state `Open`, queue `closed` status is `Closed`. "
    )
    both = vo.podgroup("pg")
    both["spec"]["networkTopology"] = {"highestTierAllowed": 1, "highestTierName": "rack"}
    assert podgroups.validate_create(both, known.get) == (
        "must not specify 'highestTierAllowed' and 'highestTierName' in networkTopology "
        "simultaneously."
    )


def request(obj: dict[str, Any], resource: str = "jobs") -> dict[str, Any]:
    group, version = obj["apiVersion"].split("/")
    return {"resource": {"group": group, "version": version, "resource": resource}, "object": obj}


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (
            ("spec", "minAvailable"),
            "abc",
            "json: cannot unmarshal string into Go struct field JobSpec.spec.minAvailable of "
            "type int32",
        ),
        (
            ("spec", "tasks"),
            {},
            "json: cannot unmarshal object into Go struct field JobSpec.spec.tasks of type "
            "[]v1alpha1.TaskSpec",
        ),
        (
            ("spec", "maxRetry"),
            2**31,
            "json: cannot unmarshal number 2147483648 into Go struct field JobSpec.spec.maxRetry "
            "of type int32",
        ),
        (("spec", "policies"), [{"timeout": "soon"}], 'time: invalid duration "soon"'),
    ],
)
def test_the_decoder_says_what_go_would(where: tuple[str, str], value: Any, message: str) -> None:
    job = vo.vcjob("j", [vo.task("w", 1)])
    job[where[0]][where[1]] = value
    with pytest.raises(schema.DecodeError) as err:
        schema.decode(request(job), "object", schema.JOBS)
    assert message in str(err.value)


def test_the_decoder_checks_the_resource_and_the_kind_and_fills_go_zero_values() -> None:
    job = vo.vcjob("j", [vo.task("w", 1)])
    with pytest.raises(schema.DecodeError, match=r"expect resource to be \{batch.volcano.sh "):
        schema.decode(request(job, "queues"), "object", schema.JOBS)
    pod = {**job, "apiVersion": "v1", "kind": "Pod"}
    with pytest.raises(schema.DecodeError, match=r"is a v1 Pod, expected batch\.volcano\.sh"):
        schema.decode({**request(job), "object": pod}, "object", schema.JOBS)
    job["spec"]["tasks"].append(None)
    job["spec"]["plugins"] = {"ssh": None}
    decoded = schema.decode(request(job), "object", schema.JOBS)
    assert decoded["spec"]["tasks"][1] == {} and decoded["spec"]["plugins"] == {"ssh": []}
    queue = vo.queue("q", capability={GPU: "lots"})
    with pytest.raises(schema.DecodeError, match=r"QueueSpec\.spec\.capability of type resource"):
        schema.decode(request(queue, "queues"), "object", schema.QUEUES)
