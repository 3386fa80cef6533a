"""The Kueue CRDs, webhook configuration and samples: structure and OpenAPI validation.

A small validator for the OpenAPI subset the CRDs use stands in for the API server
until the e2e tests run them against a real one; unknown fields count as errors so a
sample using a field our schema lacks (which the API server would prune) fails here.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulab.kueue import conversion
from gpulab.kueue.webhook import CONVERT_PATH, MUTATE_JOB_PATH
from harness import pki
from harness.addons import kueue as addon
from harness.apply import LocalTransform, load_documents

ROOT = Path(__file__).resolve().parents[2]
KUEUE = ROOT / "manifests" / "kueue"
FIXTURES = ROOT / "tests" / "fixtures" / "kueue"
SERVICE = {"name": addon.SERVICE, "namespace": "kueue-system"}


def crds() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((KUEUE / "crds").glob("*.yaml")):
        [doc] = load_documents([path])
        out[doc["spec"]["names"]["kind"]] = doc
    return out


def schema(kind: str, version: str) -> dict[str, Any]:
    [v] = [v for v in crds()[kind]["spec"]["versions"] if v["name"] == version]
    return v["schema"]["openAPIV3Schema"]


def validate(value: Any, s: dict[str, Any], path: str = "") -> list[str]:
    """Errors of ``value`` against an OpenAPI v3 (structural) schema."""
    errs: list[str] = []
    if s.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            return [f"{path}: must be an integer or a string"]
    elif s.get("type") == "object":
        if not isinstance(value, dict):
            return [f"{path}: must be an object"]
    elif s.get("type") == "array":
        if not isinstance(value, list):
            return [f"{path}: must be an array"]
    elif s.get("type") == "string":
        if not isinstance(value, str):
            return [f"{path}: must be a string"]
    elif s.get("type") == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: must be an integer"]
    elif s.get("type") == "boolean" and not isinstance(value, bool):
        return [f"{path}: must be a boolean"]
    if "enum" in s and value not in s["enum"]:
        errs.append(f"{path}: {value!r} not in {s['enum']}")
    if isinstance(value, str):
        if "pattern" in s and not re.search(s["pattern"], value):
            errs.append(f"{path}: {value!r} does not match {s['pattern']}")
        if len(value) > s.get("maxLength", len(value)):
            errs.append(f"{path}: too long")
    if isinstance(value, int) and not isinstance(value, bool) and value < s.get("minimum", value):
        errs.append(f"{path}: {value} < minimum {s['minimum']}")
    if isinstance(value, list):
        if len(value) < s.get("minItems", 0) or len(value) > s.get("maxItems", len(value)):
            errs.append(f"{path}: wrong number of items")
        for i, item in enumerate(value):
            errs += validate(item, s.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict) and s.get("type") == "object":
        for req in s.get("required", []):
            if req not in value:
                errs.append(f"{path}.{req}: required")
        props = s.get("properties", {})
        for k, v in value.items():
            if k in props:
                errs += validate(v, props[k], f"{path}.{k}")
            elif "additionalProperties" in s:
                errs += validate(v, s["additionalProperties"], f"{path}.{k}")
            elif not s.get("x-kubernetes-preserve-unknown-fields") and path != ".metadata":
                errs.append(f"{path}.{k}: unknown field")
        if len(value) > s.get("maxProperties", len(value)):
            errs.append(f"{path}: too many properties")
    return errs


def validate_doc(doc: dict[str, Any]) -> list[str]:
    version = doc["apiVersion"].split("/")[1]
    return validate(doc, schema(doc["kind"], version))


def structural_problems(s: dict[str, Any], path: str = "") -> list[str]:
    """Nodes without a type (the API server rejects non-structural schemas)."""
    out = []
    if "type" not in s and not s.get("x-kubernetes-int-or-string"):
        out.append(path or "/")
    if s.get("x-kubernetes-int-or-string"):
        assert s.get("anyOf") == [{"type": "integer"}, {"type": "string"}], path
    for k, sub in (s.get("properties") or {}).items():
        out += structural_problems(sub, f"{path}.{k}")
    if isinstance(s.get("items"), dict):
        out += structural_problems(s["items"], f"{path}[]")
    if isinstance(s.get("additionalProperties"), dict):
        out += structural_problems(s["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("kind", ["ResourceFlavor", "ClusterQueue", "LocalQueue", "Workload"])
def test_crd_structure(kind: str) -> None:
    crd = crds()[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = crd["spec"]
    assert spec["group"] == "kueue.x-k8s.io"
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.kueue.x-k8s.io"
    assert spec["scope"] == ("Namespaced" if kind in ("LocalQueue", "Workload") else "Cluster")
    versions = {v["name"]: v for v in spec["versions"]}
    assert set(versions) == {"v1beta1", "v1beta2"}
    assert all(v["served"] for v in versions.values())
    assert [n for n, v in versions.items() if v["storage"]] == ["v1beta2"]
    conv = spec["conversion"]
    assert conv["strategy"] == "Webhook"
    assert conv["webhook"]["conversionReviewVersions"] == ["v1"]
    # one form for every backend: the Service; the harness adds caBundle (and on local the URL)
    assert conv["webhook"]["clientConfig"] == {"service": {**SERVICE, "path": CONVERT_PATH}}
    for v in versions.values():
        assert structural_problems(v["schema"]["openAPIV3Schema"]) == []
        if kind != "ResourceFlavor":
            assert v["subresources"] == {"status": {}}


def test_printer_columns_show_counts_and_usage() -> None:
    def columns(kind: str) -> dict[str, str]:
        [v2] = [v for v in crds()[kind]["spec"]["versions"] if v["name"] == "v1beta2"]
        return {c["name"]: c["jsonPath"] for c in v2["additionalPrinterColumns"]}

    cq = columns("ClusterQueue")
    assert cq["Cohort"] == ".spec.cohortName"
    assert cq["Pending Workloads"] == ".status.pendingWorkloads"
    assert cq["Admitted Workloads"] == ".status.admittedWorkloads"
    assert cq["Usage"] == ".status.flavorsUsage[*].resources[*].total"
    lq = columns("LocalQueue")
    assert lq["ClusterQueue"] == ".spec.clusterQueue"
    assert {"Pending Workloads", "Admitted Workloads"} <= set(lq)
    wl = columns("Workload")
    assert wl["Reserved in"] == ".status.admission.clusterQueue"
    assert wl["Admitted"] == ".status.conditions[?(@.type=='Admitted')].status"
    assert wl["Finished"] == ".status.conditions[?(@.type=='Finished')].status"
    [v1] = [v for v in crds()["ClusterQueue"]["spec"]["versions"] if v["name"] == "v1beta1"]
    assert v1["additionalPrinterColumns"][0]["jsonPath"] == ".spec.cohort"


def test_upstream_samples_validate() -> None:
    for name in (
        "single-clusterqueue-setup.yaml",
        "single-clusterqueue-setup-v1beta1.yaml",
        "gpu-cohort-setup.yaml",
    ):
        for doc in load_documents([KUEUE / "samples" / name]):
            assert validate_doc(doc) == [], (name, doc["metadata"]["name"])
    [job] = load_documents([KUEUE / "samples" / "sample-job.yaml"])
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "user-queue"}
    assert "suspend" not in job["spec"]  # the webhook adds it


def test_converted_v1beta1_objects_fit_the_v1beta2_schema() -> None:
    docs = load_documents([KUEUE / "samples" / "gpu-cohort-setup.yaml"])
    old = [d for d in docs if d["apiVersion"].endswith("v1beta1")]
    assert old
    for doc in old:
        hub = conversion.convert(doc, conversion.V1BETA2)
        assert validate_doc(hub) == []
        # `cohort` is not a v1beta2 field: unconverted, the API server would drop it.
        assert validate(
            {**doc, "apiVersion": conversion.V1BETA2}, schema("ClusterQueue", "v1beta2")
        )


@pytest.mark.parametrize(
    "name", ["clusterqueue-negative-quota.yaml", "clusterqueue-negative-quota-string.yaml"]
)
def test_negative_quota_is_rejected_by_the_schema(name: str) -> None:
    [doc] = load_documents([FIXTURES / name])
    errs = validate_doc(doc)
    assert errs and all("nominalQuota" in e for e in errs)


@pytest.mark.parametrize("value", [0, 9, "9", "500m", "36Gi", "1.5", "+2", "1e3"])
def test_valid_quantities_pass(value: Any) -> None:
    quantity = schema("ClusterQueue", "v1beta2")["properties"]["spec"]["properties"][
        "resourceGroups"
    ]["items"]["properties"]["flavors"]["items"]["properties"]["resources"]["items"]["properties"][
        "nominalQuota"
    ]
    assert validate(value, quantity) == []
    assert validate("-1" if isinstance(value, str) else -1, quantity)


def test_unknown_flavor_fixture_is_accepted_by_schema() -> None:
    for doc in load_documents([FIXTURES / "clusterqueue-unknown-flavor.yaml"]):
        assert validate_doc(doc) == []


def test_local_transform_points_every_webhook_at_the_controller(tmp_path: Path) -> None:
    """What the addon applies (manifests/kueue minus samples/) through the local transform."""
    ca = pki.create_ca(tmp_path)
    transform = LocalTransform(ca, tmp_path, None, {addon.SERVICE: 9443}, dry_run_workloads=True)
    hooks = {}
    for doc in load_documents([addon.MANIFEST_DIR]):
        assert doc["apiVersion"].split("/")[0] != "kueue.x-k8s.io"  # no samples
        out, dry_run = transform(doc)
        assert dry_run == (doc["kind"] == "Deployment")
        if doc["kind"] == "CustomResourceDefinition":
            hooks[doc["metadata"]["name"]] = out["spec"]["conversion"]["webhook"]["clientConfig"]
        if doc["kind"] == "MutatingWebhookConfiguration":
            hooks["mjob.kb.io"] = out["webhooks"][0]["clientConfig"]
    assert len(hooks) == 5
    for name, cfg in hooks.items():
        path = MUTATE_JOB_PATH if name == "mjob.kb.io" else CONVERT_PATH
        bundle = base64.b64encode(ca.cert.read_bytes()).decode()
        assert cfg == {"url": f"https://127.0.0.1:9443{path}", "caBundle": bundle}, name


def test_webhook_rbac_and_deployment() -> None:
    [hook] = yaml.safe_load((KUEUE / "webhook.yaml").read_text())["webhooks"]
    assert hook["clientConfig"] == {"service": {**SERVICE, "path": MUTATE_JOB_PATH}}
    assert hook["name"] == "mjob.kb.io" and hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "apiGroups": ["batch"],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["jobs"],
        }
    ]
    [dep] = load_documents([KUEUE / "deployment.yaml"])
    [container] = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "gpulab:dev"
    assert container["args"][0] == "kueue-controller"
    assert "--webhook-bind=0.0.0.0:9443" in container["args"]
    [svc] = load_documents([KUEUE / "service.yaml"])
    assert svc["metadata"] == SERVICE
    assert svc["spec"]["ports"][0]["targetPort"] == 9443
    role = next(d for d in load_documents([KUEUE / "rbac.yaml"]) if d["kind"] == "ClusterRole")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for needed in [
        ("kueue.x-k8s.io", "workloads", "create"),
        ("kueue.x-k8s.io", "workloads/status", "update"),
        ("kueue.x-k8s.io", "clusterqueues/status", "update"),
        ("batch", "jobs", "patch"),
        ("batch", "jobs/status", "patch"),
        ("events.k8s.io", "events", "create"),
    ]:
        assert needed in granted, needed
