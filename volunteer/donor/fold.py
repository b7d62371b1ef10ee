"""fold / pause / finish: what the donor chose, what the run-when policy says, and what the
daemon's self-care decided, combined into one answer: serve now or not, and why.

``Conduct`` is the pure core. The donor's choice is one of

* ``folding``: serve (Folding@home's verb; ``volunteer fold``),
* ``paused``: experts withdrawn, new calls refused, connected (``volunteer pause``),
* ``finishing`` then ``finished``: stop taking new calls, let in-flight ones finish, hand off
  sole copies, save checkpoints, then stay idle but connected (``volunteer finish``);

the policy's verdict (``policy.Verdict``) and self-care's reason (every expert failing) can each
hold a folding daemon back. Every change is an ``Event`` with its origin (``cli``, ``web``,
``policy``, ``self-care``, ``consent``), kept in a bounded log the dashboard, the web page and
``volunteer status`` show. ``Steward`` in ``steward.py`` applies it to a running node.

The donor's pause or finish outlives the daemon (``save_choice`` / ``load_choice``, a small file
in the state directory): after a restart or a reboot the daemon starts as the donor left it, until
``volunteer fold``. What the policy or self-care decided is not kept: they look again at start.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .policy import RUN, Verdict
from .status import ConductView, EventView

CHOICES = ("folding", "paused", "finishing", "finished")
ACTIONS = {"fold": "folding", "pause": "paused", "finish": "finishing"}
ORIGINS = ("cli", "web", "policy", "self-care", "consent", "start")
EVENTS_KEPT = 100
LONG_PAUSE = 15 * 60.0  # seconds: a pause known or seen to last this long hands off sole copies
# a choice kept across restarts, as the daemon starts with it: a finish under way ended with the
# daemon (nothing is in flight after a restart), so it comes back finished
KEPT = {"paused": "paused", "finishing": "finished", "finished": "finished"}
CHOICE_FILE_LIMIT = 4096  # bytes of a kept choice read

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One change of what the daemon does: ``action`` (fold, pause, finish, finished, policy,
    self-care), the reason in words, who asked (``origin``) and when (wall clock)."""

    time: float
    action: str
    reason: str
    origin: str

    def as_dict(self) -> EventView:
        """The event as JSON."""
        return EventView(time=self.time, action=self.action, reason=self.reason, origin=self.origin)

    @property
    def line(self) -> str:
        """The event as a log line: ``paused (policy): on battery``."""
        return f"{self.action} ({self.origin}): {self.reason}" if self.reason else f"{self.action} ({self.origin})"


@dataclass(frozen=True)
class KeptChoice:
    """The donor's pause or finish as it was saved: the choice, who made it, since when (wall clock)."""

    choice: str
    origin: str
    since: float


class Conduct:
    """The donor's choice, the policy's verdict and self-care's hold, with their history."""

    def __init__(self, *, folding: bool = True, origin: str = "start", reason: str = "", now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.choice = "folding" if folding else "paused"
        self.origin = origin
        self.since = now
        self.verdict: Verdict = RUN
        self.verdict_since = now
        self.hold: str | None = None  # self-care's reason to stay out of the swarm
        self.events: collections.deque[Event] = collections.deque(maxlen=EVENTS_KEPT)
        self._record(now, "fold" if folding else "pause", reason, origin)
        self._paused_since: float | None = None if self.serving else now
        self.handed_off = False  # sole copies were handed off during the current pause

    @classmethod
    def kept(cls, kept: KeptChoice, now: float) -> "Conduct":
        """A daemon starting as the donor left the last one: paused or finished, by whom, since
        when; the first event says it was kept across the restart."""
        conduct = cls(folding=False, origin=kept.origin, now=now)
        conduct.choice, conduct.since = KEPT[kept.choice], kept.since
        conduct.events.clear()
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(kept.since))
        action = "pause" if conduct.choice == "paused" else "finished"
        conduct._record(now, action, f"kept from before the restart ({kept.choice} by you since {when})", kept.origin)
        return conduct

    def _record(self, now: float, action: str, reason: str, origin: str) -> Event:
        event = Event(now, action, reason, origin)
        self.events.append(event)
        return event

    # --- inputs -------------------------------------------------------------------------------------
    def ask(self, action: str, origin: str, now: float) -> Event | None:
        """The donor asks to ``fold``, ``pause`` or ``finish`` (from ``origin``); None when it
        changes nothing (folding already, or finishing when already finished)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}: fold, pause or finish")
        target = ACTIONS[action]
        if target == self.choice or (target == "finishing" and self.choice == "finished"):
            return None
        if target == "paused" and self.choice == "finished":
            return None  # already out of the swarm and nothing to finish
        was_serving = self.serving
        self.choice, self.origin, self.since = target, origin, now
        event = self._record(now, action, "", origin)
        self._after(was_serving, now)
        return event

    def finished(self, now: float, reason: str = "in-flight calls done, sole copies handed off, checkpoints saved") -> Event | None:
        """The finish ran to its end: stay idle but connected."""
        if self.choice != "finishing":
            return None
        self.choice, self.since = "finished", now
        return self._record(now, "finished", reason, self.origin)

    def set_verdict(self, verdict: Verdict, now: float) -> Event | None:
        """The policy's latest verdict; an Event when its state or reason changed."""
        if verdict.state == self.verdict.state and verdict.code == self.verdict.code and verdict.until == self.verdict.until:
            self.verdict = verdict  # the same decision; figures in its words may have moved
            return None
        was_serving = self.serving
        changed_state = verdict.state != self.verdict.state or verdict.code != self.verdict.code
        self.verdict = verdict
        if not changed_state:
            return None
        self.verdict_since = now
        event = self._record(now, "resume" if verdict.run else verdict.state, "run-when policies allow it" if verdict.run
                             else verdict.reason, "policy")
        self._after(was_serving, now)
        return event

    def set_hold(self, reason: str | None, now: float) -> Event | None:
        """Self-care holds the daemon out of the swarm for ``reason`` (None: lifts it)."""
        if reason == self.hold:
            return None
        was_serving = self.serving
        self.hold = reason
        event = self._record(now, "pause" if reason else "resume", reason or "self-care hold lifted", "self-care")
        self._after(was_serving, now)
        return event

    def _after(self, was_serving: bool, now: float) -> None:
        if was_serving and not self.serving:
            self._paused_since, self.handed_off = now, False
        elif self.serving:
            self._paused_since, self.handed_off = None, False

    # --- outputs ------------------------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        """Whether the experts should be declared and take calls now."""
        return self.choice == "folding" and self.verdict.run and self.hold is None

    def pause_lasts(self, now: float) -> bool:
        """Whether the current pause is long enough to hand sole copies to others: its end is
        known to be LONG_PAUSE away, or it has lasted that long already. Never while serving or
        once the hand-off was done for this pause."""
        if self.serving or self.handed_off or self._paused_since is None or self.choice in ("finishing", "finished"):
            return False
        if self.choice == "folding" and self.hold is None and self.verdict.until is not None:
            if self.verdict.until - now >= LONG_PAUSE:
                return True
        return now - self._paused_since >= LONG_PAUSE

    @property
    def state(self) -> str:
        """One word: folding, paused, waiting, finishing, finished."""
        if self.choice != "folding":
            return self.choice
        if self.hold is not None:
            return "paused"
        return "folding" if self.verdict.run else self.verdict.state

    @property
    def text(self) -> str:
        """What the daemon does, in words: ``folding``, ``paused: on battery``, ``paused by you
        (web)``, ``waiting: computer in use, resumes after 3 idle minutes``."""
        if self.choice == "paused" and self.origin == "consent":
            return "paused until you agree to donate: `volunteer fold` starts"
        if self.choice == "paused":
            return f"paused by you ({self.origin}): `volunteer fold` resumes"
        if self.choice == "finishing":
            return f"finishing ({self.origin}): in-flight calls, hand-off, checkpoints"
        if self.choice == "finished":
            return "finished: idle and connected; `volunteer fold` starts again"
        if self.hold is not None:
            return f"paused: {self.hold}"
        return self.verdict.text if not self.verdict.run else "folding"

    def view(self, now: float) -> ConductView:
        """The snapshot's ``conduct`` piece."""
        return ConductView(
            state=self.state, text=self.text, serving=self.serving, choice=self.choice,
            origin=self.origin, since=self.since, verdict=self.verdict.as_dict(), hold=self.hold,
            paused_for_s=round(now - self._paused_since, 1) if self._paused_since is not None else None,
            handed_off=self.handed_off,
            events=[e.as_dict() for e in list(self.events)[-20:]],
        )


def choice_path(state_dir: Path, swarm_id: str) -> Path:
    """Where the donor's pause or finish of one swarm is kept under ``state_dir``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", swarm_id)[:64] or "default"
    return state_dir / "conduct" / f"{safe}.json"


def save_choice(path: Path, conduct: Conduct) -> bool:
    """Keep the donor's choice in ``path`` (atomically) when it is a pause or a finish, and remove
    the file once the donor folds again; False (logged) when the disk refuses."""
    try:
        if conduct.choice == "folding":
            path.unlink(missing_ok=True)
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(json.dumps({"choice": conduct.choice, "origin": conduct.origin, "since": conduct.since}))
        os.replace(partial, path)
        return True
    except OSError as exc:
        log.warning("cannot keep your %s across restarts in %s: %s", conduct.choice, path, exc.strerror or exc)
        return False


def load_choice(path: Path) -> KeptChoice | None:
    """The donor's kept pause or finish, or None (none kept; an unreadable or malformed file is
    logged and read as none: the daemon then starts as consent says)."""
    try:
        with path.open("rb") as handle:
            data = json.loads(handle.read(CHOICE_FILE_LIMIT))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the kept pause in %s: %s", path, exc)
        return None
    if (not isinstance(data, dict) or data.get("choice") not in KEPT or data.get("origin") not in ORIGINS
            or not isinstance(data.get("since"), (int, float)) or isinstance(data.get("since"), bool)):
        log.warning("ignoring the kept pause in %s: not a choice this version wrote", path)
        return None
    return KeptChoice(data["choice"], data["origin"], float(data["since"]))


__all__ = ["ACTIONS", "CHOICES", "Conduct", "Event", "KeptChoice", "LONG_PAUSE", "ORIGINS", "choice_path", "load_choice",
           "save_choice"]
