"""The kind config the harness renders, decoded by kind v0.33.0's own Go config types
(sigs.k8s.io/kind/pkg/apis/config/v1alpha4) the way `kind create cluster --config` decodes
it: strictly, unknown fields refused (test-tools/kind-config-check).

k3d's config types (github.com/k3d-io/k3d/v5) are not served by the Go module proxy this
lab builds from, so the k3d config has no such check."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness import testtools
from harness.docker import KIND_NODE_IMAGE, ROOT, kind_config
from harness.spec import available, load


@pytest.fixture(scope="module")
def check() -> Path:
    return testtools.build("kind-config-check", print)


def decode(check: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(check)], input=text, capture_output=True, text=True, timeout=30, check=False
    )


def test_the_checked_in_kind_config_decodes_strictly_to_what_we_rendered(check: Path) -> None:
    proc = decode(check, (ROOT / "kind-config.yaml").read_text())
    assert proc.returncode == 0, proc.stderr
    decoded = json.loads(proc.stdout)
    rendered = kind_config(load("default"))
    assert decoded["name"] == rendered["name"]
    assert [n["role"] for n in decoded["nodes"]] == [n["role"] for n in rendered["nodes"]]
    for got, want in zip(decoded["nodes"], rendered["nodes"], strict=True):
        assert got["image"] == KIND_NODE_IMAGE
        assert got.get("labels", {}) == want.get("labels", {})
        assert got.get("extraMounts", []) == want.get("extraMounts", [])


@pytest.mark.parametrize("spec", available())
def test_every_shipped_spec_renders_a_config_kind_accepts(check: Path, spec: str) -> None:
    text = yaml.safe_dump(kind_config(load(spec), relative_paths=False))
    proc = decode(check, text)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["nodes"]) == len(load(spec).nodes) + 1


def test_a_field_kind_does_not_know_is_refused(check: Path) -> None:
    cfg = kind_config(load("default"))
    cfg["nodes"][1]["extraMount"] = cfg["nodes"][1].pop("extraMounts")  # a typo
    proc = decode(check, yaml.safe_dump(cfg))
    assert proc.returncode == 1
    assert "field extraMount not found in type v1alpha4.Node" in proc.stderr
