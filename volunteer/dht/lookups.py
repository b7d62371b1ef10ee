"""Reading the DHT: iterative lookups of a DHTNode (``find_closest``, ``get_many``, ``get``,
``held_elsewhere``), driven over the node's requests.

``LookupMixin`` is one of DHTNode's bases, as ``storing.StoreMixin`` is: the lookups themselves
are the sans-I/O state machines of ``query.py``; this module asks their questions concurrently,
wakes them on answers and deadlines, and runs the requests in the node's nursery while it runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Sequence, TypeVar

import trio

from ..errors import VolunteerError
from ..net.identity import PeerID
from .caches import ClosestPeers, RecentValues
from .messages import Nodes, Values
from .query import Lookup, ValueLookup
from .records import Record
from .routing import Contact, key_id

if TYPE_CHECKING:
    from .config import DHTConfig
    from .messages import Request, Response
    from .state import NodeState

log = logging.getLogger(__name__)


# a lookup's kind (FIND_NODE, or FIND_VALUE over its disjoint paths) carries through _drive to the
# dispatch that asks for it
AnyLookup = TypeVar("AnyLookup", bound=Lookup | ValueLookup)
Asker = Callable[[Contact], Awaitable[None]]


class LookupMixin:
    """Lookups for DHTNode (which supplies host, config, state, clock, caches, ``request`` and
    the nursery its service runs in)."""

    host: Any
    config: "DHTConfig"
    state: "NodeState"
    clock: Callable[[], float]
    closest_peers: ClosestPeers
    recent_values: RecentValues
    _nursery: trio.Nursery | None

    if TYPE_CHECKING:

        async def request(self, contact: Contact, request: "Request") -> "Response": ...

    async def find_closest(self, key_or_target: bytes | int, *, count: int | None = None, via=None) -> list[Contact]:
        """The ``count`` (default k) closest live peers to a key (bytes) or 256-bit ID (int).

        ``via(contact)``: None (send a FIND_NODE) or an awaitable of the closer contacts, for a
        question asked some other way (``store_many``: a STORE that answers as a FIND_NODE)."""
        target = key_id(key_or_target) if isinstance(key_or_target, bytes) else key_or_target
        lookup = self.state.lookup(target, self.clock(), count=count)
        request = self.state.find_node_request(target)

        async def ask(contact: Contact) -> None:
            try:
                answer = via(contact) if via is not None else None
                if answer is None:
                    response = await self.request(contact, request)
                    assert isinstance(response, Nodes)
                    answer_peers = response.peers
                else:
                    answer_peers = await answer
            except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                lookup.on_failure(contact.peer, self.clock())
            else:
                lookup.on_success(contact.peer, answer_peers, self.clock())

        await self._drive([lookup], lambda asked: [(c, ask) for _, contacts in asked for c in contacts])
        return lookup.result()

    def _spawner(self, fallback: trio.Nursery):
        """Where a lookup's requests run: the node's nursery while it runs (so a finished lookup
        does not wait for its stragglers), else ``fallback`` (the node stopping or stopped)."""
        ours = self._nursery
        if ours is None or ours.cancel_scope.cancel_called:
            return fallback.start_soon
        return ours.start_soon

    async def _drive(
        self,
        lookups: Sequence[AnyLookup],
        dispatch: Callable[[list[tuple[AnyLookup, list[Contact]]]], Iterable[tuple[Contact, Asker]]],
    ) -> None:
        """Run lookups until all finish. Each round, ``dispatch([(lookup, contacts it asks now)])``
        returns ``(contact, ask)`` pairs to start; an answer wakes the loop for the next round.

        Requests run in the node's nursery: when the lookups finish, those still out are
        cancelled, which lands on their receive (``_exchange`` shields opening and sending: a
        write cut off mid-frame breaks the whole connection), and the lookups return without
        waiting for a slow dial or send to end."""
        woken = trio.Event()
        late: set[trio.CancelScope] = set()
        async with trio.open_nursery() as nursery:
            spawn = self._spawner(nursery)

            async def run(ask, contact) -> None:
                scope = trio.CancelScope()
                late.add(scope)
                try:
                    with scope:
                        await ask(contact)
                finally:
                    late.discard(scope)
                    woken.set()

            while True:
                now = self.clock()
                asked = [(lookup, lookup.next(now)) for lookup in lookups]
                for lookup in lookups:
                    # past their slot timeout: later lookups route around them (RoutingTable.suspect)
                    self.state.on_silent(lookup.silent(), now)
                for contact, ask in dispatch([pair for pair in asked if pair[1]]):
                    spawn(run, ask, contact)
                if all(lookup.finished for lookup in lookups):
                    break
                deadlines = [d for d in (lookup.next_deadline() for lookup in lookups) if d is not None]
                wait = max(0.0, min(deadlines) - now) if deadlines else 0.0
                with trio.move_on_after(wait + 1e-3):
                    await woken.wait()
                woken = trio.Event()
            for scope in late:
                scope.cancel()  # late answers no longer change the result
            nursery.cancel_scope.cancel()

    async def get_many(
        self,
        keys: Iterable[bytes],
        *,
        quorum: int | None = None,
        latest: bool = True,
        max_age: float = 0.0,
        tombstones: bool = False,
    ) -> dict[bytes, dict[bytes, Record]]:
        """Live records (tombstones left out) of each key, newest per sub-key.

        ``tombstones=True`` keeps the unexpired tombstones among them (who withdrew a record
        matters to a receiver of a leaver's hand-off); such a lookup always asks the network and
        is not remembered for ``max_age``.

        ``latest=False`` accepts any live value: keys this node holds are answered without asking
        the network (hivemind's default). Expert lookups always ask (``latest=True``), so they see
        tombstones and fresh heartbeats of every host.

        ``max_age`` > 0 reuses this node's own lookup result for a key if it is at most that many
        seconds old (a beam search every training step asks for the same grid prefixes): what it
        returns is then at most ``max_age`` staler than a fresh lookup, never expired.

        All keys are looked up together: a peer that several keys' lookups ask in the same round
        gets one FIND_VALUE for all of them. With ``max_age`` > 0 those requests ask the holders
        to forward us the keys' tombstones for ``watch_age`` (``watch.py``), so a withdrawal drops
        the cached result at once; ``max_age`` beyond ``watch_age`` loses that guarantee.
        """
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        now = self.clock()
        generation = self.recent_values.generation
        found: dict[bytes, dict[bytes, Record]] = {}
        if tombstones:
            latest, max_age = True, 0.0
        if not latest:
            # any live value will do (hivemind's default): keys we hold are answered locally
            for key in keys:
                held = {sub: rec for sub, rec in self.state.storage.get(key, now).items() if rec.value is not None}
                if held:
                    found[key] = held
            keys = [key for key in keys if key not in found]
        if max_age > 0:
            for key in keys:
                recent = self.recent_values.get(key, now, max_age)
                if recent is not None:
                    found[key] = recent
            keys = [key for key in keys if key not in found]
        if not keys:
            return found
        lookups = {key: self.state.value_lookup(key, now, quorum=quorum) for key in keys}
        batch = self.config.max_keys_per_request

        def dispatch(asked: list[tuple[ValueLookup, list[Contact]]]) -> list[tuple[Contact, Asker]]:
            by_peer: dict[PeerID, tuple[Contact, list[bytes]]] = {}
            for lookup, contacts in asked:
                for contact in contacts:
                    by_peer.setdefault(contact.peer, (contact, []))[1].append(lookup.key)
            return [
                (contact, self._value_asker(wanted[i : i + batch], lookups, watch=max_age > 0))
                for contact, wanted in by_peer.values()
                for i in range(0, len(wanted), batch)
            ]

        await self._drive(list(lookups.values()), dispatch)
        now = self.clock()
        for key, lookup in lookups.items():
            if tombstones:
                found[key] = dict(lookup.live_records(now))
                continue
            found[key] = {sub: rec for sub, rec in lookup.live_records(now).items() if rec.value is not None}
            self.recent_values.put(key, found[key], now, since=generation)
        return found

    def _value_asker(self, keys: list[bytes], lookups: dict[bytes, ValueLookup], *, watch: bool = False) -> Asker:
        request = self.state.find_value_request(keys, watch=watch)

        async def ask(contact: Contact) -> None:
            try:
                response = await self.request(contact, request)
            except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                for key in keys:
                    lookups[key].on_failure(contact.peer, self.clock())
                return
            assert isinstance(response, Values)
            now = self.clock()
            for key, result in zip(keys, response.results):
                lookups[key].on_success(contact.peer, result.closer, now, result.records)

        return ask

    async def held_elsewhere(self, key: bytes, subkey: bytes, *, ask: int = 3) -> int:
        """How many of the ``ask`` peers closest to ``key`` hold a live ``subkey`` record under
        it: what a trainer's lookup would find, without our own storage (which ``get`` counts).
        A daemon checks with it that its declarations are visible to others."""
        contacts = [c for c in await self.find_closest(key) if c.peer != self.host.peer_id][:ask]
        request = self.state.find_value_request([key])
        holders = 0

        async def one(contact: Contact) -> None:
            nonlocal holders
            try:
                response = await self.request(contact, request)
            except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            now = self.clock()
            if isinstance(response, Values) and response.results and any(
                r.subkey == subkey and r.value is not None and r.expiration > now for r in response.results[0].records
            ):
                holders += 1

        async with trio.open_nursery() as nursery:
            for contact in contacts:
                nursery.start_soon(one, contact)
        return holders

    async def get(self, key: bytes, *, quorum: int | None = None, latest: bool = True) -> dict[bytes, Record]:
        """Live records under ``key`` by sub-key (see ``get_many``)."""
        return (await self.get_many([key], quorum=quorum, latest=latest))[bytes(key)]

