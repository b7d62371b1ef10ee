"""Writing records: ``store`` and ``store_many`` of a DHTNode (split from ``node.py``).

``StoreMixin`` is one of DHTNode's bases and uses its state, caches and requests; what goes where
is ``caches.StorePlan`` (pure). A store to one key asks its lookup's questions of the peers it
stores on with the STORE itself (``messages``: ``nr``), so the peers it writes to are asked once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import trio

from ..errors import DHTError, VolunteerError, describe
from .caches import ClosestPeers, RecentValues, StorePlan, chunks
from .config import DHTConfig
from .messages import Stored
from .records import OK, STALE, sign
from .routing import Contact, key_id

if TYPE_CHECKING:
    from .messages import Request, Response
    from .state import NodeState

log = logging.getLogger(__name__)

Item = tuple[bytes, bytes, "bytes | None", float]  # (key, sub-key, value or None, expiration)


class StoreMixin:
    """``store`` / ``store_many`` for DHTNode (which supplies host, config, state, clock, caches,
    ``request`` and ``find_closest``)."""

    host: Any
    config: DHTConfig
    state: "NodeState"
    clock: Callable[[], float]
    closest_peers: ClosestPeers
    recent_values: RecentValues
    _own: dict[tuple[bytes, bytes], Item]

    if TYPE_CHECKING:

        async def request(self, contact: Contact, request: "Request") -> "Response": ...

        async def find_closest(self, key_or_target: bytes | int, *, count: int | None = None, via=None) -> list[Contact]: ...

    async def store(
        self, key: bytes, value: bytes | None, expiration: float, *, subkey: bytes = b"", republish: bool = False
    ) -> int:
        """Sign and store one record under our own sub-key (PeerID bytes + ``subkey``); returns how
        many peers (ourselves included) accepted it. ``value=None`` writes a tombstone."""
        item = (bytes(key), self.host.peer_id.to_bytes() + bytes(subkey), value, float(expiration))
        if republish:
            self._own[item[:2]] = item
        accepted = await self.store_many([item])
        return accepted[0]

    async def store_many(
        self, items: Sequence[Item], *, cached_peers: bool = False, replicas: int | None = None
    ) -> list[int]:
        """Sign and store records on the closest peers of each key (and locally); one STORE per peer
        carries every record bound for it. Returns, per item, how many copies were accepted.

        With ``cached_peers`` a key's closest peers from a lookup less than ``caches.PEER_CACHE_AGE``
        ago are reused: heartbeats re-declare to the same peers without a lookup each time.
        ``replicas`` (default ``store_replicas``) is how many of the closest peers get each record.
        """
        replicas = replicas or self.config.store_replicas
        now = self.clock()
        plan = StorePlan([sign(self.host.keypair, *item) for item in items])
        for i, record in enumerate(plan.records):
            try:
                if self.state.storage.store(record, now, checked=True):  # signed by us just now
                    plan.on_accepted([i])
            except DHTError as exc:
                log.debug("local store of %r refused: %s", record.key, describe(exc))
        keys = plan.keys
        for key in keys:
            self.recent_values.forget(key)  # our own write (a tombstone on leave) shows at once

        async def send(contact: Contact, indices: list[int]) -> None:
            for part in chunks(indices, self.config.max_records_per_request):
                try:
                    response = await self.request(contact, self.state.store_request(plan.records[i] for i in part))
                except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    for key in {plan.records[i].key for i in part}:
                        self.closest_peers.forget(key)  # look again next time
                    log.debug("STORE to %s failed: %s", contact.peer.short(), describe(exc))
                    return
                assert isinstance(response, Stored)
                plan.on_accepted(i for i, code in zip(part, response.codes) if code in (OK, STALE))

        def deliver(nursery: trio.Nursery, targets: dict[bytes, list[Contact]]) -> None:
            for contact, indices in plan.deliver(targets):
                nursery.start_soon(send, contact, indices)

        async def store_asking(contact: Contact, indices: list[int], near: int) -> tuple[Contact, ...]:
            # one STORE that is also the lookup's FIND_NODE to this peer (messages: "nr")
            request = self.state.store_request((plan.records[i] for i in indices), near=near)
            try:
                response = await self.request(contact, request)
            except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                self.closest_peers.forget(plan.records[indices[0]].key)
                raise
            assert isinstance(response, Stored)
            plan.on_accepted(i for i, code in zip(indices, response.codes) if code in (OK, STALE))
            return response.closer

        async def locate(key: bytes, located: dict[bytes, list[Contact]], optimistic: list[Contact] | None = None) -> None:
            via = None
            if optimistic is not None:  # the peers we would store on anyway answer the lookup too
                chosen = {c.peer for c in optimistic}

                def via(contact: Contact):
                    sends = plan.deliver({key: [contact]}) if contact.peer in chosen else []
                    if not sends or len(sends[0][1]) > self.config.max_records_per_request:
                        return None
                    return store_asking(contact, sends[0][1], key_id(key))

            located[key] = await self.find_closest(key, count=replicas, via=via)
            self.closest_peers.put(key, located[key], now)

        located: dict[bytes, list[Contact]] = {}
        async with trio.open_nursery() as nursery:
            cached = {}
            if cached_peers:
                for key in keys:
                    peers = self.closest_peers.get(key, now)
                    if peers is not None:
                        cached[key] = peers
            deliver(nursery, cached)
            unknown = [key for key in keys if key not in cached]
            if len(keys) == 1 and unknown:
                # one key (a generic store): the lookup's questions to the closest peers we know
                # are the STOREs themselves, then the closer ones it finds get theirs (13 -> ~8
                # requests a store at 32 nodes)
                key = keys[0]
                optimistic = self.state.table.closest(key_id(key), replicas, now)
                await locate(key, located, optimistic)
                deliver(nursery, {key: optimistic})  # any the lookup did not get to ask
                deliver(nursery, located)
            elif unknown:
                # the closest peers we know now while the lookups run, then the closer ones found
                deliver(nursery, {key: self.state.table.closest(key_id(key), replicas, now) for key in unknown})
                async with trio.open_nursery() as lookups:
                    for key in unknown:
                        lookups.start_soon(locate, key, located)
                deliver(nursery, located)
        return plan.accepted


__all__ = ["Item", "StoreMixin"]
