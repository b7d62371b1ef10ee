"""Who hosts a swarm's grid experts, as the DHT says and as the hosts themselves answer: the
replica manager's survey (``ReplicaManager.survey``), apart from what it does with the answer.

A declaration outlives a killed volunteer until it expires, so a survey keeps only the hosts
that answer a dial (``answering_only``); the declarations' addresses go to the peerstore, where
catch-up, sync and hand-off dial them (``remember_addrs``)."""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import trio

from ..dht.grid import Declaration, get_experts, list_experts, survey_quorum
from ..dht.node import DHTNode
from ..errors import VolunteerError, describe
from ..net.identity import PeerID
from ..net.service import HostAPI
from .config import ReplicasConfig
from .grid import GridSpec
from .placement import Hosts

log = logging.getLogger(__name__)

DIRECT_LOOKUP_LIMIT = 1024  # grids up to this many experts are surveyed uid by uid (one batch)


async def declared_hosts(dht: DHTNode, grids: Sequence[GridSpec], uids: Sequence[str] = ()) -> dict[str, list[Declaration]]:
    """The declarations of every expert of ``grids``, plus ``uids``: small grids uid by uid in one
    batch, large ones by listing their prefix."""
    found: dict[str, list[Declaration]] = {}
    direct = list(dict.fromkeys(uids))
    for grid in grids:
        if grid.count <= DIRECT_LOOKUP_LIMIT:
            direct.extend(grid.uids())
        else:
            listed = await list_experts(dht, grid.prefix + ".", limit=grid.count)
            found.update({uid: decls for uid, decls in listed.items() if grid.contains(uid)})
    if direct:
        found.update(await get_experts(dht, list(dict.fromkeys(direct)), quorum=survey_quorum(dht)))
    return found


def remember_addrs(host: HostAPI, found: Mapping[str, Sequence[Declaration]]) -> None:
    """The declarations' addresses (ours left out), where catch-up, sync and hand-off dials find them."""
    for decls in found.values():
        for decl in decls:
            if decl.peer != host.peer_id:
                host.peerstore.remember_addrs(decl.peer, decl.addrs)


async def answering_only(host: HostAPI, hosts: Hosts, *, me: str, config: ReplicasConfig) -> dict[str, dict[str, int]]:
    """``hosts`` without the hosts that do not answer: a killed volunteer's declarations stay
    in the DHT until they expire, and an expert it held must not look replicated meanwhile.
    A host we are connected to counts as alive; any other must take a dial within
    ``liveness_timeout`` (a few at a time)."""
    peers = sorted({peer for holders in hosts.values() for peer in holders if peer != me})
    dead: set[str] = set()
    limiter = trio.CapacityLimiter(config.max_liveness_checks)

    async def check(peer: str) -> None:
        try:
            peer_id = PeerID.from_string(peer)
        except (ValueError, VolunteerError):
            dead.add(peer)
            return
        if host.is_connected(peer_id):
            return
        async with limiter:
            with trio.move_on_after(config.liveness_timeout):
                try:
                    await host.connect(peer_id)
                    return
                except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                    log.debug("declared host %s does not answer: %s", peer[-10:], describe(exc))
        dead.add(peer)

    async with trio.open_nursery() as nursery:
        for peer in peers:
            nursery.start_soon(check, peer)
    if dead:
        log.info("%d declared host(s) of the grid do not answer: not counted as replicas", len(dead))
    return {uid: {p: v for p, v in holders.items() if p not in dead} for uid, holders in hosts.items()}


__all__ = ["DIRECT_LOOKUP_LIMIT", "answering_only", "declared_hosts", "remember_addrs"]
