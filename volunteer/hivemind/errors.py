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


__all__ = ["HivemindError", "HivemindFrameError", "HivemindRPCError", "HivemindUnsupported"]
