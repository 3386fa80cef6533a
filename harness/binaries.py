"""Build the upstream binaries the local backend runs, from Go modules, once per version.

Where the internet is open, ``gpulab build`` first tries the official release binaries
listed in ``harness/release-binaries.yaml``, installing one only when its SHA-256 matches
the checksum pinned there (a file without a pinned official checksum is never fetched);
a failed or disabled download (``--from-source``) falls back to the Go build.

No download site is reachable where this lab is developed, only package registries, so
there every binary is compiled from its Go module:

- Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl):
  k8s.io/kubernetes cannot be ``go install``-ed because its go.mod replaces each staging
  module with a local path. A wrapper module requires ``k8s.io/kubernetes vX.Y.Z`` and
  replaces every staging module with its published ``v0.Y.Z``; the list comes from
  kubernetes' own go.mod, so it is always the right one for the pinned version.
- etcd: ``go.etcd.io/etcd/server/v3`` likewise replaces its sibling modules by path.
- kwok: no replace directives, but built the same way for one code path.
- scheduler-plugins (a test peer, built on first use by the scheduling chapter's e2e
  test, not by ``make binaries``): its go.mod pins every k8s.io module with
  ``mod => mod vX`` replaces, which the wrapper copies as they are.

Binaries land in ``<cache>/bin/<component>-<version>/`` with a ``manifest.json`` of
sha256 sums, so a corrupt or truncated binary is detected before it is started.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpulab.state import cache_dir
from harness.errors import HarnessError

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
SCHEDULER_PLUGINS_VERSION = "v0.35.4-devel"


@dataclass(frozen=True)
class Component:
    """One Go module whose commands we build together."""

    name: str
    module: str
    version: str
    commands: dict[str, str]  # binary name -> package path
    tags: str = ""
    ldflags: tuple[str, ...] = ()
    cgo: bool = False  # upstream builds containerd and runc with cgo (libseccomp, nsenter)

    @property
    def bin_dir(self) -> Path:
        return cache_dir() / "bin" / f"{self.name}-{self.version}"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def _kubernetes_ldflags(version: str) -> tuple[str, ...]:
    # What hack/lib/version.sh sets; without it /version reports v0.0.0.
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": stamp,
    }
    return tuple(
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in values.items()
    )


KUBERNETES = Component(
    name="kubernetes",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    commands={
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    },
    tags="selinux,notest",
    ldflags=_kubernetes_ldflags(KUBERNETES_VERSION),
)
ETCD = Component(
    name="etcd",
    module="go.etcd.io/etcd/server/v3",
    version=ETCD_VERSION,
    commands={"etcd": "go.etcd.io/etcd/server/v3"},
)
KWOK = Component(
    name="kwok",
    module="sigs.k8s.io/kwok",
    version=KWOK_VERSION,
    commands={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
    ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.lstrip('v')}",),
)
COMPONENTS = (ETCD, KUBERNETES, KWOK)
SCHEDULER_PLUGINS = Component(
    name="scheduler-plugins",
    module="sigs.k8s.io/scheduler-plugins",
    version=SCHEDULER_PLUGINS_VERSION,
    commands={"scheduler-plugins-kube-scheduler": "sigs.k8s.io/scheduler-plugins/cmd/scheduler"},
)
# The kind backend's node image, assembled here as kind v0.33.0's images/base/Dockerfile and
# `kind build node-image` would (they clone or pull these; only the Go module proxy answers
# here, harness/nodeimage). Versions are kind v0.33.0's, except where the proxy lacks one.
KIND_VERSION = "v0.33.0"
KIND = Component(
    name="kind",
    module="sigs.k8s.io/kind",
    version=KIND_VERSION,
    commands={"kind": "sigs.k8s.io/kind"},
)
KUBERNETES_NODE = Component(
    name="kubernetes-node",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    commands={
        "kubelet": "k8s.io/kubernetes/cmd/kubelet",
        "kubeadm": "k8s.io/kubernetes/cmd/kubeadm",
        "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    },
    tags="selinux,notest",
    ldflags=_kubernetes_ldflags(KUBERNETES_VERSION),
)
_CONTAINERD = "github.com/containerd/containerd/v2"
CONTAINERD = Component(
    name="containerd",
    module="github.com/containerd/containerd/v2",
    version="v2.3.4",
    commands={
        n: f"{_CONTAINERD}/cmd/{n}" for n in ("containerd", "ctr", "containerd-shim-runc-v2")
    },
    tags="no_aufs,no_zfs,no_btrfs,no_devmapper",  # kind's BUILDTAGS
    ldflags=(
        f"-X {_CONTAINERD}/version.Version=v2.3.4",
        f"-X {_CONTAINERD}/version.Package={_CONTAINERD}",
    ),
    cgo=True,
)
RUNC = Component(
    name="runc",
    module="github.com/opencontainers/runc",
    version="v1.4.3",
    commands={"runc": "github.com/opencontainers/runc"},
    tags="seccomp,urfave_cli_no_docs",  # runc's Makefile BUILDTAGS (needs libseccomp-dev)
    ldflags=("-X main.version=1.4.3",),
    cgo=True,
)
CRICTL = Component(
    name="cri-tools",
    # kind v0.33.0 ships crictl v1.36.0, which the module proxy does not serve
    module="sigs.k8s.io/cri-tools",
    version="v1.37.0",
    commands={"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
    ldflags=("-X sigs.k8s.io/cri-tools/pkg/version.Version=v1.37.0",),
)
CNI_PLUGINS = Component(
    name="cni-plugins",
    module="github.com/containernetworking/plugins",
    version="v1.9.1",
    commands={  # the four kind's base image installs
        name: f"github.com/containernetworking/plugins/plugins/{path}"
        for name, path in (
            ("host-local", "ipam/host-local"),
            ("loopback", "main/loopback"),
            ("ptp", "main/ptp"),
            ("portmap", "meta/portmap"),
        )
    },
    ldflags=(
        "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v1.9.1",
    ),
)
# kubeadm v1.36.3 deploys registry.k8s.io/etcd:3.6.8-0 and coredns v1.14.2; the proxy serves
# no CoreDNS v1.14.2, so the node image carries v1.14.3 and kind's kubeadm config names it.
KUBEADM_ETCD = Component(
    name="etcd",
    module="go.etcd.io/etcd/server/v3",
    version="v3.6.8",
    commands={"etcd": "go.etcd.io/etcd/server/v3"},
)
COREDNS = Component(
    name="coredns",
    module="github.com/coredns/coredns",
    version="v1.14.3",
    commands={"coredns": "github.com/coredns/coredns"},
)
KIND_NODE_COMPONENTS = (
    KIND,
    KUBERNETES_NODE,
    CONTAINERD,
    RUNC,
    CRICTL,
    CNI_PLUGINS,
    KUBEADM_ETCD,
    COREDNS,
)

# Upstream binaries only the e2e tests run (beside the lab's own components, to cross-check
# them); `gpulab build --test-peers` builds them before the tests, so a first run's build
# (minutes, with progress) is not charged to one test's timeout.
TEST_PEERS = (SCHEDULER_PLUGINS,)

Progress = Callable[[str], None]


def binary(name: str) -> Path:
    """Path of a built binary by name (``kube-apiserver``, ``etcd``, ``kwok`` ...)."""
    for comp in COMPONENTS:
        if name in comp.commands:
            return comp.binary(name)
    raise KeyError(name)


def verify(comp: Component) -> list[str]:
    """Problems with a component's cached binaries; empty when all are present and intact.

    Hashing the binaries takes most of a second; a file whose size and modification time
    are those recorded at its last full check is not hashed again.
    """
    manifest_path = comp.bin_dir / "manifest.json"
    if not manifest_path.exists():
        return [f"{comp.name} {comp.version} is not built yet (no {manifest_path})"]
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return [f"{manifest_path} is unreadable"]
    checked_path = comp.bin_dir / "checked.json"
    try:
        checked = json.loads(checked_path.read_text())
    except (OSError, ValueError):
        checked = {}
    problems = []
    for name in comp.commands:
        path = comp.binary(name)
        if not path.exists():
            problems.append(f"{path} is missing")
            continue
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, manifest.get(name)]
        if checked.get(name) == stamp:
            continue
        if manifest.get(name) != _sha256(path):
            problems.append(f"cached binary {path} is corrupt (checksum mismatch)")
        else:
            checked[name] = stamp
    if not problems:
        with contextlib.suppress(OSError):
            checked_path.write_text(json.dumps(checked))
    return problems


def require_built() -> None:
    """Fail with one line if any binary the local backend needs is missing or corrupt."""
    for comp in COMPONENTS:
        problems = verify(comp)
        if problems:
            raise HarnessError(
                f"{problems[0]}; run `make binaries` (or `gpulab build`) to rebuild it"
            )


def build_all(
    progress: Progress, force: bool = False, from_source: bool = False, say_cached: bool = True
) -> None:
    """Every component cached and intact: downloaded (unless ``from_source``) where a
    pinned official release answers, else built from its Go module. The cached ones are
    named in one line, unless not ``say_cached`` (a caller that checks again what `make`
    just checked); a download or build always reports its progress."""
    go: str | None = None
    cached = []
    for comp in COMPONENTS:
        problems = verify(comp)
        if not problems and not force:
            cached.append(f"{comp.name} {comp.version}")
            continue
        if problems and "not built yet" not in problems[0]:
            progress(f"{comp.name} {comp.version}: {problems[0]}; rebuilding")
        if not from_source:
            try:
                download(comp, release_for(comp), progress)
                continue
            except DownloadError as exc:
                progress(f"{comp.name} {comp.version}: {exc}; building from source instead")
        try:
            go = go or find_go()
        except HarnessError as exc:  # what is missing first, then why it cannot be built
            raise HarnessError(f"{problems[0] if problems else comp.name}; {exc}") from None
        build(comp, go, progress)
    if cached and say_cached:
        progress(f"binaries cached in {cache_dir() / 'bin'}: {', '.join(cached)}")


# ---------------------------------------------------------------- official release binaries

RELEASES = Path(__file__).resolve().parent / "release-binaries.yaml"
DOWNLOAD_TIMEOUT = 30.0


class DownloadError(HarnessError):
    """A release binary could not be had (or was refused); the Go build runs instead."""


@dataclass(frozen=True)
class Release:
    """One official release file of a component and what to take out of it."""

    url: str
    sha256: str | None  # the published checksum of that file; None: never downloaded
    members: dict[str, str] = field(default_factory=dict)  # binary -> path in the tar.gz


def machine_arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine(), platform.machine()
    )


def release_for(comp: Component, arch: str | None = None) -> Release:
    """The pinned release file of ``comp`` for this machine (harness/release-binaries.yaml)."""
    arch = arch or machine_arch()
    entry = yaml.safe_load(RELEASES.read_text())[comp.name]

    def fill(text: str) -> str:
        return text.format(version=comp.version, arch=arch)

    members = {name: fill(path) for name, path in (entry.get("members") or {}).items()}
    return Release(fill(entry["url"]), (entry.get("sha256") or {}).get(arch), members)


def download(comp: Component, release: Release, progress: Progress) -> None:
    """Fetch ``release``, check its SHA-256 against the pinned one and install the
    component's binaries from it; a file that does not match is deleted, never installed."""
    if not release.sha256:
        raise DownloadError(f"no official checksum is pinned for {release.url}")
    parts = cache_dir() / "download"
    parts.mkdir(parents=True, exist_ok=True)
    part = parts / (release.url.rsplit("/", 1)[-1] + ".part")
    try:
        digest = _fetch(release.url, part, comp, progress)
        if digest != release.sha256:
            raise DownloadError(
                f"{release.url} does not match its pinned checksum (sha256 {digest}, "
                f"pinned {release.sha256}); not installed"
            )
        out_dir = comp.bin_dir.with_name(comp.bin_dir.name + ".tmp")
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        _install(part, release, comp, out_dir)
    finally:
        part.unlink(missing_ok=True)
    manifest = {name: _sha256(out_dir / name) for name in comp.commands}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(comp.bin_dir, ignore_errors=True)
    out_dir.rename(comp.bin_dir)
    progress(f"{comp.name} {comp.version}: installed the official release in {comp.bin_dir}")


def _fetch(url: str, dest: Path, comp: Component, progress: Progress) -> str:
    """Stream ``url`` into ``dest`` with progress; the file's SHA-256."""
    digest = hashlib.sha256()
    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=DOWNLOAD_TIMEOUT) as resp:
            if resp.status_code != 200:
                raise DownloadError(f"{url} answered {resp.status_code} {resp.reason_phrase}")
            total = int(resp.headers.get("Content-Length") or 0)
            got, last = 0, time.monotonic()
            progress(f"{comp.name} {comp.version}: downloading {url}")
            with dest.open("wb") as out:
                for chunk in resp.iter_bytes(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    got += len(chunk)
                    if time.monotonic() - last > 2:
                        last = time.monotonic()
                        share = f" ({100 * got // total}%)" if total else ""
                        progress(f"{comp.name}: {got >> 20} MiB{share}")
    except httpx.HTTPError as exc:
        raise DownloadError(f"{url} could not be downloaded: {exc}") from None
    return digest.hexdigest()


def _install(archive: Path, release: Release, comp: Component, out_dir: Path) -> None:
    if not release.members:  # the file is the (one) binary
        (name,) = comp.commands
        shutil.copyfile(archive, out_dir / name)
        (out_dir / name).chmod(0o755)
        return
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for name, member in release.members.items():
                src = tar.extractfile(member)
                if src is None:
                    raise KeyError(member)
                with (out_dir / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                (out_dir / name).chmod(0o755)
    except (tarfile.TarError, KeyError, EOFError, OSError) as exc:
        raise DownloadError(f"{release.url}: not the release archive expected ({exc})") from None


def build_from_source(
    comps: tuple[Component, ...], progress: Progress, force: bool = False
) -> None:
    """Each of ``comps`` cached and intact, built from its Go module (no release binary
    of theirs is pinned): the test peers, the kind node image's binaries."""
    for comp in comps:
        if not verify(comp) and not force:
            progress(f"{comp.name} {comp.version}: cached in {comp.bin_dir}")
            continue
        build(comp, find_go(), progress)


def build_test_peers(progress: Progress, force: bool = False) -> None:
    build_from_source(TEST_PEERS, progress, force)


def peer_binary(comp: Component, name: str, progress: Progress) -> Path:
    """A test peer's binary, built (once, then cached) the first time it is asked for
    (`gpulab build --test-peers` builds it ahead)."""
    if verify(comp):
        build(comp, find_go(), progress)
    return comp.binary(name)


def find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise HarnessError(
            "the Go toolchain (`go`) is not on PATH; it is needed once to build Kubernetes, "
            "etcd and kwok: install Go 1.26+ (https://go.dev/doc/install) and re-run make"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    match = re.match(r"go1\.(\d+)", out.stdout.strip())
    if match is None or int(match.group(1)) < 21:
        # Go >= 1.21 fetches the toolchain the modules ask for (go 1.26) by itself.
        raise HarnessError(
            f"`go` is {out.stdout.strip() or 'unknown'}; Go 1.21+ is needed to build the "
            "pinned Kubernetes: install Go 1.26+ (https://go.dev/doc/install)"
        )
    return go


def build(comp: Component, go: str, progress: Progress) -> None:
    """Build ``comp`` unless another `gpulab build` finished it while this one waited for
    the component's lock (two terminals, or make and a test, building at once)."""
    work = cache_dir() / "build" / f"{comp.name}-{comp.version}"
    work.mkdir(parents=True, exist_ok=True)
    with (work / ".lock").open("w") as lock:
        if not _try_lock(lock):
            progress(f"{comp.name} {comp.version}: another build holds it; waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not verify(comp):
                progress(f"{comp.name} {comp.version}: built meanwhile in {comp.bin_dir}")
                return
        _build_locked(comp, go, work, progress)


def _try_lock(lock: Any) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _build_locked(comp: Component, go: str, work: Path, progress: Progress) -> None:
    env = {**os.environ, "CGO_ENABLED": "1" if comp.cgo else "0", "GOFLAGS": "-mod=mod"}
    progress(f"{comp.name} {comp.version}: resolving modules")
    _write_wrapper(comp, go, work, env)
    _run(
        [go, "get", *(f"{pkg}@{comp.version}" for pkg in comp.commands.values())],
        work,
        env,
        f"{comp.name}: go get",
    )
    packages = list(comp.commands.values())
    deps = _run(
        [go, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *packages],
        work,
        env,
        f"{comp.name}: go list",
    )
    total = max(1, len([line for line in deps.splitlines() if line.strip()]))
    out_dir = comp.bin_dir.with_name(comp.bin_dir.name + ".tmp")
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    cmd = [go, "build", "-v", "-trimpath", "-o", f"{out_dir}/"]
    if comp.tags:
        cmd += ["-tags", comp.tags]
    if comp.ldflags:
        cmd += ["-ldflags", " ".join(comp.ldflags)]
    _build_with_progress([*cmd, *packages], work, env, comp, total, progress)
    manifest = {}
    for name, pkg in comp.commands.items():
        built = out_dir / _default_binary_name(pkg)
        if built.name != name:
            built.rename(out_dir / name)
        manifest[name] = _sha256(out_dir / name)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(comp.bin_dir, ignore_errors=True)
    out_dir.rename(comp.bin_dir)
    progress(f"{comp.name} {comp.version}: built {', '.join(comp.commands)} in {comp.bin_dir}")


def _default_binary_name(pkg: str) -> str:
    """The file name `go build -o dir/` gives a main package (a /vN suffix is skipped)."""
    parts = pkg.split("/")
    return parts[-2] if re.fullmatch(r"v\d+", parts[-1]) else parts[-1]


def module_dir(module: str, version: str) -> Path:
    """A module's source tree in the Go module cache (downloaded if needed): the files
    kind's and Kubernetes' own image builds copy (kind's images/base/files, pause.c)."""
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    info = _run(
        [find_go(), "mod", "download", "-json", f"{module}@{version}"],
        cache_dir(),
        env,
        f"go mod download {module}@{version}",
    )
    return Path(json.loads(info)["Dir"])


def _write_wrapper(comp: Component, go: str, work: Path, env: dict[str, str]) -> None:
    """A module that requires comp.module and mirrors its path replaces with versions."""
    info = _run(
        [go, "mod", "download", "-json", f"{comp.module}@{comp.version}"],
        work.parent,
        env,
        f"{comp.name}: go mod download",
    )
    gomod = Path(json.loads(info)["GoMod"]).read_text()
    go_line = re.search(r"^go (\S+)", gomod, re.M)
    lines = [
        f"module gpulab.local/build/{comp.name}",
        "",
        f"go {go_line.group(1) if go_line else '1.22'}",
        "",
        f"require {comp.module} {comp.version}",
        "",
    ]
    replaces = [(mod, mod, ver) for mod, ver in _path_replaces(gomod, comp)]
    replaces += _version_replaces(gomod)
    if replaces:
        lines.append("replace (")
        lines += [f"\t{mod} => {target} {ver}" for mod, target, ver in replaces]
        lines.append(")")
    (work / "go.mod").write_text("\n".join(lines) + "\n")


def _path_replaces(gomod: str, comp: Component) -> list[tuple[str, str]]:
    """Turn ``mod => ./staging/...`` or ``mod => ../api`` into ``mod => mod <version>``."""
    staged_version = comp.version
    if comp.module == "k8s.io/kubernetes":
        # staging modules are published as v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>
        staged_version = "v0." + comp.version.split(".", 1)[1]
    out = []
    for mod, target in re.findall(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+(\.\S*)\s*$", gomod, re.M):
        if "FORBIDDEN" in target:
            continue
        out.append((mod, staged_version))
    return out


def _version_replaces(gomod: str) -> list[tuple[str, str, str]]:
    """``mod => other vX.Y.Z`` replaces, kept as they are."""
    pattern = r"^\s*(?:replace\s+)?(\S+)\s+=>\s+([^.\s]\S*)\s+(v\S+)\s*$"
    return [(m, t, v) for m, t, v in re.findall(pattern, gomod, re.M)]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise HarnessError(f"{what} failed: {' | '.join(tail)}")
    return proc.stdout


def _build_with_progress(
    cmd: list[str], cwd: Path, env: dict[str, str], comp: Component, total: int, progress: Progress
) -> None:
    """Run ``go build -v`` and report how many packages have been compiled so far.

    ``-v`` prints each package as it is built (cached ones are not printed), so the count
    is a lower bound that reaches ``total`` only on a cold cache; that is still the
    honest number to show while a first build takes minutes.
    """
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    compiled = 0
    tail: list[str] = []
    started = time.monotonic()
    last_report = started
    stop = threading.Event()

    def heartbeat() -> None:  # keep CI logs alive while the linker runs silently
        beat = started
        while not stop.wait(5):
            now = time.monotonic()
            if now - max(last_report, beat) > 15:
                beat = now
                progress(f"{comp.name}: still building ({now - started:.0f}s)")

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if re.match(r"^[\w.\-/]+$", line):
                compiled += 1
            else:
                tail = [*tail[-8:], line]
            now = time.monotonic()
            if now - last_report > (1 if sys.stderr.isatty() else 10):
                last_report = now
                pct = min(100, 100 * compiled // total)
                progress(
                    f"{comp.name} {comp.version}: compiled {compiled}/{total} packages "
                    f"({pct}%), {now - started:.0f}s"
                )
        code = proc.wait()
    finally:
        stop.set()
    if code != 0:
        raise HarnessError(f"{comp.name}: go build failed: {' | '.join(tail[-4:])}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
