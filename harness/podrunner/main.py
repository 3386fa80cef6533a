"""`gpulab pod-runner`: run the lab's own pods of one local cluster until stopped."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from gpulab.kube import api_client
from harness.podrunner import images, network, runtime
from harness.podrunner.api import RunnerAPI
from harness.podrunner.proxy import ServiceProxy
from harness.podrunner.runner import PodRunner, RunnerConfig


def run(
    kubeconfig: Path,
    cluster_dir: Path,
    block: int,
    api_port: int,
    backoff_initial: float,
    backoff_max: float,
) -> int:
    api = api_client(kubeconfig)
    config = RunnerConfig(
        cluster_dir=cluster_dir,
        api_host="127.0.0.1",
        api_port=api_port,
        ca_file=cluster_dir / "pki" / "ca.crt",
        images=images.load(cluster_dir),
        backoff_initial=backoff_initial,
        backoff_max=backoff_max,
    )
    runner = PodRunner(config, RunnerAPI(api), network.PodIPs(block))
    proxy = ServiceProxy(api, block, runner.pods.store)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    runner.start()
    proxy.start()
    try:
        stop.wait()
    finally:
        proxy.stop()
        runner.stop()
        runtime.kill_leftovers(cluster_dir)
    return 0
