"""The sans-I/O heart of a DHT node: routing table + storage + request handling.

The trio driver (``node.py``) only moves bytes and time: for an inbound stream it checks the
announced length with ``accept_length``, reads one length-prefixed body and calls ``handle`` (rate
limits, decoding, the answer, reject accounting: everything runs here, so the unit tests of
``handle`` certify what a node does); for an outbound request it builds the request here, sends
``encode_request(...)``, reads the reply and calls ``on_reply`` / ``on_failure``. Peers the routing
table wants pinged (ping-before-evict) come back from these calls.

Inbound requests are limited per peer and per source address (``source_of``): identities are
free to mint, addresses are not. Refusals are counted by reason in ``rejected``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Iterable

import msgpack

from ..errors import DHTError, DHTMessageError, DHTRemoteError
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.ratelimit import RateLimiter
from ..net.resources import address_key
from .config import DHTConfig
from .messages import (
    ErrorReply,
    FindNode,
    FindValue,
    KeyResult,
    Nodes,
    Ping,
    Pong,
    Request,
    Response,
    Store,
    Stored,
    Values,
    check_reply,
    contact_to_wire,
    decode_request,
    encode_response,
    record_to_wire,
)
from .query import Lookup, ValueLookup
from .records import OK, STALE, Record, Source, Storage
from .routing import Contact, RoutingTable, id_from_bytes, id_to_bytes, key_id
from .scope import scoped_request
from .watch import Watchers, forwards

_REPLY_OVERHEAD = 256  # map keys, op, list headers: a generous allowance when budgeting replies


@dataclass
class Handled:
    """Result of handling one inbound request: bytes to send back, peers to ping, the error if any;
    for a STORE, the tombstones to forward to watching readers before replying (``watch.py``) and
    the keys a tombstone arrived for (our own cached lookups of them are stale now)."""

    reply: bytes
    ping: list[PeerID] = field(default_factory=list)
    error: DHTError | None = None
    forward: list[tuple[Contact, list[Record]]] = field(default_factory=list)
    invalidated: list[bytes] = field(default_factory=list)


def source_of(remote_addr: Multiaddr | None) -> Source:
    """The source address a request from ``remote_addr`` counts against (rate limits, fairness).

    IPv4 by address (/32), IPv6 by its /64 (one home gets a /64, and minting addresses inside it
    is free), a relayed connection by its relay (the circuit's relay peer: the origin's address
    is not ours to see, and the relay limits its own circuits), anything else (the memory
    transport) by the whole address. None stays None: a request of unknown origin.
    """
    if remote_addr is None:
        return None
    relayed = remote_addr.relay_parts()
    if relayed is not None:
        relay_addr, _ = relayed
        relay = relay_addr.peer_id
        return ("relay", str(relay) if relay is not None else str(relay_addr))
    # the same buckets as the resource manager's address scopes
    kind = next((k for k in ("ip4", "ip6") if remote_addr.value_for(k) is not None), "addr")
    return (kind, address_key(remote_addr))


class InboundLimits:
    """Token buckets for inbound requests and stored records, per peer and per source address."""

    def __init__(self, config: DHTConfig) -> None:
        keys = config.rate_limit_keys
        self.requests = RateLimiter(config.request_rate, config.request_burst, max_keys=keys)
        self.stores = RateLimiter(config.store_rate, config.store_burst, max_keys=keys)
        self.source_requests = RateLimiter(config.source_request_rate, config.source_request_burst, max_keys=keys)
        self.source_stores = RateLimiter(config.source_store_rate, config.source_store_burst, max_keys=keys)

    def allow_request(self, peer: PeerID, source: Hashable, now: float) -> bool:
        """One request from ``peer`` at ``source``: both buckets must have a token."""
        return self.requests.allow(peer, now=now) and self.source_requests.allow(source, now=now)

    def allow_records(self, peer: PeerID, source: Hashable, count: int, now: float) -> bool:
        """``count`` records to store from ``peer`` at ``source``."""
        return self.stores.allow(peer, now=now, cost=count) and self.source_stores.allow(source, now=now, cost=count)


UNSCOPED = object()  # ``handle``'s ``via`` when the caller keeps every address a request names


class NodeState:
    """Everything a DHT node knows and decides, without I/O or clocks."""

    def __init__(
        self,
        local: PeerID,
        config: DHTConfig | None = None,
        *,
        client_mode: bool = False,
        addrs: Iterable[bytes] = (),
    ) -> None:
        self.local = local
        self.config = config or DHTConfig()
        self.client_mode = client_mode
        self.addrs: tuple[bytes, ...] = tuple(addrs)  # what we advertise; the driver keeps it current
        self.table = RoutingTable(local, self.config)
        self.storage = Storage(self.config)
        self.limits = InboundLimits(self.config)
        self.watchers = Watchers(self.config)  # readers to tell of tombstones (FIND_VALUE with watch)
        # inbound refusals by reason: rate-limited, store-flood, malformed, too-large, and every
        # STORE code other than ok/stale (signer-share, key-full, bad-signature, ...), per record
        self.rejected: Counter[str] = Counter()

    # --- inbound ---------------------------------------------------------------------------
    def accept_length(self, length: int) -> bool:
        """Whether a request body of ``length`` bytes may be read at all (counted if not)."""
        if length > self.config.max_message_size:
            self.rejected["too-large"] += 1
            return False
        return True

    def handle(self, sender: PeerID, body: bytes, now: float, *, source: Source = None,
               via: "Multiaddr | None | object" = UNSCOPED) -> Handled:
        """Answer one request body from ``sender`` (the stream's authenticated peer) at ``source``
        (``source_of`` its connection's remote address): rate limits, decoding, the answer.
        ``via``: that remote address; the sender's own addresses are kept only where usable from
        it (``scope``: never its loopback over a connection that is not on ours)."""
        if not self.limits.allow_request(sender, source, now):
            self.rejected["rate-limited"] += 1
            return self._refuse("rate-limited", "too many DHT requests; slow down")
        try:
            request = decode_request(body, self.config)
            if via is not UNSCOPED:
                request = scoped_request(request, via)  # type: ignore[arg-type]
        except DHTMessageError as exc:
            self.rejected["malformed"] += 1
            reply = encode_response(ErrorReply("malformed", exc.hint or str(exc)), self.config)
            return Handled(reply, [], exc)
        if isinstance(request, Store) and not self.limits.allow_records(sender, source, len(request.records), now):
            self.rejected["store-flood"] += len(request.records)
            return self._refuse("rate-limited", "too many records stored; slow down")
        response, ping = self.handle_request(sender, request, now, source=source)
        forward: list[tuple[Contact, list[Record]]] = []
        invalidated: list[bytes] = []
        if isinstance(request, Store) and isinstance(response, Stored):
            for code in response.codes:
                if code not in (OK, STALE):
                    self.rejected[code] += 1
            coded = list(zip(request.records, response.codes))
            # OK and STALE both mean the signature checked out: a real tombstone, new or known
            invalidated = sorted({r.key for r, code in coded if r.value is None and code in (OK, STALE)})
            forward = forwards(self.watchers, [r for r, code in coded if code == OK], now, [sender, self.local])
        return Handled(encode_response(response, self.config), ping, forward=forward, invalidated=invalidated)

    def _refuse(self, code: str, message: str) -> Handled:
        reply = encode_response(ErrorReply(code, message), self.config)
        return Handled(reply, [], DHTError(f"refused ({code}): {message}"))

    def handle_request(
        self, sender: PeerID, request: Request, now: float, *, source: Source = None
    ) -> tuple[Response, list[PeerID]]:
        """Answer a decoded request; the sender joins the routing table unless in client mode.
        ``handle`` calls this after its checks; STORE counts ``source`` for fairness."""
        ping = []
        lru = self.table.update(Contact(sender, request.addrs), now, client_mode=request.client_mode)
        if lru is not None:
            ping.append(lru)
        cm = self.client_mode
        if isinstance(request, Ping):
            return Pong(cm), ping
        if isinstance(request, Store):
            codes = tuple(self.storage.store_many(request.records, now, source=source))
            nearest: list[Contact] = []
            if request.near is not None:  # the STORE is a lookup's question too
                target = id_from_bytes(request.near)
                nearest = self.table.closest(target, self.config.reply_contacts, now, exclude=[sender], responsive_only=True)
            return Stored(codes, cm, tuple(nearest)), ping
        if isinstance(request, FindNode):
            target = id_from_bytes(request.target)
            closer = self.table.closest(target, self.config.reply_contacts, now, exclude=[sender], responsive_only=True)
            return Nodes(tuple(closer), cm), ping
        if isinstance(request, FindValue):
            if request.watch:
                reader = Contact(sender, request.addrs)
                for key in request.keys:
                    self.watchers.watch(key, reader, now)
            return self._values(sender, request.keys, now), ping
        raise AssertionError(f"unhandled request {request!r}")  # decode_request returns only the above

    def _values(self, sender: PeerID, keys: tuple[bytes, ...], now: float) -> Values:
        config = self.config
        closer_by_key = [
            self.table.closest(key_id(k), config.reply_contacts, now, exclude=[sender], responsive_only=True) for k in keys
        ]
        # the shared contact table is capped: fill it rank by rank so every key keeps its nearest
        contacts: dict[Contact, None] = {}
        for rank in range(config.reply_contacts):
            for closer in closer_by_key:
                if rank < len(closer) and len(contacts) < config.max_contacts:
                    contacts[closer[rank]] = None
        allowed = set(contacts)
        budget = config.max_message_size - _REPLY_OVERHEAD
        budget -= sum(len(msgpack.packb(contact_to_wire(c))) + 4 for c in allowed)
        budget -= len(keys) * (config.reply_contacts * 3 + 16)
        results = []
        for key, closer in zip(keys, closer_by_key):
            held = sorted(self.storage.get(key, now).values(), key=lambda r: -r.expiration)
            chosen = []
            for record in held[: config.max_records_per_request]:
                size = len(msgpack.packb(record_to_wire(record), use_bin_type=True))
                if size > budget:
                    break  # the freshest records of every key came first; the rest do not fit
                budget -= size
                chosen.append(record)
            results.append(KeyResult(tuple(chosen), tuple(c for c in closer if c in allowed)))
        return Values(tuple(results), self.client_mode)

    # --- outbound ----------------------------------------------------------------------------
    def ping_request(self) -> Ping:
        """A PING carrying our mode and addresses."""
        return Ping(self.client_mode, self.addrs)

    def store_request(self, records: Iterable[Record], *, near: int | None = None) -> Store:
        """A STORE of ``records`` (at most ``max_records_per_request``); ``near``: also ask for the
        contacts closest to this 256-bit ID (a store's lookup)."""
        return Store(tuple(records), self.client_mode, self.addrs, None if near is None else id_to_bytes(near))

    def find_node_request(self, target: int) -> FindNode:
        """A FIND_NODE for a 256-bit ID."""
        return FindNode(id_to_bytes(target), self.client_mode, self.addrs)

    def find_value_request(self, keys: Iterable[bytes], *, watch: bool = False) -> FindValue:
        """A FIND_VALUE for several keys (at most ``max_keys_per_request``); ``watch``: we cache the
        result, so holders forward us the keys' tombstones for a while."""
        return FindValue(tuple(keys), self.client_mode, self.addrs, watch)

    def on_reply(
        self, contact: Contact, request: Request, response: Response, now: float, *, rtt: float | None = None,
    ) -> list[PeerID]:
        """A well-formed reply came from ``contact`` (``rtt`` seconds after the request left, where
        the driver timed it: value lookups deal their peers to paths by it); returns peers to ping.

        Raises DHTMessageError if it does not answer ``request``, DHTRemoteError for an error reply
        (the peer is alive either way, so the routing table counts it as seen).
        """
        check_reply(request, response)
        ping = []
        client_mode = getattr(response, "client_mode", False)
        lru = self.table.update(contact, now, client_mode=client_mode, answered=True, rtt=rtt)
        if lru is not None:
            ping.append(lru)
        if isinstance(response, ErrorReply):
            raise DHTRemoteError(response.message, response.code)
        return ping

    def on_failure(self, peer: PeerID, now: float) -> None:
        """A request to ``peer`` failed: dial error, reset, timeout or malformed reply."""
        self.table.record_failure(peer, now)

    def on_silent(self, peers: Iterable[PeerID], now: float) -> None:
        """Requests to ``peers`` ran past a lookup's slot timeout (``Lookup.silent``): lookups
        route around them until they answer or speak to us (``RoutingTable.suspect``)."""
        for peer in peers:
            self.table.mark_silent(peer, now)

    def on_ping_result(self, peer: PeerID, ok: bool, now: float) -> None:
        """Outcome of a ping-before-evict."""
        self.table.on_ping_result(peer, ok, now)

    def lookup(self, target: int, now: float, *, count: int | None = None) -> Lookup:
        """A FIND_NODE lookup seeded from the routing table."""
        seeds = self.table.closest(target, self.config.k, now)
        return Lookup(target, seeds, self.config, now, local=self.local, count=count, suspect=self.table.suspect)

    def value_lookup(self, key: bytes, now: float, *, quorum: int | None = None) -> ValueLookup:
        """A FIND_VALUE lookup of ``key``, seeded from the routing table; our own records count too."""
        seeds = self.table.closest(key_id(key), self.config.k, now)
        lookup = ValueLookup(key, seeds, self.config, now, local=self.local, quorum=quorum, suspect=self.table.suspect,
                             rtt=self.table.rtt)
        for record in self.storage.get(key, now).values():
            held = lookup.records.get(record.subkey)
            if held is None or record.supersedes(held):
                lookup.records[record.subkey] = record
        return lookup

    def expire(self, now: float) -> list[PeerID]:
        """Housekeeping: collect expired records and settle overdue ping-before-evict checks."""
        self.storage.collect(now)
        return self.table.expire(now)
