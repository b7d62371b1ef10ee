"""A trainer's side of a hivemind swarm: what ``Swarm.join`` runs on a ``kind = "hivemind"`` swarm
file, so our ``RemoteExpert`` and ``RemoteMixtureOfExperts`` call experts that hivemind servers
(``hivemind.moe.Server``, or a volunteer node on that swarm) host.

    dht = await join_as_trainer(host, spec)    # client-mode HivemindDHT + kad, joined
    swarm_directory = HivemindDirectory(host, dht)

``HivemindDirectory`` is the swarm's ``ExpertDirectory`` (``volunteer.experts.directory``):
``find_grid`` reads hivemind's ``uid → peer id`` records for every uid of the grid,
``call_expert`` calls ``ConnectionHandler.rpc_*`` through ``HivemindExpert`` with our timeouts
and error types.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import trio

from ..errors import ExpertUnavailableError, VolunteerError
from ..experts.callstats import CallReport
from ..experts.config import DEFAULT_FORWARD_TIMEOUT
from ..experts.directory import ExpertHost
from ..experts.faults import FaultInjection
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import HostAPI
from .client import HivemindExpert, find_experts
from .dht import HivemindDHT
from .errors import HivemindError
from .kad import KadPeerRouting
from .unsupported import HivemindRefusals

# uids one grid lookup may ask for (hivemind has no grid records to enumerate: every uid is a key)
MAX_GRID_UIDS = 4096


@dataclass(frozen=True)
class HivemindHost:
    """Who serves an expert, as the mixture expects a declaration: a peer id (addresses: kad's
    job; load: hivemind declares none)."""

    peer: PeerID
    addrs: tuple[Multiaddr, ...] = ()
    load: float = 0.0
    synced_age: float | None = None  # hivemind's replicas never average: no audit compares them


def grid_uids(prefix: str, grid_size: Sequence[int]) -> list[str]:
    """Every uid of a hivemind grid ``prefix`` with ``grid_size`` (``ffn``, (2, 3) → ffn.0.0 … ffn.1.2)."""
    count = 1
    for size in grid_size:
        count *= int(size)
    if count > MAX_GRID_UIDS:
        raise HivemindError(f"a hivemind grid of {count} uids is more than {MAX_GRID_UIDS} lookups")
    stem = prefix.rstrip(".")
    return [".".join([stem, *map(str, coords)]) for coords in itertools.product(*(range(int(s)) for s in grid_size))]


async def hivemind_grid(dht: HivemindDHT, prefix: str, grid_size: Sequence[int]) -> dict[str, list[HivemindHost]]:
    """``{uid: [HivemindHost]}`` of the grid's uids someone declared (and whose record is live)."""
    found = await find_experts(dht, grid_uids(prefix, grid_size))
    return {uid: [HivemindHost(peer)] for uid, peer in found.items() if peer is not None}


def _as_peer(peer: Any) -> PeerID:
    if isinstance(peer, Multiaddr):
        if peer.peer_id is None:
            raise VolunteerError(f"{peer} names no /p2p/ peer")
        return peer.peer_id
    return peer if isinstance(peer, PeerID) else PeerID.from_string(str(peer))


class HivemindDirectory:
    """A hivemind swarm's experts for our trainers (an ``ExpertDirectory``): grids from hivemind's
    uid records, calls over hivemind's ``ConnectionHandler`` RPCs. Options only our protocol has
    (compression choice, keeping a forward's graph or its inputs) are ignored: a backward always
    sends its inputs; injected faults apply. A ``report`` gets the call's times and its tensors'
    raw bytes (no volunteer time: hivemind's replies do not say it)."""

    def __init__(self, host: HostAPI, dht: HivemindDHT) -> None:
        self.host = host
        self.dht = dht

    async def find_grid(self, uid_prefix: str, grid_size: Sequence[int]) -> dict[str, list[ExpertHost]]:
        found = await hivemind_grid(self.dht, uid_prefix, grid_size)
        return {uid: list(hosts) for uid, hosts in found.items()}

    async def call_expert(
        self,
        peer: PeerID | Multiaddr,
        uid: str,
        op: str,
        tensors: Sequence[torch.Tensor] = (),
        *,
        n_inputs: int | None = None,
        compression: str = "none",
        timeout: float = DEFAULT_FORWARD_TIMEOUT,
        faults: FaultInjection | None = None,
        backward_follows: bool = False,
        kept: int | None = None,
        report: CallReport | None = None,
        digest: bytes | None = None,
    ) -> Any:
        """``info`` gives hivemind's info dict, ``forward`` / ``backward`` the output /
        input-gradient tensors. Hivemind signs no receipts, so it serves no snapshots."""
        if digest is not None or op == "snapshot":  # an audit then counts the snapshot missing
            raise ExpertUnavailableError(f"hivemind experts serve no snapshots ({uid!r})")
        report = report if report is not None else CallReport()
        report.op, report.started = op, trio.current_time()
        result = await self._call(peer, uid, op, tensors, n_inputs, timeout, faults)
        report.done = trio.current_time()
        if op != "info":
            report.bytes_out = sum(t.numel() * t.element_size() for t in tensors)
            report.bytes_in = sum(t.numel() * t.element_size() for t in result)
        return result

    async def _call(self, peer, uid, op, tensors, n_inputs, timeout, faults) -> Any:
        if faults is not None:  # an experiment's injected failure or delay, before the call as ours
            await faults.before_call(uid)
        expert = HivemindExpert(self.host, uid, _as_peer(peer), forward_timeout=timeout, backward_timeout=timeout)
        if op == "info":
            return await expert.info()
        arrays = [tensor.detach().cpu().numpy() for tensor in tensors]
        if op == "forward":
            outputs = await expert.forward(arrays)
        elif op == "backward":
            split = len(arrays) if n_inputs is None else n_inputs
            outputs = await expert.backward(arrays[:split], arrays[split:])
        else:
            raise ValueError(f"unknown expert operation {op!r}")
        return [torch.from_numpy(np.ascontiguousarray(array)) for array in outputs]


async def join_as_trainer(host: HostAPI, bootstrap: Sequence[Multiaddr], *, swarm_name: str = "") -> HivemindDHT:
    """Join a hivemind DHT in client mode (as hivemind's trainers do) through its initial peers,
    with kad peer routing and the refusals of what we do not speak. Raises HivemindError when
    there is no initial peer, or none answers."""
    dht = HivemindDHT(client_mode=True)
    await host.add_service(dht)
    await host.add_service(KadPeerRouting())
    await host.add_service(HivemindRefusals())
    if not bootstrap:
        raise HivemindError(f"hivemind swarm {swarm_name!r} names no initial peers (bootstrap)")
    if not await dht.bootstrap(list(bootstrap)):
        raise HivemindError(f"none of the {len(bootstrap)} initial peers of {swarm_name!r} answered a hivemind DHT ping")
    return dht


__all__ = ["HivemindDirectory", "HivemindHost", "MAX_GRID_UIDS", "grid_uids", "hivemind_grid", "join_as_trainer"]
