"""gpulab.wait: polling waits and retries."""

from __future__ import annotations

import threading
import time

import pytest

from gpulab.errors import UserError
from gpulab.wait import WaitTimeout, retry_call, wait_for


def test_wait_for_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, [], "ready"])
    assert wait_for(lambda: next(answers), 5, "x", interval=0.01) == "ready"


def test_wait_for_names_what_it_waited_for() -> None:
    with pytest.raises(WaitTimeout, match=r"timed out after 0\.1s waiting for the moon"):
        wait_for(lambda: False, 0.1, "the moon", interval=0.02)
    assert issubclass(WaitTimeout, UserError)  # one line at the CLI


def test_wait_for_ends_early_when_stopped() -> None:
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    with pytest.raises(WaitTimeout):
        wait_for(lambda: False, 30, "never", interval=5, stop=stop)
    assert time.monotonic() - started < 5


def test_wait_for_lets_exceptions_of_the_check_through() -> None:
    def check() -> bool:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        wait_for(check, 1, "x")


def test_retry_call_retries_only_what_is_retryable() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("conflict")
        return "ok"

    assert (
        retry_call(flaky, lambda e: isinstance(e, ConnectionError), attempts=5, initial=0.001)
        == "ok"
    )
    assert len(calls) == 3

    def broken() -> None:
        raise ValueError("not retryable")

    with pytest.raises(ValueError):
        retry_call(broken, lambda e: isinstance(e, ConnectionError), attempts=5)


def test_retry_call_reraises_the_last_error_when_spent() -> None:
    calls = []

    def always() -> None:
        calls.append(1)
        raise ConnectionError(f"attempt {len(calls)}")

    with pytest.raises(ConnectionError, match="attempt 4"):
        retry_call(always, lambda e: True, attempts=4, initial=0.001)
