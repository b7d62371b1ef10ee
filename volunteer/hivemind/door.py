"""What hivemind callers may make us hold: one ``Door`` per hivemind service that serves requests
(the DHT, the experts, kad), under the Host's resource manager.

go-libp2p's resource manager is the model: a service has a scope of its own and a scope per peer
below it (its *service* and *service-peer* scopes; here with a scope per source address between
them, as our own DHT's storage groups holders by address: peer ids are free, addresses are not),
and a request's bytes are reserved, as its length is announced and before its body is read, in
the peer's scope (which also holds the peer's yamux windows), the service's peer, address and
own scopes and the system's, all or nothing:

    system ─┬─ peer ──────────────────────────────────────────────────────┐
            └─ hivemind-dht ── hivemind-dht-address ── hivemind-dht-peer ──┴─ one request's bytes

A refusal is counted by the resource manager under the kind of the scope that had no room
(``hivemind-dht-peer: memory``: that peer's share is taken; ``hivemind-dht: memory``: all peers'
share is), like every other refusal in ``volunteer status --json`` and the metrics, and so are the
door's own refusals (``slow_body``: a request that stopped arriving; ``slow_reader``: a caller
that stopped reading its answer; ``evicted``: a call dropped because all peers' share was full
and its address held the most, as our DHT's storage makes room: the largest holder loses first;
what the service reports). The door also says how fast a request must arrive (``pace``, a
``framing.BodyPace``) and how long each part of an answer may wait for its reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from ..net.identity import PeerID
from ..net.resources import MEMORY, ResourceManager, Scope, address_key
from ..net.service import HostAPI
from .errors import HivemindBusy
from .framing import BodyPace
from .limits import DoorLimits

if TYPE_CHECKING:
    from ..net.multiaddr import Multiaddr

# Refusal reasons the door counts besides the resource manager's memory refusals.
PEER_REQUEST_BYTES = "peer_request_bytes"
ADDRESS_REQUEST_BYTES = "address_request_bytes"
TOTAL_REQUEST_BYTES = "total_request_bytes"
PEER_MEMORY = "peer_memory"
SLOW_BODY = "slow_body"  # a request that stopped arriving
SLOW_READER = "slow_reader"  # a caller that stopped reading its answer
EVICTED = "evicted"  # a call dropped to make room for a smaller holder's


class Reservation:
    """The request bytes one served call holds: ``grow`` reserves more as lengths are announced
    (raising ``HivemindBusy``, with nothing more held, past a budget); ``release`` gives all back.
    ``evict``: how the call's driver drops the call when the door takes its room for a smaller
    holder (None: the call cannot be dropped)."""

    def __init__(self, door: "Door", peer: PeerID, address: str) -> None:
        self.door = door
        self.peer = peer
        self.address = address
        self.held = 0
        self.evict: Callable[[], None] | None = None
        self.evicted = False
        self._scope: Scope | None = None

    def grow(self, nbytes: int, now: float) -> None:
        """Reserve ``nbytes`` more at ``now`` (the resource manager's clock, for its log gate;
        nothing for ``nbytes`` <= 0)."""
        if nbytes <= 0:
            return
        door = self.door
        if self._scope is None:
            share = door._share(self.peer, self.address)
            self._scope = door.manager.reserve_for_peer(self.peer, nbytes, kind=door.name, now=now, within=(share,))
            if self._scope is None:
                door._refused(self.peer, nbytes)
            door._live.setdefault(self.address, {})[self] = None
        elif not self._scope.reserve(MEMORY, nbytes, now=now):
            door._refused(self.peer, nbytes)
        self.held += nbytes

    def release(self) -> None:
        """Give back everything this call reserved (idempotent)."""
        if self._scope is not None:
            self._scope.close()
            self._scope = None
            self.door._unshare(self.peer)
            self.door._released(self)
        self.held = 0


class Door:
    """Budgets, pace and refusal counts of one hivemind service's inbound requests.

    ``name`` is the service's scope kind (``hivemind-dht``); ``limits`` say how many request
    bytes each peer may hold at once, each source address (all the peers dialling from it: new
    identities are free, addresses are not) and all peers, how large one request may be, and how
    fast a request must arrive and its answer be read (``pace``)."""

    def __init__(self, manager: ResourceManager, name: str, limits: DoorLimits) -> None:
        if not 0 < limits.per_peer <= limits.per_address <= limits.total:
            raise ValueError("a Door needs 0 < per_peer <= per_address <= total")
        self.manager = manager
        self.name = name
        self.limits = limits
        self.scope = Scope(manager, name, "all peers", {MEMORY: limits.total}, (manager.system,))
        # shares live while a call holds a reservation: the tables are bounded by calls in flight
        self._peers: dict[PeerID, Scope] = {}
        self._addresses: dict[str, Scope] = {}
        self._live: dict[str, dict[Reservation, None]] = {}  # by address, oldest first
        self._listeners: list[Callable[[], None]] = []
        self.refusals: Counter[str] = Counter()

    @property
    def max_request(self) -> int:
        """The largest unary request the door lets in."""
        return self.limits.max_request

    @property
    def held(self) -> int:
        """Request bytes reserved now, all peers together."""
        return self.scope.in_use(MEMORY)

    def held_by(self, peer: PeerID) -> int:
        """Request bytes ``peer``'s calls hold now."""
        share = self._peers.get(peer)
        return share.in_use(MEMORY) if share is not None else 0

    def open(self, peer: PeerID, remote: "Multiaddr | str") -> Reservation:
        """An empty reservation for one call of ``peer`` connected from ``remote`` (``grow`` it
        as lengths are announced)."""
        return Reservation(self, peer, address_key(remote))

    def pace(self, now: float) -> BodyPace:
        """The pace a request starting at ``now`` must keep."""
        return BodyPace(self.limits.min_rate, self.limits.grace, now)

    def refuse(self, reason: str, peer: PeerID, *, now: float) -> None:
        """Count a refusal of ``peer``'s request for ``reason`` (here and in the resource manager)."""
        self.refusals[reason] += 1
        self.manager.refuse(self.name, reason, now=now, detail=peer.short())

    # --- the largest holder loses first ----------------------------------------------------------
    def evict_for(self, reservation: Reservation, nbytes: int, *, now: float) -> bool:
        """All peers' share is full and ``reservation`` needs ``nbytes`` more: drop the newest calls
        of the source address that holds the most, if it holds more than ``reservation``'s would
        with them (as our DHT's storage makes room: one address cannot keep everyone else out
        by filling the total). Whether any call was dropped; their room comes back as their
        drivers unwind (``listen``)."""
        needed = self.held + nbytes - self.limits.total
        mine = self._address_held(reservation.address) + nbytes
        ranked = sorted(
            ((self._address_held(address), address) for address in self._live if address != reservation.address),
            reverse=True,
        )
        if needed <= 0 or not ranked or ranked[0][0] <= mine:
            return False
        _, victim = ranked[0]
        dropped = False
        for call in reversed(list(self._live[victim])):
            if needed <= 0:
                break
            if call.evict is None or call.evicted:
                continue
            call.evicted = True
            needed -= call.held
            call.evict()
            self.refuse(EVICTED, call.peer, now=now)
            dropped = True
        return dropped

    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time a reservation is released."""
        self._listeners.append(callback)

    def _released(self, reservation: Reservation) -> None:
        calls = self._live.get(reservation.address)
        if calls is not None:
            calls.pop(reservation, None)
            if not calls:
                del self._live[reservation.address]
        listeners, self._listeners = self._listeners, []
        for callback in listeners:
            callback()

    def _address_held(self, address: str) -> int:
        share = self._addresses.get(address)
        return share.in_use(MEMORY) if share is not None else 0

    # --- shares ----------------------------------------------------------------------------------
    def _share(self, peer: PeerID, address: str) -> Scope:
        """``peer``'s share, below its address's share (a peer calling from two addresses at once
        stays in the share of the first)."""
        share = self._peers.get(peer)
        if share is None:
            parent = self._addresses.get(address)
            if parent is None:
                parent = self._addresses[address] = Scope(
                    self.manager, f"{self.name}-address", address, {MEMORY: self.limits.per_address}, (self.scope,)
                )
            share = self._peers[peer] = Scope(
                self.manager, f"{self.name}-peer", peer.short(), {MEMORY: self.limits.per_peer}, (parent,)
            )
        return share

    def _unshare(self, peer: PeerID) -> None:
        share = self._peers.get(peer)
        if share is None or share.refs:
            return
        (parent,) = share.parents
        share.close()
        del self._peers[peer]
        if not parent.refs:
            parent.close()
            del self._addresses[parent.name]

    def _refused(self, peer: PeerID, nbytes: int) -> NoReturn:
        """Count why ``nbytes`` more for ``peer`` did not fit, and raise HivemindBusy."""
        share = self._peers[peer]
        (address,) = share.parents
        if share.in_use(MEMORY) + nbytes > self.limits.per_peer:
            reason = PEER_REQUEST_BYTES
        elif address.in_use(MEMORY) + nbytes > self.limits.per_address:
            reason = ADDRESS_REQUEST_BYTES
        elif self.held + nbytes > self.limits.total:
            reason = TOTAL_REQUEST_BYTES
        else:
            reason = PEER_MEMORY  # the peer's own connection buffers, or the whole node, are full
        self._unshare(peer)  # unless another of its calls still holds some
        self.refusals[reason] += 1
        raise HivemindBusy(f"{self.name}: request bytes in flight are at their limit ({reason})", reason)


def door_for(host: HostAPI, name: str, limits: DoorLimits) -> Door:
    """A ``Door`` named ``name`` under ``host``'s resource manager. A Host always runs one; one
    built by hand without it gets a manager of the door's own, so the budgets still hold (only
    the node-wide ones are then not shared)."""
    manager = host.service(ResourceManager)
    if manager is None:
        manager = ResourceManager()
    return Door(manager, name, limits)


__all__ = ["ADDRESS_REQUEST_BYTES", "Door", "EVICTED", "door_for", "PEER_MEMORY", "PEER_REQUEST_BYTES", "Reservation", "SLOW_BODY", "SLOW_READER", "TOTAL_REQUEST_BYTES"]
