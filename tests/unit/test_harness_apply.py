import base64
from pathlib import Path

import pytest

from harness.apply import MANIFESTS, LocalTransform, load_documents
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
