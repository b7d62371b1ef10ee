"""How a Host reaches a peer that has several addresses: staggered parallel dials ("happy
eyeballs", RFC 8305: IPv6 and IPv4 take turns), direct addresses before relayed ones, the first
connection wins.

A peer behind NAT advertises LAN addresses that never answer; waiting for each to time out would
delay the relay for tens of seconds, so each attempt starts a little after the previous one (at
once when the previous one has failed). An address of a family this machine has no address to
send from (an IPv6 one from an IPv4-only home) is not tried at all (``routable``): its attempt
would only hold up the next one. ``dial_one`` is the Host's single-address dial, so this
module holds no connection state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from ..errors import DialError, VolunteerError, describe
from . import limits
from .connection import Connection
from .addresses import LOOPBACK, PRIVATE, PUBLIC, ip_scope, scope_of
from .identity import PeerID
from .interfaces import own_ips
from .multiaddr import Multiaddr
from .transport.base import Path

log = logging.getLogger(__name__)

DialOne = Callable[[Multiaddr, PeerID], Awaitable[Connection]]


def routable(addr: Multiaddr, own: Sequence[str]) -> bool:
    """Whether this machine, with interface addresses ``own``, has a source address to reach
    ``addr`` from: loopback always; a global IPv6 address only from a global IPv6 one (a LAN's
    unique-local or link-local source reaches no internet), a unique-local one from any
    routable IPv6 one, an IPv4 one from any IPv4 address beside loopback. Addresses that name no
    IP (memory, DNS) are routable; a relayed one is judged by its relay's address."""
    scope = scope_of(addr)
    if scope is None or scope == LOOPBACK:
        return True
    own_scopes = {(":" in ip, ip_scope(ip)) for ip in own}
    if addr.components[0][0] == "ip6":
        if scope == PUBLIC:
            return (True, PUBLIC) in own_scopes
        return (True, PUBLIC) in own_scopes or (True, PRIVATE) in own_scopes
    return (False, PUBLIC) in own_scopes or (False, PRIVATE) in own_scopes


def _is_quic(addr: Multiaddr) -> bool:
    return "quic-v1" in addr.protocols() and not addr.is_relayed()


def dial_order(peer: PeerID, addrs: Sequence[Multiaddr]) -> list[Multiaddr]:
    """The addresses to try, in order: each once, direct TCP, then direct QUIC, then relayed, at
    most MAX_DIAL_ADDRS (our QUIC costs several times TCP's CPU per byte: it is for peers, and
    hole punches, that TCP cannot reach); within each, IPv6 and IPv4 take turns.

    Relayed addresses are advertised as ``…/p2p/RELAY/p2p-circuit``, the target implied: this
    appends ``/p2p/PEER`` so the circuit transport knows whom to ask the relay for.
    """
    named = []
    for addr in addrs:
        parts = addr.relay_parts()
        named.append(addr.encapsulate(f"/p2p/{peer}") if parts is not None and parts[1] is None else addr)
    ordered: list[Multiaddr] = []
    for group in ((False, False), (False, True), (True, False), (True, True)):
        ordered += interleave_families([a for a in dict.fromkeys(named) if (a.is_relayed(), _is_quic(a)) == group])
    return ordered[: limits.MAX_DIAL_ADDRS]


def _family(addr: Multiaddr) -> str:
    components = addr.components
    return components[0][0] if components else ""


def interleave_families(addrs: Sequence[Multiaddr]) -> list[Multiaddr]:
    """``addrs`` with IPv6 and IPv4 taking turns, IPv6 first (RFC 8305's happy eyeballs): a
    family that is broken on this path costs one stagger step, not a whole family of timeouts.
    Addresses of neither family (relayed, DNS, memory) keep their place after them."""
    v6 = [a for a in addrs if _family(a) == "ip6"]
    v4 = [a for a in addrs if _family(a) == "ip4"]
    rest = [a for a in addrs if _family(a) not in ("ip4", "ip6")]
    mixed: list[Multiaddr] = []
    for index in range(max(len(v6), len(v4))):
        mixed += v6[index:index + 1] + v4[index:index + 1]
    return mixed + rest


def attempt_delay(addr: Multiaddr) -> float:
    """Seconds an attempt waits for its predecessor to fail before starting anyway."""
    extra = limits.RELAY_DIAL_DELAY if addr.is_relayed() else limits.QUIC_DIAL_DELAY if _is_quic(addr) else 0.0
    return limits.DIAL_STAGGER + extra


async def dial_staggered(dial_one: DialOne, peer: PeerID, addrs: Sequence[Multiaddr]) -> Connection:
    """Dial ``peer`` at ``addrs`` (see the module docstring); DialError with every cause if none answers.

    When two attempts succeed together, a direct connection is preferred to a relayed one.
    """
    causes: dict[str, BaseException] = {}
    own = own_ips()
    if own:  # interfaces we cannot list (no ifaddr): try everything
        kept = [a for a in addrs if routable(a, own)]
        for addr in addrs:
            if addr not in kept:
                causes[str(addr)] = DialError(f"no address of this machine can reach {addr}")
        addrs = kept or addrs
    ordered = dial_order(peer, addrs)
    winners: list[Connection] = []
    async with trio.open_nursery() as nursery:
        go_on = [trio.Event() for _ in ordered]  # set when an attempt fails: the next need not wait

        async def attempt(index: int, addr: Multiaddr) -> None:
            if index:
                with trio.move_on_after(attempt_delay(addr)):
                    await go_on[index - 1].wait()
            try:
                conn = await dial_one(addr, peer)
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                causes[str(addr)] = exc
                log.debug("dial %s via %s failed: %s", peer.short(), addr, describe(exc))
                go_on[index].set()
                return
            winners.append(conn)
            nursery.cancel_scope.cancel()

        for index, addr in enumerate(ordered):
            nursery.start_soon(attempt, index, addr)
    if winners:
        return min(winners, key=lambda c: c.path is Path.RELAYED)
    raise DialError(f"could not reach {peer}", causes)


__all__ = ["attempt_delay", "dial_order", "dial_staggered", "interleave_families", "routable"]
