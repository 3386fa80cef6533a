"""A pod's volumes as host directories (cf. kubelet ``pkg/volume``: hostpath, emptydir,
configmap, secret, projected, downwardapi).

Every simulated node has a root of its own, ``<cluster>/nodes/<node>/rootfs``: a
``hostPath`` volume is that path under it (what the node's filesystem is on kind), except
kubelet's directory ``/var/lib/kubelet``, which is ``<cluster>/nodes/<node>`` itself (the
node agent's root: its config, and device-plugins/ whose unix socket paths may not
exceed 107 bytes). The other volume types are written
under the pod's own directory, ``<cluster>/pods/<namespace>_<name>_<uid>/volumes/<volume>``,
and rewritten when their source changes (configMap, secret, projected token refresh).
"""

from __future__ import annotations

import base64
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpulab.state import node_root
from harness.podrunner.container import ContainerError, Mount, field_value

Obj = dict[str, Any]

KUBELET_DIR = "/var/lib/kubelet"
DEVICE_PLUGIN_DIR = f"{KUBELET_DIR}/device-plugins"
SUPPORTED = ("hostPath", "emptyDir", "configMap", "secret", "projected", "downwardAPI")
# kubelet asks for 1 h + 7 s and refreshes at 80 % of the lifetime
DEFAULT_TOKEN_SECONDS = 3607


class VolumeAPI(Protocol):
    def config_map(self, namespace: str, name: str) -> dict[str, str] | None: ...

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, base64-decoded."""
        ...

    def token(
        self, namespace: str, service_account: str, pod: Obj, audience: str | None, seconds: int
    ) -> tuple[str, float]:
        """A TokenRequest for the pod's ServiceAccount: (token, expiry as epoch seconds)."""
        ...


def host_path(cluster_dir: Path, node: str, path: str) -> Path:
    """Where a node's ``path`` lives on the host."""
    clean = "/" + path.strip("/")
    if clean == KUBELET_DIR or clean.startswith(KUBELET_DIR + "/"):
        rest = clean[len(KUBELET_DIR) :].lstrip("/")
        base = kubelet_root(cluster_dir, node)
        return base / rest if rest else base
    return node_root(cluster_dir, node) / clean.lstrip("/")


def kubelet_root(cluster_dir: Path, node: str) -> Path:
    """The node's /var/lib/kubelet: the node's own directory, a short path, since the
    device plugins' unix sockets live in its device-plugins/ (at most 107 bytes)."""
    return cluster_dir / "nodes" / node


def _check_host_path(path: Path, kind: str) -> None:
    """hostPath ``type`` checks as kubelet makes them."""
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif kind == "Directory" and not path.is_dir():
        raise ContainerError(
            "FailedMount", f"hostPath type check failed: {path} is not a directory"
        )
    elif kind == "File" and not path.is_file():
        raise ContainerError("FailedMount", f"hostPath type check failed: {path} is not a file")
    elif kind == "Socket" and not path.is_socket():
        raise ContainerError("FailedMount", f"hostPath type check failed: {path} is not a socket")


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


@dataclass
class PodVolumes:
    """The host side of one pod's volumes; ``sync`` (re)writes the generated ones."""

    pod: Obj
    cluster_dir: Path
    pod_dir: Path
    paths: dict[str, Path] = field(default_factory=dict)  # volume name -> host path
    _token_refresh_at: dict[str, float] = field(default_factory=dict)

    @property
    def node(self) -> str:
        return str(self.pod["spec"]["nodeName"])

    def check_supported(self) -> None:
        for vol in self.pod["spec"].get("volumes") or []:
            kind = next((k for k in vol if k != "name"), None)
            if kind not in SUPPORTED:
                raise ContainerError(
                    "FailedMount",
                    f"volume {vol['name']!r}: type {kind!r} is not supported by the local "
                    f"backend's pod runner (supported: {', '.join(SUPPORTED)})",
                )

    def sync(self, api: VolumeAPI, now: float | None = None) -> None:
        """Create every volume, or refresh the generated ones (idempotent)."""
        self.check_supported()
        now = time.time() if now is None else now
        ns = self.pod["metadata"]["namespace"]
        for vol in self.pod["spec"].get("volumes") or []:
            name = vol["name"]
            if "hostPath" in vol:
                path = host_path(self.cluster_dir, self.node, vol["hostPath"]["path"])
                _check_host_path(path, vol["hostPath"].get("type", ""))
                self.paths[name] = path
                continue
            target = self.pod_dir / "volumes" / name
            target.mkdir(parents=True, exist_ok=True)
            self.paths[name] = target
            if "emptyDir" in vol:
                continue
            if "configMap" in vol:
                self._write_source(
                    target,
                    vol["configMap"],
                    api.config_map(ns, vol["configMap"]["name"]),
                    "ConfigMap",
                )
            elif "secret" in vol:
                src = vol["secret"]
                data = api.secret(ns, src["secretName"])
                self._write_source(target, {**src, "name": src["secretName"]}, data, "Secret")
            elif "downwardAPI" in vol:
                self._write_downward(target, vol["downwardAPI"])
            elif "projected" in vol:
                self._write_projected(target, name, vol["projected"], api, now)

    def _write_source(
        self, target: Path, src: Mapping[str, Any], data: dict[str, str] | None, kind: str
    ) -> None:
        if data is None:
            if src.get("optional"):
                return
            raise ContainerError("FailedMount", f"{kind} {src.get('name')!r} not found")
        mode = int(src.get("defaultMode", 0o644))
        items = src.get("items")
        if items:
            for item in items:
                if item["key"] not in data:
                    raise ContainerError(
                        "FailedMount", f"{kind} {src.get('name')!r} has no key {item['key']!r}"
                    )
                _write_atomically(
                    target / item["path"], data[item["key"]].encode(), int(item.get("mode", mode))
                )
            return
        for key, value in data.items():
            _write_atomically(target / key, value.encode(), mode)

    def _write_downward(self, target: Path, src: Mapping[str, Any]) -> None:
        mode = int(src.get("defaultMode", 0o644))
        for item in src.get("items") or []:
            if "fieldRef" not in item:
                raise ContainerError(
                    "FailedMount", "downwardAPI: only fieldRef items are supported"
                )
            value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            _write_atomically(target / item["path"], value.encode(), int(item.get("mode", mode)))

    def _write_projected(
        self, target: Path, name: str, src: Mapping[str, Any], api: VolumeAPI, now: float
    ) -> None:
        ns = self.pod["metadata"]["namespace"]
        mode = int(src.get("defaultMode", 0o644))
        for source in src.get("sources") or []:
            if "serviceAccountToken" in source:
                tok = source["serviceAccountToken"]
                key = f"{name}/{tok['path']}"
                if now < self._token_refresh_at.get(key, 0):
                    continue
                seconds = int(tok.get("expirationSeconds", DEFAULT_TOKEN_SECONDS))
                account = self.pod["spec"].get("serviceAccountName") or "default"
                token, expiry = api.token(ns, account, self.pod, tok.get("audience"), seconds)
                _write_atomically(target / tok["path"], token.encode(), mode)
                self._token_refresh_at[key] = now + 0.8 * max(expiry - now, 0)
            elif "configMap" in source:
                cm = source["configMap"]
                self._write_source(
                    target, {**cm, "defaultMode": mode}, api.config_map(ns, cm["name"]), "ConfigMap"
                )
            elif "secret" in source:
                sec = source["secret"]
                self._write_source(
                    target, {**sec, "defaultMode": mode}, api.secret(ns, sec["name"]), "Secret"
                )
            elif "downwardAPI" in source:
                self._write_downward(target, {**source["downwardAPI"], "defaultMode": mode})
            else:
                raise ContainerError(
                    "FailedMount", f"projected volume {name!r}: unsupported source {sorted(source)}"
                )

    def mounts(self, container: Mapping[str, Any]) -> list[Mount]:
        """The container's volumeMounts on the host."""
        out = []
        for vm in container.get("volumeMounts") or []:
            base = self.paths.get(vm["name"])
            if base is None:
                raise ContainerError("FailedMount", f"volumeMount {vm['name']!r}: no such volume")
            path = base / vm["subPath"] if vm.get("subPath") else base
            out.append(Mount(vm["mountPath"], str(path), bool(vm.get("readOnly"))))
        return out


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in (data or {}).items()}


def remove_pod_dir(pod_dir: Path) -> None:
    shutil.rmtree(pod_dir, ignore_errors=True)
