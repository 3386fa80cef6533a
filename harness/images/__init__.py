"""The images the kind backend runs, built on this machine (``gpulab build --images``).

Where a container registry answers, kind's pinned ``kindest/node`` and ``python:3.11-slim``
are pulled as on any laptop. Where none does (``--offline``, or the pull fails), every image
is built here, from Debian's packages and the Go module proxy only, following kind
v0.33.0's own recipe step by step:

1. ``gpulab/debian:bookworm``: a Debian rootfs from debootstrap (minbase), imported;
2. the images kubeadm v1.36.3 and kind start, from binaries built here (harness/binaries.py):
   ``registry.k8s.io/kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy:v1.36.3``,
   ``etcd:3.6.8-0``, ``coredns/coredns:v1.14.3``, ``pause:3.10`` (kind's sandbox image, from
   v1.36.3's pause.c) and the lab's kindnetd (harness/images/kindnetd.py);
3. ``gpulab/kind-base``: kind's ``images/base/Dockerfile`` on that rootfs, with containerd
   v2.3.4, runc v1.4.3, crictl v1.37.0 and the CNI plugins v1.9.1 built from their modules;
4. ``gpulab/kind-node:v1.36.3``: what ``kind build node-image`` does (buildcontext.go):
   kubeadm, kubelet and kubectl into ``/usr/bin``, ``/kind/version``, the CNI and storage
   manifests, every image of step 2 imported into the node's containerd, committed with
   kind's entrypoint;
5. ``gpulab:dev``, the lab's component image (the repository's Dockerfile) on step 1, and
   the stand-ins of workload images the chapters name;
6. ``gpulab/kind-node-lab:v1.36.3``: step 4 with step 5's images in its containerd too (a
   lab convenience: nothing is loaded into the nodes at cluster start).

Each image carries a label with a key of what went into it, so a second build is skipped
and a changed input rebuilds only what depends on it. The engine's data root is under the
user's cache (harness/engine.py), so the images survive like the binaries do.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import docker
import docker.utils as docker_utils
from docker.errors import APIError, DockerException, ImageNotFound
from requests import RequestException

from gpulab.state import cache_dir
from harness import binaries, engine
from harness.errors import HarnessError

Progress = Callable[[str], None]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LABEL = "io.gpulab.build-key"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE = f"gpulab/debian:{DEBIAN_SUITE}"
KIND_BASE = f"gpulab/kind-base:{binaries.KIND_VERSION}"
NODE = f"gpulab/kind-node:{binaries.KUBERNETES_VERSION}"
LAB_NODE = f"gpulab/kind-node-lab:{binaries.KUBERNETES_VERSION}"
KINDNETD = f"gpulab/kindnetd:{binaries.KIND_VERSION}"
LAB = "gpulab:dev"
# the registry image gpulab:dev starts from where one can be pulled
PYTHON_IMAGE = "python:3.11-slim"
# kind v0.33.0's images/base/files/etc/containerd/config.toml: sandbox_image
PAUSE = "registry.k8s.io/pause:3.10"
PAUSE_SOURCE_VERSION = "3.10.2"  # build/pause/Makefile TAG at kubernetes v1.36.3
REGISTRY = "registry-1.docker.io"
BUILD_TIMEOUT = 900.0  # one Engine API call: a build step, a commit of the node image
# Workload images the chapters' pods name. Where no registry answers, a stand-in is built
# under the same name (labelled io.gpulab.stand-in): the lab's image, whose nvidia-smi is
# the NVML shim's, so `nvidia-smi -L` in a GPU pod lists the GPUs its container was given.
STAND_INS = ("nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",)


@dataclass(frozen=True)
class Recipe:
    """One ``docker build``: a Dockerfile from this directory and the files it copies."""

    tag: str
    dockerfile: str
    files: dict[str, Path] = field(default_factory=dict)  # context path -> host file or dir
    buildargs: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        digest = hashlib.sha256()
        digest.update((HERE / self.dockerfile).read_bytes())
        digest.update(json.dumps(self.buildargs, sort_keys=True).encode())
        for name, path in sorted(self.files.items()):
            for member, source in _walk(name, path):
                st = source.stat()
                digest.update(f"{member}:{st.st_size}:{st.st_mtime_ns}:{st.st_mode}".encode())
        return digest.hexdigest()[:20]


def _walk(name: str, path: Path) -> Iterator[tuple[str, Path]]:
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file():
                yield f"{name}/{child.relative_to(path)}", child
    else:
        yield name, path


def context_tar(recipe: Recipe) -> io.BytesIO:
    """The build context: the Dockerfile and the recipe's files, owned by root, scripts
    and binaries 0755, the rest 0644 (as kind's ``COPY --chmod``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", (HERE / recipe.dockerfile).read_bytes(), 0o644)
        for name, path in recipe.files.items():
            for member, source in _walk(name, path):
                mode = 0o755 if source.stat().st_mode & 0o111 else 0o644
                _add_bytes(tar, member, source.read_bytes(), mode)
    buffer.seek(0)
    return buffer


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def current_key(client: docker.DockerClient, tag: str) -> str | None:
    try:
        return (client.images.get(tag).labels or {}).get(LABEL)
    except ImageNotFound:
        return None


def follow_build(stream: Iterable[dict[str, Any]], progress: Progress, what: str) -> str:
    """The Engine's build stream: each ``Step n/m`` is progress, ``error`` ends it with
    the build's last lines, ``aux.ID`` names the image built."""
    image_id, tail = "", []
    for chunk in stream:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            last = " | ".join(tail[-3:])
            raise HarnessError(f"docker build of {what} failed: {detail.strip()} ({last})")
        line = (chunk.get("stream") or "").strip()
        if line.startswith("Step "):
            progress(f"  {what}: {line}")
        elif line:
            tail = [*tail[-5:], line]
        image_id = chunk.get("aux", {}).get("ID", image_id)
    if not image_id:
        raise HarnessError(f"docker build of {what} ended without naming an image")
    return image_id


def build(client: docker.DockerClient, recipe: Recipe, progress: Progress) -> None:
    key = recipe.key()
    if current_key(client, recipe.tag) == key:
        progress(f"{recipe.tag}: cached")
        return
    progress(f"{recipe.tag}: building ({recipe.dockerfile})")
    replaced = _image_id(client, recipe.tag)
    try:
        stream = client.api.build(
            fileobj=context_tar(recipe),
            custom_context=True,
            tag=recipe.tag,
            buildargs=recipe.buildargs,
            labels={LABEL: key},
            rm=True,
            decode=True,
        )
        follow_build(stream, progress, recipe.tag)
    except APIError as exc:
        raise HarnessError(f"docker build of {recipe.tag} failed: {exc.explanation}") from None
    _remove_replaced(client, replaced, recipe.tag)


# ------------------------------------------------------------------ 1. the Debian base


def build_base(client: docker.DockerClient, progress: Progress) -> None:
    """debootstrap --variant=minbase, imported as one layer (kind starts from
    debian:*-slim, which no registry here serves)."""
    key = hashlib.sha256(f"{DEBIAN_SUITE} minbase {DEBIAN_MIRROR}".encode()).hexdigest()[:20]
    if current_key(client, BASE) == key:
        progress(f"{BASE}: cached")
        return
    engine.install_packages(("debootstrap",), progress, "the offline Debian base image")
    with tempfile.TemporaryDirectory(prefix="gpulab-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        progress(f"{BASE}: debootstrap --variant=minbase {DEBIAN_SUITE} (about a minute)")
        argv = ["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR]
        _stream(argv, progress, BASE, keep=lambda line: line.startswith("I: Retrieving"))
        archive = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        progress(f"{BASE}: importing the rootfs")
        client.api.import_image_from_file(
            str(archive),
            repository=BASE.split(":")[0],
            tag=DEBIAN_SUITE,
            changes=[f"LABEL {LABEL}={key}", 'CMD ["/bin/bash"]'],
        )


def _stream(argv: list[str], progress: Progress, what: str, keep: Callable[[str], bool]) -> None:
    """Run a long command, showing the lines ``keep`` picks at most every 5 s."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    last = 0.0
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail[-4:], line]
        if keep(line) and time.monotonic() - last > 5:
            last = time.monotonic()
            progress(f"  {what}: {line}")
    if proc.wait() != 0:
        raise HarnessError(f"`{' '.join(argv[:3])}` failed: {' | '.join(tail[-3:])}")


# ------------------------------------------------- 2. the images kubeadm and kind start


def pause_binary(progress: Progress) -> Path:
    """kubernetes' build/pause/linux/pause.c, compiled statically as its Makefile does."""
    out = cache_dir() / "bin" / f"pause-{PAUSE_SOURCE_VERSION}" / "pause"
    if out.exists():
        return out
    source = binaries.module_dir("k8s.io/kubernetes", binaries.KUBERNETES_VERSION)
    out.parent.mkdir(parents=True, exist_ok=True)
    progress(f"pause {PAUSE_SOURCE_VERSION}: gcc -static build/pause/linux/pause.c")
    cmd = ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_SOURCE_VERSION}-0"]
    cmd += ["-o", f"{out}.tmp", str(source / "build/pause/linux/pause.c")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise HarnessError(f"building pause failed: {proc.stderr.strip()[-300:]}")
    os.rename(f"{out}.tmp", out)
    return out


def cluster_images(progress: Progress) -> list[Recipe]:
    """The images a kind node starts, in the names kubeadm and kind ask for."""
    base = {"BASE": BASE}
    wrapper = HERE / "iptables-wrapper"
    k8s, node = binaries.KUBERNETES, binaries.KUBERNETES_NODE
    version = binaries.KUBERNETES_VERSION
    recipes = [
        Recipe(
            f"registry.k8s.io/{name}:{version}",
            "control-plane.Dockerfile",
            {name: k8s.binary(name)},
            {**base, "BINARY": name},
        )
        for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ]
    etcd = binaries.KUBEADM_ETCD
    recipes += [
        Recipe(
            f"registry.k8s.io/kube-proxy:{version}",
            "kube-proxy.Dockerfile",
            {"kube-proxy": node.binary("kube-proxy"), "iptables-wrapper": wrapper},
            base,
        ),
        Recipe(
            f"registry.k8s.io/etcd:{etcd.version.lstrip('v')}-0",
            "control-plane.Dockerfile",
            {"etcd": etcd.binary("etcd")},
            {**base, "BINARY": "etcd"},
        ),
        Recipe(
            f"registry.k8s.io/coredns/coredns:{binaries.COREDNS.version}",
            "coredns.Dockerfile",
            {"coredns": binaries.COREDNS.binary("coredns")},
        ),
        Recipe(PAUSE, "pause.Dockerfile", {"pause": pause_binary(progress)}),
        Recipe(
            KINDNETD,
            "kindnetd.Dockerfile",
            {"kindnetd.py": HERE / "kindnetd.py", "iptables-wrapper": wrapper},
            base,
        ),
    ]
    return recipes


# ------------------------------------------------------------------- 3. kind's base image


def kind_base() -> Recipe:
    files = binaries.module_dir("sigs.k8s.io/kind", binaries.KIND_VERSION) / "images/base/files"
    cni = binaries.CNI_PLUGINS
    return Recipe(
        KIND_BASE,
        "kind-base.Dockerfile",
        {
            "kind/usr/local/bin": files / "usr/local/bin",
            "kind/kind": files / "kind",
            "kind/etc": files / "etc",
            **{f"bin/{n}": binaries.CONTAINERD.binary(n) for n in binaries.CONTAINERD.commands},
            "bin/runc": binaries.RUNC.binary("runc"),
            "bin/crictl": binaries.CRICTL.binary("crictl"),
            **{f"cni/{n}": cni.binary(n) for n in cni.commands},
        },
        {"BASE": BASE},
    )


# ------------------------------------------------------------------- 4. the node image


def node_key(client: docker.DockerClient, preload: list[str]) -> str:
    digest = hashlib.sha256()
    for tag in [KIND_BASE, *preload]:
        digest.update(f"{tag}={client.images.get(tag).id}".encode())
    for path in _node_binaries().values():
        st = path.stat()
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    for manifest in ("default-cni.yaml", "default-storage.yaml"):
        digest.update((HERE / manifest).read_bytes())
    return digest.hexdigest()[:20]


def _node_binaries() -> dict[str, Path]:
    node = binaries.KUBERNETES_NODE
    return {
        "kubeadm": node.binary("kubeadm"),
        "kubelet": node.binary("kubelet"),
        "kubectl": binaries.KUBERNETES.binary("kubectl"),
    }


def build_node(client: docker.DockerClient, preload: list[str], progress: Progress) -> None:
    """kind's buildImage: a build container from the base image, the Kubernetes binaries
    copied in, /kind/version, the manifests, every image imported into its containerd,
    committed with kind's entrypoint."""
    key = node_key(client, preload)
    if current_key(client, NODE) == key:
        progress(f"{NODE}: cached")
        return
    progress(f"{NODE}: assembling (kind build node-image's steps)")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, path in _node_binaries().items():
            _add_bytes(tar, f"usr/bin/{name}", path.read_bytes(), 0o755)
        _add_bytes(tar, "kind/version", binaries.KUBERNETES_VERSION.encode(), 0o644)
        cni = (HERE / "default-cni.yaml").read_text().replace("KINDNETD_IMAGE", KINDNETD)
        _add_bytes(tar, "kind/manifests/default-cni.yaml", cni.encode(), 0o644)
        storage = (HERE / "default-storage.yaml").read_bytes()
        _add_bytes(tar, "kind/manifests/default-storage.yaml", storage, 0o644)
    _commit_with_images(client, KIND_BASE, NODE, key, preload, progress, archive.getvalue())


def build_lab_node(client: docker.DockerClient, progress: Progress) -> None:
    """The node image with the lab's own images already in its containerd (a lab
    convenience kind lacks: `kind load docker-image` streamed 556 MB into each worker at
    every cluster start, 657 s for five workers on 2 cores). Rebuilt when gpulab:dev
    changes; the images are imported unpacked on first use, as kind's own preloads are."""
    preload = [LAB, *STAND_INS]
    digest = hashlib.sha256()
    for tag in [NODE, *preload]:
        digest.update(f"{tag}={client.images.get(tag).id}".encode())
    key = digest.hexdigest()[:20]
    if current_key(client, LAB_NODE) == key:
        progress(f"{LAB_NODE}: cached")
        return
    progress(f"{LAB_NODE}: {NODE} with {', '.join(preload)} in its containerd")
    _commit_with_images(client, NODE, LAB_NODE, key, preload, progress)


def _commit_with_images(
    client: docker.DockerClient,
    base: str,
    tag: str,
    key: str,
    preload: list[str],
    progress: Progress,
    files: bytes | None = None,
) -> None:
    """A build container from ``base`` (``files``, a tar, unpacked at /), ``preload``
    imported into its containerd (``ctr images import --no-unpack``, as kind's
    containerdImporter: the container's overlay cannot hold overlay snapshots), committed
    as ``tag`` with kind's entrypoint; the image it replaces is removed."""
    replaced = _image_id(client, tag)
    container = client.containers.run(
        base,
        entrypoint=["sleep"],
        command=["infinity"],
        detach=True,
        name=f"kind-build-{int(time.time())}-{os.getpid()}",
        security_opt=["seccomp=unconfined"],
    )
    try:
        if files:
            container.put_archive("/", files)
        _exec(container, ["bash", "-c", "nohup containerd > /dev/null 2>&1 &"])
        _exec(
            container,
            [
                "bash",
                "-c",
                "for i in $(seq 50); do [ -S /run/containerd/containerd.sock ] && break; "
                "sleep 0.2; done; ctr info >/dev/null",
            ],
        )
        progress(f"{tag}: importing {len(preload)} images into the node's containerd")
        save = subprocess.Popen(["docker", "save", *preload], stdout=subprocess.PIPE)
        load = subprocess.run(
            [
                "docker",
                "exec",
                "-i",
                container.id,
                "ctr",
                "--namespace=k8s.io",
                "images",
                "import",
                "--label=io.cri-containerd.pinned=pinned",
                "--all-platforms",
                "--no-unpack",
                "--digests",
                "-",
            ],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        if save.wait() != 0 or load.returncode != 0:
            raise HarnessError(f"importing images into {tag} failed: {load.stderr}")
        listed = _exec(container, ["ctr", "--namespace=k8s.io", "images", "list", "-q"])
        absent = [image for image in preload if _qualified(image) not in listed.split()]
        if absent:
            raise HarnessError(f"{tag}'s containerd lacks {', '.join(absent)}")
        _exec(container, ["pkill", "containerd"])
        repository, version = tag.rsplit(":", 1)
        container.commit(
            repository=repository,
            tag=version,
            changes=[
                'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]',
                'ENV HTTP_PROXY="" HTTPS_PROXY="" NO_PROXY=""',
                f"LABEL {LABEL}={key}",
            ],
        )
        progress(f"{tag}: built")
    finally:
        container.remove(force=True, v=True)
    _remove_replaced(client, replaced, tag)


def _image_id(client: docker.DockerClient, tag: str) -> str | None:
    try:
        return str(client.images.get(tag).id)
    except ImageNotFound:
        return None


def _remove_replaced(client: docker.DockerClient, image_id: str | None, tag: str) -> None:
    """Each rebuild leaves the image ``tag`` named before untagged (a node image is GBs):
    remove it, unless the rebuild gave the same image or a container (a running
    cluster's node) still uses it (then a later rebuild tries again)."""
    if image_id is None or image_id == _image_id(client, tag):
        return
    with contextlib.suppress(APIError):
        client.images.remove(image_id)


def _qualified(tag: str) -> str:
    """containerd's full name for a Docker tag (``gpulab/x:1`` -> ``docker.io/gpulab/x:1``)."""
    first = tag.split("/", 1)[0]
    if "/" not in tag:
        return f"docker.io/library/{tag}"
    if "." in first or ":" in first or first == "localhost":
        return tag
    return f"docker.io/{tag}"


def _exec(container: Any, argv: list[str]) -> str:
    code, output = container.exec_run(argv)
    text = output.decode(errors="replace") if output else ""
    if code != 0:
        raise HarnessError(f"`{' '.join(argv)}` in the build container failed: {text.strip()}")
    return text


# ------------------------------------------------------------- 5. the lab's component image


HOST_CA = "harness/images/host-ca.pem"  # empty in the repository; see lab_context


def host_ca_bundle() -> Path | None:
    """The CA bundle this host's own TLS clients trust (where a proxy re-signs TLS, as
    here, pip in a container needs it too): $SSL_CERT_FILE, else OpenSSL's default."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def lab_context() -> IO[bytes]:
    """The repository as `docker build .` sends it (.dockerignore applied), with this
    host's CA bundle in place of the empty ``harness/images/host-ca.pem``: the Dockerfile
    gives it to pip, so the image builds behind a TLS-inspecting proxy; built by hand, the
    file stays empty and pip keeps its own bundle."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    exclude = [x.strip() for x in ignore if x.strip() and not x.startswith("#")] + [HOST_CA]
    context = docker_utils.tar(str(ROOT), exclude=exclude)
    bundle = host_ca_bundle()
    with tarfile.open(fileobj=context, mode="a") as tar:
        _add_bytes(tar, HOST_CA, bundle.read_bytes() if bundle else b"", 0o644)
    context.seek(0)
    return context


def build_lab(client: docker.DockerClient, progress: Progress, base: str) -> None:
    """The repository's Dockerfile (docker's layer cache makes an unchanged rebuild fast)."""
    progress(f"{LAB}: building from {ROOT / 'Dockerfile'} on {base}")
    replaced = _image_id(client, LAB)
    try:
        stream = client.api.build(
            fileobj=lab_context(),
            custom_context=True,
            tag=LAB,
            rm=True,
            decode=True,
            buildargs={"BASE_IMAGE": base},
        )
        follow_build(stream, progress, LAB)
    except APIError as exc:
        raise HarnessError(f"docker build of {LAB} failed: {exc.explanation}") from None
    _remove_replaced(client, replaced, LAB)


# ------------------------------------------------------------------------- the whole


def registry_answers(host: str = REGISTRY, timeout: float = 3) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _pull(client: docker.DockerClient, image: str, progress: Progress) -> bool:
    try:
        client.images.get(image)
        return True
    except ImageNotFound:
        pass
    progress(f"pulling {image}")
    try:
        client.images.pull(image)
    except APIError as exc:
        progress(f"pulling {image} failed ({exc.explanation}); building here instead")
        return False
    return True


@dataclass(frozen=True)
class KindImages:
    node: str  # the node image kind's config names
    load: list[str]  # images `kind load docker-image` puts into the nodes after create


def ensure_images(
    progress: Progress, offline: bool | None = None, user: str = "build"
) -> KindImages:
    """Every image a kind cluster of the lab needs, in the engine, and kind's binary.

    ``offline`` None: pull the pinned official images where a registry answers, else build;
    True: build everything here (``gpulab build --images --offline``). ``user`` holds a
    lease on the engine (harness/engine.py); one image build runs at a time (a lock).
    """
    from harness.docker import engine as docker_engine

    engine.ensure_engine(progress, user)
    client = docker_engine(timeout=BUILD_TIMEOUT)
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / "images.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _ensure_images(client, progress, offline)
        except (DockerException, RequestException) as exc:
            raise HarnessError(f"building the kind images failed: {exc}") from None


def _ensure_images(
    client: docker.DockerClient, progress: Progress, offline: bool | None
) -> KindImages:
    from harness.docker import KIND_NODE_IMAGE

    binaries.build_from_source((binaries.KIND,), progress)
    if offline is None:
        offline = not registry_answers()
        if offline:
            progress(f"no container registry answers ({REGISTRY}): building every image here")
    if (
        not offline
        and _pull(client, KIND_NODE_IMAGE, progress)
        and _pull(client, PYTHON_IMAGE, progress)
    ):
        build_lab(client, progress, PYTHON_IMAGE)
        return KindImages(KIND_NODE_IMAGE, [LAB])
    binaries.build_all(progress)
    # runc links libseccomp (kind's base image builds it the same way)
    engine.install_packages(("libseccomp-dev", "pkg-config"), progress, "runc's seccomp support")
    binaries.build_from_source(binaries.KIND_NODE_COMPONENTS, progress)
    build_base(client, progress)
    recipes = cluster_images(progress)
    for recipe in recipes:
        build(client, recipe, progress)
    build(client, kind_base(), progress)
    build_node(client, [r.tag for r in recipes], progress)
    build_lab(client, progress, BASE)
    lab_id = str(client.images.get(LAB).id)  # a new gpulab:dev rebuilds the stand-ins
    for stand_in in STAND_INS:
        args = {"LAB": LAB, "LAB_ID": lab_id}
        build(client, Recipe(stand_in, "stand-in.Dockerfile", buildargs=args), progress)
    build_lab_node(client, progress)
    return KindImages(LAB_NODE, [])
