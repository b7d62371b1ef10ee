"""DCUtR messages (`/libp2p/dcutr`): encode and decode, pure and bounded.

A HolePunch message is a varint-delimited protobuf: a type (CONNECT or SYNC) and the sender's
observed addresses. Decoding never trusts the peer: the body is capped at DCUTR_MAX_MESSAGE, at
most DCUTR_MAX_ADDRS_READ addresses are looked at, and only direct TCP and QUIC v1 ones (at most
DCUTR_MAX_PUNCH_ADDRS of each) survive, because those are the ones a hole punch can use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...errors import RemoteProtocolError, VolunteerError
from .. import limits
from ..multiaddr import Multiaddr
from ..pb import dcutr_pb2
from ..pb.decode import parse
from ..varint import encode_uvarint

HolePunch = dcutr_pb2.HolePunch
CONNECT = HolePunch.CONNECT
SYNC = HolePunch.SYNC


@dataclass(frozen=True)
class PunchMessage:
    """A decoded HolePunch: ``kind`` (CONNECT or SYNC) and the punchable addresses it carried."""

    kind: int
    addrs: tuple[Multiaddr, ...] = ()


def encode(kind: int, addrs: Sequence[Multiaddr] = ()) -> bytes:
    """A delimited HolePunch of ``kind`` carrying ``addrs`` (at most DCUTR_MAX_PUNCH_ADDRS)."""
    message = HolePunch(type=kind, ObsAddrs=[a.to_bytes() for a in list(addrs)[: 2 * limits.DCUTR_MAX_PUNCH_ADDRS]])
    body = message.SerializeToString()
    return encode_uvarint(len(body)) + body


def decode(body: bytes, expected: int) -> PunchMessage:
    """Decode one message body (without its length prefix); RemoteProtocolError if it is malformed,
    too long, or not of the ``expected`` type."""
    if len(body) > limits.DCUTR_MAX_MESSAGE:
        raise RemoteProtocolError(f"dcutr message of {len(body)} bytes exceeds {limits.DCUTR_MAX_MESSAGE}")
    message = parse(HolePunch, body, "dcutr message")
    if message.type != expected:
        raise RemoteProtocolError(f"expected dcutr {HolePunch.Type.Name(expected)}, got type {message.type}")
    return PunchMessage(message.type, tuple(punchable(message.ObsAddrs)))


def punch_transport(addr: Multiaddr) -> str | None:
    """``tcp`` or ``quic`` for a direct address a hole punch can use; None for anything else."""
    names = addr.protocols()
    if len(names) == 2 and names[0] in ("ip4", "ip6") and names[1] == "tcp":
        return "tcp"
    if len(names) == 3 and names[0] in ("ip4", "ip6") and names[1] == "udp" and names[2] == "quic-v1":
        return "quic"
    return None


def punchable(raw_addrs: Iterable[bytes]) -> list[Multiaddr]:
    """Addresses we can hole punch: direct TCP and QUIC v1 ones, at most DCUTR_MAX_PUNCH_ADDRS
    of each transport, in the order given."""
    parsed: list[Multiaddr] = []
    for index, raw in enumerate(raw_addrs):
        if index >= limits.DCUTR_MAX_ADDRS_READ:
            break
        try:
            parsed.append(Multiaddr.from_bytes(raw).without_peer_id())
        except VolunteerError:
            continue
    return punch_candidates(parsed)


def punch_candidates(candidates: Iterable[Multiaddr]) -> list[Multiaddr]:
    """The direct TCP and QUIC v1 addresses among ``candidates``, each once, at most
    DCUTR_MAX_PUNCH_ADDRS per transport, in the order given (what we send, and what we keep of
    what a peer sent). Which of them the peer can use at all (never our loopback unless it is on
    our machine) is the driver's to say (``addresses.for_peer`` with the relayed connection)."""
    addrs: list[Multiaddr] = []
    per_transport: dict[str, int] = {}
    for addr in candidates:
        transport = punch_transport(addr)
        if transport is None or addr in addrs or per_transport.get(transport, 0) >= limits.DCUTR_MAX_PUNCH_ADDRS:
            continue

        per_transport[transport] = per_transport.get(transport, 0) + 1
        addrs.append(addr)
    return addrs


__all__ = ["CONNECT", "SYNC", "HolePunch", "PunchMessage", "decode", "encode", "punch_candidates", "punch_transport", "punchable"]
