"""``Hosting``: which experts a node serves, decided in one place per node.

A swarm with grids decides it in its ``ReplicaManager`` (placement, catch-up, hand-off, and a
set-aside the placement re-checks respect); a swarm without grids hosts what its runtime started
with, and ``RuntimeHosting`` is the one part that takes an expert out of it and puts it back.
The node's ``set_aside`` / ``take_back`` (what the donor's self-care asks) go through whichever
the kind built, never beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import trio

if TYPE_CHECKING:
    from ..experts.backend import ExpertBackend
    from ..experts.runtime import Runtime

DROP_TIMEOUT = 20.0  # a tombstone that has not reached the DHT by then is left to the record's expiry


class Hosting(Protocol):
    """The one part of a node that decides which experts it serves."""

    def hosted(self) -> frozenset[str]:
        """The uids served now (set-aside ones excluded)."""
        ...

    async def set_aside(self, uid: str) -> bool:
        """Withdraw ``uid`` (tombstone first, then refuse its calls) and keep its backend to take
        back; False when it is not hosted."""
        ...

    def take_back(self, uids: Sequence[str]) -> list[str]:
        """Serve and declare again those of ``uids`` set aside; returns the uids taken back."""
        ...


class Declares(Protocol):
    """The declarer as ``RuntimeHosting`` uses it (ours; a kind whose own service declares
    ``runtime.uids`` each round, as hivemind's does, has none)."""

    def add(self, uid: str) -> None: ...

    async def drop(self, uid: str) -> None: ...


class RuntimeHosting:
    """Hosting on a swarm without grids: the runtime's experts, declared by ``declarer``."""

    def __init__(self, runtime: "Runtime", declarer: Declares | None = None, *, drop_timeout: float = DROP_TIMEOUT) -> None:
        self.runtime = runtime
        self.declarer = declarer
        self.drop_timeout = drop_timeout
        self.aside: dict[str, "ExpertBackend"] = {}  # uid -> the backend taken out of the runtime

    def hosted(self) -> frozenset[str]:
        return frozenset(self.runtime.backends)

    async def set_aside(self, uid: str) -> bool:
        if uid not in self.runtime.backends:
            return False
        if self.declarer is not None:  # tombstone first: trainers stop picking us for it at once
            with trio.move_on_after(self.drop_timeout):
                await self.declarer.drop(uid)  # a tombstone that fails is logged by the declarer
        if uid not in self.runtime.backends:  # gone while the tombstone was on its way
            return False
        self.aside[uid] = self.runtime.remove_backend(uid)
        return True

    def take_back(self, uids: Sequence[str]) -> list[str]:
        back = []
        for uid in uids:
            backend = self.aside.pop(uid, None)
            if backend is None or uid in self.runtime.backends:
                continue
            self.runtime.add_backend(backend)
            if self.declarer is not None:
                self.declarer.add(uid)
            back.append(uid)
        return back


__all__ = ["DROP_TIMEOUT", "Declares", "Hosting", "RuntimeHosting"]
