"""``gpulab device-plugin`` and ``gpulab config-manager``: the CLI entries (upstream v0.20.0
``cmd/nvidia-device-plugin/main.go`` and ``cmd/config-manager/main.go`` flags).

    gpulab device-plugin --node-name N --socket-dir DIR [--config-file FILE]
                         [--mig-strategy none|single|mixed] [--pass-device-specs]
                         [--shared-devices-allocation-policy distributed|packed]
                         [--fail-on-init-error=false] [--mig-minors FILE]
                         [--hami [--device-config-file F] [--node-config-file F]]
                         [--kubeconfig K]

- NVML comes from the process environment: ``LD_LIBRARY_PATH`` (and the shim's
  ``FAKE_GPU_CONFIG``) must be set when the process starts.
- Per-node settings (MIG strategy, time-slicing) live in upstream's config file
  (``--config-file``, see :mod:`gpulab.deviceplugin.config`); a flag set explicitly, or its
  environment variable (``MIG_STRATEGY``, ``PASS_DEVICE_SPECS``, ``CONFIG_FILE`` ...), wins
  over the file, as upstream.
- ``--node-name`` defaults to ``$NODE_NAME``; ``--socket-dir`` to
  /var/lib/kubelet/device-plugins (kubelet's Registration service is
  ``<socket-dir>/kubelet.sock``; the plugin serves ``nvidia-gpu.sock``, and one
  ``nvidia-mig-<profile>.sock`` per MIG profile with strategy mixed).
- ``--mig-minors`` (lab flag) is the driver's ``/proc/driver/nvidia-caps/mig-minors``,
  which upstream reads at that fixed path; the lab's fake driver writes one per node.
- With an API server (``--kubeconfig``, or in-cluster config as a pod) it labels the node
  (GFD), posts trace Events, and with ``--hami`` is HAMi's device plugin instead: it
  registers the GPUs in HAMi's node annotations and allocates from HAMi's pod annotations,
  reading HAMi's device config (``--device-config-file``, upstream's ``--config-file``) and
  this node's entry of HAMi's ``config.json`` (``--node-config-file``, upstream's fixed
  ``/config/config.json``); it writes no GFD labels.
- ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` tune which Xids are failures.
- ``SIGHUP`` restarts the plugins (re-reading the config); ``SIGTERM``/``SIGINT`` stop.

    gpulab config-manager --oneshot --node-name N --config-file-srcdir DIR
                          --config-file-dst FILE [--default-config NAME]
                          [--fallback-strategies named,single,empty] [--kubeconfig K]

picks this node's config (label ``nvidia.com/device-plugin.config``) from the ConfigMap
files in DIR and links FILE to it: run it before the plugin (an init container).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kubernetes import client

from gpulab.deviceplugin.config import (
    ALLOCATION_POLICIES,
    MIG_STRATEGIES,
    ConfigError,
    FlagOverrides,
)
from gpulab.deviceplugin.configmanager import NODE_LABEL
from gpulab.deviceplugin.rm import MIG_MINORS_FILE, ResourceError
from gpulab.errors import CLIError
from gpulab.hami.config import ConfigError as HamiConfigError
from gpulab.kube import api_client, in_pod

if TYPE_CHECKING:
    from gpulab.deviceplugin.main import Options

DEFAULT_SOCKET_DIR = "/var/lib/kubelet/device-plugins"
_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def _env_bool(name: str) -> bool | None:
    """urfave/cli's BoolFlag EnvVars (strconv.ParseBool); None when unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise CLIError(f"${name}={value!r} is not a boolean; use true or false")


def _bool(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean; use true or false")


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
    p.add_argument(
        "--config-file",
        default=os.environ.get("CONFIG_FILE"),
        type=Path,
        help="upstream's config file (flags, sharing.timeSlicing) [$CONFIG_FILE]",
    )
    # No argparse choices: a bad value is the one-line error naming the choices.
    p.add_argument("--mig-strategy", help="none | single | mixed [$MIG_STRATEGY]")
    p.add_argument(
        "--pass-device-specs",
        nargs="?",
        const=True,
        type=_bool,
        help="pass the devices' DeviceSpecs to kubelet on Allocate [$PASS_DEVICE_SPECS]",
    )
    p.add_argument(
        "--fail-on-init-error",
        nargs="?",
        const=True,
        type=_bool,
        help="exit if NVML cannot be initialised, else wait (default true) [$FAIL_ON_INIT_ERROR]",
    )
    p.add_argument(
        "--shared-devices-allocation-policy",
        help="distributed | packed [$SHARED_DEVICES_ALLOCATION_POLICY]",
    )
    p.add_argument(
        "--mig-minors",
        type=Path,
        default=Path(os.environ.get("MIG_MINORS_FILE", MIG_MINORS_FILE)),
        help=f"the driver's MIG minors file (lab flag; upstream reads {MIG_MINORS_FILE})",
    )
    p.add_argument(
        "--hami", action="store_true", help="HAMi mode: node registration + vGPU allocation"
    )
    p.add_argument(
        "--device-config-file",
        type=Path,
        help="HAMi mode: HAMi's device config (deviceSplitCount, migProfileAllowlist ...)",
    )
    p.add_argument(
        "--node-config-file",
        type=Path,
        help="HAMi mode: HAMi's config.json (operatingmode ... per node)",
    )
    p.add_argument("--kubeconfig", help="API server access (default: in-cluster config, else none)")
    p.set_defaults(func=run)

    c = subparsers.add_parser(
        "config-manager",
        help="pick this node's device-plugin config from a node label (init step)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--oneshot", action="store_true", default=_env_bool("ONESHOT") or False)
    c.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    c.add_argument("--node-name", default=os.environ.get("NODE_NAME"))
    c.add_argument("--node-label", default=os.environ.get("NODE_LABEL", NODE_LABEL))
    c.add_argument("--config-file-srcdir", type=Path, default=os.environ.get("CONFIG_FILE_SRCDIR"))
    c.add_argument("--config-file-dst", type=Path, default=os.environ.get("CONFIG_FILE_DST"))
    c.add_argument("--default-config", default=os.environ.get("DEFAULT_CONFIG", ""))
    c.add_argument(
        "--fallback-strategies",
        default=os.environ.get("FALLBACK_STRATEGIES", ""),
        help="comma-separated: named, single, empty",
    )
    c.set_defaults(func=run_config_manager)


def _api(kubeconfig: str | None) -> client.ApiClient | None:
    # no API server at all is fine: the plugin then only speaks gRPC to kubelet
    return api_client(kubeconfig) if kubeconfig or in_pod() else None


def _flag(value: str | None, env: str) -> str | None:
    return value if value is not None else os.environ.get(env)


def options(args: argparse.Namespace) -> Options:
    from gpulab.deviceplugin.main import Options

    if not args.node_name:
        raise CLIError("--node-name is required (or set $NODE_NAME)")
    mig = _flag(args.mig_strategy, "MIG_STRATEGY")
    if mig is not None and mig not in MIG_STRATEGIES:
        raise CLIError(f"unknown MIG strategy {mig!r}; use one of: {', '.join(MIG_STRATEGIES)}")
    policy = _flag(args.shared_devices_allocation_policy, "SHARED_DEVICES_ALLOCATION_POLICY")
    if policy is not None and policy not in ALLOCATION_POLICIES:
        raise CLIError(
            f"invalid --shared-devices-allocation-policy option: {policy}; use one of: "
            f"{', '.join(ALLOCATION_POLICIES)}"
        )
    if not args.socket_dir.is_dir():
        raise CLIError(f"--socket-dir {args.socket_dir} is not a directory")
    flags = FlagOverrides(
        mig_strategy=mig,
        fail_on_init_error=(
            args.fail_on_init_error
            if args.fail_on_init_error is not None
            else _env_bool("FAIL_ON_INIT_ERROR")
        ),
        pass_device_specs=(
            args.pass_device_specs
            if args.pass_device_specs is not None
            else _env_bool("PASS_DEVICE_SPECS")
        ),
        allocation_policy=policy,
    )
    return Options(
        node_name=args.node_name,
        socket_dir=args.socket_dir,
        config_file=args.config_file,
        flags=flags,
        mig_minors=args.mig_minors,
        hami=args.hami,
        device_config_file=args.device_config_file,
        node_config_file=args.node_config_file,
    )


def run(args: argparse.Namespace) -> int:
    # gRPC, NVML and the generated stubs load only when the plugin actually runs.
    from gpulab.deviceplugin.main import load_config, load_hami_config, start
    from gpulab.deviceplugin.nvml import NVMLInitError

    opts = options(args)
    stop, restart = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: restart.set())
    api = _api(args.kubeconfig)
    if opts.hami and api is None:
        raise CLIError("--hami reads and writes HAMi's annotations: pass --kubeconfig")
    try:
        config = load_config(opts)  # a bad file fails now, with one line
        if opts.hami:
            load_hami_config(opts)
        try:
            start(opts, api, stop, restart)
        except NVMLInitError:
            if config.fail_on_init_error:
                raise
            logging.getLogger(__name__).warning(
                "NVML init failed and --fail-on-init-error=false: no devices. Waiting indefinitely."
            )
            stop.wait()
    except (NVMLInitError, ConfigError, HamiConfigError, ResourceError) as exc:
        raise CLIError(str(exc)) from exc
    return 0


def run_config_manager(args: argparse.Namespace) -> int:
    from gpulab.deviceplugin.configmanager import (
        available_configs,
        select_config,
        update_symlink,
    )

    for flag in ("node_name", "config_file_srcdir", "config_file_dst"):
        if not getattr(args, flag):
            raise CLIError(f"invalid <{flag.replace('_', '-')}>: must not be empty string")
    if not args.oneshot:
        raise CLIError(
            "the lab runs config-manager as an init step only: pass --oneshot (restart the "
            "plugin or send it SIGHUP after relabelling the node)"
        )
    node = client.CoreV1Api(api_client(args.kubeconfig)).read_node(args.node_name)
    label = (node.metadata.labels or {}).get(args.node_label, "")
    fallbacks = [f.strip() for f in args.fallback_strategies.split(",") if f.strip()]
    name = select_config(
        label, available_configs(args.config_file_srcdir), args.default_config, fallbacks
    )
    changed = update_symlink(name, args.config_file_srcdir, args.config_file_dst)
    which = name or "the empty config"
    print(f"{args.node_name}: {args.node_label}={label or '(unset)'} -> {which}"
          + ("" if changed else " (already configured)"))  # fmt: skip
    return 0
