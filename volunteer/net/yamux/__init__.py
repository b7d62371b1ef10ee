"""yamux (`/yamux/1.0.0`): many flow-controlled streams over one secure connection."""

from .driver import YamuxConnection, YamuxStream
from .session import Session, YamuxConfig

YAMUX_PROTOCOL = "/yamux/1.0.0"

__all__ = ["YAMUX_PROTOCOL", "Session", "YamuxConfig", "YamuxConnection", "YamuxStream"]
