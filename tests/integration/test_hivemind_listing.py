"""``volunteer experts`` on a hivemind swarm walks grids of any depth: records declared the way
hivemind's ``declare_experts`` does (here through our HivemindDHT on the memory transport) are
listed in full by a client-mode node, level by level, within its count and time bounds."""

from __future__ import annotations

import itertools
import time
from contextlib import AsyncExitStack

import pytest
import trio

from volunteer.hivemind import HivemindDHT
from volunteer.hivemind.expert_wire import declarations
from volunteer.hivemind.listing import walk_hivemind_grid
from volunteer.net.identity import KeyPair

from .test_hivemind_dht import swarm

PEERS = [KeyPair.generate().peer_id.to_base58() for _ in range(2)]


async def declare(dht: HivemindDHT, uids: list[str], peer: str) -> None:
    expiration = time.time() + 60

    async def store(record) -> None:
        if record.subkey is None:
            assert await dht.store(record.key, record.value, expiration)
        else:
            assert await dht.store(record.key, record.value, expiration, subkey=record.subkey)

    async with trio.open_nursery() as nursery:
        for record in declarations(uids, peer):
            nursery.start_soon(store, record)


def grid(prefix: str, *dims: int) -> list[str]:
    return [prefix + ".".join(map(str, index)) for index in itertools.product(*(range(d) for d in dims))]


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_grids_of_any_depth_are_listed_in_full():
    async with AsyncExitStack() as stack:
        a, b, client = await swarm(stack, 3, client=(2,))
        deep = grid("ffn.", 3, 2, 2)  # 12 uids, three coordinates
        deeper = grid("moe.1.", 2, 2, 2)  # a four-dimensional subgrid under moe.1.
        await declare(a, deep[:6], PEERS[0])
        await declare(b, deep[6:] + deeper, PEERS[1])
        await declare(a, ["flat.0", "flat.1", "flat.2"], PEERS[0])

        listing = await walk_hivemind_grid(client, "ffn.")
        assert listing.cut is None
        assert [r["uid"] for r in listing.rows] == sorted(deep)
        assert {r["uid"]: r["peer_id"] for r in listing.rows} == {
            **{uid: PEERS[0] for uid in deep[:6]}, **{uid: PEERS[1] for uid in deep[6:]}
        }
        assert all(r["load"] is None and r["heartbeat_age_s"] is None for r in listing.rows)

        listing = await walk_hivemind_grid(client, "moe")
        assert listing.cut is None and [r["uid"] for r in listing.rows] == sorted(deeper)
        listing = await walk_hivemind_grid(client, "flat.")
        assert [r["uid"] for r in listing.rows] == ["flat.0", "flat.1", "flat.2"]
        assert (await walk_hivemind_grid(client, "absent.")).rows == []


@pytest.mark.trio_timeout(60)
async def test_a_walk_past_its_bounds_says_why_and_keeps_what_it_found():
    async with AsyncExitStack() as stack:
        a, client = await swarm(stack, 2, client=(1,))
        uids = grid("ffn.", 2, 2, 2)
        await declare(a, uids, PEERS[0])

        # the second level alone has two prefix records (ffn.0.0. ... ffn.1.1. are four more)
        listing = await walk_hivemind_grid(client, "ffn.", max_prefixes=2)
        assert listing.cut == "more than 2 prefix records"
        assert 0 < len(listing.rows) < len(uids) and set(r["uid"] for r in listing.rows) <= set(uids)

        # three coordinates: ffn.i.j. records are not read with two at most
        listing = await walk_hivemind_grid(client, "ffn.", max_depth=2)
        assert listing.cut == "grid deeper than 2 coordinates"
        assert set(r["uid"] for r in listing.rows) < set(uids)

        listing = await walk_hivemind_grid(client, "ffn.", timeout=0)
        assert listing.cut == "listing took over 0 s" and listing.rows == []
