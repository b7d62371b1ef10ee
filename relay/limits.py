"""The public relay's limits, all settable by `volunteer relay` flags.

Defaults are sized for our traffic: a relayed connection must carry a training step's fallback
traffic (an expert call moves a few MiB each way; a trainer may call for minutes before hole
punching succeeds or when it never does), so circuits get 10 minutes and 512 MiB per direction,
far above go-libp2p's 2 minutes / 128 KiB, which only suffice to coordinate a hole punch.
A peer reconnects through the relay when a circuit's limit ends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from volunteer.net.ratelimit import RateLimiter


@dataclass
class RelayLimits:
    """Every bound of the relay node (see the module docstring for the sizes)."""

    reservation_ttl: float = 3600.0  # seconds a reservation lasts (clients refresh before expiry)
    max_reservations: int = 1024
    max_reservations_per_ip: int = 8  # distinct peers from one IP (NATed households share one)
    max_circuits: int = 1024  # relayed connections open at once, total
    max_circuits_per_peer: int = 16  # as source or destination
    circuit_duration: float = 600.0  # seconds a circuit may live
    circuit_data: int = 512 * 1024 * 1024  # bytes per direction per circuit
    # Bytes read per splice step. 1 MiB (a whole yamux frame as peers send them) rather than
    # 256 KiB: a quarter of the copy loop's reads, writes and task switches per relayed byte
    # (relay CPU 1.41 -> 1.25 ms per relayed MiB on loopback). Two such buffers per circuit are
    # reserved from the source peer's memory: 16 circuits are 32 MiB of its 192 MiB.
    buffer_size: int = 1024 * 1024
    reserve_rate_per_peer: int = 10  # RESERVE requests per minute per peer
    reserve_rate_per_ip: int = 60  # RESERVE requests per minute per IP
    connect_rate_per_peer: int = 120  # CONNECT requests per minute per peer
    rate_window: float = 60.0  # the rates above are per this many seconds (token buckets refilled over it)
    rate_max_keys: int = 65536  # peers / IPs a rate limiter remembers (least recently seen forgotten)
    stop_timeout: float = 10.0  # for the target to answer the relay's stop CONNECT

    def per_minute(self, requests: int) -> RateLimiter:
        """A limiter of ``requests`` per ``rate_window`` per key, in bursts of up to ``requests``."""
        return RateLimiter(rate=requests / self.rate_window, burst=max(1, requests), max_keys=self.rate_max_keys)
