"""yamux (`/yamux/1.0.0`): many flow-controlled streams over one secure connection."""

from .budget import ConnectionBudget, StreamBudget
from .driver import YamuxConnection, YamuxStream
from .session import Session, YamuxConfig

YAMUX_PROTOCOL = "/yamux/1.0.0"

__all__ = ["YAMUX_PROTOCOL", "ConnectionBudget", "StreamBudget", "Session", "YamuxConfig", "YamuxConnection", "YamuxStream"]
