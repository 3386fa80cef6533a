"""The offline image builds (harness/images): what goes into each build context, when a
cached image is rebuilt, the names containerd gives imported images, the lab's kindnetd
CNI config, and the manifests kind templates."""

from __future__ import annotations

import importlib.util
import json
import os
import tarfile
from pathlib import Path

import yaml

from harness import images
from harness.images import HERE, Recipe, _qualified, context_tar


def test_a_changed_input_changes_the_key_and_nothing_else_does(tmp_path: Path) -> None:
    binary = tmp_path / "kube-apiserver"
    binary.write_bytes(b"v1")
    args = {"BASE": images.BASE, "BINARY": "kube-apiserver"}
    recipe = Recipe("k/apiserver:1", "control-plane.Dockerfile", {"kube-apiserver": binary}, args)
    assert recipe.key() == recipe.key()
    binary.write_bytes(b"v2 ")
    changed = recipe.key()
    assert changed != Recipe(recipe.tag, recipe.dockerfile, {}, recipe.buildargs).key()
    other = Recipe(recipe.tag, recipe.dockerfile, recipe.files, {**recipe.buildargs, "BASE": "x"})
    assert other.key() != changed


def test_the_context_holds_the_dockerfile_and_the_files_with_kinds_modes(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "entrypoint"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o700)
    (tmp_path / "bin" / "conf").write_text("x")
    recipe = Recipe("t:1", "coredns.Dockerfile", {"kind/usr/local/bin": tmp_path / "bin"})
    with tarfile.open(fileobj=context_tar(recipe)) as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
        dockerfile = tar.extractfile("Dockerfile").read()  # type: ignore[union-attr]
    assert modes == {
        "Dockerfile": 0o644,
        "kind/usr/local/bin/conf": 0o644,
        "kind/usr/local/bin/entrypoint": 0o755,
    }
    assert dockerfile == (HERE / "coredns.Dockerfile").read_bytes()


def test_containerd_names_docker_tags_in_full() -> None:
    assert _qualified("gpulab/kindnetd:v0.33.0") == "docker.io/gpulab/kindnetd:v0.33.0"
    assert _qualified("gpulab:dev") == "docker.io/library/gpulab:dev"
    assert _qualified("registry.k8s.io/pause:3.10") == "registry.k8s.io/pause:3.10"
    assert _qualified("localhost/x:1") == "localhost/x:1"


def test_the_images_kubeadm_and_kind_start_are_all_built(monkeypatch) -> None:
    """The node image preloads what `kubeadm config images list` (v1.36.3) names, with
    kind's sandbox pause and CoreDNS one patch ahead, plus the CNI's image."""
    monkeypatch.setattr(images, "pause_binary", lambda _p: Path("/pause"))
    tags = [r.tag for r in images.cluster_images(lambda _m: None)]
    assert tags == [
        "registry.k8s.io/kube-apiserver:v1.36.3",
        "registry.k8s.io/kube-controller-manager:v1.36.3",
        "registry.k8s.io/kube-scheduler:v1.36.3",
        "registry.k8s.io/kube-proxy:v1.36.3",
        "registry.k8s.io/etcd:3.6.8-0",  # kubeadm's DefaultEtcdVersion for 1.36
        "registry.k8s.io/coredns/coredns:v1.14.3",
        "registry.k8s.io/pause:3.10",  # kind's containerd sandbox_image
        images.KINDNETD,
    ]


def test_the_cni_manifest_keeps_kinds_template_markers() -> None:
    """kind templates the pod subnet and patches the control-plane endpoint in only when
    the manifest carries its two markers (installcni/cni.go)."""
    text = (HERE / "default-cni.yaml").read_text()
    assert "would you kindly template this file" in text
    assert "would you kindly patch this file" in text
    rendered = text.replace("{{ .PodSubnet }}", "10.244.0.0/16").replace(
        "KINDNETD_IMAGE", images.KINDNETD
    )
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == images.KINDNETD
    assert {"name": "POD_SUBNET", "value": "10.244.0.0/16"} in container["env"]
    assert ds["spec"]["template"]["spec"]["hostNetwork"] is True


def _kindnetd():
    spec = importlib.util.spec_from_file_location("kindnetd", HERE / "kindnetd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kindnetd_writes_ptp_over_the_nodes_pod_cidrs() -> None:
    kindnetd = _kindnetd()
    config = json.loads(kindnetd.cni_config(["10.244.2.0/24"]))
    ptp, portmap = config["plugins"]
    assert (ptp["type"], ptp["ipam"]["type"]) == ("ptp", "host-local")
    assert ptp["ipam"]["ranges"] == [[{"subnet": "10.244.2.0/24"}]]
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}
    node = {
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "Hostname", "address": "w"},
                                 {"type": "InternalIP", "address": "172.18.0.3"}]},
    }  # fmt: skip
    assert kindnetd.internal_ip(node) == "172.18.0.3"
    assert kindnetd.pod_cidrs(node) == ["10.244.1.0/24"]
    assert kindnetd.pod_cidrs({"spec": {"podCIDR": "10.244.9.0/24"}}) == ["10.244.9.0/24"]


def test_kindnetd_rewrites_its_cni_config_only_when_it_changes(tmp_path, monkeypatch) -> None:
    kindnetd = _kindnetd()
    monkeypatch.setattr(kindnetd, "CNI_CONFIG", str(tmp_path / "10-kindnet.conflist"))
    kindnetd.write_cni_config(["10.244.1.0/24"])
    first = os.stat(kindnetd.CNI_CONFIG).st_ino
    kindnetd.write_cni_config(["10.244.1.0/24"])
    assert os.stat(kindnetd.CNI_CONFIG).st_ino == first  # untouched: no rename
    kindnetd.write_cni_config(["10.244.3.0/24"])
    assert "10.244.3.0/24" in Path(kindnetd.CNI_CONFIG).read_text()


def test_the_node_image_carries_kinds_files_and_binaries() -> None:
    """kind's images/base/files as its Dockerfile copies them, and the runtime's binaries."""
    recipe = images.kind_base()
    assert recipe.tag == images.KIND_BASE
    members = set(recipe.files)
    assert {"kind/usr/local/bin", "kind/kind", "kind/etc", "bin/runc", "bin/crictl"} <= members
    assert {f"bin/{n}" for n in ("containerd", "ctr", "containerd-shim-runc-v2")} <= members
    assert {f"cni/{n}" for n in ("host-local", "loopback", "ptp", "portmap")} <= members
    entrypoint = recipe.files["kind/usr/local/bin"] / "entrypoint"
    assert entrypoint.is_file()
