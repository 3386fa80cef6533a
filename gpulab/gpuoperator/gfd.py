"""``gpulab gpu-feature-discovery``: the GFD operand, labelling its node from NVML.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``cmd/gpu-feature-discovery/main.go`` (load the
config - ``--config-file``/``CONFIG_FILE``, then ``MIG_STRATEGY`` - read NVML, write the
labels, sleep ``GFD_SLEEP_INTERVAL``, again; ``--oneshot`` stops after one pass;
``GFD_FAIL_ON_INIT_ERROR``). The labels are the lab device plugin's GFD labelers
(:func:`gpulab.deviceplugin.labels.gfd_labels`).

Deliberate difference: upstream hands its labels to NFD (a features.d file or a
NodeFeature object) and NFD owns them on the node; the lab has no NFD, so GFD patches
the Node itself and, as NFD does, keeps the list of the labels it wrote in the node
annotation ``nfd.node.kubernetes.io/feature-labels``, removing those it no longer
produces (after a MIG change, the old profile's labels).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client

from gpulab.deviceplugin import nvml
from gpulab.deviceplugin.config import Config, FlagOverrides, merge, parse
from gpulab.deviceplugin.labels import gfd_labels
from gpulab.errors import CLIError
from gpulab.trace import ObjectRef, Tracer

FEATURE_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")


def parse_duration(text: str) -> float:
    """A Go duration as GFD_SLEEP_INTERVAL takes it ("60s", "1m", "500ms") in seconds."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise CLIError(f"invalid sleep interval {text!r}: use a duration such as 60s or 1m")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    return float(m.group(1)) * scale


def load_config(config_file: Path | None, mig_strategy: str | None) -> Config:
    config = parse(config_file.read_text(), str(config_file)) if config_file else Config()
    return merge(config, FlagOverrides(mig_strategy=mig_strategy or None))


def label_changes(
    labels: Mapping[str, str], annotations: Mapping[str, str], wanted: Mapping[str, str]
) -> tuple[dict[str, str | None], str]:
    """(the label patch, the new feature-labels annotation): set ``wanted``, drop the
    labels GFD wrote before (per the annotation) that are not wanted any more."""
    previous = {k for k in annotations.get(FEATURE_LABELS_ANNOTATION, "").split(",") if k}
    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if labels.get(k) != v}
    patch.update({k: None for k in previous - set(wanted) if k in labels})
    return patch, ",".join(sorted(wanted))


def label_once(api: client.ApiClient, node: str, config: Config, tracer: Tracer) -> int:
    """One pass: read NVML, write the labels; returns how many labels the node carries."""
    nvml.init()
    try:
        gpus = nvml.read_inventory()
    finally:
        nvml.shutdown()
    wanted = gfd_labels(gpus, config)
    core = client.CoreV1Api(api)
    current = core.read_node(node).metadata
    patch, feature_labels = label_changes(current.labels or {}, current.annotations or {}, wanted)
    if patch or (current.annotations or {}).get(FEATURE_LABELS_ANNOTATION) != feature_labels:
        core.patch_node(
            node,
            {
                "metadata": {
                    "labels": patch,
                    "annotations": {FEATURE_LABELS_ANNOTATION: feature_labels},
                }
            },
        )
    if patch:
        shown = ", ".join(
            f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(patch.items())
        )
        tracer.step("labelNode", ObjectRef("Node", node), shown, labels=patch)
    return len(wanted)


def run(
    api: client.ApiClient,
    node: str,
    config: Config,
    interval: float,
    oneshot: bool,
    stop: threading.Event,
) -> None:
    tracer = Tracer("gpu-feature-discovery", api, instance=node)
    try:
        while True:
            count = label_once(api, node, config, tracer)
            print(f"{node}: {count} GPU feature labels", flush=True)
            if oneshot or stop.wait(interval):
                return
    finally:
        tracer.flush(timeout=2)
