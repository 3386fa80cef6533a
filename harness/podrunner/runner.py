"""The pod runner: kubelet's pod lifecycle for the lab's own pods on kwok nodes.

kwok plays kubelet for every simulated pod (its Stages say when a pod is Running), but a
pod of the lab's own image (``gpulab:dev``) must really run: the device plugin has to serve
gRPC, the extender HTTP. kwok's Stages leave those pods alone (``harness/kwok-stages.yaml``)
and this process runs them, one worker per pod, as kubelet's ``podWorkers`` / ``syncPod``
do (``pkg/kubelet/pod_workers.go``, ``kubelet.go``, ``kuberuntime/kuberuntime_manager.go``):

    pod bound to a node ─► sandbox: a loopback pod IP, volumes (hostPath → the node's
    rootfs, configMap/secret/projected → files, the ServiceAccount token from the
    TokenRequest API) ─► init containers one by one ─► containers (host processes) ─►
    probes ─► status (phase, conditions, containerStatuses, restartCount) ─► restart per
    restartPolicy with kubelet's back-off (CrashLoopBackOff) ─► on deletion SIGTERM,
    SIGKILL after the grace period, then the final delete.

Rules for running a container as a host process are in container.py (paths, addresses),
the images it can run in ``harness/pod-images.yaml``, the pod network in network.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpulab import informer
from gpulab.trace import ObjectRef, Tracer
from harness.podrunner import container as containers
from harness.podrunner import probes, runtime, volumes
from harness.podrunner.api import RunnerAPI
from harness.podrunner.forkserver import ForkServer
from harness.podrunner.images import LAB_IMAGE, Image
from harness.podrunner.network import PodIPs
from harness.podrunner.status import ContainerStatus, now_rfc3339, pod_status

_log = logging.getLogger("gpulab.podrunner")
Obj = dict[str, Any]

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_SYNC_SECONDS = 0.25
_VOLUME_RESYNC_SECONDS = 30.0
_MOUNT_RETRY_SECONDS = 1.0  # kubelet retries a failed mount within a second or two
# kubelet: a container that ran this long has its back-off reset
_BACKOFF_RESET_SECONDS = 600.0


def _slug(image: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", image.lower()).strip("-")


def is_lab_pod(pod: Mapping[str, Any]) -> bool:
    """Pods this runner owns: any (init) container of the lab's image (kwok skips them)."""
    spec = pod.get("spec") or {}
    every = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return any(c.get("image") == LAB_IMAGE for c in every)


@dataclass(frozen=True)
class RunnerConfig:
    cluster_dir: Path
    api_host: str
    api_port: int
    ca_file: Path
    images: dict[str, Image]
    backoff_initial: float = 10.0  # kubelet's initial container restart back-off
    backoff_max: float = 300.0  # kubelet's MaxContainerBackOff

    @property
    def service_env(self) -> dict[str, str]:
        # kubelet's service links for the `kubernetes` Service; here the API server itself
        return {
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
            "KUBERNETES_PORT": f"tcp://{self.api_host}:{self.api_port}",
        }


class PodRunner:
    """Watches pods; one :class:`PodWorker` per lab pod bound to a node."""

    def __init__(self, config: RunnerConfig, api: RunnerAPI, ips: PodIPs) -> None:
        self.config = config
        self.api = api
        self.ips = ips
        self.spawner = runtime.Spawner()
        self.forkers = {
            name: ForkServer(
                config.cluster_dir / f"{_slug(name)}.fork.sock",
                image.preload,
                {
                    **image.env,
                    "PATH": ":".join(image.search_path),
                    runtime.CLUSTER_ENV: str(config.cluster_dir),
                },
                Path(sys.executable).parent,
                config.cluster_dir / "logs" / f"{_slug(name)}.fork-server.log",
                self._launch,
            )
            for name, image in config.images.items()
            if image.preload
        }
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.RLock()
        self._tracers: dict[str, Tracer] = {}
        self.pods = informer.Informer(
            informer.ListWatch(api.api, informer.PODS),
            informer.Handlers(
                on_add=self._changed,
                on_update=lambda _o, n: self._changed(n),
                on_delete=self._deleted,
            ),
            name="pod-runner-pods",
        )

    def tracer(self, node: str) -> Tracer:
        """Events as kubelet writes them (Created, Started, Killing, BackOff ...), per node."""
        with self._lock:
            if node not in self._tracers:
                self._tracers[node] = Tracer("pod-runner", self.api.api, instance=node)
            return self._tracers[node]

    def _launch(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            return self.spawner.spawn(
                lambda: runtime.launch(argv, env, self.config.cluster_dir, out)
            )

    def start(self) -> None:
        for forker in self.forkers.values():
            forker.start()
        self.pods.start()

    def stop(self, grace: float = 10.0) -> None:
        """Stop watching and stop every container (the cluster is going away)."""
        self.pods.stop()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.join(timeout=grace + 2)
        for forker in self.forkers.values():
            forker.stop()
        self.spawner.stop()

    def _changed(self, pod: Obj) -> None:
        spec = pod.get("spec") or {}
        if not spec.get("nodeName") or not is_lab_pod(pod):
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is None:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and not pod[
                    "metadata"
                ].get("deletionTimestamp"):
                    return  # finished before this runner started: nothing to run
                self.ips.reserve((pod.get("status") or {}).get("podIP", ""))
                worker = PodWorker(self, pod)
                self._workers[uid] = worker
                worker.start()
                return
        worker.update(pod)

    def _deleted(self, pod: Obj) -> None:
        with self._lock:
            worker = self._workers.get(pod["metadata"].get("uid", ""))
        if worker is not None:
            worker.gone()

    def forget(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)


@dataclass
class _Container:
    spec: Obj
    status: ContainerStatus
    image: Image | None
    process: runtime.Process | None = None
    plan: containers.Plan | None = None
    next_start: float = 0.0  # monotonic; back-off before the next start
    waiting: float = 0.0  # the back-off being waited out
    delay: float = 0.0  # the back-off after the next failure
    probers: dict[str, probes.Prober] | None = None


class PodWorker(threading.Thread):
    """kubelet's pod worker for one pod: syncs it until it is deleted."""

    def __init__(self, runner: PodRunner, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.runner = runner
        self.cfg = runner.config
        self.pod = pod
        self.uid = meta["uid"]
        self.ref = ObjectRef("Pod", meta["name"], meta["namespace"], meta["uid"])
        self.node = pod["spec"]["nodeName"]
        self.tracer = runner.tracer(self.node)
        self.dir = self.cfg.cluster_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        self.log_dir = (
            self.cfg.cluster_dir
            / "logs"
            / "pods"
            / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        )
        self.volumes = volumes.PodVolumes(pod, self.cfg.cluster_dir, self.dir)
        images = self.cfg.images
        spec = pod["spec"]
        self.init = [self._container(c, True, images) for c in spec.get("initContainers") or []]
        self.app = [self._container(c, False, images) for c in spec.get("containers") or []]
        self.pod_ip: str | None = (pod.get("status") or {}).get("podIP")
        self.start_time = (pod.get("status") or {}).get("startTime") or now_rfc3339()
        self.sandbox_ready = False
        self._mount_error: str | None = None
        self._next_mount_try = 0.0
        self._next_volume_sync = 0.0
        self._wake = threading.Event()
        self._gone = threading.Event()
        self._shutdown = threading.Event()
        self._last_status = ""
        self._warned: set[str] = set()

    @staticmethod
    def _container(spec: Obj, init: bool, images: Mapping[str, Image]) -> _Container:
        return _Container(
            spec,
            ContainerStatus(spec["name"], spec.get("image", ""), init=init),
            images.get(spec.get("image", "")),
        )

    # ------------------------------------------------------------- inputs

    def update(self, pod: Obj) -> None:
        self.pod = pod
        self._wake.set()

    def gone(self) -> None:
        self._gone.set()
        self._wake.set()

    def shutdown(self) -> None:
        self._shutdown.set()
        self._wake.set()

    # ------------------------------------------------------------- loop

    def run(self) -> None:
        try:
            while True:
                if self._shutdown.is_set() or self._gone.is_set():
                    self._kill_all(grace=2.0 if self._shutdown.is_set() else 0.0)
                    break
                pod = self.pod
                if pod["metadata"].get("deletionTimestamp"):
                    self._terminate(pod)
                    break
                try:
                    self._sync(pod)
                except Exception:
                    _log.exception("syncing pod %s failed", self.ref)
                self._wake.wait(_SYNC_SECONDS)
                self._wake.clear()
        finally:
            if self.pod_ip and not self._shutdown.is_set():
                self.runner.ips.release(self.pod_ip)
            if not self._shutdown.is_set():
                volumes.remove_pod_dir(self.dir)
            self.runner.forget(self.uid)

    def _sync(self, pod: Obj) -> None:
        if not self.sandbox_ready:
            self._create_sandbox(pod)
        if self.sandbox_ready:
            now = time.monotonic()
            if now >= self._next_volume_sync:
                self._next_volume_sync = now + _VOLUME_RESYNC_SECONDS
                try:
                    self.volumes.pod = pod
                    self.volumes.sync(self.runner.api)
                except Exception as exc:  # keep running on the last good files, as kubelet
                    _log.warning("refreshing the volumes of %s: %s", self.ref, exc)
            if self._sync_init(pod):
                self._sync_app(pod)
        self._write_status(pod)

    def _create_sandbox(self, pod: Obj) -> None:
        """What kubelet does before any container: images, pod IP, volumes."""
        if time.monotonic() < self._next_mount_try:
            return
        self._next_mount_try = time.monotonic() + _MOUNT_RETRY_SECONDS
        for c in [*self.init, *self.app]:
            if c.image is None:
                message = (
                    f"image {c.spec.get('image')!r} cannot run on the local backend: the pod "
                    f"runner runs {', '.join(sorted(self.cfg.images))} (harness/pod-images.yaml)"
                )
                self._wait_all("ErrImagePull", message)
                self._event_once("Failed", message)
                return
        if self.pod_ip is None:
            host_network = pod["spec"].get("hostNetwork", False)
            self.pod_ip = "127.0.0.1" if host_network else self.runner.ips.allocate()
            # the downward API (status.podIP) must see it before any container starts
            status = dict(pod.get("status") or {}, podIP=self.pod_ip, podIPs=[{"ip": self.pod_ip}])
            pod = {**pod, "status": status}
            self.pod = pod
        try:
            self.volumes.pod = pod
            self.volumes.sync(self.runner.api)
        except containers.ContainerError as exc:
            self._wait_all("ContainerCreating", str(exc))
            self._event_once("FailedMount", f"MountVolume.SetUp failed: {exc}", warning=True)
            return
        except Exception as exc:  # the API server may be restarting: try again
            _log.warning("preparing the volumes of %s: %s", self.ref, exc)
            return
        self._next_volume_sync = time.monotonic() + _VOLUME_RESYNC_SECONDS
        self.sandbox_ready = True
        self.runner.api.set_logs(
            pod,
            {
                c.spec["name"]: (str(self._log_path(c, c.status.restart_count)), None)
                for c in [*self.init, *self.app]
            },
        )

    def _wait_all(self, reason: str, message: str) -> None:
        for c in [*self.init, *self.app]:
            if c.process is None:
                c.status.state = {"waiting": {"reason": reason, "message": message}}

    def _ref(self, c: _Container) -> ObjectRef:
        """The container, as kubelet's Events name it (each its own Event series)."""
        kind = "initContainers" if c.status.init else "containers"
        return dataclasses.replace(self.ref, field_path=f"spec.{kind}{{{c.spec['name']}}}")

    def _event_once(self, reason: str, message: str, warning: bool = True) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        self.tracer.step(reason, self.ref, message, warning=warning, node=self.node)

    # ------------------------------------------------------------- containers

    def _sync_init(self, pod: Obj) -> bool:
        """Run init containers in order; True once all have succeeded."""
        restart_policy = pod["spec"].get("restartPolicy", "Always")
        for c in self.init:
            if c.status.succeeded:
                continue
            self._sync_one(pod, c, restart_policy if restart_policy != "Always" else "OnFailure")
            return False
        return True

    def _sync_app(self, pod: Obj) -> None:
        restart_policy = pod["spec"].get("restartPolicy", "Always")
        for c in self.app:
            self._sync_one(pod, c, restart_policy)

    def _sync_one(self, pod: Obj, c: _Container, restart_policy: str) -> None:
        now = time.monotonic()
        if c.process is not None:
            code = c.process.exit_code()
            if code is None:
                self._probe(pod, c, now)
                return
            self._exited(c, code, "Completed" if code == 0 else "Error")
        term = c.status.terminated
        if term is not None:
            code = term.get("exitCode", 1)
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
            if not restart:
                return
            self._schedule_restart(c, now)
        if now < c.next_start:
            delay = round(c.waiting)
            meta = pod["metadata"]
            who = f"{meta['name']}_{meta['namespace']}({self.uid})"
            message = f"back-off {delay}s restarting failed container={c.spec['name']} pod={who}"
            if c.status.state.get("waiting", {}).get("reason") != "CrashLoopBackOff":
                self.tracer.step(
                    "BackOff",
                    self._ref(c),
                    f"Back-off restarting failed container {c.spec['name']} in pod {who}",
                    warning=True,
                )
            c.status.state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            return
        self._start(pod, c)

    def _schedule_restart(self, c: _Container, now: float) -> None:
        """Move the terminated state to lastState and pick the next back-off (kubelet:
        the first restart is immediate, then 10 s doubling to 5 min)."""
        term = c.status.terminated or {}
        ran = _seconds_between(term.get("startedAt"), term.get("finishedAt"))
        if ran is not None and ran >= _BACKOFF_RESET_SECONDS:
            c.delay = 0.0
        c.status.last_state = {"terminated": term}
        c.status.state = {"waiting": {"reason": "ContainerCreating"}}
        c.status.restart_count += 1
        c.waiting = c.delay
        c.next_start = now + c.delay
        c.delay = min(max(c.delay * 2, self.cfg.backoff_initial), self.cfg.backoff_max)

    def _start(self, pod: Obj, c: _Container) -> None:
        assert c.image is not None and self.pod_ip is not None
        name = c.spec["name"]
        try:
            c.plan = self._plan(pod, c)
            executable = c.image.which(c.plan.argv[0])
            if executable is None:
                raise FileNotFoundError(
                    f'exec: "{c.plan.argv[0]}": executable file not found in $PATH'
                )
            log = self._log_path(c, c.status.restart_count)
            c.process = runtime.start(
                self.runner.spawner,
                c.plan,
                executable,
                log,
                self.dir / "work" / name,
                {runtime.CLUSTER_ENV: str(self.cfg.cluster_dir), runtime.POD_UID_ENV: self.uid},
                self.runner.forkers.get(c.image.name),
            )
        except containers.ContainerError as exc:
            c.status.state = {"waiting": {"reason": exc.reason, "message": str(exc)}}
            self._event_once("Failed", f"Error: {exc}")
            c.waiting = max(c.delay, self.cfg.backoff_initial)
            c.next_start = time.monotonic() + c.waiting
            return
        except OSError as exc:
            stamp = now_rfc3339()
            message = f"failed to start container {name!r}: {exc}"
            c.status.state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": message,
                    "startedAt": stamp,
                    "finishedAt": stamp,
                }
            }
            self.tracer.step("Failed", self._ref(c), f"Error: {message}", warning=True)
            return
        started = c.process.started.strftime("%Y-%m-%dT%H:%M:%SZ")
        c.status.state = {"running": {"startedAt": started}}
        c.status.container_id = f"gpulab://{c.process.pid}"
        c.status.started = "startupProbe" not in c.spec
        c.status.ready = "readinessProbe" not in c.spec and c.status.started
        mono = time.monotonic()
        c.probers = {
            kind: probes.Prober(kind, c.spec[f"{kind}Probe"], mono)
            for kind in ("startup", "readiness", "liveness")
            if f"{kind}Probe" in c.spec
        }
        if c.status.restart_count:
            self._update_logs(pod)
        self.tracer.step(
            "Started",
            self._ref(c),
            f"Started container {name} (pid {c.process.pid})",
            container=name,
            argv=c.plan.argv,
        )

    def _plan(self, pod: Obj, c: _Container) -> containers.Plan:
        assert c.image is not None and self.pod_ip is not None
        ns = pod["metadata"]["namespace"]
        api = self.runner.api
        refs = _env_references(c.spec)
        configmaps = {n: d for n in refs["ConfigMap"] if (d := api.config_map(ns, n)) is not None}
        secrets = {n: d for n in refs["Secret"] if (d := api.secret(ns, n)) is not None}
        live = {
            **pod,
            "status": {**(pod.get("status") or {}), "podIP": self.pod_ip, "hostIP": "127.0.0.1"},
        }
        env = containers.environment(live, c.spec, configmaps, secrets, self.cfg.service_env)
        base = {
            **self.cfg.service_env,
            "HOSTNAME": pod["metadata"]["name"],
            "HOME": str(self.dir / "home"),
            "PATH": ":".join(c.image.search_path),
        }
        mounts = self.volumes.mounts(c.spec)
        ip = None if pod["spec"].get("hostNetwork") else self.pod_ip
        plan = containers.plan(live, c.spec, c.image.entrypoint, c.image.env, mounts, env, base, ip)
        if c.image.adapter == "kube-scheduler":
            plan = self._adapt_kube_scheduler(plan)
        return plan

    def _adapt_kube_scheduler(self, plan: containers.Plan) -> containers.Plan:
        """The stock kube-scheduler as a host process (harness/pod-images.yaml)."""
        sa = next((m.host_path for m in plan.mounts if m.mount_path.rstrip("/") == SA_MOUNT), None)
        if sa is None:
            raise containers.ContainerError(
                "CreateContainerConfigError",
                "kube-scheduler needs the pod's ServiceAccount token "
                "(automountServiceAccountToken)",
            )
        kubeconfig = self.dir / "kube-scheduler.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "in-cluster",
                            "cluster": {
                                "server": f"https://{self.cfg.api_host}:{self.cfg.api_port}",
                                "certificate-authority": f"{sa}/ca.crt",
                            },
                        }
                    ],
                    "users": [{"name": "pod", "user": {"tokenFile": f"{sa}/token"}}],
                    "contexts": [
                        {"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "pod"}}
                    ],
                    "current-context": "in-cluster",
                }
            )
        )
        argv = list(plan.argv)
        for i, arg in enumerate(argv):
            if arg.startswith("--config="):
                source = Path(arg.split("=", 1)[1])
                config = yaml.safe_load(source.read_text())
                config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
                for extender in config.get("extenders") or []:
                    extender["urlPrefix"] = containers.rewrite_addresses(
                        extender.get("urlPrefix", ""), self.pod_ip or ""
                    )
                adapted = self.dir / "kube-scheduler-config.yaml"
                adapted.write_text(yaml.safe_dump(config))
                argv[i] = f"--config={adapted}"
        flags = {a.split("=", 1)[0] for a in argv}
        for flag, value in (
            ("--bind-address", self.pod_ip),
            ("--authentication-kubeconfig", kubeconfig),
            ("--authorization-kubeconfig", kubeconfig),
        ):
            if flag not in flags:
                argv.append(f"{flag}={value}")
        return containers.Plan(argv, plan.env, plan.cwd, plan.mounts)

    def _probe(self, pod: Obj, c: _Container, now: float) -> None:
        assert c.plan is not None and self.pod_ip is not None
        for kind, prober in (c.probers or {}).items():
            if kind != "startup" and not c.status.started:
                continue
            if kind == "startup" and c.status.started:
                continue
            if not prober.due(now):
                continue
            ok, message = probes.run(prober.spec, c.spec, self.pod_ip, c.plan.env, str(self.dir))
            verdict = prober.record(ok, now)
            if not ok:
                self.tracer.step(
                    "Unhealthy",
                    self._ref(c),
                    f"{kind.capitalize()} probe failed: {message}",
                    warning=True,
                    container=c.spec["name"],
                )
            if verdict is None:
                continue
            if kind == "readiness":
                c.status.ready = verdict
            elif kind == "startup" and verdict:
                c.status.started = True
                c.status.ready = "readinessProbe" not in c.spec
            elif not verdict:  # liveness or startup failed: kubelet kills and restarts it
                self.tracer.step(
                    "Killing",
                    self._ref(c),
                    f"Container {c.spec['name']} failed {kind} probe, will be restarted",
                    container=c.spec["name"],
                )
                assert c.process is not None
                code = c.process.stop(_grace(pod))
                self._exited(c, code, "Error")

    def _exited(self, c: _Container, code: int, reason: str) -> None:
        assert c.process is not None
        started = c.process.started.strftime("%Y-%m-%dT%H:%M:%SZ")
        c.status.state = {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": started,
                "finishedAt": now_rfc3339(),
                "containerID": c.status.container_id,
            }
        }
        c.status.ready = False
        c.status.started = False
        c.process = None

    # ------------------------------------------------------------- termination

    def _terminate(self, pod: Obj) -> None:
        """Deletion: stop every container within the grace period, then delete the pod."""
        grace = _grace(pod)
        running = [c for c in [*self.app, *self.init] if c.process is not None]
        for c in running:
            self.tracer.step(
                "Killing",
                self._ref(c),
                f"Stopping container {c.spec['name']}",
                container=c.spec["name"],
            )
        self._kill_all(grace)
        try:
            self.runner.api.delete_pod(pod)
        except Exception as exc:
            _log.warning("final delete of %s failed: %s", self.ref, exc)

    def _kill_all(self, grace: float) -> None:
        stoppers = []
        for c in [*self.app, *self.init]:
            if c.process is not None:
                t = threading.Thread(target=c.process.stop, args=(grace,), daemon=True)
                t.start()
                stoppers.append(t)
        for t in stoppers:
            t.join()

    # ------------------------------------------------------------- status, logs

    def _write_status(self, pod: Obj) -> None:
        status = pod_status(
            pod,
            [c.status for c in self.init],
            [c.status for c in self.app],
            self.pod_ip,
            "127.0.0.1",
            self.start_time,
            self.sandbox_ready,
        )
        text = json.dumps(status, sort_keys=True)
        if text == self._last_status:
            return
        try:
            self.runner.api.patch_status(pod, status)
        except Exception as exc:  # retried at the next sync
            _log.warning("writing the status of %s: %s", self.ref, exc)
            return
        self._last_status = text

    def _log_path(self, c: _Container, restart: int) -> Path:
        return self.log_dir / c.spec["name"] / f"{restart}.log"

    def _update_logs(self, pod: Obj) -> None:
        files = {}
        for c in [*self.init, *self.app]:
            n = c.status.restart_count
            files[c.spec["name"]] = (
                str(self._log_path(c, n)),
                str(self._log_path(c, n - 1)) if n else None,
            )
        self.runner.api.set_logs(pod, files)


def _grace(pod: Mapping[str, Any]) -> float:
    meta = pod.get("metadata") or {}
    value = meta.get("deletionGracePeriodSeconds")
    if value is None:
        value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
    return float(value)


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (dt.datetime.strptime(end, fmt) - dt.datetime.strptime(start, fmt)).total_seconds()


def _env_references(spec: Mapping[str, Any]) -> dict[str, set[str]]:
    """ConfigMaps and Secrets a container's env names."""
    refs: dict[str, set[str]] = {"ConfigMap": set(), "Secret": set()}
    for source in spec.get("envFrom") or []:
        if "configMapRef" in source:
            refs["ConfigMap"].add(source["configMapRef"]["name"])
        if "secretRef" in source:
            refs["Secret"].add(source["secretRef"]["name"])
    for var in spec.get("env") or []:
        src = var.get("valueFrom") or {}
        if "configMapKeyRef" in src:
            refs["ConfigMap"].add(src["configMapKeyRef"]["name"])
        if "secretKeyRef" in src:
            refs["Secret"].add(src["secretKeyRef"]["name"])
    return refs
