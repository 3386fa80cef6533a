"""Controllers of the Kueue counterpart (kubernetes-sigs/kueue v0.19.2
pkg/controller/core, pkg/controller/jobframework, the scheduler's writes) and the
manager that runs them: informers (gpulab.informer) update the cache and the queues and
add keys; workers (gpulab.workqueue) reconcile; the scheduler runs its own loop.
"""
