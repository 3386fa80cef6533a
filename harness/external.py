"""The ``external`` backend: the chapters' manifests on a cluster that already exists.

    gpulab up --backend external --kubeconfig PATH [--spec NAME]

A real cluster (real kubelets, real GPUs, real NVIDIA device plugin) or any cluster a
kubeconfig reaches. Nothing is started on this host; ``up`` applies, per chapter (the
spec's ``addons``, after ``base``), the same ``manifests/<chapter>/`` kind applies, with a
serving-cert Secret and caBundle for each webhook Service (harness/apply.py
ServiceTransform). What differs from the simulated backends:

- a chapter already on the cluster (any of its objects exists and was not created by a
  previous ``gpulab up``) is left as it is, never patched;
- the device plugin is not deployed where NVIDIA's own plugin runs: a DaemonSet running
  NVIDIA's k8s-device-plugin image (or named ``nvidia-device-plugin*``), or nodes already
  advertising ``nvidia.com/gpu`` with no gpulab device-plugin pod on them;
- ``up`` records every object it created (``<state>/<cluster>/external/created.json``,
  written before applying) and ``down`` deletes exactly those, webhooks first;
- the component image is ``$GPULAB_IMAGE`` (default ``gpulab:dev``): push it to a registry
  the cluster pulls from; ``load_image`` cannot load it for you;
- there is no fault injection (real GPUs) and no host process to restart.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from gpulab.state import cluster_dir
from gpulab.wait import WaitTimeout, wait_for
from harness import pki
from harness.apply import (
    MANIFESTS,
    WEBHOOK_KINDS,
    ServiceTransform,
    apply,
    load_documents,
    webhook_services,
)
from harness.backends import ClusterAPI
from harness.errors import HarnessError
from harness.spec import ClusterSpec

Progress = Callable[[str], None]
Obj = dict[str, Any]

KUBECONFIG_ENV = "GPULAB_KUBECONFIG"
IMAGE_ENV = "GPULAB_IMAGE"
LAB_IMAGE = "gpulab:dev"
OUR_PLUGIN = "gpulab-device-plugin"  # app.kubernetes.io/name of manifests/device-plugin
NVIDIA_PLUGIN_IMAGE = "k8s-device-plugin"  # nvcr.io/nvidia/k8s-device-plugin:<tag>
NVIDIA_PLUGIN_NAME = "nvidia-device-plugin"
GPU = "nvidia.com/gpu"
ROLLOUT_TIMEOUT = 180.0


@dataclass(frozen=True)
class Ref:
    """One object `up` created: enough to delete it again."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def ref_of(doc: Obj) -> Ref:
    meta = doc.get("metadata", {})
    return Ref(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))


# ---------------------------------------------------------------- pure decisions


def foreign_gpu_plugin(daemonsets: Iterable[Obj], pods: Iterable[Obj], nodes: Iterable[Obj]) -> str:
    """Why the lab's device plugin must not be deployed here, or "" when it may be.

    Takes the cluster's DaemonSets, pods and nodes as API dicts. NVIDIA's plugin runs when a
    DaemonSet runs its image or carries its name (static manifest
    ``nvidia-device-plugin-daemonset``, Helm ``*-nvidia-device-plugin``, GPU Operator
    ``nvidia-device-plugin-daemonset``); a node advertising ``nvidia.com/gpu`` that no
    gpulab device-plugin pod serves has some other plugin (or a kubelet) behind it.
    """
    for ds in daemonsets:
        meta = ds.get("metadata", {})
        if meta.get("labels", {}).get("app.kubernetes.io/name") == OUR_PLUGIN:
            continue
        containers = ds.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        images = [c.get("image", "") for c in containers]
        if NVIDIA_PLUGIN_NAME in meta.get("name", "") or any(
            NVIDIA_PLUGIN_IMAGE in image for image in images
        ):
            return f"NVIDIA's device plugin runs (DaemonSet {meta.get('namespace')}/{meta['name']})"
    ours = {
        p.get("spec", {}).get("nodeName")
        for p in pods
        if p.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/name") == OUR_PLUGIN
    }
    for node in nodes:
        name = node.get("metadata", {}).get("name")
        capacity = node.get("status", {}).get("capacity") or {}
        if str(capacity.get(GPU, "0")) not in ("0", "") and name not in ours:
            return (
                f"node {name} already advertises {GPU}={capacity[GPU]} and no gpulab "
                "device-plugin pod runs there"
            )
    return ""


def foreign_objects(chapter_refs: Iterable[Ref], existing: set[Ref], ours: set[Ref]) -> list[Ref]:
    """The chapter's objects that exist on the cluster and were not created by us."""
    return [r for r in chapter_refs if r in existing and r not in ours]


def deletion_order(refs: Iterable[Ref]) -> list[Ref]:
    """Webhook configurations first (so nothing calls a component that is going away),
    then everything in reverse creation order (namespaced objects before their
    namespace, CRDs after the objects that use them)."""
    refs = list(refs)
    hooks = [r for r in refs if r.kind in WEBHOOK_KINDS]
    return hooks + [r for r in reversed(refs) if r.kind not in WEBHOOK_KINDS]


def with_image(doc: Obj, image: str) -> Obj:
    """``doc`` with every container image ``gpulab:dev`` replaced by ``image``."""
    if image == LAB_IMAGE:
        return doc
    doc = copy.deepcopy(doc)
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec") if "template" in spec else spec
    for key in ("initContainers", "containers"):
        for container in (pod or {}).get(key, []) or []:
            if container.get("image") == LAB_IMAGE:
                container["image"] = image
    return doc


# ---------------------------------------------------------------- the backend


class ExternalTransform(ServiceTransform):
    """kind's transform (webhooks call their Service, caBundle from our CA) plus the
    component image the cluster can pull."""

    def __init__(self, ca: pki.KeyPair, directory: Path, image: str) -> None:
        super().__init__(ca, directory)
        self.image = image

    def __call__(self, doc: Obj) -> tuple[Obj, bool]:
        doc, dry = super().__call__(doc)
        return with_image(doc, self.image), dry


def kubeconfig_for(spec: ClusterSpec, explicit: Path | None = None) -> Path:
    """--kubeconfig, else $GPULAB_KUBECONFIG, else the one `up` recorded."""
    if explicit is not None:
        return Path(explicit)
    if os.environ.get(KUBECONFIG_ENV):
        return Path(os.environ[KUBECONFIG_ENV])
    record = state_dir(spec) / "created.json"
    if record.exists():
        return Path(json.loads(record.read_text())["kubeconfig"])
    raise HarnessError(
        "the external backend needs the existing cluster's kubeconfig: "
        f"--kubeconfig PATH (or ${KUBECONFIG_ENV})"
    )


def state_dir(spec: ClusterSpec) -> Path:
    """Kept apart from a local cluster of the same spec name (its pki, its kubeconfig)."""
    return cluster_dir(spec.name) / "external"


class ExternalCluster(ClusterAPI):
    def __init__(self, spec: ClusterSpec, kubeconfig: Path) -> None:
        self.spec = spec
        self.kubeconfig = Path(kubeconfig)
        if not self.kubeconfig.exists():
            raise HarnessError(f"kubeconfig {self.kubeconfig} does not exist")
        self.dir = state_dir(spec)
        self._record = self.dir / "created.json"

    # ------------------------------------------------------------ record

    def created(self) -> list[Ref]:
        if not self._record.exists():
            return []
        return [Ref(**r) for r in json.loads(self._record.read_text())["created"]]

    def _save(self, refs: list[Ref], chapters: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {
            "kubeconfig": str(self.kubeconfig.resolve()),
            "chapters": chapters,
            "created": [asdict(r) for r in refs],
        }
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self._record)

    def chapters(self) -> list[str]:
        if not self._record.exists():
            return []
        return list(json.loads(self._record.read_text()).get("chapters", []))

    # ------------------------------------------------------------ up

    def running(self) -> bool:
        return self._record.exists()

    def up(self, progress: Progress) -> None:
        self._check_reachable()
        progress(f"deploying onto the cluster of {self.kubeconfig}")
        self._deploy("base", progress)
        for chapter in self.spec.addons:
            self.ensure_addon(chapter, progress)
        if not self._record.exists():  # nothing was new: still remember the cluster
            self._save([], [])

    def _check_reachable(self) -> None:
        try:
            client.VersionApi(self.api()).get_code()
        except Exception as exc:  # urllib3/ssl/ApiException: one line either way
            raise HarnessError(
                f"the cluster of {self.kubeconfig} does not answer: {str(exc).splitlines()[0]}"
            ) from None

    def ensure_addon(self, name: str, progress: Progress) -> None:
        if name == "device-plugin":
            reason = self.foreign_plugin()
            if reason:
                progress(f"device-plugin: not deployed, {reason}")
                return
        self._deploy(name, progress)

    def foreign_plugin(self) -> str:
        api = self.api()
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        ser = api.sanitize_for_serialization
        return foreign_gpu_plugin(
            ser(apps.list_daemon_set_for_all_namespaces()).get("items", []),
            ser(
                core.list_pod_for_all_namespaces(
                    label_selector=f"app.kubernetes.io/name={OUR_PLUGIN}"
                )
            ).get("items", []),
            ser(core.list_node()).get("items", []),
        )

    def _deploy(self, chapter: str, progress: Progress) -> None:
        path = MANIFESTS / chapter
        if not path.is_dir():
            raise HarnessError(f"no manifests for chapter {chapter!r} in {MANIFESTS}")
        docs = load_documents([path])
        refs = [ref_of(d) for d in docs] + [
            Ref("v1", "Secret", f"{name}-tls", ns) for name, ns in sorted(webhook_services(docs))
        ]
        ours = set(self.created())
        existing = {r for r in refs if self._exists(r)}
        foreign = foreign_objects(refs, existing, ours)
        if foreign:
            progress(
                f"{chapter}: already on the cluster ({foreign[0]} was not created by "
                "`gpulab up`); left as it is"
            )
            return
        new = [r for r in refs if r not in existing]
        # recorded before applying: a failure half-way still leaves `down` a full list
        self._save([*self.created(), *new], [*self.chapters(), chapter])
        apply(self.api(), [path], progress, self._transform())
        self._wait_rollout([r for r in new if r.kind in ("Deployment", "DaemonSet")], progress)
        progress(f"{chapter}: deployed ({len(new)} objects created)")

    def _transform(self) -> ExternalTransform:
        pki_dir = self.dir / "pki"
        if not (pki_dir / "ca.crt").exists():
            pki_dir.mkdir(parents=True, exist_ok=True)
            pki.create_ca(pki_dir)
        ca = pki.KeyPair(pki_dir / "ca.crt", pki_dir / "ca.key")
        return ExternalTransform(ca, pki_dir, os.environ.get(IMAGE_ENV) or LAB_IMAGE)

    def _resource(self, ref: Ref) -> Any:
        return dynamic.DynamicClient(self.api()).resources.get(
            api_version=ref.api_version, kind=ref.kind
        )

    def _exists(self, ref: Ref) -> bool:
        try:
            resource = self._resource(ref)
        except Exception:  # the API (a CRD's group) is not served yet: nothing of it exists
            return False
        try:
            resource.get(name=ref.name, namespace=ref.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _wait_rollout(self, refs: list[Ref], progress: Progress) -> None:
        apps = client.AppsV1Api(self.api())

        def ready(ref: Ref) -> bool:
            if ref.kind == "Deployment":
                d = apps.read_namespaced_deployment(ref.name, ref.namespace)
                return (d.status.available_replicas or 0) >= (d.spec.replicas or 1)
            ds = apps.read_namespaced_daemon_set(ref.name, ref.namespace)
            want = ds.status.desired_number_scheduled or 0
            return ds.status.observed_generation is not None and (
                (ds.status.number_available or 0) >= want
            )

        for ref in refs:
            try:
                wait_for(lambda r=ref: ready(r), ROLLOUT_TIMEOUT, str(ref), interval=1)
            except WaitTimeout:
                raise HarnessError(
                    f"{ref} not available after {ROLLOUT_TIMEOUT:.0f}s; "
                    f"see `kubectl -n {ref.namespace} describe {ref.kind.lower()} {ref.name}` "
                    f"(is ${IMAGE_ENV} an image the cluster can pull?)"
                ) from None
            progress(f"{ref} available")

    def apply(self, paths: list[Path], progress: Progress) -> None:
        """Apply (user) manifests as kind does; not recorded: `down` leaves them."""
        apply(self.api(), paths, progress, self._transform())

    # ------------------------------------------------------------ down

    def down(self, progress: Progress) -> None:
        refs = self.created()
        if not self._record.exists():
            progress(f"nothing of the lab was deployed onto {self.kubeconfig}")
            return
        for ref in deletion_order(refs):
            try:
                self._resource(ref).delete(name=ref.name, namespace=ref.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    why = f"{exc.status} {exc.reason}"
                    raise HarnessError(f"could not delete {ref}: {why}") from None
            except Exception:  # its API went away with its CRD: nothing left to delete
                continue
            progress(f"deleted {ref}")
        try:
            wait_for(lambda: not any(self._exists(r) for r in refs), 120, "deletions", interval=1)
        except WaitTimeout:
            left = [str(r) for r in refs if self._exists(r)]
            raise HarnessError(f"still there after 120s: {', '.join(left)}") from None
        self._record.unlink()
        progress(f"removed the {len(refs)} objects `up` created; the cluster is as it was")

    # ------------------------------------------------------------ what it cannot do

    def processes(self) -> list[Any]:
        return []

    def inject_fault(self, node: str, gpu: int, xid: int) -> None:
        raise HarnessError(
            "fault injection needs the NVML shim; on an external cluster the GPUs are real"
        )

    def clear_faults(self, node: str, gpu: int | None = None) -> None:
        raise HarnessError("fault injection needs the NVML shim; there is nothing to clear")
