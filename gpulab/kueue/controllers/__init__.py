"""Controllers of the Kueue counterpart, run by one manager loop on one thread.

Mirrors pkg/controller/core (workload_controller.go, clusterqueue_controller.go,
localqueue_controller.go) and pkg/controller/jobs/job (job_controller.go over
jobframework/reconciler.go). The scheduler runs on the same thread, so quota decisions
never race each other.
"""
