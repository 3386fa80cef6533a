"""Kueue counterpart: ResourceFlavor, ClusterQueue, LocalQueue and Workload
(kueue.x-k8s.io/v1beta2), a quota cache with cohorts and borrowing, a scheduler that
admits Workloads, the Job integration that suspends and unsuspends batch/v1 Jobs, and the
webhooks (Job defaulting, CRD conversion v1beta1 <-> v1beta2).

Laid out like upstream kubernetes-sigs/kueue: ``cache`` (pkg/cache/scheduler), ``scheduler``
(pkg/scheduler), ``controllers`` (pkg/controller/core, pkg/controller/jobs/job),
``webhook`` (pkg/controller/jobs/job/job_webhook.go, apis/kueue/v1beta1/*_conversion.go).
"""
