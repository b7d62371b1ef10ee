"""Trainers as principals: who may train this swarm's experts, and what each trainer has done to
ours (pure bookkeeping: no torch, no trio, no clock reads; callers pass ``now``).

- ``TrainerPolicy``: what the swarm file says (``trainers = "open"``, a list of trainer peer IDs,
  or ``organiser = "<public key>"`` whose certificates admit trainers until they expire) and
  whether forwards are answered for everyone or for admitted trainers only.
- ``TrainerCertificate``: an organiser's signed statement "peer P may train swarm S until T"
  (``volunteer trainer-cert`` issues one; a trainer presents it on every expert call).
- ``TrainerBook``: per trainer, the backwards it got applied, clipped and refused; strikes for
  gradients past an expert's bound (``gradbound.py``); a trainer with ``max_strikes`` strikes
  within ``strike_window`` seconds, or one gross gradient, is refused backwards for
  ``refusal_period`` (doubled at each repeat, capped); each trainer's share of an expert's recent
  backwards, bounded while others train it too.
"""

from __future__ import annotations

import base64
import math
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Hashable, Iterable, TypedDict

import msgpack

from ..errors import VolunteerError
from ..net.identity import KeyPair, PeerID, PublicKey

CERT_PREFIX = "volunteer-trainer-cert:"
CERT_VERSION = 1
MAX_CERT_BYTES = 1024
CLOCK_SKEW = 300.0  # seconds of disagreement between an organiser's clock and ours we tolerate
MAX_CERT_DAYS = 3650

# refusal reasons, as counted and shown (with admission.py's)
NOT_ADMITTED = "trainer_not_admitted"
TRAINER_REFUSED = "trainer_refused"
TRAINER_SHARE = "trainer_share"
TRAINER_CLIPPED = "trainer_clipped_newcomer"


class TrainerCertificateError(VolunteerError, ValueError):
    """A trainer certificate is malformed, forged, expired or for another swarm or peer."""


@dataclass(frozen=True)
class TrainerCertificate:
    """``organiser`` says ``trainer`` may train swarm ``swarm_id`` until ``expires`` (Unix time)."""

    swarm_id: str
    trainer: PeerID
    expires: float
    organiser: PublicKey
    signature: bytes = b""

    def _signed_part(self) -> bytes:
        return msgpack.packb(
            {"v": CERT_VERSION, "s": self.swarm_id, "t": self.trainer.to_bytes(), "e": int(self.expires),
             "o": self.organiser.to_protobuf()},
            use_bin_type=True,
        )

    @classmethod
    def issue(cls, organiser: KeyPair, swarm_id: str, trainer: PeerID, expires: float) -> "TrainerCertificate":
        """A certificate signed with the organiser's key."""
        unsigned = cls(swarm_id, trainer, float(int(expires)), organiser.public_key)
        return cls(swarm_id, trainer, unsigned.expires, organiser.public_key, organiser.sign(unsigned._signed_part()))

    def encode(self) -> bytes:
        """Wire bytes (what a trainer sends in an expert call's header)."""
        return msgpack.packb({"p": self._signed_part(), "sig": self.signature}, use_bin_type=True)

    def to_text(self) -> str:
        """One line of text, for a file or a command line."""
        return CERT_PREFIX + base64.urlsafe_b64encode(self.encode()).decode()

    @classmethod
    def from_text(cls, text: str) -> "TrainerCertificate":
        """Parse ``to_text``'s output (TrainerCertificateError if it is not one)."""
        text = text.strip()
        if not text.startswith(CERT_PREFIX):
            raise TrainerCertificateError(f"not a trainer certificate (it starts with {CERT_PREFIX!r})")
        try:
            data = base64.urlsafe_b64decode(text[len(CERT_PREFIX):].encode())
        except ValueError:
            raise TrainerCertificateError("trainer certificate: bad base64") from None
        return cls.decode(data)

    @classmethod
    def decode(cls, data: bytes) -> "TrainerCertificate":
        """Parse untrusted wire bytes; the signature is checked by ``verify``, not here."""
        if not isinstance(data, bytes) or len(data) > MAX_CERT_BYTES:
            raise TrainerCertificateError(f"trainer certificate must be bytes of at most {MAX_CERT_BYTES}")
        try:
            outer = msgpack.unpackb(data, raw=False, max_bin_len=MAX_CERT_BYTES, max_str_len=MAX_CERT_BYTES)
            inner = msgpack.unpackb(outer["p"], raw=False, max_bin_len=MAX_CERT_BYTES, max_str_len=MAX_CERT_BYTES)
            if inner["v"] != CERT_VERSION:
                raise TrainerCertificateError(f"trainer certificate version {inner['v']!r} is not {CERT_VERSION}")
            expires = inner["e"]
            if type(expires) is not int or not isinstance(inner["s"], str) or not isinstance(outer["sig"], bytes):
                raise TrainerCertificateError("trainer certificate: a field has the wrong type")
            return cls(inner["s"], PeerID.from_bytes(inner["t"]), float(expires),
                       PublicKey.from_protobuf(inner["o"]), outer["sig"])
        except TrainerCertificateError:
            raise
        except (KeyError, TypeError, ValueError, VolunteerError, msgpack.UnpackException) as exc:
            raise TrainerCertificateError(f"malformed trainer certificate: {exc}") from None

    def verify(self, *, organiser: PublicKey, swarm_id: str, trainer: PeerID, now: float) -> None:
        """Raise TrainerCertificateError unless this certificate, signed by ``organiser``, admits
        ``trainer`` to ``swarm_id`` at wall-clock time ``now`` (``CLOCK_SKEW`` tolerated)."""
        if self.organiser != organiser:
            raise TrainerCertificateError("trainer certificate is signed by another organiser than the swarm file's")
        if not organiser.verify(self._signed_part(), self.signature):
            raise TrainerCertificateError("trainer certificate's signature does not verify")
        if self.swarm_id != swarm_id:
            raise TrainerCertificateError(f"trainer certificate is for swarm {self.swarm_id!r}, not {swarm_id!r}")
        if self.trainer != trainer:
            raise TrainerCertificateError("trainer certificate names another peer")
        if self.expires + CLOCK_SKEW < now:
            raise TrainerCertificateError("trainer certificate has expired")


def parse_public_key(text: str) -> PublicKey:
    """An organiser key as a swarm file writes it: the base64 of its libp2p protobuf form."""
    try:
        return PublicKey.from_protobuf(base64.b64decode(text.encode(), validate=True))
    except (ValueError, VolunteerError) as exc:
        raise TrainerCertificateError(f"organiser key {text[:40]!r} is not a base64 libp2p public key: {exc}") from None


def public_key_text(key: PublicKey) -> str:
    """``parse_public_key``'s input for ``key``."""
    return base64.b64encode(key.to_protobuf()).decode()


FORWARDS = ("everyone", "trainers")


@dataclass(frozen=True)
class TrainerPolicy:
    """Who may train (send backwards): everyone (``open``), the listed peers, or the holders of a
    certificate from ``organiser``; ``forwards``: answered for ``everyone`` or only for admitted
    ``trainers``. hivemind's trainers present no certificate: a hivemind swarm is always open."""

    open: bool = True
    listed: frozenset[PeerID] = frozenset()
    organiser: PublicKey | None = None
    forwards: str = "everyone"

    @classmethod
    def from_settings(cls, trainers: object = "open", organiser: str | None = None, forwards: str = "everyone") -> "TrainerPolicy":
        """The policy a swarm file's ``trainers``, ``organiser`` and ``forwards`` keys say."""
        if forwards not in FORWARDS:
            raise TrainerCertificateError(f"forwards must be one of {', '.join(FORWARDS)}, got {forwards!r}")
        key = parse_public_key(organiser) if organiser else None
        if trainers == "open" or trainers is None:
            if key is not None:  # an organiser with no list: its certificates are the admission
                return cls(False, frozenset(), key, forwards)
            return cls(True, frozenset(), None, forwards)
        if not isinstance(trainers, list) or not all(isinstance(t, str) for t in trainers):
            raise TrainerCertificateError('trainers must be "open" or a list of trainer peer IDs')
        try:
            listed = frozenset(PeerID.from_string(t) for t in trainers)
        except VolunteerError as exc:
            raise TrainerCertificateError(f"trainers: {exc}") from None
        return cls(False, listed, key, forwards)

    def describe(self) -> str:
        """One line for the first-start summary and ``volunteer status``."""
        if self.open:
            return "open: anyone may train"
        parts = []
        if self.listed:
            parts.append(f"{len(self.listed)} listed trainer(s)")
        if self.organiser is not None:
            parts.append("holders of the organiser's certificates")
        return " or ".join(parts) + ("" if self.forwards == "everyone" else "; forwards for trainers only")


OPEN = TrainerPolicy()


class TrainerAdmission:
    """Whether a peer is an admitted trainer under a ``TrainerPolicy``; a verified certificate is
    remembered until it expires (bounded LRU), so a call costs one signature check per trainer."""

    def __init__(self, policy: TrainerPolicy, swarm_id: str, *, capacity: int = 4096) -> None:
        self.policy = policy
        self.swarm_id = swarm_id
        self.capacity = capacity
        self._verified: OrderedDict[tuple[PeerID, bytes], float] = OrderedDict()

    def refusal(self, peer: PeerID, credential: bytes | None, *, wall: float) -> str | None:
        """None if ``peer`` may train (``wall``: our wall clock), else why not (one line)."""
        policy = self.policy
        if policy.open or peer in policy.listed:
            return None
        if policy.organiser is None:
            return "this swarm's trainers are listed in its swarm file, and you are not among them"
        if not credential:
            return "this swarm admits trainers by the organiser's certificate: present one (volunteer trainer-cert)"
        key = (peer, credential)
        expires = self._verified.get(key)
        if expires is not None and expires + CLOCK_SKEW >= wall:
            self._verified.move_to_end(key)
            return None
        try:
            cert = TrainerCertificate.decode(credential)
            cert.verify(organiser=policy.organiser, swarm_id=self.swarm_id, trainer=peer, now=wall)
        except TrainerCertificateError as exc:
            self._verified.pop(key, None)
            return str(exc)
        self._verified[key] = min(cert.expires, wall + MAX_CERT_DAYS * 86400.0)
        while len(self._verified) > self.capacity:
            self._verified.popitem(last=False)
        return None

    def may_forward(self, peer: PeerID, credential: bytes | None, *, wall: float) -> str | None:
        """None if ``peer`` may call forward, else why not."""
        if self.policy.forwards == "everyone":
            return None
        return self.refusal(peer, credential, wall=wall)


class TrainerCounts(TypedDict):
    """One trainer's counts in ``volunteer status`` (``TrainerRecord.as_dict``)."""

    applied: int
    clipped: int
    refused: int
    causes: int
    refused_for: float  # seconds of refusal left
    refusals: dict[str, int]  # refused backwards by reason


@dataclass
class TrainerRecord:
    """What one trainer did to this volunteer's experts."""

    applied: int = 0  # backwards applied (clipped ones included)
    clipped: int = 0  # backwards whose gradient was clipped to the expert's bound
    refused: int = 0  # backwards refused (not admitted, refused for cause, share)
    causes: int = 0  # times it was refused for cause (its gradients)
    refused_until: float = -math.inf
    strikes: dict[str, deque] = field(default_factory=dict)  # uid → times of recent strikes
    reasons: Counter = field(default_factory=Counter)

    def as_dict(self, now: float) -> TrainerCounts:
        return {
            "applied": self.applied, "clipped": self.clipped, "refused": self.refused, "causes": self.causes,
            "refused_for": max(0.0, self.refused_until - now), "refusals": dict(self.reasons),
        }


class TrainerBook:
    """Per-trainer counts, strikes and refusals, and each expert's recent trainers (module
    docstring). Bounded: ``capacity`` trainers (least recent dropped, unless refused now)."""

    def __init__(
        self,
        *,
        max_strikes: int = 3,
        strike_window: float = 120.0,
        refusal_period: float = 600.0,
        max_refusal: float = 86400.0,
        share_window: int = 64,
        capacity: int = 4096,
    ) -> None:
        self.max_strikes = max_strikes
        self.strike_window = strike_window
        self.refusal_period = refusal_period
        self.max_refusal = max_refusal
        self.share_window = share_window
        self.capacity = capacity
        self._trainers: OrderedDict[Hashable, TrainerRecord] = OrderedDict()
        self._recent: dict[str, deque] = {}  # uid → trainers of its last share_window backwards
        # uid → how many of those each trainer sent, kept as they come and go: counting the window
        # afresh on every backward hashed its 256 peer IDs, a hundred Python calls a call
        self._recent_counts: dict[str, Counter] = {}

    def _record(self, trainer: Hashable) -> TrainerRecord:
        record = self._trainers.get(trainer)
        if record is None:
            record = self._trainers[trainer] = TrainerRecord()
            if len(self._trainers) > self.capacity:
                # the least recent goes, unless ever refused: fresh identities must not flush a refusal
                for key, old in self._trainers.items():
                    if old.causes == 0:
                        del self._trainers[key]
                        break
                else:
                    self._trainers.popitem(last=False)
        else:
            self._trainers.move_to_end(trainer)
        return record

    def refused_until(self, trainer: Hashable, now: float) -> float | None:
        """When ``trainer``'s refusal ends, or None if it is not refused now."""
        record = self._trainers.get(trainer)
        if record is None or record.refused_until <= now:
            return None
        return record.refused_until

    def applied_count(self, trainer: Hashable) -> int:
        """Backwards of ``trainer`` applied here so far (0 for one never seen)."""
        record = self._trainers.get(trainer)
        return 0 if record is None else record.applied

    def share_exceeded(self, uid: str, trainer: Hashable, now: float) -> bool:
        """Whether ``trainer`` sent more than its share of ``uid``'s recent backwards while others
        train it too (alone, a trainer has no one to outweigh). Only trainers in good standing
        with an eighth of the window or more count as others (a few backwards of a passer-by, or
        of a refused attacker, must not cap the trainer doing the work). The share allowed is
        ``max(1/2, 3/(2n))`` with ``n`` such trainers: with two, one may send three quarters;
        with three or more, half at most."""
        recent = self._recent.get(uid)
        if not recent or len(recent) < self.share_window // 2:
            return False
        counts = self._recent_counts[uid]
        active = [t for t, n in counts.items() if 8 * n >= len(recent) and self.refused_until(t, now) is None]
        if len(active) < 2 or trainer not in active:
            return False
        share = max(0.5, 1.5 / len(active))
        return counts[trainer] > share * len(recent)

    def refuse(self, trainer: Hashable, reason: str) -> None:
        """Count a backward refused (not admitted, refused now, share)."""
        record = self._record(trainer)
        record.refused += 1
        record.reasons[reason] += 1

    def applied(self, uid: str, trainer: Hashable, *, clipped: bool) -> None:
        """Count a backward whose step the expert takes (``clipped``: at the bound)."""
        record = self._record(trainer)
        record.applied += 1
        record.clipped += clipped
        recent = self._recent.get(uid)
        if recent is None:
            recent = self._recent[uid] = deque(maxlen=self.share_window)
            self._recent_counts[uid] = Counter()
        counts = self._recent_counts[uid]
        if len(recent) == recent.maxlen:  # the oldest leaves the window as this one enters
            oldest = recent[0]
            counts[oldest] -= 1
            if not counts[oldest]:
                del counts[oldest]
        recent.append(trainer)
        counts[trainer] += 1

    def strike(self, uid: str, trainer: Hashable, now: float) -> bool:
        """A gradient of ``trainer`` hit ``uid``'s bound at ``now``; True if that makes
        ``max_strikes`` within ``strike_window``: refused for cause (``cause`` is applied)."""
        record = self._record(trainer)
        times = record.strikes.setdefault(uid, deque())
        times.append(now)
        while times and times[0] < now - self.strike_window:
            times.popleft()
        if sum(len(t) for t in record.strikes.values()) >= self.max_strikes:
            self.cause(trainer, now)
            return True
        return False

    def cause(self, trainer: Hashable, now: float) -> None:
        """Refuse ``trainer``'s backwards from ``now`` for a period that doubles with each cause."""
        record = self._record(trainer)
        period = min(self.max_refusal, self.refusal_period * 2 ** min(record.causes, 16))
        record.causes += 1
        record.refused_until = now + period

    def struck(self, trainer: Hashable, now: float) -> list[str]:
        """Experts on which ``trainer`` has strikes within ``strike_window`` of ``now``."""
        record = self._trainers.get(trainer)
        if record is None:
            return []
        return [uid for uid, times in record.strikes.items() if times and times[-1] >= now - self.strike_window]

    def clear_strikes(self, trainer: Hashable) -> None:
        """Forget ``trainer``'s strikes (its experts were rolled back)."""
        record = self._trainers.get(trainer)
        if record is not None:
            record.strikes.clear()

    def open_strikes(self, uid: str, now: float) -> bool:
        """Whether any trainer has a strike on ``uid`` within ``strike_window`` of ``now``."""
        horizon = now - self.strike_window
        return any(
            (times := record.strikes.get(uid)) and times[-1] >= horizon for record in self._trainers.values()
        )

    def forget_expert(self, uid: str) -> None:
        """Drop what was kept of ``uid`` (no longer served)."""
        self._recent.pop(uid, None)
        self._recent_counts.pop(uid, None)
        for record in self._trainers.values():
            record.strikes.pop(uid, None)

    def snapshot(self, now: float, names: Iterable[Hashable] | None = None) -> dict[str, TrainerCounts]:
        """Per trainer (``str`` of its key): applied, clipped, refused, causes, seconds of refusal left."""
        keys = self._trainers if names is None else [n for n in names if n in self._trainers]
        return {str(key): self._trainers[key].as_dict(now) for key in keys}


__all__ = [
    "FORWARDS",
    "TrainerCounts",
    "NOT_ADMITTED",
    "OPEN",
    "TRAINER_CLIPPED",
    "TRAINER_REFUSED",
    "TRAINER_SHARE",
    "TrainerAdmission",
    "TrainerBook",
    "TrainerCertificate",
    "TrainerCertificateError",
    "TrainerPolicy",
    "TrainerRecord",
    "parse_public_key",
    "public_key_text",
]
