"""Waiting and retrying, the one way the lab does both (built on tenacity).

- :func:`wait_for` polls a check until it returns something truthy and returns that,
  or raises :class:`WaitTimeout` naming what it waited for ("timed out after 30s waiting
  for gpu-a100 to advertise 8 GPUs"). Demos, tests, benchmarks and the harness use it.
- :func:`retry_call` calls a function again while it raises what the caller names
  retryable (a 409 Conflict, a connection refused), with exponential back-off, and
  re-raises the last error when the budget is spent.

Both take an optional ``stop`` event so a component shutting down never waits out a
back-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    stop_any,
    wait_exponential,
    wait_fixed,
)
from tenacity.stop import stop_base

from gpulab.errors import UserError

T = TypeVar("T")


class WaitTimeout(UserError):
    """A wait ran out of time; the message names what was awaited."""


def _stop_when_set(event: threading.Event | None) -> stop_base:
    class _StopWhenSet(stop_base):
        def __call__(self, retry_state: RetryCallState) -> bool:
            return event is not None and event.is_set()

    return _StopWhenSet()


def _sleeper(event: threading.Event | None) -> Callable[[float], None]:
    # An Event's wait wakes up as soon as the component is told to stop.
    if event is None:
        return threading.Event().wait
    return event.wait


def wait_for(
    check: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.2,
    stop: threading.Event | None = None,
) -> T:
    """Poll ``check`` every ``interval`` seconds until it returns something truthy.

    Returns that value. Raises :class:`WaitTimeout` ("timed out after {timeout}s waiting
    for {what}") when ``timeout`` passes or ``stop`` is set first. Exceptions raised by
    ``check`` propagate at once: a check that can fail transiently catches its own.
    """
    retrying = Retrying(
        stop=stop_any(stop_after_delay(timeout), _stop_when_set(stop)),
        wait=wait_fixed(interval),
        retry=retry_if_result(lambda r: not r),
        retry_error_callback=lambda _state: None,
        sleep=_sleeper(stop),
        reraise=True,
    )
    result = retrying(check)
    if not result:
        raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}")
    return result


def retry_call(
    fn: Callable[[], T],
    retryable: Callable[[BaseException], bool],
    *,
    attempts: int | None = None,
    timeout: float | None = None,
    initial: float = 0.05,
    maximum: float = 2.0,
    stop: threading.Event | None = None,
) -> T:
    """Call ``fn`` until it returns, retrying while it raises an error ``retryable``
    accepts, with exponential back-off from ``initial`` to ``maximum`` seconds.

    Stops after ``attempts`` calls or ``timeout`` seconds (at least one must be given)
    or when ``stop`` is set, and then re-raises the last error; errors ``retryable``
    refuses are raised at once.
    """
    if attempts is None and timeout is None:
        raise ValueError("retry_call needs attempts or timeout")
    limits: list[stop_base] = [_stop_when_set(stop)]
    if attempts is not None:
        limits.append(stop_after_attempt(attempts))
    if timeout is not None:
        limits.append(stop_after_delay(timeout))
    retrying = Retrying(
        stop=stop_any(*limits),
        wait=wait_exponential(multiplier=initial, min=initial, max=maximum),
        retry=retry_if_exception(retryable),
        sleep=_sleeper(stop),
        reraise=True,
    )
    return retrying(fn)
