"""Relay accounting (sans-I/O, ``now`` passed in) and circuit-message decoding."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.limits import RelayLimits
from relay.resources import RelayResources
from volunteer.errors import RemoteProtocolError
from volunteer.net.identity import KeyPair
from volunteer.net.nat import circuit

PEERS = [KeyPair.generate().peer_id for _ in range(6)]


def test_reservations_expire_refresh_and_are_capped_per_ip():
    resources = RelayResources(RelayLimits(reservation_ttl=100, max_reservations_per_ip=2, max_reservations=3))
    assert resources.reserve(PEERS[0], "198.51.100.1", now=0)[0] == circuit.OK
    assert resources.reserve(PEERS[1], "198.51.100.1", now=0)[0] == circuit.OK
    assert resources.reserve(PEERS[2], "198.51.100.1", now=0)[0] == circuit.RESERVATION_REFUSED  # same household
    assert resources.reserve(PEERS[2], "198.51.100.2", now=0)[0] == circuit.OK
    assert resources.reserve(PEERS[3], "198.51.100.3", now=0)[0] == circuit.RESERVATION_REFUSED  # relay full
    status, expires = resources.reserve(PEERS[0], "198.51.100.1", now=50)  # a refresh extends
    assert status == circuit.OK and expires == 150
    assert resources.has_reservation(PEERS[1], 99) and not resources.has_reservation(PEERS[1], 100)
    resources.drop_reservation(PEERS[0])
    assert not resources.has_reservation(PEERS[0], 60)
    assert resources.refusals == {"max_reservations_per_ip": 1, "max_reservations": 1}


def test_circuits_need_a_reservation_and_respect_limits():
    resources = RelayResources(RelayLimits(max_circuits_per_peer=1, max_circuits=5))
    assert resources.open_circuit(PEERS[0], PEERS[1], now=0) == circuit.NO_RESERVATION
    resources.reserve(PEERS[1], "198.51.100.1", now=0)
    assert resources.open_circuit(PEERS[0], PEERS[1], now=0) == circuit.OK
    assert resources.open_circuit(PEERS[2], PEERS[1], now=0) == circuit.RESOURCE_LIMIT_EXCEEDED
    resources.close_circuit(PEERS[0], PEERS[1])
    assert resources.open_circuit(PEERS[2], PEERS[1], now=1) == circuit.OK and resources.open_circuits == 1


def test_reservation_floods_are_capped():
    resources = RelayResources(RelayLimits(reserve_rate_per_peer=3, reserve_rate_per_ip=5))
    statuses = [resources.reserve(PEERS[0], "203.0.113.9", now=i * 0.1)[0] for i in range(10)]
    assert statuses.count(circuit.OK) == 3 and resources.refusals["reserve_rate"] == 7
    assert resources.reserve(PEERS[0], "203.0.113.9", now=61)[0] == circuit.OK  # the window slid


def test_rate_limiter_memory_is_bounded():
    # The relay's limiters are the shared token buckets (volunteer.net.ratelimit, tested there);
    # here: a flood of reservation requests from fresh IPs never grows their table past the bound.
    resources = RelayResources(RelayLimits(rate_max_keys=10, max_reservations=1000, reserve_rate_per_peer=1000))
    for i in range(100):
        resources.reserve(PEERS[0], f"203.0.113.{i}", now=i)
    assert len(resources._reserve_by_ip) == 10
    assert resources.reserve(PEERS[1], "198.51.100.99", now=200)[0] == circuit.OK  # a new IP is not locked out


def test_voucher_roundtrip_and_forgery():
    relay, peer, other = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    voucher = circuit.make_voucher(relay, peer.peer_id, 1_800_000_000)
    assert circuit.verify_voucher(voucher, relay.peer_id, peer.peer_id) == 1_800_000_000
    for wrong_relay, wrong_peer in ((other.peer_id, peer.peer_id), (relay.peer_id, other.peer_id)):
        try:
            circuit.verify_voucher(voucher, wrong_relay, wrong_peer)
        except RemoteProtocolError:
            continue
        raise AssertionError("forged voucher accepted")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_circuit_decoders_random_bytes(data):
    for cls in (circuit.HopMessage, circuit.StopMessage):
        try:
            message = circuit.decode(data, cls)
        except RemoteProtocolError:
            continue
        try:
            circuit.peer_of(message)
        except RemoteProtocolError:
            pass
