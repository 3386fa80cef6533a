"""DefaultBinder: bind through the Binding subresource.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/defaultbinder/default_binder.go``.

Lab convenience upstream kube-scheduler lacks: the Binding carries the scheduling
results as kube-scheduler-simulator's debuggable scheduler records them
(``kube-scheduler-simulator.sigs.k8s.io/filter-result`` and ``finalscore-result``,
JSON node -> plugin -> result), so ``kubectl get pod -o yaml`` explains the placement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpulab.framework.binding import BindError
from gpulab.framework.interface import SUCCESS, CycleState, Status, error
from gpulab.framework.runtime import Binder, results_of

NAME = "DefaultBinder"
FILTER_RESULT = "kube-scheduler-simulator.sigs.k8s.io/filter-result"
FINAL_SCORE_RESULT = "kube-scheduler-simulator.sigs.k8s.io/finalscore-result"


def result_annotations(state: CycleState) -> dict[str, str]:
    results = results_of(state)
    out = {}
    if results.filter:
        out[FILTER_RESULT] = json.dumps(results.filter, sort_keys=True, separators=(",", ":"))
    if results.score:
        scores = {n: {p: str(s) for p, s in v.items()} for n, v in results.score.items()}
        out[FINAL_SCORE_RESULT] = json.dumps(scores, sort_keys=True, separators=(",", ":"))
    return out


class DefaultBinder:
    name = NAME

    def __init__(self, binder: Binder | None) -> None:
        self.binder = binder

    def Bind(self, state: CycleState, pod: Mapping[str, Any], node_name: str) -> Status:
        if self.binder is None:
            return error("no binder: the framework was built without an API client")
        try:
            self.binder.bind(pod, node_name, result_annotations(state))
        except BindError as exc:
            return error(str(exc))
        return SUCCESS


def new(args: Mapping[str, Any], handle: Any) -> DefaultBinder:
    return DefaultBinder(handle.binder)
