"""The resource manager: what a peer may make this node hold, checked before it is held.

Modelled on go-libp2p's resource manager (p2p/host/resource-manager): a DAG of *scopes*, each
counting what is in use below it and refusing what would take it past its limit:

    system ─┬─ address (source IP: IPv4 /32, IPv6 /64)   pending handshakes, connections
            ├─ peer ── connection ── stream               memory, streams in/out, connections
            └─ protocol (system-wide and per peer)        inbound streams

Everything that buffers bytes for a peer reserves them from that peer's scope first (yamux
receive windows, each connection's control-frame outbox, relay circuit buffers); a reservation
is checked against the scope and all its ancestors at once, all or nothing. A refusal is counted
by the kind of scope that refused and a reason (``refusals()`` → ``{scope: {reason: count}}``)
and logged as at most one WARNING line per reason every ``warn_interval`` seconds.

Pure bookkeeping: no I/O, no clock (``now`` is passed in where a refusal may be logged). The
``ResourceManager`` is also a Host service, so ``host.service(ResourceManager)`` finds it.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from . import limits
from .ratelimit import RateLimiter
from .service import BaseService, HostAPI

if TYPE_CHECKING:
    from .multiaddr import Multiaddr

log = logging.getLogger(__name__)

MiB = 1024 * 1024
GiB = 1024 * MiB

# Resource names: the keys of a scope's counters and the reasons of refusals.
MEMORY = "memory"
STREAMS_INBOUND = "streams_inbound"
STREAMS_OUTBOUND = "streams_outbound"
CONNECTIONS = "connections"
HANDSHAKES = "pending_handshakes"

UNLIMITED = 1 << 62


@dataclass
class ResourceLimits:
    """Every bound of the resource manager, sized for a 24 GiB desktop volunteer and a small
    public relay (1-2 GiB of RAM to spare). Override any field; ``volunteer`` configs pass theirs."""

    # --- system: the whole node ---
    # A tenth of a 24 GiB desktop for network buffers; the rest is torch, the runtime and the OS.
    # A small relay (no torch) holds no more than this either: its circuits copy through fixed buffers.
    system_memory: int = 2 * GiB
    # Every peer at the 256 KiB initial window fills 4 GiB at 16384 streams: streams are cheap, memory binds first.
    system_streams_inbound: int = 16384
    system_streams_outbound: int = 16384
    system_connections: int = limits.MAX_CONNECTIONS
    # Handshakes cost CPU (X25519, signature checks) and a task each: 64 at once keeps a 2-core relay responsive.
    system_pending_handshakes: int = limits.MAX_PENDING_HANDSHAKES

    # --- source address (IPv4 /32, IPv6 /64) ---
    # One address may hold at most a quarter of the handshake slots: three more addresses must
    # collude to lock out a fourth. A NATed household dials a few at once, never 16.
    address_pending_handshakes: int = 16
    # A household behind one NAT runs a few volunteers and trainers; 64 connections is plenty for all.
    address_connections: int = 64

    # --- one peer (all its connections together) ---
    # Unread bytes of one peer: 8 streams with their full 16 MiB yamux window unread (a trainer's
    # concurrent expert calls at full speed, read by a busy runtime) plus 64 MiB for everything
    # else; ten such peers at their worst fill the system budget. Was unbounded (265 MiB and up).
    peer_memory: int = 192 * MiB
    peer_streams_inbound: int = 1024  # a trainer's batch fans out to at most a few hundred calls at once
    peer_streams_outbound: int = 1024
    peer_connections: int = 8  # direct + relayed + punched, and a few redials racing each other

    # --- protocols ---
    # One peer's inbound streams for one protocol (a misbehaving DHT client cannot starve experts).
    peer_protocol_streams_inbound: int = limits.MAX_INBOUND_STREAMS_PER_PROTOCOL
    # All peers' inbound streams for one protocol.
    protocol_streams_inbound: int = 8192

    # --- per connection ---
    # Reserved from the peer for each connection: the control-frame outbox bound (PING ACKs,
    # RSTs, window updates a peer makes us queue) plus one socket read.
    connection_memory: int = limits.YAMUX_MAX_CONTROL_OUTBOX + limits.READ_CHUNK

    # --- per stream ---
    stream_memory: int = limits.YAMUX_MAX_WINDOW  # unread bytes: never more than the largest yamux window

    # --- handshake fairness ---
    # A TCP connection whose first multistream message takes longer than this is a slowloris:
    # honest peers send it in their first packet (go-libp2p and we send header + /noise together).
    first_message_timeout: float = limits.FIRST_MESSAGE_TIMEOUT

    # --- logging ---
    warn_interval: float = limits.REFUSAL_WARN_INTERVAL  # seconds between WARNING lines per reason


def address_key(addr: "Multiaddr | str") -> str:
    """The source-address bucket of a remote multiaddr: an IPv4 address, an IPv6 /64, or the
    whole address for anything else (memory transport, relayed connections)."""
    from .multiaddr import Multiaddr

    addr = Multiaddr(addr) if isinstance(addr, str) else addr
    components = addr.components
    if components and components[0][0] == "ip4":
        return addr.value_at(0)
    if components and components[0][0] == "ip6":
        try:
            network = ipaddress.IPv6Network(f"{addr.value_at(0)}/64", strict=False)
        except ValueError:
            return addr.value_at(0)
        return str(network)
    return str(addr)


# A scope's key in the manager's table: its kind first ("address", "peer", "protocol",
# "peer-protocol"), then what names it (an address bucket, a peer ID, a protocol).
ScopeKey = tuple[object, ...]


class Scope:
    """Counters of one scope, with limits, and the parents every reservation is also checked against."""

    __slots__ = ("manager", "kind", "name", "limits", "used", "parents", "refs", "_key", "_chain")

    def __init__(
        self,
        manager: "ResourceManager",
        kind: str,
        name: str,
        scope_limits: dict[str, int],
        parents: tuple["Scope", ...] = (),
        key: ScopeKey | None = None,
    ) -> None:
        self.manager = manager
        self.kind = kind
        self.name = name
        self.limits = scope_limits
        self.used: dict[str, int] = {}
        self.parents = parents
        self.refs = 0  # child scopes alive: the scope lives while it has any
        self._key = key
        self._chain: list[Scope] | None = None
        for parent in parents:
            parent.refs += 1

    def __repr__(self) -> str:
        return f"Scope({self.kind}:{self.name} {self.used})"

    def chain(self) -> list["Scope"]:
        """This scope and all its ancestors, each once, nearest first (parents never change: cached)."""
        if self._chain is not None:
            return self._chain
        seen: list[Scope] = []
        todo = [self]
        while todo:
            scope = todo.pop(0)
            if scope not in seen:
                seen.append(scope)
                todo.extend(scope.parents)
        self._chain = seen
        return seen

    def reserve(self, resource: str, amount: int = 1, *, now: float) -> bool:
        """Take ``amount`` of ``resource`` here and in every ancestor, or nothing (and count a refusal)."""
        chain = self.chain()
        for scope in chain:
            if scope.used.get(resource, 0) + amount > scope.limits.get(resource, UNLIMITED):
                self.manager.refuse(scope.kind, resource, now=now, detail=scope.name)
                return False
        for scope in chain:
            scope.used[resource] = scope.used.get(resource, 0) + amount
        return True

    def release(self, resource: str, amount: int = 1) -> None:
        """Give back ``amount`` of ``resource`` taken with ``reserve``."""
        for scope in self.chain():
            left = scope.used.get(resource, 0) - amount
            if left < 0:
                raise AssertionError(f"{scope!r}: released more {resource} than reserved")
            scope.used[resource] = left

    def in_use(self, resource: str) -> int:
        return self.used.get(resource, 0)

    def close(self) -> None:
        """Drop this scope's link to its parents (after releasing what it holds)."""
        for resource, amount in list(self.used.items()):
            if amount:
                self.release(resource, amount)
        for parent in self.parents:
            parent.refs -= 1
            parent._maybe_forget()
        self.parents = ()
        self._chain = None

    def _maybe_forget(self) -> None:
        if self._key is not None and self.refs == 0 and not any(self.used.values()):
            self.manager._forget(self._key, self)


class StreamScope:
    """One yamux stream's resources: its stream slot, its receive window, and, once negotiated,
    its protocol slot. ``close`` gives everything back (idempotent). A ``yamux.StreamBudget``."""

    __slots__ = ("scope", "inbound", "protocol", "_protocol_scopes", "closed")

    def __init__(self, scope: Scope, inbound: bool) -> None:
        self.scope = scope
        self.inbound = inbound
        self.protocol: str | None = None
        self._protocol_scopes: tuple[Scope, ...] = ()
        self.closed = False

    def reserve_memory(self, amount: int, *, now: float) -> bool:
        """Reserve ``amount`` bytes this stream buffers (False, refusal counted, past a limit)."""
        return not self.closed and self.scope.reserve(MEMORY, amount, now=now)

    def release_memory(self, amount: int) -> None:
        """Give back ``amount`` bytes (read by the application); nothing once closed, since
        ``close`` gave everything back already."""
        if not self.closed:
            self.scope.release(MEMORY, amount)

    @property
    def memory(self) -> int:
        return self.scope.in_use(MEMORY)

    def set_protocol(self, protocol: str, *, now: float) -> bool:
        """Count this inbound stream against ``protocol``'s limits; False (refusal counted) past them."""
        if not self.inbound or self.protocol is not None or self.closed:
            return not self.closed
        manager = self.scope.manager
        scopes = (manager._protocol(protocol), manager._peer_protocol(self.scope, protocol))
        taken: list[Scope] = []
        for scope in scopes:
            if not scope.reserve(STREAMS_INBOUND, 1, now=now):
                for done in taken:
                    done.release(STREAMS_INBOUND, 1)
                for unused in scopes:
                    unused._maybe_forget()
                return False
            taken.append(scope)
        self.protocol = protocol
        self._protocol_scopes = scopes
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for scope in self._protocol_scopes:
            scope.release(STREAMS_INBOUND, 1)
            scope._maybe_forget()
        self._protocol_scopes = ()
        self.scope.close()


class ConnectionScope:
    """One connection's resources, below its peer: the fixed allotment for its control outbox and
    socket reads, and the streams opened on it. A ``yamux.ConnectionBudget``."""

    def __init__(self, scope: Scope, address: Scope | None, peer_scope: Scope) -> None:
        self.scope = scope
        self._address = address
        self._peer = peer_scope
        self.closed = False

    @property
    def peer_scope(self) -> Scope:
        return self._peer

    def refuse(self, reason: str, *, now: float) -> None:
        """Count a refusal this connection's own misbehaviour caused (a control-frame flood)."""
        self.scope.manager.refuse("connection", reason, now=now, detail=self.scope.name)

    def open_stream(self, inbound: bool, *, now: float) -> StreamScope | None:
        """A stream's scope with its stream slot reserved, or None (refused). The bytes it buffers
        are reserved as they arrive (``reserve_memory``) and released as they are read."""
        manager = self.scope.manager
        child = Scope(manager, "stream", self.scope.name, {MEMORY: manager.limits.stream_memory}, (self.scope,))
        if not child.reserve(STREAMS_INBOUND if inbound else STREAMS_OUTBOUND, 1, now=now):
            child.close()
            return None
        return StreamScope(child, inbound)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.scope.close()


class ResourceManager(BaseService):
    """Scopes, reservations and refusal counters for one node (see the module docstring).

    A Host service with no protocols that every Host runs: ``open_host`` installs a default one
    (sized by ``HostConfig``) unless it is given its own, and the Host asks it before every
    handshake, connection and stream. Its connection and stream scopes are the memory budgets
    yamux declares (``yamux.budget``).
    """

    def __init__(self, resource_limits: ResourceLimits | None = None) -> None:
        self.limits = resource_limits or ResourceLimits()
        lim = self.limits
        self.system = Scope(self, "system", "system", {
            MEMORY: lim.system_memory,
            STREAMS_INBOUND: lim.system_streams_inbound,
            STREAMS_OUTBOUND: lim.system_streams_outbound,
            CONNECTIONS: lim.system_connections,
            HANDSHAKES: lim.system_pending_handshakes,
        })
        self._scopes: dict[ScopeKey, Scope] = {}
        self._refusals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # One WARNING line per reason per interval: a flood must not turn into a log flood.
        self._warn_gate = RateLimiter(rate=1.0 / lim.warn_interval, burst=1, max_keys=256)
        self._suppressed: dict[str, int] = defaultdict(int)

    # --- refusals ----------------------------------------------------------------------------
    def refuse(self, scope: str, reason: str, *, now: float, detail: str = "") -> None:
        """Count a refusal by ``scope`` kind and ``reason``; log a WARNING if this reason has not
        been logged within ``warn_interval`` (with how many were not logged since)."""
        self._refusals[scope][reason] += 1
        if self._warn_gate.allow(reason, now=now):
            suppressed = self._suppressed.pop(reason, 0)
            more = f" ({suppressed} more refusals of this kind not logged)" if suppressed else ""
            log.warning("refused: %s limit of %s scope %s reached%s", reason, scope, detail, more)
        else:
            self._suppressed[reason] += 1

    def refusals(self) -> dict[str, dict[str, int]]:
        """Refusals since start, ``{scope: {reason: count}}`` (for `volunteer status --json` and metrics)."""
        return {scope: dict(reasons) for scope, reasons in self._refusals.items()}

    # --- handshakes --------------------------------------------------------------------------
    def open_handshake(self, remote: "Multiaddr | str", *, now: float) -> Scope | None:
        """A pending-handshake slot for a connection from ``remote`` (shared per source address),
        or None when the address's share or the global cap is taken. Close it with ``close_handshake``."""
        address = self._address(address_key(remote))
        if not address.reserve(HANDSHAKES, 1, now=now):
            address._maybe_forget()
            return None
        return address

    def close_handshake(self, address: Scope) -> None:
        address.release(HANDSHAKES, 1)
        address._maybe_forget()

    # --- connections -------------------------------------------------------------------------
    def open_connection(self, peer: object, remote: "Multiaddr | str", *, now: float) -> ConnectionScope | None:
        """Scope for a new connection to ``peer`` from ``remote``, its slots and allotment reserved; or None."""
        address = self._address(address_key(remote))
        peer_scope = self._peer(peer)
        conn = Scope(self, "connection", str(remote), {}, (peer_scope, address))
        if not conn.reserve(CONNECTIONS, 1, now=now) or not conn.reserve(MEMORY, self.limits.connection_memory, now=now):
            conn.close()
            return None
        return ConnectionScope(conn, address, peer_scope)

    def reserve_for_peer(
        self, peer: object, amount: int, *, kind: str, now: float, within: tuple[Scope, ...] = ()
    ) -> Scope | None:
        """Reserve ``amount`` bytes of ``peer``'s memory for a buffer outside yamux (a relay
        circuit's copy buffers, say); ``close()`` the returned scope to give them back (or
        ``reserve``/``release`` more on it as the buffer grows). ``within``: further scopes the
        bytes also count against (a service's own budget, as go-libp2p's service scopes). None
        (refusal counted) when the peer's, the node's or one of those budgets has no room."""
        scope = Scope(self, kind, _short(peer), {}, (self._peer(peer), *within))
        if not scope.reserve(MEMORY, amount, now=now):
            scope.close()
            return None
        return scope

    # --- views ---------------------------------------------------------------------------------
    def peer_memory(self, peer: object) -> int:
        """Bytes reserved for ``peer`` now (0 for a peer we hold nothing for)."""
        scope = self._scopes.get(("peer", peer))
        return scope.in_use(MEMORY) if scope is not None else 0

    @property
    def memory(self) -> int:
        """Bytes reserved for all peers now."""
        return self.system.in_use(MEMORY)

    def stat(self) -> dict:
        """What is in use now, system-wide, and the number of live address and peer scopes."""
        return {
            "system": dict(self.system.used),
            "addresses": sum(1 for key in self._scopes if key[0] == "address"),
            "peers": sum(1 for key in self._scopes if key[0] == "peer"),
        }

    # --- scope table ---------------------------------------------------------------------------
    def _address(self, key: str) -> Scope:
        return self._get(("address", key), "address", key, {
            HANDSHAKES: self.limits.address_pending_handshakes,
            CONNECTIONS: self.limits.address_connections,
        }, (self.system,))

    def _peer(self, peer: object) -> Scope:
        return self._get(("peer", peer), "peer", _short(peer), {
            MEMORY: self.limits.peer_memory,
            STREAMS_INBOUND: self.limits.peer_streams_inbound,
            STREAMS_OUTBOUND: self.limits.peer_streams_outbound,
            CONNECTIONS: self.limits.peer_connections,
        }, (self.system,))

    def _protocol(self, protocol: str) -> Scope:
        return self._get(("protocol", protocol), "protocol", protocol, {
            STREAMS_INBOUND: self.limits.protocol_streams_inbound,
        }, ())

    def _peer_protocol(self, stream_scope: Scope, protocol: str) -> Scope:
        peer_scope = next(s for s in stream_scope.chain() if s.kind == "peer")
        return self._get(("peer-protocol", peer_scope._key, protocol), "protocol", f"{protocol} of {peer_scope.name}", {
            STREAMS_INBOUND: self.limits.peer_protocol_streams_inbound,
        }, ())

    def _get(self, key: ScopeKey, kind: str, name: str, scope_limits: dict[str, int], parents: tuple[Scope, ...]) -> Scope:
        scope = self._scopes.get(key)
        if scope is None:
            scope = self._scopes[key] = Scope(self, kind, name, scope_limits, parents, key=key)
        return scope

    def _forget(self, key: ScopeKey, scope: Scope) -> None:
        if self._scopes.get(key) is scope:
            del self._scopes[key]
            for parent in scope.parents:
                parent.refs -= 1
            scope.parents = ()
            scope._chain = None

    # --- service -----------------------------------------------------------------------------
    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Nothing runs: the Host calls the manager synchronously. Kept for the Service interface."""
        self.host = host
        task_status.started()


def _short(peer: object) -> str:
    short = getattr(peer, "short", None)
    return short() if callable(short) else str(peer)


__all__ = [
    "CONNECTIONS",
    "HANDSHAKES",
    "MEMORY",
    "STREAMS_INBOUND",
    "STREAMS_OUTBOUND",
    "ConnectionScope",
    "ResourceLimits",
    "ResourceManager",
    "Scope",
    "StreamScope",
    "address_key",
]
