"""The swarm as a thousand peers see it, on one machine: DHT cores over an emulated internet.

    python benchmarks/scale.py                    # 1,000 peers (about 6 CPU minutes; 3 cold starts)
    python benchmarks/scale.py --cold-runs 10 --censor-lookups 100
    python benchmarks/scale.py --sizes --censor-lookups 200 --censor-swarm 2 10 --censor-behaviour far
    python benchmarks/scale.py --sizes 200 1000   # several sizes, one after the other
    python benchmarks/scale.py --sizes 10000 --cold-only

Every peer is a real ``NodeState`` and every lookup a real ``Lookup``/``ValueLookup``, driven by a
discrete-event network (``benchmarks/_netsim.py``: 20-300 ms one-way delays from five regions,
1 % loss, a share of peers behind NATs reached through relays and running the DHT as clients).
Per size it prints:

- cold start: all peers start within 10 s, bootstrapping from three relays; the routing-table
  graph of the DHT servers is checked for splits (weakly connected components beyond one) and
  for strong connectivity, over ``--cold-runs`` runs;
- steady state with churn of 10 % of peers an hour (half crash, half leave gracefully, each
  replaced by a joiner): every peer but the relays and trainers hosts one expert of a 64x64 grid
  and heartbeats it (5 s period, 15 s expiration, as ``DHTConfig``); trainers (their regions
  spread over the regions' shares: ``_netsim.spread_regions``) run expert lookups (a live host's
  uid, quorum ``EXPERT_QUORUM``), grid lookups (a prefix ``ffn.i.``) and beam searches (beam 4)
  without caches: p50, p99 and success, and expert lookups' p50 by the trainer's region;
- how long a crashed volunteer's declarations take to vanish and a joiner's to appear (a trainer
  polls every second);
- messages and bytes per peer per minute (mean, and the busiest peer: a holder of the grid's root);
- last line: ``scale: N peers, lookup p50 X ms p99 Y ms, success Z %, splits S, M msgs/peer/min``.
"""

from __future__ import annotations

import argparse
import os
import dataclasses
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._netsim import REGIONS, Net, SimNode, spread_regions  # noqa: E402
from volunteer.dht.beam import BeamSearch  # noqa: E402
from volunteer.dht.config import TRAINER_BUCKET_SIZE, TRAINER_CRAWL_LOOKUPS, TRAINER_JOIN_LOOKUPS, DHTConfig  # noqa: E402
from volunteer.dht.grid import BEAM_QUORUM, EXPERT_QUORUM, expert_key, select_alive  # noqa: E402
from volunteer.dht.messages import KeyResult, Nodes, Values  # noqa: E402
from volunteer.dht.routing import key_id  # noqa: E402
from volunteer.net.identity import KeyPair  # noqa: E402

GRID = 64
RELAYS = 3
CONFIG = DHTConfig(swarm_id="scale")
JOIN_LOOKUPS = TRAINER_JOIN_LOOKUPS  # a trainer's (--join-lookups)
CRAWL_LOOKUPS = TRAINER_CRAWL_LOOKUPS  # a trainer's, once joined (--crawl-lookups)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Swarm:
    """A Net with relays, volunteers and trainers."""

    def __init__(self, size: int, seed: int, nat_share: float, trainers: int, *, wire: str = "internet",
                 relays: int = RELAYS, client_trainers: bool = False) -> None:
        self.net = Net(CONFIG, seed, wire=wire)
        self.rng = random.Random(seed + 1)
        self.nat_share = nat_share
        self.relays = [SimNode(self.net, KeyPair.generate(), region=r) for r in ("na", "eu", "asia")][:relays]
        self.entry = [r.contact for r in self.relays]
        self.trainers: list[SimNode] = []
        self.volunteers: list[SimNode] = []
        self.size = size
        self.n_trainers = trainers
        self.trainer_regions = spread_regions(trainers, self.rng)  # the cold start's trainers take these
        self.uid_of: dict = {}
        self.client_trainers = client_trainers  # the cold start's trainers in client mode

    def new_peer(self, *, trainer: bool = False, client: bool = False) -> SimNode:
        """A volunteer (behind a NAT at ``nat_share``) or a trainer (``client``: in client mode, as
        Swarm.join's; the steady state's trainers are servers, as they were measured first)."""
        relayed = not trainer and self.rng.random() < self.nat_share
        # a trainer's DHT node keeps wide buckets and looks all over the key space on joining, as
        # Swarm.join's does (DHTConfig.for_trainer)
        config = dataclasses.replace(CONFIG, bucket_size=TRAINER_BUCKET_SIZE, join_lookups=JOIN_LOOKUPS,
                                     crawl_lookups=CRAWL_LOOKUPS) if trainer else None
        region = self.trainer_regions.pop() if trainer and self.trainer_regions else None
        node = SimNode(self.net, KeyPair.generate(), relayed=relayed, region=region, config=config,
                       client_mode=client or None)
        (self.trainers if trainer else self.volunteers).append(node)
        return node

    def cold_start(self, window: float = 10.0) -> None:
        for relay in self.relays:
            others = [r.contact for r in self.relays if r is not relay]
            self.net.after(0.0, relay.join, others)
        for i in range(self.size - len(self.relays)):
            trainer = i < self.n_trainers
            node = self.new_peer(trainer=trainer, client=trainer and self.client_trainers)
            self.net.after(self.rng.uniform(0.1, window), node.join, self.entry)

    def servers(self) -> list[SimNode]:
        return [n for n in self.net.nodes.values() if n.alive and not n.relayed]

    def splits(self) -> tuple[int, float, int]:
        """(weak components - 1, share of servers in the largest strongly connected component,
        peers (clients too) with an empty table)."""
        servers = self.servers()
        ids = {n.peer for n in servers}
        edges = {n.peer: [e.contact.peer for e in n.state.table.entries() if e.contact.peer in ids] for n in servers}
        # weak components
        undirected: dict = {p: set() for p in ids}
        for p, out in edges.items():
            for q in out:
                undirected[p].add(q)
                undirected[q].add(p)
        seen: set = set()
        components = 0
        for p in ids:
            if p in seen:
                continue
            components += 1
            stack = [p]
            seen.add(p)
            while stack:
                for q in undirected[stack.pop()]:
                    if q not in seen:
                        seen.add(q)
                        stack.append(q)
        # strongly connected: reachable from a relay and reaching it (forward and backward search)
        root = self.relays[0].peer
        reverse: dict = {p: [] for p in ids}
        for p, out in edges.items():
            for q in out:
                reverse[q].append(p)

        def reach(graph) -> set:
            got = {root}
            stack = [root]
            while stack:
                for q in graph[stack.pop()]:
                    if q not in got:
                        got.add(q)
                        stack.append(q)
            return got

        strong = reach(edges) & reach(reverse)
        empty = sum(1 for n in self.net.nodes.values() if n.alive and len(n.state.table) == 0)
        return components - 1, len(strong) / max(1, len(ids)), empty


def cold_runs(size: int, runs: int, seed: int, nat_share: float) -> list[tuple[int, float, int]]:
    out = []
    for run in range(runs):
        swarm = Swarm(size, seed + 100 * run, nat_share, trainers=0)
        swarm.net.count_traffic = False
        swarm.cold_start()
        swarm.net.run_until(30.0)
        out.append(swarm.splits())
    return out


def steady(size: int, seed: int, nat_share: float, minutes: float, trainers: int, churn_per_hour: float, *,
           grid: tuple[int, int] = (GRID, GRID), probes: int = 10, wire: str = "internet", relays: int = RELAYS,
           client_trainers: bool = False, one_per_cell: bool = False, silent_crashes: bool = True) -> dict:
    """The steady state (see the module's docstring); ``grid`` the volunteers' experts are drawn
    from, ``probes`` crashed volunteers and joiners timed, ``wire`` (``_netsim.WIRES``), ``relays``
    as entry points, ``client_trainers``: trainers in client mode (as ``Swarm.join``'s).
    ``one_per_cell``: the volunteers take the grid's uids in turn (not at random) and a probe's
    joiner takes over the uid of a crashed probe; ``silent_crashes=False``: a probe's crash is
    a killed process whose machine resets its connections (``SimNode.crash``)."""
    swarm = Swarm(size, seed, nat_share, trainers, wire=wire, relays=relays, client_trainers=client_trainers)
    net = swarm.net
    rng = swarm.rng
    swarm.cold_start()
    net.run_until(15.0)
    splits_cold = swarm.splits()
    # every volunteer hosts one expert of the grid
    cells = [f"ffn.{i}.{j}" for i in range(grid[0]) for j in range(grid[1])]
    if one_per_cell:
        rng.shuffle(cells)
    vacant: list[str] = []  # uids of crashed probes (one_per_cell: a probe's joiner takes one over)
    for n, node in enumerate(swarm.volunteers):
        uid = cells[n % len(cells)] if one_per_cell else f"ffn.{rng.randrange(grid[0])}.{rng.randrange(grid[1])}"
        swarm.uid_of[node.peer] = uid
        net.after(rng.uniform(0, CONFIG.expert_update_period), node.declare, [uid])
    net.run_until(net.now + 15.0)  # every host heartbeated twice or more
    start = net.now
    net.msgs.clear()
    net.bytes.clear()
    results = {"expert": [], "grid": [], "beam": [], "vanish": [], "appear": [], "stale": []}
    by_region: dict[str, list[float]] = {}  # expert lookup seconds, by the trainer's region
    churn = {"crash": 0, "leave": 0}
    born: dict = {}  # joiner -> when it started declaring
    crashed_at: dict = {}  # crashed volunteer -> when it crashed

    def note_stale(alive: list) -> None:
        """A trainer's lookup just returned these live declarations: any of a crashed host counts
        how long after its crash a trainer could still be sent to it (``select_alive`` drops a
        record at its expiration, so never past one expiration: this shows it does)."""
        for decl in alive:
            if decl.peer in crashed_at:
                results["stale"].append(net.now - crashed_at[decl.peer])

    def live_hosts() -> list[SimNode]:
        return [n for n in swarm.volunteers if n.alive and n.uids and net.now - born.get(n.peer, -1e9) > 2 * CONFIG.expert_update_period]

    # --- churn: Poisson, half crashes and half graceful leaves, each replaced by a joiner -------
    rate = churn_per_hour * len(swarm.volunteers) / 3600.0

    def churn_event() -> None:
        alive = [n for n in swarm.volunteers if n.alive]
        victim = rng.choice(alive)
        if rng.random() < 0.5:
            victim.crash()
            crashed_at[victim.peer] = net.now
            churn["crash"] += 1
        else:
            victim.leave()
            churn["leave"] += 1
        joiner = swarm.new_peer()

        def joined() -> None:
            uid = f"ffn.{rng.randrange(grid[0])}.{rng.randrange(grid[1])}"
            swarm.uid_of[joiner.peer] = uid
            born[joiner.peer] = net.now
            joiner.declare([uid])

        joiner.join(swarm.entry, joined)
        net.after(rng.expovariate(rate), churn_event)

    if rate > 0:
        net.after(rng.expovariate(rate), churn_event)

    # --- trainers' lookups ------------------------------------------------------------------
    def grid_prefix(uid: str) -> str:
        return uid.rsplit(".", 1)[0] + "."

    def periodic_lookup(trainer: SimNode, kind: str, key_of, gap: tuple[float, float]) -> None:
        """Look up ``key_of`` a random live host's uid (its expert, or its grid's prefix), record
        the time and whether that host was among the live holders found, and again in ``gap``."""
        hosts = live_hosts()
        if hosts:
            host = rng.choice(hosts)
            key = expert_key(key_of(swarm.uid_of[host.peer]))
            t0 = net.now

            def done(found: dict) -> None:
                alive = select_alive(found[key].values(), net.now, CONFIG)
                results[kind].append((net.now - t0, any(d.peer == host.peer for d in alive)))
                if kind == "expert":
                    by_region.setdefault(trainer.region, []).append(net.now - t0)
                note_stale(alive)

            trainer.get_many([key], EXPERT_QUORUM, done)
        net.after(rng.uniform(*gap), periodic_lookup, trainer, kind, key_of, gap)

    def full_beam(found: int) -> bool:
        if not one_per_cell:
            return found == 4
        return found >= min(4, len({swarm.uid_of[n.peer] for n in live_hosts()}))

    def beam(trainer: SimNode) -> None:
        scores = [[rng.gauss(0, 1) for _ in range(side)] for side in grid]
        search = BeamSearch("ffn", scores, 4, net.now, CONFIG)
        t0 = net.now

        def round_() -> None:
            keys = search.wanted()
            if not keys:
                results["beam"].append((net.now - t0, full_beam(len(search.result()))))
                net.after(rng.uniform(2.0, 6.0), beam, trainer)
                return

            def fed(found: dict) -> None:
                search.feed({k: list(found[expert_key(k)].values()) for k in keys}, net.now)
                round_()

            trainer.get_many([expert_key(k) for k in keys], BEAM_QUORUM, fed)

        round_()

    for trainer in swarm.trainers:
        net.after(rng.uniform(0, 1), periodic_lookup, trainer, "expert", str, (0.5, 1.5))
        net.after(rng.uniform(0, 2), periodic_lookup, trainer, "grid", grid_prefix, (1.0, 3.0))
        net.after(rng.uniform(0, 4), beam, trainer)

    # --- probes: crashed volunteers vanish, joiners appear (a trainer polls every second) --------
    prober = swarm.trainers[0]

    def poll(uid: str, peer, since: float, want: bool, key: str, tries: int = 0) -> None:
        def done(found: dict) -> None:
            alive = select_alive(found[expert_key(uid)].values(), net.now, CONFIG)
            note_stale(alive)
            present = any(d.peer == peer for d in alive)
            if present == want:
                results[key].append(net.now - since)
            elif tries < 60:
                net.after(1.0, poll, uid, peer, since, want, key, tries + 1)

        prober.get_many([expert_key(uid)], EXPERT_QUORUM, done)

    def probe_crash() -> None:
        host = rng.choice(live_hosts())
        host.crash(silent=silent_crashes)
        crashed_at[host.peer] = net.now
        vacant.append(swarm.uid_of[host.peer])
        churn["crash"] += 1
        poll(swarm.uid_of[host.peer], host.peer, net.now, False, "vanish")

    def probe_join() -> None:
        joiner = swarm.new_peer()
        uid = vacant.pop(0) if one_per_cell and vacant else f"ffn.{rng.randrange(grid[0])}.{rng.randrange(grid[1])}"
        swarm.uid_of[joiner.peer] = uid
        t0 = net.now

        def joined() -> None:
            born[joiner.peer] = net.now
            joiner.declare([uid])

        joiner.join(swarm.entry, joined)
        net.after(0.5, poll, uid, joiner.peer, t0, True, "appear")

    duration = minutes * 60.0
    for i in range(probes):  # early enough to be settled within the window
        net.at(start + 1.0 + i * min(3.0, duration / (2 * probes)), probe_crash)
        net.at(start + 2.5 + i * min(3.0, duration / (2 * probes)), probe_join)
    net.run_until(start + duration)
    elapsed = net.now - start
    peers = [n for n in net.nodes.values()]
    per_min = 60.0 / elapsed
    msgs = sum(net.msgs.values()) / len(peers) * per_min
    byts = sum(net.bytes.values()) / len(peers) * per_min
    busiest = max(net.msgs, key=net.msgs.get)
    return {
        "swarm": swarm,
        "results": results,
        "by_region": by_region,
        "trainer_regions": [t.region for t in swarm.trainers],
        "churn": churn,
        "splits_cold": splits_cold,
        "splits_end": swarm.splits(),
        "msgs": msgs,
        "bytes": byts,
        "busiest_msgs": net.msgs[busiest] * per_min,
        "busiest_bytes": net.bytes[busiest] * per_min,
        "elapsed": elapsed,
        "probes": probes,
    }


CENSOR_BEHAVIOURS = ("clique", "far", "empty", "silent")


def censored(size: int, n_censors: int, seed: int, lookups: int, quorums: tuple[int, ...],
             behaviour: str = "clique", client_trainers: bool = True) -> dict[int, tuple[int, int, float, float]]:
    """``n_censors`` of ``size`` DHT servers censor; every censor and one honest volunteer declare
    each uid. Fresh trainers (each joining through a relay) look uids up: how many lookups miss
    the live honest host, per quorum. How censors answer (``behaviour``):

    - ``clique``: every FIND_NODE with the other censors only, every FIND_VALUE with their own
      records only and the other censors as closer peers;
    - ``far``: real honest peers, but the farthest from the target (plausible, useless), and their
      own records only;
    - ``empty``: FIND_NODE honestly, FIND_VALUE with no records and the other censors;
    - ``silent``: no answer at all (requests run out).

    ``client_trainers=False``: the trainers are DHT servers (as this scenario had them first), so
    every crashed one leaves a dead contact in the honest tables."""
    swarm = Swarm(size, seed, 0.0, trainers=0)
    net = swarm.net
    rng = swarm.rng
    swarm.cold_start()
    net.run_until(15.0)
    peers = [n for n in swarm.volunteers if n.alive]
    censors = rng.sample(peers, n_censors)
    censor_ids = {c.peer for c in censors}
    fellows = tuple(c.contact for c in censors)
    honest = [n for n in peers if n.peer not in censor_ids]
    honest_contacts = [n.contact for n in honest]

    def far(target: int) -> tuple:
        return tuple(sorted(honest_contacts, key=lambda c: -(c.id ^ target))[: CONFIG.k])

    def lie(request, response):
        if behaviour == "silent":
            return None
        if isinstance(response, Nodes):
            if behaviour == "far":
                return Nodes(far(int.from_bytes(request.target, "big")))
            return response if behaviour == "empty" else Nodes(fellows)
        if isinstance(response, Values):
            if behaviour == "empty":
                return Values(tuple(KeyResult((), fellows) for _ in response.results))
            return Values(tuple(
                KeyResult(tuple(r for r in res.records if r.signer in censor_ids),
                          far(key_id(key)) if behaviour == "far" else fellows)
                for key, res in zip(request.keys, response.results)))
        return response

    uids = [f"ffn.{i}.{j}" for i, j in zip(range(GRID), rng.sample(range(GRID), GRID))][: min(20, len(honest))]
    owner = {}
    for uid, host in zip(uids, rng.sample(honest, len(uids))):
        owner[uid] = host
        host.declare([uid])
    for censor in censors:
        censor.declare(uids)
    net.run_until(net.now + 12.0)  # two heartbeats everywhere, then the censors start lying
    for censor in censors:
        censor.censor = lie
    out = {}
    batch = 10  # fresh trainers join and look up together: the swarm's upkeep is paid once per batch
    for quorum in quorums:
        rows: list[tuple[bool, float, int]] = []  # (missed, seconds, requests)
        while len(rows) < lookups:
            pending = [0]

            def one(trainer: SimNode) -> None:
                uid = rng.choice(uids)
                key = expert_key(uid)
                t0, before = net.now, trainer.requests

                def done(found: dict) -> None:
                    alive = select_alive(found[key].values(), net.now, CONFIG)
                    rows.append((not any(d.peer == owner[uid].peer for d in alive), net.now - t0, trainer.requests - before))
                    pending[0] -= 1

                trainer.get_many([key], quorum, done)

            for _ in range(min(batch, lookups - len(rows))):
                # in client mode, as Swarm.join's: a crashed trainer leaves no dead contact behind
                trainer = swarm.new_peer(trainer=True, client=client_trainers)
                pending[0] += 1
                net.after(rng.uniform(0, 1.0), trainer.join, swarm.entry, lambda t=trainer: one(t))
            net.run_until(net.now + 60.0, stop=lambda: pending[0] == 0)
            for trainer in swarm.trainers:
                trainer.crash()  # one lookup per fresh trainer
        rows = rows[:lookups]
        out[quorum] = (sum(m for m, _, _ in rows), len(rows), statistics.median(t for _, t, _ in rows) * 1000,
                       sum(r for _, _, r in rows) / max(1, len(rows)))
    return out


def summary(rows: list[tuple[float, bool]]) -> tuple[float, float, float, int]:
    times = [t * 1000 for t, _ in rows]
    ok = sum(1 for _, good in rows if good)
    return pct(times, 0.5), pct(times, 0.99), 100.0 * ok / max(1, len(rows)), len(rows)


def steady_lines(out: dict, label: str = "") -> list[str]:
    """The steady state's figures, one per line (``label`` in front of each: ``sim``, ``real``),
    in the one format that ``benchmarks/scale_processes.py`` prints its real processes' in."""
    r = out["results"]
    e, g, b = summary(r["expert"]), summary(r["grid"]), summary(r["beam"])
    v, a = r["vanish"], r["appear"]
    probes = out["probes"]
    tag = f"{label:>5} " if label else "  "
    lines = [
        f"{tag}expert lookups (quorum {EXPERT_QUORUM}): p50 {e[0]:.0f} ms, p99 {e[1]:.0f} ms, success {e[2]:.2f} % of {e[3]}",
        f"{tag}grid lookups (ffn.i.):     p50 {g[0]:.0f} ms, p99 {g[1]:.0f} ms, success {g[2]:.2f} % of {g[3]}",
    ]
    if r["beam"]:
        lines.append(f"{tag}beam search beam 4, no cache: p50 {b[0]:.0f} ms, p99 {b[1]:.0f} ms, full beam {b[2]:.2f} % of {b[3]}")
    lines += [
        f"{tag}crashed volunteer's experts vanish after: median {statistics.median(v) if v else float('nan'):.1f} s, "
        f"max {max(v) if v else float('nan'):.1f} s ({len(v)}/{probes}; expiration {CONFIG.expert_expiration:g} s; "
        "counted when a poll, every second after the last returned, comes back without them)",
    ]
    if "stale" in r:
        stale = r["stale"]
        lines.append(
            f"{tag}a crashed volunteer's experts last returned to a trainer: "
            f"{max(stale) if stale else float('nan'):.1f} s after its crash at most ({len(stale)} answers held one)"
        )
    lines += [
        f"{tag}joiner's experts appear after: median {statistics.median(a) if a else float('nan'):.1f} s, "
        f"max {max(a) if a else float('nan'):.1f} s ({len(a)}/{probes}, from the joiner's start)",
        f"{tag}traffic per peer per minute: {out['msgs']:.0f} msgs, {out['bytes'] / 1024:.0f} KiB "
        f"(busiest peer {out['busiest_msgs']:.0f} msgs, {out['busiest_bytes'] / 1024:.0f} KiB)",
    ]
    return lines


def main() -> None:
    global CONFIG, JOIN_LOOKUPS, CRAWL_LOOKUPS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000], help="none: only the censor scenario")
    parser.add_argument("--minutes", type=float, default=1.0, help="virtual minutes of steady state per size")
    parser.add_argument("--cold-runs", type=int, default=3, help="cold starts checked for splits (10 for the full check)")
    parser.add_argument("--trainers", type=int, default=10)
    parser.add_argument("--nat-share", type=float, default=0.4)
    parser.add_argument("--churn", type=float, default=0.10, help="share of peers replaced per hour")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cold-only", action="store_true")
    parser.add_argument("--censor-lookups", type=int, default=0,
                        help="fresh trainers' lookups per quorum in a swarm with censors (0: skip)")
    parser.add_argument("--censor-swarm", type=int, nargs=2, default=[20, 100], metavar=("CENSORS", "SERVERS"),
                        help="censors among DHT servers (the relays come on top)")
    parser.add_argument("--censor-behaviour", choices=CENSOR_BEHAVIOURS, default="clique")
    parser.add_argument("--censor-quorums", type=int, nargs="+", default=[2, EXPERT_QUORUM])
    parser.add_argument("--censor-server-trainers", action="store_true",
                        help="fresh trainers as DHT servers: crashed, they leave dead contacts in honest tables")
    parser.add_argument("--disjoint-paths", type=int, default=CONFIG.disjoint_paths,
                        help="paths of a value lookup (DHTConfig.disjoint_paths; 1: one path, as before)")
    parser.add_argument("--join-lookups", type=int, default=JOIN_LOOKUPS,
                        help="random IDs a trainer looks up after itself (DHTConfig.join_lookups; 0: none, as before)")
    parser.add_argument("--crawl-lookups", type=int, default=CRAWL_LOOKUPS,
                        help="IDs spread over the key space a trainer looks up once joined (DHTConfig.crawl_lookups; 0: none, as before)")
    parser.add_argument("--silent-memory", type=float, default=CONFIG.silent_memory,
                        help="seconds a peer that timed out is routed around (DHTConfig.silent_memory; 1e-9: off, as before)")
    args = parser.parse_args()
    CONFIG = dataclasses.replace(CONFIG, disjoint_paths=args.disjoint_paths, silent_memory=args.silent_memory)
    JOIN_LOOKUPS = args.join_lookups
    CRAWL_LOOKUPS = args.crawl_lookups
    last = None
    if args.censor_lookups:
        wall = time.perf_counter()
        n_censors, servers = args.censor_swarm
        got = censored(servers + RELAYS, n_censors, args.seed, args.censor_lookups, tuple(args.censor_quorums),
                       args.censor_behaviour, client_trainers=not args.censor_server_trainers)
        print(f"[{servers} servers, {n_censors} censors ({args.censor_behaviour}), seed {args.seed}] fresh trainers' "
              f"lookups missing the live honest host: "
              + ", ".join(f"quorum {q}: {m} of {n} (median {t:.0f} ms, {r:.1f} requests)" for q, (m, n, t, r) in got.items())
              + f"  [{time.perf_counter() - wall:.0f} s wall]", flush=True)
    for size in args.sizes:
        wall = time.perf_counter()
        cold = cold_runs(size, args.cold_runs, args.seed, args.nat_share)
        splits = max(c[0] for c in cold)
        print(f"[{size} peers] cold start x{len(cold)} (all within 10 s, 3 relays as entry points, graph at 30 s): "
              f"splits {[c[0] for c in cold]}, largest strongly connected {min(c[1] for c in cold):.1%} of servers "
              f"(worst run), peers with an empty table {max(c[2] for c in cold)}  [{time.perf_counter() - wall:.0f} s wall]",
              flush=True)
        if args.cold_only:
            continue
        wall = time.perf_counter()
        out = steady(size, args.seed, args.nat_share, args.minutes, args.trainers, args.churn)
        e = summary(out["results"]["expert"])
        splits = max(splits, out["splits_cold"][0], out["splits_end"][0])
        print(f"[{size} peers] {args.minutes:g} virtual min, {args.nat_share:.0%} behind NAT (DHT clients, via relays), "
              f"churn {args.churn:.0%}/h ({out['churn']['crash']} crashes, {out['churn']['leave']} leaves incl. probes), "
              f"{args.trainers} trainers  [{time.perf_counter() - wall:.0f} s wall]")
        for line in steady_lines(out):
            print(line)
        print("  expert lookups by the trainer's region: " + ", ".join(
            f"{region} ({out['trainer_regions'].count(region)} trainers) p50 {pct(out['by_region'][region], 0.5) * 1000:.0f} ms"
            for region in REGIONS if region in out["by_region"]))
        print(f"  routing-table graph after the cold start / at the end: splits {out['splits_cold'][0]} / {out['splits_end'][0]}, "
              f"strongly connected {out['splits_cold'][1]:.1%} / {out['splits_end'][1]:.1%}", flush=True)
        last = (size, e, splits, out["msgs"])
    if last:
        size, e, splits, msgs = last
        print(f"scale: {size} peers, lookup p50 {e[0]:.0f} ms p99 {e[1]:.0f} ms, success {e[2]:.1f} %, "
              f"splits {splits}, {msgs:.0f} msgs/peer/min")


if __name__ == "__main__":
    main()
