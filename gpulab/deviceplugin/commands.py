"""``gpulab device-plugin``: the CLI entry (upstream ``cmd/nvidia-device-plugin/main.go`` flags).

    gpulab device-plugin --node-name N --socket-dir DIR [--mig-strategy none|single|mixed]
                         [--replicas N] [--hami [--hami-split-count 10]]
                         [--kubeconfig K] [--health-recheck-seconds 2]

- NVML comes from the process environment: ``LD_LIBRARY_PATH`` (and the shim's
  ``FAKE_GPU_CONFIG`` / ``FAKE_GPU_STATE_DIR``) must be set when the process starts.
- ``--node-name`` defaults to ``$NODE_NAME`` (the DaemonSet sets it from spec.nodeName).
- ``--socket-dir`` defaults to /var/lib/kubelet/device-plugins; kubelet's Registration
  service is ``<socket-dir>/kubelet.sock``, this plugin serves ``nvidia-gpu.sock`` (and one
  ``nvidia-mig-<profile>.sock`` per MIG profile with ``--mig-strategy mixed``).
- With an API server (``--kubeconfig``, or in-cluster config when run as a pod) it labels
  the node (GFD labels), posts trace Events, and with ``--hami`` registers the GPUs in HAMi's
  node annotations and allocates from HAMi's pod annotations. Without one it only speaks gRPC.
- ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` tune which Xids are health failures.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kubernetes import client

from gpulab.deviceplugin.rm import MIG_STRATEGIES, ResourceError
from gpulab.errors import CLIError
from gpulab.hami.annotations import DEFAULT_SPLIT_COUNT
from gpulab.kube import api_client, in_pod

if TYPE_CHECKING:
    from gpulab.deviceplugin.main import Options

DEFAULT_SOCKET_DIR = "/var/lib/kubelet/device-plugins"


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "device-plugin",
        help="run the NVIDIA device plugin (kubelet device-plugin API v1beta1) for one node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="this node's name")
    p.add_argument(
        "--socket-dir", default=DEFAULT_SOCKET_DIR, type=Path, help="device-plugin socket dir"
    )
    # Not argparse choices: an unknown strategy is the one-line CLIError naming the choices.
    p.add_argument("--mig-strategy", default="none", help="none | single | mixed")
    p.add_argument("--replicas", type=int, default=1, help="time-slicing replicas per device")
    p.add_argument(
        "--hami", action="store_true", help="HAMi mode: node registration + vGPU allocation"
    )
    p.add_argument(
        "--hami-split-count",
        type=int,
        default=DEFAULT_SPLIT_COUNT,
        help="containers per GPU in HAMi mode",
    )
    p.add_argument("--kubeconfig", help="API server access (default: in-cluster config, else none)")
    p.add_argument(
        "--health-recheck-seconds",
        type=float,
        default=2.0,
        help="how often unhealthy GPUs are re-checked for cleared faults (0: never)",
    )
    p.set_defaults(func=run)


def _api(kubeconfig: str | None) -> client.ApiClient | None:
    # no API server at all is fine: the plugin then only speaks gRPC to kubelet
    return api_client(kubeconfig) if kubeconfig or in_pod() else None


def options(args: argparse.Namespace) -> Options:
    from gpulab.deviceplugin.main import Options

    if not args.node_name:
        raise CLIError("--node-name is required (or set $NODE_NAME)")
    if args.mig_strategy not in MIG_STRATEGIES:
        raise CLIError(
            f"unknown MIG strategy {args.mig_strategy!r}; use one of: {', '.join(MIG_STRATEGIES)}"
        )
    if args.replicas < 1:
        raise CLIError(f"--replicas must be >= 1, got {args.replicas}")
    if args.hami_split_count < 1:
        raise CLIError(f"--hami-split-count must be >= 1, got {args.hami_split_count}")
    if args.hami and args.mig_strategy != "none":
        raise CLIError("--hami shares whole GPUs: use it with --mig-strategy none")
    if not args.socket_dir.is_dir():
        raise CLIError(f"--socket-dir {args.socket_dir} is not a directory")
    replicas = args.replicas
    if args.hami and replicas == 1:
        # HAMi advertises <split count> shares per GPU to kubelet (devices GPU-x-0..n-1).
        replicas = args.hami_split_count
    return Options(
        node_name=args.node_name,
        socket_dir=args.socket_dir,
        mig_strategy=args.mig_strategy,
        replicas=replicas,
        hami=args.hami,
        hami_split_count=args.hami_split_count,
        health_recheck_seconds=args.health_recheck_seconds,
    )


def run(args: argparse.Namespace) -> int:
    # gRPC, NVML and the generated stubs load only when the plugin actually runs.
    from gpulab.deviceplugin.main import start
    from gpulab.deviceplugin.nvml import NVMLInitError

    opts = options(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    api = _api(args.kubeconfig)
    if opts.hami and api is None:
        raise CLIError("--hami reads and writes HAMi's annotations: pass --kubeconfig")
    try:
        start(opts, api, stop)
    except (NVMLInitError, ResourceError) as exc:
        raise CLIError(str(exc)) from exc
    return 0
