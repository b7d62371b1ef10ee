"""An iterative lookup in hivemind's DHT, sans-I/O (rust-libp2p's query-iterator shape): ask the
nearest contacts not yet asked, ``alpha`` at a time, learn nearer ones from their answers, stop
when the ``k`` nearest have all answered or failed, or after ``max_rounds``."""

from __future__ import annotations

from ..net.identity import PeerID
from .dht_protocol import FindAnswer, merge
from .serializer import ValueWithExpiration
from .storage import Contact


class Lookup:
    """The state of one lookup for ``target``; the driver asks ``next_batch()`` and reports back."""

    def __init__(self, target: int, seeds: list[Contact], *, k: int, alpha: int, max_rounds: int, local_id: int) -> None:
        self.target = target
        self.k = k
        self.alpha = alpha
        self.max_rounds = max_rounds
        self.local_id = local_id
        self.rounds = 0
        self.value: ValueWithExpiration | None = None
        self._known: dict[PeerID, Contact] = {}
        self._asked: set[PeerID] = set()
        self._answered: set[PeerID] = set()
        for contact in seeds:
            self._learn(contact)

    def _learn(self, contact: Contact) -> None:
        if contact.node_id != self.local_id and contact.peer not in self._known:
            self._known[contact.peer] = contact

    def _ranked(self) -> list[Contact]:
        return sorted(self._known.values(), key=lambda c: c.node_id ^ self.target)

    def next_batch(self) -> list[Contact]:
        """Who to ask next (empty: the lookup is over)."""
        if self.rounds >= self.max_rounds:
            return []
        pending = [c for c in self._ranked()[: self.k] if c.peer not in self._asked]
        batch = pending[: self.alpha]
        if batch:
            self.rounds += 1
            self._asked.update(c.peer for c in batch)
        return batch

    def on_answer(self, peer: PeerID, answer: FindAnswer) -> None:
        """``peer`` answered: keep the better value, learn the contacts it named."""
        self._answered.add(peer)
        self.value = merge(self.value, answer.value)
        for contact in answer.nearest:
            self._learn(contact)

    def on_failure(self, peer: PeerID) -> None:
        """``peer`` did not answer: it is no longer a candidate."""
        self._known.pop(peer, None)

    def nearest(self, count: int) -> list[Contact]:
        """The ``count`` nearest contacts that answered."""
        return [c for c in self._ranked() if c.peer in self._answered][:count]


__all__ = ["Lookup"]
