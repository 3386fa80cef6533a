"""`gpulab build`'s download path against a local HTTP server: a release archive with the
right checksum is installed; a wrong checksum, a truncated transfer or a 404 install
nothing and the Go build runs instead; without a pinned checksum nothing is fetched."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness import binaries
from harness.binaries import Component, DownloadError, Release, download, release_for, verify

BINARY = b"#!/bin/sh\necho etcd Version: 3.6.16\n"
COMP = Component(
    name="etcd", module="go.etcd.io/etcd/server/v3", version="v3.6.16", commands={"etcd": "x"}
)


def _tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("etcd-v3.6.16-linux-amd64/etcd")
        info.size = len(BINARY)
        tar.addfile(info, io.BytesIO(BINARY))
    return buf.getvalue()


TARBALL = _tarball()
SHA = hashlib.sha256(TARBALL).hexdigest()


class Releases(ThreadingHTTPServer):
    daemon_threads = True
    requests: list[str]


class Handler(BaseHTTPRequestHandler):
    server: Releases

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        if self.path == "/etcd.tar.gz":
            body = TARBALL
        elif self.path == "/etcd-binary":
            body = BINARY
        elif self.path == "/cut.tar.gz":  # says the full length, sends half, hangs up
            self.send_response(200)
            self.send_header("Content-Length", str(len(TARBALL)))
            self.end_headers()
            self.wfile.write(TARBALL[: len(TARBALL) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Releases]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    srv = Releases(("127.0.0.1", 0), Handler)
    srv.requests = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def url(server: Releases, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def release(server: Releases, path: str, sha: str | None = SHA) -> Release:
    return Release(url(server, path), sha, {"etcd": "etcd-v3.6.16-linux-amd64/etcd"})


def _nothing_installed() -> None:
    assert not COMP.bin_dir.exists()
    assert not COMP.bin_dir.with_name(COMP.bin_dir.name + ".tmp").exists()
    assert not any((binaries.cache_dir() / "download").glob("*"))  # no partial file kept


def test_the_right_checksum_installs_the_binary_from_the_archive(server: Releases) -> None:
    said: list[str] = []
    download(COMP, release(server, "/etcd.tar.gz"), said.append)
    installed = COMP.binary("etcd")
    assert installed.read_bytes() == BINARY
    assert installed.stat().st_mode & 0o111
    assert verify(COMP) == []  # the manifest the local backend checks before starting it
    assert said[-1].startswith("etcd v3.6.16: installed the official release in ")


def test_a_plain_binary_release_is_installed_as_it_is(server: Releases) -> None:
    plain = Release(url(server, "/etcd-binary"), hashlib.sha256(BINARY).hexdigest())
    download(COMP, plain, lambda _m: None)
    assert COMP.binary("etcd").read_bytes() == BINARY


def test_a_wrong_checksum_is_never_installed(server: Releases) -> None:
    with pytest.raises(DownloadError, match=r"does not match its pinned checksum .*not installed"):
        download(COMP, release(server, "/etcd.tar.gz", sha="0" * 64), lambda _m: None)
    assert server.requests == ["/etcd.tar.gz"]
    _nothing_installed()


def test_a_truncated_transfer_is_not_installed(server: Releases) -> None:
    with pytest.raises(DownloadError, match=r"could not be downloaded"):
        download(COMP, release(server, "/cut.tar.gz"), lambda _m: None)
    _nothing_installed()


def test_a_404_is_a_download_error(server: Releases) -> None:
    with pytest.raises(DownloadError, match=r"/gone.tar.gz answered 404"):
        download(COMP, release(server, "/gone.tar.gz"), lambda _m: None)
    _nothing_installed()


def test_without_a_pinned_checksum_nothing_is_fetched(server: Releases) -> None:
    with pytest.raises(DownloadError, match=r"no official checksum is pinned"):
        download(COMP, release(server, "/etcd.tar.gz", sha=None), lambda _m: None)
    assert server.requests == []


@pytest.fixture
def one_component(server: Releases, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """build_all over COMP alone; the Go build recorded instead of run."""
    built: list[str] = []
    monkeypatch.setattr(binaries, "COMPONENTS", (COMP,))
    monkeypatch.setattr(binaries, "find_go", lambda: built.append("find_go") or "go")
    monkeypatch.setattr(binaries, "build", lambda comp, go, progress: built.append(comp.name))
    return built


def test_build_falls_back_to_the_go_build_when_the_download_fails(
    server: Releases, one_component: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binaries, "release_for", lambda comp: release(server, "/gone.tar.gz"))
    said: list[str] = []
    binaries.build_all(said.append)
    assert one_component == ["find_go", "etcd"]
    assert any("answered 404" in m and "building from source instead" in m for m in said)


def test_a_good_download_needs_no_go(
    server: Releases, one_component: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binaries, "release_for", lambda comp: release(server, "/etcd.tar.gz"))
    binaries.build_all(lambda _m: None)
    assert one_component == []  # Go was not even looked for
    assert verify(COMP) == []


def test_from_source_never_downloads(
    server: Releases, one_component: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binaries, "release_for", lambda comp: release(server, "/etcd.tar.gz"))
    binaries.build_all(lambda _m: None, from_source=True)
    assert server.requests == []
    assert one_component == ["find_go", "etcd"]


def test_the_pinned_releases_are_the_official_files_of_the_pinned_versions() -> None:
    k8s = release_for(binaries.KUBERNETES, "amd64")
    assert k8s.url == "https://dl.k8s.io/v1.36.3/kubernetes-server-linux-amd64.tar.gz"
    assert set(k8s.members) == set(binaries.KUBERNETES.commands)
    etcd = release_for(binaries.ETCD, "amd64")
    assert etcd.url.endswith("/v3.6.16/etcd-v3.6.16-linux-amd64.tar.gz")
    assert etcd.members == {"etcd": "etcd-v3.6.16-linux-amd64/etcd"}
    kwok = release_for(binaries.KWOK, "arm64")
    assert kwok.url == (
        "https://github.com/kubernetes-sigs/kwok/releases/download/v0.8.0/kwok-linux-arm64"
    )
    for comp in binaries.COMPONENTS:  # a pinned checksum is a full SHA-256 or none at all
        sha = release_for(comp, "amd64").sha256
        assert sha is None or len(sha) == 64
