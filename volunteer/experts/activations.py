"""Forward graphs kept for the backward that follows, so the server does not recompute them.

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
from typing import Sequence

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
        while self._kept:
            key, kept = next(iter(self._kept.items()))
            if kept.expires > now:
                return
            self._pop(key)

    def clear(self) -> None:
        """Forget everything."""
        self._kept.clear()
        self.nbytes = 0

    def _pop(self, key: int) -> None:
        kept = self._kept.pop(key)
        self.nbytes -= kept.graph.nbytes


__all__ = ["ActivationCache", "same_tensors"]
