"""Volcano, the batch scheduler, small and in Python: scheduler, job controller, admission.

Mirrors volcano-sh/volcano **v1.15.1** (API types from its staged volcano.sh/apis v1.15.1),
file by file with upstream names:

    apis.py                          volcano.sh/apis: groups, kinds, phases, label and
                                     annotation keys, bus events and actions
    scheduler/api/                   pkg/scheduler/api (Resource, TaskInfo, JobInfo,
                                     NodeInfo, QueueInfo, FitErrors)
    scheduler/conf.py                pkg/scheduler/conf + scheduler/util.go
                                     (UnmarshalSchedulerConf, the default configuration)
    scheduler/framework/             pkg/scheduler/framework (Session, Statement,
                                     OpenSession / CloseSession, the JobUpdater)
    scheduler/actions/               enqueue, allocate, backfill, preempt, reclaim
    scheduler/plugins/               gang, priority, drf, proportion, predicates,
                                     nodeorder, binpack, conformance, overcommit
    scheduler/cache.py               pkg/scheduler/cache (informers, Snapshot, Bind, Evict,
                                     status write-back)
    scheduler/scheduler.py           pkg/scheduler/scheduler.go (runOnce every period)
    controllers/job/                 pkg/controllers/job (state machine, policies, pods)
    controllers/queue.py             pkg/controllers/queue (Open/Closed/Closing, counts)
    webhooks/                        pkg/webhooks/admission/{jobs,queues}

The session, its actions and plugins are pure (no I/O): they read a snapshot and record
their decisions; the cache is the edge that talks to the API server.

docs/volcano.md draws the call chain and lists every deliberate difference from upstream.
"""
