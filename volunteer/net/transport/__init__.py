"""Transports: TCP on trio, and an in-memory transport for fast tests."""

from .base import RawConnection, Transport
from .memory import MemoryNetwork, MemoryTransport
from .tcp import TcpTransport, tcp_endpoint

__all__ = ["RawConnection", "Transport", "MemoryNetwork", "MemoryTransport", "TcpTransport", "tcp_endpoint"]
