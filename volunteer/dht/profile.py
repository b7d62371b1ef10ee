"""A volunteer's public profile in the DHT: one record per volunteer under one well-known key, so
a swarm health page lists the volunteers that are up (and the names of those who chose one) with
a single lookup instead of walking every grid.

Key ``PROFILES_KEY``, sub-key = the volunteer's PeerID bytes, value a msgpack map::

    {"n": public name (only when the donor chose one: ``volunteer join --name``),
     "c": expert calls served since start, "s": samples computed since start,
     "b": bytes of expert replies sent since start, "x": experts declared,
     "r": 1 when every address the volunteer shares goes through a relay,
     "ps"/"pd": peer sessions counted and those that ended direct, "bd"/"br": bytes that went
     over direct and relayed connections (``volunteer.net.nat.share``: only when the volunteer
     runs a NAT manager; a page pools them into the swarm's direct shares)}

Counters are since the daemon started (a restart begins again at 0), which is what a swarm page
compares: who serves now. The record is written with each expert heartbeat and expires with the
volunteer's declarations. It carries no addresses: a health page must not publish where private
nodes live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack

from ..errors import DHTRecordError
from ..wire import unpack_bounded

PROFILES_KEY = b"volunteer-profiles"
MAX_NAME_LENGTH = 40  # characters of a public name
MAX_COUNTER = 2**63 - 1


def _is_name(value: object) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= MAX_NAME_LENGTH and value.isprintable() and value == value.strip()


def check_public_name(name: str) -> str:
    """``name`` stripped, or ValueError saying what a public name may be (1–40 printable
    characters: pages escape it, so any printable text shows as typed)."""
    name = name.strip()
    if not _is_name(name):
        raise ValueError(f"a public name is 1 to {MAX_NAME_LENGTH} printable characters, got {name!r}")
    return name


def _refused(message: str) -> DHTRecordError:
    return DHTRecordError(message, "bad-profile")


def _counter(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNTER


@dataclass(frozen=True)
class Profile:
    """What a volunteer says about itself on the swarm's public pages."""

    name: str | None = None
    calls: int = 0
    samples: int = 0
    bytes_sent: int = 0
    experts: int = 0
    relayed: bool = False
    # ``DirectShare.view``'s counts: how much of this volunteer's peer traffic went direct
    peer_sessions: int = 0
    peer_sessions_direct: int = 0
    bytes_direct: int = 0
    bytes_relayed: int = 0

    def encode(self) -> bytes:
        """The msgpack value stored under ``PROFILES_KEY``."""
        msg: dict = {"c": int(self.calls), "s": int(self.samples), "b": int(self.bytes_sent), "x": int(self.experts)}
        if self.name:
            msg["n"] = self.name
        if self.relayed:
            msg["r"] = 1
        for key, value in (("ps", self.peer_sessions), ("pd", self.peer_sessions_direct),
                           ("bd", self.bytes_direct), ("br", self.bytes_relayed)):
            if value:
                msg[key] = int(value)
        return msgpack.packb(msg, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes, max_size: int = 1024) -> "Profile":
        """Parse a value; raises DHTRecordError (code ``bad-profile``) for anything malformed."""
        msg = unpack_bounded(data, max_size, "profile", _refused, dict)
        name = msg.get("n")
        counters = [msg.get(k, 0) for k in ("c", "s", "b", "x", "ps", "pd", "bd", "br")]
        relayed = msg.get("r", 0)
        ok = (
            (name is None or _is_name(name))
            and all(_counter(v) for v in counters)
            and relayed in (0, 1)
            and not isinstance(relayed, bool)
        )
        if not ok:
            raise DHTRecordError("profile has missing or mistyped fields", "bad-profile")
        calls, samples, sent, experts, sessions, direct, bytes_direct, bytes_relayed = counters
        if direct > sessions:
            raise DHTRecordError("profile has more direct sessions than sessions", "bad-profile")
        return cls(name, calls, samples, sent, experts, bool(relayed), sessions, direct, bytes_direct, bytes_relayed)


def profile_item(peer_bytes: bytes, profile: Profile, expiration: float) -> tuple[bytes, bytes, bytes, float]:
    """The ``(key, sub-key, value, expiration)`` a volunteer stores for its profile."""
    if not math.isfinite(expiration):
        raise DHTRecordError("expiration is not a finite number", "invalid")
    return (PROFILES_KEY, peer_bytes, profile.encode(), float(expiration))


__all__ = ["MAX_NAME_LENGTH", "PROFILES_KEY", "Profile", "check_public_name", "profile_item"]
