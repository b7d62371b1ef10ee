"""Moving a peer off a lossy path: when our connection to a peer loses packets with nothing to
repair them (TCP retransmitting more than ``LOSSY_PATH_SHARE`` of what it sends), open a QUIC
connection to the same peer beside it. QUIC between our peers sends repair datagrams on a path
that loses packets (``transport/quic/repair.py``), so ``Host.connection_to`` ranks it first and
new streams, and the stream pool's, move there. A Host service.

Why: on a long path with random loss each lost TCP segment costs a round trip or more (a 300 ms
path that drops one packet in a hundred costs a training step about a second); a repair rebuilds
the packet at the receiver within milliseconds. TCP stays the first choice everywhere else: our
QUIC costs several times its CPU per byte.
"""

from __future__ import annotations

import logging
import math

import trio

from ..errors import VolunteerError, describe
from . import limits
from .addresses import is_loopback
from .connection import Connection
from .identity import PeerID
from .multiaddr import Multiaddr
from .service import BaseService, HostAPI
from .transport.quic import is_quic, quic_multiaddr

log = logging.getLogger(__name__)

MAX_QUIC_ADDRS = 3  # QUIC addresses tried per move, the lossy connection's host first
MAX_REMEMBERED = 1024  # peers whose last attempt is remembered (the oldest are forgotten first)


def quic_candidates(addrs: list[Multiaddr], lossy: Connection) -> list[Multiaddr]:
    """Direct QUIC addresses worth dialing to move off ``lossy``: the peer's QUIC addresses on the
    host ``lossy`` reaches; then its QUIC ports on that host (a peer behind a router learns its
    public TCP address from the peers it dials, but nobody tells it its public QUIC one, while a
    user who forwards a port, or a router that maps it, does so for TCP and UDP alike; the
    handshake authenticates whoever answers); then its other QUIC addresses. Loopback addresses
    only for a loopback connection (elsewhere they would reach ourselves)."""
    remote = lossy.remote_addr
    if len(remote.components) < 2 or remote.components[0][0] not in ("ip4", "ip6"):
        return []
    host = remote.value_at(0)
    quic = [a.without_peer_id() for a in addrs if is_quic(a)]
    same_host = [a for a in quic if a.value_at(0) == host]
    moved = [quic_multiaddr((host, int(a.value_at(1)))) for a in quic]
    others = [a for a in quic if not is_loopback(a) or is_loopback(remote)]
    return list(dict.fromkeys(same_host + moved + others))[:MAX_QUIC_ADDRS]


class LossyPathRepair(BaseService):
    """Watches the Host's TCP connections and opens a QUIC connection beside each one that loses
    packets (see the module docstring); ``moved`` counts the peers it opened one to."""

    def __init__(self, interval: float = limits.LOSSY_PATH_CHECK_INTERVAL,
                 redial_after: float = limits.LOSSY_PATH_REDIAL_AFTER) -> None:
        self.interval = interval
        self.redial_after = redial_after
        self._tried: dict[PeerID, float] = {}
        self.moved = 0
        self.failed = 0

    async def run(self, host: HostAPI, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep(self.interval)
                now = trio.current_time()
                for peer, lossy in self.lossy_peers(host, now).items():
                    self._tried[peer] = now
                    nursery.start_soon(self._open_quic, host, peer, lossy)

    def lossy_peers(self, host: HostAPI, now: float) -> dict[PeerID, Connection]:
        """Peers whose best connection is TCP losing packets, with no QUIC connection yet and no
        attempt in the last ``redial_after`` seconds: the lossy connection of each."""
        found: dict[PeerID, Connection] = {}
        for peer in {c.remote_peer for c in host.connections()}:
            best = host.connection_to(peer)
            if best is None or best.transport != "tcp" or not best.loses_packets():
                continue
            if any(c.transport == "quic" for c in host.connections(peer) if not c.is_closed):
                continue
            if now - self._tried.get(peer, -math.inf) < self.redial_after:
                continue
            found[peer] = best
        while len(self._tried) > MAX_REMEMBERED:
            self._tried.pop(next(iter(self._tried)))
        return found

    async def _open_quic(self, host: HostAPI, peer: PeerID, lossy: Connection) -> None:
        candidates = quic_candidates(host.peerstore.addrs(peer), lossy)
        causes = []
        for addr in candidates:
            try:
                conn = await host.dial_addr(addr, peer)
            except (VolunteerError, OSError) as exc:
                causes.append(f"{addr}: {describe(exc)}")
                continue
            self.moved += 1
            loss = lossy.raw.loss()
            log.info("%s loses packets over TCP (%.2f %% retransmitted): opened QUIC with repairs at %s",
                     peer.short(), 100 * (loss.share if loss else 0.0), conn.remote_addr)
            return
        self.failed += 1
        log.info("%s loses packets over TCP; no QUIC connection instead (%s)", peer.short(),
                 "; ".join(causes) or "it has no QUIC address")

__all__ = ["LossyPathRepair", "quic_candidates"]
