"""Repair datagrams under QUIC: forward error correction that rebuilds a lost datagram at the
receiver instead of waiting a round trip for QUIC to notice and send it again. Pure: no sockets,
no clock (``now`` is passed in).

On a long path with random loss (a home line 150 ms away that drops one packet in two hundred)
most steps lose a packet somewhere, and each loss costs a round trip or more however good the
retransmission is. The sender groups the QUIC datagrams it sends into blocks of up to
``BLOCK_SIZE`` and adds two repair datagrams per block, RAID-6 style over GF(2^8): ``P``, the
XOR of the members, and ``Q``, the sum of the members each times ``g^i``. Any two lost members of
a block come back from the survivors and the two repairs.

A repair names its members by the last four bytes of each (the AEAD tag of their last QUIC
packet, effectively random). The receiver keeps its recent datagrams by that tag; a rebuilt
datagram goes to QUIC like one that arrived, and QUIC authenticates it, so a wrong tag match or
a forged repair yields a datagram QUIC drops, never data.

A repair datagram starts with ``MARKER``: the long-header and fixed bits clear, which RFC 9000
peers drop as not QUIC (so a go-libp2p or py-libp2p peer ignores our ``HELLO``, and we never
send it repairs). Then the kind, the receiver's connection ID (so its endpoint routes it like a
QUIC packet), and for a repair: block number, which repair, member count, tags, coded bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MARKER = 0x1D
KIND_HELLO = 0
KIND_REPAIR = 1
KIND_REBUILT = 2  # the receiver's count of datagrams it rebuilt: the sender's sign that the path still loses
BLOCK_SIZE = 16  # members per block: two repairs each, 12.5 % more datagrams on a full block
REPAIRS_PER_BLOCK = 2  # P and Q
BLOCK_WAIT = 0.005  # seconds an open block waits for more members, at least (an eighth of the round trip if longer)
MAX_BLOCK_WAIT = 0.04  # ... at most
MIN_MEMBER = 200  # smaller datagrams (ACKs, flow control) are not protected: a later one makes up for a lost one
TAG = 4  # bytes of each member that name it in a repair
LENGTH = 2  # the member's length, coded with it (members differ in size)
MAX_CID = 20
HEADER = 3 + MAX_CID + 4  # marker, kind, CID length, CID, block (2), index, count
OVERHEAD = HEADER + BLOCK_SIZE * TAG + LENGTH  # how much larger than its largest member a repair is
REMEMBERED = 4 * BLOCK_SIZE  # received datagrams kept for rebuilding, per connection
PENDING_BLOCKS = 8  # blocks whose first repair came and that still miss two members


# --- GF(2^8), polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), generator 2 ---------------------------
def _tables() -> tuple[list[int], list[int]]:
    exp, log = [0] * 512, [0] * 256
    value = 1
    for power in range(255):
        exp[power] = value
        log[value] = power
        value <<= 1
        if value & 0x100:
            value ^= 0x11D
    for power in range(255, 512):
        exp[power] = exp[power - 255]
    return exp, log


EXP, LOG = _tables()


def _multiply(a: int, b: int) -> int:
    return 0 if a == 0 or b == 0 else EXP[LOG[a] + LOG[b]]


def _inverse(a: int) -> int:
    return EXP[255 - LOG[a]]


# bytes.translate does a whole datagram times a constant in C, one table per constant
_TIMES = [bytes(_multiply(c, x) for x in range(256)) for c in range(256)]


def _as_int(data: bytes) -> int:
    # little-endian: a shorter member is the same number as itself padded with zeros at the end
    return int.from_bytes(data, "little")


def _as_bytes(value: int, length: int) -> bytes:
    return value.to_bytes(length, "little")


def _times(value: int, length: int, constant: int) -> int:
    return _as_int(_as_bytes(value, length).translate(_TIMES[constant]))


def _coded(datagram: bytes) -> bytes:
    return len(datagram).to_bytes(LENGTH, "big") + datagram


def _decoded(coded: bytes) -> bytes | None:
    length = int.from_bytes(coded[:LENGTH], "big")
    if length == 0 or LENGTH + length > len(coded):
        return None
    return coded[LENGTH : LENGTH + length]


def tag_of(datagram: bytes) -> bytes:
    return bytes(datagram[-TAG:])


def protectable(datagram: bytes, largest: int) -> bool:
    """Whether ``datagram`` goes into a block: a QUIC short-header packet (the handshake's long
    ones are few and QUIC handles them) of ``MIN_MEMBER`` to ``largest`` bytes."""
    return MIN_MEMBER <= len(datagram) <= largest and not datagram[0] & 0x80


def _head(kind: int, peer_cid: bytes) -> bytes:
    """What every datagram of ours here starts with: marker, kind, the peer's connection ID."""
    return bytes([MARKER, kind, len(peer_cid)]) + peer_cid


def hello(peer_cid: bytes) -> bytes:
    """The datagram that tells a peer we understand repairs (sent when the handshake is done)."""
    return _head(KIND_HELLO, peer_cid)


def rebuilt_report(peer_cid: bytes, count: int) -> bytes:
    """Tells the sender how many of its datagrams we rebuilt so far (a lost report is made up for
    by the next: the count is cumulative). Repaired losses never reach its loss detection, so
    without this a path whose every loss is repaired would look clean and lose its repairs."""
    return _head(KIND_REBUILT, peer_cid) + (count % 2**32).to_bytes(4, "big")


def parse_rebuilt(datagram: bytes) -> int | None:
    """The count in a rebuilt report, or None when ``datagram`` is something else."""
    cid = connection_id(datagram)
    if cid is None or datagram[1] != KIND_REBUILT or len(datagram) < 3 + len(cid) + 4:
        return None
    at = 3 + len(cid)
    return int.from_bytes(datagram[at : at + 4], "big")


def is_repair_datagram(datagram: bytes) -> bool:
    return len(datagram) >= 3 and datagram[0] == MARKER


def connection_id(datagram: bytes) -> bytes | None:
    """The receiver's connection ID a repair or hello datagram is addressed to (None if malformed)."""
    if not is_repair_datagram(datagram):
        return None
    length = datagram[2]
    if length > MAX_CID or len(datagram) < 3 + length:
        return None
    return bytes(datagram[3 : 3 + length])


@dataclass
class _OpenBlock:
    number: int
    opened_at: float
    tags: list[bytes] = field(default_factory=list)
    p: int = 0
    q: int = 0
    length: int = 0


class RepairEncoder:
    """Builds the repairs of what one connection sends. ``add`` each datagram as it leaves and send
    what it returns; at ``deadline`` send what ``due`` returns (a block that did not fill)."""

    def __init__(self, block_size: int = BLOCK_SIZE, wait: float = BLOCK_WAIT) -> None:
        if not 1 <= block_size <= min(BLOCK_SIZE, 255):
            raise ValueError(f"block_size must be within [1, {BLOCK_SIZE}]")
        self.block_size = block_size
        self.wait = wait
        self._next_block = 0
        self._open: _OpenBlock | None = None
        self.blocks = 0
        self.members = 0  # datagrams protected
        self.repairs_sent = 0

    @property
    def deadline(self) -> float | None:
        return None if self._open is None else self._open.opened_at + self.wait

    def add(self, datagram: bytes, peer_cid: bytes, now: float) -> list[bytes]:
        """Put ``datagram`` (a protectable one) in the open block; its repairs when it is full."""
        block = self._open
        if block is None:
            block = self._open = _OpenBlock(self._next_block, now)
            self._next_block = (self._next_block + 1) % 65536
        index = len(block.tags)
        self.members += 1
        coded = _coded(datagram)
        value = _as_int(coded)
        block.tags.append(tag_of(datagram))
        block.length = max(block.length, len(coded))
        block.p ^= value
        block.q ^= _as_int(coded.translate(_TIMES[EXP[index]]))
        if len(block.tags) >= self.block_size:
            return self._close(peer_cid)
        return []

    def due(self, peer_cid: bytes, now: float, *, burst_over: bool = False) -> list[bytes]:
        """The repairs of the open block if it has waited long enough, or at once when
        ``burst_over`` (nothing more to send for now: its last member went out)."""
        deadline = self.deadline
        if deadline is None or (now < deadline and not burst_over):
            return []
        return self._close(peer_cid)

    def wait_for(self, round_trip: float | None) -> None:
        """Let a block wait an eighth of the path's round trip (within bounds): a paced burst
        fills the block (paced at 600 KB/s, a sixteenth of 300 ms gathers about eight
        datagrams, so two repairs for every eight), and its repairs still come before the
        sender gives a member up for lost (engine.py: 5/4 of a round trip with repairs on, ACK
        delay included)."""
        if round_trip is not None:
            self.wait = min(MAX_BLOCK_WAIT, max(BLOCK_WAIT, round_trip / 8))

    def _close(self, peer_cid: bytes) -> list[bytes]:
        block, self._open = self._open, None
        if block is None:
            return []
        self.blocks += 1
        head = _head(KIND_REPAIR, peer_cid) + block.number.to_bytes(2, "big")
        tags = b"".join(block.tags)
        count = len(block.tags)
        out = [head + bytes([index, count]) + tags + _as_bytes(value, block.length)
               for index, value in enumerate((block.p, block.q)[:REPAIRS_PER_BLOCK])]
        self.repairs_sent += len(out)
        return out


@dataclass(frozen=True)
class Repair:
    """One parsed repair datagram."""

    block: int
    index: int  # 0: P, 1: Q
    tags: tuple[bytes, ...]
    coded: bytes


def parse_repair(datagram: bytes) -> Repair | None:
    """The repair in ``datagram``, or None when it is a hello or malformed."""
    cid = connection_id(datagram)
    if cid is None or datagram[1] != KIND_REPAIR:
        return None
    at = 3 + len(cid)
    if len(datagram) < at + 4:
        return None
    block = int.from_bytes(datagram[at : at + 2], "big")
    index, count = datagram[at + 2], datagram[at + 3]
    at += 4
    if index >= REPAIRS_PER_BLOCK or not 1 <= count <= 255 or len(datagram) < at + count * TAG + LENGTH + 1:
        return None
    tags = tuple(bytes(datagram[at + i * TAG : at + (i + 1) * TAG]) for i in range(count))
    return Repair(block, index, tags, bytes(datagram[at + count * TAG :]))


class RepairDecoder:
    """Rebuilds lost datagrams of one connection: ``received`` each datagram that arrives,
    ``repair`` each repair datagram; it returns the datagrams it rebuilt (to hand to QUIC)."""

    def __init__(self, remembered: int = REMEMBERED, pending_blocks: int = PENDING_BLOCKS) -> None:
        self.remembered = remembered
        self.pending_blocks = pending_blocks
        self._recent: dict[bytes, bytes] = {}
        self._pending: dict[int, dict[int, Repair]] = {}  # block -> repair index -> repair
        self._done: dict[int, None] = {}  # blocks already whole (ordered: oldest first)
        self.rebuilt = 0
        self.unrepairable = 0

    def received(self, datagram: bytes) -> None:
        if len(datagram) <= TAG:
            return
        tag = tag_of(datagram)
        self._recent.pop(tag, None)
        self._recent[tag] = datagram
        while len(self._recent) > self.remembered:
            del self._recent[next(iter(self._recent))]

    def repair(self, datagram: bytes) -> list[bytes]:
        found = parse_repair(datagram)
        if found is None or found.block in self._done:
            return []
        repairs = self._pending.setdefault(found.block, {})
        repairs[found.index] = found
        while len(self._pending) > self.pending_blocks:
            oldest = next(iter(self._pending))
            if len(self._pending[oldest]) < REPAIRS_PER_BLOCK:
                self.unrepairable += 1
            del self._pending[oldest]
        missing = [i for i, tag in enumerate(found.tags) if tag not in self._recent]
        if not missing:
            self._finish(found.block)
            return []
        if len(missing) > REPAIRS_PER_BLOCK:
            self.unrepairable += 1
            self._finish(found.block)
            return []
        if len(missing) > len(repairs):
            return []  # two lost: wait for the other repair
        rebuilt = self._solve(found.tags, missing, repairs)
        self._finish(found.block)
        out = [d for d in (_decoded(c) for c in rebuilt) if d is not None]
        self.rebuilt += len(out)
        for d in out:
            self.received(d)
        return out

    def _finish(self, block: int) -> None:
        self._pending.pop(block, None)
        self._done[block] = None
        while len(self._done) > 4 * self.pending_blocks:
            del self._done[next(iter(self._done))]

    def _solve(self, tags: tuple[bytes, ...], missing: list[int], repairs: dict[int, Repair]) -> list[bytes]:
        length = max(len(r.coded) for r in repairs.values())
        p = q = 0
        for index, tag in enumerate(tags):
            if index in missing:
                continue
            coded = _coded(self._recent[tag])
            if len(coded) > length:
                return []  # the tag named some other datagram: not this block's member
            p ^= _as_int(coded)
            q ^= _as_int(coded.translate(_TIMES[EXP[index]]))
        if 0 in repairs:
            p ^= _as_int(repairs[0].coded)
        if 1 in repairs:
            q ^= _as_int(repairs[1].coded)
        if len(missing) == 1:
            (x,) = missing
            value = p if 0 in repairs else _times(q, length, _inverse(EXP[x]))
            return [_as_bytes(value, length)]
        x, y = missing
        gx, gy = EXP[x], EXP[y]
        # p = Dx + Dy, q = gx*Dx + gy*Dy  =>  Dx = (q + gy*p) / (gx + gy)
        dx = _times(q ^ _times(p, length, gy), length, _inverse(gx ^ gy))
        return [_as_bytes(dx, length), _as_bytes(p ^ dx, length)]


__all__ = [
    "BLOCK_SIZE",
    "OVERHEAD",
    "RepairDecoder",
    "RepairEncoder",
    "connection_id",
    "hello",
    "is_repair_datagram",
    "parse_repair",
    "protectable",
]
