"""``volunteer join --metrics HOST:PORT``: the daemon's figures for Prometheus.

Read at scrape time from the running node (a custom collector, as the relay's): reachability and
how long it took, connections, per-expert counters, the DHT, and refusals by scope and reason
(``volunteer_refusals_total{scope,reason}``: the resource manager's scopes, plus
``expert_server`` for the expert server's own admission refusals and ``replicas`` for the peers'
claims the replica services refused), the same names the relay uses.
Never touches the daemon's rate windows: a scrape must not move what the dashboard shows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relay.metrics import build_info, dht_metrics, refusal_metrics

from .views import reachability_view

if TYPE_CHECKING:
    from ..node import VolunteerNode
    from .daemon import Daemon

EXPERT_SERVER_SCOPE = "expert_server"  # the scope label of the expert server's own refusals
REPLICAS_SCOPE = "replicas"  # the scope label of the peers' claims the replica services refused
REACHABILITY_STATES = ("public", "private", "unknown")


def refusals_of(node: "VolunteerNode") -> dict[str, dict[str, int]]:
    """``{scope: {reason: count}}`` from the Host's resource manager and the expert server."""
    from ..net.resources import ResourceManager

    manager = node.host.service(ResourceManager)
    out = {scope: dict(reasons) for scope, reasons in (manager.refusals() if manager is not None else {}).items()}
    served = node.server.snapshot()["refusals"] if node.server is not None else {}
    if served:
        out[EXPERT_SERVER_SCOPE] = dict(served)
    claims = node.replicas.snapshot()["refusals"] if node.replicas is not None else {}
    if claims:  # peers' claims the replica services refused (sync_outlier, unsolicited_push, ...)
        out[REPLICAS_SCOPE] = dict(claims)
    return out


class DaemonCollector(Collector):
    """Reads a ``Daemon``'s node at scrape time."""

    def __init__(self, daemon: "Daemon") -> None:
        self.daemon = daemon

    def collect(self) -> Iterable[Metric]:
        daemon = self.daemon
        yield build_info("volunteer")
        yield GaugeMetricFamily("volunteer_uptime_seconds", "Seconds since the daemon started.", value=time.time() - daemon.started)
        node = daemon.node
        if node is None:
            return
        yield GaugeMetricFamily("volunteer_paused", "1 while paused (experts withdrawn).", value=1 if node.paused else 0)
        view = reachability_view(node) or {}
        reach = GaugeMetricFamily("volunteer_reachability", "1 for the current AutoNAT verdict.", labels=["status"])
        for state in REACHABILITY_STATES:
            reach.add_metric([state], 1 if view.get("status") == state else 0)
        yield reach
        reserved = sum(1 for relay in view.get("relays", []) if relay.get("reserved"))
        yield GaugeMetricFamily("volunteer_relay_reservations_held", "Relay reservations this node holds.", value=reserved)
        if daemon.reachable_after_s is not None:
            yield GaugeMetricFamily("volunteer_reachable_after_seconds",
                                    "Seconds from start to reachable (public, or reserved on a relay).",
                                    value=daemon.reachable_after_s)
        yield GaugeMetricFamily("volunteer_connections", "Connections open now.",
                                value=sum(1 for conn in node.host.connections() if not conn.is_closed))
        yield from punch_metrics(view.get("hole_punching"))
        yield from direct_metrics(view.get("direct"))
        yield from self._experts(node)
        dhts = node.swarm_dhts()
        if dhts:
            yield from dht_metrics(dhts)
        yield refusal_metrics(refusals_of(node))

    def _experts(self, node: "VolunteerNode") -> Iterable[Metric]:
        report = node.trainer_report()
        if report is None:  # no experts hosted
            return
        families = {
            "requests": CounterMetricFamily("volunteer_expert_requests", "Expert requests accepted.", labels=["uid"]),
            "samples": CounterMetricFamily("volunteer_expert_samples", "Samples computed.", labels=["uid"]),
            "errors": CounterMetricFamily("volunteer_expert_errors", "Requests answered with an error.", labels=["uid"]),
            "busy": CounterMetricFamily("volunteer_expert_busy", "Requests refused: queue full.", labels=["uid"]),
        }
        version = GaugeMetricFamily("volunteer_expert_version", "Optimizer steps the expert's state has taken.", labels=["uid"])
        for uid, stats in sorted(node.expert_stats().items()):
            for name, family in families.items():
                family.add_metric([uid], getattr(stats, name))
            version.add_metric([uid], stats.updates)
        yield from families.values()
        yield version
        backwards = CounterMetricFamily("volunteer_trainer_backwards", "Backwards by trainer and outcome "
                                        "(applied, clipped to the expert's bound, refused).", labels=["trainer", "outcome"])
        refused = GaugeMetricFamily("volunteer_trainer_refused", "1 while a trainer is refused for its gradients.",
                                    labels=["trainer"])
        for trainer, counts in sorted(report["trainers"].items()):
            for outcome in ("applied", "clipped", "refused"):
                backwards.add_metric([trainer, outcome], counts[outcome])
            refused.add_metric([trainer], 1 if counts["refused_for"] > 0 else 0)
        yield backwards
        yield refused
        yield CounterMetricFamily("volunteer_expert_rollbacks", "Experts rolled back after a trainer was refused for cause.",
                                  value=report["rollbacks"])


def punch_metrics(punching: dict | None) -> Iterable[Metric]:
    """Hole-punch attempts by transport and result, and how punches ended (a HolePuncher snapshot)."""
    if not punching:
        return
    attempts = CounterMetricFamily("volunteer_hole_punch_attempts", "DCUtR punch attempts by transport and result.",
                                   labels=["transport", "result"])
    for transport, results in sorted(punching.get("attempts", {}).items()):
        for result, count in sorted(results.items()):
            attempts.add_metric([transport, result], count)
    yield attempts
    punches = CounterMetricFamily("volunteer_hole_punches", "Hole punches that ended, by how.", labels=["result"])
    punches.add_metric(["direct"], punching.get("direct", 0))
    punches.add_metric(["failed"], punching.get("failed", 0))
    yield punches
    if punching.get("time_to_direct_ms_p50") is not None:
        yield GaugeMetricFamily("volunteer_hole_punch_time_to_direct_seconds",
                                "Median time from a relayed connection to the direct one.",
                                value=punching["time_to_direct_ms_p50"] / 1000)


def direct_metrics(direct: dict | None) -> Iterable[Metric]:
    """The shares of peer sessions and of bytes that went direct (the NAT manager's ``direct``
    view; iroh's direct_connection_rate and direct_data_rate), and the counts behind them."""
    if not direct:
        return
    if direct.get("direct_connection_share") is not None:
        yield GaugeMetricFamily("volunteer_direct_connection_share",
                                "Share of peer sessions (not the swarm's relays) that ended direct.",
                                value=direct["direct_connection_share"])
    if direct.get("direct_data_share") is not None:
        yield GaugeMetricFamily("volunteer_direct_data_share", "Share of bytes to and from peers that went direct.",
                                value=direct["direct_data_share"])
    moved = CounterMetricFamily("volunteer_peer_bytes", "Bytes to and from peers, by path.", labels=["path"])
    moved.add_metric(["direct"], direct.get("bytes_direct", 0))
    moved.add_metric(["relayed"], direct.get("bytes_relayed", 0))
    yield moved


def daemon_registry(daemon: "Daemon", *, process: bool = True) -> CollectorRegistry:
    """A registry of the daemon's own (never the global one: tests run several in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon))
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return registry


__all__ = ["EXPERT_SERVER_SCOPE", "DaemonCollector", "daemon_registry", "refusals_of"]
