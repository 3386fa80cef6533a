import base64
from pathlib import Path

import pytest

from harness.apply import (
    MANIFESTS,
    LocalTransform,
    ServiceTransform,
    load_documents,
    webhook_services,
)
from harness.errors import HarnessError

WEBHOOK = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": "w"},
    "webhooks": [
        {
            "name": "w.gpulab.io",
            "clientConfig": {"service": {"name": "svc", "namespace": "ns", "path": "/webhook"}},
        }
    ],
}


def test_local_transform_points_webhooks_at_the_host_process() -> None:
    out, dry = LocalTransform(b"PEM", {"svc": 9443})(WEBHOOK)
    assert not dry
    cfg = out["webhooks"][0]["clientConfig"]
    assert cfg == {
        "url": "https://127.0.0.1:9443/webhook",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert "service" in WEBHOOK["webhooks"][0]["clientConfig"]  # input left untouched


def test_local_transform_dry_runs_workloads() -> None:
    doc = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}}
    assert LocalTransform(b"")(doc) == (doc, True)


def test_webhook_without_a_running_component_is_an_error() -> None:
    with pytest.raises(HarnessError, match="Service 'svc' has no local port"):
        LocalTransform(b"", {})(WEBHOOK)


def test_shipped_manifests_all_parse() -> None:
    docs = load_documents([MANIFESTS])
    assert any(d["kind"] == "Namespace" and d["metadata"]["name"] == "gpulab-system" for d in docs)


def test_document_without_kind_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("apiVersion: v1\nmetadata: {name: a}\n")
    with pytest.raises(HarnessError, match=r"x.yaml: every document needs apiVersion and kind"):
        load_documents([tmp_path])


def test_service_transform_keeps_the_service_and_adds_the_ca() -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "x"},
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {"clientConfig": {"service": {"name": "s", "namespace": "n"}}},
            }
        },
    }
    out, dry = ServiceTransform(b"PEM")(crd)
    cfg = out["spec"]["conversion"]["webhook"]["clientConfig"]
    assert not dry
    assert cfg["service"] == {"name": "s", "namespace": "n"}
    assert base64.b64decode(cfg["caBundle"]) == b"PEM"
    assert webhook_services([crd, WEBHOOK]) == {("s", "n"), ("svc", "ns")}


def test_serving_secrets_are_signed_for_the_services_dns_names(tmp_path: Path) -> None:
    from cryptography import x509

    from harness import pki
    from harness.docker import serving_secrets

    ca = pki.create_ca(tmp_path)
    (secret,) = serving_secrets(ca, tmp_path, [WEBHOOK])
    assert (secret["metadata"], secret["type"]) == (
        {"name": "svc-tls", "namespace": "ns"},
        "kubernetes.io/tls",
    )
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "svc.ns.svc" in sans.get_values_for_type(x509.DNSName)
    assert cert.issuer == x509.load_pem_x509_certificate(ca.cert.read_bytes()).subject


def test_samples_are_not_part_of_a_deployment(tmp_path: Path) -> None:
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "job.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    (tmp_path / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n")
    assert [d["kind"] for d in load_documents([tmp_path])] == ["Namespace"]
    assert len(load_documents([tmp_path / "samples" / "job.yaml"])) == 1
