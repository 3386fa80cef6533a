"""What a container becomes on the host: argv, environment, working directory (pure).

Mirrors kubelet's ``kuberuntime_container.go`` / ``kubelet_pods.go`` (``makeEnvironmentVariables``:
``envFrom`` then ``env``, ``fieldRef`` / ``resourceFieldRef`` / ``configMapKeyRef`` /
``secretKeyRef``; ``$(VAR)`` expansion of env values, command and args as in
``third_party/forked/golang/expansion``), then applies the two rules that let a container
run as a host process on the local backend (docs/local-backend.md):

1. **Paths.** Every volume mount's ``mountPath`` that appears in command, args or env
   values (at a path boundary) is rewritten to the host directory behind the mount.
   Components therefore take every path by flag or env. ``GPULAB_MOUNTS`` carries the
   whole map (JSON) for code whose library hard-codes an in-image path (the in-cluster
   ServiceAccount token, see gpulab/kube.py).
2. **Addresses.** Pods share the host's network, so each pod gets its own loopback address
   (its ``status.podIP``); ``0.0.0.0``, ``127.0.0.1`` and ``localhost`` in command, args and
   env values mean "this pod" and are rewritten to it (unless ``hostNetwork``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils import parse_quantity

Obj = dict[str, Any]

MOUNTS_ENV = "GPULAB_MOUNTS"
LOOPBACK_WORDS = ("0.0.0.0", "127.0.0.1", "localhost")


class ContainerError(ValueError):
    """The container cannot be started as specified (shown as a Waiting reason)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Mount:
    """One volumeMount resolved to the host: ``mount_path`` in the container is ``host_path``."""

    mount_path: str
    host_path: str
    read_only: bool = False


@dataclass
class Plan:
    """How to start one container as a host process."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    mounts: list[Mount] = field(default_factory=list)


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """kubelet's ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``,
    undefined references and malformed ones are left as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "$" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(mapping[name] if name in mapping else text[i : end + 1])
            i = end + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API ``fieldRef.fieldPath`` of ``pod``."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    if path == "status.podIPs":
        return ",".join(ip.get("ip", "") for ip in status.get("podIPs") or [])
    if path == "status.hostIPs":
        return ",".join(ip.get("ip", "") for ip in status.get("hostIPs") or [])
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    match = _FIELD.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")


def resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """A ``resourceFieldRef`` (limits.cpu, requests.memory ...) divided by its divisor."""
    kind, _, name = str(ref.get("resource", "")).partition(".")
    resources = (container.get("resources") or {}).get(kind) or {}
    raw = resources.get(name)
    if raw is None:
        return "0"
    value = parse_quantity(raw) / parse_quantity(ref.get("divisor", "1"))
    # kubelet rounds up: a 500m CPU limit with divisor 1 is "1"
    return str(math.ceil(value))


Lookup = Mapping[str, Mapping[str, str]]
"""ConfigMap or Secret data by name (decoded), for env references."""


def _ref_value(kind: str, ref: Mapping[str, Any], objects: Lookup) -> str | None:
    data = objects.get(ref.get("name", ""))
    if data is None or ref.get("key") not in data:
        if ref.get("optional"):
            return None
        raise ContainerError(
            "CreateContainerConfigError",
            f"{kind} {ref.get('name')!r} key {ref.get('key')!r} not found",
        )
    return data[ref["key"]]


def environment(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    configmaps: Lookup,
    secrets: Lookup,
    service_env: Mapping[str, str],
) -> dict[str, str]:
    """The container's own environment as kubelet builds it, ``$(VAR)`` references to
    earlier variables and ``service_env`` expanded (before the host rewrite rules)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key, objects in (
            ("ConfigMap", "configMapRef", configmaps),
            ("Secret", "secretRef", secrets),
        ):
            ref = source.get(key)
            if ref is None:
                continue
            data = objects.get(ref.get("name", ""))
            if data is None:
                if ref.get("optional"):
                    continue
                raise ContainerError(
                    "CreateContainerConfigError", f"{kind} {ref.get('name')!r} not found"
                )
            env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            mapping = {**service_env, **env}
            env[name] = expand(str(var.get("value", "")), mapping)
            continue
        source = var["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            value = resource_value(container, source["resourceFieldRef"])
        elif "configMapKeyRef" in source:
            value = _ref_value("ConfigMap", source["configMapKeyRef"], configmaps)
        elif "secretKeyRef" in source:
            value = _ref_value("Secret", source["secretKeyRef"], secrets)
        else:
            raise ContainerError(
                "CreateContainerConfigError", f"env {name}: unsupported valueFrom {sorted(source)}"
            )
        if value is not None:
            env[name] = value
    return env


def rewrite_paths(text: str, mounts: Sequence[Mount]) -> str:
    """Replace each mount path that starts at a path boundary with its host directory."""
    for mount in sorted(mounts, key=lambda m: len(m.mount_path), reverse=True):
        path = mount.mount_path.rstrip("/") or "/"
        # at the start, after = : , a quote or a space, or as a file:// URI's path
        start = r"(?:(?<![^=:,\s\"'])|(?<=://))"
        pattern = re.compile(start + re.escape(path) + r"(?=$|[/=:,\s\"'])")
        text = pattern.sub(lambda _m, host=mount.host_path: host, text)
    return text


def rewrite_addresses(text: str, pod_ip: str) -> str:
    """``0.0.0.0``, ``127.0.0.1`` and ``localhost`` as whole words mean this pod."""
    for word in LOOPBACK_WORDS:
        text = re.sub(r"(?<![\w.-])" + re.escape(word) + r"(?![\w-]|\.\w)", pod_ip, text)
    return text


def plan(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    image_entrypoint: Sequence[str],
    image_env: Mapping[str, str],
    mounts: Sequence[Mount],
    env: Mapping[str, str],
    service_env: Mapping[str, str],
    pod_ip: str | None,
) -> Plan:
    """Command line and environment of ``container``: kubelet's rules for command/args
    over the image's entrypoint, ``$(VAR)`` expansion, then the host rewrite rules (to
    what the manifest says, not to ``service_env``, which already names host addresses)."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if command:
        argv = command + args
    elif image_entrypoint:
        argv = list(image_entrypoint) + args
    else:
        argv = args
    if not argv:
        raise ContainerError("CreateContainerConfigError", "no command: set command or args")
    argv = [expand(a, {**service_env, **env}) for a in argv]

    def host(text: str) -> str:
        text = rewrite_paths(text, mounts)
        return rewrite_addresses(text, pod_ip) if pod_ip else text

    out_env = {**image_env, **service_env, **{k: host(v) for k, v in env.items()}}
    out_env[MOUNTS_ENV] = json.dumps({m.mount_path: m.host_path for m in mounts})
    cwd = container.get("workingDir")
    return Plan(
        argv=[host(a) for a in argv],
        env=out_env,
        cwd=rewrite_paths(cwd, mounts) if cwd else None,
        mounts=list(mounts),
    )
