"""A daemon that looks after itself, as pure cores the ``Steward`` drives.

* ``FailureStreaks``: after K consecutive failed calls of one expert (Folding@home pauses a
  resource group after 5 failed work units) that expert is set aside and the reason said; once
  every hosted expert is set aside, the daemon holds itself out of the swarm. ``volunteer fold``
  takes them back.
* ``VisibilityWatch``: a daemon that believes it serves experts looks itself up in the DHT, as a
  trainer would; when it has not been seen for ``misses`` heartbeats in a row it re-joins
  (re-dials its bootstrap peers and relays, declares at once) and says so. Petals servers were
  known to vanish from the DHT after an outage while still running. While it is seen, the look-ups
  thin out to one every ``max_quiet`` heartbeats (a look-up costs about what a heartbeat does:
  one every heartbeat doubled a donor's DHT requests); after a miss, every heartbeat again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .status import ContactView, VisibilityView

DEFAULT_FAILURE_LIMIT = 5  # consecutive failed calls of one expert before it is set aside
DEFAULT_MISSES = 2  # heartbeats without seeing our own experts before re-joining
# heartbeats between two look-ups of our own experts while they are seen (doubling up to this):
# a minute at the default 5 s heartbeat, so a donor that vanished re-joins within about a minute
DEFAULT_MAX_QUIET = 12
LAST_ERROR_CHARS = 160


@dataclass
class FailureStreaks:
    """Consecutive failures per expert; ``failed`` says when one reaches ``limit``."""

    limit: int = DEFAULT_FAILURE_LIMIT
    streaks: dict[str, int] = field(default_factory=dict)
    set_aside: dict[str, str] = field(default_factory=dict)  # uid -> why

    def succeeded(self, uid: str) -> None:
        """A call of ``uid`` was answered with a result: its streak starts over."""
        self.streaks.pop(uid, None)

    def failed(self, uid: str, error: str) -> bool:
        """A call of ``uid`` failed with ``error``; True exactly when this failure sets it aside."""
        if uid in self.set_aside or not uid:
            return False
        count = self.streaks.get(uid, 0) + 1
        self.streaks[uid] = count
        if count < self.limit:
            return False
        self.streaks.pop(uid, None)
        self.set_aside[uid] = f"failed {count} calls in a row (last: {error[:LAST_ERROR_CHARS]})"
        return True

    def take_back(self) -> list[str]:
        """Forget every set-aside expert (``volunteer fold``); returns their uids."""
        uids = sorted(self.set_aside)
        self.set_aside.clear()
        self.streaks.clear()
        return uids

    def hold(self, hosted: set[str]) -> str | None:
        """Why the daemon should hold itself out of the swarm: every expert it hosts was set aside."""
        if hosted or not self.set_aside:
            return None
        return (f"all {len(self.set_aside)} expert(s) failed {self.limit} calls in a row; "
                "check the log, then `volunteer fold`")


@dataclass
class VisibilityWatch:
    """Whether our experts are visible to trainers, heartbeat after heartbeat."""

    misses_allowed: int = DEFAULT_MISSES
    max_quiet: int = DEFAULT_MAX_QUIET
    misses: int = 0
    last_seen: float | None = None
    rejoins: int = 0
    last_rejoin: float | None = None
    quiet: int = 1  # heartbeats until the next look-up

    def observe(self, seen: bool, now: float) -> bool:
        """One look-up of our own experts; True when it is time to re-join (the look-up missed
        ``misses_allowed`` times in a row); the count starts over after each re-join. Sets
        ``quiet``: doubled after a look-up that saw us (up to ``max_quiet``), one after a miss."""
        if seen:
            self.misses, self.last_seen = 0, now
            self.quiet = min(max(1, self.max_quiet), self.quiet * 2)
            return False
        self.quiet = 1
        self.misses += 1
        if self.misses < self.misses_allowed:
            return False
        self.misses = 0
        self.rejoins += 1
        self.last_rejoin = now
        return True

    def reset(self) -> None:
        """Not serving (paused): nothing should be visible, nothing is missed; once serving
        again, the next look-up comes a heartbeat later."""
        self.misses = 0
        self.quiet = 1

    @property
    def visible(self) -> bool | None:
        """Whether the last look-up saw us (None before the first)."""
        if self.misses:
            return False
        return True if self.last_seen is not None else None

    def view(self, now: float) -> VisibilityView:
        """The snapshot's ``self_care.visibility`` piece."""
        return VisibilityView(
            visible=self.visible, misses=self.misses, rejoins=self.rejoins,
            last_seen_age_s=round(now - self.last_seen, 1) if self.last_seen is not None else None,
            last_rejoin_age_s=round(now - self.last_rejoin, 1) if self.last_rejoin is not None else None,
        )


CUT_OFF_GRACE = 10.0  # seconds without a single peer before the node calls itself cut off
REDIAL_PERIOD = 30.0  # seconds between re-dials of the swarm's entry points while cut off


@dataclass
class SwarmContact:
    """Whether the node is in touch with its swarm, look after look: with no peer connected for
    ``grace`` seconds it is cut off (a relay that died, a network gone), and it re-dials the
    swarm's entry points every ``redial_period`` until a peer is back."""

    grace: float = CUT_OFF_GRACE
    redial_period: float = REDIAL_PERIOD
    alone_since: float | None = None  # first look with no peer, in this stretch
    cut_off_since: float | None = None
    last_redial: float | None = None
    redials: int = 0
    cut_offs: int = 0

    def observe(self, peers: int, now: float) -> str | None:
        """One look (``peers`` connected now): ``"cut"`` when the node has just become cut off,
        ``"redial"`` when it is cut off and due to re-dial, ``"back"`` when a peer is back after
        a cut-off, else None. "cut" asks for the first re-dial too."""
        if peers > 0:
            self.alone_since = None
            if self.cut_off_since is None:
                return None
            self.cut_off_since = None
            return "back"
        if self.alone_since is None:
            self.alone_since = now
        if self.cut_off_since is None:
            if now - self.alone_since < self.grace:
                return None
            self.cut_off_since = self.alone_since
            self.cut_offs += 1
            self._redialled(now)
            return "cut"
        if self.last_redial is not None and now - self.last_redial < self.redial_period:
            return None
        self._redialled(now)
        return "redial"

    def _redialled(self, now: float) -> None:
        self.last_redial = now
        self.redials += 1

    def text(self, when: str) -> str | None:
        """``cut off from the swarm since 22:41: no peer connected; re-dialling its entry points
        every 30 s`` (``when``: the cut-off time as the views write it), or None while in touch."""
        if self.cut_off_since is None:
            return None
        return (f"cut off from the swarm since {when}: no peer connected; "
                f"re-dialling its bootstrap peers and relays every {self.redial_period:g} s")

    def view(self, now: float) -> ContactView:
        """The snapshot's ``self_care.contact`` piece."""
        return ContactView(
            cut_off=self.cut_off_since is not None,
            cut_off_for_s=round(now - self.cut_off_since, 1) if self.cut_off_since is not None else None,
            cut_off_since=self.cut_off_since, redials=self.redials, cut_offs=self.cut_offs,
        )


__all__ = ["CUT_OFF_GRACE", "DEFAULT_FAILURE_LIMIT", "DEFAULT_MISSES", "FailureStreaks", "REDIAL_PERIOD",
           "SwarmContact", "VisibilityWatch"]
