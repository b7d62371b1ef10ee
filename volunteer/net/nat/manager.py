"""NatManager: what a volunteer node does about NAT, in one Host service.

It asks AutoNAT servers (the swarm's relays, usually) to dial back and decides public / private
from their answers, publishing ``ReachabilityChanged`` on the Host's bus when the verdict moves;
once private (or still unknown after a while), it adds a ``ReservationManager`` service so others
can reach us through relays; it reads the NAT mapping type from the ``AddressObserver``; hole
punching itself is the ``HolePuncher`` service. ``snapshot()`` is what the dashboard and
``volunteer doctor`` show.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from ...errors import VolunteerError, describe
from .. import limits
from ..events import (
    ConnectionEvent, DirectConnectionUp, PeerConnected, PeerDisconnected, ReachabilityChanged, RelayReservationsChanged,
)
from ..identify import Identify
from ..multiaddr import Multiaddr
from ..service import BaseService, HostAPI
from ..transport.base import Path
from .autonat import ProbeResult, Reachability, ReachabilityTracker, probe
from .dcutr import HolePuncher
from .observed import MappingType
from .observer import AddressObserver
from .relay_client import ReservationManager
from .share import DirectShare, DirectView
from .status import NatStatus

log = logging.getLogger(__name__)


@dataclass
class NatConfig:
    """How often to probe, how much evidence to want, how many relay slots to keep."""

    probe_interval: float = limits.AUTONAT_PROBE_INTERVAL
    unknown_probe_interval: float = limits.AUTONAT_UNKNOWN_PROBE_INTERVAL
    required_confirmations: int = limits.AUTONAT_REQUIRED_CONFIRMATIONS
    want_reservations: int = limits.WANT_RESERVATIONS
    reserve_when_unknown_after: float = limits.RESERVE_WHEN_UNKNOWN_AFTER


class NatManager(BaseService):
    """Runs AutoNAT probes and relay reservations for ``host`` (``await host.add_service(manager)``;
    ``probe_round()`` also works without running it, as ``volunteer doctor`` does)."""

    def __init__(self, host: HostAPI, servers: Sequence[Multiaddr | str], relays: Sequence[Multiaddr | str] = (),
                 config: NatConfig | None = None) -> None:
        self.host = host
        self.servers = [Multiaddr(s) for s in servers]
        self.relays = [Multiaddr(r) for r in relays]
        self.config = config or NatConfig()
        required = max(1, min(self.config.required_confirmations, len(self.servers)))
        self.tracker = ReachabilityTracker(required)
        self.reservations: ReservationManager | None = None
        self.last_results: list[ProbeResult] = []
        self.rounds = 0  # AutoNAT rounds run
        self.last_error = ""
        # what share of peer sessions and bytes went direct; the swarm's relays and entry points
        # are infrastructure, always reached directly, and left out
        infrastructure = {p for p in (a.peer_id for a in [*self.servers, *self.relays]) if p is not None}
        self.direct_share = DirectShare(infrastructure)
        # when we first became reachable (a relay reservation held, or a public verdict), in
        # trio time: the moment others could first reach us, whoever looks later
        self.reachable_at: float | None = None

    @property
    def reachability(self) -> Reachability:
        return self.tracker.status

    def _observer(self) -> AddressObserver | None:
        return self.host.service(AddressObserver)

    def mapping(self) -> MappingType:
        """The NAT mapping type our observed addresses imply (UNKNOWN without an observer)."""
        observer = self._observer()
        return observer.mapping(trio.current_time()) if observer else MappingType.UNKNOWN

    def advertised_addrs(self) -> list[Multiaddr]:
        """The address an AutoNAT server reached us on, while we are public: behind a forwarded
        port (or on a public IP the hostname does not resolve to), our listen addresses alone
        are ones nobody else can dial."""
        confirmed = self.tracker.confirmed_addr
        return [confirmed] if self.reachability is Reachability.PUBLIC and confirmed is not None else []

    def observed_addrs(self) -> list[Multiaddr]:
        """Our external addresses as peers observe them (for the listen port)."""
        observer = self._observer()
        return observer.external_addrs(trio.current_time()) if observer else []

    def our_addrs(self) -> list[Multiaddr]:
        """Addresses to have checked: observed external ones first, then our listen addresses."""
        addrs = self.observed_addrs()
        # What connected peers told us in identify, even if the observer has not seen it yet.
        for conn in self.host.connections():
            info = self.host.peerstore.get(conn.remote_peer)
            observed = info.observed_addr if info else None
            if observed is not None and not conn.remote_addr.is_relayed() and observed not in addrs:
                addrs.append(observed)
        return addrs + [a for a in self.host.addrs if not a.is_relayed() and a not in addrs]

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if host is not self.host:
            raise ValueError("a NatManager runs on the host it was made for")
        async with trio.open_nursery() as nursery:
            await nursery.start(self._follow_paths)
            task_status.started()
            if self.relays:
                # Reserve while the first verdict is pending: AutoNAT learns "private" only when
                # the server's dial-back times out (10 s), and a volunteer should be reachable
                # within seconds. A "public" verdict gives the slots back.
                nursery.start_soon(self._reserve_if_still_unknown)
            while True:
                await self.probe_round()
                if self.reachability is Reachability.PRIVATE and self.relays:
                    await self._ensure_reservations()
                elif self.reachability is Reachability.PUBLIC and self.reservations is not None:
                    self.reservations.set_want(0)
                interval = self.config.unknown_probe_interval if self.reachability is Reachability.UNKNOWN else self.config.probe_interval
                await trio.sleep(interval)

    async def _follow_paths(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # one event per connection change: a queue as long as the connection limit loses none
        kinds = (PeerConnected, PeerDisconnected, DirectConnectionUp, RelayReservationsChanged, ReachabilityChanged)
        with self.host.events.subscribe(*kinds, max_queued=limits.MAX_CONNECTIONS) as events:
            task_status.started()
            async for event in events:
                if self.reachable_at is None and self._reachable_now():
                    self.reachable_at = trio.current_time()
                if not isinstance(event, ConnectionEvent):
                    continue
                conn = event.connection
                direct = conn.path is not Path.RELAYED
                if isinstance(event, PeerDisconnected):
                    self.direct_share.closed(event.peer, direct, conn.bytes_sent + conn.bytes_received,
                                             last=not self.host.is_connected(event.peer))
                else:
                    self.direct_share.connected(event.peer, direct)

    def _reachable_now(self) -> bool:
        if self.reachability is Reachability.PUBLIC:
            return True
        return self.reservations is not None and any(r.reservation is not None for r in self.reservations.relays)

    def direct_view(self) -> DirectView:
        """The shares of peer sessions and bytes that went direct (``share.DirectShare``)."""
        live = [(c.remote_peer, c.path is not Path.RELAYED, c.bytes_sent + c.bytes_received)
                for c in self.host.connections() if not c.is_closed]
        return self.direct_share.view(live)

    async def _reserve_if_still_unknown(self) -> None:
        await trio.sleep(self.config.reserve_when_unknown_after)
        if self.reachability is Reachability.UNKNOWN:
            await self._ensure_reservations()

    async def probe_round(self) -> Reachability:
        """Ask each server once (in parallel); record what they found."""
        results: list[ProbeResult] = []

        async def ask(server: Multiaddr) -> None:
            try:
                with trio.fail_after(limits.AUTONAT_REQUEST_TIMEOUT):
                    await self._observed_by(server)
                addrs = self.our_addrs()
                if addrs:
                    results.append(await probe(self.host, server, addrs))
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.last_error = f"{server}: {describe(exc)}"

        async with trio.open_nursery() as nursery:
            for server in self.servers:
                nursery.start_soon(ask, server)
        for result in results:
            if result.reachable is not None:
                before = self.tracker.status
                after = self.tracker.record(result.server, result.reachable, result.addr)
                if after is not before:
                    log.info("reachability: %s (evidence %s)", after.value, self.tracker.evidence)
                    self.host.events.publish(ReachabilityChanged(after))
        self.last_results = results
        self.rounds += 1
        return self.tracker.status

    async def _observed_by(self, server: Multiaddr) -> None:
        """Connect to ``server`` and have it say where it sees us before we name our addresses:
        the manager starts first, before the DHT has connected anywhere, and a first round
        that named only our listen addresses (a LAN address behind a forwarded port) judged a
        reachable volunteer private until the next round, minutes later."""
        conn = await self.host.connect(server)
        info = self.host.peerstore.get(conn.remote_peer)
        identify = self.host.service(Identify)
        if identify is not None and (info is None or info.observed_addr is None):
            await identify.identify(conn)  # the connection's own identify may still be in flight

    async def _ensure_reservations(self) -> None:
        if self.reservations is None:
            self.reservations = ReservationManager(self.relays, want=self.config.want_reservations)
            await self.host.add_service(self.reservations)
        elif self.reservations.want != self.config.want_reservations:
            self.reservations.set_want(self.config.want_reservations)  # private again after public

    def snapshot(self) -> NatStatus:
        """What the dashboard and ``volunteer doctor`` show."""
        yes, no = self.tracker.evidence
        puncher = self.host.service(HolePuncher)
        return {
            "reachability": self.reachability.value,
            "evidence": {"reachable": yes, "unreachable": no, "required": self.tracker.required, "rounds": self.rounds},
            "confirmed_addr": str(self.tracker.confirmed_addr) if self.tracker.confirmed_addr else None,
            "mapping": self.mapping().value,
            "observed_addrs": [str(a) for a in self.observed_addrs()],
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
            "hole_punching": puncher.snapshot() if puncher else None,
            "probes": [
                {"server": str(r.server), "reachable": r.reachable, "addr": str(r.addr) if r.addr else None, "text": r.text}
                for r in self.last_results
            ],
            "last_error": self.last_error,
            "direct": self.direct_view(),
        }


__all__ = ["NatConfig", "NatManager"]
