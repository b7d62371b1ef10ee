"""The Host's own bounds: how long a dial, a handshake and a stream negotiation may take, how
many connections and pending handshakes it holds, and which addresses it announces.

Only what the Host itself enforces lives here; what a service needs (perf's byte budget, identify's
agent version) is that service's constructor argument, and which services run is the assembly's
choice (``volunteer.net.stack``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import limits
from .multiaddr import Multiaddr


@dataclass
class HostConfig:
    """Tunable bounds of a Host (defaults from volunteer.net.limits)."""

    handshake_timeout: float = limits.HANDSHAKE_TIMEOUT
    dial_timeout: float = limits.DIAL_TIMEOUT
    stream_negotiation_timeout: float = limits.STREAM_NEGOTIATION_TIMEOUT
    max_pending_handshakes: int = limits.MAX_PENDING_HANDSHAKES
    max_connections: int = limits.MAX_CONNECTIONS
    # Addresses to advertise instead of the listen addresses (a relay behind a port forward, say).
    announce: list[Multiaddr] = field(default_factory=list)


__all__ = ["HostConfig"]
