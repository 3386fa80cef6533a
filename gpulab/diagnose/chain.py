"""Walk the call chain an object is on and name the first broken link. Pure: an
:class:`~gpulab.diagnose.objects.ObjectSet` in, a :class:`Report` out.

The chain of a GPU pod, in the order a request travels it::

    admission   mutating/validating webhooks whose rules match it, and whether each
                one's Service answers (a URL: the reader's probe; a Service: a Ready pod
                behind its selector)
    queue       Kueue (Workload QuotaReserved/Admitted, its LocalQueue, the ClusterQueue's
                Active condition and reason, ResourceFlavors), Volcano (PodGroup phase,
                the gang's Unschedulable message, its Queue's state and capability,
                enqueue's refusal, a gang smaller than its vcjob's world - job plugin
                pytorch / mpi / tensorflow -, Unknown and the job's policy), Coscheduling
                (PodGroup phase, members against minMember, the Permit wait)
    scheduler   spec.schedulerName: does that scheduler run and answer (its Events)
    filter      why each node was refused: kube-scheduler's FailedScheduling summary,
                re-derived per node with the framework chapter's fit functions
                (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit),
                HAMi's per-node Filter table (``gpulab.io/filter-result``),
                gpulab-scheduler's Filter step (NodeResourceTopologyMatch zones)
    node        device plugin registered (resource in capacity), allocatable against
                capacity, Unhealthy devices (the plugin's CheckHealth Events), the plugin
                pod on the node, MIG ``nvidia.com/mig.config.state``; for a MIG
                profile, why the node does not offer it (layout not applied, the MIG
                strategy's resource names, a plugin the MIG manager does not pause)
    kubelet     Allocate (the node agent's record on the pod) and the pod's phase

Formats read are the pinned releases' (see each chapter's doc): kube-scheduler v1.36.3
Events and conditions, Kueue v0.19.2 (``kueue.x-k8s.io/v1beta2``), Volcano v1.15.1
(``scheduling.volcano.sh/v1beta1``), scheduler-plugins v0.35.4 Coscheduling
(``scheduling.x-k8s.io/v1alpha1``), HAMi v2.10.0 annotations, k8s-device-plugin v0.20.0
and NVIDIA mig-parted v0.15.0's ``nvidia.com/mig.config`` / ``mig.config.state`` labels
with the config the MIG manager reads (the ClusterPolicy's custom
``spec.migManager.config.name``, else the one it built, ``<node>-mig-config``, else
gpu-operator v26.7.0's ``default-mig-parted-config``) and operand labels.

A link is ``ok``, ``broken`` (the chain stops here), ``waiting`` (in progress, nothing is
wrong yet), ``blocked`` (this step decided rightly; the cause is further down the chain),
or ``skipped`` (not on this object's chain). The report's answer is its first ``broken``
link and one line of what to do.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from gpulab.dashboard.views import filter_record, scheduler_reasons, unhealthy_devices
from gpulab.diagnose.objects import (
    Obj,
    ObjectSet,
    Target,
    annotations,
    condition,
    custom_mig_config,
    event_time,
    events_about,
    find,
    labels,
    message,
    meta,
    name_of,
    ns_of,
    owners,
    reporter,
    spec,
    status,
)
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT as SIMULATOR_FILTER_RESULT
from gpulab.framework.predicates import (
    fits_request,
    node_affinity_matches,
    node_unschedulable_fits,
    requirement_matches,
    untolerated_taint,
)
from gpulab.framework.resources import is_extended_resource_name, pod_request, pod_requests
from gpulab.framework.snapshot import new_snapshot
from gpulab.gpuoperator.api import MIG_PARTED_DEFAULT_CONFIGMAP
from gpulab.gpuoperator.migmanager import node_configmap_name

OK, BROKEN, WAITING, BLOCKED, SKIPPED = "ok", "broken", "waiting", "blocked", "skipped"

GPU = "nvidia.com/gpu"
DEFAULT_SCHEDULER = "default-scheduler"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GATE = "kueue.x-k8s.io/admission"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_USE_TYPE = "nvidia.com/use-gputype"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_PREFIX = "nvidia.com/mig-"
GPU_PRODUCT = "nvidia.com/gpu.product"
OPERATOR_MANAGED_BY = "gpu-operator"  # the label the GPU Operator puts on its operands' pods
DP_CONFIG_LABEL = "nvidia.com/device-plugin.config"
ALLOCATE_PREFIX = "gpulab.io/allocate-"
SYSTEM_NAMESPACE = "gpulab-system"
# schedulerName -> the app.kubernetes.io/name of the pods that run it (the lab's manifests)
SCHEDULER_PODS = {
    "gpulab-scheduler": "gpulab-scheduler",
    "volcano": "volcano-scheduler",
    "hami-scheduler": "hami-scheduler",
}
# the app.kubernetes.io/name (or upstream app=) of device-plugin pods
DEVICE_PLUGIN_PODS = (
    "gpulab-device-plugin",
    "hami-device-plugin",
    "nvidia-device-plugin-daemonset",
)


@dataclass
class Link:
    name: str
    state: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""


@dataclass
class Report:
    target: Target
    links: list[Link]

    @property
    def broken(self) -> Link | None:
        return next((link for link in self.links if link.state == BROKEN), None)

    def answer(self) -> str:
        """The one line the report ends with."""
        first = self.broken
        if first is None:
            return f"no broken link: {self.target.ref} is where its chain says it should be"
        return f"first broken link: {first.name}: {first.summary}. Do: {first.fix}"

    def to_dict(self) -> dict[str, Any]:
        first = self.broken
        return {
            "target": asdict(self.target),
            "links": [asdict(link) for link in self.links],
            "broken": first.name if first else None,
            "fix": first.fix if first else None,
            "answer": self.answer(),
        }


def diagnose(objs: ObjectSet) -> Report:
    t = objs.target
    if t.kind == "pod":
        pod = find(objs.pods, t.name, t.namespace)
        links = pod_chain(objs, pod) if pod else [_missing(t)]
    elif t.kind == "workload":
        wl = find(objs.workloads, t.name, t.namespace)
        links = workload_chain(objs, wl) if wl else [_missing(t)]
    elif t.kind == "clusterqueue":
        cq = find(objs.cluster_queues, t.name)
        links = cluster_queue_links(objs, cq) if cq else [_missing(t)]
    elif t.kind == "podgroup":
        links = podgroup_chain(objs, t)
    elif t.kind == "node":
        node = find(objs.nodes, t.name)
        links = node_chain(objs, node) if node else [_missing(t)]
    else:
        raise ValueError(f"unknown kind {t.kind!r}")
    return Report(t, links)


def _missing(t: Target) -> Link:
    return Link("object", BROKEN, f"{t.ref} does not exist", fix=f"check the name: {t.ref}")


# ================================================================ the pod's chain


def pod_chain(objs: ObjectSet, pod: Obj) -> list[Link]:
    links = [admission_link(objs, pod, "pods")]
    links += queue_links(objs, pod)
    bound = bool(spec(pod).get("nodeName"))
    links.append(scheduler_link(objs, pod))
    if bound:
        links.append(Link("filter", OK, f"bound to {spec(pod)['nodeName']}", _placement(pod)))
        node = find(objs.nodes, str(spec(pod)["nodeName"]))
        links.append(_bound_node_link(objs, pod, node))
        links.append(kubelet_link(objs, pod))
    elif _volcano_not_admitted(objs, pod):
        links.append(
            Link(
                "filter",
                WAITING,
                "not tried: vc-scheduler's allocate looks at a gang's pods only once enqueue "
                "has let its PodGroup in (Inqueue)",
            )
        )
        links.append(Link("node", SKIPPED, "not scheduled yet"))
    else:
        filt, node = filter_and_node_links(objs, pod)
        links += [filt, node]
    return links


def _volcano_not_admitted(objs: ObjectSet, pod: Obj) -> bool:
    group = annotations(pod).get(VOLCANO_GROUP)
    if not group or spec(pod).get("schedulerName") != "volcano":
        return False
    pg = find(objs.volcano_podgroups, group, ns_of(pod))
    return pg is not None and status(pg).get("phase") in ("", "Pending")


def _placement(pod: Obj) -> list[str]:
    """What the scheduler recorded about the node it chose: HAMi's Filter table, or
    gpulab-scheduler's per-plugin Filter results (NodeResourceTopologyMatch's zone fit)."""
    out = []
    record = filter_record(pod)
    if record:
        out.append(f"HAMi Filter chose {record.get('chosen')} ({record.get('nodePolicy')})")
    raw = annotations(pod).get(SIMULATOR_FILTER_RESULT)  # gpulab-scheduler's DefaultBinder
    if raw:
        try:
            results = json.loads(raw).get(str(spec(pod).get("nodeName")), {})
        except (ValueError, AttributeError):
            results = {}
        if isinstance(results, Mapping) and results:
            plugins = ", ".join(f"{p}: {r}" for p, r in sorted(results.items()))
            out.append(f"gpulab-scheduler Filter on {spec(pod).get('nodeName')}: {plugins}")
    return out


# ---------------------------------------------------------------- admission


def selector_matches(selector: Mapping[str, Any] | None, obj_labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector: matchLabels AND every matchExpression; None/{} matches all."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if obj_labels.get(k) != v:
            return False
    return all(requirement_matches(obj_labels, r) for r in selector.get("matchExpressions") or [])


def _rule_matches(rule: Mapping[str, Any], resource: str, operation: str) -> bool:
    resources = rule.get("resources") or []
    ops = rule.get("operations") or []
    return (resource in resources or "*" in resources or "*/*" in resources) and (
        operation in ops or "*" in ops
    )


def webhooks_for(
    objs: ObjectSet, obj: Obj, resource: str, operation: str = "CREATE"
) -> list[tuple[str, Obj]]:
    """(configuration kind, webhook) whose rules and selectors match ``obj``."""
    ns = find(objs.namespaces, ns_of(obj))
    ns_labels = labels(ns) if ns else {"kubernetes.io/metadata.name": ns_of(obj)}
    out = []
    for kind, configs in (
        ("mutating", objs.mutating_webhooks),
        ("validating", objs.validating_webhooks),
    ):
        for config in configs:
            for hook in config.get("webhooks") or []:
                if not any(_rule_matches(r, resource, operation) for r in hook.get("rules") or []):
                    continue
                if not selector_matches(hook.get("namespaceSelector"), ns_labels):
                    continue
                if not selector_matches(hook.get("objectSelector"), labels(obj)):
                    continue
                out.append((kind, hook))
    return out


def webhook_answers(objs: ObjectSet, hook: Mapping[str, Any]) -> tuple[bool, str]:
    """Does the webhook's endpoint answer? A URL: the reader's probe. A Service: it exists
    and a Ready pod matches its selector (what kube-proxy would send the call to)."""
    cc = hook.get("clientConfig") or {}
    if cc.get("url"):
        url = str(cc["url"])
        probe = objs.probes.get(url)
        if probe is None:
            return True, f"{url} (not probed)"
        return probe == "ok", f"{url}: {probe}"
    svc_ref = cc.get("service") or {}
    name, ns = str(svc_ref.get("name", "")), str(svc_ref.get("namespace", ""))
    svc = find(objs.services, name, ns)
    if svc is None:
        return False, f"Service {ns}/{name} does not exist"
    selector = spec(svc).get("selector") or {}
    ready = [
        p
        for p in objs.pods
        if ns_of(p) == ns
        and selector
        and selector_matches({"matchLabels": selector}, labels(p))
        and _pod_ready(p)
    ]
    if not ready:
        return False, f"Service {ns}/{name} has no Ready pod behind it"
    return True, f"Service {ns}/{name} -> {name_of(ready[0])} (Ready)"


def admission_link(objs: ObjectSet, obj: Obj, resource: str) -> Link:
    hooks = webhooks_for(objs, obj, resource)
    if not hooks:
        return Link("admission", OK, f"no admission webhook matches {resource} here")
    evidence, dead = [], []
    for kind, hook in hooks:
        answers, how = webhook_answers(objs, hook)
        policy = hook.get("failurePolicy", "Fail")
        evidence.append(f"{kind} {hook.get('name')} (failurePolicy {policy}): {how}")
        if not answers:
            dead.append((hook, policy, how))
    if not dead:
        return Link("admission", OK, f"{len(hooks)} webhook(s) matched and answer", evidence)
    hook, policy, how = dead[0]
    what = (
        "new objects are rejected"
        if policy == "Fail"
        else "objects are admitted without its changes (e.g. schedulerName, suspend)"
    )
    return Link(
        "admission",
        BROKEN,
        f"webhook {hook.get('name')} does not answer ({how}); {what}",
        evidence,
        fix="bring its component back (`kubectl -n <ns> get pods` for the Service's pods), "
        "then recreate the object",
    )


# ---------------------------------------------------------------- queueing layers


def queue_links(objs: ObjectSet, pod: Obj) -> list[Link]:
    out = []
    kueue = kueue_link_for_pod(objs, pod)
    if kueue is not None:
        out.append(kueue)
    group = (annotations(pod) or {}).get(VOLCANO_GROUP)
    if group and spec(pod).get("schedulerName") == "volcano":
        out.append(volcano_podgroup_link(objs, ns_of(pod), group))
    cos = labels(pod).get(COSCHEDULING_LABEL)
    if cos:
        out.append(coscheduling_link(objs, ns_of(pod), cos))
    return out


def owner_job(objs: ObjectSet, pod: Obj) -> Obj | None:
    for name in owners(pod, "Job"):
        job = find(objs.jobs, name, ns_of(pod))
        if job is not None:
            return job
    return None


def kueue_link_for_pod(objs: ObjectSet, pod: Obj) -> Link | None:
    job = owner_job(objs, pod)
    queued_obj = job or pod
    queue = labels(queued_obj).get(QUEUE_LABEL)
    wl = next(
        (
            w
            for w in objs.workloads
            if ns_of(w) == ns_of(pod)
            and (
                (job is not None and name_of(job) in owners(w, "Job"))
                or name_of(pod) in owners(w, "Pod")
            )
        ),
        None,
    )
    if wl is not None:
        return kueue_workload_links(objs, wl)[-1]
    if queue:
        return Link(
            "kueue",
            WAITING,
            f"labelled {QUEUE_LABEL}={queue} but no Workload yet",
            fix="wait for kueue-controller to create it; if none appears, is it running?",
        )
    local_queues = [q for q in objs.local_queues if ns_of(q) == ns_of(pod)]
    if local_queues and job is not None:
        names = ", ".join(sorted(name_of(q) for q in local_queues))
        return Link(
            "kueue",
            BROKEN,
            f"Job {name_of(job)} has no {QUEUE_LABEL} label: it runs unqueued, outside the "
            f"quota of LocalQueue(s) {names} in its namespace",
            [f"Job {ns_of(job)}/{name_of(job)} labels: {dict(labels(job))}"],
            fix=f"create the Job with label {QUEUE_LABEL}={names.split(', ')[0]} (a running "
            "Job cannot join a queue: Kueue only suspends Jobs at creation)",
        )
    return None


def workload_chain(objs: ObjectSet, wl: Obj) -> list[Link]:
    job = next(
        (j for j in objs.jobs if ns_of(j) == ns_of(wl) and name_of(j) in owners(wl, "Job")), None
    )
    links = [admission_link(objs, job, "jobs")] if job else []
    links += kueue_workload_links(objs, wl)
    pods = [
        p
        for p in objs.pods
        if ns_of(p) == ns_of(wl)
        and (
            (job is not None and name_of(job) in owners(p, "Job"))
            or name_of(p) in owners(wl, "Pod")
        )
    ]
    if pods and condition(wl, "Admitted").get("status") == "True":
        pending = [p for p in pods if not spec(p).get("nodeName")]
        if pending:
            chain = pod_chain(objs, pending[0])
            links += [
                replace_name(link, f"pod {name_of(pending[0])}: {link.name}") for link in chain
            ]
        else:
            links.append(Link("pods", OK, f"{len(pods)} pod(s) bound"))
    return links


def replace_name(link: Link, name: str) -> Link:
    return Link(name, link.state, link.summary, link.evidence, link.fix)


def kueue_workload_links(objs: ObjectSet, wl: Obj) -> list[Link]:
    """LocalQueue → ClusterQueue → flavors → the Workload's own conditions."""
    ns = ns_of(wl)
    lq_name = str(spec(wl).get("queueName", ""))
    lq = find(objs.local_queues, lq_name, ns)
    links: list[Link] = []
    if lq is None:
        links.append(
            Link(
                "kueue",
                BROKEN,
                f"LocalQueue {ns}/{lq_name} does not exist",
                _wl_evidence(wl),
                fix=f"create LocalQueue {lq_name} in {ns} or fix the Job's {QUEUE_LABEL}",
            )
        )
        return links
    cq_name = str(spec(lq).get("clusterQueue", ""))
    cq = find(objs.cluster_queues, cq_name)
    if cq is None:
        active = condition(lq, "Active")
        links.append(
            Link(
                "kueue",
                BROKEN,
                f"LocalQueue {ns}/{lq_name} names ClusterQueue {cq_name}, which does not exist",
                [
                    f"LocalQueue Active={active.get('status')} ({active.get('reason')}: "
                    f"{active.get('message')})",
                    *_wl_evidence(wl),
                ],
                fix=f"create ClusterQueue {cq_name} (a LocalQueue's spec.clusterQueue is "
                f"immutable; or recreate the LocalQueue naming one of "
                f"{_names(objs.cluster_queues)}), or relabel the suspended Job "
                f"{QUEUE_LABEL}=<a LocalQueue with room>: its Workload moves there",
            )
        )
        return links
    cq_links = cluster_queue_links(objs, cq)
    broken = next((link for link in cq_links if link.state == BROKEN), None)
    if broken is not None:
        links.append(
            Link(
                "kueue",
                BROKEN,
                f"Workload waits in ClusterQueue {cq_name}: {broken.summary}",
                _wl_evidence(wl) + broken.evidence,
                fix=broken.fix,
            )
        )
        return links
    links.append(_workload_state(objs, wl, cq))
    return links


def _wl_evidence(wl: Obj) -> list[str]:
    out = []
    for kind in ("QuotaReserved", "Admitted", "Evicted", "Finished"):
        c = condition(wl, kind)
        if c:
            out.append(f"Workload {kind}={c.get('status')} {c.get('reason')}: {c.get('message')}")
    return out


def _workload_state(objs: ObjectSet, wl: Obj, cq: Obj) -> Link:
    name = f"Workload {ns_of(wl)}/{name_of(wl)}"
    if condition(wl, "Finished").get("status") == "True":
        return Link("kueue", OK, f"{name} finished", _wl_evidence(wl))
    if condition(wl, "Admitted").get("status") == "True":
        return Link("kueue", OK, f"{name} admitted to ClusterQueue {name_of(cq)}", _wl_evidence(wl))
    reserved = condition(wl, "QuotaReserved")
    if reserved.get("status") == "True":
        return Link(
            "kueue",
            WAITING,
            f"{name} holds quota, waiting for its admission checks",
            _wl_evidence(wl),
        )
    why = str(reserved.get("message") or "not yet evaluated")
    evidence = _wl_evidence(wl)
    over = _over_quota(cq)
    if over:
        evidence += over
        return Link(
            "kueue",
            BROKEN,
            f"{name} waits for quota in {name_of(cq)}, whose nominal quota is now below what its "
            "admitted Workloads hold (the quota was lowered while they ran; Kueue does not "
            "evict for that)",
            evidence,
            fix=f"restore ClusterQueue {name_of(cq)}'s nominalQuota, or let the admitted "
            "Workloads finish: the quota they hold returns only then",
        )
    if reserved.get("status") == "False" and reserved.get("reason") in (
        "Inadmissible",
        "Misconfigured",
    ):
        return Link(
            "kueue", BROKEN, f"{name} is inadmissible: {why}", evidence, fix=_kueue_fix(why)
        )
    return Link(
        "kueue",
        BROKEN if reserved.get("status") == "False" else WAITING,
        f"{name} is not admitted: {why}",
        evidence,
        fix=_kueue_fix(why),
    )


def _names(objs: Iterable[Obj]) -> str:
    return ", ".join(sorted(name_of(o) for o in objs)) or "none"


def _kueue_fix(why: str) -> str:
    if "insufficient" in why.lower() or "quota" in why.lower():
        return (
            "wait for admitted Workloads to finish, raise the ClusterQueue's nominalQuota, "
            "or let it borrow in a cohort"
        )
    return "read the Workload's QuotaReserved message and fix the queue setting it names"


def _quantity(value: Any) -> Decimal:
    try:
        return Decimal(parse_quantity(value if value is not None else 0))
    except (ValueError, TypeError):
        return Decimal(0)


def _over_quota(cq: Obj) -> list[str]:
    """(flavor, resource) whose usage exceeds nominal quota plus what it could borrow."""
    usage = {
        (f.get("name"), r.get("name")): _quantity(r.get("total"))
        for f in status(cq).get("flavorsUsage") or []
        for r in f.get("resources") or []
    }
    out = []
    cohort = spec(cq).get("cohortName") or spec(cq).get("cohort")
    for group in spec(cq).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                nominal = _quantity(r.get("nominalQuota"))
                used = usage.get((flavor.get("name"), r.get("name")), Decimal(0))
                if used > nominal and not cohort:
                    out.append(
                        f"ClusterQueue {name_of(cq)}: {r.get('name')} in flavor "
                        f"{flavor.get('name')}: usage {used} > nominalQuota {nominal}"
                    )
    return out


def cluster_queue_links(objs: ObjectSet, cq: Obj) -> list[Link]:
    name = name_of(cq)
    active = condition(cq, "Active")
    flavors = [
        str(f.get("name"))
        for g in spec(cq).get("resourceGroups") or []
        for f in g.get("flavors") or []
    ]
    missing = [f for f in flavors if find(objs.resource_flavors, f) is None]
    evidence = (
        [
            f"ClusterQueue Active={active.get('status')} {active.get('reason')}: "
            f"{active.get('message')}"
        ]
        if active
        else []
    )
    links = []
    if missing:
        links.append(
            Link(
                "clusterqueue",
                BROKEN,
                f"ClusterQueue {name} is inactive: ResourceFlavor {', '.join(missing)} does not "
                f"exist ({active.get('reason', 'FlavorNotFound')})",
                evidence,
                fix=f"create ResourceFlavor {missing[0]} (kueue.x-k8s.io/v1beta2) or rename the "
                f"flavor in the ClusterQueue to an existing one ({_names(objs.resource_flavors)})",
            )
        )
    elif active.get("status") == "False":
        links.append(
            Link(
                "clusterqueue",
                BROKEN,
                f"ClusterQueue {name} is inactive: {active.get('reason')}: {active.get('message')}",
                evidence,
                fix="fix what the Active condition's reason names",
            )
        )
    else:
        links.append(
            Link("clusterqueue", OK if active else WAITING, f"ClusterQueue {name} active", evidence)
        )
    over = _over_quota(cq)
    if over:
        links.append(
            Link(
                "quota",
                WAITING,
                "usage above nominal quota: admitted Workloads keep what they hold after a "
                "quota change; new ones wait until usage falls below it",
                over,
            )
        )
    return links


def volcano_podgroup_link(objs: ObjectSet, ns: str, name: str) -> Link:
    pg = find(objs.volcano_podgroups, name, ns)
    if pg is None:
        return Link(
            "volcano",
            BROKEN,
            f"Volcano PodGroup {ns}/{name} does not exist",
            fix=f"create it (a vcjob's controller does) or fix the pod's {VOLCANO_GROUP}",
        )
    phase = status(pg).get("phase", "")
    queue_name = str(spec(pg).get("queue") or "default")
    queue = find(objs.volcano_queues, queue_name)
    evidence = [
        f"PodGroup phase {phase}, minMember {spec(pg).get('minMember', 1)}, queue {queue_name}"
    ]
    for c in status(pg).get("conditions") or []:
        evidence.append(
            f"condition {c.get('type')}={c.get('status')} {c.get('reason', '')}: "
            f"{c.get('message', '')}"
        )
    if queue is None:
        return Link(
            "volcano",
            BROKEN,
            f"Queue {queue_name} does not exist",
            evidence,
            fix=f"create Queue {queue_name} or set the job's queue to an existing one",
        )
    qstate = status(queue).get("state", "Open")
    if qstate != "Open":
        return Link(
            "volcano",
            BROKEN,
            f"Queue {queue_name} is {qstate}: it takes no new jobs",
            evidence,
            fix=f"open it again: `vcctl queue operate -n {queue_name} -a open` (a "
            "bus.volcano.sh Command OpenQueue)",
        )
    bound = sum(1 for p in volcano_members(objs, pg) if spec(p).get("nodeName"))
    if phase == "Inqueue" and bound >= int(spec(pg).get("minMember") or 1):
        # getPodGroupPhase counts Bound/Running tasks, not Binding ones: the session that
        # binds a gang leaves it Inqueue, the next one writes Running
        evidence.append(f"{bound} member(s) bound: Running from vc-scheduler's next session")
        phase = "Running"
    if phase in ("Running", "Unknown"):
        half = _half_world(objs, pg, evidence)
        if half is not None:
            return half
    if phase == "Unknown":
        return _unknown_gang(objs, pg, evidence)
    if phase in ("Running", "Completed"):
        return Link("volcano", OK, f"PodGroup {ns}/{name} {phase}", evidence)
    notes = [
        str(c.get("message"))
        for c in status(pg).get("conditions") or []
        if c.get("type") == "Unschedulable" and c.get("status") == "True"
    ] + [
        message(e)
        for e in events_about(objs.events, "PodGroup", name, ns)
        if e.get("reason") == "Unschedulable"
    ][-2:]
    evidence += [f"Unschedulable: {n}" for n in notes]
    over = _over_capability(pg, queue)
    if phase in ("", "Pending") and over:
        return Link(
            "volcano",
            BROKEN,
            f"gang {ns}/{name} needs {over} at once, more than Queue {queue_name}'s capability: "
            "enqueue never lets it in",
            evidence,
            fix=f"raise Queue {queue_name}'s spec.capability, or make the job smaller "
            "(minAvailable x each task's request)",
        )
    waits = _enqueue_wait(objs, pg, queue, evidence) if phase in ("", "Pending") else None
    if waits is not None:
        return waits
    if notes:
        return Link(
            "volcano",
            BROKEN,
            f"gang {ns}/{name} ({phase or 'Pending'}) cannot be placed whole: {notes[-1]}",
            evidence,
            fix="free or add what the gang needs (it binds only when minMember tasks fit at "
            "once), or lower minAvailable if the job can start with fewer",
        )
    return Link("volcano", WAITING, f"PodGroup {ns}/{name} {phase or 'Pending'}", evidence)


# vcjob plugins that give a job a fixed world (volcano v1.15.1 pkg/controllers/job/plugins/
# distributed-framework): each role's flag and default task name. pytorch: WORLD_SIZE =
# master + worker replicas; mpi: the hostfile of every worker, launched from the master;
# tensorflow: TF_CONFIG's cluster spec of ps, worker, chief and evaluator.
WORLD_PLUGINS = {
    "pytorch": (("master", "master"), ("worker", "worker")),
    "mpi": (("master", "master"), ("worker", "worker")),
    "tensorflow": (
        ("ps", "ps"),
        ("worker", "worker"),
        ("chief", "chief"),
        ("evaluator", "evaluator"),
    ),
}
VOLCANO_JOB_NAME = "volcano.sh/job-name"
QUEUE_INSUFFICIENT = "queue resource quota insufficient"  # proportion's enqueue refusal


def volcano_job_of(objs: ObjectSet, pg: Obj) -> Obj | None:
    """The vcjob whose controller made the PodGroup (its controller reference)."""
    for ref in meta(pg).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch.volcano"):
            return find(objs.volcano_jobs, str(ref.get("name")), ns_of(pg))
    return None


def job_world(job: Obj) -> tuple[str, int, str] | None:
    """(plugin, world size, its parts) when a plugin of the vcjob makes a fixed world of
    ranks: every one of them must run before any trains."""
    plugins = spec(job).get("plugins") or {}
    replicas = {
        str(t.get("name")): int(t.get("replicas") or 0) for t in spec(job).get("tasks") or []
    }
    for plugin, roles in WORLD_PLUGINS.items():
        if plugin not in plugins:
            continue
        args = [str(a) for a in plugins.get(plugin) or []]
        names = []
        for flag, default in roles:
            given = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
            names.append(given[-1] if given else default)
        parts = [(n, replicas[n]) for n in dict.fromkeys(names) if replicas.get(n)]
        world = sum(r for _, r in parts)
        if world:
            return plugin, world, " + ".join(f"{n} {r}" for n, r in parts)
    return None


def volcano_members(objs: ObjectSet, pg: Obj) -> list[Obj]:
    """The PodGroup's live pods (its scheduling.k8s.io/group-name annotation)."""
    return [
        p
        for p in objs.pods
        if ns_of(p) == ns_of(pg)
        and annotations(p).get(VOLCANO_GROUP) == name_of(pg)
        and not meta(p).get("deletionTimestamp")
        and status(p).get("phase") not in ("Succeeded", "Failed")
    ]


def _pending_reason(objs: ObjectSet, pods: list[Obj]) -> str:
    """Why the first Pending member fits nowhere: the nodes its selector allows, with
    what each lacks (the Filter re-derived), else vc-scheduler's PodScheduled message."""
    if not pods:
        return "none Pending"
    verdicts = [v for v in node_verdicts(objs, pods[0]) if "selector" not in v.fails]
    if verdicts and all(v.fails for v in verdicts):
        return "; ".join(f"{v.node}: {next(iter(v.fails.values()))}" for v in verdicts[:4])
    c = condition(pods[0], "PodScheduled")
    return str(c.get("message") or "not placed yet")


def _half_world(objs: ObjectSet, pg: Obj, evidence: list[str]) -> Link | None:
    """A gang smaller than its job's world: Volcano commits it at minMember and is done;
    its ranks wait for the rest of the world, holding their GPUs."""
    job = volcano_job_of(objs, pg)
    world = job_world(job) if job is not None else None
    if job is None or world is None:
        return None
    plugin, size, parts = world
    min_member = int(spec(pg).get("minMember") or 1)
    members = volcano_members(objs, pg)
    pending = [p for p in members if not spec(p).get("nodeName")]
    running = len(members) - len(pending)
    if min_member >= size or not pending or not running:
        return None
    ns, name, job_name = ns_of(pg), name_of(pg), name_of(job)
    reason = _pending_reason(objs, pending)
    evidence += [
        f"vcjob {ns}/{job_name}: minAvailable {spec(job).get('minAvailable')}, plugin {plugin}: "
        f"world {parts} = {size}",
        f"{running} member(s) bound, {len(pending)} Pending: {reason}",
    ]
    others = []
    for other in objs.volcano_podgroups:
        if other is pg or status(other).get("phase") not in ("Running", "Unknown"):
            continue
        theirs = volcano_members(objs, other)
        bound = sum(1 for p in theirs if spec(p).get("nodeName"))
        if bound and bound < len(theirs):
            owner = volcano_job_of(objs, other)
            others.append(f"{name_of(owner) if owner else name_of(other)} ({bound}/{len(theirs)})")
    held = f"; half of another job holds the rest: {', '.join(others)}" if others else ""
    size_patch = json.dumps({"spec": {"minAvailable": size}}, separators=(",", ":"))
    fix = (
        f"make the gang the world: `kubectl -n {ns} patch vcjob {job_name} --type merge -p "
        f"'{size_patch}'`"
        + (f" (and {', '.join(o.split(' ')[0] for o in others)})" if others else "")
        + ". Volcano then marks the half gang Unknown; "
        + (
            "the job's policy (Unknown -> RestartJob) restarts it, and enqueue lets one whole "
            "gang in at a time"
            if _has_policy(job, "Unknown")
            else "a vcjob without an `Unknown` policy waits for you: restart it "
            f"(`vcctl job suspend -N {job_name} -n {ns}`, then `vcctl job resume`)"
        )
    )
    return Link(
        "volcano",
        BROKEN,
        f"gang {ns}/{name} is {min_member} of a {size}-rank world: Volcano committed it at "
        f"minMember {min_member} ({status(pg).get('phase')}), but the {plugin} plugin's world "
        f"is {parts}; {running} rank(s) hold their GPUs waiting for {len(pending)} Pending "
        f"({reason}){held}",
        evidence,
        fix=fix,
    )


def _has_policy(job: Obj, event: str) -> bool:
    for policy in spec(job).get("policies") or []:
        events = [*(policy.get("events") or []), policy.get("event")]
        if (event in events or "*" in events) and policy.get("action") == "RestartJob":
            return True
    return False


def _unknown_gang(objs: ObjectSet, pg: Obj, evidence: list[str]) -> Link:
    """PodGroup phase Unknown: members run, the rest of minMember cannot be placed."""
    ns, name = ns_of(pg), name_of(pg)
    members = volcano_members(objs, pg)
    pending = [p for p in members if not spec(p).get("nodeName")]
    running = len(members) - len(pending)
    min_member = int(spec(pg).get("minMember") or 1)
    job = volcano_job_of(objs, pg)
    why = _pending_reason(objs, pending)
    summary = (
        f"gang {ns}/{name} is Unknown: {running} of minMember {min_member} run, "
        f"{len(pending)} cannot be placed ({why}); Volcano leaves such a gang to its job's "
        "controller"
    )
    if job is not None and _has_policy(job, "Unknown"):
        return Link(
            "volcano",
            WAITING,
            summary + f": vcjob {name_of(job)}'s policy (Unknown -> RestartJob) restarts it",
            evidence,
        )
    return Link(
        "volcano",
        BROKEN,
        summary,
        evidence,
        fix="free what the Pending members need, or restart the job whole (`vcctl job suspend` "
        "then `resume`); a vcjob created with the policy {event: Unknown, action: RestartJob} "
        "does that itself (policies are fixed at creation)",
    )


def _enqueue_wait(objs: ObjectSet, pg: Obj, queue: Obj, evidence: list[str]) -> Link | None:
    """A Pending gang that enqueue keeps out because whole gangs in its queue hold the
    room: it waits its turn (nothing is wrong)."""
    ns, name = ns_of(pg), name_of(pg)
    refusals = [
        e
        for e in events_about(objs.events, "PodGroup", name, ns)
        if e.get("reason") == "Unschedulable" and message(e).startswith(QUEUE_INSUFFICIENT)
    ]
    if not refusals:
        return None
    queue_name = name_of(queue)
    holders = []
    for other in objs.volcano_podgroups:
        if other is pg or str(spec(other).get("queue") or "default") != queue_name:
            continue
        if status(other).get("phase") != "Running":
            continue
        theirs = volcano_members(objs, other)
        bound = sum(1 for p in theirs if spec(p).get("nodeName"))
        if bound < len(theirs) or not theirs:
            return None  # a partly placed gang holds room: not simply a turn to wait for
        holders.append(f"{ns_of(other)}/{name_of(other)} ({bound} running)")
    if not holders:
        return None
    evidence.append(f"enqueue: {message(refusals[-1])}")
    return Link(
        "volcano",
        WAITING,
        f"gang {ns}/{name} waits in enqueue: Queue {queue_name} has no room for its "
        f"minResources while {', '.join(holders)} run; it is let in when they finish",
        evidence,
    )


def _over_capability(pg: Obj, queue: Obj) -> str:
    """The first resource of the PodGroup's minResources above its Queue's capability."""
    capability = spec(queue).get("capability") or {}
    for r, v in (spec(pg).get("minResources") or {}).items():
        if r in capability and _quantity(v) > _quantity(capability[r]):
            return f"{v} {r} (capability {capability[r]})"
    return ""


def coscheduling_link(objs: ObjectSet, ns: str, name: str) -> Link:
    pg = find(objs.coscheduling_podgroups, name, ns)
    if pg is None:
        return Link(
            "coscheduling",
            BROKEN,
            f"PodGroup {ns}/{name} (scheduling.x-k8s.io) does not exist: Coscheduling rejects "
            "its pods at PreFilter",
            fix=f"create PodGroup {name} with minMember, or fix the pods' {COSCHEDULING_LABEL}",
        )
    gang = gang_state(objs, pg)
    min_member = gang.min_member
    timeout = spec(pg).get("scheduleTimeoutSeconds")
    evidence = [
        f"PodGroup phase {status(pg).get('phase') or '-'}, minMember {min_member}, members "
        f"{len(gang.members)}, bound {gang.bound}, scheduleTimeoutSeconds "
        f"{timeout if timeout is not None else '(the plugin default)'}",
        *(f"{w} waits at Permit: {note}" for w, note in gang.waiting.items()),
        *(f"{p}: FailedScheduling: {note[:120]}" for p, note in gang.failed.items()),
    ]
    if len(gang.members) < min_member:
        return Link(
            "coscheduling",
            BROKEN,
            f"PodGroup {ns}/{name} has {len(gang.members)} of minMember {min_member} pods: "
            "PreFilter rejects them until the rest exist",
            evidence,
            fix="create the missing members or lower minMember",
        )
    if gang.bound >= min_member:
        return Link(
            "coscheduling", OK, f"gang {ns}/{name}: {gang.bound}/{min_member} bound", evidence
        )
    others = [
        g
        for g in (gang_state(objs, o) for o in objs.coscheduling_podgroups if o is not pg)
        if g.holds and not g.complete
    ]
    if gang.holds and others:
        mine = f"{ns}/{name} holds {gang.holding_text()}"
        theirs = "; ".join(f"{g.key} holds {g.holding_text()}" for g in others)
        return Link(
            "coscheduling",
            BROKEN,
            f"gang deadlock: {mine}, {theirs}: each holds what the other needs to complete",
            evidence,
            fix="a gang that cannot complete must let go: give the PodGroups a short "
            "scheduleTimeoutSeconds (or none: the plugin's permitWaitingTimeSeconds), then "
            "restart gpulab-scheduler so waiting pods drop the timers they started with; "
            "minMember must be the members the job needs to start",
        )
    if gang.waiting:
        return Link(
            "coscheduling",
            WAITING,
            f"gang {ns}/{name}: {len(gang.waiting)} member(s) wait at Permit for the rest",
            evidence,
        )
    return Link(
        "coscheduling", WAITING, f"gang {ns}/{name}: {gang.bound}/{min_member} bound", evidence
    )


@dataclass
class GangState:
    """A Coscheduling gang as its members' Events show it: bound members, members waiting
    at Permit (reserved in the scheduler's cache, holding their node's devices), members
    the last cycle found no node for."""

    key: str
    min_member: int
    members: list[str]
    bound: int
    waiting: dict[str, str]
    failed: dict[str, str]

    @property
    def holds(self) -> bool:
        return self.bound + len(self.waiting) > 0

    @property
    def complete(self) -> bool:
        return self.bound >= self.min_member

    def holding_text(self) -> str:
        parts = []
        if self.bound:
            parts.append(f"{self.bound} bound")
        if self.waiting:
            parts.append(f"{len(self.waiting)} waiting at Permit")
        return f"{' + '.join(parts)} of {self.min_member}"


# the scheduler's steps that say where a pod's last attempt ended
_ATTEMPT_STEPS = ("Permit", "WaitOnPermit", "FailedScheduling", "Scheduled", "Bind")


def gang_state(objs: ObjectSet, pg: Obj) -> GangState:
    ns, name = ns_of(pg), name_of(pg)
    members = [
        p
        for p in objs.pods
        if ns_of(p) == ns
        and labels(p).get(COSCHEDULING_LABEL) == name
        and status(p).get("phase") not in ("Succeeded", "Failed")
    ]
    waiting, failed = {}, {}
    bound = 0
    for p in members:
        if spec(p).get("nodeName"):
            bound += 1
            continue
        steps = [
            e
            for e in events_about(objs.events, "Pod", name_of(p), ns)
            if e.get("reason") in _ATTEMPT_STEPS
        ]
        if not steps:
            continue
        last = steps[-1]
        if last.get("reason") == "Permit" and "Wait" in message(last):
            waiting[name_of(p)] = message(last)
        elif last.get("reason") == "FailedScheduling":
            failed[name_of(p)] = message(last)
    return GangState(
        f"{ns}/{name}",
        int(spec(pg).get("minMember") or 1),
        [name_of(p) for p in members],
        bound,
        waiting,
        failed,
    )


def podgroup_chain(objs: ObjectSet, t: Target) -> list[Link]:
    links = []
    if find(objs.volcano_podgroups, t.name, t.namespace):
        links.append(volcano_podgroup_link(objs, t.namespace, t.name))
    if find(objs.coscheduling_podgroups, t.name, t.namespace):
        links.append(coscheduling_link(objs, t.namespace, t.name))
    if not links:
        return [_missing(t)]
    members = [
        p
        for p in objs.pods
        if ns_of(p) == t.namespace
        and (
            labels(p).get(COSCHEDULING_LABEL) == t.name
            or annotations(p).get(VOLCANO_GROUP) == t.name
        )
    ]
    pending = [p for p in members if not spec(p).get("nodeName")]
    if pending and all(link.state != BROKEN for link in links):
        links += [
            replace_name(link, f"pod {name_of(pending[0])}: {link.name}")
            for link in pod_chain(objs, pending[0])
            if link.name not in ("coscheduling", "volcano")
        ]
    return links


# ---------------------------------------------------------------- scheduler


def scheduler_link(objs: ObjectSet, pod: Obj) -> Link:
    name = str(spec(pod).get("schedulerName") or DEFAULT_SCHEDULER)
    own = [
        e for e in events_about(objs.events, "Pod", name_of(pod), ns_of(pod)) if reporter(e) == name
    ]
    evidence = [f"spec.schedulerName {name}"]
    if own:
        last = own[-1]
        evidence.append(f"last Event from {name}: {last.get('reason')} ({event_time(last)})")
    if spec(pod).get("nodeName"):
        return Link("scheduler", OK, f"{name} placed it", evidence)
    if own:
        return Link("scheduler", OK, f"{name} runs and tried it", evidence)
    component = SCHEDULER_PODS.get(name)
    if component is not None:
        pods = [p for p in objs.pods if labels(p).get("app.kubernetes.io/name") == component]
        if pods and not any(_pod_ready(p) for p in pods):
            return Link(
                "scheduler",
                BROKEN,
                f"no {component} pod is Ready",
                evidence,
                fix=f"`kubectl -n {ns_of(pods[0])} describe pod {name_of(pods[0])}` and its logs",
            )
        if pods:
            return Link("scheduler", WAITING, f"{name} runs; no decision on this pod yet", evidence)
    if name == DEFAULT_SCHEDULER or component is not None or _lease_holder(objs, name):
        return Link("scheduler", WAITING, f"no decision from {name} on this pod yet", evidence)
    return Link(
        "scheduler",
        BROKEN,
        f"no scheduler named {name} has written anything about this pod",
        evidence,
        fix=f"run a scheduler whose profile is named {name}, or fix spec.schedulerName "
        "(it cannot change on a pod: recreate it)",
    )


def _lease_holder(objs: ObjectSet, name: str) -> bool:
    return any(name_of(lease) == name for lease in objs.leases)


# ---------------------------------------------------------------- filter + node


@dataclass
class NodeVerdict:
    """One node against the pod: every Filter that rejects it, in kube-scheduler's plugin
    order (``kind -> reason``; kinds: unschedulable, taint, selector, resources)."""

    node: str
    fails: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return next(iter(self.fails), "fit")

    @property
    def reason(self) -> str:
        return next(iter(self.fails.values()), "")


def extended_requests(pod: Obj) -> dict[str, int]:
    return {
        r: int(v) for r, v in pod_requests(pod).items() if is_extended_resource_name(r) and v > 0
    }


def node_verdicts(objs: ObjectSet, pod: Obj) -> list[NodeVerdict]:
    """kube-scheduler's Filter per node (NodeUnschedulable, TaintToleration, NodeAffinity,
    NodeResourcesFit), from the framework chapter's fit functions (the same feasible nodes
    as kube-scheduler v1.36.3); every failing plugin is kept, not only the first."""
    others = [p for p in objs.pods if meta(p).get("uid") != meta(pod).get("uid")]
    snapshot = new_snapshot(objs.nodes, others)
    request = pod_request(pod)
    out = []
    for info in snapshot:
        node = info.node
        v = NodeVerdict(info.name)
        if not node_unschedulable_fits(pod, node):
            v.fails["unschedulable"] = "node(s) were unschedulable"
        taint = untolerated_taint(pod, node)
        if taint is not None:
            v.fails["taint"] = (
                f"untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}} "
                f"({taint.get('effect')})"
            )
        if not node_affinity_matches(pod, node):
            v.fails["selector"] = "didn't match Pod's node affinity/selector"
        lacks = fits_request(request, info)
        if lacks:
            v.fails["resources"] = ", ".join(i.reason for i in lacks)
        out.append(v)
    return out


def filter_and_node_links(objs: ObjectSet, pod: Obj) -> tuple[Link, Link]:
    evs = events_about(objs.events, "Pod", name_of(pod), ns_of(pod))
    failed = [e for e in evs if e.get("reason") == "FailedScheduling"]
    evidence = []
    if failed:
        evidence.append(f"FailedScheduling ({reporter(failed[-1])}): {message(failed[-1])[:300]}")
        counts = scheduler_reasons(message(failed[-1]))
        if counts:
            evidence.append("per reason: " + "; ".join(f"{r}: {n}" for r, n in counts))
    step = [e for e in evs if e.get("reason") == "Filter" and e.get("type") == "Warning"]
    if step:
        evidence.append(f"{reporter(step[-1])} Filter: {message(step[-1])[:400]}")
    hami = filter_record(pod)
    gates = [g.get("name") for g in spec(pod).get("schedulingGates") or []]
    if gates:
        waiting = Link(
            "filter", WAITING, f"scheduling gates {', '.join(map(str, gates))} hold it", evidence
        )
        return waiting, Link("node", SKIPPED, "not scheduled yet")
    verdicts = node_verdicts(objs, pod)
    want = extended_requests(pod)
    evidence += [f"{v.node}: {v.reason or 'fits'}" for v in verdicts]
    if hami:
        rows = [n for n in hami.get("nodes") or [] if isinstance(n, Mapping)]
        evidence += [
            f"HAMi Filter {r.get('node')}: {'fits' if r.get('fit') else r.get('reason')}"
            for r in rows
        ]
        unfit = [r for r in rows if not r.get("fit")]
        if rows and len(unfit) == len(rows):
            return _hami_filter(objs, pod, unfit, evidence), Link("node", SKIPPED, "no node chosen")
    node_link = _candidate_node_link(objs, pod, verdicts, want)
    if not failed and not step and not hami and any(v.kind == "fit" for v in verdicts):
        return Link("filter", WAITING, "not tried yet; a node fits", evidence), node_link
    fits = [v for v in verdicts if v.kind == "fit"]
    if fits:
        return Link(
            "filter",
            WAITING,
            f"{len(fits)} node(s) fit now ({', '.join(v.node for v in fits[:4])}); "
            "waiting for the next attempt",
            evidence,
        ), node_link
    return _filter_cause(objs, pod, verdicts, want, evidence, node_link), node_link


def _filter_cause(
    objs: ObjectSet,
    pod: Obj,
    verdicts: list[NodeVerdict],
    want: Mapping[str, int],
    evidence: list[str],
    node_link: Link,
) -> Link:
    placeable = [v for v in verdicts if not {"selector", "unschedulable"} & set(v.fails)]
    if not placeable:
        if any("selector" in v.fails for v in verdicts):
            return Link(
                "filter",
                BROKEN,
                "no node matches the pod's node selector/affinity" + _selector_hint(objs, pod),
                evidence,
                fix="select a label value that exists (see above) or label the node that "
                "should run it",
            )
        return Link(
            "filter", BROKEN, "the nodes are cordoned", evidence, fix="`kubectl uncordon NODE`"
        )
    untainted = [v for v in placeable if "taint" not in v.fails]
    if not untainted:
        taint = placeable[0]
        return Link(
            "filter",
            BROKEN,
            f"the nodes that could run it are tainted: {taint.node} has {taint.fails['taint']}",
            evidence,
            fix=f"add a toleration for {taint.fails['taint'].removeprefix('untolerated taint ')} "
            "to the pod template, or remove the taint if the node should take any pod",
        )
    if node_link.state == BROKEN:
        return Link("filter", BLOCKED, "no node has the free devices: see the node link", evidence)
    for r, n in want.items():
        caps = [
            int(_quantity((status(find(objs.nodes, v.node) or {}).get("capacity") or {}).get(r)))
            for v in untainted
        ]
        biggest = max(caps, default=0)
        if biggest < n:
            return Link(
                "filter",
                BROKEN,
                f"asks {n} {r}; the largest node it may run on has {biggest}",
                evidence,
                fix=f"ask for at most {biggest} {r} per pod (split the work over several "
                "pods), or add a node with more",
            )
    holders = _holders(objs, [v.node for v in untainted], want)
    return Link(
        "filter",
        BROKEN,
        "every node it may run on has its devices in use"
        + (f" (by {', '.join(holders[:6])})" if holders else ""),
        evidence,
        fix="wait for those pods to finish, or free devices; a gang or queue above "
        "decides who goes first",
    )


def _selector_hint(objs: ObjectSet, pod: Obj) -> str:
    selector = spec(pod).get("nodeSelector") or {}
    parts = []
    for key, value in selector.items():
        have = sorted({labels(n).get(key) for n in objs.nodes if labels(n).get(key)})
        if value not in have:
            parts.append(
                f"{key}={value} is on no node; values present: {', '.join(have) or 'none'}"
            )
    return (": " + "; ".join(parts)) if parts else ""


def _holders(objs: ObjectSet, nodes: Iterable[str], want: Mapping[str, int]) -> list[str]:
    nodes = set(nodes)
    out = []
    for p in objs.pods:
        live = status(p).get("phase") not in ("Succeeded", "Failed")
        if (
            spec(p).get("nodeName") in nodes
            and live
            and any(extended_requests(p).get(r) for r in want)
        ):
            out.append(f"{ns_of(p)}/{name_of(p)}")
    return sorted(out)


def _hami_filter(
    objs: ObjectSet, pod: Obj, unfit: list[Mapping[str, Any]], evidence: list[str]
) -> Link:
    reasons = " ".join(str(r.get("reason")) for r in unfit)
    use = annotations(pod).get(HAMI_USE_TYPE)
    if "CardTypeMismatch" in reasons and use:
        types = sorted(_hami_types(objs))
        return Link(
            "filter",
            BROKEN,
            f"HAMi Filter: {HAMI_USE_TYPE}={use} matches no GPU type (CardTypeMismatch on the "
            "HAMi nodes)",
            [*evidence, f"registered GPU types: {', '.join(types) or 'none'}"],
            fix=f"set {HAMI_USE_TYPE} to a substring of a registered type "
            f"({', '.join(types) or 'none'}) or drop the annotation",
        )
    return Link(
        "filter",
        BROKEN,
        "HAMi Filter: no node fits ("
        + "; ".join(f"{r.get('node')}: {r.get('reason')}" for r in unfit[:4])
        + ")",
        evidence,
        fix="ask for less gpumem/gpucores, or wait for shares to free up",
    )


def _hami_types(objs: ObjectSet) -> set[str]:
    out = set()
    for n in objs.nodes:
        raw = annotations(n).get(HAMI_REGISTER)
        if not raw:
            continue
        try:
            out |= {str(d.get("type")) for d in json.loads(raw) if isinstance(d, dict)}
        except (ValueError, TypeError):
            continue
    return out


def _candidate_node_link(
    objs: ObjectSet, pod: Obj, verdicts: list[NodeVerdict], want: Mapping[str, int]
) -> Link:
    """The node side of an unscheduled pod: a node its selectors and tolerations allow
    whose device plugin does not offer what the pod asks for (devices Unhealthy, the
    plugin gone, or the resource under another name)."""
    eligible = [v for v in verdicts if set(v.fails) <= {"resources"}]
    if not want:
        return Link("node", SKIPPED, "asks for no device")
    if not eligible:
        return Link("node", SKIPPED, "no node passes the pod's selectors and tolerations")
    for v in eligible:
        node = find(objs.nodes, v.node)
        for r, n in want.items():
            if node is None:
                continue
            cap = int(_quantity((status(node).get("capacity") or {}).get(r)))
            alloc = int(_quantity((status(node).get("allocatable") or {}).get(r)))
            if alloc < n and (cap >= n or cap == 0):
                finding = mig_side(objs, node, r) or device_side(objs, node, r)
                if finding is not None:
                    return finding
    return Link("node", OK, "the nodes it may run on advertise what it asks for")


def renamed(node: Obj, resource: str) -> list[str]:
    """Resources of the same vendor the node advertises instead (``nvidia.com/gpu.shared``
    from a time-slicing config with renameByDefault, ``nvidia.com/mig-1g.10gb`` under the
    mixed MIG strategy)."""
    vendor = resource.split("/")[0]
    return sorted(
        f"{k}={v}"
        for k, v in (status(node).get("capacity") or {}).items()
        if k != resource and k.split("/")[0] == vendor and _quantity(v) > 0
    )


def node_summary(objs: ObjectSet, node: Obj, resource: str) -> str:
    cap = (status(node).get("capacity") or {}).get(resource, "-")
    alloc = (status(node).get("allocatable") or {}).get(resource, "-")
    return f"{name_of(node)}: {resource} capacity {cap}, allocatable {alloc}"


def _node_events(objs: ObjectSet, node: str) -> list[Obj]:
    return events_about(objs.events, "Node", node)


def plugin_pods(objs: ObjectSet, node: str) -> list[Obj]:
    return [
        p
        for p in objs.pods
        if spec(p).get("nodeName") == node
        and (
            labels(p).get("app.kubernetes.io/name") in DEVICE_PLUGIN_PODS
            or labels(p).get("app") in DEVICE_PLUGIN_PODS
        )
    ]


def device_side(objs: ObjectSet, node: Obj, resource: str) -> Link | None:
    """Why ``node`` offers fewer ``resource`` than its capacity, or none of it: its plugin
    registers the devices under another name, the plugin is gone (kubelet keeps the
    capacity at allocatable 0 for the grace period, then drops it), or devices are
    Unhealthy. None when it offers all it has."""
    name = name_of(node)
    cap_map = status(node).get("capacity") or {}
    cap = int(_quantity(cap_map.get(resource)))
    alloc = int(_quantity((status(node).get("allocatable") or {}).get(resource)))
    others = renamed(node, resource)
    if cap == alloc and (cap > 0 or (not others and resource not in cap_map)):
        return None
    events = _node_events(objs, name)
    evidence = [node_summary(objs, node, resource)]
    pods = plugin_pods(objs, name)
    gone = [
        e
        for e in events
        if e.get("reason") == "PluginDisconnected" and message(e).startswith(resource + ":")
    ]
    registered = [
        e
        for e in events
        if e.get("reason") == "Register" and f"plugin for {resource} " in message(e)
    ]
    last_registered = event_time(registered[-1]) if registered else ""
    stopped = bool(gone) and event_time(gone[-1]) >= last_registered
    if gone:
        evidence.append(f"PluginDisconnected ({event_time(gone[-1])}): {message(gone[-1])}")
    evidence.append(
        "device-plugin pod on the node: "
        + (", ".join(f"{name_of(p)} {status(p).get('phase')}" for p in pods) or "none")
    )
    running = any(_pod_ready(p) for p in pods)
    if others and running and (stopped or cap == 0):
        config = labels(node).get(DP_CONFIG_LABEL, "default")
        return Link(
            "node",
            BROKEN,
            f"the device plugin on {name} advertises {', '.join(others)} instead of {resource} "
            f"(its config {config!r} renames it); {resource}: capacity {cap}, allocatable {alloc}",
            [*evidence, f"node label {DP_CONFIG_LABEL}={config}"],
            fix=f"select a device-plugin config that keeps {resource} (`kubectl label node {name} "
            f"{DP_CONFIG_LABEL}=default --overwrite`), then restart the node's plugin pod; or "
            "ask for the advertised name",
        )
    if stopped or not running:
        return Link(
            "node",
            BROKEN,
            f"the device plugin for {resource} on {name} is not running: capacity {cap}, "
            f"allocatable {alloc} (kubelet keeps the capacity for the grace period, then drops it)",
            evidence,
            fix=_plugin_fix(objs, node),
        )
    bad = unhealthy_devices([e for e in events if reporter(e).endswith("device-plugin")])
    if bad:
        evidence += [
            f"Unhealthy {u}: {note.rpartition('Unhealthy: ')[2][:80]}"
            for u, note in sorted(bad.items())
        ]
        return Link(
            "node",
            BROKEN,
            f"{len(bad)} GPU(s) of {name} are Unhealthy (the device plugin's health check saw an "
            f"Xid): allocatable {alloc} of capacity {cap}",
            evidence,
            fix=f"a GPU stays Unhealthy until its device plugin restarts: once the fault is gone "
            "(real hardware: drain and reset the GPU; the lab's Xid was a single event), "
            f"restart the plugin: `kubectl -n {SYSTEM_NAMESPACE} delete pod {name_of(pods[0])}`",
        )
    return Link(
        "node",
        BROKEN,
        f"{name} offers {alloc} of {cap} {resource}",
        evidence,
        fix=f"see the device plugin's log on {name}",
    )


def _plugin_fix(objs: ObjectSet, node: Obj) -> str:
    name = name_of(node)
    if labels(node).get("nvidia.com/gpu.present") != "true":
        return (
            f"the device-plugin DaemonSet selects nodes labelled nvidia.com/gpu.present=true and "
            f"{name} lacks it: `kubectl label node {name} nvidia.com/gpu.present=true`"
        )
    return (
        f"find why the device-plugin pod on {name} does not run: "
        f"`kubectl -n {SYSTEM_NAMESPACE} get pods -o wide`"
    )


def _bound_node_link(objs: ObjectSet, pod: Obj, node: Obj | None) -> Link:
    if node is None:
        return Link(
            "node",
            BROKEN,
            f"node {spec(pod).get('nodeName')} does not exist",
            fix="the pod is lost: its controller recreates it elsewhere",
        )
    links = node_chain(objs, node, extended_requests(pod))
    broken = next((link for link in links if link.state == BROKEN), None)
    if broken is not None and not _allocated(pod):
        return broken
    return Link(
        "node",
        OK,
        f"{name_of(node)} Ready and advertises what the pod asked for",
        [link.summary for link in links if link.state != SKIPPED],
    )


def _allocated(pod: Obj) -> bool:
    return (
        any(k.startswith(ALLOCATE_PREFIX) for k in annotations(pod))
        or status(pod).get("phase") == "Running"
    )


def kubelet_link(objs: ObjectSet, pod: Obj) -> Link:
    phase = status(pod).get("phase", "Pending")
    records = sorted(
        k.removeprefix(ALLOCATE_PREFIX) for k in annotations(pod) if k.startswith(ALLOCATE_PREFIX)
    )
    evidence = [f"phase {phase}"] + [f"Allocate recorded for container {c}" for c in records]
    if phase == "Failed":
        why = f"{status(pod).get('reason', '')}: {status(pod).get('message', '')}"
        return Link(
            "kubelet",
            BROKEN,
            f"kubelet rejected the pod ({why})",
            evidence,
            fix="read the reason (UnexpectedAdmissionError: the device plugin's Allocate "
            "failed; TopologyAffinityError: no NUMA node holds it) and recreate the pod",
        )
    if phase in ("Running", "Succeeded"):
        return Link("kubelet", OK, f"pod {phase}", evidence)
    want = extended_requests(pod)
    if want and not records:
        return Link("kubelet", WAITING, "bound; waiting for the device plugin's Allocate", evidence)
    return Link("kubelet", WAITING, f"bound; pod {phase}", evidence)


# ================================================================ the node's chain


def node_chain(objs: ObjectSet, node: Obj, want: Mapping[str, int] | None = None) -> list[Link]:
    name = name_of(node)
    ready = condition(node, "Ready").get("status") == "True"
    links = [
        Link(
            "node",
            OK if ready else BROKEN,
            f"{name} Ready={ready}",
            fix="" if ready else f"`kubectl describe node {name}`: kubelet is not posting status",
        )
    ]
    cap = status(node).get("capacity") or {}
    resources = sorted(set(want or ()) | {r for r in cap if r.startswith("nvidia.com/")})
    for r in resources:
        if r not in (want or {}) and not _quantity(cap.get(r)):
            continue  # a resource this node does not offer (nvidia.com/gpu under MIG mixed)
        finding = mig_side(objs, node, r)
        if finding is not None and r not in (want or {}):
            continue  # withdrawn under the node's MIG layout and strategy; nothing asks for it
        finding = finding or device_side(objs, node, r)
        if finding is not None:
            links.append(replace_name(finding, f"device plugin ({r})"))
        elif r in cap:
            links.append(Link(f"device plugin ({r})", OK, node_summary(objs, node, r)))
        else:
            links.append(
                Link(
                    f"device plugin ({r})",
                    BROKEN,
                    f"{name} does not advertise {r}",
                    fix=_plugin_fix(objs, node),
                )
            )
    links.append(mig_link(objs, node))
    return links


def mig_link(objs: ObjectSet, node: Obj) -> Link:
    lab = labels(node)
    wanted = lab.get(MIG_CONFIG)
    if not wanted:
        return Link("mig", SKIPPED, "no nvidia.com/mig.config on the node")
    state = lab.get(MIG_STATE, "")
    evidence = [
        f"{MIG_CONFIG}={wanted}",
        f"{MIG_STATE}={state or '-'}",
        f"{MIG_STRATEGY}={lab.get(MIG_STRATEGY, '-')}",
    ]
    source = _mig_config_map(objs, name_of(node))
    configs = _mig_configs(source)
    if configs is not None and wanted not in configs:
        near = difflib.get_close_matches(wanted, sorted(configs), n=3, cutoff=0.5)
        return Link(
            "mig",
            BROKEN,
            f"{MIG_CONFIG}={wanted} names no config in ConfigMap {name_of(source or {})}",
            [*evidence, f"{len(configs)} configs; the closest: {', '.join(near) or '-'}"],
            fix=f"set {MIG_CONFIG} to a config of the ConfigMap"
            + (f" (did you mean {near[0]}?)" if near else ""),
        )
    if state == "failed":
        why = [
            e
            for e in _node_events(objs, name_of(node))
            if e.get("type") == "Warning" and "mig-manager" in reporter(e)
        ]
        return Link(
            "mig",
            BROKEN,
            f"mig-manager failed to apply {wanted}" + (f": {message(why[-1])}" if why else ""),
            evidence,
            fix="read the mig-manager's Event on the node / its log, fix and relabel",
        )
    if state == "pending":
        return Link("mig", WAITING, f"mig-manager is applying {wanted}", evidence)
    return Link("mig", OK, f"MIG layout {wanted}: {state or 'not reported'}", evidence)


def mig_side(objs: ObjectSet, node: Obj, resource: str) -> Link | None:
    """Why a node with a MIG config offers none of ``resource``: for
    ``nvidia.com/mig-<profile>``, its layout was not applied (the mig link), or the device
    plugin's MIG strategy advertises MIG devices under another name (k8s-device-plugin
    v0.20.0: ``single`` as ``nvidia.com/gpu`` with ``gpu.product <model>-MIG-<profile>``,
    ``none`` not at all); for ``nvidia.com/gpu`` under ``mixed``, every GPU is
    partitioned. None when the node offers it, or for none of these reasons."""
    alloc = _quantity((status(node).get("allocatable") or {}).get(resource))
    if alloc or not labels(node).get(MIG_CONFIG):
        return None
    name = name_of(node)
    strategy = labels(node).get(MIG_STRATEGY, "none")  # GFD sets no label for none
    if resource == GPU:
        offered = [r for r in renamed(node, resource) if r.startswith(MIG_PREFIX)]
        if strategy != "mixed" or not offered:
            return None
        return Link(
            "node",
            BROKEN,
            f"every GPU of {name} is partitioned by MIG layout {labels(node)[MIG_CONFIG]}: "
            f"under strategy mixed its device plugin advertises {', '.join(offered)} and no "
            f"whole {GPU} (kubelet keeps a withdrawn resource's capacity at allocatable 0 "
            "for the grace period)",
            [node_summary(objs, node, GPU)],
            fix=f"ask for one of {', '.join(r.partition('=')[0] for r in offered)}, or give "
            f"the node a {MIG_CONFIG} that leaves GPUs whole",
        )
    if not resource.startswith(MIG_PREFIX):
        return None
    mig = mig_link(objs, node)
    if mig.state in (BROKEN, WAITING):
        return Link(
            "node",
            mig.state,
            f"{name} offers no {resource}: {mig.summary}",
            mig.evidence,
            fix=mig.fix,
        )
    profile = resource.removeprefix(MIG_PREFIX)
    product = labels(node).get(GPU_PRODUCT, "")
    evidence = [*mig.evidence, f"{GPU_PRODUCT}={product or '-'}", node_summary(objs, node, GPU)]
    offered = product.rpartition("-MIG-")[2] if "-MIG-" in product else ""
    if profile in _layout_profiles(_mig_config_map(objs, name), labels(node)[MIG_CONFIG]):
        unmanaged = [
            p
            for p in plugin_pods(objs, name)
            if labels(p).get("app.kubernetes.io/managed-by") != OPERATOR_MANAGED_BY
        ]
        if unmanaged:
            return _stale_plugin(node, unmanaged[0], evidence)
        if strategy in ("single", "mixed") and offered != profile:
            return Link(
                "node",
                WAITING,
                f"the GPU Operator's device plugin on {name} is restarting on the "
                f"{labels(node)[MIG_CONFIG]} layout",
                evidence,
            )
    if strategy == "single":
        shown = f"its MIG devices ({offered}) as {GPU}" if offered else f"whole GPUs as {GPU}"
        fix = (
            f"ask for {GPU} with nodeSelector {GPU_PRODUCT}={product}, or set the "
            "ClusterPolicy's spec.mig.strategy to mixed (the device plugin and GFD are "
            "re-rendered with it)"
            if offered == profile
            else f"apply a layout with {profile} devices ({MIG_CONFIG}), and ask for {GPU} "
            "or switch the strategy to mixed"
        )
        return Link(
            "node",
            BROKEN,
            f"{name}'s MIG strategy is single: its device plugin advertises {shown}, "
            f"never {resource}",
            evidence,
            fix=fix,
        )
    if strategy == "mixed":
        offered = [r for r in renamed(node, resource) if r.startswith(MIG_PREFIX)]
        return Link(
            "node",
            BROKEN,
            f"the MIG layout {labels(node)[MIG_CONFIG]} of {name} has no {profile} devices"
            + (f" (it offers {', '.join(offered)})" if offered else ""),
            evidence,
            fix=f"ask for a profile the node offers, or label the node with a "
            f"{MIG_CONFIG} whose layout has {profile}",
        )
    return Link(
        "node",
        BROKEN,
        f"{name}'s MIG strategy is none: its device plugin advertises no MIG devices",
        evidence,
        fix=f"set the ClusterPolicy's spec.mig.strategy to mixed (or single and ask for {GPU})",
    )


def _stale_plugin(node: Obj, plugin: Obj, evidence: list[str]) -> Link:
    """The node's layout has the asked profile, yet a device plugin the GPU Operator did
    not deploy runs there. The MIG manager pauses the operator's GPU clients (their
    ``nvidia.com/gpu.deploy.*`` labels) around a change; this plugin kept the devices it
    listed at its start (it reads NVML once) until someone restarts it. (The MIG manager
    also pauses any DaemonSet whose pods select ``nvidia.com/gpu.deploy.client``, a label
    the operator sets on GPU nodes: the way to have a third-party plugin paused.)"""
    name, config = name_of(node), labels(node)[MIG_CONFIG]
    return Link(
        "node",
        BROKEN,
        f"the device plugin pod {ns_of(plugin)}/{name_of(plugin)} on {name} is not the GPU "
        f"Operator's: the MIG manager did not pause it for {config}, so it still advertises "
        "the devices it listed at its start",
        [
            *evidence,
            f"{name_of(plugin)} started {status(plugin).get('startTime', '-')}, no "
            f"app.kubernetes.io/managed-by={OPERATOR_MANAGED_BY}; its config "
            f"{DP_CONFIG_LABEL}={labels(node).get(DP_CONFIG_LABEL, 'default')}",
        ],
        fix=f"restart it (`kubectl -n {ns_of(plugin)} delete pod {name_of(plugin)}`); for "
        "good, give its DaemonSet the nodeSelector nvidia.com/gpu.deploy.client=true (the MIG "
        "manager pauses such DaemonSets around a change), or let the GPU Operator deploy the "
        "device plugin on the node (nvidia.com/gpu.deploy.device-plugin=true)",
    )


def _mig_config_map(objs: ObjectSet, node: str) -> Obj | None:
    """The mig-parted config the node's MIG manager reads: the custom one the ClusterPolicy
    names (``spec.migManager.config.name``; None when it was not read: no other config is
    in force then), else the one it built from the node's GPUs (``<node>-mig-config``),
    else the operator's default (its fallback)."""
    custom = custom_mig_config(objs.cluster_policies)
    if custom:
        return next((c for c in objs.configmaps if name_of(c) == custom), None)
    own = next((c for c in objs.configmaps if name_of(c) == node_configmap_name(node)), None)
    return own or next(
        (c for c in objs.configmaps if name_of(c) == MIG_PARTED_DEFAULT_CONFIGMAP), None
    )


def _layout_profiles(cm: Obj | None, config: str) -> set[str]:
    """The MIG profiles the mig-parted config ``config`` creates on some GPU (any of its
    rows: the rows' device filters are not matched against the node's boards)."""
    out: set[str] = set()
    for text in ((cm or {}).get("data") or {}).values():
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            continue
        rows = (doc.get("mig-configs") or {}).get(config) if isinstance(doc, dict) else None
        for row in rows or []:
            if isinstance(row, Mapping) and row.get("mig-enabled"):
                out |= {str(p).split("+")[0] for p in row.get("mig-devices") or {}}
    return out


def _mig_configs(cm: Obj | None) -> set[str] | None:
    if cm is None:
        return None
    names: set[str] = set()
    for text in (cm.get("data") or {}).values():
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict):
            names |= set((doc.get("mig-configs") or {}).keys())
    return names


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    return not meta(pod).get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status(pod).get("conditions") or []
    )
