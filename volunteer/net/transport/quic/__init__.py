"""QUIC v1 with libp2p TLS, on aioquic's sans-I/O ``QuicConnection`` (``engine``, ``session``,
``stream``), over one shared UDP socket per address family (``endpoint``), with a pure
demultiplexer (``demux``). Importing this package loads no aioquic: the modules that need it are
imported where a connection starts."""

from .demux import Admission, Route, route
from .endpoint import UdpEndpoint
from .settings import QuicLimits
from .transport import QuicTransport, is_quic, quic_endpoint, quic_multiaddr

__all__ = [
    "Admission",
    "QuicLimits",
    "QuicTransport",
    "Route",
    "UdpEndpoint",
    "is_quic",
    "quic_endpoint",
    "quic_multiaddr",
    "route",
]
