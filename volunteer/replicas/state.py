"""An expert's state as the protocols see it: an adapter over ``ExpertBackend``. No trio.

State = the module's ``state_dict`` (parameters and buffers, named ``m:<name>``) + the optimizer's
per-parameter state (tensors named ``o:<parameter index>:<key>``, numbers carried in the header)
+ the version (``backend.updates``: its count of optimizer updates). The optimizer's
hyper-parameters (learning rate, betas) stay the receiver's own: they are configuration, not state.

These functions touch the backend's tensors: call them where the backend is not training (the
runtime's worker thread, ``Runtime.run_sync``), as ``BackendStore`` does.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from ..experts.backend import ExpertBackend
from .aggregate import Aggregate, mean
from .config import DEFAULT_CONFIG, ReplicasConfig
from .errors import StateMismatchError, StateProtocolError
from .messages import StateHeader, TensorMeta, chunked, encode_tensors, split_payload

MODULE = "m:"
OPTIMIZER = "o:"


@dataclass(frozen=True)
class ExportedState:
    """A state ready to send: its header and its payload as chunks of at most ``chunk_size``."""

    header: StateHeader
    chunks: tuple[memoryview, ...]


def module_layout(backend: ExpertBackend) -> tuple[TensorMeta, ...]:
    """The module tensors a state for ``backend`` must hold (names, shapes, dtypes)."""
    return tuple(TensorMeta.of(MODULE + name, t) for name, t in backend.module.state_dict().items())


def _optimizer_items(backend: ExpertBackend) -> tuple[list[tuple[str, torch.Tensor]], dict[str, int | float]]:
    tensors: list[tuple[str, torch.Tensor]] = []
    scalars: dict[str, int | float] = {}
    if backend.optimizer is None:
        return tensors, scalars
    for index, values in sorted(backend.optimizer.state_dict()["state"].items()):
        for key, value in sorted(values.items()):
            name = f"{OPTIMIZER}{index}:{key}"
            if isinstance(value, torch.Tensor):
                tensors.append((name, value))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                scalars[name] = value
            else:
                raise StateMismatchError(f"optimizer state {name} of type {type(value).__name__} cannot be sent")
    return tensors, scalars


def export_state(backend: ExpertBackend, config: ReplicasConfig = DEFAULT_CONFIG) -> ExportedState:
    """A copy of ``backend``'s state (parameters, optimizer state, version) with its sha256."""
    backend.settle()  # a step the runtime deferred is counted in the version: apply it first
    named = [(MODULE + name, t) for name, t in backend.module.state_dict().items()]
    optimizer_tensors, scalars = _optimizer_items(backend)
    metas, parts, sha = encode_tensors(named + optimizer_tensors)
    total = sum(len(p) for p in parts)
    if total > config.max_state_bytes or len(metas) > config.max_state_tensors:
        raise StateMismatchError(f"expert {backend.uid!r}: its state ({total} bytes, {len(metas)} tensors) exceeds the limits")
    header = StateHeader(
        backend.uid, backend.expert_class, backend.hidden_dim, backend.updates, metas,
        tuple(sorted(scalars.items())), total, sha,
    )
    return ExportedState(header, tuple(chunked(parts, config.chunk_size)))


def check_fits(backend: ExpertBackend, header: StateHeader) -> None:
    """StateMismatchError unless ``header`` describes a state of ``backend``'s uid, class, hidden
    size and exact module tensors, with optimizer state shaped like the parameters it belongs to."""
    if header.uid != backend.uid:
        raise StateMismatchError(f"state of {header.uid!r} offered for expert {backend.uid!r}")
    for what, theirs, mine in (("class", header.expert_class, backend.expert_class), ("hidden_dim", header.hidden_dim, backend.hidden_dim)):
        if theirs != mine:
            raise StateMismatchError(f"expert {backend.uid!r}: the state has {what} {theirs!r}, this expert {mine!r}")
    expected = set(module_layout(backend))
    got = {m for m in header.tensors if m.name.startswith(MODULE)}
    if got != expected:
        diff = sorted(m.name for m in got ^ expected)[:3]
        raise StateMismatchError(f"expert {backend.uid!r}: module tensors differ in name, shape or dtype ({', '.join(diff)})")
    params = [p for p in backend.module.parameters() if p.requires_grad]
    for meta in header.tensors:
        if meta.name.startswith(MODULE):
            continue
        index = _param_index(meta.name, len(params))
        if meta.shape != tuple(params[index].shape) and math.prod(meta.shape) > 1:
            raise StateMismatchError(f"optimizer tensor {meta.name} has shape {list(meta.shape)}, its parameter {list(params[index].shape)}")
    for name, _ in header.scalars:
        _param_index(name, len(params))
    if (backend.optimizer is None) and any(not m.name.startswith(MODULE) for m in header.tensors):
        raise StateMismatchError(f"expert {backend.uid!r} has no optimizer; the state carries optimizer state")


def _param_index(name: str, count: int) -> int:
    kind, _, rest = name.partition(":")
    index, _, key = rest.partition(":")
    if kind + ":" != OPTIMIZER or not index.isdigit() or not key or int(index) >= count:
        raise StateMismatchError(f"state tensor {name[:64]!r} belongs to no parameter of this expert")
    return int(index)


def verify_payload(header: StateHeader, payload: bytes | bytearray) -> None:
    """StateProtocolError unless the payload has the announced length and sha256."""
    if len(payload) != header.total:
        raise StateProtocolError(f"state payload of {len(payload)} bytes, {header.total} announced")
    if hashlib.sha256(payload).digest() != header.sha256:
        raise StateProtocolError(f"state of {header.uid!r} does not match its sha256")


def import_state(backend: ExpertBackend, header: StateHeader, payload: bytes | bytearray) -> None:
    """Load a received state into ``backend``: verified (length, sha256, fit) before anything
    changes, then the module, the optimizer state and the version."""
    backend.settle()  # an owed step must not land on the imported parameters later
    verify_payload(header, payload)
    check_fits(backend, header)
    tensors = split_payload(header.tensors, payload)
    module_state = {name[len(MODULE):]: t for name, t in tensors.items() if name.startswith(MODULE)}
    optimizer_state: dict[int, dict[str, object]] = {}
    for name, value in [*((n, t) for n, t in tensors.items() if not n.startswith(MODULE)), *header.scalars]:
        _, index, key = name.split(":", 2)
        optimizer_state.setdefault(int(index), {})[key] = value
    try:
        with torch.no_grad():
            backend.module.load_state_dict(module_state, strict=True)
        if backend.optimizer is not None:
            own = backend.optimizer.state_dict()
            own["state"] = optimizer_state
            backend.optimizer.load_state_dict(own)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise StateMismatchError(f"state does not load into expert {backend.uid!r}: {exc}") from exc
    backend.updates = header.version


def state_digest(backend: ExpertBackend) -> bytes:
    """The sha256 ``export_state`` would announce now (for tests and ``volunteer experts``)."""
    return export_state(backend).header.sha256


# --- replica sync ------------------------------------------------------------------------------
def sync_parameters(backend: ExpertBackend) -> list[tuple[str, torch.Tensor]]:
    """Copies of the floating-point parameters a sync averages, by name."""
    backend.settle()
    return [
        (name, p.detach().to("cpu", copy=True))
        for name, p in backend.module.named_parameters()
        if p.is_floating_point()
    ]


def apply_parameters(
    backend: ExpertBackend,
    averaged: Mapping[str, torch.Tensor],
    version: int,
    base: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Write a round's averages into the parameters and raise the version to ``version`` (the
    group's highest). Parameters the round left out keep their values.

    ``base``: the parameters this replica contributed when the round opened. Training goes on
    while a round is open, so the round's change (``averaged - base``) is added to the parameters
    as they are now, instead of overwriting the optimizer steps taken meanwhile; without training
    in between that is exactly ``averaged``."""
    backend.settle()
    params = dict(backend.module.named_parameters())
    with torch.no_grad():
        for name, value in averaged.items():
            param = params.get(name)
            if param is None or param.shape != value.shape:
                raise StateMismatchError(f"expert {backend.uid!r} has no parameter {name!r} of shape {list(value.shape)}")
            own = None if base is None else base.get(name)
            if own is None:
                param.copy_(value.to(param.device, param.dtype))
            else:
                param.add_((value.to(torch.float64) - own.to(torch.float64)).to(param.device, param.dtype))
    backend.updates = max(backend.updates, version)


def merge_round(
    backend: ExpertBackend,
    own: Mapping[str, torch.Tensor],
    contributions: Sequence[Mapping[str, torch.Tensor]],
    version: int,
    aggregate: Aggregate = mean,
) -> None:
    """Write a finished sync round into ``backend``: ``aggregate`` of the parameters we
    contributed (``own``) and those that arrived, added as the round's change to the parameters
    as they are now (``apply_parameters`` with ``own`` as the base), the version raised to the
    group's highest. The tensor work of a round: run it where the backend is not training."""
    apply_parameters(backend, aggregate(own, contributions), version, base=own)


def parameter_layout(backend: ExpertBackend) -> tuple[TensorMeta, ...]:
    """What a sync contribution for ``backend`` must list. Names, shapes and dtypes only, which
    no step changes: safe on the event loop while the runtime trains (no copy, no settle)."""
    return tuple(TensorMeta.of(name, p) for name, p in backend.module.named_parameters() if p.is_floating_point())


__all__ = [
    "ExportedState",
    "apply_parameters",
    "check_fits",
    "export_state",
    "import_state",
    "merge_round",
    "module_layout",
    "parameter_layout",
    "state_digest",
    "sync_parameters",
    "verify_payload",
]
