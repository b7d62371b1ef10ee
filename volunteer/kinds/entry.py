"""Reaching a swarm's entry points when a volunteer starts, or failing with one line that says
where (``host:port``), why (the innermost reason) and what next (``volunteer doctor``)."""

from __future__ import annotations

import os

import trio

from ..errors import DialError, JoinError, PeerIDMismatch, VolunteerError
from ..net.multiaddr import Multiaddr
from ..net.service import HostAPI
from ..swarmfile import SwarmSpec

REACH_TIMEOUT = 20.0  # a swarm none of whose entry points answers by then is "unreachable"


async def reach_swarm(host: HostAPI, spec: SwarmSpec, timeout: float = REACH_TIMEOUT) -> None:
    """Connect to the swarm's entry points (bootstrap peers and relays) at once; return once any
    answered, raise JoinError when none did. A swarm with none (its first node) is left alone."""
    entry = spec.entry_points
    if not entry:
        return  # the first node of a new swarm: others will bootstrap from us
    failures: dict[Multiaddr, str] = {}
    wrong_peers: dict[Multiaddr, PeerIDMismatch] = {}
    reached = False

    async def one(addr: Multiaddr) -> None:
        nonlocal reached
        try:
            with trio.fail_after(timeout):
                await host.connect(addr)
            reached = True
        except trio.TooSlowError:
            failures[addr] = f"no answer within {timeout:g} s"
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            failures[addr] = _root_reason(exc)
            if (wrong := PeerIDMismatch.inside(exc)) is not None:
                wrong_peers[addr] = wrong

    async with trio.open_nursery() as nursery:
        for addr in entry:
            nursery.start_soon(one, addr)
    if not reached and wrong_peers:  # someone answered, but not whom the swarm file names
        addr, wrong = next(iter(wrong_peers.items()))
        raise JoinError(f"cannot join swarm {spec.name!r}: " + wrong_peer_line(wrong, addr, spec))
    if not reached:
        # one short line: where (host:port, no peer id), why (the innermost reason), what next
        addr, reason = next(iter(failures.items()))
        where = _host_port(addr)
        doctor = str(spec.path) if spec.path is not None else str(addr)
        kind = "relay" if addr in spec.relays else "bootstrap peer"
        whom = f"its {kind} {where}" if len(entry) == 1 else f"none of its {len(entry)} bootstrap peers/relays ({where}: "
        raise JoinError(
            f"cannot reach swarm {spec.name!r}: "
            + (f"{whom} did not answer ({reason})" if len(entry) == 1 else f"{whom}{reason}) answered")
            + f"; run `volunteer doctor {doctor}` to see why"
        )


def _root_reason(exc: BaseException) -> str:
    """The innermost reason of a dial failure, without the addresses and peer ids each layer of
    DialError adds: ``Connection refused``, ``handshake timed out``."""
    while isinstance(exc, DialError) and exc.causes:
        exc = next(iter(exc.causes.values()))
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.rsplit(": ", 1)[-1][:80]  # the innermost clause of "while …: because …: reason"


def wrong_peer_line(exc: BaseException, addr: Multiaddr, spec: SwarmSpec | None = None) -> str:
    """One line for a dial of ``addr`` that another peer than its /p2p/ id answered, in the same
    words wherever it is said (``join``, ``ping``, ``doctor``): where (``host:port``, and which
    entry point of ``spec`` it is), both ids whole, what to do, and the swarm file to fix."""
    wrong = PeerIDMismatch.inside(exc)
    if wrong is None:
        raise ValueError(f"not a wrong peer id: {exc!r}")
    if spec is None:
        return wrong.advice(_host_port(addr))
    kind = "relay" if addr in spec.relays else "bootstrap peer"
    named = f"swarm file {spec.path}" if spec.path is not None else "the address given"
    return wrong.advice(f"its {kind} {_host_port(addr)}") + f" (fix {named})"


def _host_port(addr: Multiaddr) -> str:
    """``127.0.0.1:4001`` from a multiaddr (the whole address, less its /p2p part, otherwise)."""
    text = str(addr).split("/p2p/", 1)[0]
    parts = text.split("/")
    if len(parts) >= 5 and parts[1] in ("ip4", "ip6", "dns", "dns4", "dns6") and parts[3] in ("tcp", "udp"):
        return f"{parts[2]}:{parts[4]}"
    return text


__all__ = ["REACH_TIMEOUT", "reach_swarm", "wrong_peer_line"]
