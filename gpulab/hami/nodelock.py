"""The node lock: one pod at a time between Bind and the device plugin's Allocate.

Mirrors HAMi ``pkg/util/nodelock/nodelock.go``: the lock is the node annotation
``hami.io/mutex.lock = <RFC3339>,<namespace>,<pod>`` (codec in ``annotations.py``),
taken with a compare-and-swap patch (resourceVersion) and stale after
``NodeLockTimeout`` (5 min, env ``HAMI_NODELOCK_EXPIRE``) or when the pod holding it no
longer exists. The encode/parse/expiry functions are pure; ``lock_node`` and
``release_node_lock`` do the API calls.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.hami import annotations as ann
from gpulab.hami.cluster import Cluster, Conflict, NotFound

NODE_LOCK_KEY = ann.NODE_LOCK
DEFAULT_TIMEOUT = dt.timedelta(minutes=5)
# HAMi's DefaultStrategy: 5 tries from 100 ms, doubling.
_RETRIES = 5
_BACKOFF = 0.1


class NodeLocked(RuntimeError):
    """Another pod holds a fresh lock on the node."""


@dataclass(frozen=True)
class Lock:
    time: dt.datetime
    namespace: str
    pod: str


def encode(now: dt.datetime, namespace: str, pod: str) -> str:
    return ann.node_lock_value(now, namespace, pod)


def parse(value: str) -> Lock:
    """``ParseNodeLock``; AnnotationError when it is not ``<RFC3339>,<ns>,<pod>``."""
    return Lock(*ann.parse_node_lock(value))


def expired(lock: Lock, now: dt.datetime, timeout: dt.timedelta) -> bool:
    return now - lock.time > timeout


def owned_by(value: str, namespace: str, pod: str) -> bool:
    return value.endswith(f",{namespace},{pod}")


_local_locks: dict[str, threading.Lock] = {}
_local_guard = threading.Lock()


def _local(node: str) -> threading.Lock:
    """Per-node in-process mutex, as HAMi's nodeLockManager: the API CAS covers replicas."""
    with _local_guard:
        return _local_locks.setdefault(node, threading.Lock())


def _retry_on_conflict(fn: Callable[[], None]) -> None:
    for attempt in range(_RETRIES):
        try:
            fn()
            return
        except Conflict:
            if attempt == _RETRIES - 1:
                raise
            time.sleep(_BACKOFF * 2**attempt)


def lock_node(
    cluster: Cluster,
    node: str,
    namespace: str,
    pod: str,
    *,
    now: dt.datetime,
    timeout: dt.timedelta = DEFAULT_TIMEOUT,
) -> None:
    """``LockNode``: take the lock, replacing a stale or dangling one; NodeLocked if held."""
    with _local(node):
        value = _annotations(cluster.get_node(node)).get(NODE_LOCK_KEY)
        if value is not None and not owned_by(value, namespace, pod):
            try:
                held = parse(value)
            except ann.AnnotationError:
                held = None  # an unreadable lock protects nothing: replace it
            if held is not None and not expired(held, now, timeout) and _pod_exists(cluster, held):
                raise NodeLocked(
                    f"node {node} is locked by {held.namespace}/{held.pod} since "
                    f"{held.time.isoformat()} (expires after {int(timeout.total_seconds())} s)"
                )

        def take() -> None:
            current = cluster.get_node(node)
            existing = _annotations(current).get(NODE_LOCK_KEY)
            if existing is not None and existing != value:
                raise NodeLocked(f"node {node} was locked meanwhile ({existing})")
            cluster.patch_node_annotations(
                node,
                {NODE_LOCK_KEY: encode(now, namespace, pod)},
                resource_version=current.get("metadata", {}).get("resourceVersion"),
            )

        _retry_on_conflict(take)


def release_node_lock(cluster: Cluster, node: str, namespace: str, pod: str) -> bool:
    """``ReleaseNodeLock``: drop the lock if this pod holds it. True if it was removed."""
    with _local(node):
        released = False

        def drop() -> None:
            nonlocal released
            current = cluster.get_node(node)
            value = _annotations(current).get(NODE_LOCK_KEY)
            if value is None or not owned_by(value, namespace, pod):
                return
            cluster.patch_node_annotations(
                node,
                {NODE_LOCK_KEY: None},
                resource_version=current.get("metadata", {}).get("resourceVersion"),
            )
            released = True

        _retry_on_conflict(drop)
        return released


def _annotations(obj: dict) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _pod_exists(cluster: Cluster, lock: Lock) -> bool:
    """A lock whose pod is gone is dangling: HAMi releases it."""
    try:
        cluster.get_pod(lock.namespace, lock.pod)
    except NotFound:
        return False
    return True
