"""``gpulab node-agent``: kubelet's device manager for one simulated (kwok) node.

    gpulab node-agent --node-name N --socket-dir DIR --kubeconfig K
                      [--endpoint-stop-grace-period 300]

Serves kubelet's Registration service on ``<socket-dir>/kubelet.sock`` (start it before or
after the device plugin: the plugin restarts and registers when kubelet.sock appears),
follows each registered plugin's ListAndWatch into the Node's ``status.capacity`` /
``status.allocatable``, and allocates devices to the pods bound to the node, recording
each container's ContainerAllocateResponse in the pod annotation
``gpulab.io/allocate-<container>`` (the lab's stand-in for kubelet's checkpoint file).
``--endpoint-stop-grace-period`` is kubelet's ``endpointStopGracePeriod`` (a constant of 5
minutes there; a flag here so tests can watch a stopped plugin's resource go away).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from gpulab.errors import CLIError
from gpulab.kube import api_client
from gpulab.trace import Tracer


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "node-agent",
        help="run kubelet's device manager for a simulated node (local backend)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--node-name", required=True, help="the simulated node's name")
    p.add_argument("--socket-dir", required=True, type=Path, help="device-plugin socket dir")
    p.add_argument("--kubeconfig", help="kubeconfig of the cluster (default: in-cluster)")
    p.add_argument(
        "--endpoint-stop-grace-period",
        type=float,
        default=300.0,
        help="seconds a stopped plugin's resource stays (at 0 allocatable) before removal",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # gRPC and the generated stubs load only when the agent actually runs.
    from gpulab.informer import PODS, Informer, ListWatch
    from gpulab.nodeagent.kube import KubeNodeAPI
    from gpulab.nodeagent.manager import ManagerImpl

    if not args.socket_dir.is_dir():
        raise CLIError(f"--socket-dir {args.socket_dir} is not a directory")
    if args.endpoint_stop_grace_period < 0:
        raise CLIError("--endpoint-stop-grace-period must be >= 0 seconds")
    api = api_client(args.kubeconfig)
    tracer = Tracer("node-agent", api, instance=args.node_name)
    manager = ManagerImpl(
        args.node_name,
        args.socket_dir,
        KubeNodeAPI(api),
        tracer,
        grace_period=args.endpoint_stop_grace_period,
    )
    pods = Informer(
        ListWatch(api, PODS, field_selector=f"spec.nodeName={args.node_name}"),
        manager.handlers,
        name="pod-informer",
        store=manager.pods,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    manager.Start()
    pods.start()
    try:
        stop.wait()
    finally:
        pods.stop()
        manager.Stop()
        tracer.flush(timeout=2)
    return 0
