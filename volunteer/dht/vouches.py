"""Vouches: a trainer's signed word for the work a host did for it, the credit a swarm's public
page ranks contributors by (BOINC grants credit for validated results, never for claims).

A trainer keeps, per host it called, how many replies it accepted (they came over a stream only
that host could answer on, the guard passed them, and where the swarm asks for receipts the
receipt matched) and how many samples they carried (``VouchBook.accept``, called by
``client._Call`` once a reply is taken). Now and then
it signs one ``Vouch`` per host whose tally moved: cumulative figures since the trainer started
(``epoch``, its start time), a sequence number that only grows, the time it signed, and the
swarm. It publishes each under ``CONTRIBUTIONS_KEY`` in the DHT, sub-key the host's PeerID bytes,
so a newer vouch for the same host replaces the older one.

A reader (the relay's health page) merges what it finds into a ``Ledger``: a vouch counts only
if its signature is the named trainer's, it names a host other than the trainer, and it is newer
(a higher ``seq``) than what the ledger holds for that trainer, host and epoch; the ledger adds
the difference, so a replayed or older vouch adds nothing and a restarted trainer's new epoch
adds on top of the old one. ``Ledger.contributors`` ranks hosts by vouched calls, with a recent
average that halves every ``HALF_LIFE`` (BOINC's RAC).

What a vouch proves: that the holder of the trainer's key says so. It does not prove the trainer
is honest or distinct from the host's owner: a sybil trainer can vouch for a sybil host, and its
vouches weigh exactly what that trainer says (the page counts trainers per host so a reader can
see whose word it is). Pure: no trio, no clock (``now`` is passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import msgpack

from ..errors import DHTRecordError
from ..net.identity import KeyPair, PeerID, names_a_peer, signed_by
from ..wire import unpack_bounded

CONTRIBUTIONS_KEY = b"volunteer-vouches"  # DHT key; sub-key: the host's PeerID bytes (after the trainer's)
SIGNED = b"volunteer/vouch/1\n"  # domain of the signature: no other signed message reads as a vouch
HALF_LIFE = 7 * 86400.0  # seconds in which the recent average halves (BOINC's RAC: one week)
MAX_VOUCH = 1024  # bytes of an encoded vouch
MAX_COUNT = 2**63 - 1
MAX_LEDGER = 100_000  # (trainer, host, epoch) entries a ledger keeps; beyond, new ones are dropped


@dataclass(frozen=True)
class Vouch:
    """A trainer's signed, cumulative word for one host (see the module docstring)."""

    swarm: str
    trainer: bytes  # the signer's PeerID bytes
    host: bytes  # the vouched-for host's PeerID bytes
    epoch: int  # the trainer's start (unix ms): its counts begin at 0 then
    seq: int  # grows with every vouch the trainer signs
    at: float  # when it was signed (the trainer's clock)
    calls: int  # replies accepted since ``epoch``
    samples: int  # rows those replies computed
    signature: bytes = b""

    def _fields(self) -> list:
        return [self.swarm, self.trainer, self.host, self.epoch, self.seq, float(self.at), self.calls, self.samples]

    def signed_part(self) -> bytes:
        """The bytes the signature covers."""
        return SIGNED + msgpack.packb(self._fields(), use_bin_type=True)

    def sign(self, keypair: KeyPair) -> "Vouch":
        return replace(self, signature=keypair.sign(self.signed_part()))

    def verify(self) -> bool:
        """Whether the signature is the named trainer's."""
        return signed_by(self.trainer, self.signed_part(), self.signature)

    def encode(self) -> bytes:
        return msgpack.packb([*self._fields(), self.signature], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> "Vouch":
        """Parse an untrusted vouch (signature unchecked: ``verify``); DHTRecordError (code ``bad-vouch``) if malformed."""
        item = unpack_bounded(data, MAX_VOUCH, "vouch", _refused, list)
        if len(item) != 9:
            raise _refused("a vouch is a list of 9 fields")
        swarm, trainer, host, epoch, seq, at, calls, samples, signature = item
        if not isinstance(swarm, str) or len(swarm) > 256:
            raise _refused("vouch's swarm is malformed")
        for value in (trainer, host, signature):
            if not isinstance(value, bytes) or not 0 < len(value) <= 128:
                raise _refused("vouch's trainer, host or signature is malformed")
        for value in (epoch, seq, calls, samples):
            if type(value) is not int or not 0 <= value <= MAX_COUNT:
                raise _refused("vouch's counts are malformed")
        if not isinstance(at, float) or not math.isfinite(at):
            raise _refused("vouch's time is malformed")
        return cls(swarm, trainer, host, epoch, seq, at, calls, samples, signature)


class VouchBook:
    """A trainer's tally of accepted replies per host, and the vouches it signs from it."""

    def __init__(self, keypair: KeyPair, swarm: str, started: float) -> None:
        self.keypair = keypair
        self.swarm = swarm
        self.epoch = int(started * 1000)
        self._seq = 0
        self._tally: dict[bytes, list[int]] = {}  # host -> [calls, samples]
        self._moved: set[bytes] = set()

    def accept(self, host: bytes, samples: int) -> None:
        """A reply of ``host`` passed every check: one call and its ``samples`` rows count."""
        if host == self.keypair.peer_id.to_bytes():
            return  # our own work vouches for nothing
        tally = self._tally.setdefault(bytes(host), [0, 0])
        tally[0] += 1
        tally[1] += max(0, int(samples))
        self._moved.add(bytes(host))

    def due(self, now: float, *, everyone: bool = False) -> list[Vouch]:
        """A signed vouch for every host whose tally moved since the last call (``everyone``: for
        every host tallied, to republish records before they expire)."""
        out = []
        trainer = self.keypair.peer_id.to_bytes()
        for host in sorted(self._tally if everyone else self._moved):
            self._seq += 1
            calls, samples = self._tally[host]
            out.append(Vouch(self.swarm, trainer, host, self.epoch, self._seq, float(now), calls, samples).sign(self.keypair))
        self._moved.clear()
        return out


@dataclass
class _Entry:
    seq: int
    calls: int
    samples: int


@dataclass
class Credit:
    """One host's vouched work: totals, trainers that vouched, and the decayed recent calls."""

    calls: int = 0
    samples: int = 0
    recent: float = 0.0  # calls, each weighed 2^-(age / HALF_LIFE)
    recent_at: float = 0.0
    trainers: set[bytes] | None = None


class Ledger:
    """What a reader has merged of a swarm's vouches (see the module docstring)."""

    def __init__(self, swarm: str, *, half_life: float = HALF_LIFE) -> None:
        self.swarm = swarm
        self.half_life = half_life
        self._entries: dict[tuple[bytes, bytes, int], _Entry] = {}
        self._credit: dict[bytes, Credit] = {}
        self.refused = 0  # vouches not counted: forged, for the trainer itself, another swarm's

    def merge(self, vouch: Vouch, now: float) -> bool:
        """Count ``vouch`` if it is valid and newer than what the ledger holds; whether it added."""
        if vouch.swarm != self.swarm or vouch.trainer == vouch.host or not names_a_peer(vouch.host) or not vouch.verify():
            self.refused += 1
            return False
        key = (vouch.trainer, vouch.host, vouch.epoch)
        held = self._entries.get(key)
        if held is not None and vouch.seq <= held.seq:
            return False  # a replay, or an older vouch than one already counted
        if held is None and len(self._entries) >= MAX_LEDGER:
            return False
        old = held or _Entry(0, 0, 0)
        calls, samples = max(0, vouch.calls - old.calls), max(0, vouch.samples - old.samples)
        self._entries[key] = _Entry(vouch.seq, max(old.calls, vouch.calls), max(old.samples, vouch.samples))
        credit = self._credit.setdefault(vouch.host, Credit(trainers=set()))
        credit.calls += calls
        credit.samples += samples
        credit.recent = self._decayed(credit, now) + calls
        credit.recent_at = now
        assert credit.trainers is not None
        credit.trainers.add(vouch.trainer)
        return calls > 0 or samples > 0

    def _decayed(self, credit: Credit, now: float) -> float:
        return credit.recent * 2.0 ** (-max(0.0, now - credit.recent_at) / self.half_life)

    def contributors(self, now: float) -> list[dict]:
        """Hosts with vouched calls, most first: ``peer`` (text), total ``calls`` and ``samples``,
        ``recent_per_day`` (the decayed recent calls as a daily rate, BOINC's RAC) and how many
        ``trainers`` vouched. A host nobody vouched a call for is not listed."""
        rate = math.log(2) / self.half_life * 86400
        ranked = sorted(((str(PeerID.from_bytes(host)), c) for host, c in self._credit.items() if c.calls > 0),
                        key=lambda item: (-item[1].calls, -item[1].samples, item[0]))
        return [{"peer": peer, "calls": c.calls, "samples": c.samples,
                 "recent_per_day": round(self._decayed(c, now) * rate, 4), "trainers": len(c.trainers or ())}
                for peer, c in ranked]


def _refused(message: str) -> DHTRecordError:
    """A malformed vouch is a refused DHT record, as a malformed profile is."""
    return DHTRecordError(message, "bad-vouch")


def vouch_item(vouch: Vouch, expiration: float) -> tuple[bytes, bytes, bytes, float]:
    """The DHT item of ``vouch`` (key, sub-key: the trainer's then the host's PeerID bytes, value,
    expiration): one record per trainer and host, a newer vouch replacing the older."""
    return CONTRIBUTIONS_KEY, vouch.trainer + vouch.host, vouch.encode(), float(expiration)


__all__ = ["CONTRIBUTIONS_KEY", "HALF_LIFE", "Credit", "Ledger", "Vouch", "VouchBook", "vouch_item"]
