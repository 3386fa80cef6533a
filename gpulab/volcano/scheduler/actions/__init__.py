"""The scheduler actions by name (volcano-sh/volcano v1.15.1 ``actions/factory.go``)."""

from __future__ import annotations

from collections.abc import Callable

from gpulab.volcano.scheduler.actions.allocate import Allocate
from gpulab.volcano.scheduler.actions.backfill import Backfill
from gpulab.volcano.scheduler.actions.enqueue import Enqueue
from gpulab.volcano.scheduler.actions.preempt import Preempt
from gpulab.volcano.scheduler.actions.reclaim import Reclaim
from gpulab.volcano.scheduler.framework.interface import Action

ACTIONS: dict[str, Callable[[], Action]] = {
    "allocate": Allocate,
    "backfill": Backfill,
    "enqueue": Enqueue,
    "preempt": Preempt,
    "reclaim": Reclaim,
}
