"""The PortMapper service: asks the home router to forward our listen ports, keeps the leases, and
advertises a mapped address once an AutoNAT server has reached it from outside.

In the background from the start: the gateway is probed by PCP, NAT-PMP and UPnP IGD at once and
the most preferred protocol that answers maps every IPv4 port we listen on (TCP, and QUIC's UDP
port), asking for the same external port. Leases are renewed half-way, mapping is tried again
(with back-off) when it failed or when our addresses or reachability change, and on leaving the
mappings are deleted. Every decision is ``plan``'s; the wire formats are ``natpmp``'s and
``pcp``'s; UPnP goes through miniupnpc (``upnp``).
"""

from __future__ import annotations

import logging
import math
from typing import TypedDict

import trio

from ....errors import PortMappingError, VolunteerError, describe
from ... import limits
from ...events import ListenAddrsChanged, ObservedAddrChanged, PeerIdentified, PortMappingChanged, ReachabilityChanged
from ...identity import PeerID
from ...multiaddr import Multiaddr
from ...identify import identify_of
from ...service import BaseService, HostAPI
from ...transport.base import Path
from ..autonat import AUTONAT, probe
from .gateway import default_gateway
from .gateway_client import GatewayClient
from .plan import PROTOCOLS, Lease, PortMapPlan, Wanted, settled, wanted_ports
from .upnp import UpnpGateway

log = logging.getLogger(__name__)



class MappingView(TypedDict):
    """One lease the router granted (or was asked for), and what became of it."""

    addr: str
    internal_port: int
    protocol: str
    confirmed: bool
    refused: bool
    unchecked: bool
    renew_in_s: float


class PortMapStatus(TypedDict):
    """``PortMapper.snapshot()``: the protocol the router speaks, our leases, errors by protocol."""

    protocol: str | None
    gateway: str | None
    external_ip: str | None
    mappings: list[MappingView]
    error: str
    errors: dict[str, str]


class PortMapper(BaseService):
    """Router port mapping for a Host (see the module docstring).

    ``gateway``: where NAT-PMP and PCP requests go (default: the default route's gateway) and
    ``gateway_port`` (5351 but in tests); ``protocols``: which of "pcp", "natpmp", "upnp" to try.
    """

    def __init__(self, gateway: str | None = None, *, gateway_port: int = limits.PORTMAP_SERVER_PORT,
                 protocols: tuple[str, ...] = PROTOCOLS, lifetime: int = limits.PORTMAP_LIFETIME) -> None:
        self._gateway = gateway
        self.gateway_port = gateway_port
        self.protocols = tuple(p for p in PROTOCOLS if p in protocols)
        self.lifetime = lifetime
        self.plan = PortMapPlan()
        self.external_ip = ""  # the gateway's external address, as it reports it
        self.errors: dict[str, str] = {}  # protocol -> why it did not answer (doctor shows it)
        self._client: GatewayClient | None = None
        self._upnp: UpnpGateway | None = None
        self._next_confirm = -math.inf
        self.started = trio.Event()  # set once the first try has ended (doctor waits for it)
        self._nursery: trio.Nursery | None = None

    @property
    def gateway(self) -> str | None:
        """The gateway NAT-PMP and PCP are asked (None: no default route we can read)."""
        if self._gateway is None:
            self._gateway = default_gateway()
        return self._gateway

    def advertised_addrs(self) -> list[Multiaddr]:
        return self.plan.advertised()

    @property
    def confirming(self) -> bool:
        """Whether a mapping the router granted awaits an AutoNAT server's dial-back that can
        happen now (one is connected): a hole punch starting now may wait a moment for it."""
        return bool(self.plan.candidates()) and bool(self._servers())

    # --- the loop ---------------------------------------------------------------------------
    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        kinds = (ListenAddrsChanged, ObservedAddrChanged, ReachabilityChanged, PeerIdentified)
        with host.events.subscribe(*kinds, max_queued=limits.MAX_CONNECTIONS) as events:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await self._loop(events)
                finally:
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True), trio.move_on_after(limits.PORTMAP_REMOVE_DEADLINE):
                        await self.unmap_all()

    async def _loop(self, events) -> None:
        changed = False
        while True:
            await self._step(changed)
            changed = False
            with trio.move_on_at(self._wake_at()):
                try:
                    event = await events.receive()
                except trio.EndOfChannel:
                    return  # the Host is closing
                if isinstance(event, (ObservedAddrChanged, ReachabilityChanged)):
                    changed = True
                    self.plan.network_changed()

    async def _step(self, network_changed: bool) -> None:
        now = trio.current_time()
        wanted = wanted_ports(self.host.listen_addrs)
        if self.plan.should_try(wanted, now, network_changed=network_changed):
            await self.map_all(wanted)
            self.started.set()
        for lease in self.plan.due_renewals(trio.current_time()):
            await self._renew(lease)
        if self.plan.candidates() and trio.current_time() >= self._next_confirm:
            await self.confirm()

    def _wake_at(self) -> float:
        times = [self.plan.next_renewal()]
        if any(w not in self.plan.leases for w in wanted_ports(self.host.listen_addrs)):
            times.append(self.plan.next_try_at())
        if self.plan.candidates():
            times.append(self._next_confirm)
        return min((t for t in times if t is not None), default=math.inf)

    # --- mapping ----------------------------------------------------------------------------
    async def map_all(self, wanted: list[Wanted]) -> None:
        """Probe the protocols (at once), then map every ``wanted`` port with the best that answered."""
        if not wanted:
            return
        first = wanted[0]
        outcomes: dict[str, bool | None] = {}
        leases: list[Lease] = []
        self.errors = {}
        async with trio.open_nursery() as nursery:

            async def attempt(protocol: str) -> None:
                outcomes[protocol] = None
                try:
                    lease = await self._probe(protocol, first)
                except (PortMappingError, OSError) as exc:
                    self.errors[protocol] = describe(exc) if not isinstance(exc, PortMappingError) else str(exc)
                    outcomes[protocol] = False
                else:
                    if lease is not None:
                        leases.append(lease)
                    outcomes[protocol] = True
                done, _ = settled(outcomes)
                if done:
                    nursery.cancel_scope.cancel()

            for protocol in self.protocols:
                if protocol != "upnp" and self.gateway is None:
                    self.errors[protocol] = "no IPv4 default gateway to ask"
                    continue
                nursery.start_soon(attempt, protocol)
        _, answered = settled(outcomes)
        failed: list[str] = []
        if answered is None:
            failed.append("no router answered: " + "; ".join(f"{p}: {e}" for p, e in self.errors.items()))
        else:
            for lease in leases:
                if lease.protocol == answered:
                    self._granted(lease)
            for item in wanted:
                if item in self.plan.leases and self.plan.leases[item].protocol == answered:
                    continue
                try:
                    self._granted(await self._map(answered, item))
                except (PortMappingError, OSError) as exc:
                    failed.append(f"{item.kind} port {item.internal_port}: {describe(exc)}")
        self.plan.tried(trio.current_time(), answered, "; ".join(failed), wanted)
        if failed:
            log.info("port mapping: %s", self.plan.error)

    async def _probe(self, protocol: str, first: Wanted) -> Lease | None:
        """Whether the gateway speaks ``protocol``: PCP by mapping ``first`` (the probe is the
        request), NAT-PMP by asking its external address, UPnP by SSDP discovery."""
        if protocol == "pcp":
            return await self._map("pcp", first)
        if protocol == "natpmp":
            answer = await self._gateway_client().natpmp_external_address()
            self.external_ip = self.external_ip or answer.ip
            return None
        self._upnp = await UpnpGateway.discover()
        self.external_ip = self.external_ip or self._upnp.external_ip
        return None

    def _gateway_client(self) -> GatewayClient:
        if self._client is None:
            if self.gateway is None:
                raise PortMappingError("no IPv4 default gateway to ask")
            self._client = GatewayClient(self.gateway, self.gateway_port)
        return self._client

    async def _map(self, protocol: str, wanted: Wanted, external_port: int | None = None) -> Lease:
        """One mapping request (a renewal is the same request again)."""
        suggested = external_port or wanted.internal_port
        if protocol == "pcp":
            got = await self._gateway_client().pcp_map(wanted.transport, wanted.internal_port, suggested, self.lifetime)
            self.external_ip = got.external_ip
            return Lease("pcp", wanted, got.external_ip, got.external_port, got.lifetime, trio.current_time())
        if protocol == "natpmp":
            client = self._gateway_client()
            if not self.external_ip:
                self.external_ip = (await client.natpmp_external_address()).ip
            mapped = await client.natpmp_map(wanted.transport, wanted.internal_port, suggested, self.lifetime)
            return Lease("natpmp", wanted, self.external_ip, mapped.external_port, mapped.lifetime, trio.current_time())
        if self._upnp is None:
            self._upnp = await UpnpGateway.discover()
        port = await self._upnp.map(wanted.transport, wanted.internal_port, suggested, self.lifetime)
        return Lease("upnp", wanted, self._upnp.external_ip, port, self.lifetime, trio.current_time())

    def _granted(self, lease: Lease) -> None:
        if self.plan.granted(lease):
            log.info("port mapping: %s maps %s port %d to %s (not advertised until dialled back)",
                     lease.protocol, lease.wanted.kind, lease.wanted.internal_port, lease.addr)
            self._next_confirm = -math.inf

    async def _renew(self, lease: Lease) -> None:
        try:
            self._granted(await self._map(lease.protocol, lease.wanted, lease.external_port))
        except (PortMappingError, OSError) as exc:
            log.info("port mapping: renewing %s failed: %s", lease.addr, describe(exc))
            self.plan.lost(lease.wanted)
            self.plan.tried(trio.current_time(), self.plan.protocol, f"renewal of {lease.addr}: {describe(exc)}")
            self._publish()

    async def unmap_all(self) -> None:
        """Delete every mapping we hold (on leaving; the routers drop them at expiry otherwise)."""
        for wanted in list(self.plan.leases):
            lease = self.plan.lost(wanted)
            if lease is None:
                continue
            try:
                if lease.protocol == "pcp":
                    await self._gateway_client().pcp_map(wanted.transport, wanted.internal_port, 0, 0)
                elif lease.protocol == "natpmp":
                    await self._gateway_client().natpmp_map(wanted.transport, wanted.internal_port, 0, 0)
                elif self._upnp is not None:
                    await self._upnp.unmap(wanted.transport, lease.external_port)
            except (PortMappingError, OSError) as exc:
                log.info("port mapping: could not delete %s: %s (it expires on its own)", lease.addr, describe(exc))

    # --- confirmation -----------------------------------------------------------------------
    def _servers(self) -> list[PeerID]:
        """Peers we reach directly that serve AutoNAT: who can dial our mapping back from outside."""
        found: list[PeerID] = []
        for conn in self.host.connections():
            info = self.host.peerstore.get(conn.remote_peer)
            if conn.path is Path.RELAYED or conn.is_closed or info is None or AUTONAT not in info.protocols:
                continue
            if conn.remote_peer not in found:
                found.append(conn.remote_peer)
        return found[: limits.PORTMAP_CONFIRM_SERVERS]

    async def confirm(self) -> None:
        """Ask AutoNAT servers to dial each unconfirmed mapped address back; advertise those reached."""
        servers = self._servers()
        if not servers:
            return  # PeerIdentified wakes us when one connects
        self._next_confirm = trio.current_time() + limits.PORTMAP_RETRY_INTERVAL
        changed = answered = False
        for addr in self.plan.candidates():
            refusals = 0
            for server in servers:
                try:
                    result = await probe(self.host, server, [addr])
                except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    log.debug("port mapping: %s could not check %s: %s", server.short(), addr, describe(exc))
                    continue
                if result.reachable is None:
                    refusals += 1  # refused to try (rate limit, another IP): no evidence
                    continue
                changed |= self.plan.dialled_back(addr, result.reachable)
                answered = True
                log.info("port mapping: %s %s reached from outside", addr, "is" if result.reachable else "is not")
                break
            else:
                if refusals == len(servers):
                    # nobody will check it: it stops being a candidate (no hole punch waits for it)
                    self.plan.not_checked(addr)
                    answered = True
                    log.info("port mapping: no AutoNAT server would dial %s back; not advertised", addr)
        if changed or answered:
            self._publish(push=changed)

    def _publish(self, push: bool = True) -> None:
        """Tell the bus what we advertise now; tell connected peers too (identify push) when it changed."""
        self.host.events.publish(PortMappingChanged(tuple(self.plan.advertised())))
        if push and self._nursery is not None:
            self._nursery.start_soon(self._push_identify, name="identify push after a port mapping change")

    async def _push_identify(self) -> None:
        try:
            await identify_of(self.host).push()
        except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify push failed: %s", describe(exc))

    def snapshot(self) -> PortMapStatus:
        """The protocol the router speaks, our leases and what became of them (status, doctor)."""
        now = trio.current_time()
        return {
            "protocol": self.plan.protocol,
            "gateway": self._gateway,
            "external_ip": self.external_ip or None,
            "mappings": [
                {
                    "addr": str(lease.addr),
                    "internal_port": lease.wanted.internal_port,
                    "protocol": lease.protocol,
                    "confirmed": lease.addr in self.plan.confirmed,
                    "refused": lease.addr in self.plan.refused,
                    "unchecked": lease.addr in self.plan.unchecked,
                    "renew_in_s": round(lease.renew_at - now, 1),
                }
                for lease in self.plan.leases.values()
            ],
            "error": self.plan.error,
            "errors": dict(self.errors),
        }


__all__ = ["PortMapper"]
