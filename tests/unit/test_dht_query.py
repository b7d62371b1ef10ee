"""Lookup iterators: unit behaviour, then a simulated network of 250 pure nodes (no trio, virtual time)."""

from __future__ import annotations

import heapq
import itertools
import pickle
import random

import pytest

from volunteer.dht.config import DHTConfig
from volunteer.dht.grid import EXPERT_QUORUM
from volunteer.dht.messages import FindValue, Nodes, Store, Values
from volunteer.dht.query import Lookup, State, ValueLookup, deal
from volunteer.dht.records import Record, owned_subkey, sign
from volunteer.dht.routing import Contact, key_id, node_id
from volunteer.dht.state import NodeState
from volunteer.net.identity import KeyPair, PeerID

CONFIG = DHTConfig(alpha=3)  # the tests below count in-flight requests against alpha=3


def make_peer(rng: random.Random) -> PeerID:
    return PeerID(b"\x12\x20" + rng.randbytes(32))


def contacts(n: int, rng: random.Random) -> list[Contact]:
    return [Contact(make_peer(rng)) for _ in range(n)]


# --- the iterator alone -----------------------------------------------------------------------
def test_alpha_in_flight_closest_first() -> None:
    rng = random.Random(1)
    target = rng.getrandbits(256)
    seeds = contacts(10, rng)
    lookup = Lookup(target, seeds, CONFIG, 0.0, count=3)
    first = lookup.next(0.0)
    by_distance = sorted(seeds, key=lambda c: c.id ^ target)
    assert first == by_distance[:3]
    assert lookup.next(0.0) == []  # alpha reached
    lookup.on_failure(first[0].peer, 0.1)
    assert lookup.next(0.1) == [by_distance[3]]
    for c in (first[1], first[2], by_distance[3]):
        lookup.on_success(c.peer, [], 0.2)
    # the 3 closest that could answer did: finished without asking the rest
    assert lookup.next(0.2) == [] and lookup.finished
    assert lookup.result() == [first[1], first[2], by_distance[3]]


def test_timeouts_free_slots_and_late_answers_still_count() -> None:
    rng = random.Random(2)
    seeds = contacts(6, rng)
    lookup = Lookup(0, seeds, CONFIG, 0.0, count=2)
    asked = lookup.next(0.0)
    assert lookup.next_deadline() == CONFIG.slot_timeout
    more = lookup.next(CONFIG.slot_timeout)  # the first three free their slots but are still awaited
    assert len(more) == 3 and not set(more) & set(asked)
    assert lookup.state_of(asked[0].peer) is State.SLOW
    assert lookup.next_deadline() == 2 * CONFIG.slot_timeout  # the second batch's slots
    assert lookup.next(CONFIG.request_timeout) == []
    assert lookup.state_of(asked[0].peer) is State.UNRESPONSIVE
    lookup.on_success(asked[0].peer, [], 5.5)  # late, but welcome
    lookup.on_success(more[0].peer, [], 5.6)
    lookup.next(5.6)
    assert lookup.finished and {c.peer for c in lookup.result()} == {asked[0].peer, more[0].peer}


def test_slow_close_peer_is_waited_for() -> None:
    rng = random.Random(8)
    seeds = contacts(4, rng)
    target = 0
    closest, *others = sorted(seeds, key=lambda c: c.id ^ target)
    lookup = Lookup(target, seeds, CONFIG, 0.0, count=1)
    asked = lookup.next(0.0)
    assert asked[0] == closest
    for c in asked[1:]:
        lookup.on_success(c.peer, [], 0.1)
    assert lookup.next(0.1) == [] and not lookup.finished  # the closest may still answer
    assert lookup.next(CONFIG.slot_timeout) == [others[-1]] or not lookup.finished
    lookup.on_success(closest.peer, [], 3.0)
    lookup.next(3.0)
    assert lookup.finished and lookup.result() == [closest]


def test_deadline_ends_a_lookup_where_everyone_hangs() -> None:
    rng = random.Random(3)
    lookup = Lookup(0, contacts(50, rng), CONFIG, 0.0)
    now = 0.0
    for _ in range(1000):
        lookup.next(now)
        if lookup.finished:
            break
        now = lookup.next_deadline()
    assert lookup.finished and now <= CONFIG.lookup_deadline
    assert lookup.result() == [] and lookup.next_deadline() is None


def test_everyone_failing_ends_at_once() -> None:
    rng = random.Random(4)
    lookup = Lookup(0, contacts(30, rng), CONFIG, 0.0)
    while not lookup.finished:
        for c in lookup.next(0.0):
            lookup.on_failure(c.peer, 0.0)
    assert lookup.queried == 30 and lookup.result() == []


def test_unknown_and_repeated_answers_ignored() -> None:
    rng = random.Random(5)
    seeds = contacts(3, rng)
    me = make_peer(rng)
    lookup = Lookup(0, seeds + [Contact(me)], CONFIG, 0.0, local=me)
    asked = lookup.next(0.0)
    assert me not in {c.peer for c in asked}
    lookup.on_success(make_peer(rng), contacts(5, rng), 0.1)  # never asked: ignored
    lookup.on_success(asked[0].peer, [], 0.1)
    lookup.on_failure(asked[0].peer, 0.2)  # already succeeded: stays succeeded
    assert lookup.state_of(asked[0].peer) is State.SUCCEEDED
    assert len(lookup._candidates) == 3


def test_reporters_of_failing_contacts_are_distrusted() -> None:
    rng = random.Random(9)
    honest, liar = contacts(2, rng)
    lookup = Lookup(0, [honest, liar], CONFIG, 0.0, count=5)
    lookup.next(0.0)
    garbage = contacts(10, rng)
    lookup.on_success(liar.peer, garbage, 0.1)
    lookup.on_success(honest.peer, [], 0.1)
    asked = lookup.next(0.1)
    assert set(asked) <= set(garbage) and len(asked) == CONFIG.alpha
    for c in asked[:2]:
        lookup.on_failure(c.peer, 0.2)
    # two misses and no hit: the rest of the liar's contacts are neither asked nor waited for
    assert lookup.next(0.2) == []
    lookup.on_failure(asked[2].peer, 0.3)
    assert lookup.next(0.3) == [] and lookup.finished
    assert lookup.result() == sorted([honest, liar], key=lambda c: c.id)


def test_a_slow_crowd_does_not_make_an_honest_reporter_distrusted() -> None:
    # A joining crowd on a loaded machine: every contact the bootstrap peer reported answers, but
    # after slot_timeout. Slowness is no lie: the rest of its contacts are still asked, and the
    # lookup ends with all of them (it used to stop at the first two slow answers).
    rng = random.Random(11)
    bootstrap = contacts(1, rng)[0]
    crowd = contacts(9, rng)
    lookup = Lookup(0, [bootstrap], CONFIG, 0.0, count=20)
    lookup.next(0.0)
    lookup.on_success(bootstrap.peer, crowd, 0.1)
    now, answered, in_flight = 0.1, set(), {}
    while not lookup.finished and now < CONFIG.lookup_deadline:
        for c in lookup.next(now):
            in_flight[c.peer] = now
        for peer, asked_at in list(in_flight.items()):
            if now - asked_at >= CONFIG.slot_timeout + 0.5:  # late, but before request_timeout
                lookup.on_success(peer, [], now)
                answered.add(peer)
                del in_flight[peer]
        now += 0.25
    assert answered == {c.peer for c in crowd}
    assert {c.peer for c in lookup.result()} == {c.peer for c in crowd} | {bootstrap.peer}


def test_candidates_are_bounded() -> None:
    rng = random.Random(6)
    config = DHTConfig(lookup_max_peers=50)
    lookup = Lookup(0, contacts(3, rng), config, 0.0)
    for _ in range(20):
        for c in lookup.next(0.0):
            lookup.on_success(c.peer, contacts(64, rng), 0.0)
    assert len(lookup._candidates) <= 50 + config.alpha


def test_value_lookup_merges_newest_and_rejects_forgeries() -> None:
    rng = random.Random(7)
    alice, bob, mallory = (KeyPair.generate() for _ in range(3))
    key = b"ffn.3."
    a_old = sign(alice, key, owned_subkey(alice.peer_id), b"old", 100.0)
    a_new = sign(alice, key, owned_subkey(alice.peer_id), b"new", 110.0)
    b_rec = sign(bob, key, owned_subkey(bob.peer_id), b"bob", 105.0)
    forged = sign(mallory, key, owned_subkey(mallory.peer_id), b"x", 105.0)
    forged = type(forged)(key, owned_subkey(alice.peer_id), b"evil", 200.0, alice.peer_id, forged.signature)
    other_key = sign(alice, b"other", owned_subkey(alice.peer_id), b"o", 105.0)
    seeds = contacts(5, rng)
    lookup = ValueLookup(key, seeds, CONFIG, 90.0, quorum=2)
    asked = lookup.next(90.0)
    assert len(asked) == 5  # the witness window (5 of the 8 closest) at once, past alpha
    lookup.on_success(asked[0].peer, [], 90.1, [a_new, forged, other_key])
    assert lookup.rejected == 2 and not lookup.finished
    lookup.on_success(asked[1].peer, [], 90.2, [a_old, b_rec])
    assert not lookup.finished  # a quorum of 2 peers with records, but 2 of the closest heard
    assert lookup.next(90.2) == []  # all asked already
    for contact in asked[2:4]:
        lookup.on_success(contact.peer, [], 90.3)
    assert not lookup.finished
    lookup.on_success(asked[4].peer, [], 90.3)
    assert lookup.finished  # five known: all five heard
    assert lookup.records[owned_subkey(alice.peer_id)].value == b"new"
    assert lookup.records[owned_subkey(bob.peer_id)].value == b"bob"
    assert set(lookup.live_records(106.0)) == {owned_subkey(alice.peer_id)}


def test_a_lookup_asks_past_two_censors_that_answer_with_their_own_records_only() -> None:
    rng = random.Random(8)
    honest, censor_a, censor_b = (KeyPair.generate() for _ in range(3))
    key = b"rep.0"
    own = [sign(c, key, owned_subkey(c.peer_id), b"me", 105.0) for c in (censor_a, censor_b)]
    honest_rec = sign(honest, key, owned_subkey(honest.peer_id), b"honest", 105.0)
    seeds = contacts(5, rng)

    def run(quorum: int) -> set[bytes]:
        lookup = ValueLookup(key, seeds, CONFIG, 90.0, quorum=quorum)
        asked = lookup.next(90.0)  # the two closest answer first, with their own records only
        lookup.on_success(asked[0].peer, [], 90.1, [own[0]])
        lookup.on_success(asked[1].peer, [], 90.1, [own[1]])
        if not lookup.finished:  # the others answer with the honest host's record too
            for contact in [asked[2], *lookup.next(90.2)]:
                lookup.on_success(contact.peer, [], 90.3, [honest_rec])
        return {rec.value for rec in lookup.live_records(95.0).values()}

    # the two censors meet a quorum of 2, but the lookup hears value_witnesses of the 5 closest
    assert run(quorum=2) == {b"me", b"honest"}
    assert run(quorum=CONFIG.k) == {b"me", b"honest"}  # a survey merges every holder's answer


# --- a simulated network ----------------------------------------------------------------------
HANG = object()
FAIL = object()


class Sim:
    """250 NodeStates exchanging Request/Response objects under a virtual clock."""

    def __init__(self, n: int, seed: int, config: DHTConfig = CONFIG) -> None:
        self.rng = random.Random(seed)
        self.config = config
        self.now = 0.0
        self.nodes = {}
        for _ in range(n):
            peer = make_peer(self.rng)
            self.nodes[peer] = NodeState(peer, config, addrs=[b"/sim"])
        self.peers = list(self.nodes)
        self.dead: set[PeerID] = set()  # refuse at once (dial error)
        self.hung: set[PeerID] = set()  # accept and never answer
        self.liars: dict[PeerID, str] = {}  # "far", "garbage" or "censor"
        self.requests = 0

    def alive(self, peer: PeerID) -> bool:
        return peer in self.nodes and peer not in self.dead and peer not in self.hung

    def _serve(self, src: PeerID, dst: PeerID, request):
        self.requests += 1
        if dst not in self.nodes or dst in self.hung:
            return HANG  # unknown (made-up) peers hang: the worst case for the asker
        if dst in self.dead:
            return FAIL
        response, ping = self.nodes[dst].handle_request(src, request, self.now)
        for lru in ping:
            self.nodes[dst].on_ping_result(lru, self.alive(lru), self.now)
        kind = self.liars.get(dst)
        if kind is not None:
            response = self._lie(kind, request, response)
        return response

    def _lie(self, kind: str, request, response):
        if kind == "censor":  # its fellow censors as the only closer peers, its own records only
            fellows = tuple(Contact(p, (b"/sim",)) for p in self.liars if self.liars[p] == "censor")
            if isinstance(response, Nodes):
                return Nodes(fellows)
            return Values(tuple(
                type(r)(tuple(rec for rec in r.records if self.liars.get(rec.signer) == "censor"), fellows)
                for r in response.results
            ))
        target = key_id(request.keys[0]) if isinstance(request, FindValue) else int.from_bytes(request.target, "big")
        if kind == "far":
            liars = sorted(self.peers, key=lambda p: -(node_id(p) ^ target))[: self.config.k]
            fake = tuple(self.nodes[p].table.get(p) or Contact(p, (b"/sim",)) for p in liars)
        else:
            fake = tuple(Contact(make_peer(self.rng), (b"/nowhere",)) for _ in range(self.config.k))
        if isinstance(response, Nodes):
            return Nodes(fake)
        return Values(tuple(type(r)(r.records, fake) for r in response.results))

    def run(self, src: PeerID, lookup: Lookup, make_request) -> Lookup:
        state = self.nodes[src]
        events: list = []
        seq = itertools.count()
        for _ in range(100_000):
            for contact in lookup.next(self.now):
                request = make_request()
                outcome = self._serve(src, contact.peer, request)
                if outcome is not HANG:
                    delay = self.rng.uniform(0.01, 0.1) if outcome is not FAIL else 0.001
                    heapq.heappush(events, (self.now + delay, next(seq), contact, request, outcome))
            if lookup.finished:
                break
            deadline = lookup.next_deadline()
            if events and events[0][0] <= deadline:
                when, _, contact, request, outcome = heapq.heappop(events)
                self.now = max(self.now, when)
                if outcome is FAIL:
                    state.on_failure(contact.peer, self.now)
                    lookup.on_failure(contact.peer, self.now)
                    continue
                for lru in state.on_reply(contact, request, outcome, self.now):
                    state.on_ping_result(lru, self.alive(lru), self.now)
                if isinstance(outcome, Values):
                    lookup.on_success(contact.peer, outcome.results[0].closer, self.now, outcome.results[0].records)
                else:
                    lookup.on_success(contact.peer, outcome.peers, self.now)
            else:
                self.now = max(self.now, deadline)
        else:
            raise AssertionError("lookup did not terminate")
        return lookup

    def find_node(self, src: PeerID, target: int) -> Lookup:
        state = self.nodes[src]
        start = self.now
        lookup = self.run(src, state.lookup(target, self.now), lambda: state.find_node_request(target))
        assert self.now - start <= self.config.lookup_deadline + 0.2
        return lookup

    def bootstrap(self) -> None:
        first = self.peers[0]
        for peer in self.peers[1:]:
            self.nodes[peer].table.update(Contact(first, (b"/sim",)), self.now)
            self.find_node(peer, node_id(peer))
        for peer in self.peers:  # a second pass, as periodic self-lookups would do
            self.find_node(peer, node_id(peer))

    def truth(self, target: int, src: PeerID) -> set[PeerID]:
        """The k closest live peers to ``target`` other than the asker (a lookup never returns itself)."""
        live = [p for p in self.peers if self.alive(p) and p != src]
        return set(sorted(live, key=lambda p: node_id(p) ^ target)[: self.config.k])


@pytest.fixture(scope="module")
def bootstrapped() -> bytes:
    sim = Sim(250, seed=11)
    sim.bootstrap()
    return pickle.dumps(sim)  # each test gets a fresh copy: bootstrapping is the slow part


@pytest.fixture
def network(bootstrapped: bytes) -> Sim:
    return pickle.loads(bootstrapped)


def recall(sim: Sim, lookups: int, seed: int) -> float:
    rng = random.Random(seed)
    live = [p for p in sim.peers if sim.alive(p)]
    hits = total = 0
    for _ in range(lookups):
        target = rng.getrandbits(256)
        src = rng.choice(live)
        lookup = sim.find_node(src, target)
        truth = sim.truth(target, src)
        hits += len(truth & {c.peer for c in lookup.result()})
        total += len(truth)
    return hits / total


@pytest.mark.slow
def test_healthy_network_finds_exact_k_closest(network: Sim) -> None:
    sizes = [len(s.table) for s in network.nodes.values()]
    assert min(sizes) >= network.config.k
    assert recall(network, 40, seed=1) == 1.0


@pytest.mark.slow
def test_twenty_percent_dead_still_finds_k_closest(network: Sim) -> None:
    sim = network
    victims = sim.rng.sample(sim.peers, 50)
    sim.dead.update(victims[:25])  # connection refused
    sim.hung.update(victims[25:])  # silent
    assert recall(sim, 60, seed=2) >= 0.99
    # the driver's liveness sweep (ping what to_check names) then clears the dead from every table
    def dead_entries() -> int:
        return sum(
            1 for p, s in sim.nodes.items() if sim.alive(p) for e in s.table.entries() if not sim.alive(e.contact.peer)
        )

    before = dead_entries()
    assert before > 0
    for _ in range(30):  # dead replacements get promoted too, and are swept in later rounds
        if not dead_entries():
            break
        sim.now += CONFIG.max_failure_backoff
        for peer, state in sim.nodes.items():
            if not sim.alive(peer):
                continue
            for other in state.table.to_check(sim.now, max_age=0.0):
                if sim.alive(other):
                    state.table.record_success(other, sim.now)
                else:
                    state.table.record_failure(other, sim.now)
    assert dead_entries() == 0
    assert recall(sim, 20, seed=5) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["far", "garbage"])
def test_liars_cannot_stop_termination(kind: str, network: Sim) -> None:
    sim = network
    for peer in sim.rng.sample(sim.peers, 50):
        sim.liars[peer] = kind
    rng = random.Random(3)
    hits = total = 0
    for _ in range(20):
        target = rng.getrandbits(256)
        start = sim.now
        src = rng.choice(sim.peers)
        lookup = sim.find_node(src, target)  # asserts the deadline held
        assert lookup.finished and sim.now - start <= CONFIG.lookup_deadline + 0.2
        truth = sim.truth(target, src)
        hits += len(truth & {c.peer for c in lookup.result()})
        total += len(truth)
    if kind == "far":
        assert hits / total >= 0.99  # far contacts are never closer: the honest majority wins
    else:
        # made-up contacts that never answer cost slots until their reporter is distrusted
        assert hits / total >= 0.9


@pytest.mark.slow
def test_store_and_find_values_with_dead_nodes(network: Sim) -> None:
    sim = network
    publishers = [KeyPair.generate() for _ in range(5)]
    key = b"ffn.7."
    for i, kp in enumerate(publishers):
        src = sim.peers[i + 1]
        closest = sim.find_node(src, key_id(key)).result()
        record = sign(kp, key, owned_subkey(kp.peer_id), b"host %d" % i, sim.now + 60)
        for contact in closest:
            sim._serve(src, contact.peer, Store((record,)))
    for victim in sim.rng.sample(sim.peers[10:], 50):
        sim.dead.add(victim)
    rng = random.Random(4)
    for _ in range(10):
        src = rng.choice([p for p in sim.peers if sim.alive(p)])
        state = sim.nodes[src]
        lookup = sim.run(src, state.value_lookup(key, sim.now), lambda: state.find_value_request([key]))
        found = lookup.live_records(sim.now)
        assert {r.signer for r in found.values()} == {kp.peer_id for kp in publishers}
        assert len(lookup.found_on) >= CONFIG.value_quorum or lookup.finished


def test_two_censoring_nodes_among_ten_hide_a_live_host_from_fewer_than_1_in_200_surveys() -> None:
    """Two DHT servers among ten that declare an expert too and answer every lookup with their own
    records and each other only (the eclipse of issue 22). A fresh joiner's placement survey
    (quorum: the k closest) must find the honest host, and so must a trainer's expert lookup
    (EXPERT_QUORUM, 3), and so must a beam search's (2): a value lookup hears value_witnesses of
    the closest peers before its quorum ends it, so censors answering first no longer end it."""
    sim = Sim(10, seed=21)
    sim.bootstrap()
    rng = random.Random(5)
    censors = sim.peers[1:3]
    key = b"rep.0"
    honest, *censor_keys = (KeyPair.generate() for _ in range(3))
    published = [0.0]

    def publish() -> None:
        liars, sim.liars = sim.liars, {}
        for kp, src in ((honest, sim.peers[5]), *zip(censor_keys, censors)):
            record = sign(kp, key, owned_subkey(kp.peer_id), b"host", sim.now + 3600)
            for contact in [Contact(src, (b"/sim",)), *sim.find_node(src, key_id(key)).result()]:
                sim._serve(src, contact.peer, Store((record,)))
        sim.liars = liars
        published[0] = sim.now

    publish()
    censor_signers = {kp.peer_id for kp in censor_keys}
    for censor in censors:
        sim.liars[censor] = "censor"
    for record_signer, censor in zip(censor_signers, censors):
        sim.liars[record_signer] = "censor"  # whose records a censor lets through: its own
    misses = {CONFIG.k: 0, 2: 0, EXPERT_QUORUM: 0}
    surveys = 400
    for _ in range(surveys):
        if sim.now > published[0] + 1800:
            # the surveys' virtual time adds up (the censors name their records' signers as
            # fellows: made-up contacts, each a slot timeout), past the records' hour: heartbeat
            publish()
        # a fresh node each time, bootstrapped from an honest member (the swarm file's entry
        # points; one that knows only censors sees only what they show, in any DHT)
        joiner = make_peer(sim.rng)
        sim.nodes[joiner] = state = NodeState(joiner, CONFIG, addrs=[b"/sim"])
        sim.peers.append(joiner)
        entry = rng.choice([p for p in sim.peers[:10] if p not in censors])
        state.table.update(Contact(entry, (b"/sim",)), sim.now)
        sim.find_node(joiner, node_id(joiner))
        for quorum in misses:
            lookup = sim.run(joiner, state.value_lookup(key, sim.now, quorum=quorum),
                             lambda: state.find_value_request([key]))
            if honest.peer_id not in {r.signer for r in lookup.live_records(sim.now).values()}:
                misses[quorum] += 1
        sim.dead.add(joiner)  # it leaves: the others' tables learn so at their next try
    assert misses[CONFIG.k] * 200 < surveys, misses  # fewer than 1 in 200
    assert misses[EXPERT_QUORUM] * 200 < surveys, misses  # a trainer's expert lookups too
    assert misses[2] * 200 < surveys, misses  # and a beam search's quorum
    print(f"honest host missed by {misses[CONFIG.k]} of {surveys} surveys, {misses[2]} lookups at quorum 2, {misses[EXPERT_QUORUM]} at EXPERT_QUORUM, {sim.now:.0f} s")


def test_a_value_lookup_short_of_its_quorum_asks_past_a_stale_reporter() -> None:
    """A bootstrap peer after churn hands out dead contacts first (they are closer) and the live
    holder last: two dead contacts make it distrusted, but a value lookup that has not reached its
    quorum still asks the holder rather than ending empty (a fresh joiner missed live hosts so)."""
    rng = random.Random(12)
    alice = KeyPair.generate()
    key = b"ffn.3.4"
    record = sign(alice, key, owned_subkey(alice.peer_id), b"host", 105.0)
    target = key_id(key)
    entry = contacts(1, rng)[0]
    reported = sorted(contacts(12, rng), key=lambda c: c.id ^ target)
    dead, holder = reported[:11], reported[11]  # more dead than a witness window holds
    lookup = ValueLookup(key, [entry], CONFIG, 90.0, quorum=1)
    assert lookup.next(90.0) == [entry]
    lookup.on_success(entry.peer, reported, 90.1)
    now, asked = 90.1, []
    while not lookup.finished and now < 100.0:
        for c in lookup.next(now):
            asked.append(c)
            if c == holder:
                lookup.on_success(c.peer, [], now + 0.1, [record])
            else:
                lookup.on_failure(c.peer, now + 0.1)
        now += 0.1
    assert asked[-1] == holder and set(asked) == set(reported)  # the dead first, closest first
    assert lookup.finished and set(lookup.live_records(95.0)) == {owned_subkey(alice.peer_id)}


# --- known-unresponsive peers: routed around after one timeout ------------------------------------
def _five_servers_holding(key: bytes, rng: random.Random) -> tuple[Record, list[Contact]]:
    """A host's signed record of ``key`` and five servers, closest to the key first."""
    owner = KeyPair.generate()
    record = sign(owner, key, owned_subkey(owner.peer_id), b"host", 1000.0)
    return record, sorted(contacts(5, rng), key=lambda c: c.id ^ key_id(key))


def test_after_one_timeout_a_small_swarms_lookups_stop_waiting_on_a_crashed_peer() -> None:
    """Five servers, the key's closest crashed silently: the first value lookup waits one slot
    timeout for it and reports it (``silent``); the node marks it (``RoutingTable.suspect``) and
    the next lookups finish on the four live peers' answers at once (they waited 2 s each until
    three failures evicted it, about 12 s in a small swarm)."""
    from volunteer.dht.routing import RoutingTable

    rng = random.Random(11)
    key = b"expert.0.0"
    record, servers = _five_servers_holding(key, rng)
    dead = servers[0]
    table = RoutingTable(make_peer(rng), CONFIG)

    def run(now: float) -> tuple[float, list[PeerID]]:
        lookup = ValueLookup(key, servers, CONFIG, now, quorum=EXPERT_QUORUM, suspect=table.suspect)
        asked: list[PeerID] = []
        answered = False
        while not lookup.finished:
            for contact in lookup.next(now):
                asked.append(contact.peer)
            for peer in lookup.silent():
                table.mark_silent(peer, now)
            if not answered:
                now += 0.1
                for peer in asked:
                    if peer != dead.peer:
                        lookup.on_success(peer, servers, now, [record])
                answered = True
            elif not lookup.finished:
                now = lookup.next_deadline()
        assert set(lookup.live_records(now)) == {record.subkey}
        return now, asked

    ended, asked = run(0.0)
    assert dead.peer in asked and ended >= CONFIG.slot_timeout  # waited once...
    assert table.suspect(dead.peer, ended)
    ended, asked = run(10.0)
    assert dead.peer not in asked and ended == pytest.approx(10.1)  # ...and not again


def test_a_known_unresponsive_peer_is_asked_only_when_nobody_else_answered() -> None:
    rng = random.Random(12)
    live, dead = contacts(2, rng)
    silent = {dead.peer}

    def suspect(peer: PeerID, now: float) -> bool:
        return peer in silent

    lookup = Lookup(0, [live, dead], CONFIG, 0.0, suspect=suspect)
    assert lookup.next(0.0) == [live]
    lookup.on_success(live.peer, [], 0.1)
    assert lookup.next(0.1) == [] and lookup.finished and lookup.result() == [live]
    # our own link was down and every contact failed: a lookup that hears nobody tries them again
    lookup = Lookup(0, [live, dead], CONFIG, 0.0, suspect=suspect)
    assert lookup.next(0.0) == [live]
    lookup.on_failure(live.peer, 0.1)
    assert lookup.next(0.1) == [dead]


def test_a_censor_that_looks_dead_leaves_its_place_in_the_window_to_the_next_peer() -> None:
    """The window is the w + s closest peers that may answer: one known unresponsive (a censor
    that went silent to us, say) gives its place to the next peer out, and w are still heard."""
    rng = random.Random(13)
    key = b"expert.1.2"
    seeds = sorted(contacts(12, rng), key=lambda c: c.id ^ key_id(key))
    censor = seeds[0]
    signer = KeyPair.generate()
    rec = sign(signer, key, owned_subkey(signer.peer_id), b"v", 1000.0)
    lookup = ValueLookup(key, seeds, CONFIG, 0.0, quorum=EXPERT_QUORUM, paths=1,
                         suspect=lambda peer, now: peer == censor.peer)
    witnesses = min(CONFIG.value_witnesses, EXPERT_QUORUM + CONFIG.witness_spares)
    asked = lookup.next(0.0)
    assert censor not in asked and asked == seeds[1 : 2 + witnesses + CONFIG.witness_spares - 1]
    for i, contact in enumerate(asked[:witnesses]):
        assert not lookup.finished, f"finished after {i} answers"
        lookup.on_success(contact.peer, [], 0.1, [rec])
    assert lookup.finished


def test_a_path_waits_for_the_other_paths_answers_before_asking_a_known_unresponsive_peer() -> None:
    """Five servers over two paths, one known unresponsive: the path whose two live peers answer
    first (short of the quorum of 3) does not fall back on the dead one while the other path's
    requests are out, and once their answers meet the quorum the dead one is not waited for."""
    rng = random.Random(14)
    key = b"expert.3.1"
    record, servers = _five_servers_holding(key, rng)
    dead = servers[0]
    lookup = ValueLookup(key, servers, CONFIG, 0.0, quorum=EXPERT_QUORUM,
                         suspect=lambda peer, now: peer == dead.peer)
    first, second = (lookup.paths[0], lookup.paths[1])
    asked = lookup.next(0.0)
    assert dead not in asked and len(asked) == 4
    mine = [c for c in asked if first.state_of(c.peer) is State.WAITING and lookup._claimed[c.peer] is first]
    theirs = [c for c in asked if c not in mine]
    for contact in mine:
        lookup.on_success(contact.peer, [], 0.1, [record])
    assert dead not in lookup.next(0.1) and not lookup.finished
    for contact in theirs:
        lookup.on_success(contact.peer, [], 0.2, [record])
    assert lookup.next(0.2) == [] and lookup.finished
    assert second.finished and dead.peer not in lookup._claimed


def test_a_value_lookup_short_of_its_quorum_does_not_wait_past_a_slot_timeout() -> None:
    """A crashed host's records expired: nobody holds the key, so the lookup hears the k closest,
    and one of them crashed. Its window let it go at its slot timeout; now the lookup does too,
    where it used to wait for request_timeout (a trainer's polls saw experts vanish up to 5 s
    late). A FIND_NODE lookup still waits for a slow peer among the closest (its result)."""
    rng = random.Random(15)
    key = b"expert.9.9"
    seeds = contacts(3, rng)
    lookup = ValueLookup(key, seeds, CONFIG, 0.0, quorum=EXPERT_QUORUM, paths=1)
    asked = lookup.next(0.0)
    assert len(asked) == 3
    for contact in asked[:2]:
        lookup.on_success(contact.peer, [], 0.1, [])
    assert lookup.next(0.1) == [] and not lookup.finished
    lookup.next(CONFIG.slot_timeout)
    assert lookup.finished and lookup.silent() == [asked[2].peer]
    assert not lookup.live_records(CONFIG.slot_timeout)


def test_seeds_are_dealt_one_of_each_group_and_the_quickest_to_the_slowest_path() -> None:
    """Each path takes one of every two consecutive seeds (its share of the closest places), in
    turn where a round trip is unknown; where both are known, the quicker goes to the path whose
    seeds so far took longer."""
    rng = random.Random(16)
    seeds = contacts(7, rng)
    assert deal(seeds, 2) == [seeds[0::2], seeds[1::2]]
    assert deal(seeds, 2, lambda peer: None) == [seeds[0::2], seeds[1::2]]
    rtts = {seeds[0].peer: 0.3, seeds[1].peer: 0.05, seeds[2].peer: 0.2, seeds[3].peer: 0.04,
            seeds[5].peer: 0.1}  # seeds[4] never timed
    first, second = deal(seeds, 2, rtts.get)
    # group 1: the quicker (seeds[1]) to path 0 (both at 0 s, the first slowest); group 2: path 1
    # now took 0.3 s, so it gets the quicker seeds[3]; group 3 has an untimed peer: in turn; the
    # last seed, alone, goes to the first path
    assert first == [seeds[1], seeds[2], seeds[4], seeds[6]]
    assert second == [seeds[0], seeds[3], seeds[5]]
    # whatever round trips peers show us (a censor can answer as slowly as it likes, or as fast as
    # the network lets it), each path still holds exactly one of every pair: no timing puts two
    # neighbouring places, or more than its share of the closest, on one path
    for _ in range(50):
        times = {c.peer: rng.random() for c in seeds}
        for path in deal(seeds, 2, times.get):
            assert sorted(seeds.index(c) // 2 for c in path) == list(range(len(path)))


def test_a_value_lookup_over_timed_peers_does_not_leave_one_path_all_the_far_ones() -> None:
    """Dealt in turn, the four far peers among the closest would all fall to one path, whose
    window then needs a far answer to reach w. Dealt by round trip, each path gets two, and both
    reach w on near answers alone."""
    rng = random.Random(17)
    key = b"expert.4.4"
    seeds = sorted(contacts(20, rng), key=lambda c: c.id ^ key_id(key))
    far = {c.peer for c in seeds[0:8:2]}  # dealt in turn, all four go to the first path
    rtt = {c.peer: (0.3 if c.peer in far else 0.05) for c in seeds}
    signer = KeyPair.generate()
    record = sign(signer, key, owned_subkey(signer.peer_id), b"v", 1000.0)
    witnesses = min(CONFIG.value_witnesses, EXPERT_QUORUM + CONFIG.witness_spares)
    window = witnesses + CONFIG.witness_spares
    for timed, ends_on_near_answers in ((None, False), (rtt.get, True)):
        lookup = ValueLookup(key, seeds, CONFIG, 0.0, quorum=EXPERT_QUORUM, rtt=timed)
        asked = lookup.next(0.0)
        assert len(asked) == 2 * window
        for contact in asked:
            if contact.peer not in far:
                lookup.on_success(contact.peer, [], 0.05, [record])
        assert lookup.finished is ends_on_near_answers
