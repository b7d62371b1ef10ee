"""The sans-I/O heart of a DHT node: routing table + storage + request handling.

The trio driver (``node.py``) only moves bytes and time: for an inbound stream it reads one
length-prefixed body and calls ``handle``; for an outbound request it builds the request here,
sends ``encode_request(...)``, reads the reply and calls ``on_reply`` / ``on_failure``. Peers the
routing table wants pinged (ping-before-evict) come back from these calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import msgpack

from ..errors import DHTError, DHTMessageError, DHTRemoteError
from ..net.identity import PeerID
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
from .records import Record, Storage
from .routing import Contact, RoutingTable, id_from_bytes, id_to_bytes, key_id

_REPLY_OVERHEAD = 256  # map keys, op, list headers: a generous allowance when budgeting replies


@dataclass
class Handled:
    """Result of handling one inbound request: bytes to send back, peers to ping, the error if any."""

    reply: bytes
    ping: list[PeerID] = field(default_factory=list)
    error: DHTError | None = None


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

    # --- inbound ---------------------------------------------------------------------------
    def handle(self, sender: PeerID, body: bytes, now: float) -> Handled:
        """Answer one request body from ``sender`` (the stream's authenticated peer)."""
        try:
            request = decode_request(body, self.config)
        except DHTMessageError as exc:
            reply = encode_response(ErrorReply("malformed", exc.hint or str(exc)), self.config)
            return Handled(reply, [], exc)
        response, ping = self.handle_request(sender, request, now)
        return Handled(encode_response(response, self.config), ping)

    def handle_request(self, sender: PeerID, request: Request, now: float) -> tuple[Response, list[PeerID]]:
        """Answer a decoded request; the sender joins the routing table unless in client mode."""
        ping = []
        lru = self.table.update(Contact(sender, request.addrs), now, client_mode=request.client_mode)
        if lru is not None:
            ping.append(lru)
        cm = self.client_mode
        if isinstance(request, Ping):
            return Pong(cm), ping
        if isinstance(request, Store):
            return Stored(tuple(self.storage.store_many(request.records, now)), cm), ping
        if isinstance(request, FindNode):
            target = id_from_bytes(request.target)
            closer = self.table.closest(target, self.config.reply_contacts, now, exclude=[sender], responsive_only=True)
            return Nodes(tuple(closer), cm), ping
        if isinstance(request, FindValue):
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

    def store_request(self, records: Iterable[Record]) -> Store:
        """A STORE of ``records`` (at most ``max_records_per_request``)."""
        return Store(tuple(records), self.client_mode, self.addrs)

    def find_node_request(self, target: int) -> FindNode:
        """A FIND_NODE for a 256-bit ID."""
        return FindNode(id_to_bytes(target), self.client_mode, self.addrs)

    def find_value_request(self, keys: Iterable[bytes]) -> FindValue:
        """A FIND_VALUE for several keys (at most ``max_keys_per_request``)."""
        return FindValue(tuple(keys), self.client_mode, self.addrs)

    def on_reply(self, contact: Contact, request: Request, response: Response, now: float) -> list[PeerID]:
        """A well-formed reply came from ``contact``; returns peers to ping.

        Raises DHTMessageError if it does not answer ``request``, DHTRemoteError for an error reply
        (the peer is alive either way, so the routing table counts it as seen).
        """
        check_reply(request, response)
        ping = []
        client_mode = getattr(response, "client_mode", False)
        lru = self.table.update(contact, now, client_mode=client_mode)
        if lru is not None:
            ping.append(lru)
        if isinstance(response, ErrorReply):
            raise DHTRemoteError(response.message, response.code)
        return ping

    def on_failure(self, peer: PeerID, now: float) -> None:
        """A request to ``peer`` failed: dial error, reset, timeout or malformed reply."""
        self.table.record_failure(peer, now)

    def on_ping_result(self, peer: PeerID, ok: bool, now: float) -> None:
        """Outcome of a ping-before-evict."""
        self.table.on_ping_result(peer, ok, now)

    def lookup(self, target: int, now: float, *, count: int | None = None) -> Lookup:
        """A FIND_NODE lookup seeded from the routing table."""
        seeds = self.table.closest(target, self.config.k, now)
        return Lookup(target, seeds, self.config, now, local=self.local, count=count)

    def value_lookup(self, key: bytes, now: float, *, quorum: int | None = None) -> ValueLookup:
        """A FIND_VALUE lookup of ``key``, seeded from the routing table; our own records count too."""
        seeds = self.table.closest(key_id(key), self.config.k, now)
        lookup = ValueLookup(key, seeds, self.config, now, local=self.local, quorum=quorum)
        for record in self.storage.get(key, now).values():
            held = lookup.records.get(record.subkey)
            if held is None or record.supersedes(held):
                lookup.records[record.subkey] = record
        return lookup

    def expire(self, now: float) -> list[PeerID]:
        """Housekeeping: collect expired records and settle overdue ping-before-evict checks."""
        self.storage.collect(now)
        return self.table.expire(now)
