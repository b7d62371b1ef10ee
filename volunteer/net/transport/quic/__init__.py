"""QUIC v1 with libp2p TLS, on aioquic's sans-I/O ``QuicConnection``, over one shared UDP socket
per address family (``endpoint``), with a pure demultiplexer (``demux``)."""

from .demux import Admission, Route, route
from .endpoint import UdpEndpoint
from .engine import Engine, QuicLimits
from .session import QuicSession
from .stream import QuicStream
from .transport import QuicTransport, is_quic, quic_endpoint, quic_multiaddr

__all__ = [
    "Admission",
    "Engine",
    "QuicLimits",
    "QuicSession",
    "QuicStream",
    "QuicTransport",
    "Route",
    "UdpEndpoint",
    "is_quic",
    "quic_endpoint",
    "quic_multiaddr",
    "route",
]
