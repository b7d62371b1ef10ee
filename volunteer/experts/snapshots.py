"""Snapshots: the states a host answered from, kept a while so that an auditor can recompute.

The runtime notes, on its worker thread, the state each batch is computed from (``note``): once
per state version, not per call (right after the optimizer step that made it, else before the
first batch computed from it), the module's tensors (parameters and buffers, no optimizer state:
recomputing a reply needs none) are copied and given an id, which a receipt names. A backend
whose state did not change since its last note costs a comparison of its fingerprint
(``ExpertBackend.state_fingerprint``).

A snapshot is digested (``state_digest``) only when it is first served: a copy never changes
once taken, so its digest is the same whenever it is taken, and the server signs it with the
snapshot (``receipts.StateBinding``). A digest per version on the reply's path cost more than
the call (a 32 MB expert: a 16 ms copy into reused memory, a 60 ms sha256); auditors fetch a
few snapshots in a hundred.

What is kept, ``SnapshotPolicy``: every snapshot younger than ``keep_s`` seconds, within
``max_bytes`` in all and ``max_count`` snapshots (oldest forgotten first), and always the newest of
each expert; plus, per expert, the memory of its last evicted snapshot, which the next one is
copied into (a copy into touched memory costs a third of a fresh allocation's; only when nothing
is serving it). Large states are digested on two threads (hashlib releases the GIL).

A store made with ``background=True`` (the runtime's) copies on a thread of its own: ``note``
returns the stamp at once, and the copy (torch releases the GIL) runs while the reply travels and
the next forward computes from the same, unchanged tensors; a 32 MB expert's copy left the
critical path of every forward+backward. The price is a rule: whatever writes an expert's state
(an optimizer step, a roll-back, a replica's import) first calls ``settle_copies``, which waits
for copies still running; the runtime does, before every job but a batch that only reads (see
``Runtime._perform``). A copy checks afterwards that no tensor's version moved while it ran, and a
torn copy is dropped and counted (``torn``), never served. ``get`` waits for a copy still running.

An auditor fetches a snapshot right after the reply it audits (the forward's at
once, the backward's when the trainer's backward returns), well within the window; a snapshot
asked for that is gone counts against its host (``audit.py``), so the budget a host states is a
promise: the memory it takes is the module's size times the versions it answered from in the
window (one per optimizer step while it trains; ``benchmarks/audits.py`` measures it).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Sequence, TypedDict

import torch

from ..errors import ExpertConfigError
from .receipts import tensor_digest

log = logging.getLogger(__name__)

MiB = 1024 * 1024


@dataclass(frozen=True)
class SnapshotPolicy:
    """How long and how much a host keeps of the states it answered from."""

    keep_s: float = 120.0  # kept at least this long, within the bounds below
    max_bytes: int = 256 * MiB  # module tensors kept in all (the budget a host states)
    max_count: int = 4096  # snapshots kept in all

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ExpertConfigError(f"SnapshotPolicy.{f.name} must be a positive number, got {value!r}")


DEFAULT_SNAPSHOTS = SnapshotPolicy()


PARALLEL_DIGEST = 256 * 1024  # bytes from which a state's tensors are digested on two threads
_digesters: ThreadPoolExecutor | None = None  # hashlib releases the GIL: large tensors hash in parallel


def state_digest(named: Sequence[tuple[str, torch.Tensor]]) -> bytes:
    """The digest of a module state: its tensors' names, dtypes, shapes and values, by name (the
    digest of each tensor's digest, so large states hash on two threads)."""
    global _digesters
    ordered = sorted(named, key=lambda item: item[0])
    if sum(t.nelement() * t.element_size() for _, t in ordered) >= PARALLEL_DIGEST:
        if _digesters is None:
            _digesters = ThreadPoolExecutor(2, thread_name_prefix="volunteer-digest")
        parts = list(_digesters.map(lambda item: tensor_digest([item[1]]), ordered))
    else:
        parts = [tensor_digest([t]) for _, t in ordered]
    digest = hashlib.sha256()
    for (name, _), part in zip(ordered, parts):
        digest.update(name.encode() + b"\0")
        digest.update(part)
    return digest.digest()


@dataclass(frozen=True)
class Stamp:
    """The state a batch was computed from, and the settings a recompute needs."""

    uid: str
    version: int
    state: bytes  # the snapshot's id (receipts name it)
    expert_class: str
    hidden_dim: int | None
    device: str
    threads: int


@dataclass(eq=False)
class Snapshot:
    """One kept state: its module tensors by name (CPU copies, never written while kept), as
    served to an auditor."""

    uid: str
    version: int
    state: bytes  # its id
    expert_class: str
    hidden_dim: int | None
    names: list[str]
    tensors: list[torch.Tensor]
    nbytes: int
    taken: float  # the store's clock
    _digest: bytes | None = None
    on_digest: Callable[[], None] | None = None  # its store counts the snapshots it had to hash
    copying: Future | None = None  # a background store's copy into ``tensors``, while it may run

    def copied(self) -> bool:
        """Whether ``tensors`` holds the whole copy (a background store fills it on its thread)."""
        return self.copying is None or self.copying.done()

    def wait_copied(self) -> None:
        """Return once ``tensors`` holds the whole copy."""
        if self.copying is not None:
            self.copying.result()

    def digest(self) -> bytes:
        """``state_digest`` of its tensors, taken on the first call (off the event loop: 60 ms for
        32 MB) and remembered."""
        self.wait_copied()
        if self._digest is None:
            self._digest = state_digest(list(zip(self.names, self.tensors)))
            if self.on_digest is not None:
                self.on_digest()
        return self._digest

    def matches(self, digest: bytes) -> bool:
        """Whether these tensors digest to ``digest`` (an auditor checks what it fetched)."""
        self.wait_copied()
        return state_digest(list(zip(self.names, self.tensors))) == digest



class SnapshotsReport(TypedDict):
    """``SnapshotStore.report()``: kept snapshots and bytes, the budget, and counts."""

    snapshots: int
    bytes: int
    budget_bytes: int
    keep_s: float
    taken: int
    served: int
    missed: int
    reused: int
    digested: int  # snapshots hashed (when first served): a few in a hundred taken
    torn: int  # background copies that failed or a write raced (dropped, never served): a bug if ever above 0


class SnapshotStore:
    """The snapshots of one runtime's experts (see the module docstring). ``note`` runs where the
    runtime computes (its worker, or the event loop), the rest on the event loop, copies on the
    store's own thread (``background``): a lock guards the tables."""

    def __init__(self, policy: SnapshotPolicy = DEFAULT_SNAPSHOTS, clock: Callable[[], float] = time.monotonic,
                 *, background: bool = False) -> None:
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[bytes, Snapshot] = OrderedDict()  # id -> snapshot, oldest first
        self._latest: dict[str, tuple[tuple, Stamp]] = {}  # uid -> (fingerprint, stamp)
        self._spare: dict[str, list[torch.Tensor]] = {}  # uid -> the tensors of its last evicted snapshot, reused
        self.bytes = 0
        self.taken = 0  # snapshots taken
        self.served = 0
        self.missed = 0  # asked for and not (or no longer) kept
        self.reused = 0  # snapshots written into an evicted one's memory
        self.digested = 0  # snapshots hashed (served)
        self.torn = 0  # background copies that failed or a write raced (dropped)
        # one thread: copies run in the order noted, and a later one never waits behind a newer
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="volunteer-snapshot") if background else None
        self._copying: dict[str, Future] = {}  # uid -> its newest copy, until it is done
        self._epoch = os.urandom(16)  # ids never repeat across restarts, whatever the versions
        self._ids = itertools.count()

    def note(self, backend) -> Stamp:
        """The stamp of ``backend``'s current state, snapshotting it if it changed since the last
        note (call it where the backend is not training: the runtime's worker, after ``settle``).
        A copy, no digest: ``Snapshot.digest`` is taken when it is served. A background store
        starts the copy and returns: nothing may write the state before ``settle_copies``."""
        fingerprint = backend.state_fingerprint()
        found = self._latest.get(backend.uid)
        if found is not None and found[0] == fingerprint:
            return found[1]
        self.settle_copies(backend.uid)  # its last copy's memory may be the spare of this one
        with self._lock:
            spare = self._spare.pop(backend.uid, None)
        state = backend.module.state_dict()
        self.reused += spare is not None
        named_by = b"%s%d\0%d\0%s" % (self._epoch, next(self._ids), backend.updates, backend.uid.encode())
        state_id = hashlib.sha256(named_by).digest()  # an id, not a digest of the state: that waits till served
        stamp = Stamp(backend.uid, backend.updates, state_id, backend.expert_class, backend.hidden_dim,
                      backend.device.type, torch.get_num_threads())
        nbytes = sum(t.nelement() * t.element_size() for t in state.values())
        snapshot = Snapshot(backend.uid, backend.updates, state_id, backend.expert_class, backend.hidden_dim,
                            list(state), [], nbytes, self.clock(), on_digest=self._digested)
        if self._copier is None:
            snapshot.tensors = [t for _, t in _copied(state, spare)]
        with self._lock:  # held: the copy's end (``_copy``) finds it registered
            if self._copier is not None:
                snapshot.copying = self._copier.submit(self._copy, snapshot, state, spare)
                self._copying[backend.uid] = snapshot.copying
            self._latest[backend.uid] = (fingerprint, stamp)
            self._kept[state_id] = snapshot
            self.bytes += nbytes
            self.taken += 1
            self._evict()
        return stamp

    def settle_copies(self, uid: str | None = None) -> None:
        """Return once no copy of ``uid``'s state (of any expert's: None) is running: whatever
        writes an expert's state calls this first. At once when none runs."""
        if not self._copying:
            return
        with self._lock:
            running = [f for u, f in self._copying.items() if uid is None or u == uid]
        for future in running:
            future.result()

    def _copy(self, snapshot: Snapshot, state: Mapping[str, torch.Tensor], spare: list[torch.Tensor] | None) -> None:
        """The store's thread: copy ``state`` into ``snapshot``; drop it if the copy failed or a
        write raced it (never raises: a writer waits on it)."""
        failure: str | None = None
        try:
            versions = [t._version for t in state.values()]
            tensors = [t for _, t in _copied(state, spare)]
            if versions != [t._version for t in state.values()]:
                failure = "a write raced the copy"
        except Exception as exc:  # noqa: BLE001 - out of memory, a device gone: this snapshot is lost, not the runtime
            failure = f"the copy failed: {exc!r}"
        with self._lock:
            if self._copying.get(snapshot.uid) is snapshot.copying:
                del self._copying[snapshot.uid]
            if failure is None:
                snapshot.tensors = tensors
                return
            self.torn += 1
            if self._kept.pop(snapshot.state, None) is not None:
                self.bytes -= snapshot.nbytes
            latest = self._latest.get(snapshot.uid)
            if latest is not None and latest[1].state == snapshot.state:
                del self._latest[snapshot.uid]  # the next note copies the state again
        log.error("snapshot %d of expert %s is dropped: %s", snapshot.version, snapshot.uid, failure)

    def close(self) -> None:
        """Wait for running copies and stop the copy thread (a background store)."""
        if self._copier is not None:
            self._copier.shutdown(wait=True)

    def _digested(self) -> None:
        with self._lock:
            self.digested += 1

    def get(self, state: bytes) -> Snapshot | None:
        """The kept snapshot with id ``state`` (None: never taken, or forgotten)."""
        with self._lock:
            self._evict()
            found = self._kept.get(state)
            if found is None:
                self.missed += 1
            else:
                self.served += 1
        if found is not None:
            found.wait_copied()  # a copy still running (rare: the reply it names came first)
            if not found.tensors and found.nbytes:  # torn meanwhile: dropped, never served
                return None
        return found

    def forget(self, uid: str) -> None:
        """Drop ``uid``'s snapshots (the expert left this host)."""
        with self._lock:
            for state in [d for d, s in self._kept.items() if s.uid == uid]:
                self.bytes -= self._kept.pop(state).nbytes
            self._latest.pop(uid, None)

    def report(self) -> SnapshotsReport:
        """Kept snapshots and bytes, the budget, and counts (``volunteer status``)."""
        with self._lock:
            return {"snapshots": len(self._kept), "bytes": self.bytes, "budget_bytes": self.policy.max_bytes,
                    "keep_s": self.policy.keep_s, "taken": self.taken, "served": self.served, "missed": self.missed, "reused": self.reused,
                    "digested": self.digested, "torn": self.torn}

    def _evict(self) -> None:
        # under the lock: too old, too many or too big, oldest first; the newest of an expert stays
        policy, now = self.policy, self.clock()
        newest = {stamp.state for _, stamp in self._latest.values()}
        for state in list(self._kept):
            snapshot = self._kept[state]
            over = self.bytes > policy.max_bytes or len(self._kept) > policy.max_count
            if not over and now - snapshot.taken <= policy.keep_s:
                break
            if state in newest or not snapshot.copied():
                continue
            del self._kept[state]
            self.bytes -= snapshot.nbytes
            if snapshot.uid not in self._spare and _unshared(snapshot):
                self._spare[snapshot.uid] = snapshot.tensors


def _unshared(snapshot: Snapshot) -> bool:
    """Whether nothing but the store holds ``snapshot`` or a view of its tensors (a snapshot
    being served is held by the server, its payload by views): only then may its memory be
    written over. (CPython's reference counts: the caller's name and the argument; a tensor's
    list entry and the argument.)"""
    return sys.getrefcount(snapshot) <= 3 and sys.getrefcount(snapshot.tensors) <= 2 and all(
        sys.getrefcount(t) <= 3 for t in snapshot.tensors)


def _copied(state: Mapping[str, torch.Tensor], spare: list[torch.Tensor] | None) -> list[tuple[str, torch.Tensor]]:
    """CPU copies of ``state``'s tensors, written into ``spare`` (an evicted snapshot's tensors)
    where they fit: a copy into memory already touched costs a fraction of a fresh allocation's."""
    out = []
    spare = list(spare) if spare is not None and len(spare) == len(state) else None
    for index, (name, tensor) in enumerate(state.items()):
        tensor = tensor.detach()
        target = spare[index] if spare is not None else None
        if target is not None and target.shape == tensor.shape and target.dtype == tensor.dtype:
            target.copy_(tensor)
        else:
            target = tensor.to("cpu", copy=True).contiguous()
        out.append((name, target))
    return out


def module_of(expert_class: str, hidden_dim: int | None, names: Sequence[str], tensors: Sequence[torch.Tensor],
              cache: dict | None = None) -> torch.nn.Module:
    """A module of a registered class holding a snapshot's tensors (for a recompute). ``cache``:
    modules by (class, hidden_dim), reused (loading a state overwrites every tensor)."""
    from .layers import get_expert_class

    key = (expert_class, hidden_dim)
    module = cache.get(key) if cache is not None else None
    if module is None:
        if hidden_dim is None:
            raise ExpertConfigError(f"a {expert_class} snapshot names no hidden_dim to build it with")
        module = get_expert_class(expert_class).build(hidden_dim)
        for parameter in module.parameters():  # a recompute needs input gradients, never the parameters'
            parameter.requires_grad_(False)
        if cache is not None:
            cache[key] = module
    state: Mapping[str, torch.Tensor] = dict(zip(names, tensors))
    module.load_state_dict(state, strict=True)
    module.train()  # as a server's module computes (the built-in experts hold no dropout)
    return module


__all__ = ["DEFAULT_SNAPSHOTS", "Snapshot", "SnapshotPolicy", "SnapshotStore", "Stamp", "module_of", "state_digest"]
