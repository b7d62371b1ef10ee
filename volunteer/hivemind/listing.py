"""Which experts a hivemind swarm has, for ``volunteer experts`` on a ``kind = "hivemind"`` swarm.

hivemind keeps no record of a whole grid: each uid is a key (``ffn.3`` → peer id) and each prefix
one level above a uid's last coordinate holds ``{coordinate: (uid, peer id)}`` (``ffn.1.`` for
``ffn.1.2``). So a listing under ``ffn.`` asks, in batches of ``BATCH`` indices ``i``, for the
uids ``ffn.i`` and the prefixes ``ffn.i.``, and stops after a batch where nothing answered
(at most ``MAX_INDEX`` indices). It finds every expert of one- and two-dimensional grids, and one
uid per prefix of deeper ones.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from ..errors import PeerIDError
from ..net.identity import PeerID
from .dht import HivemindDHT
from .serializer import DictionaryValue

BATCH = 32
MAX_INDEX = 1024


def _peer(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return str(PeerID.from_string(value))
    except (PeerIDError, ValueError):
        return None


def _rows_of(key: str, found, now: float) -> Iterable[dict]:
    value, expiration = found.value, found.expiration_time
    if isinstance(value, DictionaryValue):
        for item in value.items.values():
            entry = item.value
            if isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
                peer = _peer(entry[1])
                if peer is not None:
                    yield row(entry[0], peer, item.expiration_time, now)
    else:
        peer = _peer(value)
        if peer is not None:
            yield row(key, peer, expiration, now)


def row(uid: str, peer: str, expiration: float, now: float) -> dict:
    """One row of ``volunteer experts`` for a hivemind expert: what hivemind does not declare
    (addresses, load, heartbeat) is None, shown "–"."""
    return {
        "uid": uid, "peer_id": peer, "reached": None, "addrs": None, "load": None, "heartbeat_age_s": None,
        "expires_in_s": round(expiration - now, 1),
    }


async def list_hivemind_experts(dht: HivemindDHT, prefix: str) -> list[dict]:
    """Rows of the live experts under ``prefix`` (``ffn.``), sorted by uid, one per (uid, host)."""
    stem = prefix if prefix.endswith(".") else prefix + "."
    rows: dict[tuple[str, str], dict] = {}
    for start in range(0, MAX_INDEX, BATCH):
        hits = 0

        async def look(key: str) -> None:
            nonlocal hits
            found = await dht.get(key)
            if found is None:
                return
            for entry in _rows_of(key, found, dht.clock()):
                hits += 1
                rows[entry["uid"], entry["peer_id"]] = entry

        async with trio.open_nursery() as nursery:
            for index in range(start, start + BATCH):
                nursery.start_soon(look, f"{stem}{index}")
                nursery.start_soon(look, f"{stem}{index}.")
        if not hits:
            break
    return [rows[key] for key in sorted(rows)]


__all__ = ["BATCH", "MAX_INDEX", "list_hivemind_experts", "row"]
