"""``BackendStore``: what the state, sync and hand-off services ask of the experts a volunteer
hosts, over a dict of ``ExpertBackend``s. Torch work runs through ``Runtime.run_sync`` when a
runtime is given (a backend is not thread-safe and the runtime's worker owns it), directly when
not (tests, a backend no runtime serves yet). Whether to make room for a pushed expert, and what
to do once one is taken, is the state service's policy (``StateService``), not the store's."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping, MutableMapping, Protocol, Sequence

import torch

from ..errors import ExpertConfigError, ExpertUnavailableError, UnknownExpertError
from ..experts.backend import ExpertBackend
from ..experts.requests import Kind
from .aggregate import Aggregate, robust
from .config import DEFAULT_CONFIG, ReplicasConfig
from .errors import StateMismatchError, StateRefusedError
from .guard import Contributed, SyncGuard, Verdict
from .messages import FetchRequest, StateHeader, TensorMeta
from .state import (
    ExportedState,
    check_fits,
    export_state,
    import_state,
    merge_round,
    module_layout,
    parameter_layout,
    sync_parameters,
)

# builds an empty backend for a pushed state (uid, class, hidden_dim): the daemon's make_backend
BackendFactory = Callable[[StateHeader], ExpertBackend]
# told about a backend that a push made this volunteer host (the daemon serves and declares it)
AcceptedHook = Callable[[ExpertBackend], Awaitable[None] | None]
# asked, when full, to free a slot for a pushed uid (by dropping an expert others hold): True if it did
MakeRoomHook = Callable[[str], Awaitable[bool]]


class HostingRuntime(Protocol):
    """What the store asks of the runtime that serves its backends (``experts.Runtime``)."""

    backends: dict[str, ExpertBackend]

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    async def run_on(self, uid: str, fn: Callable[..., Any], *args: Any, kind: Kind) -> Any: ...

    def add_backend(self, backend: ExpertBackend) -> None: ...

    def remove_backend(self, uid: str) -> ExpertBackend: ...

    def suspect(self, uid: str) -> bool: ...


class BackendStore:
    """The state of a volunteer's experts as the replica protocols see it.

    ``backends``: in a node, the runtime's own dict (the runtime changes it as it takes and drops
    experts through ``add`` / ``remove``). ``capacity`` and ``factory`` let it take pushed
    experts it does not host yet (hand-off receivers); without a factory a push is accepted only
    for a uid already hosted."""

    def __init__(
        self,
        backends: MutableMapping[str, ExpertBackend],
        *,
        runtime: HostingRuntime | None = None,
        capacity: int | None = None,
        factory: BackendFactory | None = None,
        config: ReplicasConfig = DEFAULT_CONFIG,
    ) -> None:
        self.backends = backends
        self.runtime = runtime
        self.capacity = capacity
        self.factory = factory
        self.config = config

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.runtime is not None:
            return await self.runtime.run_sync(fn, *args)
        return fn(*args)

    def _backend(self, uid: str) -> ExpertBackend:
        backend = self.backends.get(uid)
        if backend is None:
            raise StateRefusedError(f"this volunteer does not host {uid!r}", "unknown")
        return backend

    # --- state transfer ---------------------------------------------------------------------
    @property
    def spare(self) -> int | None:
        """Experts this volunteer could still take (None: no bound)."""
        return None if self.capacity is None else max(0, self.capacity - len(self.backends))

    def suspect(self, uid: str) -> bool:
        """Whether ``uid`` took a clipped gradient a refused trainer may yet have undone
        (``ExpertBackend.suspect``): it is no reference for others, in catch-up or sync."""
        if self.runtime is not None:
            return self.runtime.suspect(uid)  # it knows when the strikes behind it expire
        backend = self.backends.get(uid)
        return backend is not None and backend.suspect

    async def export(self, request: FetchRequest) -> ExportedState:
        """The state asked for, after checking it is the expert the requester expects."""
        backend = self._backend(request.uid)
        if self.suspect(request.uid):  # damage a trainer did must not spread to a joiner: another replica serves it
            raise StateRefusedError(f"{request.uid!r} here took gradients past its bound lately: ask another replica", "busy")
        expected = (request.expert_class, request.hidden_dim, set(request.tensors))
        mine = (backend.expert_class, backend.hidden_dim, set(module_layout(backend)))
        if expected != mine:
            raise StateMismatchError(
                f"{request.uid!r} here is {backend.expert_class!r} of width {backend.hidden_dim} with its own tensors;"
                f" asked for {request.expert_class!r} of width {request.hidden_dim}"
                + ("" if expected[2] == mine[2] else " with other tensor names, shapes or dtypes")
            )
        return await self._run(export_state, backend, self.config)

    async def export_uid(self, uid: str) -> ExportedState:
        """A hosted expert's state (for pushes)."""
        return await self._run(export_state, self._backend(uid), self.config)

    def offer(self, header: StateHeader) -> None:
        """Raise a refusal unless a pushed state can be taken: a uid not hosted here (``hosted``
        otherwise: hosted copies merge through sync, never by replacement), room, and a factory
        to build the expert."""
        if header.uid in self.backends:
            raise StateRefusedError(
                f"{header.uid!r} is hosted here: its replicas merge through sync, never by replacement", "hosted"
            )
        if self.factory is None:
            raise StateRefusedError(f"this volunteer does not take new experts ({header.uid!r})", "unknown")
        if self.spare is not None and self.spare < 1:
            raise StateRefusedError(f"no capacity for {header.uid!r}", "full")

    async def receive(self, header: StateHeader, payload: bytes | bytearray, *, version: int | None = None) -> int:
        """Build the expert of a pushed state, load it and host it at ``version`` (the header's
        when None); the version now hosted."""
        self.offer(header)  # again: another push may have taken the room meanwhile
        assert self.factory is not None
        try:
            backend = self.factory(header)
        except ExpertConfigError as exc:
            raise StateMismatchError(f"cannot build {header.uid!r} ({header.expert_class!r}) here: {exc}") from exc
        import_state(backend, header, payload)  # nobody else sees this backend yet
        if version is not None:
            backend.updates = version
        if header.uid in self.backends:
            raise StateRefusedError(f"{header.uid!r} arrived twice at once", "busy")
        self.add(backend)
        return backend.updates

    def add(self, backend: ExpertBackend) -> None:
        """Host ``backend`` from now on: the runtime serves it (its ``add_backend``), or, without
        a runtime, it joins the dict of backends."""
        if self.runtime is not None:
            self.runtime.add_backend(backend)  # the runtime's dict is ours: it adds it there
        else:
            self.backends[backend.uid] = backend

    def remove(self, uid: str) -> ExpertBackend:
        """Stop hosting ``uid``; returns its backend."""
        if self.runtime is not None:
            return self.runtime.remove_backend(uid)
        return self.backends.pop(uid)

    # --- replica sync ---------------------------------------------------------------------------
    def parameter_layout(self, uid: str) -> tuple[TensorMeta, ...]:
        """The parameters a sync contribution for ``uid`` must list."""
        return parameter_layout(self._backend(uid))

    async def parameters(self, uid: str) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        """(version, copies of the float parameters) of a hosted expert."""
        backend = self._backend(uid)
        return await self._run(lambda: (backend.updates, sync_parameters(backend)))

    async def merge(
        self,
        uid: str,
        own: Mapping[str, torch.Tensor],
        contributions: Sequence[Contributed],
        guard: SyncGuard,
        aggregate: Aggregate = robust,
    ) -> Verdict:
        """Write a finished sync round into a hosted expert: the guard's verdict on what arrived
        against what it contributed (``own``), as the round's change (``merge_round``). With a runtime, a
        job on that expert (``Kind.AVERAGE``): ordered with its forwards, backwards and steps,
        on the worker unless it is as cheap as an inline forward, never a big sum on the event loop."""
        backend = self._backend(uid)
        if self.runtime is not None:
            try:
                verdict: Verdict = await self.runtime.run_on(
                    uid, merge_round, backend, own, contributions, guard, aggregate, kind=Kind.AVERAGE
                )
            except (ExpertUnavailableError, UnknownExpertError):
                if uid in self.backends:
                    raise  # the runtime itself failed
                # a re-check or a hand-off dropped it while the job waited: the same refusal as
                # a drop before the round's end (the sync driver expects it, not the runtime's)
                raise StateRefusedError(f"this volunteer no longer hosts {uid!r}", "unknown") from None
            return verdict
        return merge_round(backend, own, contributions, guard, aggregate)

    def versions(self) -> dict[str, int]:
        """Version of every hosted expert."""
        return {uid: backend.updates for uid, backend in self.backends.items()}


__all__ = ["AcceptedHook", "BackendFactory", "BackendStore", "MakeRoomHook"]
