"""The one apply path: `manifests/` onto any backend.

Server-side apply (what `kubectl apply --server-side` sends), so every object is
validated by the real API server, in this order: Namespaces, Services, then the
transform's ``prepare`` (a ``<service>-tls`` serving-cert Secret for every Service a
webhook calls, signed by the cluster CA), CRDs (waited for until Established), then the
rest. The transform adapts webhook ``clientConfig``s to the backend:

- kind/k3d (:class:`ServiceTransform`): webhooks keep calling their Service; the
  caBundle is the cluster CA's.
- local (:class:`LocalTransform`): the API server runs on the host and cannot resolve a
  Service's DNS name, so a webhook calls the Service's address on the host
  (``https://127.K.A.B:PORT/path``, served by the pod runner's service proxy, see
  harness/podrunner/network.py); the serving certificate names that address too. An
  aggregated API's APIService (which can only name a Service) is pointed at an
  ExternalName Service ``<service>-host`` whose externalName is that address: kube-apiserver
  resolves a ClusterIP Service to its ClusterIP, which no host process serves, and its
  EndpointSlices cannot hold the pods' loopback IPs.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from gpulab.wait import WaitTimeout, wait_for
from harness import pki
from harness.errors import HarnessError
from harness.podrunner.network import service_address

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
FIELD_MANAGER = "gpulab"
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod"}
WEBHOOK_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}

Progress = Callable[[str], None]
Obj = dict[str, Any]


@dataclass(frozen=True)
class Applied:
    kind: str
    name: str
    namespace: str | None
    dry_run: bool = False


def _client_configs(doc: Obj) -> list[Obj]:
    """The webhook clientConfigs of a webhook configuration or a CRD's conversion."""
    kind = doc.get("kind", "")
    if kind in WEBHOOK_KINDS:
        return [hook.setdefault("clientConfig", {}) for hook in doc.get("webhooks", [])]
    if kind == "CustomResourceDefinition":
        conv = doc.get("spec", {}).get("conversion", {})
        if conv.get("strategy") == "Webhook" and conv.get("webhook"):
            return [conv["webhook"].setdefault("clientConfig", {})]
    return []


def webhook_services(docs: Iterable[Obj]) -> set[tuple[str, str]]:
    """(name, namespace) of every Service a webhook or conversion calls."""
    return {
        (cfg["service"]["name"], cfg["service"]["namespace"])
        for doc in docs
        for cfg in _client_configs(copy.deepcopy(doc))
        if "service" in cfg
    }


def api_services(docs: Iterable[Obj]) -> set[tuple[str, str]]:
    """(name, namespace) of every Service an APIService proxies to."""
    return {
        (svc["name"], svc["namespace"])
        for doc in docs
        if doc.get("kind") == "APIService" and (svc := (doc.get("spec") or {}).get("service"))
    }


def host_service(name: str, namespace: str, address: str) -> Obj:
    """The local backend's stand-in an APIService names: ExternalName ``address``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-host", "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": address},
    }


def serving_secret(
    ca: pki.KeyPair, directory: Path, name: str, namespace: str, ips: tuple[str, ...] = ()
) -> Obj:
    """The ``<service>-tls`` Secret (kubernetes.io/tls) a webhook's component serves with:
    a certificate from ``ca`` for the Service's DNS names (and ``ips``)."""
    dns = (
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
    )
    pair = pki.issue(ca, directory, f"{name}-{namespace}", dns[2], hosts=(*dns, *ips))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": f"{name}-tls", "namespace": namespace},
        "data": {
            "tls.crt": base64.b64encode(pair.cert.read_bytes()).decode(),
            "tls.key": base64.b64encode(pair.key.read_bytes()).decode(),
        },
    }


class Transform(Protocol):
    def prepare(self, api: client.ApiClient, docs: list[Obj]) -> list[Obj]:
        """Objects to apply with the rest (called once the Services exist)."""
        ...

    def __call__(self, doc: Obj) -> tuple[Obj, bool]:
        """The document to apply, and whether to apply it as a dry run only."""
        ...


@dataclass
class ServiceTransform:
    """kind/k3d: webhooks keep calling their Service; the harness adds the caBundle of
    the CA that signed the Services' serving certs."""

    ca: pki.KeyPair
    directory: Path

    def prepare(self, api: client.ApiClient, docs: list[Obj]) -> list[Obj]:
        return [
            serving_secret(self.ca, self.directory, name, ns)
            for name, ns in sorted(webhook_services(docs))
        ]

    def __call__(self, doc: Obj) -> tuple[Obj, bool]:
        doc = copy.deepcopy(doc)
        for cfg in _client_configs(doc):
            if "service" in cfg:
                cfg["caBundle"] = base64.b64encode(self.ca.cert.read_bytes()).decode()
        return doc, False


@dataclass
class LocalTransform:
    """The local backend: a webhook calls its Service's address on the host.

    ``block`` is the cluster's loopback block (127.K.0.0/16). ``service_ports`` maps a
    Service still served by a host process (an addon not yet deployed as pods) to its
    127.0.0.1 port. ``dry_run_workloads`` applies Deployments/DaemonSets as a dry run
    (such an addon's processes stand in for them).
    """

    ca: pki.KeyPair
    directory: Path
    block: int | None
    service_ports: dict[str, int] = field(default_factory=dict)
    dry_run_workloads: bool = False
    _addresses: dict[tuple[str, str], str] = field(default_factory=dict)

    def prepare(self, api: client.ApiClient, docs: list[Obj]) -> list[Obj]:
        secrets = []
        for name, ns in sorted(webhook_services(docs)):
            if name in self.service_ports:
                continue
            address = self._address(api, name, ns, "webhook")
            secrets.append(serving_secret(self.ca, self.directory, name, ns, (address,)))
        hosts = [
            host_service(name, ns, self._address(api, name, ns, "APIService"))
            for name, ns in sorted(api_services(docs))
        ]
        return [*secrets, *hosts]

    def _address(self, api: client.ApiClient, name: str, ns: str, user: str) -> str:
        """Where the pod runner serves the Service (127.K.A.B), remembered for __call__."""
        try:
            cluster_ip = client.CoreV1Api(api).read_namespaced_service(name, ns).spec.cluster_ip
        except ApiException as exc:
            raise HarnessError(
                f"{user} Service {ns}/{name} is not in the manifests applied with it "
                f"({exc.status} {exc.reason}); add it to the chapter's manifests"
            ) from None
        if self.block is None:
            raise HarnessError("the cluster is not up: no loopback block for its Services")
        address = service_address(self.block, cluster_ip or "")
        if address is None:
            raise HarnessError(f"{user} Service {ns}/{name} has no ClusterIP")
        self._addresses[(name, ns)] = address
        return address

    def __call__(self, doc: Obj) -> tuple[Obj, bool]:
        if doc.get("kind", "") in WORKLOAD_KINDS:
            return doc, self.dry_run_workloads
        doc = copy.deepcopy(doc)
        svc = (doc.get("spec") or {}).get("service") if doc.get("kind") == "APIService" else None
        if svc is not None:
            svc["name"] = host_service(svc["name"], svc["namespace"], "")["metadata"]["name"]
        for cfg in _client_configs(doc):
            svc = cfg.pop("service", None)
            if svc is None:
                continue
            port = self.service_ports.get(svc["name"])
            if port is not None:
                host = f"127.0.0.1:{port}"
            else:
                address = self._addresses.get((svc["name"], svc["namespace"]))
                if address is None:
                    raise HarnessError(
                        f"webhook Service {svc['namespace']}/{svc['name']} was not prepared; "
                        "apply the webhook configuration together with its Service"
                    )
                host = f"{address}:{svc.get('port', 443)}"
            cfg["url"] = f"https://{host}{svc.get('path', '')}"
            cfg["caBundle"] = base64.b64encode(self.ca.cert.read_bytes()).decode()
        return doc, False


def load_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """All YAML documents under ``paths`` (files or directories, sorted, recursive).

    ``samples/`` directories are examples for users to apply, ``assets/`` templates a
    controller renders (the GPU Operator's operands): neither is part of a deployment, so
    walking a directory skips them (name a file explicitly to load it).
    """
    docs: list[dict[str, Any]] = []
    for path in paths:
        if path.is_dir():
            files = sorted(
                f
                for f in path.rglob("*.yaml")
                if not {"samples", "assets"} & set(f.relative_to(path).parts)
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
) -> list[Applied]:
    """Apply Namespaces, Services, the transform's extra objects (serving certs), CRDs
    (waiting until they are Established), then the rest."""
    docs = load_documents(paths)
    order = ("Namespace", "Service")
    first = [d for kind in order for d in docs if d["kind"] == kind]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] not in (*order, "CustomResourceDefinition")]
    dyn = dynamic.DynamicClient(api)
    applied = [_apply_one(dyn, d, transform) for d in first]
    extra = transform.prepare(api, docs) if transform is not None else []
    applied += [_apply_one(dyn, d, transform) for d in crds]
    if crds:
        _wait_established(api, [d["metadata"]["name"] for d in crds], progress)
        dyn.resources.invalidate_cache()
    applied += [_apply_one(dyn, d, transform) for d in [*extra, *rest]]
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
        return str(json.loads(exc.body).get("message", exc.reason))
    except (ValueError, TypeError, AttributeError):
        return f"{exc.status} {exc.reason}"


def _wait_established(api: client.ApiClient, names: list[str], progress: Progress) -> None:
    ext = client.ApiextensionsV1Api(api)

    def established(name: str) -> bool:
        crd = ext.read_custom_resource_definition(name)
        conds = crd.status.conditions or [] if crd.status else []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    try:
        wait_for(lambda: all(established(n) for n in names), 60, "CRDs to be Established")
    except WaitTimeout:
        pending = sorted(n for n in names if not established(n))
        raise HarnessError(f"CRDs not Established after 60s: {pending}") from None
    progress(f"{len(names)} CRDs Established")
