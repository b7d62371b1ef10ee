"""Errors of the hivemind personality, under the project's one root (volunteer.errors)."""

from __future__ import annotations

from ..errors import RemoteProtocolError, VolunteerError


class HivemindError(VolunteerError):
    """Something went wrong speaking hivemind's protocols."""


class HivemindRPCError(HivemindError):
    """A hivemind handler on the other side failed and said why (a unary ``error`` or an error
    frame of a stream call); ``message`` is its text, ``protocol`` the handler name."""

    def __init__(self, message: str, protocol: str = "") -> None:
        self.message = message
        self.protocol = protocol
        super().__init__(f"{protocol}: {message}" if protocol else message)


class HivemindUnsupported(HivemindError):
    """A hivemind feature we do not implement (averaging, authorizers, signed records)."""


class HivemindFrameError(RemoteProtocolError):
    """A peer sent a hivemind frame we cannot accept (bad marker, oversized length, bad protobuf)."""


class HivemindBusy(HivemindError):
    """A hivemind request refused because what it would make us hold is over a budget (that
    peer's share, its address's, or all peers' share of the service's request bytes): ``reason``
    says which."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class HivemindTooSlow(RemoteProtocolError):
    """A peer's hivemind request stopped arriving (below the door's minimum rate, or past its
    timeout): the stream is dropped, and with it what the request held."""


__all__ = [
    "HivemindBusy",
    "HivemindError",
    "HivemindFrameError",
    "HivemindRPCError",
    "HivemindTooSlow",
    "HivemindUnsupported",
]
