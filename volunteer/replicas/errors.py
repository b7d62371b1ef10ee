"""Errors of replicated expert state, under ``volunteer.errors``' one root."""

from __future__ import annotations

from ..errors import RemoteProtocolError, VolunteerError


class ReplicaError(VolunteerError):
    """Base of every failure of placement, state transfer, replica sync or hand-off."""


class ReplicaConfigError(ReplicaError, ValueError):
    """A ReplicasConfig value is out of range."""


# a malformed [[grid]] table is a swarm-file error first (defined beside the swarm file's parser)
from ..swarmfile import GridSpecError  # noqa: E402


class StateProtocolError(ReplicaError, RemoteProtocolError):
    """A state-transfer or sync message was malformed, beyond a bound, truncated, or its payload
    did not match the sha256 its header announced."""


class StateRefusedError(ReplicaError):
    """The peer refused a state request, push or sync contribution. ``code`` says why:
    ``unknown`` (it does not host that uid, or a pusher does not declare it), ``mismatch`` (class
    or shapes differ), ``full`` (no capacity to take a pushed expert), ``hosted`` (a push of an
    expert the receiver hosts), ``replicated`` (a push of an expert other live hosts hold: a
    hand-off is for sole copies), ``busy`` (too many transfers at once), ``error``."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class StateMismatchError(StateRefusedError, ValueError):
    """A state does not fit the expert it is meant for: another class, hidden size, tensor names,
    shapes or dtypes. Raised locally before anything is loaded, and for a peer's ``mismatch``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "mismatch")


class ImplausibleStateError(ReplicaError):
    """A fetched state is well-formed but not believable as a trained expert: non-finite values,
    or parameters far from the scale any training reaches (all zeros, ×10⁶)."""


class StateTimeoutError(ReplicaError, TimeoutError):
    """A state transfer or a sync contribution did not finish within its bound."""


class SyncError(ReplicaError):
    """A replica-sync round was misused (a contribution from outside the group, twice, or a second
    round for an expert whose round is still open)."""


__all__ = [
    "GridSpecError",
    "ImplausibleStateError",
    "ReplicaConfigError",
    "ReplicaError",
    "StateMismatchError",
    "StateProtocolError",
    "StateRefusedError",
    "StateTimeoutError",
    "SyncError",
]
