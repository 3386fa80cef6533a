"""`gpulab fake-gpu ...`: render profiles for the NVML shim, inject and clear faults,
show node health, a nvidia-smi over the shim, and `run` (a command in the GPU environment
its container's Allocate gave it; see :mod:`gpulab.fakegpu.container`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpulab.fakegpu import container, faults, paths, render, smi
from gpulab.fakegpu.profiles import ProfileError, load


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("fake-gpu", help="the fake GPU (NVML shim) of simulated nodes")
    sub = group.add_subparsers(dest="fake_gpu_command", metavar="COMMAND", required=True)

    def node_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--node", required=True, help="simulated node name")
        p.add_argument(
            "--state-dir",
            help=f"state root (default: ${paths.ENV_STATE_ROOT}, else the default cluster's "
            f"{paths.NODE_STATE_DIR} on the node)",
        )

    p = sub.add_parser("render", help="write the shim config of a profile on a node")
    p.add_argument("--profile", required=True, help="profile name or YAML path")
    node_args(p)
    p.add_argument("-o", "--output", help="file to write (default: <state-dir>/<node>/config)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("inject", help="inject a GPU fault, delivered as an NVML event")
    node_args(p)
    p.add_argument("--gpu", type=int, required=True, help="GPU index")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--xid", type=int, help="Xid critical error number (e.g. 79, 13)")
    kind.add_argument("--ecc-dbe", action="store_true", help="double-bit ECC error (Xid 48)")
    kind.add_argument("--off-bus", action="store_true", help="GPU fell off the bus (Xid 79)")
    p.set_defaults(func=cmd_inject)

    p = sub.add_parser("clear", help="clear injected faults (restore health)")
    node_args(p)
    p.add_argument("--gpu", type=int, help="GPU index (default: every GPU)")
    p.set_defaults(func=cmd_clear)

    p = sub.add_parser("status", help="show each GPU's injected faults")
    node_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("smi", help="nvidia-smi over the shim")
    smi.add_arguments(p)
    p.set_defaults(func=cmd_smi)

    p = sub.add_parser(
        "run",
        help="run a command in a pod's container with the GPU environment Allocate gave it "
        "(lab: on the local backend, from the node agent's record)",
        description=container.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--container", required=True, help="this container's name")
    p.add_argument("--pod", default=os.environ.get("HOSTNAME"), help="this pod (default $HOSTNAME)")
    p.add_argument("--namespace", help="this pod's namespace (default: its ServiceAccount's)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    p.set_defaults(func=cmd_run)


def cmd_render(args: argparse.Namespace) -> int:
    profile = load(args.profile)
    ndir = paths.node_dir(paths.state_root(args.state_dir, args.node), args.node)
    out = Path(args.output) if args.output else None
    print(render.write_node(profile, args.node, ndir, out))
    return 0


def _gpu_count(ndir: Path, node: str) -> int:
    config = paths.existing_config(ndir.parent, node)
    for line in config.read_text().splitlines():
        if line.startswith("gpu_count="):
            return int(line.split("=", 1)[1])
    raise ProfileError(f"{config} has no gpu_count; render it again")


def _checked_gpu(ndir: Path, node: str, gpu: int) -> int:
    count = _gpu_count(ndir, node)
    if not 0 <= gpu < count:
        raise ProfileError(f"node {node!r} has {count} GPUs; --gpu must be 0..{count - 1}")
    return gpu


def cmd_inject(args: argparse.Namespace) -> int:
    ndir = paths.node_dir(paths.state_root(args.state_dir, args.node), args.node)
    gpu = _checked_gpu(ndir, args.node, args.gpu)
    if args.ecc_dbe:
        injected = faults.inject_ecc_dbe(ndir, gpu)
    else:
        xid = faults.XID_FALLEN_OFF_BUS if args.off_bus else args.xid
        if xid <= 0:
            raise ProfileError("--xid must be a positive Xid number")
        injected = [faults.inject_xid(ndir, gpu, xid)]
    for f in injected:
        note = "" if f.fatal else " (non-fatal for the device plugin)"
        print(f"{args.node} GPU {gpu}: injected {f.describe()}{note}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    ndir = paths.node_dir(paths.state_root(args.state_dir, args.node), args.node)
    if args.gpu is not None:
        _checked_gpu(ndir, args.node, args.gpu)
    faults.clear(ndir, args.gpu)
    which = "every GPU" if args.gpu is None else f"GPU {args.gpu}"
    print(f"{args.node}: cleared faults on {which}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    ndir = paths.node_dir(paths.state_root(args.state_dir, args.node), args.node)
    active = faults.active(ndir)
    for gpu in range(_gpu_count(ndir, args.node)):
        found = active.get(gpu, [])
        state = "unhealthy" if any(f.fatal for f in found) else "healthy"
        detail = ", ".join(f.describe() for f in found)
        print(f"GPU {gpu}: {state}" + (f" ({detail})" if detail else ""))
    return 0


def cmd_smi(args: argparse.Namespace) -> int:
    smi.select_node(args.node, args.profile, args.state_dir)
    print(smi.run(args.list_gpus))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.pod:
        raise container.RunError("--pod is required where $HOSTNAME is not the pod's name")
    container.run(argv, args.pod, args.namespace, args.container)
    return 0  # not reached: run replaces this process
