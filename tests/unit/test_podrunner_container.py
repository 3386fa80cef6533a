"""harness/podrunner/container.py: kubelet's env and $(VAR) rules, and the host rewrites."""

from __future__ import annotations

import json

import pytest

from harness.podrunner.container import (
    MOUNTS_ENV,
    ContainerError,
    Mount,
    environment,
    expand,
    plan,
    rewrite_addresses,
    rewrite_paths,
)

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
    "spec": {"nodeName": "gpu-a100", "serviceAccountName": "sa"},
    "status": {"podIP": "127.20.128.7", "hostIP": "127.0.0.1"},
}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(A)-$(B)", "1-2"),
        ("$$(A)", "$(A)"),  # escaped
        ("$(MISSING)", "$(MISSING)"),  # undefined: left as written
        ("$(A", "$(A"),  # unterminated
        ("a$b", "a$b"),
        ("$", "$"),
    ],
)
def test_expand_follows_kubelet(text: str, want: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == want


def test_environment_resolves_references_in_order() -> None:
    container = {
        "name": "c",
        "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "PATHY", "value": "/var/lib/fake-gpu/$(NODE)/config"},
            {"name": "LATER", "value": "$(EARLIER)"},  # defined after: not expanded
            {"name": "EARLIER", "value": "e"},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "MEM_MI",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "t", "optional": True}},
            },
            {"name": "API", "value": "$(KUBERNETES_SERVICE_HOST)"},
        ],
    }
    env = environment(
        POD,
        container,
        {"cm": {"A": "1"}},
        {"s": {"t": "secret"}},
        {"KUBERNETES_SERVICE_HOST": "127.0.0.1"},
    )
    assert env == {
        "CM_A": "1",
        "NODE": "gpu-a100",
        "APP": "x",
        "PATHY": "/var/lib/fake-gpu/gpu-a100/config",
        "LATER": "$(EARLIER)",
        "EARLIER": "e",
        "CPU": "1",  # kubelet rounds up
        "MEM_MI": "64",
        "TOKEN": "secret",
        "API": "127.0.0.1",
    }


def test_a_missing_reference_is_a_config_error() -> None:
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}],
    }
    with pytest.raises(ContainerError) as exc:
        environment(POD, container, {}, {}, {})
    assert exc.value.reason == "CreateContainerConfigError"
    assert "'gone'" in str(exc.value)


MOUNTS = [
    Mount("/var/lib/kubelet/device-plugins", "/state/nodes/n/device-plugins"),
    Mount("/var/lib/fake-gpu", "/state/nodes/n/rootfs/var/lib/fake-gpu"),
    Mount("/tls", "/state/pods/p/volumes/tls"),
]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("/var/lib/kubelet/device-plugins", "/state/nodes/n/device-plugins"),
        (
            "--socket-dir=/var/lib/kubelet/device-plugins/",
            "--socket-dir=/state/nodes/n/device-plugins/",
        ),
        ("/var/lib/fake-gpu/n/config", "/state/nodes/n/rootfs/var/lib/fake-gpu/n/config"),
        ("--cert-file=/tls/tls.crt", "--cert-file=/state/pods/p/volumes/tls/tls.crt"),
        ("/tlsx/a", "/tlsx/a"),  # not a path boundary
        ("/other/tls/a", "/other/tls/a"),  # not at the start of a path
        ("a:/tls,/tls/b", "a:/state/pods/p/volumes/tls,/state/pods/p/volumes/tls/b"),
        ("file:///tls/ca.crt", "file:///state/pods/p/volumes/tls/ca.crt"),
    ],
)
def test_mount_paths_are_rewritten_at_path_boundaries(text: str, want: str) -> None:
    assert rewrite_paths(text, MOUNTS) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0.0.0.0:9443", "127.20.128.7:9443"),
        ("--http-bind=0.0.0.0:9443", "--http-bind=127.20.128.7:9443"),
        ("https://127.0.0.1:9443", "https://127.20.128.7:9443"),
        ("localhost:8080", "127.20.128.7:8080"),
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("127.0.0.10", "127.0.0.10"),
        ("localhost.localdomain", "localhost.localdomain"),
    ],
)
def test_loopback_words_mean_this_pod(text: str, want: str) -> None:
    assert rewrite_addresses(text, "127.20.128.7") == want


def test_plan_uses_the_image_entrypoint_for_args_only_containers() -> None:
    container = {
        "name": "c",
        "args": ["kueue-controller", "--webhook-bind=0.0.0.0:9443", "--cert-file=/tls/tls.crt"],
    }
    out = plan(
        POD,
        container,
        ["gpulab"],
        {"LD_LIBRARY_PATH": "/shim"},
        MOUNTS,
        {},
        {"KUBERNETES_SERVICE_HOST": "127.0.0.1"},
        "127.20.128.7",
    )
    assert out.argv == [
        "gpulab",
        "kueue-controller",
        "--webhook-bind=127.20.128.7:9443",
        "--cert-file=/state/pods/p/volumes/tls/tls.crt",
    ]
    # the service env names host addresses already: never rewritten
    assert out.env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert out.env["LD_LIBRARY_PATH"] == "/shim"
    assert json.loads(out.env[MOUNTS_ENV])["/tls"] == "/state/pods/p/volumes/tls"


def test_plan_command_replaces_the_entrypoint_and_expands_args() -> None:
    container = {
        "name": "c",
        "command": ["gpulab", "device-plugin"],
        "args": ["--node-name", "$(NODE_NAME)"],
    }
    out = plan(POD, container, ["ignored"], {}, [], {"NODE_NAME": "gpu-a100"}, {}, None)
    assert out.argv == ["gpulab", "device-plugin", "--node-name", "gpu-a100"]


def test_plan_without_any_command_is_an_error() -> None:
    with pytest.raises(ContainerError, match="no command"):
        plan(POD, {"name": "c"}, [], {}, [], {}, {}, None)
