"""OpenSession and CloseSession: the two ends of every scheduling cycle.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/framework/framework.go``
(``OpenSession``: take the cache's snapshot, then build every configured plugin and call
its ``OnSessionOpen``, which registers its order / predicate / score / vote functions;
``CloseSession``: every plugin's ``OnSessionClose``, then ``closeSession``),
``session.go`` ``openSession`` / ``closeSession`` / ``updateQueueStatus`` and
``job_updater.go`` (``UpdateAll``: each job's PodGroup status recomputed; written back
when it changed, its Events and pod conditions recorded).

Lab difference: the JobUpdater hands the work to the cache one job at a time (upstream
fans out to 16 goroutines); the cache decides how to parallelise the API calls.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping

from gpulab.framework.snapshot import new_snapshot
from gpulab.volcano.scheduler.api.resource_info import Resource
from gpulab.volcano.scheduler.conf import SchedulerConfiguration
from gpulab.volcano.scheduler.framework.interface import Cache, ClusterInfo, PluginBuilder
from gpulab.volcano.scheduler.framework.session import (
    Session,
    job_status,
    pod_group_status_updated,
    queue_allocated,
)

_log = logging.getLogger(__name__)


def plugin_builders() -> Mapping[str, PluginBuilder]:
    """The plugins this scheduler knows by name (plugins/factory.go)."""
    from gpulab.volcano.scheduler.plugins import PLUGINS

    return PLUGINS


def open_session(cache: Cache, snapshot: ClusterInfo, conf: SchedulerConfiguration) -> Session:
    """OpenSession: a Session over ``snapshot`` with the configured plugins opened."""
    bound = [p for p in snapshot.pods if (p.get("spec") or {}).get("nodeName")]
    ssn = Session(
        cache,
        snapshot.jobs,
        snapshot.nodes,
        snapshot.queues,
        new_snapshot([n.node for n in snapshot.nodes.values()], bound),
        conf.tiers,
        frozenset(conf.actions),
        conf.configurations,
    )
    for job in ssn.jobs.values():
        if job.pod_group is not None:
            ssn.pod_group_old_status[job.uid] = copy.deepcopy(job.pod_group.get("status") or {})
    builders = plugin_builders()
    for tier in conf.tiers:
        for option in tier.plugins:
            plugin = builders[option.name](option.arguments)
            ssn.plugins[plugin.name] = plugin
            plugin.on_session_open(ssn)
    return ssn


def close_session(ssn: Session) -> None:
    """CloseSession: plugins close, PodGroup statuses and queue allocations go back."""
    for plugin in ssn.plugins.values():
        plugin.on_session_close(ssn)
    for job in ssn.jobs.values():
        if job.pod_group is None:
            continue
        status = job_status(ssn, job)
        job.pod_group["status"] = status
        old = ssn.pod_group_old_status.get(job.uid)
        ssn.cache.update_job_status(job, old is None or pod_group_status_updated(status, old))
    for name, allocated in queue_allocated(ssn).items():
        queue = ssn.queues[name]
        current = Resource.from_list((queue.queue.get("status") or {}).get("allocated"))
        if current.to_list() != allocated.to_list():
            ssn.cache.update_queue_status(queue, allocated.to_list())
