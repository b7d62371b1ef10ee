"""hivemind's RPC framings driven over real Hosts (memory transport): unary and stream calls,
errors carried back to the caller, the caller's identity taken from the connection, bad frames."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from volunteer.hivemind import HivemindRPCError
from volunteer.hivemind.framing import UnaryCall, encode_call, new_call_id
from volunteer.hivemind.rpc import call_stream, call_unary, serve_stream, serve_unary
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def two_hosts(stack: AsyncExitStack):
    network = MemoryNetwork()
    hosts = [
        await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET)
        )
        for _ in range(2)
    ]
    await hosts[1].connect(hosts[0].full_addrs()[0])
    return hosts


@pytest.mark.trio_timeout(20)
async def test_unary_calls_answer_errors_and_use_the_connection_identity():
    async with AsyncExitStack() as stack:
        server, client = await two_hosts(stack)
        seen = []

        async def echo(data, sender):
            seen.append(sender)
            if data == b"fail":
                raise ValueError("asked to fail")
            return data[::-1]

        server.set_handler("Test.rpc_echo", lambda s: serve_unary(s, echo, timeout=5))
        assert await call_unary(client, server.peer_id, "Test.rpc_echo", b"abc", timeout=5) == b"cba"
        with pytest.raises(HivemindRPCError, match="asked to fail"):
            await call_unary(client, server.peer_id, "Test.rpc_echo", b"fail", timeout=5)
        # a caller that names someone else in the message is still itself
        stream = await client.new_stream(server.peer_id, ["Test.rpc_echo"])
        await stream.send_all(encode_call(UnaryCall(new_call_id(), "Test.rpc_echo", b"x", peer=server.peer_id.to_bytes())))
        await stream.receive_some()
        await stream.aclose()
        assert seen == [client.peer_id] * 3


@pytest.mark.trio_timeout(20)
async def test_stream_calls_carry_many_messages_and_errors():
    async with AsyncExitStack() as stack:
        server, client = await two_hosts(stack)

        async def split(requests, sender):
            if requests == [b"fail"]:
                raise RuntimeError("bad input")
            for request in requests:
                for byte in request:
                    yield bytes([byte])

        server.set_handler("Test.rpc_split_stream", lambda s: serve_stream(s, split, timeout=5))
        outputs = await call_stream(client, server.peer_id, "Test.rpc_split_stream", [b"ab", b"", b"c"], timeout=5)
        assert outputs == [b"a", b"b", b"c"]
        with pytest.raises(HivemindRPCError, match="bad input"):
            await call_stream(client, server.peer_id, "Test.rpc_split_stream", [b"fail"], timeout=5)
        # a frame that claims more than the bound: the stream is reset, the server keeps serving
        stream = await client.new_stream(server.peer_id, ["Test.rpc_split_stream"])
        await stream.send_all(b"\x00" + (2**62).to_bytes(8, "big"))
        with trio.move_on_after(5):
            try:
                assert await stream.receive_some() == b""
            except trio.BrokenResourceError:
                pass
        assert await call_stream(client, server.peer_id, "Test.rpc_split_stream", [b"z"], timeout=5) == [b"z"]
