"""The public relay's limits, all settable by `volunteer relay` flags.

Defaults are sized for our traffic: a relayed connection must carry a training step's fallback
traffic (an expert call moves a few MiB each way; a trainer may call for minutes before hole
punching succeeds or when it never does), so circuits get 10 minutes and 512 MiB per direction,
far above go-libp2p's 2 minutes / 128 KiB, which only suffice to coordinate a hole punch.
A peer reconnects through the relay when a circuit's limit ends it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RelayLimits:
    reservation_ttl: float = 3600.0  # seconds a reservation lasts (clients refresh before expiry)
    max_reservations: int = 1024
    max_reservations_per_ip: int = 8  # distinct peers from one IP (NATed households share one)
    max_circuits: int = 1024  # relayed connections open at once, total
    max_circuits_per_peer: int = 16  # as source or destination
    circuit_duration: float = 600.0  # seconds a circuit may live
    circuit_data: int = 512 * 1024 * 1024  # bytes per direction per circuit
    buffer_size: int = 256 * 1024  # bytes read per splice step
    reserve_rate_per_peer: int = 10  # RESERVE requests per minute per peer
    reserve_rate_per_ip: int = 60  # RESERVE requests per minute per IP
    connect_rate_per_peer: int = 120  # CONNECT requests per minute per peer
