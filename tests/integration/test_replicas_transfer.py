"""State transfer between Hosts on the memory transport, with real ffn ExpertBackends: a fetched
state equals the source's (sha256) and trains on identically; mismatched class or shapes, unknown
uids, corrupted payloads and full receivers are refused with typed errors; a push makes the
receiver host the expert at the sender's version."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import torch

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.streams import BufferedStream
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.errors import StateMismatchError, StateProtocolError, StateRefusedError
from volunteer.replicas.messages import pack, state_protocol, unpack
from volunteer.replicas.state import export_state, state_digest
from volunteer.replicas.store import BackendStore
from volunteer.replicas.transfer import StateService, catch_up, fetch_state, push_state, request_for

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
EXPERTS = ExpertsConfig(device="cpu")
SWARM = "rs"


def trained(uid: str, steps: int = 3, hidden: int = 8):
    backend = make_backend(uid, "ffn", hidden, config=EXPERTS)
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, hidden)
        backend.backward([x], [torch.randn(4, hidden)])
    return backend


@asynccontextmanager
async def node(network, store: BackendStore | None = None, config: ReplicasConfig = ReplicasConfig(), on_accepted=None):
    services = [StateService(SWARM, store, config, on_accepted=on_accepted)] if store is not None else []
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=services) as host:
        yield host


async def test_fetched_state_equals_the_source_and_trains_on_identically():
    network = MemoryNetwork()
    source = trained("expert.0.1")
    joiner = make_backend("expert.0.1", "ffn", 8, config=EXPERTS)
    assert state_digest(joiner) != state_digest(source)
    async with open_runtime([source], EXPERTS) as runtime:
        store = BackendStore({"expert.0.1": source}, runtime=runtime)
        async with node(network, store) as server, node(network) as client:
            header = await catch_up(client, server.full_addrs()[0], joiner, swarm_id=SWARM)
    assert header.version == source.updates == joiner.updates == 3
    assert state_digest(joiner) == state_digest(source) == header.sha256
    x, g = torch.randn(5, 8), torch.randn(5, 8)
    source.backward([x], [g])
    joiner.backward([x], [g])  # optimizer state came along: the next step is the same step
    assert torch.equal(source.forward([x])[0], joiner.forward([x])[0])


async def test_mismatched_class_or_shapes_and_unknown_uids_are_refused():
    network = MemoryNetwork()
    source = trained("expert.0.1")
    async with node(network, BackendStore({"expert.0.1": source})) as server, node(network) as client:
        addr = server.full_addrs()[0]
        wider = make_backend("expert.0.1", "ffn", 16, config=EXPERTS)
        with pytest.raises(StateMismatchError, match="width"):
            await catch_up(client, addr, wider, swarm_id=SWARM)
        other_class = make_backend("expert.0.1", "transformer", 8, config=EXPERTS)
        with pytest.raises(StateMismatchError):
            await catch_up(client, addr, other_class, swarm_id=SWARM)
        with pytest.raises(StateRefusedError) as info:
            await catch_up(client, addr, make_backend("expert.9.9", "ffn", 8, config=EXPERTS), swarm_id=SWARM)
        assert info.value.code == "unknown" and not isinstance(info.value, StateMismatchError)
        assert wider.updates == 0  # nothing was loaded


async def test_a_corrupted_payload_fails_its_hash_and_loads_nothing():
    network = MemoryNetwork()
    joiner = make_backend("expert.0.1", "ffn", 8, config=EXPERTS)
    before = state_digest(joiner)
    exported = export_state(trained("expert.0.1"))

    async def liar(stream):  # answers with a real header and a flipped payload byte
        reader = BufferedStream(stream)
        await reader.receive_length_prefixed(1 << 20)
        await reader.send_all(pack({"ok": True, "h": exported.header.to_wire()}))
        payload = bytearray(b"".join(bytes(c) for c in exported.chunks))
        payload[7] ^= 0xFF
        await reader.send_all(bytes(payload))
        await reader.aclose()

    async with node(network) as server, node(network) as client:
        server.set_handler(state_protocol(SWARM), liar)
        with pytest.raises(StateProtocolError, match="sha256"):
            await catch_up(client, server.full_addrs()[0], joiner, swarm_id=SWARM)
    assert state_digest(joiner) == before


async def test_a_truncated_payload_is_a_protocol_error():
    network = MemoryNetwork()
    exported = export_state(trained("expert.0.1"))

    async def short(stream):
        reader = BufferedStream(stream)
        await reader.receive_length_prefixed(1 << 20)
        await reader.send_all(pack({"ok": True, "h": exported.header.to_wire()}))
        await reader.send_all(bytes(exported.chunks[0])[:10])
        await reader.aclose()

    async with node(network) as server, node(network) as client:
        server.set_handler(state_protocol(SWARM), short)
        with pytest.raises(StateProtocolError, match="truncated"):
            await fetch_state(client, server.full_addrs()[0], request_for(make_backend("expert.0.1", "ffn", 8, config=EXPERTS)), swarm_id=SWARM)


async def test_oversized_states_and_malformed_requests_get_refusals():
    network = MemoryNetwork()
    small = ReplicasConfig(max_state_bytes=1000)
    source = trained("expert.0.1")
    async with node(network, BackendStore({"expert.0.1": source}), small) as server, node(network) as client:
        addr = server.full_addrs()[0]
        # a request whose tensor list announces more than the bound
        stream = BufferedStream(await client.new_stream(addr, [state_protocol(SWARM)]))
        request = request_for(source).to_wire()
        request["t"] = [["m:huge", [30, 30], "float32"]]  # 3600 bytes
        await stream.send_all(pack(request))
        reply = unpack(await stream.receive_length_prefixed(1 << 20))
        assert reply["ok"] is False and "exceeds" in reply["e"]["m"]
        # bad msgpack
        stream = BufferedStream(await client.new_stream(addr, [state_protocol(SWARM)]))
        await stream.send_all(b"\x03\xc1\xc1\xc1")
        reply = unpack(await stream.receive_length_prefixed(1 << 20))
        assert reply["ok"] is False and reply["e"]["c"] == "error"
        # the server still serves a good request (a client with the default bounds)
        joiner = make_backend("expert.0.1", "ffn", 8, config=EXPERTS)
        with pytest.raises(StateRefusedError):  # its own state is beyond its 1000-byte bound
            await catch_up(client, addr, joiner, swarm_id=SWARM)


async def test_push_makes_the_receiver_host_the_expert_at_the_senders_version():
    network = MemoryNetwork()
    leaver = trained("expert.1.2", steps=5)
    accepted = []
    received: dict = {}
    store = BackendStore(
        received,
        capacity=1,
        factory=lambda header: make_backend(header.uid, header.expert_class, header.hidden_dim, config=EXPERTS),
    )
    async with node(network, store, on_accepted=accepted.append) as receiver, node(network) as sender:
        addr = receiver.full_addrs()[0]
        version = await push_state(sender, addr, export_state(leaver), swarm_id=SWARM)
        assert version == 5 == received["expert.1.2"].updates
        assert state_digest(received["expert.1.2"]) == state_digest(leaver)
        assert accepted == [received["expert.1.2"]]
        # full now: a second expert is refused before its payload is sent
        with pytest.raises(StateRefusedError) as info:
            await push_state(sender, addr, export_state(trained("expert.1.3")), swarm_id=SWARM)
        assert info.value.code == "full" and set(received) == {"expert.1.2"}
        # a push for an expert it hosts is refused whatever it carries
        with pytest.raises(StateRefusedError) as info:
            await push_state(sender, addr, export_state(trained("expert.1.2", hidden=16)), swarm_id=SWARM)
        assert info.value.code == "hosted"


async def test_push_to_a_volunteer_that_takes_no_new_experts_is_refused():
    network = MemoryNetwork()
    async with node(network, BackendStore({})) as receiver, node(network) as sender:
        with pytest.raises(StateRefusedError) as info:
            await push_state(sender, receiver.full_addrs()[0], export_state(trained("expert.0.0")), swarm_id=SWARM)
    assert info.value.code == "unknown"


@pytest.mark.slow
async def test_a_push_never_replaces_a_hosted_replica_older_or_fresher():
    network = MemoryNetwork()
    hosted = trained("expert.0.1", steps=4)
    digest = state_digest(hosted)
    service = StateService(SWARM, BackendStore({"expert.0.1": hosted}))
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                         services=[service]) as receiver, node(network) as sender:
        addr = receiver.full_addrs()[0]
        for steps in (2, 6):  # a staler state, and a fresher claim: hosted copies merge through sync
            with pytest.raises(StateRefusedError) as info:
                await push_state(sender, addr, export_state(trained("expert.0.1", steps=steps)), swarm_id=SWARM)
            assert info.value.code == "hosted"
        assert hosted.updates == 4 and state_digest(hosted) == digest
        assert service.refusals["unsolicited_push"] == 2
