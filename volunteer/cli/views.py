"""The pieces of a running volunteer's status snapshot (``Daemon.snapshot``), each read from the
node's parts and their ``snapshot()``: JSON-serialisable dicts and lists the dashboard, ``volunteer
status [--json]`` and the metrics collector show."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..net.multiaddr import Multiaddr
from ..net.nat.manager import NatManager
from ..net.service import HostAPI

if TYPE_CHECKING:
    from ..dht.status import DHTPanel
    from ..node import VolunteerNode
    from ..replicas.coverage import Coverage


def reachability_view(node: "VolunteerNode") -> dict | None:
    """AutoNAT's verdict, the NAT mapping, observed addresses and relay reservations (None when
    the node runs no NAT manager)."""
    manager = node.host.service(NatManager)
    if manager is None:
        return None
    nat = manager.snapshot()
    return {
        "status": nat["reachability"],
        # AutoNAT's answers so far: a first round that called a reachable node private shows here
        "evidence": nat["evidence"],
        "nat_type": nat["mapping"],
        "observed_addrs": nat["observed_addrs"],
        # punch attempts by transport and result, time to direct (the HolePuncher's snapshot)
        "hole_punching": nat["hole_punching"],
        # iroh's direct_connection_rate and direct_data_rate: peer sessions and bytes that went direct
        "direct": nat["direct"],
        "relays": [
            {
                "peer_id": str(Multiaddr(r["addr"]).peer_id or ""),
                "addr": r["addr"],
                "rtt_ms": r["rtt_ms"],
                "expires_in_s": r["expires_in"],
                "reserved": r["reserved"],
                "error": r["error"],
            }
            for r in nat["relays"]
        ],
    }


def connections_view(host: HostAPI) -> list[dict]:
    """One row per open connection: peer, path (direct quic, direct tcp, relayed), whether it was
    hole-punched, RTT, bytes."""
    rows = []
    for conn in host.connections():
        if conn.is_closed:
            continue
        relay = conn.remote_addr.relay_parts() if conn.remote_addr.is_relayed() else None
        info = host.peerstore.get(conn.remote_peer)
        rows.append(
            {
                "peer_id": str(conn.remote_peer),
                "path": conn.path_label,  # direct quic, direct tcp, relayed
                "hole_punched": conn.path.value == "hole-punched",
                "transport": conn.transport,
                "via": str(relay[1]) if relay and relay[1] else None,
                "rtt_ms": round(conn.rtt * 1000, 2) if conn.rtt else None,
                "bytes_in": conn.bytes_received,
                "bytes_out": conn.bytes_sent,
                "addr": str(conn.remote_addr),
                "agent": info.agent_version if info is not None else None,
            }
        )
    return rows


def dht_view(node: "VolunteerNode") -> "DHTPanel":
    """The swarm DHT's figures plus how fresh and how many our declarations are (the kind's)."""
    return node.parts.dht_status()


def expert_rows(node: "VolunteerNode", now: float) -> list[dict]:
    """One row per hosted expert, by uid (``now`` on trio's clock, for the age of its last
    replica sync). ``requests_per_s`` and ``mean_batch`` are the lifetime figures; the daemon
    replaces them with figures over its rate window."""
    if not node.hosts_experts:
        return []
    synced = node.replicas.sync.last_sync if node.replicas is not None else {}
    rows = []
    for uid, s in sorted(node.expert_stats().items()):
        rows.append(
            {
                "uid": uid,
                "requests": s.requests,
                "requests_per_s": 0.0,
                "mean_batch": round(s.mean_batch_size, 2),
                "p50_ms": round(s.latency_p50 * 1000, 2) if s.latency_p50 is not None else None,
                "p95_ms": round(s.latency_p95 * 1000, 2) if s.latency_p95 is not None else None,
                "errors": s.errors,
                "busy": s.busy,
                "updates": s.updates,
                "last_error": s.last_error,
                "version": s.updates,
                "last_sync_age_s": round(now - synced[uid], 1) if uid in synced else None,
            }
        )
    return rows


def coverage_view(node: "VolunteerNode") -> "Coverage | None":
    """The swarm's coverage of its declared grids (as this volunteer last surveyed it) and
    warnings (experts with no host, experts hosted outside every grid); None without grids."""
    return node.replicas.snapshot()["coverage"] if node.replicas is not None else None


def compute_view(device: str) -> dict:
    """The device the experts run on and, for CUDA, its memory and utilisation."""
    info: dict = {"device": device, "utilization_pct": None, "memory_used_mb": None, "memory_total_mb": None}
    if device.startswith("cuda"):
        try:
            import torch

            free, total = torch.cuda.mem_get_info(torch.device(device))
            info["memory_used_mb"] = round((total - free) / 2**20)
            info["memory_total_mb"] = round(total / 2**20)
            info["utilization_pct"] = torch.cuda.utilization(torch.device(device))
        except Exception:  # utilisation needs pynvml; memory figures alone still help
            pass
    return info


def refusals_view(node: "VolunteerNode") -> dict[str, dict[str, int]]:
    """``{scope: {reason: count}}``: the resource manager's scopes, the expert server's own
    admission refusals under ``experts``, and the peers' claims the replica services refused
    under ``replicas`` (``sync_outlier``, ``unsolicited_push``, ``version_claim``, ...); each only
    when it refused something."""
    from ..net.resources import ResourceManager

    refusals: dict[str, dict[str, int]] = {}
    manager = node.host.service(ResourceManager)
    if manager is not None:
        refusals.update({scope: dict(reasons) for scope, reasons in manager.refusals().items()})
    if node.server is not None:
        served = node.server.snapshot()["refusals"]
        if served:
            refusals["experts"] = dict(served)
    if node.replicas is not None:
        claims = node.replicas.snapshot()["refusals"]
        if claims:
            refusals["replicas"] = dict(claims)
    return refusals


def bytes_served(node: "VolunteerNode") -> int:
    """Bytes the volunteer uploaded: expert replies, replica sync, catch-up served and hand-off
    (the shared upload meter's total; a server without one: its reply bytes; 0 without a server)."""
    if node.server is None:
        return 0
    snap = node.server.snapshot()
    return snap["upload"]["bytes_sent"] if "upload" in snap else 0  # hivemind's counts no bytes


__all__ = [
    "bytes_served",
    "compute_view",
    "connections_view",
    "coverage_view",
    "dht_view",
    "expert_rows",
    "reachability_view",
    "refusals_view",
]
