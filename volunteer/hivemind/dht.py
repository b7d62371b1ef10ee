"""A member of a hivemind 1.1 DHT, as a Host service: serves ``DHTProtocol.rpc_*`` and asks them.

    async with open_stack(keypair, listen=[...], services=[HivemindDHT()]) as host:
        dht = host.service(HivemindDHT)
        await dht.bootstrap(["/ip4/.../tcp/.../p2p/Qm..."])
        await dht.store("key", {"any": "msgpack"}, expiration_time=time.time() + 60)
        found = await dht.get("key")          # ValueWithExpiration of the decoded value

Values are what hivemind's ``DHT.store`` takes (msgpack-able objects, tuples kept apart); a
dictionary value's sub-keys are stored with ``subkey=``. The protocol logic is in
``dht_protocol`` and ``lookup`` (sans-I/O); this module only moves bytes and reads the clock.
Served requests pass the ``hivemind-dht`` door (``door.Door``: request bytes reserved per peer
and in all from the Host's resource manager, a minimum arrival rate), and what peers store is
charged to them in the storage (``storage.Storage``: per-peer quotas, largest holder loses first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from ..errors import VolunteerError, describe
from ..net.connection import NetStream
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import BaseService, Handler, HostAPI
from .dht_protocol import FIND, PING, STORE, DHTProtocolCore, FindAnswer, StoreItem, merge
from .dhtid import key_id, random_id
from .door import Door, door_for
from .kad import ensure_routable
from .errors import HivemindError
from .limits import DEFAULT_DHT_LIMITS, DHTLimits
from .lookup import Lookup
from .rpc import call_unary, serve_unary
from .serializer import DictionaryValue, MalformedValue, ValueWithExpiration, dumps, loads

log = logging.getLogger(__name__)

# hivemind stores each key on this many of the nearest nodes (DHTNode num_replicas)
NUM_REPLICAS = 5
# scope kinds of our refusals: the door's (request bytes, pace) and the storage's (quotas)
DOOR = "hivemind-dht"
STORAGE_SCOPE = "hivemind-storage"
MALFORMED_VALUE = "malformed_value"
_NO_SUBKEY = object()


class HivemindDHT(BaseService):
    """Our node in a hivemind DHT (see the module docstring). ``client_mode`` serves nothing and
    sends no node id, as hivemind's own client mode does; ``clock`` gives DHT time (seconds since
    the epoch, like hivemind's ``get_dht_time``)."""

    def __init__(
        self,
        *,
        node_id: int | None = None,
        client_mode: bool = False,
        limits: DHTLimits = DEFAULT_DHT_LIMITS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = DHTProtocolCore(
            node_id if node_id is not None else random_id(), limits, client_mode=client_mode,
            on_refusal=self._storage_refused,
        )
        self.limits = limits
        self.clock = clock
        self._door: Door | None = None  # the Host's resource manager is known once we run

    @property
    def node_id(self) -> int:
        """Our random 160-bit DHT id."""
        return self.core.node_id

    def handlers(self) -> Mapping[str, Handler]:
        if self.core.client_mode:
            return {}
        return {PING: self._serve_ping, STORE: self._serve_store, FIND: self._serve_find}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        self._door = door_for(host, DOOR, self.limits.door)
        task_status.started()

    @property
    def door(self) -> Door:
        """What hivemind DHT callers may make us hold (their request bytes, reserved as announced)."""
        if self._door is None:
            raise HivemindError("the hivemind DHT service is not running yet")
        return self._door

    def _storage_refused(self, reason: str) -> None:
        # counted with every other refusal (volunteer status --json, metrics); the storage keeps
        # its own count too
        if self._door is not None:
            self._door.manager.refuse(STORAGE_SCOPE, reason, now=trio.current_time())

    # --- serving ---------------------------------------------------------------------------

    async def _serve(self, stream: NetStream, answer: Callable[[bytes, PeerID], Awaitable[bytes]], timeout: float) -> None:
        door = self.door

        async def counted(data: bytes, sender: PeerID) -> bytes:
            try:
                return await answer(data, sender)
            except MalformedValue:
                door.refuse(MALFORMED_VALUE, sender, now=trio.current_time())
                raise

        await serve_unary(stream, counted, timeout=timeout, door=door)

    async def _serve_ping(self, stream: NetStream) -> None:
        async def answer(data: bytes, sender: PeerID) -> bytes:
            request, sender_node = self.core.parse_ping(data)
            available = False
            if request.validate and sender_node is not None:
                # hivemind asks us to check that we can reach it back under the node id it claims
                available = await self.ping(sender, validate=False) == sender_node
            return self.core.answer_ping(sender, sender_node, self.clock(), available=available)

        await self._serve(stream, answer, self.limits.rpc_timeout * 2)

    async def _serve_store(self, stream: NetStream) -> None:
        async def answer(data: bytes, sender: PeerID) -> bytes:
            return self.core.handle_store(data, sender, self.clock())

        await self._serve(stream, answer, self.limits.rpc_timeout)

    async def _serve_find(self, stream: NetStream) -> None:
        async def answer(data: bytes, sender: PeerID) -> bytes:
            return self.core.handle_find(data, sender, self.clock())

        await self._serve(stream, answer, self.limits.rpc_timeout)

    # --- asking one peer -------------------------------------------------------------------

    async def _call(self, peer: PeerID, protocol: str, data: bytes) -> bytes:
        # hivemind names nearest peers by id only: their addresses come from kad peer routing
        await ensure_routable(self.host, peer)
        return await call_unary(self.host, peer, protocol, data, timeout=self.limits.rpc_timeout)

    async def ping(self, peer: PeerID, *, validate: bool = False) -> int | None:
        """``peer``'s node id (and it joins our contacts), or None when it does not answer."""
        try:
            response = self.core.read_ping(peer, await self._call(peer, PING, self.core.ping_request(validate)))
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("hivemind ping to %s failed: %s", peer.short(), describe(exc))
            self.core.contacts.mark_failed(peer)
            return None
        return self.core.contacts.node_of(peer) if response.peer.node_id else None

    async def store_at(self, peer: PeerID, items: Sequence[StoreItem]) -> list[bool]:
        """Ask ``peer`` to keep ``items``; which it kept (raises when it does not answer)."""
        data = await self._call(peer, STORE, self.core.store_request(items))
        return self.core.read_store(peer, data, len(items))

    async def find_at(self, peer: PeerID, keys: Sequence[int]) -> list[FindAnswer]:
        """Ask ``peer`` for ``keys`` (key ids); what it holds and whom it knows nearer."""
        data = await self._call(peer, FIND, self.core.find_request(keys))
        return self.core.read_find(peer, data, keys)

    # --- the DHT -----------------------------------------------------------------------------

    async def bootstrap(self, addrs: Sequence[Multiaddr | str]) -> int:
        """Connect to and ping initial peers (``…/p2p/PEER`` multiaddrs); how many answered."""
        answered = 0
        for addr in addrs:
            try:
                conn = await self.host.connect(addr)
            except (VolunteerError, OSError, trio.TooSlowError) as exc:
                log.info("hivemind bootstrap peer %s unreachable: %s", addr, describe(exc))
                continue
            if await self.ping(conn.remote_peer) is not None:
                answered += 1
        return answered

    async def _lookup(self, target: int) -> Lookup:
        seeds = self.core.contacts.nearest(target, self.limits.bucket_size)
        lookup = Lookup(
            target, seeds, k=self.limits.bucket_size, alpha=self.limits.alpha,
            max_rounds=self.limits.max_lookup_rounds, local_id=self.node_id,
        )
        while batch := lookup.next_batch():
            async with trio.open_nursery() as nursery:
                for contact in batch:
                    nursery.start_soon(self._ask, lookup, contact.peer, target)
        return lookup

    async def _ask(self, lookup: Lookup, peer: PeerID, target: int) -> None:
        try:
            (answer,) = await self.find_at(peer, [target])
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("hivemind find at %s failed: %s", peer.short(), describe(exc))
            self.core.contacts.mark_failed(peer)
            lookup.on_failure(peer)
            return
        lookup.on_answer(peer, answer)

    async def store(self, key: Any, value: Any, expiration_time: float, *, subkey: Any = _NO_SUBKEY) -> bool:
        """Store ``value`` (msgpack-able) under ``key`` (and ``subkey`` of a dictionary value) on
        the nearest nodes and, unless in client mode, here; True when anyone kept it."""
        target = key_id(key)
        has_subkey = subkey is not _NO_SUBKEY
        packed = dumps(value)
        item = StoreItem(target, packed, expiration_time, subkey if has_subkey else None, has_subkey)
        stored = False
        if not self.core.client_mode:
            now = self.clock()
            if has_subkey:
                stored = self.core.storage.store_subkey(target, subkey, packed, expiration_time, now)
            else:
                stored = self.core.storage.store(target, packed, expiration_time, now)
        lookup = await self._lookup(target)
        results: list[bool] = []

        async def store_one(peer: PeerID) -> None:
            try:
                results.extend(await self.store_at(peer, [item]))
            except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("hivemind store at %s failed: %s", peer.short(), describe(exc))

        async with trio.open_nursery() as nursery:
            for contact in lookup.nearest(NUM_REPLICAS):
                nursery.start_soon(store_one, contact.peer)
        return stored or any(results)

    async def get(self, key: Any) -> ValueWithExpiration | None:
        """The freshest value under ``key`` here and at the nearest nodes, decoded (a dictionary
        value comes back as a DictionaryValue of decoded sub-values), or None."""
        target = key_id(key)
        lookup = await self._lookup(target)
        found = lookup.value
        local = self.core.storage.get(target, self.clock())
        if local is not None:
            found = merge(found, local)
        if found is None or found.expiration_time < self.clock():
            return None
        return decode(found)


def decode(found: ValueWithExpiration) -> ValueWithExpiration:
    """A stored value with its msgpack bytes decoded (sub-values of a dictionary too)."""
    if isinstance(found.value, DictionaryValue):
        decoded = DictionaryValue(maxsize=found.value.maxsize)
        for subkey, item in found.value.items.items():
            decoded.items[subkey] = ValueWithExpiration(loads(item.value), item.expiration_time)
        decoded.latest_expiration_time = found.value.latest_expiration_time
        return ValueWithExpiration(decoded, found.expiration_time)
    return ValueWithExpiration(loads(found.value), found.expiration_time)


__all__ = ["HivemindDHT", "HivemindError", "NUM_REPLICAS", "decode"]
