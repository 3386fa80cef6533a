"""vc-scheduler's loop: every schedule period, one session from OpenSession to CloseSession.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/scheduler.go``: ``Run`` loads the
configuration (``loadSchedulerConf``), watches its file (``watchSchedulerConf``: the
ConfigMap mounted at ``--scheduler-conf``; a change is loaded, an invalid one is logged
and the previous configuration kept), starts the cache and calls ``runOnce`` every
``--schedule-period``; ``runOnce`` = ``OpenSession`` -> each configured action's
``Execute`` -> ``CloseSession``. Metrics as ``pkg/scheduler/metrics``
(``volcano_e2e_scheduling_latency_milliseconds``, ``volcano_action_scheduling_latency_
microseconds``).

The call-chain trace (a lab addition): a session that decided something is narrated as
JSON lines - ``OpenSession`` (jobs, nodes, queues), ``OnSessionOpen`` (what gang and
proportion set up: a JobInfo per PodGroup with its minAvailable, each queue's deserved
share by weight), one line per action summarising its
decisions (allocate's first: the ``predicates`` per node and the ``nodeorder`` scores for
each job's first task), ``CloseSession`` (how long it took) - and each decision is an Event on the
PodGroup concerned (``Enqueue``, ``Allocate``, ``Reclaim`` ...). A session that only
repeats the previous one (a gang that still does not fit) is not narrated again.

Lab differences: the file is polled once a second (upstream: fsnotify); a configuration
naming an unknown plugin is rejected too (see conf.py); an invalid configuration is also
reported as a Warning Event ``LoadSchedulerConf`` on the scheduler's own Pod
(``POD_NAME`` / ``POD_NAMESPACE`` from the downward API).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram

from gpulab.kube import own_pod
from gpulab.trace import ObjectRef, Tracer
from gpulab.volcano.scheduler import conf
from gpulab.volcano.scheduler.actions import ACTIONS
from gpulab.volcano.scheduler.cache import pod_group_ref
from gpulab.volcano.scheduler.framework.framework import close_session, open_session
from gpulab.volcano.scheduler.framework.interface import Cache, ClusterInfo
from gpulab.volcano.scheduler.framework.session import Record, Session
from gpulab.volcano.scheduler.plugins import PLUGINS

GPU = "nvidia.com/gpu"

_log = logging.getLogger(__name__)

STEP_OF = {"enqueue": "Enqueue", "allocate": "Allocate", "backfill": "Backfill"}
STEP_OF.update(reclaim="Reclaim", preempt="Preempt")


class LoopCache(Cache, Protocol):
    """What the loop needs from the cache beyond the session's interface."""

    def run(self) -> None: ...

    def snapshot(self) -> ClusterInfo: ...

    def flush(self) -> None: ...


@dataclass
class Metrics:
    registry: CollectorRegistry
    e2e: Histogram
    action: Histogram

    @classmethod
    def new(cls) -> Metrics:
        registry = CollectorRegistry()
        buckets = (5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240)
        return cls(
            registry,
            Histogram(
                "volcano_e2e_scheduling_latency_milliseconds",
                "E2e scheduling latency in milliseconds (scheduling algorithm + binding)",
                buckets=buckets,
                registry=registry,
            ),
            Histogram(
                "volcano_action_scheduling_latency_microseconds",
                "Action scheduling latency in microseconds",
                ["action"],
                buckets=tuple(b * 1000 for b in buckets),
                registry=registry,
            ),
        )


def load(text: str) -> conf.SchedulerConfiguration:
    return conf.unmarshal_scheduler_conf(text, ACTIONS, PLUGINS)


class Scheduler:
    def __init__(
        self,
        cache: LoopCache,
        tracer: Tracer,
        conf_path: Path | None,
        period: float = 1.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.cache = cache
        self.tracer = tracer
        self.conf_path = conf_path
        self.period = period
        self.metrics = metrics or Metrics.new()
        self.conf = load(conf.DEFAULT_SCHEDULER_CONF)
        self._conf_text: str | None = None
        self._lock = threading.Lock()
        self._narrated: dict[tuple[str, str | None, str], str] = {}
        self.sessions = 0
        self.last_session_seconds = 0.0
        self.on_session: Callable[[Session, float], None] | None = None

    # ---------------------------------------------------------------- configuration

    def load_scheduler_conf(self) -> None:
        """loadSchedulerConf: read the file; keep the previous configuration if it is
        unreadable or invalid, and say why."""
        if self.conf_path is None:
            return
        try:
            text = self.conf_path.read_text().strip()
        except OSError as exc:
            self._reject(f"cannot read {self.conf_path}: {exc.strerror}")
            return
        if text == self._conf_text:
            return
        self._conf_text = text
        try:
            new = load(text)
        except conf.ConfError as exc:
            self._reject(f"scheduler config {self.conf_path} is invalid: {exc}")
            return
        with self._lock:
            self.conf = new
        self.tracer.step(
            "LoadSchedulerConf",
            None,
            f"actions: {', '.join(new.actions)}; plugins: {', '.join(new.plugin_names())}",
        )

    def _reject(self, why: str) -> None:
        message = f"{why}; keeping the previous configuration"
        _log.error("%s", message)
        pod = own_pod()
        ref = ObjectRef("Pod", pod[1], pod[0]) if pod else None
        self.tracer.step("LoadSchedulerConf", ref, message, warning=True)

    def watch_scheduler_conf(self, stop: threading.Event, interval: float = 1.0) -> None:
        while not stop.wait(interval):
            self.load_scheduler_conf()

    # ---------------------------------------------------------------- the loop

    def run(self, stop: threading.Event) -> None:
        """Run: configuration, cache, then runOnce every period until ``stop``."""
        self.load_scheduler_conf()
        threading.Thread(
            target=self.watch_scheduler_conf, args=(stop,), name="conf-watch", daemon=True
        ).start()
        self.cache.run()
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # one bad cycle must not stop the scheduler
                _log.exception("scheduling cycle failed")
            stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def run_once(self) -> Session:
        """runOnce: OpenSession, the actions, CloseSession."""
        with self._lock:
            cfg = self.conf
        started = time.monotonic()
        ssn = open_session(self.cache, self.cache.snapshot(), cfg)
        opened = on_session_open_line(ssn)  # before OnSessionClose drops the plugins' state
        for name in cfg.actions:
            action_started = time.monotonic()
            ACTIONS[name]().execute(ssn)
            self.metrics.action.labels(name).observe((time.monotonic() - action_started) * 1e6)
        close_session(ssn)
        self.cache.flush()
        seconds = time.monotonic() - started
        self.metrics.e2e.observe(seconds * 1000)
        self.sessions += 1
        self.last_session_seconds = seconds
        self.narrate(ssn, cfg, seconds, opened)
        if self.on_session is not None:
            self.on_session(ssn, seconds)
        return ssn

    # ---------------------------------------------------------------- the trace

    def _news(self, records: list[Record]) -> list[Record]:
        """Records not told already: all loud ones, quiet ones whose text changed."""
        news = []
        for r in records:
            key = (r.action, r.step, r.job)
            if not r.quiet or self._narrated.get(key) != r.message:
                news.append(r)
            self._narrated[key] = r.message
        return news

    def narrate(
        self, ssn: Session, cfg: conf.SchedulerConfiguration, seconds: float, opened: str = ""
    ) -> None:
        news = self._news(ssn.records)
        if not news:
            return
        sid = ssn.uid[:8]
        busy = sorted({j.queue for j in ssn.jobs.values()})
        queues = ", ".join(f"{q} (weight {ssn.queues[q].weight})" for q in busy)
        self.tracer.step(
            "OpenSession",
            None,
            f"session {sid}: {len(ssn.jobs)} jobs in queues {queues or '-'}, {len(ssn.nodes)} "
            f"nodes; OnSessionOpen of {', '.join(cfg.plugin_names())}",
            session=ssn.uid,
        )
        if opened:
            self.tracer.step("OnSessionOpen", None, opened, session=ssn.uid)
        for action in cfg.actions:
            mine = [r for r in news if r.action == action]
            # the plugins' verdicts inside the action first, one line each, then its decisions
            for step in dict.fromkeys(r.step for r in mine if r.step):
                said = "; ".join(f"{r.job}: {r.message}" for r in mine if r.step == step)
                self.tracer.step(step, None, f"{action}: {said}", session=ssn.uid)
            decisions = [r for r in mine if r.step is None]
            if not decisions:
                continue
            summary = "; ".join(f"{r.job}: {r.message}" for r in decisions)
            self.tracer.step(action, None, summary, session=ssn.uid)
            for r in decisions:
                if not r.quiet:  # a repeat-prone non-decision stays in the log line
                    self._event(ssn, r)
        self.tracer.step(
            "CloseSession",
            None,
            f"session {sid} closed in {seconds * 1000:.0f} ms: PodGroup status and queue "
            "allocations written back",
            session=ssn.uid,
        )

    def _event(self, ssn: Session, record: Record) -> None:
        job = ssn.jobs.get(record.job)
        if job is None or job.pod_group is None:
            return
        step = STEP_OF.get(record.action, record.action)
        self.tracer.step(step, pod_group_ref(job), record.message, session=ssn.uid)


def on_session_open_line(ssn: Session) -> str:
    """What the gang and proportion plugins' OnSessionOpen set up, for the trace: a JobInfo
    per PodGroup (its minAvailable), each busy queue's deserved share (dealt by weight)."""
    jobs = sorted(ssn.jobs.values(), key=lambda j: j.name)
    parts = [
        "gang: JobInfo per PodGroup, minAvailable "
        + (", ".join(f"{j.name} {j.min_available}" for j in jobs) or "-")
    ]
    proportion = ssn.plugins.get("proportion")
    attrs = getattr(proportion, "queue_opts", {})
    if attrs:
        deserved = ", ".join(
            f"{a.name} (weight {a.weight}) {a.deserved.get(GPU) / 1000:g} GPUs"
            for a in sorted(attrs.values(), key=lambda a: a.name)
        )
        parts.append(f"proportion: deserved {deserved}")
    return "; ".join(parts)
