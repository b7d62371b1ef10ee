"""Birthday probing against one hard NAT, the decisions: pure, no sockets, no clock.

A NAT whose mapping depends on the destination ("hard", symmetric) gives every new destination a
fresh external port, so the port a peer observed for us is useless to anyone else, and an
ordinary UDP punch fails. If the other side's NAT is easy (endpoint-independent mapping), the two
can still meet, as Tailscale does: the hard side opens many sockets (at most BIRTHDAY_SOCKETS) and
sends one packet from each to the easy side's known external ip:port, which opens as many
mappings on the hard NAT, each letting that ip:port in; the easy side sends probes from its one
socket to random ports of the hard side's IP (at most BIRTHDAY_PROBES, paced). A probe that lands
on one of the open mappings reaches one of the hard side's sockets: with 256 of 64,512 ports open,
2,048 probes find one 9,997 times in 10,000 (1,024: 98 in 100). The hard side then dials QUIC from that socket; the easy
side's NAT lets it in, since the easy side's probe went to exactly that port.

Each side only knows its own NAT (``udp_role``): a hard side opens sockets, an easy side sprays;
two hard sides both open sockets and nobody sprays (that pair stays relayed, as it must without a
port mapping). A side that cannot tell yet (only one observer, usually the relay, saw a changed
port: an endpoint-independent NAT that does not keep ports looks the same as a symmetric one) is
``UNSURE`` and does both, so a pair goes direct whenever either side might be easy, not by luck. Probing runs only after an attempt's ordinary punch has failed, from the same
moment on both sides (DCUTR_MAX_PUNCH after the attempt's synchronised start: each side's own
budget comes from the round trip it measured, and the two differ).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .. import limits
from ..multiaddr import Multiaddr
from .observed import MappingType, endpoint_of

HARD = "hard"  # our UDP mapping depends on the destination: we open many sockets
EASY = "easy"  # our UDP mapping is endpoint-independent: we spray probes at the hard side
UNSURE = "unsure"  # one observer saw a changed port: hard or easy, we cannot tell; we do both


def udp_role(mapping: MappingType, observed_ports: Sequence[int], local_port: int | None) -> str | None:
    """Which side of a birthday probe we are for UDP, from what peers told us about our QUIC port.

    With observers at two or more addresses the mapping type says it. With fewer, a port kept
    across the NAT (an observed port equal to our local one) marks an easy NAT; a changed one
    says nothing for sure (easy NATs that renumber ports exist, and calling one hard made a pair
    of it and a symmetric NAT stay relayed): UNSURE. None when nobody has observed our QUIC port."""
    if mapping is MappingType.ENDPOINT_DEPENDENT:
        return HARD
    if mapping is MappingType.ENDPOINT_INDEPENDENT:
        return EASY
    if not observed_ports:
        return None
    return EASY if local_port is not None and local_port in observed_ports else UNSURE


@dataclass(frozen=True)
class BirthdayStep:
    """What we do in one birthday probe.

    ``role`` HARD: open ``sockets`` sockets, send from each to ``target`` (the easy side's
    external QUIC address), dial QUIC from the first socket that hears from it.
    ``role`` EASY: send a probe to each of ``ports`` at ``target_ip`` from our shared QUIC
    socket, ``burst`` at a time every ``interval`` seconds, and wait for the hard side's dial.
    ``role`` UNSURE: both at once (``parts``).
    """

    role: str
    target_ip: str
    target_port: int = 0
    sockets: int = 0
    ports: tuple[int, ...] = ()
    burst: int = limits.BIRTHDAY_BURST
    interval: float = limits.BIRTHDAY_BURST_INTERVAL
    budget: float = limits.BIRTHDAY_BUDGET

    @property
    def target(self) -> Multiaddr:
        """The peer's address we probe toward (for EASY: its IP at port 0, only the IP counts)."""
        return Multiaddr(f"/ip4/{self.target_ip}/udp/{self.target_port}/quic-v1")

    def parts(self) -> list["BirthdayStep"]:
        """The single-role steps this one is: itself, or for UNSURE a HARD and an EASY one."""
        if self.role != UNSURE:
            return [self]
        return [replace(self, role=HARD), replace(self, role=EASY)]

    def send_times(self) -> list[float]:
        """Seconds after the start at which each probe (EASY) or socket's packet (HARD) goes out."""
        count = len(self.ports) if self.role == EASY else self.sockets
        return [(index // self.burst) * self.interval for index in range(count)]


def _peer_quic_v4(addrs: Sequence[Multiaddr]) -> tuple[str, int] | None:
    for addr in addrs:
        found = endpoint_of(addr)
        if found is not None and found[0] == "quic" and ":" not in found[1]:
            return found[1], found[2]
    return None


def probe_ports(rng: random.Random, count: int = limits.BIRTHDAY_PROBES,
                low: int = limits.BIRTHDAY_PORT_LOW, high: int = limits.BIRTHDAY_PORT_HIGH) -> tuple[int, ...]:
    """``count`` distinct random ports in [low, high] (a hard NAT's range): probing a port twice
    wastes a probe."""
    count = max(0, min(count, high - low + 1))
    return tuple(rng.sample(range(low, high + 1), count))


def birthday_step(role: str | None, peer_addrs: Sequence[Multiaddr], rng: random.Random) -> BirthdayStep | None:
    """Our part of a birthday probe with a peer that sent ``peer_addrs`` (its observed addresses),
    or None when there is nothing to do: we do not know our role, or the peer gave no IPv4 QUIC
    address (IPv6 has no NAT to probe through)."""
    peer = _peer_quic_v4(peer_addrs)
    if role is None or peer is None:
        return None
    ip, port = peer
    if role == HARD:
        return BirthdayStep(HARD, ip, port, sockets=limits.BIRTHDAY_SOCKETS)
    if role == UNSURE:
        return BirthdayStep(UNSURE, ip, port, sockets=limits.BIRTHDAY_SOCKETS, ports=probe_ports(rng))
    return BirthdayStep(EASY, ip, ports=probe_ports(rng))


__all__ = ["EASY", "HARD", "UNSURE", "BirthdayStep", "birthday_step", "probe_ports", "udp_role"]
