"""Kueue counterpart, mirroring kubernetes-sigs/kueue v0.19.2: ResourceFlavor,
ClusterQueue, LocalQueue, Cohort, AdmissionCheck, WorkloadPriorityClass and Workload
(kueue.x-k8s.io/v1beta2, v1beta1 converted), the scheduler and its queues, the
integrations (batch/v1 Jobs, Pods and pod groups, Deployments, StatefulSets) and the
webhooks. The chapter's map is docs/kueue.md.

Laid out like upstream: ``cache`` (pkg/cache/scheduler), ``queue`` (pkg/cache/queue),
``scheduler``, ``flavorassigner``, ``preemption`` (pkg/scheduler/...), ``controllers``
(pkg/controller/core, pkg/controller/jobframework), ``jobs`` (pkg/controller/jobs),
``validation`` and ``webhook`` (pkg/webhooks, the jobs' webhooks), ``conversion``
(apis/kueue/v1beta1/*_conversion.go), ``config`` (apis/config/v1beta2), ``metrics``.
"""
