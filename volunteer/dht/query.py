"""Iterative Kademlia lookups as sans-I/O state machines (after rust-libp2p's ClosestPeersIter).

The driver loops::

    lookup = Lookup(target, table.closest(target, k, now), config, now, local=me)
    while not lookup.finished:
        for contact in lookup.next(now):           # at most alpha counted in flight
            start a request to contact             # -> on_success / on_failure when it ends
        wait until a request ends or lookup.next_deadline()
    lookup.result()

A lookup finishes when the ``count`` closest peers it knows have all answered, when nobody is
left to ask or waited for, or at ``lookup_deadline``, whatever peers do: every peer is asked at
most once, and at most ``lookup_max_peers`` candidates are tracked. A request unanswered after
``slot_timeout`` frees its alpha slot (the lookup still waits for it, up to ``request_timeout``,
if it is among the closest, and a late answer still counts), so silent peers slow a lookup
little. A reporter whose contacts fail or run out past ``request_timeout`` more often than they
answer is distrusted (merely slow answers count for nothing: a loaded machine or a crowd joining
at once is slow, not lying). Peers that return far or made-up contacts only cost the queries those contacts fail:
contacts are placed by sha256 of their PeerID, never by what a peer claims.

Peers the node knows to be unresponsive (``suspect``: a request of ours to them failed or ran past
a slot timeout lately, and they have not spoken since; ``RoutingTable.suspect``) are routed
around: not asked while others are left, not waited for, and outside a value lookup's window. A
lookup reports the peers that ran past their slot timeout (``silent``) so the node can mark them:
one timeout, not three, and the lookups after it stop waiting on a crashed peer.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..errors import DHTRecordError
from ..net.identity import PeerID
from .config import DHTConfig
from .records import Record, check
from .routing import Contact, key_id


class State(enum.Enum):
    """Where a candidate peer stands in a lookup."""

    NOT_CONTACTED = "not-contacted"
    WAITING = "waiting"  # request in flight, counted against alpha
    SLOW = "slow"  # past slot_timeout: frees its slot, still waited for until request_timeout
    UNRESPONSIVE = "unresponsive"  # past request_timeout: not waited for; a late answer still counts
    SUCCEEDED = "succeeded"
    FAILED = "failed"


_ASKED = (State.WAITING, State.SLOW, State.UNRESPONSIVE)

Suspect = Callable[[PeerID, float], bool]  # (peer, now) -> known unresponsive: RoutingTable.suspect
RoundTrip = Callable[[PeerID], float | None]  # peer -> seconds our requests to it take: RoutingTable.rtt


@dataclass
class _Candidate:
    contact: Contact
    distance: int
    state: State = State.NOT_CONTACTED
    asked_at: float = 0.0
    deadline: float = 0.0  # when WAITING turns SLOW, or SLOW turns UNRESPONSIVE
    reporters: set[PeerID] = field(default_factory=set)  # who told us about it (empty: a seed)


class Lookup:
    """FIND_NODE lookup: the ``count`` (default k) closest responsive peers to ``target``."""

    def __init__(
        self,
        target: int,
        seeds: Iterable[Contact],
        config: DHTConfig,
        now: float,
        *,
        local: PeerID | None = None,
        count: int | None = None,
        suspect: Suspect | None = None,
    ) -> None:
        self.target = target
        self.config = config
        self.count = count or config.k
        self.local = local
        self._suspect = suspect
        self._silent: list[PeerID] = []  # ran past their slot timeout since ``silent`` was last called
        self.deadline = now + config.lookup_deadline
        self.finished = False
        self.queried = 0  # requests started, for stats and tests
        self._candidates: dict[PeerID, _Candidate] = {}
        self._order: list[tuple[int, bytes]] = []  # (distance, peer bytes), sorted
        self._by_bytes: dict[bytes, PeerID] = {}
        # reporter -> [answered, failed] among the contacts it gave us; see _judge
        self._record: dict[PeerID, list[int]] = {}
        self._distrusted: set[PeerID] = set()
        self._add(seeds, None)

    # --- driver API ----------------------------------------------------------------------
    def next(self, now: float) -> list[Contact]:
        """Peers to ask now (none once finished); marks them in flight."""
        if self.finished:
            return []
        if now >= self.deadline:
            self.finished = True
            return []
        in_flight = self._tick(now)
        to_ask: list[Contact] = []
        succeeded = 0
        pending = False  # a candidate closer than the result may still change it
        fallback: list[_Candidate] = []  # not asked: only distrusted peers reported them
        for _, raw in self._order:
            cand = self._candidates[self._by_bytes[raw]]
            if self._taken(cand):
                continue
            if cand.state is State.SUCCEEDED:
                succeeded += 1
                if succeeded >= self.count:
                    break
            elif cand.state is State.NOT_CONTACTED:
                if self._untrusted(cand) or self._known_silent(cand, now):
                    fallback.append(cand)
                    continue
                pending = True
                if in_flight >= self.config.alpha:
                    break
                self._ask(cand, now)
                in_flight += 1
                to_ask.append(cand.contact)
            elif cand.state is State.WAITING or (
                cand.state is State.SLOW and not self._untrusted(cand) and self._waits_for_slow()
            ):
                pending = True
        if not pending and fallback and (self._short() or succeeded == 0):
            # Nothing trusted and responsive left and the lookup is still short of what it is
            # for (or nobody answered at all): a reporter distrusted for handing out dead
            # contacts may be honest with a stale table (a bootstrap peer after churn), the live
            # peers only it knew are all that is left, and a peer that timed out lately may be
            # back (our own link was down). Not while another path's requests are out: their
            # answers may meet the quorum, and then these are not needed at all.
            if not self._others_busy():
                for cand in fallback[: max(0, self.config.alpha - in_flight)]:
                    self._ask(cand, now)
                    to_ask.append(cand.contact)
            pending = True
        if not pending:
            # the closest peers all answered, or nobody is left to ask or wait for
            self.finished = True
        return to_ask

    def _tick(self, now: float) -> int:
        """Move requests past their deadlines along; returns how many are counted in flight."""
        in_flight = 0
        for cand in self._candidates.values():
            if cand.state is State.WAITING and now >= cand.deadline:
                # slow is not a lie: a loaded machine or a joining crowd makes honest peers slow,
                # so only a request that runs out (or fails) counts against who reported the peer
                cand.state = State.SLOW
                cand.deadline = cand.asked_at + self.config.request_timeout
                self._silent.append(cand.contact.peer)  # ...but routed around until it answers
            if cand.state is State.SLOW and now >= cand.deadline:
                cand.state = State.UNRESPONSIVE
                self._judge(cand, ok=False)
            if cand.state is State.WAITING:
                in_flight += 1
        return in_flight

    def _ask(self, cand: _Candidate, now: float) -> None:
        cand.state = State.WAITING
        cand.asked_at = now
        cand.deadline = now + min(self.config.slot_timeout, self.config.request_timeout)
        self.queried += 1

    def _taken(self, cand: _Candidate) -> bool:
        """Whether another path of a disjoint lookup asked this candidate (see ``ValueLookup``):
        then it is theirs, never asked or counted here. A lone lookup has no other paths."""
        return False

    def _others_busy(self) -> bool:
        """Whether other paths of the same lookup have requests out (see ``ValueLookup``)."""
        return False

    def _waits_for_slow(self) -> bool:
        """Whether a request past its slot timeout still holds the lookup (up to request_timeout)
        while it is among the closest: a FIND_NODE lookup's result is those peers."""
        return True

    def _short(self) -> bool:
        """Whether the lookup still lacks what it is for once only distrusted reporters' contacts
        are left. A FIND_NODE lookup's result is whatever answered: it stops there (made-up
        contacts would cost it a slot timeout each)."""
        return False

    def on_success(self, peer: PeerID, closer: Iterable[Contact], now: float) -> None:
        """``peer`` answered with ``closer`` contacts."""
        cand = self._candidates.get(peer)
        if cand is None or cand.state not in _ASKED:
            return
        if cand.state is State.UNRESPONSIVE:
            self._judge(cand, ok=False, undo=True)  # it answered after all: take the miss back
        self._judge(cand, ok=True)  # late or not, its reporter told the truth
        cand.state = State.SUCCEEDED
        if not self.finished and peer not in self._distrusted:
            self._add(closer, peer)

    def on_failure(self, peer: PeerID, now: float) -> None:
        """The request to ``peer`` failed (error, reset, timeout, malformed reply)."""
        cand = self._candidates.get(peer)
        if cand is not None and cand.state in _ASKED:
            if cand.state is not State.UNRESPONSIVE:  # an unresponsive one was counted already
                self._judge(cand, ok=False)
            cand.state = State.FAILED

    def next_deadline(self) -> float | None:
        """When ``next`` should be called again if no request ends first (None once finished)."""
        if self.finished:
            return None
        waiting = [c.deadline for c in self._candidates.values() if c.state in (State.WAITING, State.SLOW)]
        return min(waiting + [self.deadline])

    def in_flight(self) -> list[PeerID]:
        """Peers whose request is still counted against alpha."""
        return [p for p, c in self._candidates.items() if c.state is State.WAITING]

    def silent(self) -> list[PeerID]:
        """Peers whose request ran past its slot timeout since the last call: the driver tells
        the node (``NodeState.on_silent``), which routes around them until they are heard from."""
        out, self._silent = self._silent, []
        return out

    def result(self) -> list[Contact]:
        """The closest peers that answered, closest first (at most ``count``)."""
        out = []
        for _, raw in self._order:
            cand = self._candidates[self._by_bytes[raw]]
            if cand.state is State.SUCCEEDED:
                out.append(cand.contact)
                if len(out) >= self.count:
                    break
        return out

    def state_of(self, peer: PeerID) -> State | None:
        """A candidate's state (tests, diagnostics)."""
        cand = self._candidates.get(peer)
        return cand.state if cand else None

    # --- internals -----------------------------------------------------------------------------
    def _judge(self, cand: _Candidate, ok: bool, *, undo: bool = False) -> None:
        # A peer whose contacts keep failing (made-up or dead peers) loses our trust: the contacts
        # only it reported are no longer asked or waited for. Honest peers in a churning swarm
        # give mostly live contacts, so they stay above the bar; liars fall below it in 2 misses.
        # A verdict follows the record both ways: answers that come in late redeem a reporter.
        for reporter in cand.reporters:
            record = self._record.setdefault(reporter, [0, 0])
            record[0 if ok else 1] += -1 if undo else 1
            if record[1] >= 2 and record[1] > record[0]:
                self._distrusted.add(reporter)
            else:
                self._distrusted.discard(reporter)

    def _untrusted(self, cand: _Candidate) -> bool:
        return bool(cand.reporters) and cand.reporters <= self._distrusted

    def _known_silent(self, cand: _Candidate, now: float) -> bool:
        # only our own requests make a peer suspect (RoutingTable.suspect), never a reply: nobody
        # can make an honest peer look dead to us by what it says
        return self._suspect is not None and self._suspect(cand.contact.peer, now)

    def _add(self, contacts: Iterable[Contact], reporter: PeerID | None) -> None:
        for contact in contacts:
            peer = contact.peer
            if peer == self.local:
                continue
            known = self._candidates.get(peer)
            if known is not None:
                if not known.contact.addrs and contact.addrs:
                    known.contact = contact
                if reporter is not None and known.reporters:
                    known.reporters.add(reporter)
                continue
            distance = contact.id ^ self.target
            if len(self._order) >= self.config.lookup_max_peers and distance >= self._order[-1][0]:
                continue  # farther than everything we track: cannot matter
            raw = peer.to_bytes()
            self._candidates[peer] = _Candidate(contact, distance, reporters={reporter} if reporter else set())
            self._by_bytes[raw] = peer
            bisect.insort(self._order, (distance, raw))
            self._trim()

    def _trim(self) -> None:
        # forget the farthest candidates not in flight; those in flight stay until they answer
        i = len(self._order) - 1
        while len(self._order) > self.config.lookup_max_peers and i >= 0:
            raw = self._order[i][1]
            peer = self._by_bytes[raw]
            if self._candidates[peer].state not in _ASKED:
                del self._order[i]
                del self._candidates[peer]
                del self._by_bytes[raw]
            i -= 1



class ValueLookup:
    """FIND_VALUE lookup of one key over ``disjoint_paths`` disjoint paths (S/Kademlia, section
    4.4): merges the sub-keyed records the peers of every path return.

    The k closest peers our table knows are dealt out to the paths, one of every ``paths``
    consecutive ones to each (``deal``: the quickest of them to the path that is slowest so far,
    where our table timed them all). Each path is a lookup of its own (``_ValuePath``):
    it learns contacts only from the peers it asked, and asks a peer only if no other path did, so
    a peer is asked once in all and its answer steers one path. The lookup finishes when every
    path has.

    Records are checked (signature, ownership, bounds, expiry) before they count; per sub-key the
    newest expiration wins, whichever path heard them. A path stops early once ``quorum`` peers (of
    any path) returned valid records, so sub-keys written by different publishers to slightly
    different peer sets are collected, and once w of the w + s closest peers it knows have
    answered it (records or not), s being ``witness_spares`` (3) and w the quorum plus s, at most
    ``value_witnesses`` (5): those are where publishers write (``expert_replicas``). The window's
    peers are asked all at once.

    The window is what keeps censors from ending a lookup at their own records. Any peer can
    return valid records (its own, or whatever it chooses to keep of others'), wherever it sits in
    the key space: a quorum met by the first answers is met by whoever answers first, and one that
    censors (answers with its own records and leaves out the rest) ends the lookup before the
    honest holders are heard. A record's place is the key's neighbourhood, and a peer's place is
    sha256 of its PeerID, not its choice: hearing most of the closest peers means a record is
    hidden only if censors hold w of those w + s places (benchmarks/scale.py --censor-lookups;
    see ``docs/ARCHITECTURE.md``).

    The paths are what keeps censors from choosing which places a lookup knows of. A censor names
    only its fellows, all live and quick to answer: in one path, a table that knows mostly censors
    (a join that heard them first) fills the window with them, and six of them answer before the
    honest peers farther out bring the holders' contacts. Split in two, each path's window holds
    half of those censors and must hear honest peers too, whose answers bring the holders into
    that path; the contacts censors name reach only the path that asked them.
    """

    def __init__(
        self,
        key: bytes,
        seeds: Iterable[Contact],
        config: DHTConfig,
        now: float,
        *,
        local: PeerID | None = None,
        quorum: int | None = None,
        count: int | None = None,
        paths: int | None = None,
        suspect: Suspect | None = None,
        rtt: RoundTrip | None = None,
    ) -> None:
        self.key = bytes(key)
        self.suspect = suspect
        self.target = key_id(self.key)
        self.config = config
        self.local = local
        self.count = count or config.k
        self.quorum = quorum or config.value_quorum
        self.records: dict[bytes, Record] = {}
        self.found_on: list[PeerID] = []  # peers that returned valid records, in answer order
        self.rejected = 0  # invalid records seen (forgeries, expired, foreign keys)
        self._claimed: dict[PeerID, _ValuePath] = {}  # who asked each peer: one path at most
        unique = {c.peer: c for c in seeds if c.peer != local}
        ordered = sorted(unique.values(), key=lambda c: c.id ^ self.target)
        d = max(1, min(paths or config.disjoint_paths, len(ordered)))
        self.paths = [_ValuePath(self, dealt, now) for dealt in deal(ordered, d, rtt)]

    # --- driver API (as Lookup's) ----------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return all(path.finished for path in self.paths)

    @property
    def queried(self) -> int:
        """Requests started, all paths together."""
        return sum(path.queried for path in self.paths)

    def next(self, now: float) -> list[Contact]:
        """Peers to ask now, every path's (see ``_ValuePath.next``); marks them in flight."""
        return [contact for path in self.paths for contact in path.next(now)]

    def on_success(
        self, peer: PeerID, closer: Iterable[Contact], now: float, records: Iterable[Record] = ()
    ) -> None:
        """``peer`` answered with ``closer`` contacts and its records for the key."""
        path = self._claimed.get(peer)
        if path is not None:
            path.on_success(peer, closer, now, records)

    def on_failure(self, peer: PeerID, now: float) -> None:
        """The request to ``peer`` failed (error, reset, timeout, malformed reply)."""
        path = self._claimed.get(peer)
        if path is not None:
            path.on_failure(peer, now)

    def next_deadline(self) -> float | None:
        """When ``next`` should be called again if no request ends first (None once finished)."""
        deadlines = [d for d in (path.next_deadline() for path in self.paths) if d is not None]
        return min(deadlines) if deadlines else None

    def in_flight(self) -> list[PeerID]:
        """Peers whose request is still counted against a path's alpha."""
        return [peer for path in self.paths for peer in path.in_flight()]

    def silent(self) -> list[PeerID]:
        """Peers that ran past their slot timeout since the last call, every path's."""
        return [peer for path in self.paths for peer in path.silent()]

    def result(self) -> list[Contact]:
        """The closest peers that answered, any path's, closest first (at most ``count``)."""
        answered = {c.peer: c for path in self.paths for c in path.result()}
        return sorted(answered.values(), key=lambda c: c.id ^ self.target)[: self.count]

    def state_of(self, peer: PeerID) -> State | None:
        """A candidate's state in the path that asked it, else in the first that knows it."""
        path = self._claimed.get(peer)
        if path is not None:
            return path.state_of(peer)
        return next((s for s in (p.state_of(peer) for p in self.paths) if s is not None), None)

    def live_records(self, now: float) -> dict[bytes, Record]:
        """Merged records not yet expired at ``now`` (tombstones included)."""
        return {sub: rec for sub, rec in self.records.items() if rec.expiration > now}

    # --- what the paths share -------------------------------------------------------------------
    def _merge(self, peer: PeerID, records: Iterable[Record], now: float) -> None:
        valid = 0
        for record in records:
            if record.key != self.key:
                self.rejected += 1
                continue
            try:
                check(record, now, self.config)
            except DHTRecordError:
                self.rejected += 1
                continue
            valid += 1
            held = self.records.get(record.subkey)
            if held is None or record.supersedes(held):
                self.records[record.subkey] = record
        if valid:
            self.found_on.append(peer)


def deal(ordered: list[Contact], paths: int, rtt: RoundTrip | None = None) -> list[list[Contact]]:
    """Seeds (closest first) dealt out to ``paths`` paths: each path takes one of every ``paths``
    consecutive seeds, so each holds its share of the key's closest places (where publishers
    write), as dealing them in turn did. Within a group whose round trips ``rtt`` knows, the
    quickest goes to the path whose seeds so far took longest in all, the next quickest to the
    next, and so on; a group with an untimed peer is dealt in turn. Why: a path ends on its
    window's w-th answer and the lookup on its slowest path's, so paths dealt in turn waited, on
    the emulated internet, for whichever path drew most of the far peers (benchmarks/scale.py
    --seed 2, 1,000 peers, at 6 of 9: expert lookups p50 242 -> 230 ms, p99 518 -> 397). A peer
    that answers slowly on purpose only moves itself between two paths of the same places."""
    dealt: list[list[Contact]] = [[] for _ in range(paths)]
    took = [0.0] * paths  # seconds of round trips dealt to each path so far
    for start in range(0, len(ordered), paths):
        group = ordered[start:start + paths]
        timed = [rtt(contact.peer) for contact in group] if rtt is not None else []
        times = [t for t in timed if t is not None]
        if len(times) < paths:  # a short last group, or a peer never timed
            for path, contact in enumerate(group):
                dealt[path].append(contact)
            continue
        slowest_first = sorted(range(paths), key=lambda path: -took[path])
        quickest_first = sorted(zip(times, range(paths)), key=lambda pair: pair[0])
        for path, (seconds, index) in zip(slowest_first, quickest_first):
            dealt[path].append(group[index])
            took[path] += seconds
    return dealt


class _ValuePath(Lookup):
    """One path of a ``ValueLookup``: a FIND_NODE lookup over the peers no other path asked, with
    the value lookup's window (see there). Records and the quorum are the whole lookup's."""

    def __init__(self, owner: ValueLookup, seeds: list[Contact], now: float) -> None:
        super().__init__(owner.target, seeds, owner.config, now, local=owner.local, count=owner.count,
                         suspect=owner.suspect)
        self.owner = owner

    def _taken(self, cand: _Candidate) -> bool:
        path = self.owner._claimed.get(cand.contact.peer)
        return path is not None and path is not self

    def _ask(self, cand: _Candidate, now: float) -> None:
        super()._ask(cand, now)
        self.owner._claimed[cand.contact.peer] = self

    def _met(self) -> bool:
        return len(self.owner.found_on) >= self.owner.quorum

    def _others_busy(self) -> bool:
        return any(path is not self and path.in_flight() for path in self.owner.paths)

    def _waits_for_slow(self) -> bool:
        # A value lookup's answer is the records, and its window already let a request past its
        # slot timeout go: short of the quorum it no longer waits for one either. A key with no
        # records (a crashed host's, expired) is looked for among all k closest, and a crashed
        # peer among them held every such lookup for request_timeout: a crashed volunteer's
        # experts vanished from a trainer's polls up to 5 s after they expired (scale.py, 1,000
        # peers: 19.9 s for an expiration of 15). A late answer still counts while it runs.
        return False

    def on_success(
        self, peer: PeerID, closer: Iterable[Contact], now: float, records: Iterable[Record] = ()
    ) -> None:
        cand = self._candidates.get(peer)
        if cand is None or cand.state not in _ASKED:
            return
        self.owner._merge(peer, records, now)
        super().on_success(peer, closer, now)
        if not self.finished and self._enough(now):
            self.finished = True

    def next(self, now: float) -> list[Contact]:
        """Peers to ask now (see ``Lookup.next``); past the quorum, only the closest few."""
        if self.finished or now >= self.deadline or not self._met():
            to_ask = super().next(now)
            if not self.finished:
                to_ask += self._ask_window(now)
            return to_ask
        self._tick(now)
        if self._enough(now):
            self.finished = True
            return []
        return self._ask_window(now)

    def _ask_window(self, now: float) -> list[Contact]:
        """Ask the window's peers not asked yet, all at once (past ``alpha``: the path waits for
        w of them anyway). Short of the quorum, those only distrusted peers reported wait, as
        ``Lookup.next`` has them; past it, requests to peers past the window no longer matter."""
        short = not self._met()
        to_ask = []
        for cand in self._window(now):
            if cand.state is State.NOT_CONTACTED and not (short and self._untrusted(cand)):
                self._ask(cand, now)
                to_ask.append(cand.contact)
        return to_ask

    def _window(self, now: float) -> list[_Candidate]:
        """The w + s closest candidates of this path (see ``ValueLookup``) that may still answer:
        not failed, not past ``slot_timeout``, not known unresponsive (unless it answered), not
        asked by another path. Those only distrusted peers reported count too: an honest peer
        that hands out a contact that left since is distrusted as soon as a liar (censors hand
        out only each other, all live), and a made-up contact leaves the window at its slot
        timeout anyway.

        Leaving known-unresponsive peers out is what the window did already one slot timeout
        later, so a censor gains nothing by looking dead: its place goes to the next peer out,
        and w of the w + s are still to be heard; only our own timed-out requests mark a peer
        (never a reply about it), so nobody can make honest peers look dead to shrink it."""
        size = self._witnesses() + self.config.witness_spares
        out: list[_Candidate] = []
        for _, raw in self._order:
            cand = self._candidates[self._by_bytes[raw]]
            state = cand.state
            if state in (State.NOT_CONTACTED, State.WAITING) and self._known_silent(cand, now):
                continue  # asked only as a last resort (Lookup.next): not waited for here
            if state in (State.SUCCEEDED, State.WAITING, State.NOT_CONTACTED) and not self._taken(cand):
                out.append(cand)
                if len(out) >= size:
                    break
        return out

    def _witnesses(self) -> int:
        # witness_spares more than the quorum, at most value_witnesses: an expert lookup (3) and a
        # beam search (2) hear 5 of the 8 closest
        return min(self.config.value_witnesses, self.owner.quorum + self.config.witness_spares)

    def _enough(self, now: float) -> bool:
        """The quorum is met and enough of this path's closest peers were heard."""
        if not self._met():
            return False
        window = self._window(now)
        heard = sum(1 for cand in window if cand.state is State.SUCCEEDED)
        return heard >= min(self._witnesses(), len(window))

    def _short(self) -> bool:
        # a value lookup short of its quorum asks distrusted reporters' contacts too (in distance
        # order, alpha at a time, until the deadline): a record only they lead to beats none
        return not self._met()
