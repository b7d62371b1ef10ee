"""A discrete-event internet for the DHT's sans-I/O cores (used by ``benchmarks/scale.py``).

Every peer is a real ``NodeState`` (routing table, storage, rate limits, records checked and
signed with real keys) and its lookups are the real ``Lookup`` / ``ValueLookup`` iterators; what
is simulated is the network and the thin driver around the cores (what ``dht/node.py``,
``lookups.py``, ``storing.py`` and ``declare.py`` do with trio), written here as callbacks on one
event queue with a virtual clock. Requests travel as objects; their size on the wire is that of
``encode_request`` / ``encode_response``.

The network: peers live in five regions with one-way delays between them after public ping
tables (15-160 ms) plus each peer's last mile (log-normal, median 8 ms), clamped to 20-300 ms;
1 % of messages are lost once and resent by TCP after a retransmission timeout (200 ms + the
round trip); a share of peers sit behind NATs, run the DHT in client mode and are reached only
through their relay (one more hop). A crashed peer is silent (requests to it run out at
``request_timeout``); a peer that leaves gracefully closes its connections (requests fail fast).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from typing import Callable

from volunteer.dht.config import DHTConfig
from volunteer.dht.grid import HostInfo, expert_key, make_declarations, make_tombstones
from volunteer.dht.messages import (
    FindNode, FindValue, Ping, Store, Values, encode_request, encode_response,
)
from volunteer.dht.query import Lookup
from volunteer.dht.records import sign
from volunteer.dht.routing import Contact, key_id
from volunteer.dht.state import NodeState
from volunteer.net.identity import KeyPair, PeerID

REGIONS = ("na", "eu", "asia", "sa", "oc")
REGION_SHARE = (0.35, 0.35, 0.2, 0.05, 0.05)
# one-way ms between regions (half of typical public round trips)
_BASE = {
    ("na", "na"): 20, ("eu", "eu"): 15, ("asia", "asia"): 30, ("sa", "sa"): 25, ("oc", "oc"): 15,
    ("na", "eu"): 45, ("na", "asia"): 85, ("na", "sa"): 70, ("na", "oc"): 80, ("eu", "asia"): 110,
    ("eu", "sa"): 100, ("eu", "oc"): 140, ("asia", "sa"): 150, ("asia", "oc"): 60, ("sa", "oc"): 160,
}
MAX_MAINTENANCE_PINGS = 16  # as node.py's _MAX_PINGS
MAINTENANCE_PERIOD = 5.0  # node.py sweeps every second; every 5 s keeps 10k peers affordable
BUCKET_REFRESH_AGE = 600.0  # node.py's _BUCKET_REFRESH_AGE
CLOSEST_REUSE = 30.0
SAMPLE = 8  # messages per one encoded to measure bytes  # the declarer reuses a key's closest peers this long (storing.py)


WIRES = ("internet", "loopback")
# one message's way between two processes on one machine: a Noise + yamux frame through the
# kernel and two event loops (a DHT round trip between two loopback daemons is about 1 ms idle)
LOOPBACK_ONE_WAY = 0.0005


def one_way(a: str, b: str) -> float:
    return _BASE.get((a, b)) or _BASE[(b, a)]


def spread_regions(n: int, rng: random.Random) -> list[str]:
    """``n`` regions drawn by systematic sampling over ``REGION_SHARE`` (one random offset, then
    evenly spaced), in random order: each draw is still a region with its share's chance, but ten
    of them hold three or four in each of the two big regions, not anything from none to seven.
    Why: a lookup's time is mostly where its trainer sits, and ten independent draws made the
    lookup p50 of benchmarks/scale.py a figure of that luck (1,000 peers, seeds 1-4: 146 to
    over 200 ms, with seven trainers in North America or four in Asia)."""
    if n <= 0:
        return []  # no draw: a swarm without trainers (the censor scenario) keeps its seed's peers
    offset = rng.random()
    cumulative = list(itertools.accumulate(REGION_SHARE))
    picked = []
    for i in range(n):
        point = (i + offset) / n * cumulative[-1]
        picked.append(REGIONS[next(j for j, edge in enumerate(cumulative) if point < edge)])
    rng.shuffle(picked)
    return picked


class Net:
    """The event queue, the clock and the wire."""

    def __init__(self, config: DHTConfig, seed: int, *, loss: float = 0.01, wire: str = "internet") -> None:
        """``wire``: ``internet`` (the regions' delays, ``loss``) or ``loopback`` (one machine:
        ``LOOPBACK_ONE_WAY`` each way, nothing lost), to hold beside real processes on loopback."""
        if wire not in WIRES:
            raise ValueError(f"wire must be one of {WIRES}")
        self.config = config
        self.rng = random.Random(seed)
        self.loss = loss if wire == "internet" else 0.0
        self.wire = wire
        self.now = 0.0
        self._queue: list = []
        self._seq = itertools.count()
        self.nodes: dict[PeerID, SimNode] = {}
        self.msgs: Counter[PeerID] = Counter()  # messages sent (requests and replies)
        self.bytes: Counter[PeerID] = Counter()
        self.count_traffic = True
        self._sampled = itertools.count()

    # --- time ---------------------------------------------------------------------------------
    def at(self, when: float, fn: Callable, *args) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), fn, args))

    def after(self, delay: float, fn: Callable, *args) -> None:
        self.at(self.now + delay, fn, *args)

    def run_until(self, until: float, *, stop: Callable[[], bool] | None = None) -> None:
        queue = self._queue
        while queue and queue[0][0] <= until:
            when, _, fn, args = heapq.heappop(queue)
            self.now = max(self.now, when)
            fn(*args)
            if stop is not None and stop():
                return
        self.now = max(self.now, until)

    # --- the wire -----------------------------------------------------------------------------
    def delay(self, a: "SimNode", b: "SimNode") -> float:
        if self.wire == "loopback":
            return LOOPBACK_ONE_WAY * self.rng.uniform(0.5, 2.0)
        d = (one_way(a.region, b.region) + a.last_mile + b.last_mile) / 1000.0
        if a.relayed or b.relayed:
            d += 0.01  # through the relay: one more hop in the same region
        d = min(0.3, max(0.02, d)) * self.rng.uniform(0.95, 1.1)
        if self.rng.random() < self.loss:
            d += 0.2 + 2 * d  # lost once: TCP resends after its retransmission timeout
        return d

    def request(self, src: "SimNode", contact: Contact, request, on_reply: Callable, on_fail: Callable) -> None:
        """Send ``request``; exactly one of ``on_reply(response)`` / ``on_fail()`` runs later."""
        dst = self.nodes.get(contact.peer)
        settled = [False]

        def fail() -> None:
            if not settled[0]:
                settled[0] = True
                on_fail()

        self._account(src.peer, request, encode_request)
        if dst is None or dst.crashed:
            self.after(self.config.request_timeout, fail)
            return
        if dst.left:
            self.after(2 * self.delay(src, dst), fail)  # connection refused / reset
            return
        self.after(min(self.config.request_timeout, self.delay(src, dst)), self._arrive, src, dst, request, on_reply, settled)
        self.after(self.config.request_timeout, fail)

    def _arrive(self, src: "SimNode", dst: "SimNode", request, on_reply: Callable, settled: list) -> None:
        if not dst.alive:
            return  # crashed in between: the request runs out
        response, pings = dst.state.handle_request(src.peer, request, self.now, source=src.source)
        if dst.censor is not None:
            response = dst.censor(request, response)
            if response is None:
                return  # a censor that drops the request: it runs out
        dst.ping_soon(pings)
        self._account(dst.peer, response, encode_response)

        def deliver() -> None:
            if not settled[0] and src.alive:
                settled[0] = True
                on_reply(response)

        self.after(self.delay(dst, src), deliver)

    def _account(self, peer: PeerID, message, encode: Callable) -> None:
        if self.count_traffic:
            self.msgs[peer] += 1
            # bytes: one message in SAMPLE is encoded and counts SAMPLE times (an unbiased
            # estimate; encoding every reply's contacts cost a tenth of the run)
            if next(self._sampled) % SAMPLE == 0:
                self.bytes[peer] += SAMPLE * (len(encode(message, self.config)) + 8)  # + length prefix, yamux header


class SimNode:
    """One peer: a NodeState and the driver around it (joining, upkeep, lookups, heartbeats)."""

    def __init__(self, net: Net, keypair: KeyPair, *, relayed: bool = False, region: str | None = None,
                 config: DHTConfig | None = None, client_mode: bool | None = None) -> None:
        self.net = net
        self.keypair = keypair
        self.peer = keypair.peer_id
        rng = net.rng
        self.region = region or rng.choices(REGIONS, REGION_SHARE)[0]
        self.last_mile = min(60.0, rng.lognormvariate(math.log(8.0), 0.6))
        self.relayed = relayed
        self.addrs = (b"/sim/relayed" if relayed else b"/sim/direct",)
        self.source = ("relay", self.region) if relayed else ("ip", self.peer)
        # a relayed peer runs the DHT in client mode; so does a trainer (Swarm.join), if asked
        client_mode = relayed if client_mode is None else client_mode
        self.state = NodeState(self.peer, config or net.config, client_mode=client_mode, addrs=self.addrs)
        self.contact = Contact(self.peer, self.addrs)
        self.crashed = False
        self.left = False
        self.censor: Callable | None = None  # rewrites this peer's answers, None: drops them (an attacker)
        self.uids: list[str] = []
        self.last_expiration = 0.0
        self.requests = 0
        self.failures = 0
        self._pinging: set[PeerID] = set()
        self._closest: dict[bytes, tuple[float, list[Contact]]] = {}
        self._boot_delay = 1.0
        self._crawled = False  # a trainer's crawl started (DHTConfig.crawl_lookups)
        net.nodes[self.peer] = self

    @property
    def alive(self) -> bool:
        return not (self.crashed or self.left)

    # --- requests ---------------------------------------------------------------------------
    def send(self, contact: Contact, request, on_reply: Callable, on_fail: Callable) -> None:
        self.requests += 1
        sent = self.net.now

        def reply(response) -> None:
            now = self.net.now
            try:
                pings = self.state.on_reply(contact, request, response, now, rtt=now - sent)
            except Exception:
                self.state.on_failure(contact.peer, now)
                on_fail()
                return
            self.ping_soon(pings)
            on_reply(response)

        def fail() -> None:
            self.failures += 1
            self.state.on_failure(contact.peer, self.net.now)
            on_fail()

        self.net.request(self, contact, request, reply, fail)

    def ping_soon(self, peers) -> None:
        for peer in peers:
            if peer in self._pinging or len(self._pinging) >= MAX_MAINTENANCE_PINGS or not self.alive:
                continue
            self._pinging.add(peer)
            entry = self.state.table.get(peer)
            contact = entry.contact if entry else Contact(peer)

            def done(ok: bool, peer=peer) -> None:
                self._pinging.discard(peer)
                if self.alive:
                    self.state.on_ping_result(peer, ok, self.net.now)

            self.send(contact, self.state.ping_request(), lambda _r, d=done: d(True), lambda d=done: d(False))

    # --- lookups (lookups.py's _drive, as callbacks) -----------------------------------------
    def drive(self, lookups: list[Lookup], dispatch: Callable, done: Callable[[], None]) -> None:
        net = self.net
        state = {"finished": False, "timer": None}

        def step() -> None:
            if state["finished"] or not self.alive:
                return
            now = net.now
            asked = [(lookup, lookup.next(now)) for lookup in lookups]
            for lookup in lookups:
                self.state.on_silent(lookup.silent(), now)
            for contact, request, on_reply, on_fail in dispatch([p for p in asked if p[1]]):
                self.send(contact, request, lambda r, f=on_reply: (f(r), step()), lambda f=on_fail: (f(), step()))
            if all(lookup.finished for lookup in lookups):
                state["finished"] = True
                done()
                return
            deadlines = [d for d in (lookup.next_deadline() for lookup in lookups) if d is not None]
            if deadlines:
                when = min(deadlines) + 1e-3
                if state["timer"] is None or when < state["timer"] or state["timer"] <= now:
                    state["timer"] = when
                    net.at(when, step)

        step()

    def find_closest(self, target: int, done: Callable[[list[Contact]], None], *, count: int | None = None) -> None:
        lookup = self.state.lookup(target, self.net.now, count=count)
        request = self.state.find_node_request(target)

        def dispatch(asked):
            out = []
            for lk, contacts in asked:
                for contact in contacts:
                    out.append((contact, request,
                                lambda r, c=contact: lookup.on_success(c.peer, r.peers, self.net.now),
                                lambda c=contact: lookup.on_failure(c.peer, self.net.now)))
            return out

        self.drive([lookup], dispatch, lambda: done(lookup.result()))

    def get_many(self, keys: list[bytes], quorum: int, done: Callable[[dict], None]) -> None:
        """``DHTNode.get_many(keys, quorum=quorum)`` (max_age 0): live records per key."""
        now = self.net.now
        lookups = {key: self.state.value_lookup(key, now, quorum=quorum) for key in keys}
        batch = self.net.config.max_keys_per_request

        def dispatch(asked):
            by_peer: dict[PeerID, tuple[Contact, list[bytes]]] = {}
            for lookup, contacts in asked:
                for contact in contacts:
                    by_peer.setdefault(contact.peer, (contact, []))[1].append(lookup.key)
            out = []
            for contact, wanted in by_peer.values():
                for i in range(0, len(wanted), batch):
                    ks = wanted[i : i + batch]
                    out.append((contact, self.state.find_value_request(ks),
                                lambda r, c=contact, ks=ks: self._values(c, ks, r, lookups),
                                lambda c=contact, ks=ks: [lookups[k].on_failure(c.peer, self.net.now) for k in ks]))
            return out

        def finish() -> None:
            t = self.net.now
            done({k: {s: r for s, r in lk.live_records(t).items() if r.value is not None} for k, lk in lookups.items()})

        self.drive(list(lookups.values()), dispatch, finish)

    def _values(self, contact: Contact, keys: list[bytes], response, lookups) -> None:
        if not isinstance(response, Values):
            for k in keys:
                lookups[k].on_failure(contact.peer, self.net.now)
            return
        for key, result in zip(keys, response.results):
            lookups[key].on_success(contact.peer, result.closer, self.net.now, result.records)

    # --- joining and upkeep (node.py's bootstrap and _maintain) --------------------------------
    def join(self, entry: list[Contact], done: Callable[[], None] | None = None) -> None:
        pending = [len(entry)]
        self._entry = entry

        def refreshed(_closest) -> None:
            # then random IDs far from ours (node.py's bootstrap: DHTConfig.join_lookups), together
            targets = self.state.table.join_targets(self.state.config.join_lookups, self.net.rng)
            left = [len(targets)]

            def one_refreshed(_c) -> None:
                left[0] -= 1
                if left[0] == 0 and done:
                    done()

            for target in targets:
                self.find_closest(target, one_refreshed)
            if not targets and done:
                done()
            self._crawl()

        def one_done() -> None:
            pending[0] -= 1
            if pending[0] == 0:
                if len(self.state.table):
                    self.find_closest(self.state.table.local_id, refreshed)
                elif done:
                    done()

        for contact in entry:
            self.send(contact, self.state.ping_request(), lambda _r: one_done(), one_done)
        self.net.after(MAINTENANCE_PERIOD * self.net.rng.random(), self._maintain)

    def _crawl(self) -> None:
        """node.py's crawl once joined (DHTConfig.crawl_lookups): ``crawl_parallel`` lookups at a
        time, each started as another one ends."""
        config = self.state.config
        if self._crawled or not config.crawl_lookups:
            return
        self._crawled = True
        targets = self.state.table.crawl_targets(config.crawl_lookups, self.net.rng)

        def next_one(_closest=None) -> None:
            if targets and self.alive:
                self.find_closest(targets.pop(), next_one)

        for _ in range(config.crawl_parallel):
            next_one()

    def _maintain(self) -> None:
        if not self.alive:
            return
        net = self.net
        now = net.now
        self.ping_soon(self.state.expire(now))
        self.ping_soon(self.state.table.to_check(now))
        if len(self.state.table) == 0 and self._entry:
            self._boot_delay = min(self._boot_delay * 2, 30.0)
            self.join(self._entry)
            return  # join schedules the next sweep
        for target in self.state.table.refresh_targets(now, BUCKET_REFRESH_AGE, net.rng)[:2]:
            self.find_closest(target, lambda _c: None)
        net.after(MAINTENANCE_PERIOD, self._maintain)

    # --- heartbeats (declare.py, storing.py with cached_peers) ------------------------------
    def declare(self, uids: list[str]) -> None:
        self.uids = list(uids)
        self._heartbeat()

    def _heartbeat(self) -> None:
        if not self.alive or not self.uids:
            return
        config = self.net.config
        now = self.net.now
        expiration = now + config.expert_expiration
        self.last_expiration = expiration
        items = make_declarations(self.uids, HostInfo(self.peer, self.addrs, 0.0), now, expiration, config=config)
        self.store_items(items)
        self.net.after(config.expert_update_period, self._heartbeat)

    def leave(self) -> None:
        """A graceful leave: tombstones for every declaration, then the connections close."""
        items = make_tombstones(self.uids, self.peer, self.last_expiration)
        self.uids = []
        self.store_items(items)
        self.net.after(1.0, self._close)

    def _close(self) -> None:
        self.left = True

    def crash(self, *, silent: bool = True) -> None:
        """A crash: ``silent``, the machine or its link is gone (requests to it run out);
        otherwise only the process died and its machine resets its connections (requests fail
        at once), as ``kill -9`` on a live machine does. No tombstones either way."""
        if silent:
            self.crashed = True
        else:
            self.left = True

    def store_items(self, items) -> None:
        now = self.net.now
        records = [sign(self.keypair, key, sub, value, exp) for key, sub, value, exp in items]
        self.state.storage.store_many(records, now)
        by_key: dict[bytes, list] = {}
        for record in records:
            by_key.setdefault(record.key, []).append(record)
        replicas = self.net.config.expert_replicas
        ready: dict[PeerID, tuple[Contact, list]] = {}
        missing = []
        for key, recs in by_key.items():
            cached = self._closest.get(key)
            if cached and now - cached[0] < CLOSEST_REUSE and cached[1]:
                for c in cached[1][:replicas]:
                    ready.setdefault(c.peer, (c, []))[1].extend(recs)
            else:
                missing.append(key)
        # as storing.py's store_many: the closest peers the table knows get the records at once,
        # while the lookups run, then the closer ones found (each peer each key's records once)
        sent: set[tuple[PeerID, bytes]] = set()
        for key in missing:
            for c in self.state.table.closest(key_id(key), replicas, now):
                sent.add((c.peer, key))
                ready.setdefault(c.peer, (c, []))[1].extend(by_key[key])
        for contact, recs in ready.values():
            self._store_to(contact, recs)
        for key in missing:
            def found(closest: list[Contact], key=key) -> None:
                closest = [c for c in closest if c.peer != self.peer][:replicas]
                self._closest[key] = (self.net.now, closest)
                for c in closest:
                    if (c.peer, key) not in sent:
                        self._store_to(c, by_key[key])
            self.find_closest(key_id(key), found)

    def _store_to(self, contact: Contact, records: list) -> None:
        limit = self.net.config.max_records_per_request
        keys = {r.key for r in records}

        def failed() -> None:
            for key in keys:
                self._closest.pop(key, None)  # storing.py: a failed STORE makes the next one look again

        for i in range(0, len(records), limit):
            self.send(contact, self.state.store_request(records[i : i + limit]), lambda _r: None, failed)


__all__ = ["Net", "SimNode", "FindNode", "FindValue", "Ping", "Store", "expert_key"]
