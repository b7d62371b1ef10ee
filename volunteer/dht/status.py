"""The DHT panel of ``volunteer status``, typed: what ``DHTNode.snapshot()`` and the declarer's
``ExpertDeclarer.snapshot()`` return, and the panel both swarm kinds build from them (ours from
those two, hivemind's from its own DHT: what it does not count is None, shown "–")."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class DHTStatus(TypedDict):
    """``DHTNode.snapshot()``: the routing table, records held, requests sent and answered and
    their bytes, and records refused by reason."""

    routing_table: int
    records: int
    client_mode: bool
    requests: int | None
    failures: int | None
    answered: NotRequired[int]  # inbound requests answered (a kind that does not count them leaves it out)
    bytes_in: int | None
    bytes_out: int | None
    rejected: dict[str, int]


class DeclarerStatus(TypedDict):
    """``ExpertDeclarer.snapshot()``: experts declared now (none while paused), when a heartbeat
    last reached a peer (DHT time), heartbeats and their bytes."""

    experts_declared: int
    last_declared: float | None
    declarations: int
    heartbeat_bytes: int


class DHTPanel(DHTStatus):
    """The DHT panel of ``volunteer status`` (``NodeParts.dht_status``): the node's figures and
    how fresh and how many our declarations are; hivemind's adds its kind and node ID."""

    last_declared_age_s: float | None
    experts_declared: int
    kind: NotRequired[str]
    node_id: NotRequired[str]


class LanStatus(TypedDict):
    """``LanDiscovery.snapshot()``: how many LAN peers mDNS found."""

    found: int


__all__ = ["DHTPanel", "DHTStatus", "DeclarerStatus", "LanStatus"]
