"""The GPU Operator chapter's commands, named after the upstream binaries they stand for:

    gpulab gpu-operator [--namespace NS] [--operand-image gpulab:dev]
                        [--metrics-bind-address :8080] [--health-probe-bind-address :8081]
    gpulab nvidia-validator --component driver|toolkit|cuda|plugin [--output-dir DIR] ...
    gpulab gpu-feature-discovery [--oneshot] [--sleep-interval 60s] [--config-file FILE]
    gpulab dcgm-exporter [-a :9400] [-f collectors.csv] [-k] [-r host:port]
    gpulab nvidia-mig-manager [--node-name N] [--config-file FILE] [--with-reboot]

Flags take upstream's environment variables as defaults (OPERATOR_NAMESPACE, COMPONENT,
WITH_WAIT, WITH_WORKLOAD, OUTPUT_DIR, NODE_NAME, GFD_SLEEP_INTERVAL, MIG_STRATEGY,
DCGM_EXPORTER_LISTEN, DCGM_EXPORTER_COLLECTORS, DCGM_EXPORTER_KUBERNETES, CONFIG_FILE,
DEFAULT_CONFIG_FILE, WITH_REBOOT ...), so the operand DaemonSets of manifests/gpu-operator/assets/
configure them as upstream's do.
Each runs in-cluster as its ServiceAccount, or with --kubeconfig.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import Any

from gpulab.errors import CLIError

OPERAND_IMAGE = "gpulab:dev"


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def _bool(value: str) -> bool:
    if value.lower() in ("1", "t", "true"):
        return True
    if value.lower() in ("0", "f", "false", ""):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean; use true or false")


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _api(kubeconfig: str | None) -> Any:
    from gpulab.kube import api_client

    return api_client(kubeconfig)


def add_commands(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser(
        "gpu-operator", help="run the GPU Operator (ClusterPolicy controller)",
        description=__doc__, formatter_class=fmt,
    )  # fmt: skip
    p.add_argument("--namespace", default=_env("OPERATOR_NAMESPACE"),
                   help="where the operands go [$OPERATOR_NAMESPACE]")  # fmt: skip
    p.add_argument("--operand-image", default=_env("OPERAND_IMAGE", OPERAND_IMAGE),
                   help="(lab) the image every operand runs [$OPERAND_IMAGE]")  # fmt: skip
    p.add_argument("--metrics-bind-address", default=":8080")
    p.add_argument("--health-probe-bind-address", default=":8081")
    p.add_argument("--kubeconfig", default=None)
    p.set_defaults(func=run_operator)

    v = sub.add_parser(
        "nvidia-validator", help="validate one GPU Operator component on this node",
        description=__doc__, formatter_class=fmt,
    )  # fmt: skip
    v.add_argument("-c", "--component", default=_env("COMPONENT"))
    v.add_argument("--with-wait", type=_bool, default=_bool(_env("WITH_WAIT", "false")))
    v.add_argument("--with-workload", type=_bool, default=_bool(_env("WITH_WORKLOAD", "true")))
    v.add_argument(
        "--output-dir", type=Path, default=Path(_env("OUTPUT_DIR", "/run/nvidia/validations"))
    )
    v.add_argument("-n", "--node-name", default=_env("NODE_NAME"))
    v.add_argument("--namespace", default=_env("OPERATOR_NAMESPACE"))
    v.add_argument("-s", "--sleep-interval-seconds", type=float,
                   default=float(_env("SLEEP_INTERVAL_SECONDS", "5")))  # fmt: skip
    v.add_argument("--toolkit-install-dir", type=Path, default=Path("/usr/local/nvidia"),
                   help="(lab) where the simulated toolkit installs itself")  # fmt: skip
    v.add_argument("--kubeconfig", default=None)
    v.set_defaults(func=run_validator)

    g = sub.add_parser(
        "gpu-feature-discovery", help="label this node with its GPUs' features",
        description=__doc__, formatter_class=fmt,
    )  # fmt: skip
    g.add_argument("--node-name", default=_env("NODE_NAME"))
    g.add_argument("--oneshot", action="store_true", default=_bool(_env("GFD_ONESHOT", "false")))
    g.add_argument("--sleep-interval", default=_env("GFD_SLEEP_INTERVAL", "60s"))
    g.add_argument("--fail-on-init-error", type=_bool,
                   default=_bool(_env("GFD_FAIL_ON_INIT_ERROR", "true")))  # fmt: skip
    g.add_argument("--config-file", type=Path, default=_env("CONFIG_FILE") or None)
    g.add_argument("--mig-strategy", default=_env("MIG_STRATEGY") or None)
    g.add_argument("--kubeconfig", default=None)
    g.set_defaults(func=run_gfd)

    d = sub.add_parser(
        "dcgm-exporter", help="serve GPU metrics with DCGM's field names",
        description=__doc__, formatter_class=fmt,
    )  # fmt: skip
    d.add_argument("-a", "--address", default=_env("DCGM_EXPORTER_LISTEN", ":9400"))
    d.add_argument(
        "-f", "--collectors", type=Path, default=_env("DCGM_EXPORTER_COLLECTORS") or None
    )
    d.add_argument("-k", "--kubernetes", type=_bool, nargs="?", const=True,
                   default=_bool(_env("DCGM_EXPORTER_KUBERNETES", "false")),
                   help="Kubernetes mode: the Hostname label is $NODE_NAME")  # fmt: skip
    d.add_argument("-r", "--remote-hostengine-info",
                   default=_env("DCGM_REMOTE_HOSTENGINE_INFO") or None,
                   help="the host engine to use (the lab reads NVML; names Hostname "
                   "outside Kubernetes) [$DCGM_REMOTE_HOSTENGINE_INFO]")  # fmt: skip
    d.set_defaults(func=run_dcgm_exporter)

    m = sub.add_parser(
        "nvidia-mig-manager", help="apply this node's nvidia.com/mig.config through NVML",
        description=__doc__, formatter_class=fmt,
    )  # fmt: skip
    m.add_argument("-n", "--node-name", default=_env("NODE_NAME"))
    m.add_argument("-f", "--config-file", type=Path, default=_env("CONFIG_FILE") or None,
                   help="the user's mig-parted config; without it the MIG manager builds "
                   "one from the GPUs [$CONFIG_FILE]")  # fmt: skip
    m.add_argument("-p", "--default-gpu-clients-namespace",
                   default=_env("DEFAULT_GPU_CLIENTS_NAMESPACE", "default"))  # fmt: skip
    m.add_argument("-r", "--with-reboot", type=_bool, nargs="?", const=True,
                   default=_bool(_env("WITH_REBOOT", "false")),
                   help="reboot if changing the MIG mode fails [$WITH_REBOOT]")  # fmt: skip
    m.add_argument("--kubeconfig", default=_env("KUBECONFIG") or None)
    m.set_defaults(func=run_mig_manager)


def _need(value: str | None, flag: str, env: str) -> str:
    if not value:
        raise CLIError(f"{flag} is required (or set ${env})")
    return value


def run_operator(args: argparse.Namespace) -> int:
    from gpulab.gpuoperator import controller

    namespace = _need(args.namespace, "--namespace", "OPERATOR_NAMESPACE")
    controller.run(
        _api(args.kubeconfig),
        namespace,
        args.operand_image,
        args.metrics_bind_address,
        args.health_probe_bind_address,
        _stop_event(),
    )
    return 0


def run_validator(args: argparse.Namespace) -> int:
    import time

    from gpulab.gpuoperator.validator import Options, Validator
    from gpulab.trace import Tracer

    opts = Options(
        component=_need(args.component, "--component", "COMPONENT"),
        node=_need(args.node_name, "--node-name", "NODE_NAME"),
        namespace=args.namespace or "",
        output_dir=args.output_dir,
        with_wait=args.with_wait,
        with_workload=args.with_workload,
        sleep_seconds=args.sleep_interval_seconds,
        toolkit_install_dir=args.toolkit_install_dir,
    )
    from gpulab.kube import in_pod

    # the toolkit and cuda checks need no API server: without one only the log is written
    api = _api(args.kubeconfig) if args.kubeconfig or in_pod() else None
    if api is None and opts.component in ("driver", "plugin"):
        raise CLIError(f"--component {opts.component} reads the API server: pass --kubeconfig")
    tracer = Tracer("nvidia-validator", api, instance=opts.node)
    try:
        print(Validator(opts, api, tracer, time.sleep).run(), flush=True)
    finally:
        tracer.flush(timeout=2)
    return 0


def run_gfd(args: argparse.Namespace) -> int:
    from gpulab.deviceplugin.config import ConfigError
    from gpulab.deviceplugin.nvml import NVMLInitError
    from gpulab.gpuoperator import gfd

    node = _need(args.node_name, "--node-name", "NODE_NAME")
    interval = gfd.parse_duration(args.sleep_interval)
    stop = _stop_event()
    try:
        config = gfd.load_config(args.config_file, args.mig_strategy)
        gfd.run(_api(args.kubeconfig), node, config, interval, args.oneshot, stop)
    except NVMLInitError as exc:
        if args.fail_on_init_error:
            raise CLIError(str(exc)) from exc
        print(f"{exc}; --fail-on-init-error=false: no labels. Waiting.", flush=True)
        stop.wait()
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
    return 0


def run_dcgm_exporter(args: argparse.Namespace) -> int:
    from gpulab.gpuoperator import dcgm

    counters = dcgm.default_counters()
    if args.collectors:
        try:
            text = Path(args.collectors).read_text()
        except OSError as exc:
            raise CLIError(
                f"cannot read the collectors file {args.collectors}: {exc.strerror}"
            ) from None
        counters = dcgm.parse_counters(text, str(args.collectors))
    reader = dcgm.Reader()
    try:
        reader.start()
    except reader.N.NVMLError as exc:
        raise CLIError(f"NVML init failed: {exc}; is the driver (the NVML shim) there?") from exc
    host = dcgm.hostname(args.kubernetes, args.remote_hostengine_info)
    server = dcgm.serve(dcgm.listen_address(args.address), counters, reader, host)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    print(f"dcgm-exporter: serving /metrics on {args.address}", flush=True)
    _stop_event().wait()
    server.shutdown()
    reader.stop()
    return 0


def run_mig_manager(args: argparse.Namespace) -> int:
    from gpulab.gpuoperator import migmanager
    from gpulab.kube import mounted
    from gpulab.trace import Tracer

    node = _need(args.node_name, "--node-name", "NODE_NAME")
    default = _env("DEFAULT_CONFIG_FILE")  # read from the environment only, as upstream
    opts = migmanager.Options(
        node,
        args.default_gpu_clients_namespace,
        config_file=args.config_file,
        default_config_file=Path(default) if default else None,
        generated_config_file=Path(mounted(str(migmanager.GENERATED_CONFIG_FILE))),
        pod_name=_env("POD_NAME"),
        pod_namespace=_env("POD_NAMESPACE"),
        with_reboot=args.with_reboot,
    )
    api = _api(args.kubeconfig)
    tracer = Tracer("nvidia-mig-manager", api, instance=node)
    try:
        migmanager.MigManager(api, opts, tracer).run(_stop_event())
    finally:
        tracer.flush(timeout=2)
    return 0
