"""The expert server against bad callers, over raw streams: malformed headers, truncated and
oversized payloads, unknown compressions and operations get error replies; memory stays bounded
and the server keeps serving."""

from __future__ import annotations

import msgpack
import pytest
import torch
import trio

from volunteer.errors import ExpertBusyError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.experts.client import call_expert
from volunteer.experts.protocol import pack, protocol_id
from volunteer.experts.server import ExpertServer
from volunteer.experts.tensors import encode
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.streams import BufferedStream
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
CONFIG = ExpertsConfig(device="cpu", max_payload_bytes=64 * 1024, max_queue=2)


async def serve(nursery, network, config=CONFIG):
    server_host = await nursery.start(_host, network)
    backends = [make_backend("expert.0", "ffn", 8, config=config)]
    runtime_cm = open_runtime(backends, config)
    runtime = await runtime_cm.__aenter__()
    server = ExpertServer(server_host, runtime, "s", config)
    await server_host.add_service(server)
    return server_host, runtime, runtime_cm, server


async def _host(network, task_status=trio.TASK_STATUS_IGNORED):
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET) as host:
        task_status.started(host)
        await trio.sleep_forever()


async def raw_call(client, server_host, header: dict | bytes, payload: bytes = b"", eof: bool = True) -> dict:
    stream = BufferedStream(await client.new_stream(server_host.full_addrs()[0], [protocol_id("s")]))
    await stream.send_all((pack(header) if isinstance(header, dict) else header) + payload)
    if eof:
        await stream.send_eof()
    length_prefixed = await stream.receive_length_prefixed(1 << 20)
    return msgpack.unpackb(length_prefixed)


async def test_bad_requests_get_error_replies_and_the_server_keeps_serving():
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        server_host, runtime, runtime_cm, server = await serve(nursery, network)
        client = await nursery.start(_host, network)
        good_header, good_payload = encode([torch.randn(2, 8)])
        cases = [
            (b"\x05\xc1\xc1\xc1\xc1\xc1", b"", "not valid msgpack"),
            ({"op": "explode", "uid": "expert.0"}, b"", "unknown operation"),
            ({"op": "forward", "uid": "expert.0", "c": "zip", "t": good_header}, good_payload, "unknown compression"),
            ({"op": "forward", "uid": "expert.0", "t": good_header}, good_payload[:10], "truncated"),
            ({"op": "forward", "uid": "expert.0", "t": {"t": [{"d": "float32", "s": [4000, 8], "c": "none", "n": 128000}], "n": 128000}},
             b"x" * 1000, "more than"),
            ({"op": "forward", "uid": "expert.0", "t": {"t": "nope", "n": 1}}, b"", "tensor header"),
            ({"op": "backward", "uid": "expert.0", "t": good_header, "ni": 1}, good_payload, "leaves no gradients"),
            ({"op": "forward", "uid": "nobody.1", "t": good_header}, good_payload, "no expert"),
        ]
        for header, payload, fragment in cases:
            reply = await raw_call(client, server_host, header, payload)
            assert reply["ok"] is False, header
            failure = reply["e"]
            assert fragment in failure["message"], (fragment, failure)
            assert failure["peer_id"] == str(server_host.peer_id)
        assert server.errors == len(cases)
        # still serving, and the good call matches the backend
        outputs = await call_expert(client, server_host.full_addrs()[0], "expert.0", "forward", [torch.ones(3, 8)], swarm_id="s")
        assert outputs[0].shape == (3, 8)
        assert server.active_requests == 0
        await runtime_cm.__aexit__(None, None, None)
        nursery.cancel_scope.cancel()


async def test_a_silent_caller_is_dropped_and_busy_is_immediate():
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        server_host, runtime, runtime_cm, server = await serve(nursery, network)
        client = await nursery.start(_host, network)
        # a full queue answers BUSY at once instead of timing out
        import threading

        gate = threading.Event()

        def block():
            gate.wait(10)

        async def hold():
            await runtime.run_sync(block)

        nursery.start_soon(hold)
        await trio.sleep(0.05)
        calls = []

        async def one():
            try:
                await call_expert(client, server_host.full_addrs()[0], "expert.0", "forward", [torch.ones(1, 8)], swarm_id="s")
                calls.append("ok")
            except ExpertBusyError:
                calls.append("busy")

        async with trio.open_nursery() as inner:
            for _ in range(4):
                inner.start_soon(one)
            await trio.sleep(0.5)
            assert calls.count("busy") == 2  # max_queue=2 queued, the rest refused at once
            gate.set()
        assert calls.count("ok") == 2
        await runtime_cm.__aexit__(None, None, None)
        nursery.cancel_scope.cancel()
