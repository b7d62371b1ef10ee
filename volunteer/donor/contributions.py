"""What this volunteer has given: requests answered, samples computed, compute time, bytes sent
and distinct trainers served, for this session and kept across restarts.

The core (``Contributions``) is sans-I/O: it is fed the expert runtime's and server's cumulative
counters (which restart at zero with the process) and the callers the server answered; the
lifetime figures are what the state file held at start plus this session's. ``load`` and
``save`` are the only file I/O (a small JSON file under the state dir, replaced atomically).

Distinct trainers are counted in bounded memory with a K-minimum-values sketch: exact up to
``SKETCH_SIZE`` trainers, an estimate (within a few percent) beyond, and mergeable, so the
lifetime count survives restarts without keeping every peer id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SKETCH_SIZE = 1024  # trainers counted exactly; beyond, estimated from the smallest hashes
SAVE_PERIOD = 60.0  # seconds between saves of the state file while the daemon runs
HASH_SPACE = 2**64
STATE_VERSION = 1


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


@dataclass
class Totals:
    """One set of contribution figures."""

    requests: int = 0
    samples: int = 0
    compute_s: float = 0.0
    bytes_sent: int = 0

    def plus(self, other: "Totals") -> "Totals":
        """The element-wise sum."""
        return Totals(self.requests + other.requests, self.samples + other.samples,
                      self.compute_s + other.compute_s, self.bytes_sent + other.bytes_sent)


def _number(value: object, kind: type) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return kind(0)
    return kind(value)


class Contributions:
    """This session's contributions and the lifetime ones (the state file's plus this session's)."""

    def __init__(self, *, since: float | None = None) -> None:
        self.kept = Totals()  # what earlier sessions gave, as the state file says
        self.kept_trainers = DistinctSketch()
        self.session = Totals()
        self.session_trainers = DistinctSketch()
        self.since = since  # wall-clock time of the first session on record

    # --- feeding ---------------------------------------------------------------------------------
    def observe(self, *, requests: int, samples: int, compute_s: float, bytes_sent: int) -> None:
        """This session's cumulative counters (the runtime's and the server's, since start)."""
        self.session = Totals(int(requests), int(samples), float(compute_s), int(bytes_sent))

    def served(self, peer: object) -> None:
        """The server answered a call from ``peer``."""
        self.session_trainers.add(str(peer))

    # --- reading ---------------------------------------------------------------------------------
    def lifetime(self) -> Totals:
        """Earlier sessions plus this one."""
        return self.kept.plus(self.session)

    def view(self) -> dict:
        """The snapshot's ``contributions`` piece: ``{"session": {...}, "total": {...}, "since"}``."""
        total = self.lifetime()
        return {
            "session": {**vars(self.session), "trainers": self.session_trainers.count()},
            "total": {**vars(total), "trainers": self.kept_trainers.merge(self.session_trainers).count()},
            "since": self.since,
        }

    # --- the state file --------------------------------------------------------------------------
    def to_json(self) -> dict:
        """What the state file holds: the lifetime figures and trainer sketch."""
        total = self.lifetime()
        return {"version": STATE_VERSION, "since": self.since, **vars(total),
                "trainers": self.kept_trainers.merge(self.session_trainers).to_json()}

    @classmethod
    def from_json(cls, data: object, *, now: float) -> "Contributions":
        """Contributions whose earlier sessions are ``data`` (a broken field counts as zero)."""
        data = data if isinstance(data, dict) else {}
        since = data.get("since")
        contributions = cls(since=float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else now)
        contributions.kept = Totals(
            int(_number(data.get("requests"), int)), int(_number(data.get("samples"), int)),
            float(_number(data.get("compute_s"), float)), int(_number(data.get("bytes_sent"), int)),
        )
        contributions.kept_trainers = DistinctSketch.from_json(data.get("trainers"))
        return contributions


def state_path(state_dir: Path, swarm_id: str) -> Path:
    """The state file of one swarm's contributions under ``state_dir``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", swarm_id)[:64] or "default"
    return state_dir / "contributions" / f"{safe}.json"


def load(path: Path, *, now: float) -> Contributions:
    """The contributions kept in ``path``; a missing file starts at zero, a broken one too (with
    a warning: the daemon must start anyway)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return Contributions(since=now)
    except (OSError, ValueError) as exc:
        log.warning("contributions file %s unreadable (%s); counting from zero", path, exc)
        return Contributions(since=now)
    return Contributions.from_json(data, now=now)


def save(path: Path, contributions: Contributions) -> bool:
    """Write the lifetime figures to ``path`` atomically; False (logged once by the caller) on failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(json.dumps(contributions.to_json()))
        os.replace(partial, path)
        return True
    except OSError as exc:
        log.debug("cannot save contributions to %s: %s", path, exc)
        return False


__all__ = ["Contributions", "DistinctSketch", "SAVE_PERIOD", "SKETCH_SIZE", "Totals", "load", "save", "state_path"]
