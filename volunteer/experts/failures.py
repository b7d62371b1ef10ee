"""Exceptions across the wire: the server turns any exception into a msgpack-able dict, the client
turns that dict back into a typed error whose message carries the remote traceback.

A failure dict has exactly these keys (all strings; bounded by ExpertsConfig)::

    {"type": "volunteer.errors.ExpertInputError", "kind": "input", "message": "...",
     "traceback": "Traceback (most recent call last): ...", "expert_uid": "ffn.3.5", "peer_id": "12D3Koo..."}

``kind`` tells the client what to do without parsing type names: ``busy`` (queue or request
bytes full: try another expert now), ``paused`` and ``unknown`` (this host will not serve it:
pick another), ``refused`` (a backward without a recent forward from this caller),
``forgotten`` (a backward named kept inputs the server no longer holds: send them), ``input``
(the caller sent tensors that do not fit the schema), ``error`` (the expert failed).
``raise_remote`` raises ExpertBusyError / ExpertPausedError / UnknownExpertError /
ExpertBackwardRefusedError / ExpertInputsForgottenError for the first five, so the client's "skip this expert" path catches
them as ExpertUnavailableError, and RemoteExpertError (type, message, remote traceback) for the rest.

How much of a traceback leaves the volunteer is its choice (``ExpertsConfig.share_tracebacks``):
``full``; ``redacted`` (the default: type, message and frames, with file paths shown relative to
the package or the home directory, so no user name or directory layout leaks); ``none``.
"""

from __future__ import annotations

import os
import sys
import traceback as tb
from pathlib import Path
from typing import Mapping, NoReturn

from ..errors import (
    ExpertBackwardRefusedError,
    ExpertBusyError,
    ExpertInputError,
    ExpertInputsForgottenError,
    ExpertPausedError,
    ExpertProtocolError,
    RemoteExpertError,
    UnknownExpertError,
    VolunteerError,
)
from .config import DEFAULT_CONFIG, ExpertsConfig

KEYS = frozenset({"type", "kind", "message", "traceback", "expert_uid", "peer_id"})
# Order matters: ExpertBusyError and ExpertPausedError are ExpertUnavailableErrors too.
_KINDS: tuple[tuple[str, type[BaseException]], ...] = (
    ("busy", ExpertBusyError),
    ("paused", ExpertPausedError),
    ("unknown", UnknownExpertError),
    ("refused", ExpertBackwardRefusedError),
    ("forgotten", ExpertInputsForgottenError),
    ("input", ExpertInputError),
)
KINDS = frozenset({kind for kind, _ in _KINDS} | {"error"})
_QUIET = frozenset({"busy", "paused", "unknown", "refused", "forgotten"})  # expected refusals: no traceback to ship


def _clip(text: str, limit: int, keep_tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    marker = "…[truncated]…"
    if limit <= len(marker):
        return text[-limit:] if keep_tail else text[:limit]
    return marker + text[-(limit - len(marker)) :] if keep_tail else text[: limit - len(marker)] + marker


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not break the error reply
        return f"({type(exc).__name__} whose str() failed)"


def type_name(exc: BaseException) -> str:
    """``ValueError`` for builtins, ``module.QualName`` for everything else."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def kind_of(exc: BaseException) -> str:
    """The failure kind of an exception raised on the server (see the module docstring)."""
    for kind, cls in _KINDS:
        if isinstance(exc, cls):
            return kind
    return "error"


_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds volunteer/: paths show as volunteer/...


def redact_path(filename: str) -> str:
    """``filename`` as a trainer may see it: relative to the deepest of the directory holding our
    package and the ``sys.path`` entries that holds it (site-packages: ``torch/nn/...``), else to
    ``~``, else its base name. Pseudo-files such as ``<string>`` stay as they are."""
    if not filename or filename.startswith("<"):
        return filename
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError, ValueError):
        return Path(filename).name
    # The deepest root that holds the file wins: a venv inside the project's directory puts
    # site-packages below the package root, and torch/nn/... says more than .venv/lib/...
    roots = sorted({_PACKAGE_ROOT, *(Path(entry).resolve() for entry in sys.path if entry)}, key=lambda root: -len(root.parts))
    for root in roots:
        if root != Path(root.anchor) and path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    home = Path(os.path.expanduser("~")).resolve()
    if home != Path(home.anchor) and path.is_relative_to(home):
        return "~/" + path.relative_to(home).as_posix()
    return path.name


def _redact_frames(trace: tb.TracebackException, seen: set[int]) -> None:
    if id(trace) in seen:  # cause/context chains can loop back
        return
    seen.add(id(trace))
    for frame in trace.stack:
        frame.filename = redact_path(frame.filename)
    for linked in (trace.__cause__, trace.__context__, *(getattr(trace, "exceptions", None) or ())):
        if linked is not None:
            _redact_frames(linked, seen)


def format_traceback(exc: BaseException, share: str = "redacted") -> str:
    """The traceback to send for ``exc`` under a ``share_tracebacks`` policy."""
    if share == "none":
        return ""
    if share == "full":
        return "".join(tb.format_exception(exc))
    trace = tb.TracebackException.from_exception(exc)
    _redact_frames(trace, set())
    return "".join(trace.format())


def to_failure(
    exc: BaseException, *, expert_uid: str = "", peer_id: str = "", config: ExpertsConfig = DEFAULT_CONFIG
) -> dict:
    """The msgpack-able failure dict for ``exc`` (call it where the exception was caught).
    Expected refusals (busy, paused, unknown, refused) carry no traceback; others carry what
    ``config.share_tracebacks`` allows."""
    kind = kind_of(exc)
    trace = "" if kind in _QUIET else format_traceback(exc, config.share_tracebacks)
    return {
        "type": _clip(type_name(exc), config.max_error_field),
        "kind": kind,
        "message": _clip(_text(exc), config.max_error_message),
        "traceback": _clip(trace, config.max_error_traceback, keep_tail=True),
        "expert_uid": _clip(str(expert_uid), config.max_error_field),
        "peer_id": _clip(str(peer_id), config.max_error_field),
    }


def check_failure(data: object, *, config: ExpertsConfig = DEFAULT_CONFIG) -> dict:
    """Validate an untrusted failure dict (from msgpack); raises ExpertProtocolError."""
    if not isinstance(data, Mapping) or set(data) != KEYS:
        raise ExpertProtocolError(f"error reply must be a map with exactly the keys {sorted(KEYS)}")
    if not all(isinstance(value, str) for value in data.values()):
        raise ExpertProtocolError("error reply: every field must be a string")
    if data["kind"] not in KINDS:
        raise ExpertProtocolError(f"error reply: unknown kind {data['kind']!r}")
    limits = {"message": config.max_error_message, "traceback": config.max_error_traceback}
    for key, value in data.items():
        if len(value) > limits.get(key, config.max_error_field):
            raise ExpertProtocolError(f"error reply: field {key!r} is longer than allowed")
    return dict(data)


def from_failure(
    data: object, *, expert_uid: str | None = None, peer_id: str | None = None, config: ExpertsConfig = DEFAULT_CONFIG
) -> VolunteerError:
    """The local exception for a failure dict. ``expert_uid``/``peer_id``, when given, override the
    dict's: the client knows whom it called better than the server's word."""
    failure = check_failure(data, config=config)
    uid = failure["expert_uid"] if expert_uid is None else expert_uid
    peer = failure["peer_id"] if peer_id is None else peer_id
    kind, message = failure["kind"], failure["message"]
    if kind == "busy":
        return ExpertBusyError(f"expert {uid!r} on {peer} is busy: {message}")
    if kind == "paused":
        return ExpertPausedError(f"expert {uid!r} on {peer} is paused: {message}")
    if kind == "unknown":
        return UnknownExpertError(f"{peer} does not serve expert {uid!r}: {message}")
    if kind == "refused":
        return ExpertBackwardRefusedError(f"expert {uid!r} on {peer} refused backward: {message}")
    if kind == "forgotten":
        return ExpertInputsForgottenError(f"expert {uid!r} on {peer} no longer holds the forward's inputs: {message}")
    return RemoteExpertError(failure["type"], message, failure["traceback"], uid, peer)


def raise_remote(
    data: object, *, expert_uid: str | None = None, peer_id: str | None = None, config: ExpertsConfig = DEFAULT_CONFIG
) -> NoReturn:
    """Raise ``from_failure(data)``. Called inside the client's ``except``/call frame, so the local
    traceback prints first and the remote one follows in the message."""
    raise from_failure(data, expert_uid=expert_uid, peer_id=peer_id, config=config)
