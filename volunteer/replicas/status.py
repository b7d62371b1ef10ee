"""What ``ReplicaManager.snapshot()`` returns, typed: the dashboard and ``volunteer status
--json`` read these keys, and mypy checks them against what the manager builds."""

from __future__ import annotations

from typing import TypedDict

from .coverage import Coverage


class TransferCounts(TypedDict):
    """State transfers (catch-up and hand-off) this volunteer served, received and refused."""

    served: int
    received: int
    refused: int


class ReplicasStatus(TypedDict):
    """``ReplicaManager.snapshot()``: the grids' coverage as last surveyed, and what this
    volunteer did about it."""

    coverage: Coverage
    moves: int  # experts added or dropped by re-checks
    caught_up: int  # experts caught up before declaring
    sync_failures: int
    transfers: TransferCounts
    refusals: dict[str, int]  # peers' claims refused, by reason
    standings: dict[str, dict[str, str]]  # uid → {peer: standing} of the replicas dealt with
    proven_liars: list[str]  # peers a checked proof excludes that declared our grids' experts


__all__ = ["ReplicasStatus", "TransferCounts"]
