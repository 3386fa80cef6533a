"""Job plugins: what ``spec.plugins`` of a vcjob does to its pods and around them.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/controllers/job/plugins`` (``factory.go``,
``interface/interface.go``: ``OnPodCreate``, ``OnJobAdd``, ``OnJobDelete``,
``OnJobUpdate``; ``job_controller_plugins.go`` calls them for every plugin the job names,
its arguments parsed by Go's ``flag`` package):

- ``env`` (``env/env.go``): ``VK_TASK_INDEX`` and ``VC_TASK_INDEX`` = the pod's index in
  its task, in every container and init container;
- ``svc`` (``svc/svc.go``): each pod gets ``hostname`` = its name and ``subdomain`` = the
  job's name; a headless Service ``<job>`` selecting the job's pods, a NetworkPolicy
  ``<job>`` letting only them in (``--disable-network-policy``), and a ConfigMap
  ``<job>-svc`` with each task's hosts (``<task>.host``, ``VC_<TASK>_HOSTS``,
  ``VC_<TASK>_NUM``), mounted at ``/etc/volcano`` and given to the containers as env;
- ``ssh`` (``ssh/ssh.go``): a Secret ``<job>-ssh`` with an RSA key pair,
  ``authorized_keys`` and an ssh ``config`` naming every pod, mounted at ``/root/.ssh``;
- ``pytorch`` (``distributed-framework/pytorch``): ``MASTER_ADDR`` (``<job>-<master>-0.
  <job>``), ``MASTER_PORT`` (``--port``, 23456), ``WORLD_SIZE`` (master + worker
  replicas) and ``RANK`` (master 0, worker i: i + 1), the port opened in each container;
  with ``--wait-master-enabled`` the workers wait for the master in an init container;
- ``mpi`` (``distributed-framework/mpi``): the master's containers get ``MPI_HOST`` (the
  workers' hosts), every container the ssh port (``--port``, 22).

Each ``OnJobAdd`` / ``OnJobDelete`` marks or unmarks ``status.controlledResources
["plugin-<name>"]`` so that it runs once; the job controller calls ``OnJobDelete`` when it
kills a job (the Service, ConfigMap, NetworkPolicy and Secret go, and come back when the
job restarts).

Lab differences: ``tensorflow``, ``ray`` and ``hcclrank`` are accepted by the webhook (as
upstream) but not implemented: the controller records a Warning ``PluginError`` Event
on the Job saying so and creates the pods without their changes. The ssh key pair is
generated only when the job's Secret does not already carry the same ssh config
(upstream generates one every time and then keeps the Secret as it is).
"""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.volcano import apis
from gpulab.volcano.controllers.job import helpers

_log = logging.getLogger(__name__)

Obj = dict[str, Any]
CONFIG_MAP_MOUNT_PATH = "/etc/volcano"  # svc / env ConfigMapMountPath
SSH_ABSOLUTE_PATH, SSH_RELATIVE_PATH = "/root/.ssh", ".ssh"
SSH_PRIVATE_KEY, SSH_PUBLIC_KEY = "id_rsa", "id_rsa.pub"
SSH_AUTHORIZED_KEYS, SSH_CONFIG = "authorized_keys", "config"
NOT_IMPLEMENTED = ("tensorflow", "ray", "hcclrank")


class PluginError(Exception):
    """A plugin could not do its part (upstream: the error pluginOnJobAdd returns)."""


class Clients(Protocol):
    """The typed clients a plugin writes through (PluginClientset)."""

    core: client.CoreV1Api
    networking: client.NetworkingV1Api


# -- flags ----------------------------------------------------------------------------------


def parse_flags(name: str, arguments: Sequence[str], defaults: Mapping[str, Any]) -> Obj:
    """Go's ``flag.NewFlagSet(name, ContinueOnError).Parse(arguments)``: ``-f``, ``--f``,
    ``-f=v``, ``-f v``; a bool flag needs no value. Parsing stops at the first argument
    that is no flag; on an error (logged, as upstream) the flags set so far stay."""
    values = dict(defaults)
    args = list(arguments)
    while args:
        arg = args.pop(0)
        if len(arg) < 2 or not arg.startswith("-") or arg == "--":
            break
        key = arg[2:] if arg.startswith("--") else arg[1:]
        key, has_value, raw = key.partition("=")
        failed = "plugin %s flagset parse failed, err: %s"
        if key not in defaults:
            _log.error(failed, name, f"flag provided but not defined: -{key}")
            break
        kind = type(defaults[key])
        if kind is bool and not has_value:
            values[key] = True
            continue
        if not has_value:
            if not args:
                _log.error(failed, name, f"flag needs an argument: -{key}")
                break
            raw = args.pop(0)
        try:
            values[key] = _flag_value(kind, raw)
        except ValueError:
            _log.error(failed, name, f'invalid value "{raw}" for flag -{key}')
            break
    return values


def _flag_value(kind: type, raw: str) -> Any:
    if kind is bool:
        if raw.lower() in ("1", "t", "true"):
            return True
        if raw.lower() in ("0", "f", "false"):
            return False
        raise ValueError(raw)
    return int(raw, 0) if kind is int else raw


# -- helpers shared by the plugins ------------------------------------------------------------


def _tasks(job: Mapping[str, Any]) -> list[Obj]:
    return list((job.get("spec") or {}).get("tasks") or [])


def _containers(pod: Obj, init: bool = True) -> list[Obj]:
    spec = pod.setdefault("spec", {})
    out = list(spec.get("containers") or [])
    if init:
        out += list(spec.get("initContainers") or [])
    return out


def _add_env(container: Obj, *env: Obj) -> None:
    container["env"] = [*(container.get("env") or []), *env]


def pod_index(pod: Mapping[str, Any]) -> str:
    """GetPodIndexUnderTask: the last ``-`` part of the pod's name."""
    parts = str((pod.get("metadata") or {}).get("name") or "").split("-")
    return parts[-1] if len(parts) >= 3 else ""


def task_hosts(job: Mapping[str, Any], task: Mapping[str, Any]) -> list[str]:
    """``hostname.subdomain`` of each pod of ``task`` (one if the template names a
    hostname), as svc's GenerateHosts and mpi's generateTaskHosts build them."""
    template_spec = (task.get("template") or {}).get("spec") or {}
    job_name = str((job.get("metadata") or {}).get("name"))
    hosts = []
    for index in range(int(task.get("replicas") or 0)):
        hostname = template_spec.get("hostname") or apis.pod_name(job_name, task["name"], index)
        hosts.append(f"{hostname}.{template_spec.get('subdomain') or job_name}")
        if template_spec.get("hostname"):
            break
    return hosts


def _controlled(job: Obj) -> dict[str, str]:
    return job.setdefault("status", {}).setdefault("controlledResources", {}) or {}


def _mark(job: Obj, name: str, on: bool) -> None:
    controlled = _controlled(job)
    if on:
        controlled[f"plugin-{name}"] = name
    else:
        controlled.pop(f"plugin-{name}", None)
    job["status"]["controlledResources"] = controlled


def _marked(job: Obj, name: str) -> bool:
    return _controlled(job).get(f"plugin-{name}") == name


def _owned(job: Mapping[str, Any], name: str) -> Obj:
    meta = job["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "ownerReferences": [helpers.owner_ref(job)],
    }


def _get(read: Callable[[], Any]) -> Any | None:
    try:
        return read()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _delete(remove: Callable[[], Any]) -> None:
    try:
        remove()
    except ApiException as exc:
        if exc.status != 404:
            raise


def create_or_update_config_map(
    job: Mapping[str, Any], clients: Clients, data: Mapping[str, str], name: str
) -> None:
    """helpers.CreateOrUpdateConfigMap."""
    ns = job["metadata"]["namespace"]
    old = _get(lambda: clients.core.read_namespaced_config_map(name, ns))
    if old is None:
        body = {"metadata": _owned(job, name), "data": dict(data)}
        clients.core.create_namespaced_config_map(ns, body)
    elif dict(old.data or {}) != dict(data):
        old.data = dict(data)
        clients.core.replace_namespaced_config_map(name, ns, old)


def create_or_update_secret(
    job: Mapping[str, Any],
    clients: Clients,
    make_data: Callable[[], Mapping[str, str]],
    config: str,
    name: str,
) -> None:
    """helpers.CreateOrUpdateSecret: the Secret is written when it is missing or its
    ssh config changed (``make_data`` builds the keys; see the module docstring)."""
    ns = job["metadata"]["namespace"]
    old = _get(lambda: clients.core.read_namespaced_secret(name, ns))
    if old is not None and _secret_text(old, SSH_CONFIG) == config:
        return
    data = dict(make_data())
    if old is None:
        body = {"metadata": _owned(job, name), "stringData": data}
        clients.core.create_namespaced_secret(ns, body)
    else:
        old.data, old.string_data = None, data
        clients.core.replace_namespaced_secret(name, ns, old)


def _secret_text(secret: Any, key: str) -> str:
    raw = (secret.data or {}).get(key)
    return base64.b64decode(raw).decode() if raw else ""


# -- the plugins ----------------------------------------------------------------------------


@dataclass
class EnvPlugin:
    """env/env.go."""

    arguments: Sequence[str] = ()
    name: str = "env"

    def on_pod_create(self, pod: Obj, job: Obj) -> None:
        index = pod_index(pod)
        for c in _containers(pod):
            _add_env(c, {"name": "VK_TASK_INDEX", "value": index})
            _add_env(c, {"name": "VC_TASK_INDEX", "value": index})

    def on_job_add(self, job: Obj, clients: Clients) -> None:
        _mark(job, self.name, True)

    def on_job_delete(self, job: Obj, clients: Clients) -> None:
        _mark(job, self.name, False)

    def on_job_update(self, job: Obj, clients: Clients) -> None:
        pass


@dataclass
class SvcPlugin:
    """svc/svc.go."""

    arguments: Sequence[str] = ()
    name: str = "svc"
    flags: Obj = field(init=False)

    def __post_init__(self) -> None:
        defaults = {"publish-not-ready-addresses": False, "disable-network-policy": False}
        self.flags = parse_flags(self.name, self.arguments, defaults)

    def config_map_name(self, job: Mapping[str, Any]) -> str:
        return f"{job['metadata']['name']}-{self.name}"

    def on_pod_create(self, pod: Obj, job: Obj) -> None:
        spec = pod.setdefault("spec", {})
        spec["hostname"] = spec.get("hostname") or pod["metadata"]["name"]
        spec["subdomain"] = spec.get("subdomain") or job["metadata"]["name"]
        cm = self.config_map_name(job)
        env = []
        for task in _tasks(job):
            key = task["name"].replace("-", "_").upper()
            for var in (f"VC_{key}_HOSTS", f"VC_{key}_NUM"):
                ref = {"configMapKeyRef": {"name": cm, "key": var}}
                env.append({"name": var, "valueFrom": ref})
        for c in _containers(pod):
            _add_env(c, *copy.deepcopy(env))
        spec["volumes"] = [*(spec.get("volumes") or []), {"name": cm, "configMap": {"name": cm}}]
        for c in _containers(pod):
            mount = {"mountPath": CONFIG_MAP_MOUNT_PATH, "name": cm}
            c["volumeMounts"] = [*(c.get("volumeMounts") or []), mount]

    def hosts(self, job: Mapping[str, Any]) -> dict[str, str]:
        """GenerateHosts."""
        data: dict[str, str] = {}
        for task in _tasks(job):
            hosts = task_hosts(job, task)
            key = task["name"].replace("-", "_")
            data[f"{key}.host"] = "\n".join(hosts)
            data[f"VC_{key.upper()}_HOSTS"] = ",".join(hosts)
            data[f"VC_{key.upper()}_NUM"] = str(len(hosts))
        return data

    def on_job_add(self, job: Obj, clients: Clients) -> None:
        if _marked(job, self.name):
            return
        create_or_update_config_map(job, clients, self.hosts(job), self.config_map_name(job))
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        selector = {apis.JOB_NAME_KEY: name, apis.JOB_NAMESPACE_KEY: ns}
        if _get(lambda: clients.core.read_namespaced_service(name, ns)) is None:
            service = {
                "metadata": _owned(job, name),
                "spec": {
                    "clusterIP": "None",
                    "selector": selector,
                    "publishNotReadyAddresses": self.flags["publish-not-ready-addresses"],
                },
            }
            clients.core.create_namespaced_service(ns, service)
        if not self.flags["disable-network-policy"] and (
            _get(lambda: clients.networking.read_namespaced_network_policy(name, ns)) is None
        ):
            policy = {
                "metadata": _owned(job, name),
                "spec": {
                    "podSelector": {"matchLabels": selector},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
                    "policyTypes": ["Ingress"],
                },
            }
            clients.networking.create_namespaced_network_policy(ns, policy)
        _mark(job, self.name, True)

    def on_job_delete(self, job: Obj, clients: Clients) -> None:
        if not _marked(job, self.name):
            return
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        cm = self.config_map_name(job)
        _delete(lambda: clients.core.delete_namespaced_config_map(cm, ns))
        _delete(lambda: clients.core.delete_namespaced_service(name, ns))
        _mark(job, self.name, False)
        if not self.flags["disable-network-policy"]:
            _delete(lambda: clients.networking.delete_namespaced_network_policy(name, ns))

    def on_job_update(self, job: Obj, clients: Clients) -> None:
        create_or_update_config_map(job, clients, self.hosts(job), self.config_map_name(job))


@dataclass
class SshPlugin:
    """ssh/ssh.go."""

    arguments: Sequence[str] = ()
    name: str = "ssh"
    flags: Obj = field(init=False)

    def __post_init__(self) -> None:
        defaults = {
            "ssh-key-file-path": SSH_ABSOLUTE_PATH,
            "ssh-private-key": "",
            "ssh-public-key": "",
            "ssh-port": 22,
        }
        self.flags = parse_flags(self.name, self.arguments, defaults)

    def secret_name(self, job: Mapping[str, Any]) -> str:
        return f"{job['metadata']['name']}-{self.name}"

    def on_pod_create(self, pod: Obj, job: Obj) -> None:
        """mountRsaKey."""
        secret = self.secret_name(job)
        items = [
            {"key": k, "path": f"{SSH_RELATIVE_PATH}/{k}"}
            for k in (SSH_PRIVATE_KEY, SSH_PUBLIC_KEY, SSH_AUTHORIZED_KEYS, SSH_CONFIG)
        ]
        mode = 0o600 if self.flags["ssh-key-file-path"] == SSH_ABSOLUTE_PATH else 0o644
        source = {"secretName": secret, "items": items, "defaultMode": mode}
        volume = {"name": secret, "secret": source}
        spec = pod.setdefault("spec", {})
        spec["volumes"] = [*(spec.get("volumes") or []), volume]
        for c in _containers(pod):
            mount = {
                "mountPath": self.flags["ssh-key-file-path"],
                "subPath": SSH_RELATIVE_PATH,
                "name": secret,
            }
            c["volumeMounts"] = [*(c.get("volumeMounts") or []), mount]

    def ssh_config(self, job: Mapping[str, Any]) -> str:
        """generateSSHConfig."""
        port = self.flags["ssh-port"] if 0 < self.flags["ssh-port"] <= 65535 else 22
        text = "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n"
        for task in _tasks(job):
            for host in task_hosts(job, task):
                short = host.split(".", 1)[0]
                text += f"Host {short}\n  HostName {host}\n  Port {port}\n"
        return text

    def key_pair(self, job: Mapping[str, Any]) -> dict[str, str]:
        """generateRsaKey (2048 bits) or withUserProvidedRsaKey."""
        private, public = self.flags["ssh-private-key"], self.flags["ssh-public-key"]
        if not private:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import rsa

            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            private = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            ).decode()
            public = (
                key.public_key()
                .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
                .decode()
                + "\n"
            )
        return {
            SSH_PRIVATE_KEY: private,
            SSH_PUBLIC_KEY: public,
            SSH_AUTHORIZED_KEYS: public,
            SSH_CONFIG: self.ssh_config(job),
        }

    def on_job_add(self, job: Obj, clients: Clients) -> None:
        if _marked(job, self.name):
            return
        try:
            config, name = self.ssh_config(job), self.secret_name(job)
            create_or_update_secret(job, clients, lambda: self.key_pair(job), config, name)
        except ApiException as exc:
            meta = job["metadata"]
            raise PluginError(
                f"create secret for job <{meta['namespace']}/{meta['name']}> with ssh plugin "
                f"failed for {exc.reason}"
            ) from exc
        _mark(job, self.name, True)

    def on_job_delete(self, job: Obj, clients: Clients) -> None:
        if not _marked(job, self.name):
            return
        secret, ns = self.secret_name(job), job["metadata"]["namespace"]
        _delete(lambda: clients.core.delete_namespaced_secret(secret, ns))
        _mark(job, self.name, False)

    def on_job_update(self, job: Obj, clients: Clients) -> None:
        pass  # upstream leaves the Secret as it is (volcano-sh/volcano#1420)


@dataclass
class PytorchPlugin:
    """distributed-framework/pytorch/pytorch.go."""

    arguments: Sequence[str] = ()
    name: str = "pytorch"
    flags: Obj = field(init=False)

    def __post_init__(self) -> None:
        defaults = {
            "master": "master",
            "worker": "worker",
            "port": 23456,
            "wait-master-enabled": False,
            "wait-master-timeout": 300,
            "wait-master-image": "busybox:1.36.1",
        }
        self.flags = parse_flags(self.name, self.arguments, defaults)

    def world_size(self, job: Mapping[str, Any]) -> int:
        """getTotalReplicas: the master's and the workers' replicas."""
        roles = (self.flags["master"], self.flags["worker"])
        return sum(int(t.get("replicas") or 0) for t in _tasks(job) if t["name"] in roles)

    def wait_for_master_script(self, addr: str) -> str:
        port, timeout = self.flags["port"], self.flags["wait-master-timeout"]
        return (
            f'echo "Waiting for master node {addr}:{port} to be ready..."\n'
            f"TIMEOUT={timeout}\nELAPSED=0\n"
            f"until {{ nc -z {addr} {port} || echo > /dev/tcp/{addr}/{port}; }} 2>/dev/null; do\n"
            "  if [ $ELAPSED -ge $TIMEOUT ]; then\n"
            '    echo "Timeout waiting for master after ${TIMEOUT} seconds"\n'
            "    exit 1\n  fi\n"
            '  echo "Master not ready yet, retrying in 2 seconds... (elapsed: ${ELAPSED}s)"\n'
            "  sleep 2\n  ELAPSED=$((ELAPSED + 2))\ndone\n"
            'echo "Master node is ready!"'
        )

    def on_pod_create(self, pod: Obj, job: Obj) -> None:
        master = next((t for t in _tasks(job) if t["name"] == self.flags["master"]), None)
        if master is None:
            _log.error("job %s doesn't have task %s", job["metadata"]["name"], self.flags["master"])
            return
        addr = task_hosts(job, {**master, "replicas": 1})[0]
        role = helpers.task_key(pod)
        rank = None
        if role == self.flags["worker"]:
            rank = int(pod_index(pod)) + 1
            spec = pod.setdefault("spec", {})
            inits = list(spec.get("initContainers") or [])
            if self.flags["wait-master-enabled"] and not any(
                c.get("name") == "wait-for-master" for c in inits
            ):
                inits.append(
                    {
                        "name": "wait-for-master",
                        "image": self.flags["wait-master-image"],
                        "command": ["sh", "-c", self.wait_for_master_script(addr)],
                    }
                )
                spec["initContainers"] = inits
        elif role == self.flags["master"]:
            rank = 0
        for c in _containers(pod, init=False):
            ports = list(c.get("ports") or [])
            if not any(p.get("containerPort") == self.flags["port"] for p in ports):
                port = {"name": "pytorchjob-port", "containerPort": self.flags["port"]}
                c["ports"] = [*ports, port]
            _add_env(
                c,
                {"name": "MASTER_ADDR", "value": addr},
                {"name": "MASTER_PORT", "value": str(self.flags["port"])},
                {"name": "WORLD_SIZE", "value": str(self.world_size(job))},
            )
            if rank is not None:
                _add_env(c, {"name": "RANK", "value": str(rank)})

    def on_job_add(self, job: Obj, clients: Clients) -> None:
        _mark(job, self.name, True)

    def on_job_delete(self, job: Obj, clients: Clients) -> None:
        _mark(job, self.name, False)

    def on_job_update(self, job: Obj, clients: Clients) -> None:
        pass


@dataclass
class MpiPlugin:
    """distributed-framework/mpi/mpi.go."""

    arguments: Sequence[str] = ()
    name: str = "mpi"
    flags: Obj = field(init=False)

    def __post_init__(self) -> None:
        defaults = {"master": "master", "worker": "worker", "port": 22}
        self.flags = parse_flags(self.name, self.arguments, defaults)

    def on_pod_create(self, pod: Obj, job: Obj) -> None:
        env = None
        if helpers.task_key(pod) == self.flags["master"]:
            worker = next((t for t in _tasks(job) if t["name"] == self.flags["worker"]), None)
            if worker is None:
                return
            env = {"name": "MPI_HOST", "value": ",".join(task_hosts(job, worker))}
        spec = pod.setdefault("spec", {})
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            ports = list(c.get("ports") or [])
            if not any(p.get("containerPort") == self.flags["port"] for p in ports):
                c["ports"] = [*ports, {"name": "mpijob-port", "containerPort": self.flags["port"]}]
            if env is not None:
                _add_env(c, dict(env))

    def on_job_add(self, job: Obj, clients: Clients) -> None:
        _mark(job, self.name, True)

    def on_job_delete(self, job: Obj, clients: Clients) -> None:
        _mark(job, self.name, False)

    def on_job_update(self, job: Obj, clients: Clients) -> None:
        pass


class Plugin(Protocol):
    name: str

    def on_pod_create(self, pod: Obj, job: Obj) -> None: ...

    def on_job_add(self, job: Obj, clients: Clients) -> None: ...

    def on_job_delete(self, job: Obj, clients: Clients) -> None: ...

    def on_job_update(self, job: Obj, clients: Clients) -> None: ...


BUILDERS: dict[str, Callable[[Sequence[str]], Plugin]] = {
    "env": EnvPlugin,
    "svc": SvcPlugin,
    "ssh": SshPlugin,
    "pytorch": PytorchPlugin,
    "mpi": MpiPlugin,
}


def of(job: Mapping[str, Any]) -> list[Plugin]:
    """The job's plugins in the order its spec names them (upstream: a Go map, any
    order); a name the lab does not implement (NOT_IMPLEMENTED) is skipped."""
    plugins = (job.get("spec") or {}).get("plugins") or {}
    return [BUILDERS[name](list(args or [])) for name, args in plugins.items() if name in BUILDERS]


def not_implemented(job: Mapping[str, Any]) -> list[str]:
    return [n for n in (job.get("spec") or {}).get("plugins") or {} if n not in BUILDERS]
