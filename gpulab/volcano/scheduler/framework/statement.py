"""The Statement: a gang's tentative decisions, committed together or discarded together.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/framework/statement.go``: ``Evict``,
``Pipeline`` and ``Allocate`` change only the session (task status, node accounting, the
plugins' event handlers) and remember the operation; ``Commit`` makes them real (evict
the pods, hand allocated tasks to the binder), ``Discard`` undoes them in reverse order;
``Merge`` adopts another statement's operations (reclaim and preempt try one node at a
time and keep only the node that worked).

This is the piece that makes a gang all-or-nothing: allocate commits a job's statement
only when ``JobReady`` holds, and discards it otherwise.

Lab difference: ``SaveOperations`` / ``RecoverOperations`` (used only by the
hyper-node search of network-topology-aware allocation) are not implemented.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulab.volcano.scheduler.api.job_info import TaskInfo, TaskStatus
from gpulab.volcano.scheduler.api.node_info import NodeInfo

if TYPE_CHECKING:
    from gpulab.volcano.scheduler.framework.session import Session

_log = logging.getLogger(__name__)


class Op(enum.Enum):
    EVICT = "evict"
    PIPELINE = "pipeline"
    ALLOCATE = "allocate"


@dataclass
class Operation:
    name: Op
    task: TaskInfo
    reason: str = ""


class StatementError(Exception):
    pass


class Statement:
    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn
        self.operations: list[Operation] = []

    # ---------------------------------------------------------------- tentative

    def evict(self, reclaimee: TaskInfo, reason: str) -> None:
        job = self.ssn.jobs.get(reclaimee.job)
        if job is not None:
            job.update_task_status(reclaimee, TaskStatus.RELEASING)
        node = self.ssn.nodes.get(reclaimee.node_name)
        if node is not None:
            node.update_task(reclaimee)
        self.ssn._fire(False, reclaimee)
        self.operations.append(Operation(Op.EVICT, reclaimee, reason))

    def pipeline(self, task: TaskInfo, hostname: str, eviction_occurred: bool) -> None:
        """Pipeline ``task`` on ``hostname``; rolled back (and raised) if anything fails."""
        errors: list[Exception] = []
        job = self.ssn.jobs.get(task.job)
        if job is not None:
            job.update_task_status(task, TaskStatus.PIPELINED)
        task.node_name = hostname
        task.eviction_occurred = eviction_occurred
        node = self.ssn.nodes.get(hostname)
        try:
            if node is None:
                raise StatementError(f"failed to find node {hostname}")
            node.add_task(task)
        except Exception as err:
            errors.append(err)
        errors.extend(self.ssn._fire(True, task))
        if errors:
            self._unpipeline(task)
            raise StatementError(
                f"Task({task.key}) pipeline to node({hostname}) error and errInfos num is "
                f"{len(errors)}, pipeline has been rolled back"
            )
        self.operations.append(Operation(Op.PIPELINE, task))

    def allocate(self, task: TaskInfo, node: NodeInfo) -> None:
        """Allocate ``task`` on ``node``; rolled back (and raised) if anything fails."""
        errors: list[Exception] = []
        job = self.ssn.jobs.get(task.job)
        if job is not None:
            job.update_task_status(task, TaskStatus.ALLOCATED)
        task.node_name = node.name
        try:
            node.add_task(task)
        except Exception as err:
            errors.append(err)
        errors.extend(self.ssn._fire(True, task))
        if errors:
            self._unallocate(task)
            raise StatementError(
                f"Task {task.key} allocate to node {node.name} error and errInfos num is "
                f"{len(errors)}, allocation has been rolled back"
            )
        self.operations.append(Operation(Op.ALLOCATE, task))

    # ---------------------------------------------------------------- undo

    def _unevict(self, task: TaskInfo) -> None:
        job = self.ssn.jobs.get(task.job)
        if job is not None:
            job.update_task_status(task, TaskStatus.RUNNING)
        node = self.ssn.nodes.get(task.node_name)
        if node is not None:
            node.update_task(task)
        self.ssn._fire(True, task)

    def _unpipeline(self, task: TaskInfo) -> None:
        job = self.ssn.jobs.get(task.job)
        if job is not None:
            job.update_task_status(task, TaskStatus.PENDING)
        node = self.ssn.nodes.get(task.node_name)
        if node is not None:
            node.remove_task(task)
        self.ssn._fire(False, task)
        task.node_name = ""

    unpipeline = _unpipeline

    def _unallocate(self, task: TaskInfo) -> None:
        job = self.ssn.jobs.get(task.job)
        if job is not None:
            job.update_task_status(task, TaskStatus.PENDING)
        node = self.ssn.nodes.get(task.node_name)
        if node is not None:
            node.remove_task(task)
        self.ssn._fire(False, task)
        task.node_name = ""

    # ---------------------------------------------------------------- settle

    def discard(self) -> None:
        """Undo every operation, newest first."""
        for op in reversed(self.operations):
            op.task.generate_last_tx_context()
            if op.name is Op.EVICT:
                self._unevict(op.task)
            elif op.name is Op.PIPELINE:
                self._unpipeline(op.task)
            else:
                self._unallocate(op.task)
        self.operations = []

    def commit(self) -> None:
        """Make every operation real: evict pods, dispatch allocated tasks to the binder
        (a pipelined task stays pipelined: it waits for the resources being freed)."""
        for op in self.operations:
            op.task.clear_last_tx_context()
            if op.name is Op.EVICT:
                self.ssn.cache.evict(op.task, op.reason)
            elif op.name is Op.ALLOCATE:
                try:
                    self.ssn.dispatch(op.task)
                except Exception as err:
                    _log.error("Failed to allocate task <%s>: %s", op.task.key, err)
                    self._unallocate(op.task)
        self.operations = []

    def merge(self, *others: Statement) -> None:
        for other in others:
            self.operations.extend(other.operations)
            other.operations = []
