"""The `local` backend: real upstream binaries as host processes, kwok for the nodes.

    etcd → kube-apiserver → kube-controller-manager, kube-scheduler, kwok → Nodes

What kind would run in containers runs here as processes bound to 127.0.0.1, with the
same flags kubeadm gives them (RBAC, ServiceAccount tokens, admission webhooks on) so
manifests meet the same API server they meet on kind. kwok plays every kubelet: it
marks our Nodes Ready, keeps their leases and moves Pods through the Stages in
``harness/kwok-stages.yaml``.

Every process is recorded in ``<state>/cluster.json``; `down` stops exactly those.
Later components (device plugins, extenders) join through :meth:`LocalCluster.start_process`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity

from gpulab.fakegpu import faults, paths, profiles
from gpulab.nodeagent.topology import KUBELET_CONFIG, MACHINE_INFO, MachineInfo
from gpulab.state import cluster_dir
from gpulab.wait import WaitTimeout, wait_for
from harness import addons, binaries, pki
from harness.apply import MANIFESTS, LocalTransform, apply
from harness.backends import ClusterAPI
from harness.errors import HarnessError
from harness.podrunner import network, runtime, volumes
from harness.ports import free_port, port_in_use
from harness.spec import PROFILE_MOUNT, ClusterSpec, node_object

Progress = Callable[[str], None]

HERE = Path(__file__).resolve().parent
START_TIMEOUT = 90.0
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
POD_RUNNER = "pod-runner"
GPULAB = [sys.executable, "-m", "gpulab"]  # a lab command as a host process
# The controllers a lab cluster uses. Pod IPs here are loopback addresses, which
# Endpoints may not hold, so the endpoint controllers are left out (the pod runner's
# service proxy reads the pods); so are volume, cloud and quota controllers nobody uses,
# which also makes the controller-manager start seconds sooner.
CONTROLLERS = (
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "clusterrole-aggregation-controller",
    "certificatesigningrequest-approving-controller",
    "certificatesigningrequest-signing-controller",
)


@dataclass
class ProcessRecord:
    name: str
    pid: int
    exe: str
    log: str
    ports: list[int] = field(default_factory=list)
    service: str | None = None  # the manifests' Service this process stands for
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of the harness's environment


def pid_alive(pid: int, exe: str | None = None) -> bool:
    """True if ``pid`` runs and (when given) is still our binary, not a recycled pid."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (ProcessLookupError, PermissionError, OSError):
        return False
    # a zombie (state Z) has exited; only its parent has not reaped it yet
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    if exe is None or not cmdline:  # empty for a moment while the child execs
        return True
    return cmdline.split(b"\0")[0].decode() == exe


class LocalCluster(ClusterAPI):
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.dir = cluster_dir(spec.name)
        self.pki = self.dir / "pki"
        self.kubeconfig = self.dir / "kubeconfig"
        self._state_file = self.dir / "cluster.json"
        # processes started by this Python process: their exit status explains a failure
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._block: int | None = None

    # ---------------------------------------------------------------- state

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.spec.ports['apiserver']}"

    def processes(self) -> list[ProcessRecord]:
        if not self._state_file.exists():
            return []
        data = json.loads(self._state_file.read_text())
        return [ProcessRecord(**p) for p in data.get("processes", [])]

    def _save(self, procs: list[ProcessRecord]) -> None:
        if self._block is None and self._state_file.exists():
            self._block = json.loads(self._state_file.read_text()).get("block")
        state = {
            "name": self.spec.name,
            "spec": str(self.spec.path) if self.spec.path else None,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "processes": [asdict(p) for p in procs],
            "addons": self._addons(),
            "block": self._block,
        }
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self._state_file)

    def running(self) -> bool:
        procs = self.processes()
        return bool(procs) and all(pid_alive(p.pid, p.exe) for p in procs)

    # ---------------------------------------------------------------- up

    def up(self, progress: Progress) -> None:
        if self.running():
            progress(f"cluster {self.spec.name} is already up ({self.server})")
            return
        if self.processes():  # a previous cluster died half-way: clear what is left
            self.down(lambda _m: None)
        self._check_ports()  # before a build that may take minutes, and before anything runs
        # nothing to do when cached, and nothing said: `make` has just checked them
        binaries.build_all(progress, say_cached=False)
        started = time.monotonic()
        self._prepare_dir()
        try:
            self._start_control_plane(progress)
            self._create_nodes(progress)
            self._start_pod_runner(progress)
            # nothing below waits for the controller-manager's first seconds: the base
            # manifests and the chapters' objects go in while it starts (each addon then
            # waits for its own components), the node and health checks come last
            self._apply_base(progress)
            self.ensure_addons(self.spec.addons, progress)
            self._wait_ready(progress)
        except BaseException:
            progress("start-up failed; stopping what was started")
            self.down(lambda _m: None)
            raise
        progress(f"cluster {self.spec.name} ready in {time.monotonic() - started:.1f}s")

    def _check_ports(self) -> None:
        for name, port in self.spec.ports.items():
            if port_in_use(port):
                where = f" in {self.spec.path}" if self.spec.path else ""
                raise HarnessError(
                    f"port {port} ({name}) on 127.0.0.1 is in use by another process; "
                    f"stop it (`ss -ltnp 'sport = :{port}'` shows which) or set ports.{name}{where}"
                )

    def _prepare_dir(self) -> None:
        if self.dir.exists():
            for sub in ("etcd", "pki", "logs"):  # a new cluster starts with fresh logs
                _rmtree(self.dir / sub)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        self.pki.mkdir(parents=True, exist_ok=True)
        ca = pki.create_ca(self.pki)
        pki.issue(
            ca,
            self.pki,
            "apiserver",
            "kube-apiserver",
            hosts=(
                "127.0.0.1",
                "localhost",
                "10.96.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        # Same identities kubeadm uses, so the bootstrap RBAC roles apply unchanged.
        identities = {
            "admin": ("kubernetes-admin", "system:masters"),
            "controller-manager": ("system:kube-controller-manager", None),
            "scheduler": ("system:kube-scheduler", None),
        }
        for stem, (cn, org) in identities.items():
            pair = pki.issue(ca, self.pki, stem, cn, org=org, client=True)
            path = self.kubeconfig if stem == "admin" else self.dir / f"{stem}.kubeconfig"
            path.write_text(self._kubeconfig_text(pair))
            path.chmod(0o600)
        pki.create_service_account_keys(self.pki)
        # the aggregation layer, as kubeadm sets it up: a separate CA for the front proxy
        front = pki.create_ca(self.pki, "front-proxy-ca", stem="front-proxy-ca")
        pki.issue(front, self.pki, "front-proxy-client", "front-proxy-client", client=True)
        (self.dir / "scheduler-config.yaml").write_text(
            yaml.safe_dump(self.scheduler_config(), sort_keys=False)
        )

    def _kubeconfig_text(self, pair: pki.KeyPair) -> str:
        name = self.spec.name
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": name,
                        "cluster": {
                            "server": self.server,
                            "certificate-authority": str(self.pki / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": f"{name}-{pair.cert.stem}",
                        "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
                    }
                ],
                "contexts": [
                    {"name": name, "context": {"cluster": name, "user": f"{name}-{pair.cert.stem}"}}
                ],
                "current-context": name,
            },
            sort_keys=False,
        )

    def scheduler_config(self) -> dict[str, Any]:
        """The default kube-scheduler's KubeSchedulerConfiguration (chapters extend it)."""
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.dir / "scheduler.kubeconfig")},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}],
        }

    def _start_control_plane(self, progress: Progress) -> None:
        p = self.spec.ports
        pk = self.pki
        logs = self.dir / "logs"
        progress("starting etcd")
        self.start_process(
            "etcd",
            [
                str(binaries.binary("etcd")),
                f"--name={self.spec.name}",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{p['etcdPeer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcdPeer']}",
                f"--initial-cluster={self.spec.name}=http://127.0.0.1:{p['etcdPeer']}",
                "--listen-metrics-urls=",
                # a throw-away lab cluster: skipping fsync makes start-up seconds faster
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            ports=[p["etcd"], p["etcdPeer"]],
        )
        self.wait_http(f"http://127.0.0.1:{p['etcd']}/health", "etcd", tls=False)
        progress("starting kube-apiserver")
        self.start_process(
            "kube-apiserver",
            [
                str(binaries.binary("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['apiserver']}",
                f"--tls-cert-file={pk / 'apiserver.crt'}",
                f"--tls-private-key-file={pk / 'apiserver.key'}",
                f"--client-ca-file={pk / 'ca.crt'}",
                f"--service-account-key-file={pk / 'sa.pub'}",
                f"--service-account-signing-key-file={pk / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                # the aggregation layer (kubeadm's flags): aggregated APIs such as Kueue's
                # visibility server trust the front proxy's certificate and X-Remote-* headers
                f"--requestheader-client-ca-file={pk / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pk / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pk / 'front-proxy-client.key'}",
                f"--service-cluster-ip-range={network.SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # kwok serves `kubectl logs` on the node's InternalIP (127.0.0.1)
                "--kubelet-preferred-address-types=InternalIP",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                # 127.0.0.1 may not be an Endpoints address; nothing in-cluster dials it
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                f"--audit-log-path={logs / 'audit.log'}" if os.environ.get("GPULAB_AUDIT") else "",
            ],
            ports=[p["apiserver"]],
        )
        self.wait_http(f"{self.server}/readyz", "kube-apiserver")
        progress(
            f"kube-apiserver ready at {self.server}; starting controller-manager, scheduler, kwok"
        )
        self.start_process(
            "kube-controller-manager",
            [
                str(binaries.binary("kube-controller-manager")),
                f"--kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['controllerManager']}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pk / 'sa.key'}",
                f"--root-ca-file={pk / 'ca.crt'}",
                f"--cluster-signing-cert-file={pk / 'ca.crt'}",
                f"--cluster-signing-key-file={pk / 'ca.key'}",
                f"--service-cluster-ip-range={network.SERVICE_CIDR}",
                "--profiling=false",
                # Pod IPs here are loopback addresses, which Endpoints may not hold; the
                # pod runner's service proxy reads the pods instead (podrunner/proxy.py)
                "--controllers=" + ",".join(CONTROLLERS),
            ],
            ports=[p["controllerManager"]],
        )
        self.start_process(
            "kube-scheduler",
            [
                str(binaries.binary("kube-scheduler")),
                f"--config={self.dir / 'scheduler-config.yaml'}",
                f"--authentication-kubeconfig={self.dir / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={self.dir / 'scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['scheduler']}",
                "--profiling=false",
            ],
            ports=[p["scheduler"]],
        )
        # kwok reads the Logs objects of the lab's own pods (`kubectl logs`)
        apply(self.api(), [HERE / "kwok-crds.yaml"], lambda _m: None)
        kwok_port = free_port()
        kwok_cert = self.issue_serving_cert("kwok", "kwok")
        self.start_process(
            "kwok",
            [
                str(binaries.binary("kwok")),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={HERE / 'kwok-stages.yaml'}",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40",
                "--node-ip=127.0.0.1",
                f"--node-port={kwok_port}",
                f"--server-address=127.0.0.1:{kwok_port}",
                f"--tls-cert-file={kwok_cert.cert}",
                f"--tls-private-key-file={kwok_cert.key}",
                "--enable-crds=Logs",
            ],
            ports=[kwok_port],
        )

    def start_process(
        self,
        name: str,
        argv: list[str],
        ports: list[int] | None = None,
        env: dict[str, str] | None = None,
        service: str | None = None,
    ) -> ProcessRecord:
        """Start a host process that belongs to this cluster (stopped by `down`).

        ``service`` names the Service of ``manifests/`` the process stands for; its first
        port then serves what that Service would (webhooks point there).
        """
        argv = [a for a in argv if a]
        log = self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # outlives `gpulab up`; `down` stops it
            )
        self._children[proc.pid] = proc
        record = ProcessRecord(
            name, proc.pid, argv[0], str(log), list(ports or []), service, argv, dict(env or {})
        )
        # a component started again under its name (after a kill) replaces its dead record
        live = [p for p in self.processes() if p.name != name or pid_alive(p.pid, p.exe)]
        self._save([*live, record])
        return record

    def stop_process(self, name: str, forget: bool = False) -> ProcessRecord:
        """Stop one of the cluster's processes (SIGTERM, then SIGKILL); keep its record
        (to start it again) unless ``forget``: a process that is gone for good, which
        ``check_alive`` must no longer count."""
        procs = self.processes()
        rec = next((p for p in procs if p.name == name), None)
        if rec is None:
            raise HarnessError(f"cluster {self.spec.name} has no process {name!r}")
        _stop(rec)
        if forget:
            self._save([p for p in procs if p.name != name])
        return rec

    def restart_process(self, name: str) -> ProcessRecord:
        """Stop a host process and start it again with the same command line and
        environment (a node agent re-reading its kubelet config)."""
        rec = self.stop_process(name)
        return self.start_process(rec.name, rec.argv, rec.ports, rec.env, rec.service)

    def check_alive(self) -> None:
        for rec in self.processes():
            child = self._children.get(rec.pid)
            alive = child.poll() is None if child else pid_alive(rec.pid, rec.exe)
            if not alive:
                tail = _tail(Path(rec.log)) or "no output"
                code = child.returncode if child else None
                if code is not None:
                    tail = f"exit status {code}" + (" (killed by a signal)" if code < 0 else "")
                    tail += f"; {_tail(Path(rec.log)) or 'no output'}"
                raise HarnessError(f"{rec.name} exited during start-up: {tail} (log: {rec.log})")

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS as the cluster admin: trusts the cluster CA, presents the admin cert."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def wait_http(self, url: str, what: str, tls: bool = True, verify: bool = True) -> None:
        kwargs: dict[str, Any] = {"timeout": 2.0}
        if not verify:
            # controller-manager and scheduler serve a self-signed cert on loopback,
            # as they do under kubeadm; we only ask whether they are up
            kwargs["verify"] = False
        elif tls:
            kwargs["verify"] = self.admin_ssl_context()
        with httpx.Client(**kwargs) as client:

            def healthy() -> bool:
                self.check_alive()  # a component that died says so at once
                with contextlib.suppress(httpx.HTTPError):
                    return client.get(url).status_code == 200
                return False

            try:
                wait_for(healthy, START_TIMEOUT, f"{what} ({url})", interval=0.1)
            except WaitTimeout:
                raise HarnessError(
                    f"{what} did not become healthy in {START_TIMEOUT:.0f}s ({url})"
                ) from None

    # ---------------------------------------------------------------- nodes

    # ---------------------------------------------------------------- GPUs

    def fake_gpu_dir(self, node: str) -> Path:
        """The node's NVML shim state (config, faults.log): /var/lib/fake-gpu/<node> on the
        node, where the device plugin's init container renders it."""
        return volumes.host_path(self.dir, node, paths.NODE_STATE_DIR) / node

    runs_containers = False

    def allocation(self, namespace: str, pod: str, container: str) -> dict[str, str] | None:
        """kwok runs no container: the node agent records each Allocate response on the
        pod, as kubelet keeps it in its checkpoint file."""
        from gpulab.nodeagent.policy import annotation_key

        meta = client.CoreV1Api(self.api()).read_namespaced_pod(pod, namespace).metadata
        raw = (meta.annotations or {}).get(annotation_key(container))
        return dict(json.loads(raw)["envs"]) if raw else None

    def exec(self, namespace: str, pod: str, container: str, argv: list[str]) -> str:
        raise HarnessError(
            "the local backend runs no workload containers (kwok simulates them): "
            "`exec` needs a real kubelet (--backend kind)"
        )

    def inject_fault(self, node: str, gpu: int, xid: int) -> None:
        faults.inject_xid(self.fake_gpu_dir(node), gpu, xid)

    def clear_faults(self, node: str, gpu: int | None = None) -> None:
        faults.clear(self.fake_gpu_dir(node), gpu)

    # ---------------------------------------------------------------- nodes

    def _create_nodes(self, progress: Progress) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api())
        # With an addon that deploys a device plugin the node agent advertises the GPUs,
        # as kubelet does
        static = not addons.DEVICE_PLUGINS & set(self.spec.addons)
        for node in self.spec.nodes:
            core.create_node(node_object(node, static_gpus=static))
        gpus = sum(1 for n in self.spec.nodes if n.profile)
        progress(f"created {len(self.spec.nodes)} simulated nodes ({gpus} with GPUs)")

    def _start_pod_runner(self, progress: Progress) -> None:
        """kubelet for the lab's own pods (harness/podrunner), on the cluster's own
        loopback block, and a node agent (kubelet's device manager) per GPU node; each
        node gets the files kind would mount into its container."""
        for node in self.spec.nodes:
            (self.dir / "nodes" / node.name / "device-plugins").mkdir(parents=True, exist_ok=True)
            # /run is a tmpfs: a node starts without what its pods left there last time
            _rmtree(volumes.host_path(self.dir, node.name, "/run"))
            if node.profile:
                mounted = volumes.host_path(self.dir, node.name, PROFILE_MOUNT)
                mounted.parent.mkdir(parents=True, exist_ok=True)
                mounted.write_text(profiles.resolve(node.profile).read_text())
        block = self._block = network.acquire_block(self.dir)
        for node in self.spec.nodes:
            if node.profile:  # kubelet's device manager, for the node's device plugin pods
                root = volumes.kubelet_root(self.dir, node.name)
                (root / KUBELET_CONFIG).write_text(self.spec.kubelet.to_yaml())
                # what kubelet learns from the machine (cAdvisor): its NUMA nodes
                machine = MachineInfo.of(
                    node.name,
                    node.profile,
                    int(parse_quantity(node.cpu)),
                    int(parse_quantity(node.memory)),
                )
                (root / MACHINE_INFO).write_text(machine.to_yaml())
                sockets = volumes.host_path(self.dir, node.name, volumes.DEVICE_PLUGIN_DIR)
                self.start_process(
                    f"node-agent-{node.name}",
                    [
                        *GPULAB,
                        "node-agent",
                        f"--node-name={node.name}",
                        f"--socket-dir={sockets}",
                        f"--kubeconfig={self.kubeconfig}",
                    ],
                )
        self.start_process(
            POD_RUNNER,
            [
                *GPULAB,
                "pod-runner",
                f"--kubeconfig={self.kubeconfig}",
                f"--cluster-dir={self.dir}",
                f"--block={block}",
                f"--api-port={self.spec.ports['apiserver']}",
            ],
        )
        progress(
            f"pod runner started: pods at 127.{block}.128.0/17, Services at 127.{block}.0.0/17"
        )

    def _wait_ready(self, progress: Progress) -> None:
        from kubernetes import client

        api = self.api()
        core = client.CoreV1Api(api)
        want = {n.name for n in self.spec.nodes}
        ready: set[str] = set()

        def all_ready() -> bool:
            self.check_alive()
            now = {
                n.metadata.name
                for n in core.list_node().items
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            } & want
            if now != ready:
                ready.clear()
                ready.update(now)
                progress(f"nodes Ready: {len(now)}/{len(want)}")
            # Pods need the namespace's default ServiceAccount (made by the controller-manager).
            return want <= now and _has_default_sa(core)

        try:
            wait_for(all_ready, START_TIMEOUT, "nodes to be Ready")
        except WaitTimeout:
            raise HarnessError(
                f"nodes not Ready after {START_TIMEOUT:.0f}s: {sorted(want - ready)}; "
                f"see {self.dir / 'logs' / 'kwok.log'}"
            ) from None
        for name, key in (("controller-manager", "controllerManager"), ("scheduler", "scheduler")):
            port = self.spec.ports[key]
            self.wait_http(f"https://127.0.0.1:{port}/healthz", name, verify=False)

    def ensure_addon(self, name: str, progress: Progress) -> None:
        """Start an addon (harness/addons) on this running cluster unless it already runs.

        Demos call this, so `make demo-kueue` works on a cluster brought up without it.
        """
        self.ensure_addons([name], progress)

    def ensure_addons(self, names: list[str], progress: Progress) -> None:
        """Start those of ``names`` that do not run yet, side by side (addons.start_all)."""
        for name in names:
            if name not in addons.ADDONS:
                raise HarnessError(f"unknown addon {name!r}; known: {', '.join(addons.ADDONS)}")
        running = self._addons()
        new = [n for n in names if n not in running]
        if not new:
            return
        addons.start_all(new, self, progress)
        state = json.loads(self._state_file.read_text())
        state["addons"] = [*state.get("addons", []), *new]
        self._state_file.write_text(json.dumps(state, indent=1))

    def _addons(self) -> list[str]:
        if not self._state_file.exists():
            return []
        return list(json.loads(self._state_file.read_text()).get("addons", []))

    def service_host(self, cluster_ip: str) -> str | None:
        return network.service_address(self.block, cluster_ip)

    def apply_transform(self, dry_run_workloads: bool = False) -> LocalTransform:
        """How manifests meet this cluster (harness/apply.py); ``dry_run_workloads`` for an
        addon whose host processes stand in for its Deployments/DaemonSets."""
        services = {r.service: r.ports[0] for r in self.processes() if r.service and r.ports}
        ca = pki.KeyPair(self.pki / "ca.crt", self.pki / "ca.key")
        return LocalTransform(ca, self.pki, self.block, services, dry_run_workloads)

    @property
    def block(self) -> int | None:
        """K of the cluster's loopback block 127.K.0.0/16 (harness/podrunner/network.py),
        None while the cluster is down."""
        if not self._state_file.exists():
            return None
        return json.loads(self._state_file.read_text()).get("block")

    def apply(self, paths: list[Path], progress: Progress) -> None:
        apply(self.api(), paths, progress, self.apply_transform())

    def issue_serving_cert(self, stem: str, cn: str) -> pki.KeyPair:
        """A serving cert for a component on 127.0.0.1, signed by the cluster CA."""
        ca = pki.KeyPair(self.pki / "ca.crt", self.pki / "ca.key")
        return pki.issue(ca, self.pki, stem, cn, hosts=("127.0.0.1", "localhost"))

    def _apply_base(self, progress: Progress) -> None:
        apply(self.api(), [MANIFESTS / "base"], progress, self.apply_transform())

    # ---------------------------------------------------------------- down / status

    def down(self, progress: Progress) -> None:
        procs = self.processes()
        if not procs:
            progress(f"cluster {self.spec.name} is not running")
            return
        # Components (anything after the control plane) all at once, then the control
        # plane in reverse start order, etcd last, so kube-apiserver shuts down cleanly
        # instead of retrying etcd.
        control = [p for p in procs if p.name in CONTROL_PLANE]
        _stop(*[p for p in procs if p.name not in CONTROL_PLANE])
        for rec in reversed(control):
            _stop(rec)
        ports = [port for rec in procs for port in rec.ports]
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: not any(port_in_use(p) for p in ports), 10, "ports", 0.05)
        busy = [p for p in ports if port_in_use(p)]
        left = runtime.kill_leftovers(self.dir)
        if left:
            progress(f"stopped {left} process(es) left behind by the cluster's pods")
        self._state_file.unlink(missing_ok=True)
        network.release_block(self.dir)
        if busy:
            raise HarnessError(f"ports {busy} are still in use after stopping the cluster")
        progress(f"cluster {self.spec.name} stopped ({len(procs)} processes)")


STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL


def _stop(*recs: ProcessRecord) -> None:
    """SIGTERM each process's group, wait up to STOP_GRACE for all, SIGKILL what is left
    and wait until it is gone: a process restarted under its name must not find the old
    one still dying (its record would be kept, and check_alive would report the old
    process's death as the new one's)."""
    alive = [r for r in recs if pid_alive(r.pid, r.exe)]
    for rec in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec.pid, signal.SIGTERM)
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: not any(pid_alive(r.pid, r.exe) for r in alive), STOP_GRACE, "exit", 0.02)
    left = [r for r in alive if pid_alive(r.pid, r.exe)]
    for rec in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec.pid, signal.SIGKILL)
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: not any(pid_alive(r.pid, r.exe) for r in left), 5.0, "exit", 0.02)


def _has_default_sa(core: Any) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        core.read_namespaced_service_account("default", "default")
    except ApiException:
        return False
    return True


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:300] for line in text[-lines:])


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
