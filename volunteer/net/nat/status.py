"""What ``NatManager.snapshot()`` returns, typed: the dashboard, ``volunteer status --json`` and
``volunteer doctor`` read these keys, and mypy checks them against what the manager builds."""

from __future__ import annotations

from typing import Any, TypedDict

from .dcutr import PunchingStatus
from .share import DirectView


class Evidence(TypedDict):
    """AutoNAT's evidence: servers that reached us, that did not, how many agree to decide."""

    reachable: int
    unreachable: int
    required: int
    rounds: int


class RelayView(TypedDict):
    """One relay we keep (or want) a reservation on."""

    addr: str
    reserved: bool
    expires_in: float | None
    rtt_ms: float | None
    error: str


class ProbeView(TypedDict):
    """One AutoNAT server's last answer (``reachable`` None: it refused or failed)."""

    server: str
    reachable: bool | None
    addr: str | None
    text: str


class NatStatus(TypedDict):
    """``NatManager.snapshot()``."""

    reachability: str
    evidence: Evidence
    confirmed_addr: str | None
    mapping: str
    observed_addrs: list[str]
    relays: list[RelayView]
    hole_punches: list[dict[str, Any]]  # the last punches, as ``punch.PunchOutcome``'s fields
    hole_punching: PunchingStatus | None
    probes: list[ProbeView]
    last_error: str
    direct: DirectView


__all__ = ["Evidence", "NatStatus", "ProbeView", "RelayView"]
