"""Relay figures for the dashboard, and as Prometheus metrics through ``prometheus_client``.

The figures are read when scraped (a custom collector), never copied into metric objects as they
change: the hop service's counters stay the one source. Names follow the OpenMetrics rules: a
gauge never shares its name with a counter's ``_total`` (open circuits are
``volunteer_relay_open_circuits``; the counter of circuits ever opened is
``volunteer_relay_circuits_total``).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from .service import HopService

DIRECTIONS = ("to_target", "to_source")  # bytes the circuit's initiator sent, and those it received


class RelayFigures(TypedDict):
    """``snapshot()``: the figures the relay's dashboard and /metrics show."""

    reservations: int
    circuits: int  # open now
    circuits_total: int  # ever opened
    bytes_relayed: int
    bytes_by_direction: dict[str, int]  # by DIRECTIONS
    connections: int
    refusals: dict[str, int]  # the hop's refusals, by reason
    resource_refusals: dict[str, dict[str, int]]  # the Host's resource manager's, {scope: {reason: count}}


def snapshot(service: HopService) -> RelayFigures:
    """The figures the dashboard and /metrics show."""
    resources = service.resources
    return {
        "reservations": len(resources.reservations),
        "circuits": resources.open_circuits,
        "circuits_total": resources.circuits_total,
        "bytes_relayed": resources.bytes_relayed,
        "bytes_by_direction": dict(zip(DIRECTIONS, resources.bytes_by_direction)),
        "connections": len(service.host.connections()),
        "refusals": dict(resources.refusals),
        "resource_refusals": _resource_refusals(service),
    }


def _resource_refusals(service: HopService) -> dict[str, dict[str, int]]:
    """The Host's resource manager refusals, ``{scope: {reason: count}}`` (empty without one)."""
    from volunteer.net.resources import ResourceManager

    manager = service.host.service(ResourceManager)
    return manager.refusals() if manager is not None else {}


def refusal_metrics(refusals: Mapping[str, Mapping[str, int]]) -> CounterMetricFamily:
    """``volunteer_refusals_total{scope,reason}``: the name the relay and the daemon share."""
    family = CounterMetricFamily("volunteer_refusals", "Resource-manager refusals, by scope and reason.",
                                 labels=["scope", "reason"])
    for scope, reasons in sorted(refusals.items()):
        for reason, count in sorted(reasons.items()):
            family.add_metric([scope, reason], count)
    return family


def build_info(component: str) -> InfoMetricFamily:
    """``volunteer_build_info{component,version,python}``: which build answers this scrape."""
    from volunteer import __version__

    return InfoMetricFamily("volunteer_build", "The volunteer build serving these metrics.", value={
        "component": component, "version": __version__, "python": platform.python_version(),
    })


def dht_metrics(dhts: Mapping[str, Any]) -> Iterable[Metric]:
    """Per-swarm DHT figures from each DHT node's ``snapshot()``."""
    table = GaugeMetricFamily("volunteer_dht_routing_table_peers", "Peers in the DHT routing table.", labels=["swarm"])
    records = GaugeMetricFamily("volunteer_dht_records", "Records stored by this DHT node.", labels=["swarm"])
    requests = CounterMetricFamily("volunteer_dht_requests", "DHT requests answered.", labels=["swarm"])
    failures = CounterMetricFamily("volunteer_dht_failures", "DHT requests that failed.", labels=["swarm"])
    traffic = CounterMetricFamily("volunteer_dht_bytes", "DHT bytes, by direction.", labels=["swarm", "direction"])
    for swarm, dht in sorted(dhts.items()):
        figures = dht.snapshot()
        table.add_metric([swarm], figures["routing_table"])
        records.add_metric([swarm], figures["records"])
        requests.add_metric([swarm], figures["requests"])
        failures.add_metric([swarm], figures["failures"])
        traffic.add_metric([swarm, "in"], figures["bytes_in"])
        traffic.add_metric([swarm, "out"], figures["bytes_out"])
    return [table, records, requests, failures, traffic]


class RelayCollector(Collector):
    """Reads the relay's figures at scrape time."""

    def __init__(self, service: HopService, dhts: Mapping[str, Any] | None = None) -> None:
        self.service = service
        self.dhts = dhts if dhts is not None else {}

    def collect(self) -> Iterable[Metric]:
        figures = snapshot(self.service)
        yield build_info("relay")
        yield GaugeMetricFamily("volunteer_relay_reservations", "Reservations held now.", value=figures["reservations"])
        yield GaugeMetricFamily("volunteer_relay_open_circuits", "Circuits open now.", value=figures["circuits"])
        yield CounterMetricFamily("volunteer_relay_circuits", "Circuits opened since start.", value=figures["circuits_total"])
        relayed = CounterMetricFamily("volunteer_relay_bytes", "Bytes relayed, by direction "
                                      "(to_target: sent by the circuit's initiator).", labels=["direction"])
        for direction, count in figures["bytes_by_direction"].items():
            relayed.add_metric([direction], count)
        yield relayed
        yield GaugeMetricFamily("volunteer_relay_connections", "Connections open now.", value=figures["connections"])
        refused = CounterMetricFamily("volunteer_relay_refusals", "Relay requests refused, by reason.", labels=["reason"])
        for reason, count in sorted(figures["refusals"].items()):
            refused.add_metric([reason], count)
        yield refused
        yield refusal_metrics(figures["resource_refusals"])
        yield from dht_metrics(self.dhts)


def relay_registry(service: HopService, dhts: Mapping[str, Any] | None = None, *, process: bool = True) -> CollectorRegistry:
    """A registry of its own per relay (no global state: several relays in one test process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(service, dhts))
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return registry


def prometheus_text(service: HopService, dhts: Mapping[str, Any] | None = None) -> str:
    """The relay's metrics in the Prometheus text format (what ``GET /metrics`` answers)."""
    return generate_latest(relay_registry(service, dhts, process=False)).decode()


__all__ = ["DIRECTIONS", "RelayCollector", "build_info", "dht_metrics", "prometheus_text", "refusal_metrics",
           "relay_registry", "snapshot"]
