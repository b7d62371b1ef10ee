"""HivemindExperts over real Hosts (memory transport): our runtime's experts answer hivemind's
``ConnectionHandler.rpc_*`` calls, unary and streamed, with admission as our own server's, errors
as hivemind RPC errors, and declarations in the hivemind DHT."""

from __future__ import annotations

from contextlib import AsyncExitStack

import numpy as np
import pytest
import torch
import trio

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.hivemind import HivemindDHT, HivemindExperts, HivemindRPCError
from volunteer.hivemind import expert_wire as wire
from volunteer.hivemind.framing import DelimitedDecoder, FrameDecoder, FrameKind, UnaryCall, encode_call, encode_frame, new_call_id, parse_reply
from volunteer.hivemind.limits import ExpertLimits
from volunteer.hivemind.rpc import call_stream, call_unary
from volunteer.hivemind.serializer import TensorDescriptor, loads
from volunteer.hivemind.pb.hm_runtime_pb2 import ExpertInfo
from volunteer.net.resources import ResourceManager
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
HIDDEN = 8


async def setup(
    stack: AsyncExitStack, *, limits: ExpertLimits = ExpertLimits(), uids=("ffn.0", "ffn.1"), per_peer: int = 64 << 20
):
    network = MemoryNetwork()
    config = ExpertsConfig(device="cpu", hivemind_request_bytes_per_peer=per_peer)
    runtime = await stack.enter_async_context(
        open_runtime([make_backend(uid, "ffn", HIDDEN, config=config) for uid in uids], config)
    )
    server_dht, client_dht = HivemindDHT(), HivemindDHT()
    experts = HivemindExperts(runtime, dht=server_dht, config=config, limits=limits)
    server = await stack.enter_async_context(
        open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=[server_dht])
    )
    client = await stack.enter_async_context(
        open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=[client_dht])
    )
    await client_dht.bootstrap([server.full_addrs()[0]])
    await server.add_service(experts)
    return server, client, client_dht, experts, runtime


async def forward(client, server, uid, x):
    data = await call_unary(client, server.peer_id, wire.FORWARD, wire.request(uid, [x]), timeout=10)
    return wire.parse_response(data)


@pytest.mark.trio_timeout(30)
async def test_info_forward_backward_unary_and_streamed_match_the_runtime():
    async with AsyncExitStack() as stack:
        server, client, _, experts, runtime = await setup(stack)
        data = await call_unary(client, server.peer_id, wire.INFO, wire.info_request("ffn.0"), timeout=10)
        info = loads(ExpertInfo.FromString(data).serialized_info)
        descriptor = TensorDescriptor(size=(None, HIDDEN), dtype="torch.float32")
        assert info == {"forward_schema": ((descriptor,), {}), "outputs_schema": descriptor, "keyword_names": ()}

        x = np.random.default_rng(0).standard_normal((4, HIDDEN)).astype(np.float32)
        (y,) = await forward(client, server, "ffn.0", x)
        (expected,) = await runtime.forward("ffn.0", [torch.from_numpy(x)])
        np.testing.assert_allclose(y, expected.numpy(), rtol=1e-6)

        frames = await call_stream(client, server.peer_id, wire.FORWARD_STREAM, wire.stream_request("ffn.0", [x]), timeout=10)
        np.testing.assert_allclose(wire.parse_stream_response(frames)[0], y, rtol=1e-6)

        grad = np.ones_like(y)
        data = await call_unary(client, server.peer_id, wire.BACKWARD, wire.request("ffn.0", [x, grad]), timeout=10)
        (grad_x,) = wire.parse_response(data)
        assert grad_x.shape == x.shape and np.isfinite(grad_x).all()
        frames = await call_stream(
            client, server.peer_id, wire.BACKWARD_STREAM, wire.stream_request("ffn.0", [x, grad]), timeout=10
        )
        assert wire.parse_stream_response(frames)[0].shape == x.shape
        assert runtime.backends["ffn.0"].updates == 2


@pytest.mark.trio_timeout(30)
async def test_streamed_tensors_split_into_many_parts_are_joined():
    async with AsyncExitStack() as stack:
        server, client, *_ = await setup(stack, limits=ExpertLimits(stream_part_bytes=40))
        x = np.arange(6 * HIDDEN, dtype=np.float32).reshape(6, HIDDEN) / 100
        requests = wire.stream_request("ffn.1", [x], limits=ExpertLimits(stream_part_bytes=40))
        assert len(requests) > 1
        frames = await call_stream(client, server.peer_id, wire.FORWARD_STREAM, requests, timeout=10)
        assert len(frames) > 1
        (unary,) = await forward(client, server, "ffn.1", x)
        np.testing.assert_allclose(wire.parse_stream_response(frames)[0], unary, rtol=1e-6)


@pytest.mark.trio_timeout(30)
async def test_errors_reach_the_caller_and_the_service_keeps_serving():
    async with AsyncExitStack() as stack:
        server, client, _, experts, runtime = await setup(stack)
        x = np.zeros((2, HIDDEN), np.float32)
        with pytest.raises(HivemindRPCError, match="ExpertInputError.*expected float32\\[batch, 8\\]"):
            await forward(client, server, "ffn.0", np.zeros((2, HIDDEN + 1), np.float32))
        with pytest.raises(HivemindRPCError, match="UnknownExpertError"):
            await forward(client, server, "ffn.9", x)
        with pytest.raises(HivemindRPCError, match="UnknownExpertError"):
            await call_unary(client, server.peer_id, wire.INFO, wire.info_request("nope.0"), timeout=10)
        with pytest.raises(HivemindRPCError, match="RemoteProtocolError|HivemindFrameError"):
            await call_unary(client, server.peer_id, wire.FORWARD, b"\xff\xff\xff", timeout=10)
        with pytest.raises(HivemindRPCError, match="ExpertInputError"):
            await call_stream(client, server.peer_id, wire.FORWARD_STREAM,
                              wire.stream_request("ffn.0", [np.zeros((2, 3), np.float32)]), timeout=10)
        # backward on an expert this caller never ran forward on is refused, as our server refuses it
        with pytest.raises(HivemindRPCError, match="ExpertBackwardRefusedError"):
            await call_unary(client, server.peer_id, wire.BACKWARD, wire.request("ffn.1", [x, x]), timeout=10)
        assert experts.refusals["backward_without_forward"] == 1
        assert server.service(ResourceManager).refusals()["hivemind-experts"]["backward_without_forward"] == 1
        assert runtime.backends["ffn.1"].updates == 0
        assert experts.door.held == 0
        (y,) = await forward(client, server, "ffn.0", x)
        assert y.shape == (2, HIDDEN)


@pytest.mark.trio_timeout(30)
async def test_request_bytes_over_the_budget_are_refused_busy():
    async with AsyncExitStack() as stack:
        server, client, _, experts, _ = await setup(stack, per_peer=16)  # fewer bytes than one request
        with pytest.raises(HivemindRPCError, match="HivemindBusy"):
            await forward(client, server, "ffn.0", np.zeros((2, HIDDEN), np.float32))
        assert experts.door.refusals["peer_request_bytes"] == 1
        # counted where every refusal is: the resource manager (volunteer status --json, metrics)
        assert server.service(ResourceManager).refusals()["hivemind-experts-peer"] == {"memory": 1}


@pytest.mark.trio_timeout(30)
async def test_experts_are_declared_the_hivemind_way():
    async with AsyncExitStack() as stack:
        server, client, client_dht, experts, _ = await setup(stack, uids=("ffn.0", "ffn.1", "grid.2.3", "not_hivemind"))
        assert experts.skipped == ["not_hivemind"]
        with trio.fail_after(10):
            while sorted(experts.declared) != ["ffn.0", "ffn.1", "grid.2.3"]:
                await trio.sleep(0.01)
        peer = server.peer_id.to_base58()
        found = await client_dht.get("ffn.1")
        assert found is not None and found.value == peer
        assert 0 < found.expiration_time - experts.clock() <= 60
        flat = await client_dht.get("ffn.0.")
        assert {k: v.value for k, v in flat.value.items.items()} == {-1: ("ffn.0", peer)}
        grid = await client_dht.get("grid.2.")
        assert {k: v.value for k, v in grid.value.items.items()} == {3: ("grid.2.3", peer)}
        assert await client_dht.get("not_hivemind") is None


async def wait_for(predicate, *, steps: int = 200) -> None:
    for _ in range(steps):
        if predicate():
            return
        await trio.sleep(0.01)
    raise AssertionError("condition never held")


@pytest.mark.trio_timeout(30)
async def test_a_stream_call_is_refused_when_its_frame_header_arrives_before_its_body():
    async with AsyncExitStack() as stack:
        server, client, _, experts, _ = await setup(stack, limits=ExpertLimits(read_timeout=5), per_peer=4096)
        stream = await client.new_stream(server.peer_id, [wire.FORWARD_STREAM])
        # announce 1 MiB, send only the header and a few bytes: the refusal comes back at once
        await stream.send_all(encode_frame(b"\0" * (1 << 20))[:20])
        decoder = FrameDecoder()
        frames: list = []
        while not frames:
            frames = decoder.receive_data(await stream.receive_some(1 << 16))
        assert frames[0].kind is FrameKind.ERROR and "HivemindBusy" in frames[0].error_message
        assert experts.door.refusals["peer_request_bytes"] == 1
        await stream.send_eof()
        await wait_for(lambda: experts.door.held == 0)
        await stream.aclose()
        # the service keeps serving calls that fit
        (y,) = await forward(client, server, "ffn.0", np.zeros((2, HIDDEN), np.float32))
        assert y.shape == (2, HIDDEN)
        assert experts.door.held == 0


@pytest.mark.trio_timeout(30)
async def test_a_unary_call_is_refused_on_its_length_prefix_and_its_body_read_past_unkept():
    async with AsyncExitStack() as stack:
        server, client, _, experts, _ = await setup(stack, per_peer=4096)
        call = UnaryCall(new_call_id(), wire.FORWARD, wire.request("ffn.0", [np.zeros((64, 512), np.float32)]))
        data = encode_call(call)
        stream = await client.new_stream(server.peer_id, [wire.FORWARD])
        await stream.send_all(data[:64])
        await wait_for(lambda: experts.door.refusals["peer_request_bytes"] == 1)  # refused before the body
        assert experts.door.held == 0
        await stream.send_all(data[64:])
        decoder = DelimitedDecoder()
        body = None
        while body is None:
            body = decoder.receive_data(await stream.receive_some(1 << 16))
        reply = parse_reply(body)
        assert reply.call_id == call.call_id and "HivemindBusy" in (reply.error or "")
        await stream.aclose()
        assert experts.calls == 0  # the request never reached the runtime
