"""One error hierarchy for the whole project (see DESIGN.md, "Errors").

Sections follow the layers, bottom up: the root and its helpers, protocol violations (every
layer), network (``volunteer.net``), DHT (``volunteer.dht``), experts (``volunteer.experts``).
"""

from __future__ import annotations

import trio


class VolunteerError(Exception):
    """Root of every error raised on purpose by volunteer."""


def describe(exc: BaseException) -> str:
    """A one-line description of an exception, for CLI messages and logs."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


# --- protocol violations (every layer) ---------------------------------------------------------


class ProtocolError(VolunteerError):
    """A protocol was violated; see the two subclasses for who did it."""


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol forbids (a bug on our side or a misuse of the API)."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. ``hint`` is what to tell it before closing, if anything."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


# --- network: volunteer.net ----------------------------------------------------------------------


class MultiaddrError(VolunteerError, ValueError):
    """A multiaddr could not be parsed or encoded."""


class PeerIDError(VolunteerError, ValueError):
    """A peer ID or key could not be parsed, or a key file is unsafe."""


class KeyFileError(PeerIDError):
    """An identity key file is missing, unreadable, malformed or readable by others."""


class DialError(VolunteerError):
    """Every address we tried for a peer failed. ``causes`` maps each address to its error."""

    def __init__(self, message: str, causes: dict[str, BaseException] | None = None) -> None:
        self.causes = dict(causes or {})
        if self.causes:
            detail = "; ".join(f"{addr}: {describe(exc)}" for addr, exc in self.causes.items())
            message = f"{message} ({detail})"
        super().__init__(message)


class ListenError(VolunteerError):
    """We could not listen on an address (port in use, address not ours)."""


class HandshakeError(VolunteerError):
    """A security or muxer handshake failed: bad signature, wrong peer ID, refused protocol, timeout."""


class PeerIDMismatch(HandshakeError):
    """The peer authenticated as someone other than the peer we dialled (``expected`` and
    ``answered``, as text, where the raiser knew them)."""

    def __init__(self, message: str, *, expected: object = None, answered: object = None) -> None:
        super().__init__(message)
        self.expected = str(expected) if expected is not None else None
        self.answered = str(answered) if answered is not None else None

    @classmethod
    def between(cls, expected: object, answered: object) -> "PeerIDMismatch":
        """The error for a dial of ``expected`` that ``answered`` took."""
        return cls(f"dialled {expected} but {answered} answered", expected=expected, answered=answered)

    @classmethod
    def inside(cls, exc: BaseException) -> "PeerIDMismatch | None":
        """The PeerIDMismatch a dial failure comes down to (DialError's first cause, all the
        way down), if that is what it was."""
        while isinstance(exc, DialError) and exc.causes:
            exc = next(iter(exc.causes.values()))
        return exc if isinstance(exc, PeerIDMismatch) else None

    def advice(self, where: str) -> str:
        """One line, the same in every command: who answered at ``where`` instead of whom, and
        what to do (every id whole, never cut)."""
        if self.expected is None or self.answered is None:
            return f"{where}: {self}"
        return (f"{where} answered as peer {self.answered}, not {self.expected} as its address says: the address's "
                "/p2p/ id is wrong, or that node has a new identity; ask for its current address")


class NegotiationError(HandshakeError):
    """multistream-select found no protocol both sides speak."""


class StreamReset(VolunteerError, trio.BrokenResourceError):
    """The stream was reset by the peer or because its connection died."""


class ConnectionClosed(VolunteerError, trio.ClosedResourceError):
    """The connection was closed locally; nothing more can be sent or opened on it."""


class ConnectionLost(VolunteerError, trio.BrokenResourceError):
    """A multiplexed connection ended from the peer's side or the network's: EOF, GoAway, a broken
    socket. ``code`` is the yamux GoAway code when the peer sent one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class KeepaliveTimeout(ConnectionLost):
    """The peer did not answer a keepalive ping in time (and sent nothing else meanwhile)."""


class PortMappingError(VolunteerError):
    """A router refused or could not make a port mapping (NAT-PMP, PCP or UPnP IGD said why).
    ``code``: the protocol's result code, when it gave one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class PortMappingMessageError(PortMappingError, RemoteProtocolError):
    """A router's port-mapping answer was malformed (too short, wrong version, wrong opcode)."""


class ResourceLimitExceeded(VolunteerError):
    """A configured bound (streams, pending handshakes, buffer size) would be exceeded."""


# --- DHT: volunteer.dht ----------------------------------------------------------------------------


class DHTError(VolunteerError):
    """Base for DHT failures: malformed messages, refused records, error replies."""


class DHTMessageError(DHTError, RemoteProtocolError):
    """A DHT message was malformed: bad msgpack, wrong types, or a bound exceeded."""


class DHTRecordError(DHTError, ValueError):
    """A record was refused. ``code`` is a short machine-readable reason sent back in STORE replies."""

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code


class DHTRemoteError(DHTError):
    """The peer answered with an ERROR reply (``code``, message)."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ExpertUIDError(VolunteerError, ValueError):
    """An expert uid or grid prefix does not follow the ``prefix.i.j`` grammar."""


# --- experts: volunteer.experts --------------------------------------------------------------------


class ExpertError(VolunteerError):
    """Base for failures of remote expert calls."""


class RemoteExpertError(ExpertError):
    """The expert raised on the server. Carries the remote type, message and traceback.

    ``str()`` is one line (type, message, which expert on which peer), fit for a log line or the
    CLI; the server's traceback stays in ``remote_traceback`` and is shown when the exception is
    printed with its traceback (``traceback.print_exception``, an uncaught raise), as a note."""

    def __init__(
        self,
        error_type: str,
        message: str,
        remote_traceback: str = "",
        expert_uid: str = "",
        peer_id: str = "",
    ) -> None:
        self.error_type = error_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        self.expert_uid = expert_uid
        self.peer_id = peer_id
        first_line = message.strip().splitlines()[0] if message.strip() else ""
        super().__init__(f"{error_type}: {first_line} (expert {expert_uid!r} on {peer_id})")
        if remote_traceback:
            # PEP 678 notes print after the local traceback, and only there: str() stays one line
            self.add_note("Remote traceback (most recent call last, on the server):\n" + remote_traceback.rstrip())


class ExpertTimeoutError(ExpertError, TimeoutError):
    """A forward or backward call did not answer within its timeout."""


class ExpertUnavailableError(ExpertError):
    """The expert's peer could not be reached, or the connection died mid-call."""


class ExpertPeerUnreachableError(ExpertUnavailableError):
    """The expert's host could not be dialled at all (gone, or no route): avoid it for a while."""


class ExpertBusyError(ExpertUnavailableError):
    """The expert's queue is full, or the server holds as many request bytes as it allows (for
    this caller or in all); the server answered BUSY at once."""


class ExpertPausedError(ExpertUnavailableError):
    """The volunteer paused its experts; new requests are refused until it resumes."""


class UnknownExpertError(ExpertUnavailableError):
    """This server does not host an expert with that uid (any more)."""


class ExpertBackwardRefusedError(ExpertUnavailableError):
    """The server refused a backward call: the caller ran no forward on that expert within the
    server's ``backward_window`` (only a trainer that used the expert may step its optimizer),
    or the caller is no trainer this volunteer applies gradients from (``TrainerRefusedError``)."""


class TrainerRefusedError(ExpertBackwardRefusedError):
    """The server refused this trainer: the swarm does not admit it (its swarm file lists its
    trainers, or asks for an organiser's certificate), its gradients went past the expert's bound
    (it is refused for a while, and what it did is undone), or it sent more than its share of an
    expert's recent backwards while others train it too."""


class GradientRefusedError(TrainerRefusedError):
    """One backward's gradient was so far past the expert's learned bound that no honest trainer
    sends it (``gross``), or past it from a trainer too new to be given a clip: the step is not
    taken (``experts/gradbound.py``). ``norm`` and ``bound`` say how far."""

    def __init__(self, message: str, *, norm: float = 0.0, bound: float = 0.0, gross: bool = True) -> None:
        super().__init__(message)
        self.norm, self.bound, self.gross = norm, bound, gross


class ExpertInputsForgottenError(ExpertUnavailableError):
    """A backward named the inputs its forward left on the server, and the server no longer
    holds them (evicted, or too old): the caller sends them again with the gradients."""


class ExpertExcludedError(ExpertUnavailableError):
    """This trainer excluded the expert's host: it was caught returning wrong results (a
    non-finite reply, or outputs that other replicas outvoted in an audit). No call is sent."""


class ExpertReplyRejected(ExpertError):
    """A volunteer's reply failed the trainer's checks (``experts/guard.py``) and was dropped
    before it reached autograd: the call counts as failed. ``outputs`` keeps the rejected
    tensors (an audit compares them with another replica's answer to the same inputs);
    ``excluded`` says whether this rejection got the host excluded."""

    def __init__(self, message: str, *, outputs=None, excluded: bool = False) -> None:
        super().__init__(message)
        self.outputs = outputs
        self.excluded = excluded


class NonFiniteReplyError(ExpertReplyRejected):
    """The reply held NaN or infinity although the trainer sent finite tensors."""


class ImplausibleReplyError(ExpertReplyRejected):
    """The reply's scale is far outside what this expert's replicas have recently returned."""


class ExpertProtocolError(ExpertError, RemoteProtocolError):
    """An expert call's message was malformed (tensor payload, error reply, request header)."""


class TensorFormatError(ExpertProtocolError):
    """Serialized tensors were malformed: unknown dtype or compression, wrong or truncated lengths,
    a shape or total size beyond the configured bounds."""


class ExpertInputError(ExpertError, ValueError):
    """A request's tensors do not match the expert's schema (count, shape, dtype) or hold NaN/inf."""


class ExpertConfigError(VolunteerError, ValueError):
    """An expert cannot be built or restored: unknown class, bad custom-expert file, bad checkpoint."""


class CheckpointDirError(ExpertConfigError):
    """The checkpoint directory cannot be created or written: found at start, not at leave time."""


class JoinError(VolunteerError):
    """A volunteer node cannot start: swarm unreachable, bad expert settings, missing device."""
