"""One upload meter per volunteer (``--max-upload``): expert replies, replica sync, catch-up
served and hand-off all wait under its cap and are counted by purpose. Transfers over the
memory transport with the trio clock jumping, and whole ``open_volunteer`` nodes on loopback."""

from __future__ import annotations

import pytest
import torch
import trio

from volunteer.cli import views
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.net.upload import CATCH_UP, HAND_OFF, REPLIES, SYNC, UploadMeter
from volunteer.node import open_volunteer
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.state import export_state
from volunteer.replicas.store import BackendStore
from volunteer.replicas.transfer import StateService, fetch_state, push_state, request_for

from .test_replicas_node import GRID, ALONE, options, spec, train, until, _holders

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
EXPERTS = ExpertsConfig(device="cpu")
SWARM = "up"
RATE = 512.0  # bytes per second: an ffn expert's state of width 8 (2 KiB) takes seconds under it
SMALL_CHUNKS = ReplicasConfig(chunk_size=256)  # writes well under one second's worth


def expert(uid: str = "expert.0.1"):
    torch.manual_seed(0)
    return make_backend(uid, "ffn", 8, config=EXPERTS)


async def test_catch_up_served_waits_under_the_cap_and_is_counted(autojump_clock):
    network = MemoryNetwork()
    meter = UploadMeter(RATE)
    source = expert()
    service = StateService(SWARM, BackendStore({source.uid: source}, config=SMALL_CHUNKS), SMALL_CHUNKS, upload=meter)
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                          services=[service]) as server:
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET) as client:
            started = trio.current_time()
            header, _ = await fetch_state(client, server.full_addrs()[0], request_for(expert()), swarm_id=SWARM)
            took = trio.current_time() - started
    assert meter.sent[CATCH_UP] == header.total and header.total > 2 * RATE
    # the first second's worth went at once, the rest at the cap (the clock is trio's mock)
    assert took >= (header.total - RATE) / RATE


async def test_a_hand_off_push_is_counted_under_its_purpose(autojump_clock):
    network = MemoryNetwork()
    meter = UploadMeter(RATE)
    received: dict = {}
    store = BackendStore(received, capacity=1,
                         factory=lambda h: make_backend(h.uid, h.expert_class, h.hidden_dim, config=EXPERTS))
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                          services=[StateService(SWARM, store)]) as receiver:
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET) as sender:
            exported = export_state(expert("expert.1.2"))
            await push_state(sender, receiver.full_addrs()[0], exported, swarm_id=SWARM, upload=meter)
    assert meter.sent[HAND_OFF] == exported.header.total and "expert.1.2" in received
    assert meter.total == meter.sent[HAND_OFF]


def test_a_cap_must_be_above_zero():
    with pytest.raises(ValueError):
        UploadMeter(0.0)
    assert UploadMeter(None).snapshot()["limit_bps"] is None


@pytest.mark.slow
async def test_a_volunteer_counts_catch_up_and_sync_with_its_replies_under_one_cap():
    cap = 64 * 1024 * 1024  # high enough not to slow the test; the meter is what is checked
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(place=True, max_experts=2, max_upload=cap)) as first:
            meter = first.server.upload
            # one meter, built by the node, shared by the server and both replica services
            assert meter.rate == cap
            assert first.replicas.state.upload is meter and first.replicas.sync.upload is meter
            assert first.replicas.upload is meter
            await train(first, "rep.0", 2)
            first.declarer.resume()
            await until(lambda: _holders(seed.dht, "rep.0", 1), "declared")
            async with open_volunteer(spec(entry), options(place=True, max_experts=2)) as late:
                assert late.replicas.caught_up["rep.0"] == 2
                assert meter.sent[CATCH_UP] > 0  # the late joiner caught up from us
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(first.replicas.sync_grid, GRID)
                    nursery.start_soon(late.replicas.sync_grid, GRID)
                assert meter.sent[SYNC] > 0 and late.server.upload.sent[SYNC] > 0
            assert meter.sent[REPLIES] == 0  # no trainer called
            assert views.bytes_served(first) == meter.total == meter.sent[CATCH_UP] + meter.sent[SYNC]


@pytest.mark.slow
async def test_a_leavers_hand_off_counts_against_its_upload():
    grids = (GRID, ALONE)
    async with open_volunteer(spec(grids=grids), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=2)):
            async with open_volunteer(spec(entry, grids=grids), options(uids=["solo.0"])) as leaver:
                await until(lambda: _holders(seed.dht, "solo.0", 1), "leaver declared")
                leaver.leave()
            assert leaver.handed_off is not None and "solo.0" in leaver.handed_off.done
            assert leaver.server.upload.sent[HAND_OFF] > 0
