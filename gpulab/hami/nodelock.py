"""The node lock: one pod at a time between Bind and the device plugin's Allocate.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/util/nodelock/nodelock.go``. The lock is the node
annotation ``hami.io/mutex.lock = <RFC3339>,<namespace>,<pod>`` (codec in
``annotations.py``). The extender's Bind takes it (``LockNode``) and leaves it; the device
plugin releases it once the pod's last container is allocated (``ReleaseNodeLock`` from
``PodAllocationTrySuccess`` / ``PodAllocationFailed``), or Bind releases it if binding
fails. Rules, as the release:

- a lock older than ``--node-lock-timeout`` (5m) is expired and replaced;
- a lock whose pod no longer exists is dangling and replaced;
- a lock this very pod holds counts as taken;
- any other lock is contention (``NodeLockContention``): Bind fails at once, except for
  PodGroup members, which retry for ``--node-lock-retry-timeout`` (scheduler side);
- a lock value that does not parse is an error (not silently replaced); the legacy
  timestamp-only value is honoured (expires; owned by nobody);
- taking and releasing are compare-and-swap patches (resourceVersion), retried by
  ``DefaultStrategy`` (5 tries from 100 ms, doubling) through ``gpulab.wait.retry_call``
  (no jitter here), under a per-node mutex of this process (``nodeLockManager``).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping
from typing import Any

from gpulab.hami import annotations as ann
from gpulab.hami.cluster import Cluster, ClusterError, NotFound
from gpulab.hami.config import go_duration_string
from gpulab.wait import retry_call

NODE_LOCK_KEY = ann.NODE_LOCK
DEFAULT_TIMEOUT = dt.timedelta(minutes=5)
DEFAULT_RETRY_TIMEOUT = dt.timedelta(seconds=28)
_STEPS = 5  # DefaultStrategy: Steps 5, Duration 100ms, Factor 2
_FIRST_WAIT = 0.1


CONTENTION = "node lock contention"  # ErrNodeLockContention's text, which upstream wraps


class NodeLockContention(ClusterError):
    """``ErrNodeLockContention``: another live pod holds a fresh lock on the node. The
    message is upstream's, wrapped the way ``%w`` wraps it (learners read it in the pod's
    BindingFailed Event)."""


class NodeLockError(ClusterError):
    """The lock annotation cannot be read (``ParseNodeLock`` failed)."""


def encode(now: dt.datetime, namespace: str, pod: str) -> str:
    return ann.node_lock_value(now, namespace, pod)


def owner_suffix(namespace: str, pod: str) -> str:
    return f",{namespace},{pod}"


def owned_by(value: str, namespace: str, pod: str) -> bool:
    """The lock names this pod (legacy timestamp-only locks name nobody)."""
    return "," in value and value.endswith(owner_suffix(namespace, pod))


def expired(locked_at: dt.datetime, now: dt.datetime, timeout: dt.timedelta) -> bool:
    return now - locked_at > timeout


class _Mutexes:
    """``nodeLockManager``: one in-process mutex per node; the API's CAS covers replicas."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def get(self, node: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(node, threading.Lock())

    def forget(self, node: str) -> None:
        """``CleanupNodeLock``: the node is gone."""
        with self._guard:
            self._locks.pop(node, None)


MUTEXES = _Mutexes()


def _lock_of(node: Mapping[str, Any]) -> str | None:
    return ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_LOCK_KEY)


def _rv(node: Mapping[str, Any]) -> str | None:
    return (node.get("metadata") or {}).get("resourceVersion")


def set_node_lock(cluster: Cluster, node: str, namespace: str, pod: str, now: dt.datetime) -> None:
    """``SetNodeLock``: write the lock if the node has none (CAS, retried on errors other
    than contention)."""
    with MUTEXES.get(node):
        if _lock_of(cluster.get_node(node)) is not None:
            raise NodeLockContention(f"node {node} is locked: {CONTENTION}")

        def attempt() -> None:
            current = cluster.get_node(node)
            held = _lock_of(current)
            if held is not None and owned_by(held, namespace, pod):
                return
            if held is not None:
                raise NodeLockContention(f"node {node} is locked: {CONTENTION}")
            cluster.patch_node_annotations(
                node, {NODE_LOCK_KEY: encode(now, namespace, pod)}, resource_version=_rv(current)
            )

        retry_call(
            attempt,
            lambda exc: isinstance(exc, ClusterError) and not isinstance(exc, NodeLockContention),
            attempts=_STEPS,
            initial=_FIRST_WAIT,
            maximum=_FIRST_WAIT * 2 ** (_STEPS - 1),
        )


def release_node_lock(
    cluster: Cluster, node: str, namespace: str, pod: str, skip_owner_check: bool = False
) -> bool:
    """``ReleaseNodeLock``: drop the lock if this pod holds it (or, with
    ``skip_owner_check``, if it is still the lock that was read first). True if removed."""
    with MUTEXES.get(node):
        first = _lock_of(cluster.get_node(node))
        if first is None:
            return False
        if not skip_owner_check and "," in first and not owned_by(first, namespace, pod):
            return False
        released = False

        def attempt() -> None:
            nonlocal released
            current = cluster.get_node(node)
            value = _lock_of(current)
            if value is None:
                return
            if skip_owner_check or "," not in value:
                if value != first:
                    return
            elif not owned_by(value, namespace, pod):
                return
            cluster.patch_node_annotations(
                node, {NODE_LOCK_KEY: None}, resource_version=_rv(current)
            )
            released = True

        retry_call(
            attempt,
            lambda exc: isinstance(exc, ClusterError),
            attempts=_STEPS,
            initial=_FIRST_WAIT,
            maximum=_FIRST_WAIT * 2 ** (_STEPS - 1),
        )
        return released


def lock_node(
    cluster: Cluster,
    node: str,
    namespace: str,
    pod: str,
    *,
    now: dt.datetime,
    timeout: dt.timedelta = DEFAULT_TIMEOUT,
) -> None:
    """``LockNode``: take the lock, replacing an expired or dangling one.

    Raises NodeLockContention when another live pod holds it, NodeLockError when the
    value does not parse, ClusterError for API failures."""
    value = _lock_of(cluster.get_node(node))
    if value is None:
        set_node_lock(cluster, node, namespace, pod, now)
        return
    try:
        locked_at, holder_ns, holder = ann.parse_node_lock(value)
    except ann.AnnotationError as exc:
        raise NodeLockError(f"node {node}: cannot read {NODE_LOCK_KEY}: {exc}") from exc
    replace = False
    if expired(locked_at, now, timeout):
        replace = True
    elif (holder_ns, holder) == (namespace, pod):
        return  # this pod already holds it
    elif holder_ns and holder:
        try:
            cluster.get_pod(holder_ns, holder)
        except NotFound:
            replace = True  # dangling: its pod is gone
    if not replace:
        raise NodeLockContention(
            f"node {node} has been locked within {go_duration_string(timeout)}: {CONTENTION}"
        )
    release_node_lock(cluster, node, namespace, pod, skip_owner_check=True)
    set_node_lock(cluster, node, namespace, pod, now)
