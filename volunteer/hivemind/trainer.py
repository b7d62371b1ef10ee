"""A trainer's side of a hivemind swarm: what ``Swarm.join`` runs on a ``kind = "hivemind"`` swarm
file, so our ``RemoteExpert`` and ``RemoteMixtureOfExperts`` call experts that hivemind servers
(``hivemind.moe.Server``, or a volunteer node on that swarm) host.

    await join_as_trainer(swarm, host)   # client-mode HivemindDHT + kad; sets swarm.find_grid / call_expert

The two hooks replace ours: ``find_grid`` reads hivemind's ``uid → peer id`` records for every uid
of the grid, ``call_expert`` calls ``ConnectionHandler.rpc_*`` through ``HivemindExpert`` with our
timeouts and error types.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import VolunteerError
from ..experts.config import DEFAULT_FORWARD_TIMEOUT
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
    """Who serves an expert, as the mixture expects a declaration: a peer id (addresses: kad's job)."""

    peer: PeerID
    addrs: tuple[Multiaddr, ...] = ()
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


async def hivemind_call_expert(
    host: HostAPI,
    peer: Any,
    uid: str,
    op: str,
    tensors: Sequence[torch.Tensor] = (),
    *,
    n_inputs: int | None = None,
    timeout: float = DEFAULT_FORWARD_TIMEOUT,
    **_ours: Any,
) -> Any:
    """``experts.client.call_expert`` for an expert a hivemind server hosts: ``info`` gives
    hivemind's info dict, ``forward`` / ``backward`` the output / input-gradient tensors. Options
    that only our protocol has (swarm id, compression, fault injection) are ignored."""
    expert = HivemindExpert(host, uid, _as_peer(peer), forward_timeout=timeout, backward_timeout=timeout)
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


async def join_as_trainer(swarm: Any, host: HostAPI) -> HivemindDHT:
    """Join ``swarm.spec``'s hivemind DHT in client mode (as hivemind's trainers do) and install the
    hivemind hooks on ``swarm``. Raises HivemindError when no initial peer answers."""
    dht = HivemindDHT(client_mode=True)
    await host.add_service(dht)
    await host.add_service(KadPeerRouting())
    await host.add_service(HivemindRefusals())
    bootstrap = list(swarm.spec.bootstrap)
    if not bootstrap:
        raise HivemindError(f"hivemind swarm {swarm.spec.name!r} names no initial peers (bootstrap)")
    if not await dht.bootstrap(bootstrap):
        raise HivemindError(f"none of the {len(bootstrap)} initial peers of {swarm.spec.name!r} answered a hivemind DHT ping")

    def find_grid(uid_prefix: str, dims: int, *, grid_size: Sequence[int] | None = None, timeout: float = 30) -> dict:
        if grid_size is None:
            raise HivemindError("a hivemind grid lookup needs the grid's size (hivemind keeps no grid records)")
        return swarm.loop.run(hivemind_grid, dht, uid_prefix, grid_size, timeout=timeout)

    swarm.find_grid = find_grid
    swarm.call_expert = hivemind_call_expert
    return dht


__all__ = ["HivemindHost", "MAX_GRID_UIDS", "grid_uids", "hivemind_call_expert", "hivemind_grid", "join_as_trainer"]
