import base64
from pathlib import Path

import pytest

from harness import pki
from harness.apply import (
    MANIFESTS,
    LocalTransform,
    ServiceTransform,
    load_documents,
    serving_secret,
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


@pytest.fixture
def ca(tmp_path: Path) -> pki.KeyPair:
    return pki.create_ca(tmp_path)


def test_local_transform_points_webhooks_at_the_services_address(
    ca: pki.KeyPair, tmp_path: Path
) -> None:
    transform = LocalTransform(ca, tmp_path, block=42)
    transform._addresses[("svc", "ns")] = "127.42.3.4"  # what prepare() read from the Service
    out, dry = transform(WEBHOOK)
    assert not dry
    cfg = out["webhooks"][0]["clientConfig"]
    assert cfg == {
        "url": "https://127.42.3.4:443/webhook",
        "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
    }
    assert "service" in WEBHOOK["webhooks"][0]["clientConfig"]  # input left untouched


def test_local_transform_points_webhooks_at_a_host_process(ca: pki.KeyPair, tmp_path: Path) -> None:
    out, _ = LocalTransform(ca, tmp_path, 42, {"svc": 9443})(WEBHOOK)
    assert out["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:9443/webhook"


def test_local_transform_runs_workloads_unless_an_addon_stands_in(
    ca: pki.KeyPair, tmp_path: Path
) -> None:
    doc = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}}
    assert LocalTransform(ca, tmp_path, 42)(doc) == (doc, False)
    assert LocalTransform(ca, tmp_path, 42, dry_run_workloads=True)(doc) == (doc, True)


def test_webhook_whose_service_was_not_prepared_is_an_error(
    ca: pki.KeyPair, tmp_path: Path
) -> None:
    with pytest.raises(HarnessError, match="Service ns/svc was not prepared"):
        LocalTransform(ca, tmp_path, 42)(WEBHOOK)


def test_shipped_manifests_all_parse() -> None:
    docs = load_documents([MANIFESTS])
    assert any(d["kind"] == "Namespace" and d["metadata"]["name"] == "gpulab-system" for d in docs)


def test_document_without_kind_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("apiVersion: v1\nmetadata: {name: a}\n")
    with pytest.raises(HarnessError, match=r"x.yaml: every document needs apiVersion and kind"):
        load_documents([tmp_path])


def test_service_transform_keeps_the_service_and_adds_the_ca(tmp_path: Path) -> None:
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
    ca = pki.create_ca(tmp_path)
    out, dry = ServiceTransform(ca, tmp_path)(crd)
    cfg = out["spec"]["conversion"]["webhook"]["clientConfig"]
    assert not dry
    assert cfg["service"] == {"name": "s", "namespace": "n"}
    assert base64.b64decode(cfg["caBundle"]) == ca.cert.read_bytes()
    assert webhook_services([crd, WEBHOOK]) == {("s", "n"), ("svc", "ns")}


def test_serving_secrets_are_signed_for_the_services_names_and_address(tmp_path: Path) -> None:
    from cryptography import x509

    ca = pki.create_ca(tmp_path)
    (secret,) = ServiceTransform(ca, tmp_path).prepare(None, [WEBHOOK])  # type: ignore[arg-type]
    local = serving_secret(ca, tmp_path, "svc", "ns", ("127.42.3.4",))
    assert (secret["metadata"], secret["type"]) == (
        {"name": "svc-tls", "namespace": "ns"},
        "kubernetes.io/tls",
    )
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "svc.ns.svc" in sans.get_values_for_type(x509.DNSName)
    assert cert.issuer == x509.load_pem_x509_certificate(ca.cert.read_bytes()).subject
    cert = x509.load_pem_x509_certificate(base64.b64decode(local["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.42.3.4"]


def test_samples_are_not_part_of_a_deployment(tmp_path: Path) -> None:
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "job.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    (tmp_path / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n")
    assert [d["kind"] for d in load_documents([tmp_path])] == ["Namespace"]
    assert len(load_documents([tmp_path / "samples" / "job.yaml"])) == 1
