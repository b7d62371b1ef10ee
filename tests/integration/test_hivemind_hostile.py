"""The hivemind door against hostile peers built from our own modules, over TCP on loopback.

Each attack is one a red team ran against the hivemind personality; each test measures how much
the node's resident memory grows while the attack runs (its peak), asserts it stays within
256 MiB, and has an honest caller, dialling from another loopback address, served during the
attack. Attackers and node share this process, so the attackers send from one shared buffer.

- held DHT requests: streams that announce the largest request and send all but its last byte;
- held expert calls: unary calls, and a stream call's frames without their end marker;
- a request trickled to hold its reservation, and answers never read;
- msgpack of empty maps (an object bomb), and sub-keys that decode to millions of strings;
- a storage flood from several peers, which must not push out an honest peer's record;
- held kad requests.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.hivemind import HivemindDHT, HivemindExperts, key_id
from volunteer.hivemind import expert_wire as wire
from volunteer.hivemind.dht_protocol import STORE
from volunteer.hivemind.framing import UnaryCall, encode_call, encode_frame, new_call_id
from volunteer.hivemind.kad import KadPeerRouting
from volunteer.hivemind.kad_wire import PROTOCOL as KAD
from volunteer.hivemind.rpc import call_unary
from volunteer.net.resources import ResourceManager
from volunteer.net.stack import StackOptions, open_stack

from ..hivemind_attacks import (
    PEER_ERRORS, flood, held_unary, map_bomb, reset_all, resets, send_filler, store_request, stored, string_tuple,
    try_call,
)
from ..memwatch import MiB, PeakGrowth

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
BOUND = 256 * MiB  # what the personality may grow by under any one attack
HIDDEN = 8


async def _host(address: str, services=(), *, task_status=trio.TASK_STATUS_IGNORED):
    async with open_stack(listen=[f"/ip4/{address}/tcp/0"], options=QUIET, services=list(services)) as host:
        task_status.started(host)
        await trio.sleep_forever()


async def settle(predicate, *, timeout: float = 20) -> None:
    # the node's handlers run in their own tasks: let them catch up (bounded)
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def refusals(host) -> dict:
    return host.service(ResourceManager).refusals()


# --- the DHT ---------------------------------------------------------------------------------


class DHTNode:
    """A node in a hivemind DHT, an attacker on its address and an honest client on another."""

    def __init__(self, dht: HivemindDHT, server, attacker, honest_dht: HivemindDHT, nursery) -> None:
        self.dht, self.server, self.attacker, self.honest_dht, self.nursery = dht, server, attacker, honest_dht, nursery

    async def honest_store(self, key: str) -> None:
        assert await self.honest_dht.store(key, "honest", time.time() + 60)
        assert self.dht.core.storage.get(key_id(key), time.time()) is not None


@asynccontextmanager
async def dht_node() -> AsyncIterator[DHTNode]:
    """The DHT node, its attacker and its honest client, for the length of the block."""
    async with trio.open_nursery() as nursery:
        dht, honest_dht = HivemindDHT(), HivemindDHT(client_mode=True)
        server = await nursery.start(_host, "127.0.0.1", [dht])
        attacker = await nursery.start(_host, "127.0.0.1")
        await nursery.start(_host, "127.0.0.2", [honest_dht])
        await attacker.connect(server.full_addrs()[0])
        assert await honest_dht.bootstrap([server.full_addrs()[0]]) == 1
        yield DHTNode(dht, server, attacker, honest_dht, nursery)
        nursery.cancel_scope.cancel()


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_held_dht_requests_stay_within_budget_and_honest_stores_are_served():
    async with dht_node() as node:
        dht, attacker, target = node.dht, node.attacker, node.server.peer_id
        watch = PeakGrowth.watching(node.nursery)
        # the largest request p2pd carries, then the largest the door lets in
        held = await held_unary(attacker, target, STORE, (4 << 20) - 64, 100)
        held += await held_unary(attacker, target, STORE, (1 << 20) - 64, 200)
        await node.honest_store("while-held")
        assert watch.growth < BOUND, f"grew by {watch.mib} under held DHT requests"
        assert dht.door.held_by(attacker.peer_id) <= dht.limits.door.per_peer
        assert refusals(node.server)["hivemind-dht-peer"]["memory"] > 0
        await reset_all(held)
        await settle(lambda: dht.door.held == 0)


@pytest.mark.trio_timeout(60)
async def test_msgpack_object_bombs_stay_within_budget():
    async with dht_node() as node:
        attacker, target = node.attacker, node.server.peer_id
        watch = PeakGrowth.watching(node.nursery)
        # ~400 MiB of dicts from 4 MiB of one-entry maps ({0: {}}, 3 bytes, 248 bytes decoded),
        # then as much as the door lets in, flat and in arrays short enough for any length bound;
        # each as a sub-key and as a whole dictionary value
        for index, bomb in enumerate([map_bomb(4 << 20), map_bomb(1 << 20), map_bomb(1 << 20, 4000)]):
            assert not stored(await try_call(attacker, target, STORE, store_request("bomb", bomb, b"\x01")))
            assert not stored(await try_call(attacker, target, STORE, store_request("bomb", b"", bomb)))
            await node.honest_store(f"after-{index}")
        assert watch.growth < BOUND, f"grew by {watch.mib} decoding msgpack bombs"
        assert node.dht.core.storage.get(key_id("bomb"), time.time()) is None


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
async def test_subkey_floods_stay_within_budget_and_the_largest_holder_loses_first():
    async with dht_node() as node:
        dht, attacker, target = node.dht, node.attacker, node.server.peer_id
        others = [await node.nursery.start(_host, "127.0.0.1") for _ in range(4)]
        for other in others:
            await other.connect(node.server.full_addrs()[0])
        storage = dht.core.storage
        watch = PeakGrowth.watching(node.nursery)
        # sub-keys that decode to 1.4 M strings each (kept for a day by a store that counts only
        # values), then as large as the door lets a request be
        answers = []
        for index, size in enumerate([4 << 20] * 5 + [1 << 20] * 2):
            tag = string_tuple((size - 512) // 3)
            answers.append(await try_call(attacker, target, STORE, store_request(f"huge.{index}", tag, b"\x01")))
        await node.honest_store("honest.0")
        assert watch.growth < BOUND, f"grew by {watch.mib} keeping sub-keys of millions of strings"
        assert not any(stored(answer) for answer in answers)
        # then the largest sub-keys the door lets in: one peer's quota binds first; then four
        # more peers fill the storage, and room is taken from the largest holder first
        strings = dht.limits.max_subkey_objects - 8
        for round_ in range(2):
            await flood(attacker, target, f"flood.{round_}", 4000, strings)
        assert storage.held_by(attacker.peer_id) <= dht.limits.max_stored_bytes_per_peer
        assert storage.refusals["peer_quota"] > 0
        for index, peer in enumerate(others):
            for round_ in range(2):
                await flood(peer, target, f"flood.{index}.{round_}", 4000, strings)
        await node.honest_store("honest.1")
        assert watch.growth < BOUND, f"grew by {watch.mib} under sub-key floods"
        assert storage.stored_bytes <= dht.limits.max_stored_bytes
        for peer in [attacker, *others]:
            assert storage.held_by(peer.peer_id) <= dht.limits.max_stored_bytes_per_peer
        counted = refusals(node.server)["hivemind-storage"]
        assert counted["subkey_size"] == 2 and counted["peer_quota"] > 0 and counted["storage_full"] > 0, counted
        assert storage.evicted > 0  # the flooders made room for each other
        assert storage.get(key_id("honest.0"), time.time()) is not None  # the smallest holder kept it


# --- the experts -------------------------------------------------------------------------------


class ExpertNode:
    """A node serving one hivemind expert, an attacker on its address and an honest caller on
    another; ``nursery`` runs them."""

    def __init__(self, experts: HivemindExperts, server, attacker, honest, hidden: int, nursery) -> None:
        self.experts, self.server, self.attacker, self.honest = experts, server, attacker, honest
        self.hidden, self.nursery, self.config = hidden, nursery, experts.config

    async def honest_forward(self) -> None:
        x = np.ones((3, self.hidden), np.float32)
        answer = await call_unary(self.honest, self.server.peer_id, wire.FORWARD, wire.request("ffn.0", [x]), timeout=20)
        assert wire.parse_response(answer)[0].shape == (3, self.hidden)


@asynccontextmanager
async def expert_node(hidden: int = HIDDEN) -> AsyncIterator[ExpertNode]:
    """A node serving ``ffn.0`` of ``hidden`` on hivemind's RPCs, with an attacker and an honest
    caller, for the length of the block."""
    config = ExpertsConfig(device="cpu")
    async with open_runtime([make_backend("ffn.0", "ffn", hidden, config=config)], config) as runtime:
        async with trio.open_nursery() as nursery:
            experts = HivemindExperts(runtime, config=config)
            server = await nursery.start(_host, "127.0.0.1", [experts])
            attacker = await nursery.start(_host, "127.0.0.1")
            honest = await nursery.start(_host, "127.0.0.2")
            for host in (attacker, honest):
                await host.connect(server.full_addrs()[0])
            yield ExpertNode(experts, server, attacker, honest, hidden, nursery)
            nursery.cancel_scope.cancel()


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_held_expert_calls_stay_within_budget_and_honest_calls_are_served():
    async with expert_node() as node:
        nursery, config = node.nursery, node.config
        watch = PeakGrowth.watching(nursery)
        # unary calls of the largest size, all but their last byte sent, from two addresses
        # (together they fill all callers' share: the honest caller's call takes room from
        # the address holding the most) ...
        other = await nursery.start(_host, "127.0.0.3")
        await other.connect(node.server.full_addrs()[0])
        held = await held_unary(node.attacker, node.server.peer_id, wire.FORWARD, 4 << 20, 120)
        held += await held_unary(other, node.server.peer_id, wire.FORWARD, 4 << 20, 120)
        # ... and a stream call's frames of the largest size, without their end marker
        stream = await node.attacker.new_stream(node.server.peer_id, [wire.FORWARD_STREAM])
        frame = (16 << 20) - 64
        with trio.move_on_after(30):
            try:
                for _ in range(15):
                    await stream.send_all(encode_frame(b"")[:1] + frame.to_bytes(8, "big"))
                    await send_filler(stream, frame)
            except PEER_ERRORS:
                pass  # refused: the node answered and drops the rest
        await node.honest_forward()
        assert watch.growth < BOUND, f"grew by {watch.mib} under held expert calls"
        door = node.experts.door
        assert door.held_by(node.attacker.peer_id) <= config.hivemind_request_bytes_per_peer
        assert door.refusals["peer_request_bytes"] > 0 and door.refusals["evicted"] > 0
        await reset_all([*held, stream])
        await settle(lambda: door.held == 0)


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_a_trickled_call_loses_its_stream_and_what_it_reserved():
    async with expert_node() as node:
        call = encode_call(UnaryCall(new_call_id(), wire.FORWARD, bytes(1 << 20)))
        stream = await node.attacker.new_stream(node.server.peer_id, [wire.FORWARD])
        started = trio.current_time()
        await stream.send_all(call[:4096])
        with trio.fail_after(20):  # hivemind's own read timeout would keep it 60 s
            try:
                for offset in range(4096, len(call)):  # a byte a second holds the reservation
                    await stream.send_all(call[offset : offset + 1])
                    await trio.sleep(1)
            except PEER_ERRORS:
                pass  # the node dropped the stream
        assert trio.current_time() - started < 15
        door = node.experts.door
        await settle(lambda: door.held == 0)
        assert door.refusals["slow_body"] == 1
        assert refusals(node.server)["hivemind-experts"]["slow_body"] == 1
        await node.honest_forward()


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_answers_never_read_lose_their_streams_and_stay_within_budget():
    hidden = 512
    async with expert_node(hidden) as node:
        nursery, config = node.nursery, node.config
        watch = PeakGrowth.watching(nursery)
        # complete forwards whose 2 MiB answers the attacker never reads (past yamux's first
        # window of 256 KiB, the node's writes wait for it)
        x = np.zeros((config.max_batch_size, hidden), np.float32)
        request = encode_call(UnaryCall(new_call_id(), wire.FORWARD, wire.request("ffn.0", [x])))
        streams = []
        for _ in range(50):
            try:
                stream = await node.attacker.new_stream(node.server.peer_id, [wire.FORWARD])
                await stream.send_all(request)
            except PEER_ERRORS:
                continue
            streams.append(stream)
        await node.honest_forward()
        # the door's grace, then the first window at its rate: the streams go, and what their
        # calls held with them
        with trio.fail_after(40):
            while not await resets(streams):
                await trio.sleep(0.1)
        door = node.experts.door
        await settle(lambda: door.refusals["slow_reader"] > 0 and door.held == 0)
        assert node.experts.errors == 0  # the answers were real, and large
        assert watch.growth < BOUND, f"grew by {watch.mib} under answers never read"
        await node.honest_forward()
        await reset_all(streams)


# --- kad -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_held_kad_requests_stay_within_budget():
    async with trio.open_nursery() as nursery:
        kad = KadPeerRouting()
        server = await nursery.start(_host, "127.0.0.1", [kad])
        attacker = await nursery.start(_host, "127.0.0.1")
        honest_kad = KadPeerRouting()
        honest = await nursery.start(_host, "127.0.0.2", [honest_kad])
        await attacker.connect(server.full_addrs()[0])
        await honest.connect(server.full_addrs()[0])
        watch = PeakGrowth.watching(nursery)
        held = await held_unary(attacker, server.peer_id, KAD, (4 << 20) - 64, 80)
        held += await held_unary(attacker, server.peer_id, KAD, (64 << 10) - 64, 80)
        assert await honest_kad.ping(server.peer_id)
        assert watch.growth < BOUND, f"grew by {watch.mib} under held kad requests"
        assert kad.door.held_by(attacker.peer_id) <= kad.limits.door.per_peer
        await reset_all(held)
        await settle(lambda: kad.door.held == 0)
        nursery.cancel_scope.cancel()
