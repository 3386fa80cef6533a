"""The controller's Configuration (config.kueue.x-k8s.io/v1beta2, kind Configuration),
read from ``--config`` as upstream's manager reads controller_manager_config.yaml.

Mirrors kubernetes-sigs/kueue v0.19.2 apis/config/v1beta2/configuration_types.go and
its defaults (defaults.go). What the lab honours: ``waitForPodsReady`` (timeout,
blockAdmission, recoveryTimeout, requeuingStrategy), ``fairSharing``
(preemptionStrategies), ``resources`` (excludeResourcePrefixes, transformations),
``integrations.frameworks`` (batch/job, pod, deployment, statefulset),
``featureGates`` (UnadmittedWorkloadsObservability, WorkloadPriorityClassDefaulting,
VisibilityOnDemand, LocalQueueMetrics), ``visibilityServer`` (bindPort, bindAddress),
``metrics.enableClusterQueueResources``, ``metrics.bindAddress``, ``webhook.port``,
``namespace``. Fields that only tune a multi-replica deployment (leaderElection,
clientConnection, controller, health, pprofBindAddress, internalCertManagement) are
accepted and reported as not applicable. Anything else is rejected with one line
naming the field: nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils.quantity import parse_quantity

from gpulab.errors import UserError
from gpulab.kueue.model import ResourceConfig, Transformation
from gpulab.kueue.preemption import STRATEGIES

API_VERSION = "config.kueue.x-k8s.io/v1beta2"
FRAMEWORKS = ("batch/job", "pod", "deployment", "statefulset")
# feature gate -> its default in v0.19.2
FEATURE_GATES = {
    "UnadmittedWorkloadsObservability": False,
    "WorkloadPriorityClassDefaulting": False,
    "VisibilityOnDemand": True,
    "LocalQueueMetrics": True,
}
NOT_APPLICABLE = (
    "leaderElection",
    "clientConnection",
    "controller",
    "health",
    "pprofBindAddress",
    "internalCertManagement",
    "kind",
    "apiVersion",
)


class ConfigError(UserError):
    pass


@dataclass(frozen=True)
class WaitForPodsReady:
    timeout: float = 300.0
    block_admission: bool = False
    recovery_timeout: float | None = None
    eviction_timestamp: bool = True  # requeuingStrategy.timestamp Eviction (default)
    backoff_limit_count: int | None = None
    backoff_base_seconds: int = 60
    backoff_max_seconds: int = 3600


@dataclass(frozen=True)
class Configuration:
    namespace: str = "kueue-system"
    wait_for_pods_ready: WaitForPodsReady | None = None
    fair_sharing: tuple[str, ...] | None = None
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    frameworks: tuple[str, ...] = FRAMEWORKS
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    cluster_queue_resource_metrics: bool = False
    metrics_bind: str | None = None
    # visibilityServer (bindAddress, bindPort): no address = the webhooks' host (lab: so
    # the pod runner's per-pod address applies; upstream binds every interface)
    visibility_bind: tuple[str | None, int] = (None, 8082)  # DefaultVisibilityBindPort
    webhook_port: int | None = None
    not_applicable: tuple[str, ...] = ()

    def gate(self, name: str) -> bool:
        return bool(self.feature_gates.get(name, False))


def duration(value: Any, where: str) -> float:
    """A metav1.Duration ("5m", "90s", "1h30m") in seconds."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {value!r} is not a duration like 5m or 90s")
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    total, number = 0.0, ""
    rest = value
    while rest:
        if rest[0].isdigit() or rest[0] == ".":
            number += rest[0]
            rest = rest[1:]
            continue
        unit = "ms" if rest.startswith("ms") else rest[0]
        if unit not in units or not number:
            raise ConfigError(f"{where}: {value!r} is not a duration like 5m or 90s")
        total += float(number) * units[unit]
        number, rest = "", rest[len(unit) :]
    if number:
        raise ConfigError(f"{where}: {value!r} needs a unit (s, m or h)")
    return total


def _check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: {', '.join(unknown)} not supported by the lab's Kueue "
            f"(supported: {', '.join(sorted(allowed))})"
        )


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    return value


def _wait_for_pods_ready(raw: Mapping[str, Any]) -> WaitForPodsReady:
    where = "waitForPodsReady"
    _check_keys(raw, {"timeout", "blockAdmission", "recoveryTimeout", "requeuingStrategy"}, where)
    strategy = _mapping(raw.get("requeuingStrategy"), f"{where}.requeuingStrategy")
    _check_keys(
        strategy,
        {"timestamp", "backoffLimitCount", "backoffBaseSeconds", "backoffMaxSeconds"},
        f"{where}.requeuingStrategy",
    )
    timestamp = strategy.get("timestamp", "Eviction")
    if timestamp not in ("Eviction", "Creation"):
        raise ConfigError(f"{where}.requeuingStrategy.timestamp must be Eviction or Creation")
    timeout = duration(raw.get("timeout", "5m"), f"{where}.timeout")
    recovery = raw.get("recoveryTimeout")
    return WaitForPodsReady(
        timeout=timeout,
        block_admission=bool(raw.get("blockAdmission", False)),
        recovery_timeout=timeout
        if recovery is None
        else duration(recovery, f"{where}.recoveryTimeout") or None,
        eviction_timestamp=timestamp == "Eviction",
        backoff_limit_count=strategy.get("backoffLimitCount"),
        backoff_base_seconds=int(strategy.get("backoffBaseSeconds", 60)),
        backoff_max_seconds=int(strategy.get("backoffMaxSeconds", 3600)),
    )


def _resources(raw: Mapping[str, Any]) -> ResourceConfig:
    _check_keys(raw, {"excludeResourcePrefixes", "transformations"}, "resources")
    transformations: dict[str, Transformation] = {}
    for i, t in enumerate(raw.get("transformations") or []):
        where = f"resources.transformations[{i}]"
        t = _mapping(t, where)
        _check_keys(t, {"input", "strategy", "multiplyBy", "outputs"}, where)
        if not t.get("input"):
            raise ConfigError(f"{where}.input is required")
        strategy = t.get("strategy", "Retain")
        if strategy not in ("Retain", "Replace"):
            raise ConfigError(f"{where}.strategy must be Retain or Replace, got {strategy!r}")
        try:
            outputs = {k: Decimal(parse_quantity(v)) for k, v in (t.get("outputs") or {}).items()}
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}.outputs: {exc}") from exc
        transformations[t["input"]] = Transformation(
            input=t["input"],
            retain=strategy == "Retain",
            multiply_by=t.get("multiplyBy") or "",
            outputs=outputs,
        )
    return ResourceConfig(
        excluded_prefixes=tuple(raw.get("excludeResourcePrefixes") or ()),
        transformations=transformations,
    )


def parse(raw: Mapping[str, Any]) -> Configuration:
    if raw.get("apiVersion") not in (None, API_VERSION) or raw.get("kind") not in (
        None,
        "Configuration",
    ):
        raise ConfigError(f"the configuration must be apiVersion {API_VERSION}, kind Configuration")
    known = {
        "namespace",
        "manageJobsWithoutQueueName",
        "waitForPodsReady",
        "fairSharing",
        "resources",
        "integrations",
        "featureGates",
        "metrics",
        "webhook",
        "visibilityServer",
        *NOT_APPLICABLE,
    }
    _check_keys(raw, known, "Configuration")
    if raw.get("manageJobsWithoutQueueName"):
        raise ConfigError(
            "manageJobsWithoutQueueName: true is not supported by the lab's Kueue; "
            "label Jobs with kueue.x-k8s.io/queue-name"
        )
    integrations = _mapping(raw.get("integrations"), "integrations")
    _check_keys(integrations, {"frameworks"}, "integrations")
    frameworks = tuple(integrations.get("frameworks") or FRAMEWORKS)
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        raise ConfigError(
            f"integrations.frameworks: {', '.join(unknown)} not implemented by the lab "
            f"(available: {', '.join(FRAMEWORKS)})"
        )
    gates = _gates(_mapping(raw.get("featureGates"), "featureGates"))
    fair = _mapping(raw.get("fairSharing"), "fairSharing")
    _check_keys(fair, {"preemptionStrategies"}, "fairSharing")
    strategies = tuple(
        fair.get("preemptionStrategies") or ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
    )
    if any(s not in STRATEGIES for s in strategies):
        raise ConfigError(f"fairSharing.preemptionStrategies: choose from {', '.join(STRATEGIES)}")
    metrics = _mapping(raw.get("metrics"), "metrics")
    _check_keys(metrics, {"bindAddress", "enableClusterQueueResources"}, "metrics")
    webhook = _mapping(raw.get("webhook"), "webhook")
    _check_keys(webhook, {"port", "host", "certDir"}, "webhook")
    visibility = _mapping(raw.get("visibilityServer"), "visibilityServer")
    _check_keys(visibility, {"bindPort", "bindAddress"}, "visibilityServer")
    wfpr = raw.get("waitForPodsReady")
    return Configuration(
        namespace=raw.get("namespace") or "kueue-system",
        wait_for_pods_ready=_wait_for_pods_ready(_mapping(wfpr, "waitForPodsReady"))
        if wfpr is not None
        else None,
        fair_sharing=strategies if "fairSharing" in raw else None,
        resources=_resources(_mapping(raw.get("resources"), "resources")),
        frameworks=frameworks,
        feature_gates=gates,
        cluster_queue_resource_metrics=bool(metrics.get("enableClusterQueueResources", False)),
        metrics_bind=metrics.get("bindAddress"),
        visibility_bind=(visibility.get("bindAddress"), int(visibility.get("bindPort") or 8082)),
        webhook_port=webhook.get("port"),
        not_applicable=tuple(k for k in NOT_APPLICABLE[:-2] if k in raw),
    )


def _gates(requested: Mapping[str, Any]) -> dict[str, bool]:
    gates = dict(FEATURE_GATES)
    for name, value in requested.items():
        if name not in FEATURE_GATES:
            raise ConfigError(
                f"feature gate {name} is not implemented by the lab "
                f"(available: {', '.join(FEATURE_GATES)})"
            )
        gates[name] = bool(value)
    return gates


def with_gates(config: Configuration, requested: Mapping[str, bool]) -> Configuration:
    """The Configuration with --feature-gates applied on top of its featureGates."""
    return dataclasses.replace(config, feature_gates=_gates(requested))


def load(path: Path | None) -> Configuration:
    if path is None:
        return Configuration()
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not YAML ({exc})") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"--config {path}: expected a Configuration object")
    try:
        return parse(raw)
    except ConfigError as exc:
        raise ConfigError(f"--config {path}: {exc}") from exc
