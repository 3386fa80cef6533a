"""gpulab.workqueue: client-go's work-queue semantics."""

from __future__ import annotations

import threading
import time

from gpulab.wait import wait_for
from gpulab.workqueue import WorkQueue, run_worker


def test_a_key_added_twice_is_handed_out_once() -> None:
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert [q.get(0), q.get(0), q.get(0)] == ["a", "b", None]


def test_a_key_being_processed_comes_back_after_done_if_added_meanwhile() -> None:
    q = WorkQueue()
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")  # changed while we work on it
    assert q.get(0) is None  # not handed to a second worker
    q.done("a")
    assert q.get(0) == "a"


def test_add_after_delays() -> None:
    q = WorkQueue()
    q.add_after("a", 0.2)
    assert q.get(0.05) is None
    started = time.monotonic()
    assert q.get(2) == "a"
    assert time.monotonic() - started > 0.1


def test_rate_limited_backoff_doubles_until_forgotten() -> None:
    q = WorkQueue(base_delay=0.01, max_delay=0.05)
    assert [q.add_rate_limited("a") for _ in range(4)] == [0.01, 0.02, 0.04, 0.05]
    q.forget("a")
    assert q.add_rate_limited("a") == 0.01


def test_run_worker_requeues_as_reconcile_asks_and_retries_errors() -> None:
    q = WorkQueue(base_delay=0.01)
    calls: list[str] = []

    def reconcile(key: str) -> float | None:
        calls.append(key)
        if key == "fails" and calls.count("fails") < 3:
            raise RuntimeError("transient")
        if key == "again" and calls.count("again") < 2:
            return 0.01
        return None

    worker = threading.Thread(target=run_worker, args=(q, reconcile), daemon=True)
    worker.start()
    q.add("fails")
    q.add("again")
    wait_for(lambda: calls.count("fails") == 3 and calls.count("again") == 2, 5, "requeues")
    q.shutdown()
    worker.join(2)
    assert not worker.is_alive()
