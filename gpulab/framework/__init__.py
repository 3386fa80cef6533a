"""kube-scheduler's scheduling framework, small and in Python.

Mirrors kubernetes **v1.36.3** ``pkg/scheduler`` (the Kubernetes version the lab runs),
file by file with upstream names:

    interface.py     staging/src/k8s.io/kube-scheduler/framework/interface.go (Status,
                     CycleState, the extension points)
    runtime.py       pkg/scheduler/framework/runtime/framework.go, waiting_pods_map.go
    schedule_one.py  pkg/scheduler/schedule_one.go (ScheduleOne, schedulingCycle,
                     bindingCycle, FitError "0/N nodes are available: ...")
    queue.py         pkg/scheduler/backend/queue/scheduling_queue.go (activeQ, backoffQ,
                     unschedulablePods)
    cache.py         pkg/scheduler/backend/cache/cache.go (assumed pods)
    config.py        pkg/scheduler/apis/config/v1 (KubeSchedulerConfiguration profiles)
    scheduler.py     pkg/scheduler/scheduler.go, eventhandlers.go (informers -> queue/cache)
    plugins/         pkg/scheduler/framework/plugins/{noderesources,nodename,nodeaffinity,
                     tainttoleration,nodeunschedulable,queuesort,defaultbinder}

Reusable, stable parts (the Volcano chapter builds on them): ``resources.py`` (pod
requests, Resource), ``snapshot.py`` (NodeInfo, Snapshot, new_snapshot),
``predicates.py`` (the fit functions) and ``binding.py`` (the Binding subresource).

The call chain of one pod:

    Pop -> PreFilter -> Filter (per node) -> [PostFilter] -> PreScore -> Score ->
    NormalizeScore -> Reserve -> Permit (-> waiting) || WaitOnPermit -> PreBind -> Bind

docs/scheduling-framework.md lists every deliberate difference from upstream.
"""
