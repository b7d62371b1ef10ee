"""`/perf/1.0.0` between two hosts: exact byte counts, and the server's per-peer limits."""

from __future__ import annotations

import struct

import pytest
import trio

from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.perf import PERF, PerfLimits, PerfServer, perf_stream
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport


def transports(network):
    return [MemoryTransport(network)]


async def test_perf_exact_bytes_both_ways():
    network = MemoryNetwork()
    with trio.fail_after(30):
        async with open_stack(listen=["/memory/0"], transports=transports(network)) as server, open_stack(
            transports=transports(network)
        ) as client:
            conn = await client.connect(server.full_addrs()[0])
            uploaded, downloaded = [], []
            stream = await conn.new_stream([PERF])
            up, down = await perf_stream(stream, 3_000_001, 5_000_003, uploaded.append, downloaded.append)
            assert sum(uploaded) == 3_000_001 and sum(downloaded) == 5_000_003
            assert up >= 0 and down >= 0
            assert server.service(PerfServer).stats.bytes_received == 3_000_001
            assert server.service(PerfServer).stats.bytes_sent == 5_000_003
            # Zero-byte runs are legal too.
            stream = await conn.new_stream([PERF])
            await perf_stream(stream, 0, 0)


async def test_perf_budget_refuses_with_reset():
    network = MemoryNetwork()
    options = StackOptions(perf=PerfLimits(max_bytes_per_minute_per_peer=1_000_000))
    with trio.fail_after(30):
        async with open_stack(listen=["/memory/0"], transports=transports(network), options=options) as server, open_stack(
            transports=transports(network)
        ) as client:
            conn = await client.connect(server.full_addrs()[0])
            stream = await conn.new_stream([PERF])
            await perf_stream(stream, 100_000, 400_000)
            stream = await conn.new_stream([PERF])
            with pytest.raises(trio.BrokenResourceError):
                await perf_stream(stream, 0, 900_000)  # over the per-minute budget
            assert server.service(PerfServer).stats.refused == 1


async def test_perf_concurrency_limit():
    network = MemoryNetwork()
    options = StackOptions(perf=PerfLimits(max_streams_per_peer=1))
    with trio.fail_after(30):
        async with open_stack(listen=["/memory/0"], transports=transports(network), options=options) as server, open_stack(
            transports=transports(network)
        ) as client:
            conn = await client.connect(server.full_addrs()[0])
            first = await conn.new_stream([PERF])
            await first.send_all(struct.pack(">Q", 10))  # holds the only slot: never closes its upload
            while not server.service(PerfServer)._active:
                await trio.sleep(0.01)
            second = await conn.new_stream([PERF])
            with pytest.raises(trio.BrokenResourceError):
                await perf_stream(second, 10, 10)
            await first.send_eof()
            assert len(await first.receive_some()) == 10
