"""The one apply path: `manifests/` onto any backend, CRDs first.

Server-side apply (what `kubectl apply --server-side` sends), so every object is
validated by the real API server. The local backend passes a :class:`LocalTransform`:
workloads (Deployments, DaemonSets) are applied with ``dryRun=All`` — validated but not
run, because there the components run as host processes — and webhook configurations
point at ``https://127.0.0.1:PORT`` instead of a Service.
"""

from __future__ import annotations

import base64
import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from harness.errors import HarnessError

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
FIELD_MANAGER = "gpulab"
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod", "Service"}
WEBHOOK_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Applied:
    kind: str
    name: str
    namespace: str | None
    dry_run: bool = False


def _client_configs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The webhook clientConfigs of a webhook configuration or a CRD's conversion."""
    kind = doc.get("kind", "")
    if kind in WEBHOOK_KINDS:
        return [hook.setdefault("clientConfig", {}) for hook in doc.get("webhooks", [])]
    if kind == "CustomResourceDefinition":
        conv = doc.get("spec", {}).get("conversion", {})
        if conv.get("strategy") == "Webhook" and conv.get("webhook"):
            return [conv["webhook"].setdefault("clientConfig", {})]
    return []


def webhook_services(docs: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    """(name, namespace) of every Service a webhook or conversion calls."""
    return {
        (cfg["service"]["name"], cfg["service"]["namespace"])
        for doc in docs
        for cfg in _client_configs(copy.deepcopy(doc))
        if "service" in cfg
    }


@dataclass
class ServiceTransform:
    """kind/k3d: webhooks keep calling their Service; the harness adds the caBundle of
    the CA that signed the Services' serving certs (``<service>-tls`` Secrets)."""

    ca_bundle: bytes

    def __call__(self, doc: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        doc = copy.deepcopy(doc)
        for cfg in _client_configs(doc):
            if "service" in cfg:
                cfg["caBundle"] = base64.b64encode(self.ca_bundle).decode()
        return doc, False


@dataclass
class LocalTransform:
    """How the local backend adapts manifests written for kind.

    ``service_ports`` maps a webhook Service name to the 127.0.0.1 port where the host
    process serves it; ``ca_bundle`` is the PEM of the CA that signed those serving certs.
    Workloads are validated by dry-run only: their processes run on the host.
    """

    ca_bundle: bytes
    service_ports: dict[str, int] = field(default_factory=dict)

    def __call__(self, doc: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if doc.get("kind", "") in WORKLOAD_KINDS:
            return doc, True
        doc = copy.deepcopy(doc)
        for cfg in _client_configs(doc):
            svc = cfg.pop("service", None)
            if svc is None:
                continue
            port = self.service_ports.get(svc["name"])
            if port is None:
                raise HarnessError(
                    f"webhook Service {svc['name']!r} has no local port; the component "
                    "serving it must be started by the local backend first"
                )
            cfg["url"] = f"https://127.0.0.1:{port}{svc.get('path', '')}"
            cfg["caBundle"] = base64.b64encode(self.ca_bundle).decode()
        return doc, False


Transform = Callable[[dict[str, Any]], tuple[dict[str, Any], bool]]


def load_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """All YAML documents under ``paths`` (files or directories, sorted, recursive).

    ``samples/`` directories are examples for users to apply, not part of a deployment:
    walking a directory skips them (name a sample file explicitly to load it).
    """
    docs: list[dict[str, Any]] = []
    for path in paths:
        if path.is_dir():
            files = sorted(
                f for f in path.rglob("*.yaml") if "samples" not in f.relative_to(path).parts
            )
        else:
            files = [path]
        for f in files:
            try:
                loaded = list(yaml.safe_load_all(f.read_text()))
            except yaml.YAMLError as exc:
                raise HarnessError(f"{f}: not valid YAML: {exc}") from exc
            for doc in loaded:
                if not doc:
                    continue
                if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                    raise HarnessError(f"{f}: every document needs apiVersion and kind")
                docs.append(doc)
    return docs


def apply(
    api: client.ApiClient,
    paths: Iterable[Path],
    progress: Progress,
    transform: Transform | None = None,
    extra: Iterable[dict[str, Any]] = (),
) -> list[Applied]:
    """Apply CRDs, wait until they are Established, then Namespaces, then the rest
    (``extra``: objects the harness made, such as serving-cert Secrets, go with the rest)."""
    docs = [*load_documents(paths), *extra]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Namespace")]
    dyn = dynamic.DynamicClient(api)
    applied = [_apply_one(dyn, d, transform) for d in crds]
    if crds:
        _wait_established(api, [d["metadata"]["name"] for d in crds], progress)
        dyn.resources.invalidate_cache()
    applied += [_apply_one(dyn, d, transform) for d in namespaces + rest]
    dry = sum(a.dry_run for a in applied)
    note = f", {dry} workloads validated by dry-run" if dry else ""
    progress(f"applied {len(applied)} objects ({len(crds)} CRDs{note})")
    return applied


def _apply_one(
    dyn: dynamic.DynamicClient, doc: dict[str, Any], transform: Transform | None
) -> Applied:
    dry_run = False
    if transform is not None:
        doc, dry_run = transform(doc)
    meta = doc.get("metadata", {})
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    what = f"{doc['kind']} {where}{meta.get('name')}"
    try:
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    except Exception as exc:  # ResourceNotFoundError and friends from discovery
        raise HarnessError(
            f"{what}: the API server does not serve {doc['apiVersion']} {doc['kind']}"
        ) from exc
    kwargs: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
    if dry_run:
        kwargs["dry_run"] = "All"
    try:
        dyn.server_side_apply(resource, body=doc, **kwargs)
    except ApiException as exc:
        raise HarnessError(f"{what} was rejected by the API server: {_reason(exc)}") from None
    return Applied(doc["kind"], meta.get("name", ""), meta.get("namespace"), dry_run)


def _reason(exc: ApiException) -> str:
    try:
        import json

        return str(json.loads(exc.body).get("message", exc.reason))
    except (ValueError, TypeError, AttributeError):
        return f"{exc.status} {exc.reason}"


def _wait_established(api: client.ApiClient, names: list[str], progress: Progress) -> None:
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + 60
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in list(pending):
            crd = ext.read_custom_resource_definition(name)
            conds = crd.status.conditions or [] if crd.status else []
            if any(c.type == "Established" and c.status == "True" for c in conds):
                pending.discard(name)
        if pending:
            time.sleep(0.2)
    if pending:
        raise HarnessError(f"CRDs not Established after 60s: {sorted(pending)}")
    progress(f"{len(names)} CRDs Established")
