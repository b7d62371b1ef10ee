"""Whether the relays this donor holds reservations on still answer.

A reservation is only as good as its relay: one that died (or hangs) keeps looking "reserved" in
the NAT manager's view until the reservation would be refreshed, so ``volunteer status``, the
dashboard and the web page showed a frozen round trip and a green state while nobody could reach
the donor through it. ``RelayWatch`` is the pure core (pings answered or missed, fed with ``now``);
``watch_relays`` is the thin driver the daemon runs: every ``period`` seconds it pings each reserved
relay over the connection the reservation lives on (the muxer's ping, bounded by ``timeout``), and
says so in the log (a warning) when one stops answering, and again (a notice) when it is back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..errors import VolunteerError
from ..widgets import short

log = logging.getLogger(__name__)

RELAY_CHECK_PERIOD = 10.0  # seconds between pings of each reserved relay
RELAY_PING_TIMEOUT = 5.0  # a ping that takes longer is a miss
MISSES_ALLOWED = 2  # misses in a row before a relay counts as not answering


@dataclass
class _Relay:
    last_answer: float | None = None
    silent_since: float | None = None  # the first miss of the current run of misses
    misses: int = 0
    rtt_ms: float | None = None


class RelayWatch:
    """Pings of the reserved relays, answered or missed; pure (every input takes ``now``)."""

    def __init__(self, misses_allowed: int = MISSES_ALLOWED) -> None:
        self.misses_allowed = misses_allowed
        self._relays: dict[str, _Relay] = {}

    def answered(self, peer: str, now: float, rtt_s: float) -> bool:
        """``peer`` answered a ping in ``rtt_s``; True when it had been counted as not answering."""
        relay = self._relays.setdefault(peer, _Relay())
        was_silent = self.silent(peer)
        relay.last_answer, relay.silent_since, relay.misses = now, None, 0
        relay.rtt_ms = round(rtt_s * 1000, 2)
        return was_silent

    def missed(self, peer: str, now: float) -> bool:
        """``peer`` did not answer (no connection, a broken one, or no reply in time); True when
        this miss makes it count as not answering."""
        relay = self._relays.setdefault(peer, _Relay())
        if relay.silent_since is None:
            relay.silent_since = now
        relay.misses += 1
        return relay.misses == self.misses_allowed

    def silent(self, peer: str) -> bool:
        """Whether ``peer`` has missed ``misses_allowed`` pings in a row."""
        relay = self._relays.get(peer)
        return relay is not None and relay.misses >= self.misses_allowed

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of relays no longer reserved on."""
        for peer in set(self._relays) - keep:
            del self._relays[peer]

    def view(self, peer: str, now: float) -> dict:
        """What the status views add to a reserved relay's row: ``answering`` (None: not checked
        yet), ``silent_s`` (since its first unanswered ping) and the last ping's ``rtt_ms``."""
        relay = self._relays.get(peer)
        if relay is None:
            return {"answering": None}
        out: dict = {"answering": not self.silent(peer)}
        if relay.silent_since is not None:
            out["silent_s"] = round(max(0.0, now - relay.silent_since), 1)
        if relay.rtt_ms is not None and not self.silent(peer):
            out["rtt_ms"] = relay.rtt_ms  # fresh, not the one measured when the reservation was made
        elif self.silent(peer):
            out["rtt_ms"] = None  # a round trip nobody answers has no figure
        return out


def silent_text(relays: list[dict]) -> str | None:
    """One line for a state text when a reserved relay stopped answering, else None."""
    silent = [r for r in relays if r.get("reserved") and r.get("answering") is False]
    if not silent:
        return None
    parts = [f"relay {short(r.get('peer_id', ''))} not answering for {r.get('silent_s', 0):.0f} s" for r in silent]
    alive = any(r.get("reserved") and r.get("answering") is not False for r in relays)
    tail = "" if alive else " (nobody can reach this node through a relay)"
    return "; ".join(parts) + tail


async def watch_relays(reserved: Callable[[], list[str]], connection_to: Callable[[str], object | None],
                       watch: RelayWatch, *, period: float = RELAY_CHECK_PERIOD,
                       timeout: float = RELAY_PING_TIMEOUT) -> None:
    """Every ``period`` seconds, ping each relay ``reserved()`` names (peer IDs) over
    ``connection_to(peer)`` (an open direct connection, or None) until cancelled."""
    while True:
        await trio.sleep(period)
        peers = reserved()
        watch.forget(set(peers))
        for peer in peers:
            rtt = await _ping(connection_to(peer), timeout)
            now = trio.current_time()
            shown = short(peer)
            if rtt is None:
                if watch.missed(peer, now):
                    log.warning("relay %s stopped answering: its reservation no longer makes this node reachable "
                                "(status shows it; the swarm's other relays are tried as usual)", shown)
            elif watch.answered(peer, now, rtt):
                log.info("relay %s answers again", shown)


async def _ping(conn, timeout: float) -> float | None:
    if conn is None:
        return None
    with trio.move_on_after(timeout):
        try:
            return await conn.muxer.ping()
        except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return None
    return None


__all__ = ["RELAY_CHECK_PERIOD", "RELAY_PING_TIMEOUT", "RelayWatch", "silent_text", "watch_relays"]
