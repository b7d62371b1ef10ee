"""The one record of what a volunteer contributed: per hour, per day, per month, this session
and over its lifetime, in one vocabulary (``FIGURES``), kept across restarts in one file.

The daemon's counters, the status snapshot's ``contributions`` piece (``contributions_view``),
``volunteer history`` and the web page's plots all read this record; nothing else keeps totals.
The core (``History``) is sans-I/O: it is fed the daemon's cumulative counters with ``now``
(wall-clock seconds) and adds what grew since the last feed to the hour, the local day and the
local month ``now`` falls in, to this session and to the lifetime totals. Old buckets are dropped as new ones open (``HOURS_KEPT``,
``DAYS_KEPT``, ``MONTHS_KEPT``), so the file stays bounded (well under a few MiB) however long a
machine donates. ``load`` and ``save`` are the only file I/O (JSON replaced atomically).

Each bucket holds: calls answered, samples computed, compute seconds on a GPU and on the CPU,
expert reply bytes sent, all bytes in and out (the daily transfer cap reads it), seconds the
daemon ran and seconds it served, and the distinct trainers served (a small K-minimum-values
sketch per bucket: exact up to ``TRAINER_SKETCH`` trainers, estimated beyond).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .contributions import SKETCH_SIZE, DistinctSketch
from .status import BucketView, ContributionsView, Given

log = logging.getLogger(__name__)

HOURS_KEPT = 8 * 24  # the web page plots the last 7 days per hour
DAYS_KEPT = 400  # ... the last 90 per day; `volunteer history` lists a year of days
MONTHS_KEPT = 240  # twenty years of months
TRAINER_SKETCH = 64  # trainers counted exactly per bucket
MAX_GAP = 120.0  # seconds between feeds counted as uptime at most (a suspended laptop is not up)
HISTORY_VERSION = 2  # 2: lifetime totals and the first day on record beside the buckets
FILE_LIMIT = 16 * 2**20  # a history file larger than this is not read (it is not ours)
FIGURES = ("calls", "samples", "gpu_s", "cpu_s", "bytes_sent", "traffic", "uptime_s", "serving_s")


@dataclass
class Bucket:
    """One hour's, day's or month's contributions."""

    calls: int = 0
    samples: int = 0
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    bytes_sent: int = 0
    traffic: int = 0
    uptime_s: float = 0.0
    serving_s: float = 0.0
    trainers: DistinctSketch = field(default_factory=lambda: DistinctSketch(TRAINER_SKETCH))

    def add(self, figures: dict[str, float]) -> None:
        """Add ``figures`` (a subset of FIGURES) to this bucket."""
        for name, value in figures.items():
            setattr(self, name, type(getattr(self, name))(getattr(self, name) + value))

    def merge(self, other: "Bucket") -> "Bucket":
        """The sum of two buckets (two swarms' histories of the same day)."""
        merged = Bucket(trainers=self.trainers.merge(other.trainers))
        merged.add({name: getattr(self, name) for name in FIGURES})
        merged.add({name: getattr(other, name) for name in FIGURES})
        return merged

    def given(self) -> Given:
        """This bucket in the status snapshot's ``contributions`` keys (``Given``)."""
        return Given(requests=self.calls, samples=self.samples, compute_s=round(self.gpu_s + self.cpu_s, 3),
                     bytes_sent=self.bytes_sent, trainers=self.trainers.count())

    def as_dict(self) -> BucketView:
        """JSON figures (trainers as a count)."""
        return BucketView(calls=self.calls, samples=self.samples, gpu_s=round(self.gpu_s, 3), cpu_s=round(self.cpu_s, 3),
                          bytes_sent=self.bytes_sent, traffic=self.traffic, uptime_s=round(self.uptime_s, 3),
                          serving_s=round(self.serving_s, 3), trainers=self.trainers.count())

    def to_json(self) -> dict:
        """What the file holds (trainers as the sketch)."""
        return {**{name: getattr(self, name) for name in FIGURES}, "trainers": self.trainers.to_json()}

    @classmethod
    def from_json(cls, data: object, *, sketch: int = TRAINER_SKETCH) -> "Bucket":
        """A bucket from ``to_json``'s dict; a broken figure counts as zero."""
        data = data if isinstance(data, dict) else {}
        bucket = cls(trainers=DistinctSketch.from_json(data.get("trainers"), size=sketch))
        for name in FIGURES:
            value = data.get(name)
            kind = type(getattr(bucket, name))
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and 0 <= value < 2**62:
                setattr(bucket, name, kind(value))
        return bucket


def hour_of(now: float) -> int:
    """The start of ``now``'s hour, in epoch seconds (hours are the same everywhere but for
    zones with a half-hour offset, which then see their hours shifted by 30 minutes)."""
    return int(now // 3600 * 3600)


def day_of(now: float) -> str:
    """``now``'s local date, ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.localtime(now))


def month_of(now: float) -> str:
    """``now``'s local month, ``YYYY-MM``."""
    return time.strftime("%Y-%m", time.localtime(now))


class Deltas:
    """What each cumulative counter grew by since the last look. A counter that went down was
    restarted (an expert handed off and taken again): its whole new value is the growth."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def step(self, current: dict[str, float]) -> dict[str, float]:
        """The growth of each counter in ``current``; counters not given are forgotten."""
        grown = {}
        for key, value in current.items():
            before = self.last.get(key, 0.0)
            grown[key] = value - before if value >= before else value
        self.last = dict(current)
        return grown


class History:
    """Hour, day and month buckets, fed with cumulative counters and ``now``."""

    def __init__(self, *, keep_file: bool = True) -> None:
        # False: the file this history came from could not be read nor set aside; saving over it
        # would lose what it holds
        self.keep_file = keep_file
        self.hours: dict[int, Bucket] = {}
        self.days: dict[str, Bucket] = {}
        self.months: dict[str, Bucket] = {}
        # every figure since the first day on record (``since``), and this session's (not kept)
        self.lifetime = Bucket(trainers=DistinctSketch(SKETCH_SIZE))
        self.session = Bucket(trainers=DistinctSketch(SKETCH_SIZE))
        self.since: float | None = None
        self._last_feed: float | None = None

    # --- feeding ---------------------------------------------------------------------------------
    def add(self, now: float, figures: dict[str, float]) -> None:
        """Add ``figures`` to the hour, day and month of ``now``, dropping buckets now too old."""
        for bucket in self._buckets(now):
            bucket.add(figures)
        self.lifetime.add(figures)
        self.session.add(figures)

    def tick(self, now: float, *, serving: bool) -> None:
        """Count the time since the last tick as uptime (and serving time while ``serving``);
        a gap longer than MAX_GAP (the machine slept) counts as MAX_GAP."""
        if self._last_feed is not None and now > self._last_feed:
            span = min(now - self._last_feed, MAX_GAP)
            self.add(now, {"uptime_s": span, **({"serving_s": span} if serving else {})})
        self._last_feed = now

    def served(self, now: float, trainer: str) -> None:
        """A call from ``trainer`` was answered at ``now``."""
        for bucket in (*self._buckets(now), self.lifetime, self.session):
            bucket.trainers.add(trainer)

    def _buckets(self, now: float) -> tuple[Bucket, Bucket, Bucket]:
        if self.since is None:
            self.since = now
        hour, day, month = hour_of(now), day_of(now), month_of(now)
        if hour not in self.hours:
            self.hours[hour] = Bucket()
            _keep_newest(self.hours, HOURS_KEPT)
        if day not in self.days:
            self.days[day] = Bucket()
            _keep_newest(self.days, DAYS_KEPT)
        if month not in self.months:
            self.months[month] = Bucket()
            _keep_newest(self.months, MONTHS_KEPT)
        return self.hours[hour], self.days[day], self.months[month]

    # --- reading ---------------------------------------------------------------------------------
    def contributions_view(self) -> ContributionsView:
        """The status snapshot's ``contributions`` piece: this session, the lifetime, since when."""
        return ContributionsView(session=self.session.given(), total=self.lifetime.given(), since=self.since)

    def today(self, now: float) -> Bucket:
        """The bucket of ``now``'s local day (empty if nothing happened yet)."""
        return self.days.get(day_of(now), Bucket())

    def hourly(self, now: float, hours: int = 7 * 24) -> list[tuple[int, Bucket]]:
        """The last ``hours`` hours up to ``now``'s, oldest first, empty hours included."""
        last = hour_of(now)
        return [(start, self.hours.get(start, Bucket())) for start in range(last - (hours - 1) * 3600, last + 1, 3600)]

    def daily(self, now: float, days: int = 90) -> list[tuple[str, Bucket]]:
        """The last ``days`` local days up to ``now``'s, oldest first, empty days included."""
        out: list[tuple[str, Bucket]] = []
        seen: set[str] = set()
        moment = now
        while len(out) < days:
            day = day_of(moment)
            if day not in seen:
                seen.add(day)
                out.append((day, self.days.get(day, Bucket())))
            moment -= 6 * 3600  # steps shorter than a day: a 23-hour DST day is not skipped
        return out[::-1]

    def merge(self, other: "History") -> "History":
        """Both histories summed bucket by bucket (several swarms on one machine)."""
        merged = History()
        for name in ("hours", "days", "months"):
            mine, theirs, out = getattr(self, name), getattr(other, name), getattr(merged, name)
            for key in {*mine, *theirs}:
                out[key] = mine.get(key, Bucket()).merge(theirs.get(key, Bucket()))
        merged.lifetime = self.lifetime.merge(other.lifetime)
        merged.session = self.session.merge(other.session)
        merged.since = min((t for t in (self.since, other.since) if t is not None), default=None)
        return merged

    # --- the file --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """What the history file holds."""
        return {
            "version": HISTORY_VERSION,
            "hours": {str(k): b.to_json() for k, b in sorted(self.hours.items())},
            "days": {k: b.to_json() for k, b in sorted(self.days.items())},
            "months": {k: b.to_json() for k, b in sorted(self.months.items())},
            "lifetime": self.lifetime.to_json(),
            "since": self.since,
        }

    @classmethod
    def from_json(cls, data: object) -> "History":
        """A history from ``to_json``'s dict; keys that do not parse are skipped, and no more
        buckets are kept than a running daemon would keep."""
        history = cls()
        data = data if isinstance(data, dict) else {}
        for name, pattern, limit in (("hours", _HOUR, HOURS_KEPT), ("days", _DAY, DAYS_KEPT), ("months", _MONTH, MONTHS_KEPT)):
            table = data.get(name)
            if not isinstance(table, dict):
                continue
            target = getattr(history, name)
            for key, value in table.items():
                if isinstance(key, str) and pattern.fullmatch(key):
                    target[int(key) if name == "hours" else key] = Bucket.from_json(value)
            _keep_newest(target, limit)
        if isinstance(data.get("lifetime"), dict):
            history.lifetime = Bucket.from_json(data["lifetime"], sketch=SKETCH_SIZE)
        else:  # a version 1 file kept no totals: its months (twenty years of them) are its lifetime
            for bucket in history.months.values():
                history.lifetime = history.lifetime.merge(bucket)
        since = data.get("since")
        if isinstance(since, (int, float)) and not isinstance(since, bool) and 0 <= since < 2**40:
            history.since = float(since)
        elif history.hours:  # version 1: the oldest hour kept
            history.since = float(min(history.hours))
        return history


_HOUR = re.compile(r"\d{1,12}")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_MONTH = re.compile(r"\d{4}-\d{2}")


def _keep_newest(table: dict, limit: int) -> None:
    if len(table) > limit:
        for key in sorted(table)[: len(table) - limit]:
            del table[key]


def history_path(state_dir: Path, swarm_id: str) -> Path:
    """One swarm's history file under ``state_dir``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", swarm_id)[:64] or "default"
    return state_dir / "history" / f"{safe}.json"


class CorruptHistory(ValueError):
    """A history file that is not one we wrote (broken JSON, too large, not a history)."""


def read(path: Path) -> History:
    """The history kept in ``path``: FileNotFoundError when there is none, CorruptHistory when
    the file is not a history, OSError when it cannot be read."""
    if path.stat().st_size > FILE_LIMIT:
        raise CorruptHistory(f"larger than {FILE_LIMIT} bytes")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptHistory(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptHistory(f"not a history (a JSON {type(data).__name__})")
    return History.from_json(data)


def load(path: Path, *, now: float | None = None) -> History:
    """The history a daemon keeps adding to in ``path``; missing starts empty. A corrupt file is
    never written over: it is kept aside as ``<name>.corrupt-<stamp>`` (``now``'s local time)
    and the log says so once; then a new history starts (the daemon must start anyway)."""
    try:
        return read(path)
    except FileNotFoundError:
        return History()
    except CorruptHistory as exc:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        aside = path.with_name(f"{path.name}.corrupt-{stamp}")
        try:
            os.replace(path, aside)
        except OSError as move:
            log.warning("contribution history %s is corrupt (%s) and cannot be kept aside (%s); "
                        "starting a new one in memory, not saved over it", path, exc, move)
            return History(keep_file=False)
        log.warning("contribution history %s is corrupt (%s): kept aside as %s; starting a new one",
                    path, exc, aside.name)
        return History()
    except OSError as exc:
        log.warning("contribution history %s unreadable (%s); starting a new one in memory, not saved over it",
                    path, exc)
        return History(keep_file=False)


def _read_quietly(path: Path) -> History:
    # a reader (``volunteer history``, the web page) leaves a bad file for the daemon to set aside
    try:
        return read(path)
    except FileNotFoundError:
        return History()
    except (OSError, CorruptHistory) as exc:
        log.warning("contribution history %s skipped: %s", path, exc)
        return History()


def adopt_legacy_totals(history: History, path: Path) -> bool:
    """Fold the lifetime totals an older version kept in a separate contributions file
    (``contributions/<swarm>.json``: requests, samples, compute_s, bytes_sent, trainers, since)
    into ``history``'s, once: each figure is raised to at least the old one (the old compute
    seconds count as CPU seconds: that file did not say which). The old file is renamed
    ``.adopted`` so it is not counted twice. True when there was one to adopt."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    life = history.lifetime

    def number(key: str) -> float:
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 2**62:
            return float(value)
        return 0.0

    life.calls = max(life.calls, int(number("requests")))
    life.samples = max(life.samples, int(number("samples")))
    life.bytes_sent = max(life.bytes_sent, int(number("bytes_sent")))
    life.cpu_s += max(0.0, number("compute_s") - (life.gpu_s + life.cpu_s))
    life.trainers = life.trainers.merge(DistinctSketch.from_json(data.get("trainers"), size=SKETCH_SIZE))
    since = number("since")
    if since > 0 and (history.since is None or since < history.since):
        history.since = since
    try:
        os.replace(path, path.with_name(path.name + ".adopted"))
    except OSError as exc:
        log.debug("cannot rename the adopted contributions file %s: %s", path, exc)
    return True


def legacy_path(state_dir: Path, swarm_id: str) -> Path:
    """Where an older version kept one swarm's lifetime totals apart from its history."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", swarm_id)[:64] or "default"
    return state_dir / "contributions" / f"{safe}.json"


def load_all(state_dir: Path, swarm_id: str | None = None) -> History:
    """Every swarm's history on this machine summed (or one swarm's)."""
    if swarm_id is not None:
        return _read_quietly(history_path(state_dir, swarm_id))
    total = History()
    folder = state_dir / "history"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        total = total.merge(_read_quietly(path))
    return total


def save(path: Path, history: History) -> bool:
    """Write ``history`` to ``path`` atomically; False (the caller warns once) on failure, or
    when ``history`` must not replace the file (``keep_file``: it could not be read)."""
    if not history.keep_file:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(json.dumps(history.to_json(), separators=(",", ":")))
        os.replace(partial, path)
        return True
    except OSError as exc:
        log.debug("cannot save the contribution history to %s: %s", path, exc)
        return False


__all__ = ["Bucket", "CorruptHistory", "Deltas", "adopt_legacy_totals", "legacy_path", "FIGURES", "History", "day_of", "history_path", "hour_of", "load", "load_all",
           "month_of", "read", "save"]
