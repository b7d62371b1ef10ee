"""Host end to end on the in-memory transport and on loopback TCP: upgrade, streams, identify, ping,
connection reuse, and hostile peers that must only hurt their own connection.

Tests of the Host itself open a bare one (``open_host``); those that need identify, ping or the NAT
wing open the standard stack (``open_stack``)."""

from __future__ import annotations

import os

import pytest
import trio

from volunteer.errors import DialError, HandshakeError, NegotiationError, PeerIDMismatch
from volunteer.net.events import PeerConnected, PeerDisconnected, PeerIdentified
from volunteer.net.host import HostConfig, open_host
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.resources import ResourceLimits, ResourceManager
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.net.transport.tcp import TcpTransport
from volunteer.net.identify import identify_of
from volunteer.net.ping import ping_of

ECHO = "/test/echo/1.0.0"


async def echo(stream) -> None:
    while True:
        data = await stream.receive_some(65536)
        if not data:
            break
        await stream.send_all(data)
    await stream.send_eof()


async def read_all(stream) -> bytes:
    chunks = []
    while True:
        data = await stream.receive_some(1 << 20)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


async def roundtrip(stream, payload: bytes) -> bytes:
    async with trio.open_nursery() as nursery:
        async def writer():
            await stream.send_all(payload)
            await stream.send_eof()

        nursery.start_soon(writer)
        return await read_all(stream)


@pytest.fixture(params=["memory", "tcp"])
def listen_addr(request):
    return "/memory/0" if request.param == "memory" else "/ip4/127.0.0.1/tcp/0"


def transports():
    return [TcpTransport(), MemoryTransport(NETWORK)]


NETWORK = MemoryNetwork()


async def test_echo_identify_ping(listen_addr):
    with trio.fail_after(20):
        async with open_stack(listen=[listen_addr], transports=transports()) as server, open_stack(
            transports=transports()
        ) as client:
            server.set_handler(ECHO, echo)
            addr = server.full_addrs()[0]
            payload = os.urandom(300_000)
            stream = await client.new_stream(addr, [ECHO])
            assert stream.protocol == ECHO
            sent_before, received_before = stream.connection.bytes_sent, stream.connection.bytes_received
            assert await roundtrip(stream, payload) == payload
            # the dashboard's traffic column: stream payload both ways on this connection (plus the
            # few hundred bytes of identify running beside it)
            assert len(payload) <= stream.connection.bytes_sent - sent_before < len(payload) + 4096
            assert len(payload) <= stream.connection.bytes_received - received_before < len(payload) + 4096

            info = await identify_of(client).ask(server.peer_id)
            assert info.peer_id == server.peer_id
            assert ECHO in info.protocols and "/ipfs/ping/1.0.0" in info.protocols
            assert info.agent_version.startswith("volunteer/")
            assert info.observed_addr is not None
            assert client.peerstore.info(server.peer_id).agent_version == info.agent_version

            pinger = await ping_of(client).open(server.peer_id)
            rtts = [await pinger.ping() for _ in range(3)]
            assert all(0 <= rtt < 5 for rtt in rtts)
            await pinger.aclose()


async def test_connection_reused_for_streams_and_peer_id_dials():
    with trio.fail_after(20):
        async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], transports=transports()) as server, open_host(transports=transports()) as client:
            server.set_handler(ECHO, echo)
            first = await client.connect(server.full_addrs()[0])
            # Dial by peer ID: addresses come from the peerstore, and the open connection is reused.
            streams = [await client.new_stream(server.peer_id, [ECHO]) for _ in range(5)]
            assert all(s.connection is first for s in streams)
            assert len(client.connections(server.peer_id)) == 1
            for s in streams:
                assert await roundtrip(s, b"abc") == b"abc"


async def test_wrong_peer_id_is_refused_and_server_keeps_serving():
    with trio.fail_after(20):
        async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], transports=transports()) as server, open_host(transports=transports()) as client:
            server.set_handler(ECHO, echo)
            impostor = KeyPair.generate().peer_id
            wrong = server.addrs[0].with_peer_id(impostor)
            with pytest.raises(DialError) as excinfo:
                await client.connect(wrong)
            assert any(isinstance(c, PeerIDMismatch) for c in excinfo.value.causes.values())
            stream = await client.new_stream(server.full_addrs()[0], [ECHO])
            assert await roundtrip(stream, b"still here") == b"still here"


async def test_unknown_protocol_is_refused():
    with trio.fail_after(20):
        async with open_host(listen=["/memory/0"], transports=transports()) as server, open_host(
            transports=transports()
        ) as client:
            stream = await client.new_stream(server.full_addrs()[0], ["/nobody/1.0.0"])
            with pytest.raises(NegotiationError):
                await stream.send_all(b"hi")
                await stream.receive_some()
            with pytest.raises(NegotiationError):
                await client.new_stream(server.peer_id, ["/nobody/1.0.0", "/nobody/2.0.0"])


@pytest.mark.slow
async def test_garbage_and_slowloris_only_close_their_connection():
    config = HostConfig(handshake_timeout=1.0)
    with trio.fail_after(30):
        async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], transports=transports(), config=config) as server, open_host(transports=transports()) as client:
            server.set_handler(ECHO, echo)
            host, port = str(server.addrs[0]).split("/")[2], int(str(server.addrs[0]).split("/")[4])
            garbage = await trio.open_tcp_stream(host, port)
            await garbage.send_all(os.urandom(5000))
            silent = await trio.open_tcp_stream(host, port)  # never says anything
            # The server closes both without hurting anyone else.
            with trio.fail_after(5):
                while await garbage.receive_some(65536):
                    pass
                while await silent.receive_some(65536):
                    pass
            stream = await client.new_stream(server.full_addrs()[0], [ECHO])
            assert await roundtrip(stream, b"ok") == b"ok"
            await garbage.aclose()
            await silent.aclose()


async def test_handler_crash_resets_stream_but_not_connection():
    async def broken(stream):
        raise RuntimeError("bug in a handler")

    with trio.fail_after(20):
        async with open_host(listen=["/memory/0"], transports=transports()) as server, open_host(
            transports=transports()
        ) as client:
            server.set_handler("/broken/1", broken)
            server.set_handler(ECHO, echo)
            stream = await client.new_stream(server.full_addrs()[0], ["/broken/1"])
            with pytest.raises(trio.BrokenResourceError):
                await stream.send_all(b"x")
                await read_all(stream)
            stream = await client.new_stream(server.peer_id, [ECHO])
            assert await roundtrip(stream, b"fine") == b"fine"


async def test_events_and_clean_close():
    with trio.fail_after(20):
        async with open_stack(listen=["/memory/0"], transports=transports()) as server:
            events = server.events.subscribe()
            async with open_stack(transports=transports()) as client:
                await client.connect(server.full_addrs()[0])
                kinds = set()
                while not {PeerConnected, PeerIdentified} <= kinds:
                    kinds.add(type(await events.receive()))
            # The client closed: the server sees the disconnect.
            while True:
                event = await events.receive()
                if isinstance(event, PeerDisconnected):
                    break
            assert not server.connections()


async def test_dial_nobody_fails_fast():
    with trio.fail_after(10):
        async with open_host(transports=transports()) as client:
            with pytest.raises(DialError):
                await client.connect(Multiaddr("/ip4/127.0.0.1/tcp/1"))
            with pytest.raises(DialError):
                await client.connect(KeyPair.generate().peer_id)


@pytest.mark.slow
async def test_thousand_concurrent_streams_on_one_connection():
    # A thousand at once of one protocol from one peer is past the default per-peer, per-protocol
    # inbound limit (512): the server is given room for them, so that the test does not hang on
    # how fast it happens to finish the first ones.
    room = ResourceManager(ResourceLimits(peer_protocol_streams_inbound=1000))
    with trio.fail_after(60):
        async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], transports=transports(), services=[room]) as server, open_host(transports=transports()) as client:
            server.set_handler(ECHO, echo)
            conn = await client.connect(server.full_addrs()[0])
            results = {}

            async def one(i):
                stream = await conn.new_stream([ECHO])
                payload = i.to_bytes(4, "big") * 1000
                results[i] = await roundtrip(stream, payload) == payload

            async with trio.open_nursery() as nursery:
                for i in range(1000):
                    nursery.start_soon(one, i)
            assert len(results) == 1000 and all(results.values())
            assert len(client.connections(server.peer_id)) == 1


async def test_handshake_error_type_for_non_libp2p_listener():
    async def not_libp2p(stream):
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, not_libp2p, 0, )
            port = listeners[0].socket.getsockname()[1]
            async with open_host(transports=transports()) as client:
                with pytest.raises(DialError) as excinfo:
                    await client.connect(Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"))
                assert any(isinstance(c, HandshakeError) for c in excinfo.value.causes.values()) or "handshake" in str(excinfo.value).lower()
            nursery.cancel_scope.cancel()


async def test_a_silent_address_does_not_hold_up_the_others():
    """Peers behind NAT advertise addresses that never answer: dials are staggered, not serial."""
    config = HostConfig(handshake_timeout=600, dial_timeout=600)  # a serial dial would hang here
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async def silent(stream):
                await trio.sleep_forever()

            listeners = await nursery.start(trio.serve_tcp, silent, 0)
            silent_port = listeners[0].socket.getsockname()[1]
            async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], transports=transports()) as server, open_host(transports=transports(), config=config) as client:
                server.set_handler(ECHO, echo)
                client.peerstore.add_addrs(server.peer_id, [server.addrs[0], Multiaddr(f"/ip4/127.0.0.1/tcp/{silent_port}")])
                conn = await client.connect(server.peer_id)
                assert conn.remote_addr == server.addrs[0]
            nursery.cancel_scope.cancel()


async def test_standard_protocols_are_services_and_a_given_one_replaces_the_standard_one():
    from volunteer.net.identify import IDENTIFY, Identify
    from volunteer.net.nat.dcutr import DCUTR, HolePuncher
    from volunteer.net.nat.relay_client import RelayClient
    from volunteer.net.perf import PERF, PerfServer
    from volunteer.net.ping import PING, Ping

    network = MemoryNetwork()
    mine = Identify(identify_on_connect=False)
    with trio.fail_after(10):
        async with open_stack(transports=[MemoryTransport(network)], services=[mine]) as host:
            assert host.service(Identify) is mine and sum(isinstance(s, Identify) for s in host.services) == 1
            for kind in (Ping, PerfServer, RelayClient, HolePuncher):
                assert host.service(kind) is not None
            assert {IDENTIFY, PING, PERF, DCUTR} <= set(host.protocols)
            assert isinstance(host.service(PerfServer), PerfServer)
        options = StackOptions(perf=None, relay_client=False, hole_punching=False)
        async with open_stack(transports=[MemoryTransport(network)], options=options) as bare:
            assert bare.service(PerfServer) is None and PERF not in bare.protocols and DCUTR not in bare.protocols
            assert bare.service(RelayClient) is None and bare.service(HolePuncher) is None


async def test_a_bare_host_runs_only_what_it_is_given_and_its_resource_manager():
    from volunteer.net.identify import IDENTIFY, IDENTIFY_PUSH, Identify

    network = MemoryNetwork()
    with trio.fail_after(10):
        async with open_host(transports=[MemoryTransport(network)]) as bare:
            assert [type(s) for s in bare.services] == [ResourceManager] and bare.protocols == []
            assert bare.resources is bare.service(ResourceManager)
        mine = Identify(identify_on_connect=False)
        async with open_host(transports=[MemoryTransport(network)], services=[mine]) as host:
            assert host.services[0] is mine and host.protocols == sorted([IDENTIFY, IDENTIFY_PUSH])


async def test_identify_feeds_the_observer_which_publishes_our_observed_address():
    from volunteer.net.events import ObservedAddrChanged

    with trio.fail_after(10):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as client:
            with client.events.subscribe(ObservedAddrChanged) as changes:
                await client.connect(server.full_addrs()[0])
                event = await changes.receive()
                assert isinstance(event, ObservedAddrChanged) and len(event.addrs) == 1
                assert event.addrs[0].value_for("ip4") == "127.0.0.1"


async def test_an_expected_punch_is_classified_as_ours():
    from volunteer.net.transport.base import Direction, Path
    from volunteer.net.nat.dcutr import HolePuncher
    from volunteer.net.transport.base import RawConnection

    with trio.fail_after(10):
        async with open_stack() as host:
            puncher = host.service(HolePuncher)
            peer = KeyPair.generate().peer_id
            addr = Multiaddr("/ip4/203.0.113.5/tcp/4001")
            raw = RawConnection(None, Multiaddr("/ip4/127.0.0.1/tcp/4001"), addr, None)
            assert puncher.classify_inbound(raw) is None
            with puncher._expecting(peer, [addr], Direction.OUTBOUND):
                verdict = puncher.classify_inbound(raw)
                assert verdict.role is Direction.OUTBOUND and verdict.expected_peer == peer and verdict.path is Path.HOLE_PUNCHED
            with puncher._expecting(peer, [addr], Direction.INBOUND):
                assert puncher.classify_inbound(raw) is None  # as the server of the upgrade, nothing to claim
            assert puncher.classify_inbound(raw) is None
            # a symmetric NAT dialling our port mapping: the peer's IP, a port it never told us
            renumbered = RawConnection(None, Multiaddr("/ip4/127.0.0.1/tcp/4001"), Multiaddr("/ip4/203.0.113.5/tcp/61111"), None)
            other_ip = RawConnection(None, Multiaddr("/ip4/127.0.0.1/tcp/4001"), Multiaddr("/ip4/203.0.113.6/tcp/61111"), None)
            with puncher._expecting(peer, [addr], Direction.OUTBOUND):
                verdict = puncher.classify_inbound(renumbered)
                assert verdict.role is Direction.OUTBOUND and verdict.expected_peer == peer
                assert puncher.classify_inbound(other_ip) is None
            assert puncher.classify_inbound(renumbered) is None


async def test_a_refused_dial_is_dialled_again_while_the_caller_allows():
    """A punched SYN refused by the peer's router is re-sent 50 ms later, within the attempt."""
    transport = TcpTransport()
    with trio.socket.socket() as probe:  # a free port nobody listens on yet
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")
    with pytest.raises(ConnectionRefusedError):
        await transport.dial(target)
    assert transport.refused_redials == 0
    async with trio.open_nursery() as nursery:
        ready = trio.Event()

        async def listen_later():
            await trio.sleep(0.2)
            listener = (await trio.open_tcp_listeners(port, host="127.0.0.1"))[0]
            ready.set()
            async with listener:
                stream = await listener.accept()
                await stream.aclose()

        nursery.start_soon(listen_later)
        raw = await transport.dial(target, redial_refused_for=2.0)
        await ready.wait()
        await raw.abort()
    assert transport.refused_redials >= 1
    with pytest.raises(ConnectionRefusedError):  # the window is over: the refusal stands
        await transport.dial(target, redial_refused_for=0.1)


async def test_the_host_builds_no_transport_the_stack_hands_in_tcp_and_memory():
    # host.py constructs no transport: a bare Host dials nothing, the stack's list is what it has
    from volunteer.net.stack import standard_transports

    with trio.fail_after(10):
        async with open_host() as bare:
            assert bare.transports == []
            with pytest.raises(DialError, match="no transport"):
                await bare.connect("/ip4/127.0.0.1/tcp/1")
        async with open_stack(options=StackOptions(quic=None, relay_client=False)) as host:
            assert [type(t) for t in host.transports] == [TcpTransport, MemoryTransport]
        only_tcp = StackOptions(memory=False, quic=None)
        assert [type(t) for t in standard_transports(only_tcp)] == [TcpTransport]
        async with open_stack(options=only_tcp) as host:
            with pytest.raises(DialError, match="no transport"):
                await host.connect("/memory/12345")


async def test_identify_and_ping_are_reached_as_services_not_through_the_host():
    # the Host keeps no identify/ping/perf façades: callers find the services as pool_of does
    from volunteer.net.host import Host

    assert not any(hasattr(Host, name) for name in ("identify", "identify_info", "push_identify", "open_pinger", "perf"))
    with trio.fail_after(10):
        async with open_host(transports=transports()) as bare:
            with pytest.raises(RuntimeError, match="no Identify"):
                identify_of(bare)
            with pytest.raises(RuntimeError, match="no Ping"):
                ping_of(bare)
