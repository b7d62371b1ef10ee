"""Contact addresses across a connection: what a peer's DHT messages may teach us, and what we
tell it of ourselves (``net.addresses.for_peer``'s rule: a loopback address only between two
nodes on one loopback, a link-local one never).

Pure functions on the messages' binary multiaddrs. Requests and replies are filtered as they
arrive, so a volunteer's ``127.0.0.1`` never enters a routing table off its machine and is never
handed to a third peer, whatever that volunteer's software sent.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Iterable
from functools import lru_cache

from ..errors import VolunteerError
from ..net.addresses import LOOPBACK, scope_of, scope_usable_across
from ..net.multiaddr import Multiaddr
from .messages import KeyResult, Nodes, Request, Response, Stored, Values
from .routing import Contact


_UNPARSABLE = "unparsable"  # a raw address that is no multiaddr (never usable)


@lru_cache(maxsize=8192)
def _scope_of_raw(raw: bytes) -> str | None:
    # every contact of every DHT reply passes here: parsing its addresses and their IPs again each
    # time was a tenth of a busy daemon's CPU, and a swarm's addresses repeat
    try:
        return scope_of(Multiaddr(raw))
    except VolunteerError:
        return _UNPARSABLE


def usable_addrs(addrs: Iterable[bytes], via: Multiaddr | None) -> tuple[bytes, ...]:
    """The binary multiaddrs of ``addrs`` that mean something to us, told over a connection to
    ``via`` (unparsable ones dropped too)."""
    kept = []
    for raw in addrs:
        raw = bytes(raw)
        scope = _scope_of_raw(raw)
        if scope != _UNPARSABLE and scope_usable_across(scope, via):
            kept.append(raw)
    return tuple(kept)


def _contact(contact: Contact, via: Multiaddr | None) -> Contact:
    addrs = usable_addrs(contact.addrs, via)
    return contact if addrs == contact.addrs else Contact(contact.peer, addrs)


def scoped_request(request: Request, via: Multiaddr | None) -> Request:
    """``request`` with the sender's addresses limited to those usable from ``via``."""
    addrs = usable_addrs(request.addrs, via)
    return request if addrs == request.addrs else replace(request, addrs=addrs)


def scoped_response(response: Response, via: Multiaddr | None) -> Response:
    """``response`` with every contact's addresses limited to those usable from ``via``."""
    if isinstance(response, Nodes):
        return replace(response, peers=tuple(_contact(c, via) for c in response.peers))
    if isinstance(response, Stored):
        return replace(response, closer=tuple(_contact(c, via) for c in response.closer))
    if isinstance(response, Values):
        results = tuple(KeyResult(r.records, tuple(_contact(c, via) for c in r.closer)) for r in response.results)
        return replace(response, results=results)
    return response


def own_contact_addrs(addrs: Iterable[Multiaddr], limit: int) -> tuple[bytes, ...]:
    """Our own contact addresses for one peer (already limited to what it can use): loopback ones
    last, so a cap of ``limit`` drops them first."""
    ordered = sorted(addrs, key=lambda a: scope_of(a) == LOOPBACK)
    return tuple(a.to_bytes() for a in ordered[:limit])


__all__ = ["own_contact_addrs", "scoped_request", "scoped_response", "usable_addrs"]
