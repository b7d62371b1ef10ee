"""Forward graphs (and inputs) kept for the backward that follows, so the server does not
recompute them and the caller does not send the inputs twice (``KeptInputs``, at the end).

A trainer's backward carries the very inputs of its forward. Instead of recomputing that
forward with autograd (Learning@home's way, which costs a whole forward per backward), the
runtime computes a lone forward request with autograd and keeps its graph here; a backward
whose inputs are ``torch.equal`` to a kept forward's, on an expert whose state fingerprint
(``ExpertBackend.state_fingerprint``) is still the one taken after that forward, goes backward
through the kept graph. Anything else recomputes, as before.

Why a kept graph is never stale: the graph captured the parameter values of its forward. Its
gradients equal those of a recomputation exactly when the inputs are equal and the module would
compute the same thing now: same update count, same training mode, and every parameter and
buffer the same tensor at the same version (torch bumps a tensor's version on any in-place
change: an optimizer step, a loaded checkpoint, a replica's import). The fingerprint checks all
of that; a step makes every older graph of that expert useless, so they are dropped at once.

Bounds (``ExpertsConfig``): at most ``activation_cache_entries`` graphs and
``activation_cache_bytes`` of saved activations in all, each for at most
``activation_cache_ttl`` seconds; the oldest go first. Not thread-safe: the runtime uses it
under its lock. The clock is the caller's (``now``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .backend import ForwardGraph


@dataclass
class _Kept:
    uid: str
    graph: ForwardGraph
    expires: float


def same_tensors(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """Equal count, dtypes, shapes and values (``torch.equal`` after the cheap checks)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
    return all(torch.equal(x, y) for x, y in zip(a, b))


class ActivationCache:
    """Bounded store of forward graphs, looked up by expert and inputs."""

    def __init__(self, max_entries: int, max_bytes: int, ttl: float) -> None:
        self.max_entries, self.max_bytes, self.ttl = max_entries, max_bytes, ttl
        self._kept: OrderedDict[int, _Kept] = OrderedDict()  # oldest first
        self._next = 0
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        """Whether graphs are kept at all (a bound of 0 turns the cache off)."""
        return self.max_entries > 0 and self.max_bytes > 0 and self.ttl > 0

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, uid: str, graph: ForwardGraph, *, now: float) -> bool:
        """Keep ``graph`` for ``uid``'s next backward; False if it alone exceeds the byte bound."""
        self.expire(now)
        if graph.nbytes > self.max_bytes:
            return False
        while self._kept and (len(self._kept) >= self.max_entries or self.nbytes + graph.nbytes > self.max_bytes):
            self._pop(next(iter(self._kept)))
        self._kept[self._next] = _Kept(uid, graph, now + self.ttl)
        self._next += 1
        self.nbytes += graph.nbytes
        return True

    def take(self, uid: str, inputs: Sequence[torch.Tensor], state: tuple, *, now: float) -> ForwardGraph | None:
        """Remove and return a kept graph of ``uid`` for exactly these inputs, taken in module
        state ``state``; None if there is none (the caller recomputes)."""
        self.expire(now)
        for key, kept in self._kept.items():
            if kept.uid == uid and kept.graph.state == state and same_tensors(kept.graph.inputs, inputs):
                self._pop(key)
                self.hits += 1
                return kept.graph
        self.misses += 1
        return None

    def drop_stale(self, uid: str, state: tuple) -> None:
        """Forget ``uid``'s graphs taken in another state than ``state`` (they can never be used)."""
        for key in [k for k, kept in self._kept.items() if kept.uid == uid and kept.graph.state != state]:
            self._pop(key)

    def drop(self, uid: str) -> None:
        """Forget every graph of ``uid`` (the expert left this runtime)."""
        for key in [k for k, kept in self._kept.items() if kept.uid == uid]:
            self._pop(key)

    def expire(self, now: float) -> None:
        """Forget graphs older than the ttl."""
        _expire_oldest(self._kept, now, self._pop)

    def clear(self) -> None:
        """Forget everything."""
        self._kept.clear()
        self.nbytes = 0

    def _pop(self, key: int) -> None:
        kept = self._kept.pop(key)
        self.nbytes -= kept.graph.nbytes


def _expire_oldest(kept: OrderedDict, now: float, pop: Callable[[Any], None]) -> None:
    """``pop`` the entries of ``kept`` (oldest first, each with an ``expires``) that are due."""
    while kept:
        key, entry = next(iter(kept.items()))
        if entry.expires > now:
            return
        pop(key)


@dataclass
class _KeptInputs:
    peer: str
    uid: str
    inputs: list
    nbytes: int
    expires: float


class KeptInputs:
    """A forward's inputs, kept for the backward its caller announced, so the backward need not
    carry them again: on a home uplink they are as many bytes as the gradients. ``put`` gives a
    key that the forward's reply hands the caller; only that caller can ``take`` them back.

    Bounded (``ExpertsConfig.kept_inputs_*``): entries, bytes and age in all, and at most half
    of the entries and bytes for any one caller, so a caller that never sends its backwards
    cannot push everyone else's inputs out. The inputs are the very tensors the forward
    computed on (a kept graph holds them too): no copies. The clock is the caller's (``now``).
    """

    def __init__(self, max_entries: int, max_bytes: int, ttl: float) -> None:
        self.max_entries, self.max_bytes, self.ttl = max_entries, max_bytes, ttl
        self._kept: OrderedDict[tuple[str, int], _KeptInputs] = OrderedDict()  # oldest first
        self._per_peer: dict[str, tuple[int, int]] = {}  # peer -> (entries, bytes)
        self._next = 0
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, peer: str, uid: str, inputs: Sequence[torch.Tensor], *, now: float) -> int | None:
        """Keep ``inputs`` of ``peer``'s forward on ``uid``; the key, or None when they alone
        exceed what one caller may hold (the caller then sends them with its backward)."""
        self.expire(now)
        size = sum(t.nelement() * t.element_size() for t in inputs)
        share_entries, share_bytes = max(1, self.max_entries // 2), self.max_bytes // 2
        if size > share_bytes or self.max_entries <= 0 or self.ttl <= 0:
            return None
        while self._kept and (len(self._kept) >= self.max_entries or self.nbytes + size > self.max_bytes):
            self._pop(next(iter(self._kept)))
        while True:  # this caller's oldest go first once it holds its share
            entries, held = self._per_peer.get(peer, (0, 0))
            if entries < share_entries and held + size <= share_bytes:
                break
            self._pop(next(k for k, v in self._kept.items() if v.peer == peer))
        key = self._next
        self._next += 1
        self._kept[(peer, key)] = _KeptInputs(peer, uid, list(inputs), size, now + self.ttl)
        entries, held = self._per_peer.get(peer, (0, 0))
        self._per_peer[peer] = (entries + 1, held + size)
        self.nbytes += size
        return key

    def take(self, peer: str, uid: str, key: int, *, now: float) -> list[torch.Tensor] | None:
        """Remove and return the inputs ``peer`` was given ``key`` for on ``uid``; None when
        they are gone (or the key is not this caller's, or not for this expert)."""
        self.expire(now)
        kept = self._kept.get((peer, key))
        if kept is None or kept.uid != uid:
            self.misses += 1
            return None
        self._pop((peer, key))
        self.hits += 1
        return kept.inputs

    def expire(self, now: float) -> None:
        """Forget inputs older than the ttl."""
        _expire_oldest(self._kept, now, self._pop)

    def _pop(self, key: tuple[str, int]) -> None:
        kept = self._kept.pop(key)
        self.nbytes -= kept.nbytes
        entries, held = self._per_peer[kept.peer]
        if entries <= 1:
            del self._per_peer[kept.peer]
        else:
            self._per_peer[kept.peer] = (entries - 1, held - kept.nbytes)


__all__ = ["ActivationCache", "KeptInputs", "same_tensors"]
