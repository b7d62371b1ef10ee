"""The resource manager's core: scopes, all-or-nothing reservations, refusals, warnings."""

from __future__ import annotations

import logging

import pytest

from volunteer.net.multiaddr import Multiaddr
from volunteer.net.resources import (
    CONNECTIONS,
    HANDSHAKES,
    MEMORY,
    STREAMS_INBOUND,
    ResourceLimits,
    ResourceManager,
    address_key,
)


def manager(**overrides) -> ResourceManager:
    return ResourceManager(ResourceLimits(**overrides))


def test_address_key_buckets_ipv4_by_host_and_ipv6_by_64():
    assert address_key(Multiaddr("/ip4/127.0.0.3/tcp/5")) == "127.0.0.3"
    assert address_key("/ip6/2001:db8:1:2:aaaa::1/tcp/5") == address_key("/ip6/2001:db8:1:2:bbbb::9/tcp/7")
    assert address_key("/ip6/2001:db8:1:2::1/tcp/5") != address_key("/ip6/2001:db8:1:3::1/tcp/5")
    assert address_key("/memory/7") == "/memory/7"


def test_handshakes_are_shared_per_address_under_a_global_cap():
    rm = manager(address_pending_handshakes=2, system_pending_handshakes=3)
    a1 = rm.open_handshake("/ip4/10.0.0.1/tcp/1", now=0)
    a2 = rm.open_handshake("/ip4/10.0.0.1/tcp/2", now=0)
    assert a1 is not None and a2 is not None
    assert rm.open_handshake("/ip4/10.0.0.1/tcp/3", now=0) is None  # its share is taken
    b1 = rm.open_handshake("/ip4/10.0.0.2/tcp/1", now=0)  # another address still gets in
    assert b1 is not None
    assert rm.open_handshake("/ip4/10.0.0.3/tcp/1", now=0) is None  # the global cap
    assert rm.refusals() == {"address": {HANDSHAKES: 1}, "system": {HANDSHAKES: 1}}
    for slot in (a1, a2, b1):
        rm.close_handshake(slot)
    assert rm.system.in_use(HANDSHAKES) == 0
    assert rm.stat()["addresses"] == 0  # empty address scopes are forgotten: the table stays bounded


def test_connection_and_stream_scopes_reserve_up_the_chain_and_give_back_on_close():
    rm = manager(peer_memory=1000, connection_memory=100, peer_streams_inbound=2)
    conn = rm.open_connection("peer-a", "/ip4/10.0.0.1/tcp/1", now=0)
    assert conn is not None
    assert rm.peer_memory("peer-a") == 100 and rm.system.in_use(CONNECTIONS) == 1
    s1 = conn.open_stream(True, now=0)
    s2 = conn.open_stream(True, now=0)
    assert s1 is not None and s2 is not None
    assert conn.open_stream(True, now=0) is None  # the peer's inbound streams
    assert conn.open_stream(False, now=0) is not None  # outbound streams are counted apart
    assert s1.reserve_memory(800, now=0)
    assert not s2.reserve_memory(200, now=0)  # 100 + 800 + 200 > 1000: all or nothing
    assert rm.peer_memory("peer-a") == 900 and rm.memory == 900
    s1.release_memory(300)
    assert rm.peer_memory("peer-a") == 600
    s1.close()
    s1.close()  # idempotent
    assert rm.peer_memory("peer-a") == 100
    conn.close()
    assert rm.memory == 0 and rm.system.in_use(STREAMS_INBOUND) == 0 and rm.system.in_use(CONNECTIONS) == 0
    assert rm.stat()["peers"] == 0
    assert rm.refusals() == {"peer": {STREAMS_INBOUND: 1, MEMORY: 1}}


def test_peers_have_separate_budgets_under_the_system_one():
    rm = manager(peer_memory=1000, connection_memory=0, system_memory=1500)
    a = rm.open_connection("a", "/ip4/10.0.0.1/tcp/1", now=0).open_stream(True, now=0)
    b = rm.open_connection("b", "/ip4/10.0.0.2/tcp/1", now=0).open_stream(True, now=0)
    assert a.reserve_memory(1000, now=0)
    assert not a.reserve_memory(1, now=0)
    assert b.reserve_memory(500, now=0)
    assert not b.reserve_memory(1, now=0)  # the system budget binds now
    assert rm.refusals() == {"peer": {MEMORY: 1}, "system": {MEMORY: 1}}


def test_connections_per_peer_and_address():
    rm = manager(peer_connections=1, address_connections=2)
    assert rm.open_connection("a", "/ip4/10.0.0.1/tcp/1", now=0) is not None
    assert rm.open_connection("a", "/ip4/10.0.0.9/tcp/1", now=0) is None
    assert rm.open_connection("b", "/ip4/10.0.0.1/tcp/2", now=0) is not None
    assert rm.open_connection("c", "/ip4/10.0.0.1/tcp/3", now=0) is None
    assert rm.refusals() == {"peer": {CONNECTIONS: 1}, "address": {CONNECTIONS: 1}}
    assert rm.memory == 2 * rm.limits.connection_memory  # refused ones hold nothing


def test_protocol_limits_per_peer_and_system_wide():
    rm = manager(peer_protocol_streams_inbound=2, protocol_streams_inbound=3, connection_memory=0)
    conn_a = rm.open_connection("a", "/ip4/10.0.0.1/tcp/1", now=0)
    conn_b = rm.open_connection("b", "/ip4/10.0.0.2/tcp/1", now=0)
    streams_a = [conn_a.open_stream(True, now=0) for _ in range(3)]
    assert [s.set_protocol("/dht", now=0) for s in streams_a] == [True, True, False]
    assert streams_a[2].set_protocol("/experts", now=0)  # another protocol has its own count
    b1, b2 = conn_b.open_stream(True, now=0), conn_b.open_stream(True, now=0)
    assert b1.set_protocol("/dht", now=0)
    assert not b2.set_protocol("/dht", now=0)  # 3 /dht streams in all
    streams_a[0].close()
    assert b2.set_protocol("/dht", now=0)
    assert rm.refusals()["protocol"] == {STREAMS_INBOUND: 2}
    outbound = conn_a.open_stream(False, now=0)
    assert outbound.set_protocol("/dht", now=0)  # only inbound streams count against protocols
    for stream in (*streams_a, b1, b2, outbound):
        stream.close()
    conn_a.close()
    conn_b.close()
    assert rm.stat() == {"system": {k: 0 for k in rm.system.used}, "addresses": 0, "peers": 0}


def test_warnings_at_most_one_per_reason_per_interval(caplog):
    rm = manager(address_pending_handshakes=0, warn_interval=10.0)
    with caplog.at_level(logging.WARNING, logger="volunteer.net.resources"):
        for second in range(30):
            for _ in range(100):
                assert rm.open_handshake("/ip4/10.0.0.1/tcp/1", now=float(second)) is None
        rm.refuse("connection", "control_outbox", now=29.5)
    lines = [r.getMessage() for r in caplog.records]
    assert sum(HANDSHAKES in line for line in lines) == 3  # at 0 s, 10 s and 20 s
    assert sum("control_outbox" in line for line in lines) == 1  # reasons are gated apart
    assert "more refusals of this kind not logged" in [line for line in lines if HANDSHAKES in line][1]
    assert rm.refusals()["address"][HANDSHAKES] == 3000


def test_over_release_is_a_bug():
    rm = manager()
    stream = rm.open_connection("a", "/ip4/10.0.0.1/tcp/1", now=0).open_stream(True, now=0)
    assert stream.reserve_memory(10, now=0)
    with pytest.raises(AssertionError):
        stream.release_memory(11)
