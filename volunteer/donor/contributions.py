"""The sketch the contribution record (``history.History``, the one record) counts distinct
trainers with, and how often the daemon saves that record.

Distinct trainers are counted in bounded memory with a K-minimum-values sketch: exact up to
``SKETCH_SIZE`` trainers, an estimate (within a few percent) beyond, and mergeable, so the
lifetime count survives restarts without keeping every peer id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

SKETCH_SIZE = 1024  # trainers counted exactly; beyond, estimated from the smallest hashes
SAVE_PERIOD = 60.0  # seconds between saves of the record while the daemon runs
HASH_SPACE = 2**64


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@dataclass
class DistinctSketch:
    """Counts distinct keys in bounded memory (K minimum values of a 64-bit hash)."""

    size: int = SKETCH_SIZE
    hashes: set[int] = field(default_factory=set)

    def add(self, key: str) -> None:
        """Count ``key`` (adding it again changes nothing)."""
        self._insert(_hash(key))

    def _insert(self, value: int) -> None:
        if value in self.hashes:
            return
        if len(self.hashes) < self.size:
            self.hashes.add(value)
        elif value < max(self.hashes):
            self.hashes.remove(max(self.hashes))
            self.hashes.add(value)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` was added (exact while the sketch is not full; afterwards a key whose
        hash fell out of the K smallest reads as absent)."""
        return _hash(str(key)) in self.hashes

    def merge(self, other: "DistinctSketch") -> "DistinctSketch":
        """A sketch of the union of both key sets."""
        merged = DistinctSketch(self.size, set(self.hashes))
        for value in other.hashes:
            merged._insert(value)
        return merged

    def count(self) -> int:
        """The number of distinct keys: exact while the sketch is not full, else estimated."""
        if len(self.hashes) < self.size:
            return len(self.hashes)
        return round((self.size - 1) * HASH_SPACE / (max(self.hashes) + 1))

    def to_json(self) -> list[str]:
        """The hashes as hex strings (JSON numbers lose 64-bit precision in some readers)."""
        return [f"{value:016x}" for value in sorted(self.hashes)]

    @classmethod
    def from_json(cls, values: object, size: int = SKETCH_SIZE) -> "DistinctSketch":
        """A sketch from ``to_json``'s list; entries that do not parse are skipped."""
        sketch = cls(size)
        for value in values if isinstance(values, list) else []:
            try:
                sketch._insert(int(str(value), 16) % HASH_SPACE)
            except ValueError:
                continue
        return sketch


__all__ = ["DistinctSketch", "SAVE_PERIOD", "SKETCH_SIZE"]
