"""Shared verdicts, the experts' half: the evidence a proof carries, how a peer checks it by
recompute, and the watcher that publishes our proofs and checks everyone else's.

**Evidence** (``Evidence``): what a third party needs to see the lie itself, and nothing it must
believe: the accused's signed receipt (``receipts.py``), the inputs the auditor sent (and the
output gradients, for a backward) raw, the encoding they travelled in, and the reply as it
travelled (tensors header and payload bytes, which the receipt's ``outputs`` digest names), and
the accused's signed ``StateBinding`` of the receipt's state id to the digest of the state the
auditor recomputed from (which it checked before publishing; absent from older evidence). It
rides in a ``dht.verdicts.Accusation`` when it fits one record (``MAX_EVIDENCE``, about 7 KiB:
some 1,700 float32 values), and otherwise in pieces under content-addressed keys that the signed
accusation names by digest (``dht.verdicts``: chunked evidence), up to ``MAX_CHUNKED_EVIDENCE``
(about 1 MiB: a width-1024 backward of 64 rows fits). Only a proof past that bound, or whose reply
does not encode again to the bytes its receipt names, stays the auditor's own (counted
``proofs_unpublished``). A reader fetches the pieces (``read_evidence``) and checks the whole
against the digest before anything else; missing or altered pieces change nothing.

**Checking** (``check_accusation``): the receipt is the accused's (its signature, and it names the
accused and the expert accused of), the reply bytes are those the receipt names, the accused still
serves the snapshot the receipt names (fetched from it by digest, the experts protocol's
``snapshot`` op), and a recompute from that snapshot contradicts the reply (``Recomputer.check``
says ``CONTRADICTED``). With a binding in the evidence, the state served must hash to it; and a
state served under the receipt's id with the accused's binding naming another digest is a proof
by signatures alone, no recompute: the host signed two states for one id (equivocation: serving
its auditor the state it computed from and checkers one made to reproduce the lie). Anything
else changes nothing: a snapshot that is gone, not served or not the state its binding names, a
receipt or binding that is not the accused's for that state, inputs the receipt does not name,
a reply that a recompute reproduces. So an accusation against an honest host is worth nothing, however many identities
sign it, and a liar is proven only while the state it signed is kept (``SnapshotPolicy``: at
least 120 s): a proof read later than that cannot be checked and excludes nobody new.

``VerdictBook`` (pure, ``now`` passed in) keeps what was checked: one recompute per distinct
evidence (``Accusation.digest``), an uncheckable one tried again at most ``MAX_TRIES`` times
``RETRY_AFTER`` apart, and the peers a checked proof excludes, with the reason
``proof published by <accuser>: ...``. ``VerdictWatch`` is the trio driver, a Host service: it
publishes our own proofs (``publish``), and every ``period`` reads the index and the keys of the
peers it is asked about, checks what is new, and tells ``on_proven`` (a trainer's ledger, a
volunteer's replicas) about each peer a checked proof excludes.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Sequence

import msgpack
import torch
import trio

from ..dht.node import DHTNode
from ..dht.verdicts import (
    MAX_CHUNKED_EVIDENCE, MAX_EVIDENCE, PROOFS_KEY, Accusation, EvidenceRef, accusation_items, accusations_of,
    accused_in_index, assemble, chunk_items, chunk_key, proof_key, split_evidence,
)
from ..errors import ExpertError, ExpertProtocolError, VolunteerError, describe
from ..net.identity import KeyPair, PeerID
from ..net.service import BaseService, HostAPI
from ..wire import unpack_bounded
from .config import DEFAULT_CONFIG, ExpertsConfig
from .receipts import Receipt, StateBinding, binds, payload_digest
from .recompute import Recomputer, Verdict
from .snapshots import state_digest
from .tensors import deserialize, serialize

log = logging.getLogger(__name__)

RETRY_AFTER = 30.0  # seconds before an accusation that could not be checked is tried again
MAX_TRIES = 3  # checks of one uncheckable accusation (its snapshot gone, its host unreachable)
MAX_REMEMBERED = 4096  # distinct evidence digests a book remembers
MAX_PROVEN = 16384  # peers a book remembers as excluded on a checked proof
PERIOD = 10.0  # seconds between two reads of the DHT by a watcher
# seconds between two reads of the keys of the peers we deal with (besides the index, every read):
# a key nobody wrote costs a whole lookup, and 64 of them every 10 s were over half of an idle
# donor's DHT requests among 50; the index names a new accusation within a period, and these keys
# only bound what flooding the index can delay
PEERS_PERIOD = 60.0
MAX_ACCUSED_PER_READ = 64  # accused peers whose keys one read looks up
PROOF_TTL = 3600.0  # seconds an accusation lives in the DHT (a snapshot outlives 120 s only)
# pieces of chunked evidence per DHT call: 16 of ~8 KiB keep a STORE or a FIND_VALUE reply far
# under the DHT's 1 MiB message bound
CHUNKS_PER_CALL = 16

# a snapshot as its host served it: (names, tensors), or (names, tensors, the host's signed binding)
Served = tuple[list[str], list[torch.Tensor]] | tuple[list[str], list[torch.Tensor], StateBinding | None]
# (accused peer, uid, state id) -> the snapshot a receipt names, from its host
FetchSnapshot = Callable[[PeerID, str, bytes], Awaitable[Served]]


def served_parts(served: Served) -> tuple[list[str], list[torch.Tensor], StateBinding | None]:
    """A fetch's (names, tensors, binding); binding None where the fetch gave none."""
    if len(served) == 3:
        return served[0], served[1], served[2]
    return served[0], served[1], None


def _encode_tensors(tensors: Sequence[torch.Tensor], config: ExpertsConfig) -> list:
    header, chunks = serialize([t.detach().cpu().contiguous() for t in tensors], "none", config=config)
    return [header, b"".join(bytes(c) for c in chunks)]


def _decode_tensors(item: object, config: ExpertsConfig) -> list[torch.Tensor]:
    if not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], bytes):
        raise ExpertProtocolError("evidence tensors are malformed")
    return deserialize(item[0], item[1], config=config)


@dataclass(frozen=True)
class Evidence:
    """A proof's self-contained half (see the module docstring)."""

    receipt: Receipt
    inputs: list[torch.Tensor]  # what the auditor sent, before any encoding
    grad_outputs: list[torch.Tensor] | None  # a backward's output gradients
    input_compression: str | None  # the inputs' encoding when not the receipt's (a backward's inputs)
    reply_header: dict  # the reply as it travelled: tensors header ...
    reply_payload: bytes  # ... and payload bytes (``receipt.outputs`` is their digest)
    # the host's signed word on the digest of the state the auditor recomputed from (None: evidence
    # from before bindings were carried, checked by recompute alone)
    binding: StateBinding | None = None

    def encode(self, config: ExpertsConfig = DEFAULT_CONFIG) -> bytes:
        grads = _encode_tensors(self.grad_outputs, config) if self.grad_outputs is not None else None
        fields = [self.receipt.to_wire(), _encode_tensors(self.inputs, config), grads, self.input_compression,
                  self.reply_header, self.reply_payload]
        if self.binding is not None:
            fields.append(self.binding.to_wire())
        return msgpack.packb(fields, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes, config: ExpertsConfig = DEFAULT_CONFIG) -> "Evidence":
        """Parse untrusted evidence; ExpertProtocolError on anything malformed."""
        item = unpack_bounded(data, MAX_CHUNKED_EVIDENCE, "evidence", ExpertProtocolError, list)
        if len(item) not in (6, 7):
            raise ExpertProtocolError("evidence is a list of 6 fields, or 7 with the state's binding")
        receipt, inputs, grads, input_compression, reply_header, reply_payload = item[:6]
        binding = StateBinding.from_wire(item[6]) if len(item) == 7 else None
        if input_compression is not None and not isinstance(input_compression, str):
            raise ExpertProtocolError("evidence's input encoding is malformed")
        if not isinstance(reply_header, dict) or not isinstance(reply_payload, bytes):
            raise ExpertProtocolError("evidence's reply is malformed")
        return cls(Receipt.from_wire(receipt), _decode_tensors(inputs, config),
                   _decode_tensors(grads, config) if grads is not None else None, input_compression,
                   reply_header, reply_payload, binding)

    def replied(self, config: ExpertsConfig = DEFAULT_CONFIG) -> list[torch.Tensor]:
        """The reply's tensors, as the auditor decoded them."""
        return deserialize(self.reply_header, self.reply_payload, config=config)


def evidence_of(receipt: Receipt, inputs: Sequence[torch.Tensor], replied: Sequence[torch.Tensor],
                grad_outputs: Sequence[torch.Tensor] | None = None, input_compression: str | None = None,
                config: ExpertsConfig = DEFAULT_CONFIG, binding: StateBinding | None = None) -> Evidence | None:
    """The evidence of an audit's proof, with the reply encoded again as it travelled and
    ``binding`` (the host's, for the state the auditor recomputed from, whose digest it checked); None when
    that does not give the bytes the receipt names (an encoding that does not round-trip) or the
    evidence exceeds ``MAX_CHUNKED_EVIDENCE``: such a proof is the auditor's alone."""
    try:
        header, chunks = serialize([t.detach().cpu().contiguous() for t in replied], receipt.compression, config=config)
    except VolunteerError:
        return None
    payload = b"".join(bytes(c) for c in chunks)
    if payload_digest(header, [payload]) != receipt.outputs:
        return None
    evidence = Evidence(receipt, [t.detach().cpu() for t in inputs],
                        [t.detach().cpu() for t in grad_outputs] if grad_outputs is not None else None,
                        input_compression, header, payload, binding)
    return evidence if len(evidence.encode(config)) <= MAX_CHUNKED_EVIDENCE else None


@dataclass(frozen=True)
class Checked:
    """What checking one accusation found: ``proven`` (a recompute contradicted the reply the
    accused signed) or not, and why, in words; ``final``: no later check can change it;
    ``refusal``: the counter it goes under when not proven (default: by ``final``)."""

    proven: bool
    detail: str
    final: bool = True
    refusal: str = ""


EVIDENCE_UNREAD = Checked(False, "its evidence's pieces are missing or do not hash to the digest it signed",
                          final=False, refusal="evidence_unread")


async def read_evidence(dht: DHTNode, accusation: Accusation) -> bytes | None:
    """The evidence of ``accusation``: inline, or its pieces fetched from the DHT and checked
    against the signed digest (None if any is missing or the whole does not match)."""
    ref = accusation.evidence
    if not isinstance(ref, EvidenceRef):
        return ref
    keys = [chunk_key(ref.digest, i) for i in range(ref.chunks)]
    found: dict[bytes, dict] = {}
    try:
        for start in range(0, len(keys), CHUNKS_PER_CALL):
            found.update(await dht.get_many(keys[start:start + CHUNKS_PER_CALL]))
    except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
        log.info("reading the pieces of a proof against %s failed: %s", PeerID.from_bytes(accusation.accused), describe(exc))
        return None
    return assemble(ref, accusation.accuser, found, dht.clock())


async def check_accusation(accusation: Accusation, fetch: FetchSnapshot, recomputer: Recomputer,
                           config: ExpertsConfig = DEFAULT_CONFIG, evidence_bytes: bytes | None = None) -> Checked:
    """Check ``accusation`` by recompute (see the module docstring); never raises for bad input.
    ``evidence_bytes``: chunked evidence as ``read_evidence`` assembled it (inline evidence is
    the accusation's own)."""
    if not isinstance(accusation.evidence, EvidenceRef):
        evidence_bytes = accusation.evidence
    if evidence_bytes is None:
        return EVIDENCE_UNREAD
    try:
        accused = PeerID.from_bytes(accusation.accused)
        evidence = Evidence.decode(evidence_bytes, config)
        replied = evidence.replied(config)
    except Exception as exc:  # noqa: BLE001 - a peer's bytes: whatever the parsers raise, it proves nothing
        return Checked(False, f"its evidence is malformed: {describe(exc)}")
    receipt = evidence.receipt
    if receipt.peer != accusation.accused or receipt.uid != accusation.uid or not receipt.verify(accused):
        return Checked(False, "its receipt is not one the accused signed for that expert")
    try:
        same_reply = payload_digest(evidence.reply_header, [evidence.reply_payload]) == receipt.outputs
    except Exception:  # noqa: BLE001 - a header msgpack cannot pack again names no reply
        same_reply = False
    if not same_reply:
        return Checked(False, "its reply is not the one the receipt names")
    claimed = evidence.binding
    if claimed is not None and not binds(claimed, receipt):
        return Checked(False, "its state binding is not one the accused signed for the state its receipt names")
    try:
        names, tensors, binding = served_parts(await fetch(accused, receipt.uid, receipt.state))
    except (ExpertError, VolunteerError, OSError, trio.BrokenResourceError) as exc:
        return Checked(False, f"the accused did not serve the state its receipt names: {describe(exc)}", final=False)
    if binding is not None and not binds(binding, receipt):
        return Checked(False, "the accused served the state its receipt names with a binding not its own", final=False)
    if claimed is not None and binding is not None and binding.digest != claimed.digest:
        # two signatures of the accused, one id, two digests: no recompute needed to see the lie
        return Checked(True, f"it signed two states for one id (state {receipt.state.hex()[:16]} of {receipt.uid}, "
                             f"version {receipt.version}): digests {claimed.digest.hex()[:16]} for the auditor and "
                             f"{binding.digest.hex()[:16]} for us")
    if claimed is not None and await trio.to_thread.run_sync(state_digest, list(zip(names, tensors))) != claimed.digest:
        # a state that is not the one it signed: as good as none served (what was signed is not checkable)
        return Checked(False, "the accused served, under that id, a state that is not the one it signed", final=False)
    finding = await trio.to_thread.run_sync(
        recomputer.check, receipt, accused, names, tensors, evidence.inputs, replied, evidence.grad_outputs,
        evidence.input_compression)
    if finding.verdict is Verdict.CONTRADICTED:
        return Checked(True, finding.detail)
    if finding.verdict is Verdict.PASSED:
        return Checked(False, f"a recompute reproduces the reply: {finding.detail}")
    return Checked(False, f"not checkable: {finding.detail}")


@dataclass(frozen=True)
class Proven:
    """A checked proof against a peer: who published it, the expert, and what the recompute found."""

    accuser: str
    uid: str
    detail: str

    @property
    def reason(self) -> str:
        return f"proof published by {self.accuser}: {self.detail}"


@dataclass
class _Seen:
    checked: Checked | None = None
    tries: int = 0
    last_try: float = float("-inf")


class VerdictBook:
    """What one peer has checked of the swarm's accusations (see the module docstring). Pure."""

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, _Seen] = OrderedDict()
        self._proven: OrderedDict[str, Proven] = OrderedDict()  # accused -> the first proof that checked
        self.refused: Counter[str] = Counter()  # accusations that changed nothing, by why
        self._unproven: OrderedDict[str, str] = OrderedDict()  # accused -> why its last accusation changed nothing
        self.checks = 0  # recomputes run for others' accusations

    def due(self, accusation: Accusation, now: float) -> bool:
        """Whether ``accusation`` should be checked now: new evidence, or an uncheckable one
        whose next try is due; never once its accused is excluded."""
        if str(PeerID.from_bytes(accusation.accused)) in self._proven:
            return False
        seen = self._seen.get(accusation.digest)
        if seen is None:
            return True
        if seen.checked is not None and seen.checked.final:
            return False
        return seen.tries < MAX_TRIES and now - seen.last_try >= RETRY_AFTER

    def record(self, accusation: Accusation, checked: Checked, now: float) -> Proven | None:
        """The result of checking ``accusation``; the new exclusion, if it is one."""
        seen = self._seen.setdefault(accusation.digest, _Seen())
        self._seen.move_to_end(accusation.digest)
        seen.checked, seen.last_try = checked, now
        seen.tries += 1
        while len(self._seen) > MAX_REMEMBERED:
            self._seen.popitem(last=False)
        self.checks += 1
        if not checked.proven:
            self.refused[checked.refusal or ("snapshot_gone" if not checked.final else "not_proven")] += 1
            accused = str(PeerID.from_bytes(accusation.accused))
            self._unproven.pop(accused, None)
            self._unproven[accused] = checked.detail
            while len(self._unproven) > MAX_PROVEN:
                self._unproven.popitem(last=False)
            return None
        return self.prove(str(PeerID.from_bytes(accusation.accused)), Proven(
            str(PeerID.from_bytes(accusation.accuser)), accusation.uid, checked.detail))

    def prove(self, accused: str, proven: Proven) -> Proven | None:
        """``accused`` is excluded on ``proven`` (ours, or one we checked); None if it already was."""
        if accused in self._proven:
            return None
        self._proven[accused] = proven
        while len(self._proven) > MAX_PROVEN:
            self._proven.popitem(last=False)
        return proven

    def excluded(self, peer: object) -> bool:
        """Whether a checked proof excludes ``peer`` (a PeerID or its text)."""
        return str(peer) in self._proven

    def proven(self, peer: object) -> Proven | None:
        return self._proven.get(str(peer))

    def unproven(self, peer: object) -> str | None:
        """Why the last accusation against ``peer`` changed nothing (None: none did)."""
        return self._unproven.get(str(peer))

    def exclusions(self) -> dict[str, Proven]:
        """Every peer a checked proof excludes, with that proof."""
        return dict(self._proven)

    def report(self) -> dict:
        """Excluded peers (accuser, expert, why), accusations that changed nothing by why, and
        how many recomputes checking cost."""
        return {
            "excluded": {peer: {"accuser": p.accuser, "uid": p.uid, "reason": p.reason} for peer, p in sorted(self._proven.items())},
            "refused": dict(sorted(self.refused.items())),
            "unproven": {peer: why for peer, why in sorted(self._unproven.items()) if peer not in self._proven},
            "checks": self.checks,
        }


class VerdictWatch(BaseService):
    """Publishes this peer's proofs and checks the swarm's (see the module docstring).

    Collaborators: the DHT node, the ``fetch`` of snapshots (over the experts protocol), the
    ``recomputer``; ``peers()``: peers to look up besides the index (the hosts we deal with);
    ``on_proven(peer, proven)``: a checked proof excludes ``peer``."""

    def __init__(self, dht: DHTNode, keypair: KeyPair, swarm_id: str, fetch: FetchSnapshot, *,
                 recomputer: Recomputer | None = None, peers: Callable[[], Iterable[str]] = lambda: (),
                 on_proven: Callable[[str, Proven], None] = lambda peer, proven: None,
                 period: float = PERIOD, clock: Callable[[], float] | None = None,
                 config: ExpertsConfig = DEFAULT_CONFIG, first_read: float = 0.0,
                 peers_period: float = PEERS_PERIOD) -> None:
        self.dht, self.keypair, self.swarm_id, self.fetch = dht, keypair, swarm_id, fetch
        self.recomputer = recomputer or Recomputer()
        self.peers, self.on_proven, self.period, self.config = peers, on_proven, period, config
        self.clock = clock or dht.clock
        self.first_read = first_read  # seconds of a first read before reporting started (a joiner's)
        self.peers_period = peers_period
        self._peers_read_at: float | None = None  # when a read last looked up the keys of peers()
        self.book = VerdictBook()
        self.published = 0
        self.unpublished = 0  # proofs whose evidence did not fit a record (or did not round-trip)
        self._wake = trio.Event()

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.first_read > 0:  # what a joiner learns before it chooses whom to catch up from
            with trio.move_on_after(self.first_read):
                await self._read_once()
        task_status.started()
        while True:
            await self._read_once()
            with trio.move_on_after(self.period):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _read_once(self) -> None:
        try:
            await self.read()
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.info("reading the swarm's proofs failed: %s", describe(exc))

    def read_soon(self) -> None:
        """Read the DHT now rather than at the end of the period (the keys of ``peers()`` too)."""
        self._peers_read_at = None
        self._wake.set()

    async def publish(self, accused: str, uid: str, evidence: Evidence | None, detail: str) -> bool:
        """Our own audit proved ``accused`` a liar: remember it, and store the accusation (its
        evidence inline, or in pieces stored first) for everyone else to check. Whether it was stored."""
        self.book.prove(accused, Proven(str(self.keypair.peer_id), uid, detail))
        encoded = evidence.encode(self.config) if evidence is not None else b""
        if not 0 < len(encoded) <= MAX_CHUNKED_EVIDENCE:
            self.unpublished += 1
            return False
        me = self.keypair.peer_id.to_bytes()
        expiration = self.clock() + PROOF_TTL
        pieces: list = []
        carried: bytes | EvidenceRef = encoded
        if len(encoded) > MAX_EVIDENCE:
            carried, parts = split_evidence(encoded)
            pieces = chunk_items(carried, parts, me, expiration)
        accusation = Accusation(self.swarm_id, me, PeerID.from_string(accused).to_bytes(),
                                uid, float(self.clock()), carried).sign(self.keypair)
        try:
            # the pieces before the accusation that names them, so a reader that sees it finds them
            for start in range(0, len(pieces), CHUNKS_PER_CALL):
                await self.dht.store_many(pieces[start:start + CHUNKS_PER_CALL])
            stored = await self.dht.store_many(accusation_items(accusation, expiration))
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.warning("the proof against %s was not stored: %s", accused, describe(exc))
            return False
        self.published += 1
        return bool(stored and stored[0])

    async def read(self) -> list[str]:
        """One look: the index, and (the first time, then every ``peers_period``) the keys of
        ``peers()``, each new accusation checked. Returns the peers newly excluded."""
        now = self.clock()
        index = await self.dht.get(PROOFS_KEY)
        # the peers we deal with first: pointers anyone can add must not crowd them out of a read
        wanted: dict[bytes, None] = {}
        dealt_with: list = []
        if self._peers_read_at is None or now - self._peers_read_at >= self.peers_period:
            dealt_with = list(self.peers())
            if dealt_with:  # none yet (nothing surveyed, nobody called): the next read asks again
                self._peers_read_at = now
        for peer in dealt_with:
            try:
                wanted[PeerID.from_string(str(peer)).to_bytes()] = None
            except (ValueError, VolunteerError):
                continue
        wanted.update(dict.fromkeys(accused_in_index(index, now)))
        accused = [a for a in wanted if not self.book.excluded(PeerID.from_bytes(a))][:MAX_ACCUSED_PER_READ]
        if not accused:
            return []
        found = await self.dht.get_many([proof_key(a) for a in accused])
        newly = []
        for who in accused:
            accusations, refused = accusations_of(who, found.get(proof_key(who), {}), self.swarm_id, now)
            self.book.refused["unsigned"] += refused
            for accusation in accusations:
                if not self.book.due(accusation, self.clock()):
                    continue
                evidence = await read_evidence(self.dht, accusation)
                checked = await check_accusation(accusation, self.fetch, self.recomputer, self.config, evidence)
                proven = self.book.record(accusation, checked, self.clock())
                if proven is None:
                    log.info("an accusation against %s by %s changed nothing: %s", PeerID.from_bytes(who),
                             PeerID.from_bytes(accusation.accuser), checked.detail)
                    continue
                peer = str(PeerID.from_bytes(who))
                log.warning("excluding volunteer %s: %s", peer, proven.reason)
                newly.append(peer)
                self.on_proven(peer, proven)
                break
        return newly

    def snapshot(self) -> dict:
        """The book's report, with proofs published and kept for want of room."""
        return {**self.book.report(), "published": self.published, "unpublished": self.unpublished}


def snapshot_fetcher(call: Callable[..., Awaitable[Any]]) -> FetchSnapshot:
    """A ``FetchSnapshot`` over an experts-protocol call (``client.call_expert`` bound to a host
    and swarm, or a directory's ``call_expert``)."""

    async def fetch(peer: PeerID, uid: str, digest: bytes) -> Served:
        meta, tensors = await call(peer, uid, "snapshot", digest=digest)
        names = list(meta["n"])
        if len(names) != len(tensors):
            raise ExpertProtocolError(f"{peer} named {len(names)} tensors of a snapshot of {uid!r} and sent {len(tensors)}")
        binding = StateBinding.from_wire(meta["b"]) if meta.get("b") is not None else None
        return names, tensors, binding

    return fetch


__all__ = [
    "Checked", "Evidence", "FetchSnapshot", "Proven", "Served", "binds", "served_parts", "VerdictBook", "VerdictWatch", "check_accusation", "evidence_of",
    "read_evidence", "snapshot_fetcher",
]
