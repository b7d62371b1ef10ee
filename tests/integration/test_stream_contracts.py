"""The six stream classes against trio's own stream contract (trio.testing.check_*_stream).

Every class is a ``trio.abc.HalfCloseableStream``, so each must pass
``check_half_closeable_stream``: send/receive in both directions, ``send_eof``, ``aclose``
semantics (ClosedResourceError after our own close, b"" after the peer's EOF), conflict detection
for concurrent calls, cancellation. Where a class has no natural way to clog its send side (its
flow control is the wrapped stream's), the clogged maker is None and trio skips those checks.

Each pair of streams is built the way the Host builds them, on in-memory byte streams (Noise over
a memory pair, yamux over Noise, NetStream over a Host pair on the memory transport): no sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import trio
import trio.testing

from volunteer.net.connection import NetStream
from volunteer.net.stack import open_stack
from volunteer.net.identity import KeyPair
from volunteer.net.multistream import LazyStream
from volunteer.net.noise import NoiseConnection, secure_inbound, secure_outbound
from volunteer.net.streams import BufferedStream
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.net.yamux import YamuxConnection, YamuxStream

Pair = tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]
PROTOCOL = "/test/contract/1.0.0"


# --- BufferedStream: wraps any stream; its contract is the wrapped stream's ----------------------
async def buffered_pair(make: Callable[[], Pair]) -> Pair:
    left, right = make()
    return BufferedStream(left), BufferedStream(right)


async def test_buffered_stream_contract():
    # The two-way form: BufferedStream's half-close is the wrapped stream's send_eof, and trio's
    # memory pairs (StapledStream) half-close by closing their send side, which trio certifies
    # as two-way streams only. A wrapped stream that does half-close conformantly (yamux) is
    # checked through NetStream below.
    await trio.testing.check_two_way_stream(
        partial(buffered_pair, trio.testing.memory_stream_pair),
        # lockstep streams never buffer: a send_all blocks until the other side reads
        partial(buffered_pair, trio.testing.lockstep_stream_pair),
    )


# --- NoiseConnection: a real XX handshake over a memory pair ------------------------------------
async def noise_pair(make: Callable[[], Pair]) -> tuple[NoiseConnection, NoiseConnection]:
    left, right = make()
    a, b = KeyPair.generate(), KeyPair.generate()
    results: dict[str, NoiseConnection] = {}

    async def outbound() -> None:
        results["out"] = await secure_outbound(left, a, b.peer_id)

    async def inbound() -> None:
        results["in"] = await secure_inbound(right, b)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbound)
        nursery.start_soon(inbound)
    return results["out"], results["in"]


async def test_noise_connection_contract():
    # No clogged maker: NoiseConnection queues concurrent send_all calls on purpose (one send
    # lock: yamux's data writers and its control writer share the secure channel), where trio's
    # clogged checks want the second caller to get BusyResourceError.
    await trio.testing.check_two_way_stream(partial(noise_pair, trio.testing.memory_stream_pair), None)


# --- YamuxStream: two yamux connections over Noise; their reader tasks live in ``nursery`` -------
async def yamux_pair(nursery: trio.Nursery) -> tuple[YamuxStream, YamuxStream]:
    secure_client, secure_server = await noise_pair(trio.testing.memory_stream_pair)
    client = YamuxConnection(secure_client, is_client=True)
    server = YamuxConnection(secure_server, is_client=False)
    await nursery.start(client.run)
    await nursery.start(server.run)
    opened = await client.open_stream()
    accepted = await server.accept_stream()
    return opened, accepted


async def test_yamux_stream_contract():
    # No clogged maker: a yamux stream's send side blocks only once the peer's 256 KiB window is
    # spent, and trio's clogged checks need a send_all that blocks on its first byte.
    async with trio.open_nursery() as nursery:
        await trio.testing.check_half_closeable_stream(partial(yamux_pair, nursery), None)
        nursery.cancel_scope.cancel()


# --- NetStream and LazyStream: a Host pair on the memory transport -----------------------------
class HostPair:
    """Two Hosts; ``make`` opens one stream from the first to the second and returns both ends:
    the outbound one a NetStream over a LazyStream (one protocol proposed: 0-RTT negotiation),
    the inbound one a NetStream over a BufferedStream (what a handler gets)."""

    def __init__(self, dialer, listener) -> None:
        self.dialer = dialer
        self.listener = listener
        self.inbound_send, self.inbound_receive = trio.open_memory_channel[NetStream](0)
        listener.set_handler(PROTOCOL, self._handle)

    async def _handle(self, stream: NetStream) -> None:
        await self.inbound_send.send(stream)
        await trio.sleep_forever()  # returning would close the stream under the test; the Host's close ends this

    async def make(self) -> tuple[NetStream, NetStream]:
        outbound = await self.dialer.new_stream(self.listener.peer_id, [PROTOCOL])
        # A lazy stream says nothing until its first write; an empty one sends the proposal,
        # so the listener's handler starts and hands us the other end.
        await outbound.send_all(b"")
        inbound = await self.inbound_receive.receive()
        return outbound, inbound


async def test_net_stream_and_lazy_stream_contract():
    network = MemoryNetwork()
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)]) as listener, open_stack(
        transports=[MemoryTransport(network)]
    ) as dialer:
        await dialer.connect(listener.full_addrs()[0])
        pair = HostPair(dialer, listener)
        outbound, inbound = await pair.make()
        assert isinstance(outbound, NetStream) and isinstance(outbound._inner, LazyStream)
        assert isinstance(inbound, NetStream) and isinstance(inbound._inner, BufferedStream)
        await outbound.aclose()
        await inbound.aclose()
        await trio.testing.check_half_closeable_stream(pair.make, None)



# --- TcpStream: a real socket pair (the kernel's buffers are the flow control) ------------------
async def tcp_pair() -> Pair:
    import socket

    from volunteer.net.transport.tcpstream import TcpStream

    left, right = socket.socketpair()
    # fair_turns=1: every operation yields, as the contract has it. The default yields only
    # when it waited or after FAIR_TURNS ready ones (tests/unit/test_tcpstream.py checks that);
    # everything else checked here is the same at any setting.
    return TcpStream(left, fair_turns=1), TcpStream(right, fair_turns=1)


async def clogged_tcp_pair() -> Pair:
    # the kernel's buffers filled both ways, as trio's own SocketStream tests clog theirs
    left, right = await tcp_pair()
    for stream in (left, right):
        try:
            while True:
                stream.socket.send(b"x" * 65536)
        except BlockingIOError:
            pass
    return left, right


async def test_tcp_stream_contract():
    await trio.testing.check_half_closeable_stream(tcp_pair, clogged_tcp_pair)
