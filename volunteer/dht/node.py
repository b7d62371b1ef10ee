"""The DHT's trio driver: moves NodeState's requests and replies over Host streams.

    async with open_dht(host, DHTConfig(swarm_id="demo"), bootstrap=[relay_addr]) as dht:
        await dht.store(b"key", b"value", expiration=time.time() + 60)
        records = await dht.get(b"key")

Everything protocol-shaped lives in the sans-I/O cores (``state``, ``query``, ``records``); this
module only opens streams, waits and reads the clock it was given (``clock``; wall time by default
because expirations cross the wire, ``trio.current_time`` under a MockClock in simulations).

Streams: a requester may send several requests one after another on one stream (each answered
before the next is sent); idle streams wait in the Host's ``StreamPool`` (``net/pool.py``), so a busy
trainer pays for stream setup once, not per lookup step. Lookups are ``lookups.py`` and writing
records is ``storing.py`` (bases of DHTNode). Expert declarations and beam search
are in ``declare.py`` (``ExpertDeclarer``) and ``grid.py`` on top of ``get_many`` / ``store_many``.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Callable, Iterable, Sequence

import trio

from ..errors import DHTError, DHTMessageError, VolunteerError, describe
from ..net.events import (
    ListenAddrsChanged, PeerDisconnected, PeerIdentified, PortMappingChanged, ReachabilityChanged,
    RelayReservationsChanged,
)
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.nat.autonat import Reachability
from ..net.pool import SERVE_IDLE, pool_of
from ..net.service import BaseService, Handler, HostAPI
from ..net.streams import BufferedStream
from .caches import ClosestPeers, RecentValues, chunks
from .config import DHTConfig
from .messages import Request, Response, decode_response, encode_request
from .records import Record
from .routing import Contact
from .scope import own_contact_addrs, scoped_response
from .state import NodeState, source_of
from .lookups import LookupMixin
from .storing import Item, StoreMixin
from .status import DHTStatus

log = logging.getLogger(__name__)


_MAX_PINGS = 16  # concurrent maintenance pings (ping-before-evict, liveness checks)
_MAINTENANCE_PERIOD = 1.0
_BUCKET_REFRESH_AGE = 600.0
_SELF_LOOKUPS = 3  # a join's self-lookup is repeated (at most this often) when it found nobody new
_BOOTSTRAP_BACKOFF = (1.0, 30.0)  # first and largest delay between bootstrap retries
_REPUBLISH_PERIOD = 600.0  # own long-lived records are stored again on the then-closest peers
_ANNOUNCE_SETTLE = 0.2  # address changes come in bursts (a reservation, then identify push): one announcement


class DHTNode(LookupMixin, StoreMixin, BaseService):
    """A DHT node, as a Host service (``await host.add_service(node)``) or for the length of a
    block (``open_dht``).

    Given ``bootstrap`` peers, it joins through them before it reports started (unless
    ``wait_bootstrap=False``), so the services started after it find a routing table.
    ``follow_reachability``: client mode follows the Host's ``ReachabilityChanged`` events (a
    private volunteer is not put in others' tables), as a volunteer's node does; ``reachability``
    gives the verdict reached before we started following (the NAT manager starts first)."""

    def __init__(
        self,
        host: HostAPI,
        config: DHTConfig,
        *,
        client_mode: bool = False,
        clock: Callable[[], float] = time.time,
        bootstrap: Sequence[Multiaddr | str] = (),
        wait_bootstrap: bool = True,
        follow_reachability: bool = False,
        reachability: Callable[[], Reachability] | None = None,
    ) -> None:
        self.host = host
        self.config = config
        self.clock = clock
        self.state = NodeState(host.peer_id, config, client_mode=client_mode)
        self.bootstrap_addrs = [Multiaddr(a) for a in bootstrap]
        self.wait_bootstrap = wait_bootstrap
        self.follow_reachability = follow_reachability
        self._current_reachability = reachability  # the verdict so far, read once we follow changes
        self.protocol = config.protocol_id
        # requests sent, failures, requests answered, bytes in and out; inbound refusals are the
        # core's (``state.rejected``)
        self.stats: dict[str, int] = defaultdict(int)
        self.last_bootstrap_ok: float | None = None
        self._crawled = False  # a trainer's crawl (DHTConfig.crawl_lookups) started, after the first join
        self.closest_peers = ClosestPeers()
        self.recent_values = RecentValues()
        self._pinging: set[PeerID] = set()
        self._ping_slots = trio.Semaphore(_MAX_PINGS)
        self._nursery: trio.Nursery | None = None
        self._own: dict[tuple[bytes, bytes], Item] = {}  # records we re-publish (store(..., republish=True))
        self._next_republish = 0.0
        self._rng = random.Random()

    # --- mode and addresses ---------------------------------------------------------------------
    @property
    def client_mode(self) -> bool:
        return self.state.client_mode

    def set_client_mode(self, client_mode: bool) -> None:
        """Client mode (AutoNAT says private): we query and store but ask not to be routed to."""
        self.state.client_mode = bool(client_mode)

    def _apply_reachability(self, reachability: Reachability) -> None:
        # private volunteers run the DHT in client mode: routing others to them would fail
        private = reachability is Reachability.PRIVATE
        if self.client_mode != private:
            log.info("DHT %s mode (reachability: %s)", "client" if private else "server", reachability.value)
            self.set_client_mode(private)

    def _refresh_addrs(self) -> None:
        # what a request names when no connection says better (``contact_addrs`` per peer)
        self.state.addrs = own_contact_addrs(self.host.shareable_addrs(), self.config.max_addrs)

    # --- inbound ---------------------------------------------------------------------------------
    async def _serve(self, stream) -> None:
        # One path for every inbound request: NodeState.handle decides (rate limits per peer and
        # per source address, decoding, the answer, reject accounting); this loop only moves bytes.
        reader = BufferedStream(stream)
        sender = stream.remote_peer
        via = stream.connection.remote_addr
        source = source_of(via)
        while True:
            with trio.move_on_after(SERVE_IDLE) as idle:
                try:
                    length = await reader.receive_uvarint("DHT request")
                except VolunteerError:
                    return  # EOF between requests: the requester is done with this stream
            if idle.cancelled_caught:
                return
            if not self.state.accept_length(length):
                raise DHTMessageError(f"DHT request of {length} bytes exceeds the limit")
            with trio.fail_after(self.config.request_timeout):
                body = await reader.receive_exactly(length, "DHT request")
            self.stats["bytes_in"] += length
            handled = self.state.handle(sender, body, self.clock(), source=source, via=via)
            self._ping_soon(handled.ping)
            for key in handled.invalidated:
                self.recent_values.forget(key)  # a tombstone reached us: our cached lookup is stale
            if handled.forward:
                await self._forward(handled.forward)
            self.stats["bytes_out"] += len(handled.reply)
            self.stats["answered"] += 1
            await reader.send_all(handled.reply)

    async def _forward(self, forward: Sequence[tuple[Contact, Sequence[Record]]]) -> None:
        # Tombstones to the readers that cache their keys, before we answer the STORE that brought
        # them: the leaver's withdraw returns only once caches were told (watch.py). Bounded: a
        # slow reader costs the leaver watch_forward_timeout, not request_timeout.
        async def one(contact: Contact, records: Sequence[Record]) -> None:
            try:
                await self.request(contact, self.state.store_request(records))
            except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("forwarding tombstones to %s failed: %s", contact.peer.short(), describe(exc))

        self.stats["forwards"] += len(forward)
        with trio.move_on_after(self.config.watch_forward_timeout):
            async with trio.open_nursery() as nursery:
                for contact, records in forward:
                    for part in chunks(range(len(records)), self.config.max_records_per_request):
                        nursery.start_soon(one, contact, [records[i] for i in part])

    # --- outbound --------------------------------------------------------------------------------
    async def request(self, contact: Contact, request: Request) -> Response:
        """Send one request to ``contact`` and return its checked reply (raises DHTError / VolunteerError).

        Failures are reported to the routing table; a reply is recorded as the peer being alive.
        The request carries our addresses as the connection it goes over can use them
        (``scope``), and the contacts in the reply keep only the addresses usable from there.
        """
        peer = contact.peer
        self.stats["requests"] += 1
        try:
            with trio.fail_after(self.config.request_timeout):
                reply, via, rtt = await self._exchange(contact, request)
            response = scoped_response(decode_response(reply, self.config, request), via)
        except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.stats["failures"] += 1
            log.debug("DHT request to %s failed: %s", peer.short(), describe(exc))
            self.state.on_failure(peer, self.clock())
            if isinstance(exc, trio.TooSlowError):
                raise DHTError(f"{peer.short()} did not answer within {self.config.request_timeout} s") from None
            raise
        self._ping_soon(self.state.on_reply(contact, request, response, self.clock(), rtt=rtt))
        return response

    def contact_addrs(self, via: Multiaddr | None) -> tuple[bytes, ...]:
        """Our contact addresses as the peer at ``via`` can use them: the Host's current ones
        (listen, observed and mapped, relay circuits), never fixed at start."""
        return own_contact_addrs(self.host.addrs_for(via), self.config.max_addrs)

    async def _exchange(self, contact: Contact, request: Request) -> tuple[bytes, Multiaddr | None, float]:
        """The reply, the address it came over, and the seconds from our request's first byte to
        the reply (a dial's handshakes before it are no round trip of the peer's)."""
        peer = contact.peer
        if contact.addrs and not self.host.is_connected(peer):
            self.host.peerstore.add_addrs(peer, [a for a in map(_multiaddr, contact.addrs) if a])
        # A write cut off mid-frame (opening the stream, or the request) breaks the whole
        # connection: every stream on it fails and the next request redials. Lookups cancel their
        # late requests when they finish, so opening and sending run shielded (bounded on their
        # own) and a cancellation lands on the receive, which only resets this stream. Measured:
        # 32 concurrent stores broke ~3 connections a batch before.
        with trio.CancelScope(shield=True) as opening:
            opening.deadline = trio.current_time() + self.config.request_timeout
            lease = await pool_of(self.host).lend(peer, self.protocol)
        if opening.cancelled_caught:
            raise DHTError(f"no stream to {peer.short()} within {self.config.request_timeout} s")
        async with lease:
            conn = self.host.connection_to(peer)
            via = conn.remote_addr if conn is not None else None
            body = encode_request(replace(request, addrs=self.contact_addrs(via)), self.config)
            self.stats["bytes_out"] += len(body)
            sent = self.clock()
            with trio.CancelScope(shield=True) as sending:
                sending.deadline = trio.current_time() + self.config.request_timeout
                await lease.stream.send_all(body)
            if sending.cancelled_caught:
                raise DHTError(f"{peer.short()} did not take a request within {self.config.request_timeout} s")
            reply = await lease.stream.receive_length_prefixed(self.config.max_message_size, "DHT reply")
            self.stats["bytes_in"] += len(reply)
            return reply, via, self.clock() - sent

    async def ping(self, contact: Contact) -> bool:
        """PING ``contact``; True if it answered (the routing table learns either way)."""
        self._refresh_addrs()
        try:
            await self.request(contact, self.state.ping_request())
            return True
        except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    def _ping_soon(self, peers: Iterable[PeerID]) -> None:
        for peer in peers:
            if peer in self._pinging or self._nursery is None:
                continue
            self._pinging.add(peer)
            self._nursery.start_soon(self._check_alive, peer)

    async def _check_alive(self, peer: PeerID) -> None:
        try:
            async with self._ping_slots:
                entry = self.state.table.get(peer)
                contact = entry.contact if entry else Contact(peer)
                ok = await self.ping(contact)
                self.state.on_ping_result(peer, ok, self.clock())
        finally:
            self._pinging.discard(peer)

    # --- joining and upkeep --------------------------------------------------------------------
    async def bootstrap(self, addrs: Sequence[Multiaddr | str] = ()) -> int:
        """Ping the given (or configured) bootstrap peers, then look ourselves up to fill the table.
        Returns how many bootstrap peers answered."""
        dialled = [Multiaddr(a) for a in addrs] or self.bootstrap_addrs
        answered = 0

        async def one(addr: Multiaddr) -> None:
            nonlocal answered
            try:
                with trio.fail_after(self.config.request_timeout):
                    conn = await self.host.connect(addr)
                if await self.ping(Contact(conn.remote_peer, (addr.without_peer_id().to_bytes(),))):
                    answered += 1
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.info("bootstrap peer %s did not answer: %s", addr, describe(exc))

        async with trio.open_nursery() as nursery:
            for addr in dialled:
                nursery.start_soon(one, addr)
        if answered or len(self.state.table):
            for attempt in range(_SELF_LOOKUPS):
                failures = self.stats["failures"]
                await self.find_closest(self.state.table.local_id)
                # Learned nobody beyond the bootstrap peers while requests failed (the peers they
                # named had just left, or a dial raced a busy loop): look again before calling
                # the join done, rather than waiting for maintenance to notice a thin table.
                if len(self.state.table) > answered or self.stats["failures"] == failures:
                    break
                await trio.sleep(0.2 * (attempt + 1))
            # then a few random IDs far from ours, together: the table learns of peers all over
            # the key space, not only of whoever answered near our ID (DHTConfig.join_lookups)
            async with trio.open_nursery() as nursery:
                for target in self.state.table.join_targets(self.config.join_lookups, self._rng):
                    nursery.start_soon(self._quiet_lookup, target)
            self.last_bootstrap_ok = self.clock()
        return answered

    async def add_peer(self, peer: PeerID, addrs: Sequence[Multiaddr] = ()) -> bool:
        """A peer found some other way (identify, mDNS): ping it so it joins our table if it speaks DHT."""
        if addrs:
            self.host.peerstore.add_addrs(peer, list(addrs))
        return await self.ping(Contact(peer, tuple(a.to_bytes() for a in addrs)))

    async def _maintain(self, nursery: trio.Nursery) -> None:
        delay = _BOOTSTRAP_BACKOFF[0]
        next_bootstrap = 0.0
        while True:
            await trio.sleep(_MAINTENANCE_PERIOD)
            self._refresh_addrs()
            now = self.clock()
            self.state.expire(now)
            self._ping_soon(self.state.table.to_check(now))
            if len(self.state.table) == 0 and self.bootstrap_addrs and trio.current_time() >= next_bootstrap:
                # lost everyone (a home link went down): keep retrying, with back-off
                if await self.bootstrap():
                    delay = _BOOTSTRAP_BACKOFF[0]
                else:
                    delay = min(delay * 2, _BOOTSTRAP_BACKOFF[1])
                next_bootstrap = trio.current_time() + delay * (0.5 + self._rng.random())
            for target in self.state.table.refresh_targets(now, _BUCKET_REFRESH_AGE, self._rng)[:2]:
                nursery.start_soon(self._quiet_lookup, target)
            if not self._crawled and self.config.crawl_lookups and self.last_bootstrap_ok is not None:
                self._crawled = True
                nursery.start_soon(self._crawl)
            if self._own and now >= self._next_republish:
                self._next_republish = now + _REPUBLISH_PERIOD
                nursery.start_soon(self._republish, now)

    async def _quiet_lookup(self, target: int) -> None:
        try:
            await self.find_closest(target)
        except DHTError as exc:
            log.debug("refresh lookup failed: %s", describe(exc))

    async def _crawl(self) -> None:
        """A trainer's crawl (``DHTConfig.crawl_lookups``): lookups spread over the key space, a few
        at a time, so that its table comes to hold most servers."""
        limit = trio.CapacityLimiter(self.config.crawl_parallel)

        async def one(target: int) -> None:
            async with limit:
                await self._quiet_lookup(target)

        async with trio.open_nursery() as nursery:
            for target in self.state.table.crawl_targets(self.config.crawl_lookups, self._rng):
                nursery.start_soon(one, target)
        log.info("crawled the DHT: %d peers in the table", len(self.state.table))

    async def _republish(self, now: float) -> None:
        # Re-publication (Kademlia): peers closest to our keys change as volunteers come and go,
        # so records we published with republish=True are stored again on the current closest peers.
        self._own = {item[:2]: item for item in self._own.values() if item[3] > now}
        if self._own:
            try:
                await self.store_many(list(self._own.values()))
            except DHTError as exc:
                log.debug("re-publication failed: %s", describe(exc))

    async def _follow_connections(self, nursery: trio.Nursery) -> None:
        events = self.host.events.subscribe()
        async for event in events:
            if isinstance(event, PeerIdentified) and self.protocol in (event.info.protocols or ()):
                # peers that connect for other reasons (trainers, relays) and speak our DHT join the table
                if event.peer not in self.state.table and not self.client_mode:
                    nursery.start_soon(self._add_if_unknown, event.peer)
            elif isinstance(event, PeerDisconnected) and event.peer in self.state.table:
                # a volunteer that left should stop being handed out now, not at the next sweep
                nursery.start_soon(self._recheck_after_disconnect, event.peer)

    async def _follow_addrs(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Our contact follows our addresses: when they change (a relay reservation, a router
        # mapping, a public verdict's confirmed address, a new listen address), the peers of our
        # table we are connected to hear the new ones at once, not at their next lookup of us.
        kinds = (ListenAddrsChanged, RelayReservationsChanged, PortMappingChanged, ReachabilityChanged)
        with self.host.events.subscribe(*kinds) as changes:
            task_status.started()
            announced = self.contact_addrs(None)
            async for _ in changes:
                await trio.sleep(_ANNOUNCE_SETTLE)
                current = self.contact_addrs(None)
                self._refresh_addrs()
                if current == announced:
                    continue
                announced = current
                near = self.state.table.closest(self.state.table.local_id, self.config.k, self.clock())
                self._ping_soon([c.peer for c in near if self.host.is_connected(c.peer)])

    async def _add_if_unknown(self, peer: PeerID) -> None:
        # most peers that identify with our DHT protocol are talking DHT to us already and join the
        # table through that; ping only those still unknown a moment later
        await trio.sleep(1.0)
        if peer not in self.state.table and self.host.is_connected(peer):
            await self.add_peer(peer)

    async def _recheck_after_disconnect(self, peer: PeerID) -> None:
        await trio.sleep(0)  # let a replacement connection (hole punch, redial) register first
        if self.host.is_connected(peer):
            return
        # Hand it out last until it proves alive again (any message from it redeems it), and check
        # soon: joiners asking us right after a volunteer left must not be sent to it first.
        self.state.on_failure(peer, self.clock())
        await trio.sleep(0.5)
        if not self.host.is_connected(peer):
            self._ping_soon([peer])

    def handlers(self) -> Mapping[str, Handler]:
        return {self.protocol: self._serve}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the table healthy until cancelled (the Host routes the protocol to ``handlers()``);
        reports started once joined through the bootstrap peers (if any, and ``wait_bootstrap``)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._refresh_addrs()
                if self.follow_reachability:
                    # subscribed before anything else starts: no verdict can fall before it
                    await nursery.start(self._follow_reachability)
                nursery.start_soon(self._maintain, nursery)
                nursery.start_soon(self._follow_connections, nursery)
                await nursery.start(self._follow_addrs)
                if self.bootstrap_addrs and self.wait_bootstrap:
                    await self.bootstrap()
                task_status.started()
        finally:
            # services stopped beside ours (a declarer withdrawing on its way out) may still ask
            # through us: their requests then run in their own nurseries (see _spawner)
            self._nursery = None

    async def _follow_reachability(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.host.events.subscribe(ReachabilityChanged) as changes:
            if self._current_reachability is not None:
                self._apply_reachability(self._current_reachability())  # a verdict that fell before
            task_status.started()
            async for change in changes:
                if isinstance(change, ReachabilityChanged) and isinstance(change.reachability, Reachability):
                    self._apply_reachability(change.reachability)

    def snapshot(self) -> DHTStatus:
        """Figures for the dashboard and ``volunteer status``."""
        return {
            "routing_table": len(self.state.table),
            "records": len(self.state.storage),
            "client_mode": self.client_mode,
            "requests": self.stats["requests"],
            "failures": self.stats["failures"],
            "answered": self.stats["answered"],
            "bytes_in": self.stats["bytes_in"],
            "bytes_out": self.stats["bytes_out"],
            "rejected": dict(self.state.rejected),
        }


def _multiaddr(raw: bytes) -> Multiaddr | None:
    try:
        return Multiaddr(raw)
    except VolunteerError:
        return None


@asynccontextmanager
async def open_dht(
    host: HostAPI,
    config: DHTConfig | None = None,
    *,
    bootstrap: Sequence[Multiaddr | str] = (),
    client_mode: bool = False,
    clock: Callable[[], float] = time.time,
    wait_bootstrap: bool = True,
) -> AsyncIterator[DHTNode]:
    """Run a DHT node on ``host`` for the duration of the block; bootstraps first when peers are
    given. (A volunteer runs its node as a Host service instead, for the Host's lifetime.)"""
    node = DHTNode(host, config or DHTConfig(), client_mode=client_mode, clock=clock, bootstrap=bootstrap,
                   wait_bootstrap=wait_bootstrap)
    handlers = node.handlers()
    async with trio.open_nursery() as nursery:
        for protocol, handler in handlers.items():
            host.set_handler(protocol, handler)
        try:
            await nursery.start(node.run, host)
            yield node
        finally:
            for protocol in handlers:
                host.remove_handler(protocol)
            nursery.cancel_scope.cancel()


__all__ = ["DHTNode", "open_dht"]
