"""TcpStream: trio's stream contract (cancellation, conflicts, closing, errors) with a ready
read or write that does not pass through the scheduler, except one in every FAIR_TURNS."""

from __future__ import annotations

import socket

import pytest
import trio

from tests.recording import TaskSteps
from volunteer.net.transport.tcpstream import FAIR_TURNS, TcpStream


def _pair() -> tuple[TcpStream, TcpStream]:
    left, right = socket.socketpair()
    return TcpStream(left), TcpStream(right)


async def test_bytes_go_through_and_a_half_close_reads_as_the_end():
    a, b = _pair()
    await a.send_all(b"hello")
    assert await b.receive_some(5) == b"hello"
    await a.send_eof()
    await a.send_eof()  # idempotent
    with pytest.raises(trio.ClosedResourceError):
        await a.send_all(b"late")  # as trio's stream says it
    assert await b.receive_some() == b""
    await b.send_all(b"back")  # the other direction still open
    assert await a.receive_some() == b"back"
    await a.aclose()
    await b.aclose()


async def test_ready_operations_yield_once_in_every_fair_turns():
    a, b = _pair()
    steps = TaskSteps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        for _ in range(FAIR_TURNS - 1):
            await a.send_all(b"x")  # the socket takes it at once: no pass of the scheduler
        assert steps.steps == 0
        await a.send_all(b"x")  # the FAIR_TURNS-th in a row yields
        assert steps.steps == 1
        assert await b.receive_some(FAIR_TURNS) == b"x" * FAIR_TURNS  # ready too: no yield
        assert steps.steps == 1
    finally:
        trio.lowlevel.remove_instrument(steps)
    await a.aclose()
    await b.aclose()


async def test_a_cancelled_write_raises_first_and_sends_nothing():
    a, b = _pair()
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await a.send_all(b"never")
    await a.send_all(b"after")
    assert await b.receive_some() == b"after"  # nothing of the cancelled write came first
    await a.aclose()
    await b.aclose()


async def test_closing_wakes_a_blocked_reader_and_later_calls_are_refused():
    a, b = _pair()
    caught: list[BaseException] = []

    async def reader() -> None:
        try:
            await a.receive_some()
        except trio.ClosedResourceError as exc:
            caught.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.sleep(0.01)  # blocked: nothing to read
        await a.aclose()
    assert len(caught) == 1
    with pytest.raises(trio.ClosedResourceError):
        await a.send_all(b"x")
    with pytest.raises(trio.ClosedResourceError):
        await a.receive_some()
    await b.aclose()


async def test_a_second_reader_is_a_conflict_and_a_dead_peer_breaks_writes():
    a, b = _pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.receive_some)
        await trio.sleep(0.01)
        with pytest.raises(trio.BusyResourceError):
            await a.receive_some()
        await b.send_all(b"x")  # lets the first reader finish
    await b.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first writes may still land in the socket's buffer
            await a.send_all(b"y" * 65536)
    await a.aclose()


async def test_a_large_write_waits_for_the_reader_and_arrives_whole():
    a, b = _pair()
    payload = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers
    got = bytearray()

    async def read_all() -> None:
        while len(got) < len(payload):
            got.extend(await b.receive_some(65536))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await a.send_all(payload)
    assert bytes(got) == payload
    await a.aclose()
    await b.aclose()
