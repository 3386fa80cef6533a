"""Helpers shared by Score plugins.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/helper/normalize_score.go``.
"""

from __future__ import annotations

from gpulab.framework.interface import SUCCESS, NodeScore, Status


def default_normalize_score(max_priority: int, reverse: bool, scores: list[NodeScore]) -> Status:
    """Scale scores so the highest becomes ``max_priority``; ``reverse`` flips them (for
    counts where fewer is better). All zero: 0, or ``max_priority`` when reversed."""
    highest = max((s.score for s in scores), default=0)
    if highest == 0:
        if reverse:
            for s in scores:
                s.score = max_priority
        return SUCCESS
    for s in scores:
        score = max_priority * s.score // highest
        s.score = max_priority - score if reverse else score
    return SUCCESS
