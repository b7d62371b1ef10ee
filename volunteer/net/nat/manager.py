"""NatManager: what a volunteer node does about NAT, in one service.

It asks AutoNAT servers (the swarm's relays, usually) to dial back and decides public / private
from their answers; once private, it keeps relay reservations so others can reach us; it reads
the NAT mapping type from identify's observed addresses; hole punching itself runs in the Host
(DCUtR). ``snapshot()`` is what the dashboard and ``volunteer doctor`` show.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from ...errors import VolunteerError, describe
from ..multiaddr import Multiaddr
from .autonat import ProbeResult, Reachability, ReachabilityTracker, probe
from .observed import MappingType
from .relay_client import ReservationManager

log = logging.getLogger(__name__)


@dataclass
class NatConfig:
    probe_interval: float = 120.0  # re-check once reachability is known
    unknown_probe_interval: float = 15.0
    required_confirmations: int = 3  # distinct servers that must agree (fewer if fewer exist)
    want_reservations: int = 2
    reserve_when_unknown_after: float = 30.0  # no verdict by then: reserve anyway, to be reachable


class NatManager:
    """Runs AutoNAT probes and relay reservations for ``host``."""

    def __init__(self, host, servers: Sequence[Multiaddr | str], relays: Sequence[Multiaddr | str] = (), config: NatConfig | None = None) -> None:
        self.host = host
        self.servers = [Multiaddr(s) for s in servers]
        self.relays = [Multiaddr(r) for r in relays]
        self.config = config or NatConfig()
        required = max(1, min(self.config.required_confirmations, len(self.servers)))
        self.tracker = ReachabilityTracker(required)
        self.reservations: ReservationManager | None = None
        self.last_results: list[ProbeResult] = []
        self.last_error = ""
        self._nursery: trio.Nursery | None = None

    @property
    def reachability(self) -> Reachability:
        return self.tracker.status

    def mapping(self) -> MappingType:
        puncher = self.host.hole_puncher
        if puncher is None:
            return MappingType.UNKNOWN
        ports = [int(a.value_for("tcp")) for a in self.host.listen_addrs if a.value_for("tcp")]
        return puncher.observed.mapping(trio.current_time(), ports[0] if ports else None)

    def our_addrs(self) -> list[Multiaddr]:
        """Addresses to have checked: observed external ones first, then our listen addresses."""
        addrs = list(self.host.hole_puncher.our_addrs()) if self.host.hole_puncher else []
        # What connected peers told us in identify, even if the hole puncher has not seen it yet.
        for conn in self.host.connections():
            info = self.host.peerstore.get(conn.remote_peer)
            observed = info.observed_addr if info else None
            if observed is not None and not conn.remote_addr.is_relayed() and observed not in addrs:
                addrs.append(observed)
        return addrs + [a for a in self.host.addrs if not a.is_relayed() and a not in addrs]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            started = trio.current_time()
            while True:
                await self.probe_round()
                unknown_too_long = (
                    self.reachability is Reachability.UNKNOWN
                    and trio.current_time() - started >= self.config.reserve_when_unknown_after
                )
                if (self.reachability is Reachability.PRIVATE or unknown_too_long) and self.relays:
                    await self._ensure_reservations()
                interval = self.config.unknown_probe_interval if self.reachability is Reachability.UNKNOWN else self.config.probe_interval
                await trio.sleep(interval)

    async def probe_round(self) -> Reachability:
        """Ask each server once (in parallel); record what they found."""
        results: list[ProbeResult] = []
        addrs = self.our_addrs()

        async def ask(server: Multiaddr) -> None:
            try:
                results.append(await probe(self.host, server, addrs))
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.last_error = f"{server}: {describe(exc)}"

        if addrs:
            async with trio.open_nursery() as nursery:
                for server in self.servers:
                    nursery.start_soon(ask, server)
        for result in results:
            if result.reachable is not None:
                before = self.tracker.status
                after = self.tracker.record(result.server, result.reachable, result.addr)
                if after is not before:
                    log.info("reachability: %s (evidence %s)", after.value, self.tracker.evidence)
        self.last_results = results
        return self.tracker.status

    async def _ensure_reservations(self) -> None:
        if self.reservations is None and self._nursery is not None:
            self.reservations = ReservationManager(self.host, self.relays, want=self.config.want_reservations)
            await self._nursery.start(self.reservations.run)

    def snapshot(self) -> dict:
        yes, no = self.tracker.evidence
        puncher = self.host.hole_puncher
        return {
            "reachability": self.reachability.value,
            "evidence": {"reachable": yes, "unreachable": no, "required": self.tracker.required},
            "confirmed_addr": str(self.tracker.confirmed_addr) if self.tracker.confirmed_addr else None,
            "mapping": self.mapping().value,
            "observed_addrs": [str(a) for a in (puncher.our_addrs() if puncher else [])],
            "relays": [
                {
                    "addr": str(status.addr),
                    "reserved": status.reservation is not None,
                    "expires_in": round(status.reservation.refresh_at() - trio.current_time(), 1) if status.reservation else None,
                    "rtt_ms": round(status.rtt * 1000, 2) if status.rtt else None,
                    "error": status.last_error,
                }
                for status in (self.reservations.relays if self.reservations else [])
            ],
            "hole_punches": [vars(o) for o in (puncher.outcomes[-10:] if puncher else [])],
            "probes": [
                {"server": str(r.server), "reachable": r.reachable, "addr": str(r.addr) if r.addr else None, "text": r.text}
                for r in self.last_results
            ],
            "last_error": self.last_error,
        }
