"""Every bound and timing of the DHT, in one dataclass (see DESIGN.md, "Limits are part of the protocol").

The sans-I/O cores (messages, routing, records, query, experts) take a ``DHTConfig``; tests pass
smaller values. The numbers below are chosen for a swarm of a few hundred to a few thousand
volunteers whose experts re-declare every ``expert_update_period`` seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..net.limits import MAX_MULTIADDR_BYTES, MAX_PEER_ID_BYTES

# uid grammar (experts.py); these are format rules, not tunables.
MAX_UID_LENGTH = 256
MAX_GRID_DEPTH = 8  # indices after the prefix
MAX_GRID_INDEX = 2**20  # an index is below this, so a coordinate fits in msgpack's small ints
# an expert's declared version (its count of optimizer updates) is 0..this: a signed 64-bit int,
# the range replica state transfer accepts too
MAX_DECLARED_VERSION = 2**63 - 1
MAX_SYNCED_AGE = 365 * 24 * 3600.0  # a declared "seconds since the replicas last averaged" beyond a year is nonsense


TRAINER_BUCKET_SIZE = 512  # a trainer's buckets: up to ~7k contacts in a 10k-peer swarm, a few MB
# A trainer's join looks up this many random far IDs after itself (DHTConfig.join_lookups). Its
# self-lookup alone fills the table with whoever answers near its ID, and censors name only each
# other: a fresh trainer so joined knew all 20 censors of 100 servers beside 20 honest peers, and
# its lookups began among them (benchmarks/scale.py --censor-server-trainers: the table now holds
# honest peers that honest replies named all over the key space).
TRAINER_JOIN_LOOKUPS = 3
# ... and, once joined, these spread over the whole key space (DHTConfig.crawl_lookups): about 20
# servers each, so about 640 servers known at most from a crawl; past that a trainer's table
# fills from its lookups' answers
TRAINER_CRAWL_LOOKUPS = 32


@dataclass(frozen=True)
class DHTConfig:
    """Bounds and timings of one DHT node. Frozen: share one instance freely."""

    swarm_id: str = "default"  # part of the protocol id: swarms never mix
    k: int = 20  # bucket size, lookup result size
    # Contacts one bucket holds (None: k). A trainer keeps wide buckets (TRAINER_BUCKET_SIZE):
    # a value lookup is done when a quorum of the key's few holders answered, and a table that
    # already knows them asks them in its first round instead of learning of them in a second
    # (benchmarks/scale.py, 1,000 peers: expert lookups p50 243 ms with 20, 178 with 1,000)
    bucket_size: int | None = None
    # Copies of a record that ``store`` writes (the k closest peers before). Each STORE target and
    # the lookup that finds it cost a request, and on a loaded machine a store's cost is its
    # request count (benchmarks/dht.py, 32 nodes: k=20 took 43.5 requests a store, 8 took 19.5,
    # 5 took 13.5, with throughput in proportion). 5 is what expert declarations use and what
    # hivemind uses for everything; it leaves value_quorum (3) holders to a lookup, and in the
    # 200-node simulation (tests/integration/test_dht_swarm_sim.py) every key survived 20% of the
    # nodes crashing at once (a key is lost only when all 5 of its holders go before the next
    # re-publication: 0.2**5 = 0.03% there). Pass ``replicas=`` for a record that must outlive more.
    # (Since then a one-key store's STOREs also answer its lookup: ~7.5 requests at 5 replicas.)
    store_replicas: int = 5
    # Queries in flight per lookup. Measured (benchmarks/dht_alpha.py: 100 nodes, 20% silent,
    # 80 ms RTT): α=3 took 0.16 s median but 2.1 s at p95 (slots stuck on silent peers until
    # slot_timeout); α=5 took 0.08 s median and 0.16 s p95 for 5.5 requests a lookup instead of
    # 4.3; α=8 was no faster and cost 8.3. Volunteers die silently often, so 5.
    alpha: int = 5
    # contacts per key in a reply. More than k: volunteers churn, so tables hold dead contacts
    # between checks, and a reply of only k would often hide the k-th closest live peer (in a
    # simulation with 20% dead, recall of the true k closest went from ~98.5% to 100%).
    reply_contacts: int = 30
    # ... of which at most this many never answered a request of ours (they only sent us one),
    # unless proven contacts run short. A peer that looked something up and crashed is in every
    # table it asked; handing it out unchecked made honest replies mostly dead contacts once such
    # peers outnumbered the servers, and a censoring clique (whose contacts all answer) the only
    # peers a fresh trainer heard from (benchmarks/scale.py --censor-server-trainers: 10 such
    # places missed 0, 2, 2 of 100 lookups over seeds 1-3, 3 places 0-1). A newcomer is proven by
    # the first lookup of ours that reaches it, or earlier by a ping-before-evict.
    unproven_reply_contacts: int = 3
    value_quorum: int = 3  # a value lookup stops once this many peers returned records for the key
    # ... and once w of the w + s closest peers it knows answered, w = min(quorum + s, this) and
    # s = witness_spares: any peer can return valid records, so a quorum met by whoever answers
    # first lets censors that leave out others' records end the lookup (benchmarks/scale.py
    # --censor-lookups). The closest places are where publishers write (expert_replicas), a
    # peer's place is sha256 of its PeerID, and censors answer first at best: a record is hidden
    # only where censors hold w of those w + s places on every path (disjoint_paths). 5 of 8 per
    # path (an expert lookup's; a beam search's too): with a fifth of the servers censoring,
    # 1.0 % of one path's windows by the binomial, about 0.01 % of keys over two (6 of 9: 0.31 %
    # and 0.001 %). A path waits for the 5th of its 8 round trips rather than the 6th of 9: on the
    # emulated internet expert lookups took p50 191 ms, not 230 (benchmarks/scale.py --seed 2,
    # 1,000 peers). Each path still hears one of the key's 9 holders (expert_replicas): its 8
    # places hold 4 or 5 of them, so 5 answers include one. See query.ValueLookup.
    value_witnesses: int = 5
    witness_spares: int = 3
    # A value lookup runs over this many disjoint paths (S/Kademlia): the table's closest peers
    # are dealt out to them, each path learns only from the peers it asked, and no peer is asked
    # by two. Censors then steer only the paths that asked them, and each path must hear its own
    # window: a table that knows mostly censors no longer lets six of them end the lookup (see
    # query.ValueLookup, benchmarks/scale.py --censor-server-trainers).
    disjoint_paths: int = 2
    # A joiner looks up this many random IDs after itself, one in each of the farthest buckets
    # (half, a quarter, an eighth of the key space). A trainer's node (client mode: nobody asks
    # it, so its table holds only whoever answered it) does, TRAINER_JOIN_LOOKUPS; a server's
    # table fills from those who ask it, and three more lookups for each of a thousand peers
    # starting at once cost the cold start four times the work.
    join_lookups: int = 0
    # Once joined, a trainer looks up this many IDs spread evenly over the key space, a few at a
    # time (crawl_parallel), in the background: its wide buckets then hold most servers, each
    # timed by its answer, so a value lookup's windows are the key's true closest peers from its
    # first round and deal() can balance its paths by round trip. A trainer held about half of
    # the 606 servers of a 1,000-peer swarm after its join (benchmarks/scale.py), and its expert
    # lookups asked again once replies named the closer peers it did not know.
    crawl_lookups: int = 0
    crawl_parallel: int = 4

    # --- timings (seconds) -------------------------------------------------------------
    request_timeout: float = 5.0  # one request/response round trip
    lookup_deadline: float = 15.0  # a whole lookup, however many peers it asks
    # a lookup stops counting a request against alpha after this long (the request itself runs
    # on until request_timeout, and a late answer still counts): silent or made-up contacts then
    # cost a lookup 2 s of one slot, not 5
    slot_timeout: float = 2.0
    ping_timeout: float = 5.0  # ping-before-evict: the old contact has this long to answer
    failure_backoff: float = 1.0  # first back-off after a failed request, doubled per failure
    max_failure_backoff: float = 60.0
    max_failures: int = 3  # consecutive failures that evict a contact from the routing table
    liveness_check_age: float = 120.0  # ping contacts not heard from for this long (driver sweep)
    # A peer whose request ran past slot_timeout or failed is routed around this long, unless it
    # answers or speaks to us first: lookups neither ask it nor wait for it while others are left
    # (a silently crashed peer cost every lookup whose window held it a slot timeout, 2 s, until
    # three failures evicted it; crashed peers that asked honest servers once filled a ten-server
    # swarm's replies). See query.Lookup and RoutingTable.suspect.
    silent_memory: float = 60.0

    # --- routing table -------------------------------------------------------------------
    replacement_cache_size: int = 20  # per bucket: contacts waiting for a free slot
    max_silent_peers: int = 4096  # peers remembered as unresponsive (silent_memory), oldest forgotten first
    lookup_max_peers: int = 200  # candidates one lookup tracks; farther ones are forgotten

    # --- messages ---------------------------------------------------------------------------
    max_message_size: int = 1024 * 1024  # one length-prefixed msgpack body
    max_contacts: int = 2048  # contacts in one reply: reply_contacts per key for a FIND_VALUE batch
    max_addrs: int = 16  # multiaddrs per contact
    max_addr_size: int = MAX_MULTIADDR_BYTES
    max_peer_id_size: int = MAX_PEER_ID_BYTES
    max_keys_per_request: int = 64  # FIND_VALUE keys batched in one request
    max_records_per_request: int = 1024  # STORE records batched in one request, or per key in a reply
    max_error_text: int = 512

    # --- records ------------------------------------------------------------------------------
    max_key_size: int = 256
    max_subkey_size: int = 256
    max_value_size: int = 8 * 1024
    max_signature_size: int = 512  # Ed25519 signs in 64 bytes; leave room for RSA keys' 512
    max_subkeys_per_key: int = 1024  # e.g. hosts declaring under one grid prefix
    # One signer's share of any key. An honest host declares under one sub-key (its PeerID); a
    # little room for owners' suffixes, but one identity can no longer fill a grid's prefix key
    # with 1,024 far-future sub-keys and push every honest heartbeat out. A full key
    # then makes room at the expense of the largest holder, by source address and then by signer
    # (``records.Storage``), so many identities from one address cannot do it either.
    max_subkeys_per_signer_per_key: int = 4
    max_records_per_signer: int = 1024  # what one publishing peer may keep in our storage
    max_total_records: int = 100_000
    max_total_bytes: int = 64 * 1024 * 1024  # keys + sub-keys + values + signatures held
    max_ttl: float = 3600.0  # records must be refreshed at least this often
    max_clock_skew: float = 30.0  # publishers' clocks may run this far ahead of ours

    # --- inbound rate limits (NodeState.handle) --------------------------------------------
    # Per peer: a busy trainer's beam search batches ~64 keys a FIND_VALUE and a few per step,
    # a heartbeat one STORE per close peer every few seconds; these leave honest peers 10-100x
    # headroom and stop one identity's flood at the door, before decoding its records.
    request_rate: float = 500.0  # requests per second per peer
    request_burst: float = 2000.0
    store_rate: float = 2000.0  # records per second per peer (a STORE costs its record count)
    store_burst: float = 8000.0
    # Per source address (IPv4 /32, IPv6 /64, a relay): identities are free to mint, addresses
    # are not. Four times a peer's allowance: a home NAT or a lab may hold several volunteers.
    source_request_rate: float = 2000.0
    source_request_burst: float = 8000.0
    source_store_rate: float = 8000.0
    source_store_burst: float = 32000.0
    rate_limit_keys: int = 4096  # peers (and addresses) whose buckets are remembered

    # --- live experts (used by the driver) -------------------------------------------------
    expert_update_period: float = 5.0  # hosts re-declare their experts this often
    # Declarations are re-sent every few seconds, so they go to fewer peers than other records
    # (k): a few holders survive churn between two heartbeats, and heartbeat traffic drops 2-4x.
    # As many as a value lookup's witness window (value_witnesses + witness_spares), where it looks.
    expert_replicas: int = 9
    expert_expiration: float = 15.0  # declarations live this long: a crashed host vanishes in < 20 s
    heartbeat_stale: float = 10.0  # a declaration whose heartbeat is older than this is a last resort
    # Beam search reuses a grid key's lookup this long by default (find_best_experts(max_age=)).
    # A leaver's tombstones reach the cache at once (watch.py), a crashed host's records expire
    # in it as anywhere; what it delays is a new host's experts and load changes, by at most
    # this: one heartbeat period, the delay any reader already has for a load change.
    expert_cache_age: float = 5.0

    # --- tombstone forwarding to caching readers (watch.py) ---------------------------------
    watch_age: float = 10.0  # a holder forwards a key's tombstones to its readers this long after a read
    max_watched_keys: int = 4096  # keys a holder keeps readers of
    max_watchers_per_key: int = 32  # readers per key (the oldest dropped)
    watch_forward_timeout: float = 1.0  # a STORE's answer waits at most this for the forwards it caused

    @classmethod
    def for_trainer(cls, swarm_id: str, **options) -> "DHTConfig":
        """The configuration of a trainer's DHT node: wide buckets (``TRAINER_BUCKET_SIZE``),
        lookups all over the key space on joining (``TRAINER_JOIN_LOOKUPS``), and a crawl once
        joined (``TRAINER_CRAWL_LOOKUPS``)."""
        return cls(swarm_id=swarm_id, **{"bucket_size": TRAINER_BUCKET_SIZE, "join_lookups": TRAINER_JOIN_LOOKUPS,
                                          "crawl_lookups": TRAINER_CRAWL_LOOKUPS, **options})

    @property
    def bucket_capacity(self) -> int:
        """Contacts one bucket of the routing table holds."""
        return self.k if self.bucket_size is None else self.bucket_size

    def __post_init__(self) -> None:
        if not self.swarm_id or "/" in self.swarm_id or len(self.swarm_id) > 64:
            raise ValueError(f"swarm_id must be 1..64 characters without '/': {self.swarm_id!r}")
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or field.name == "swarm_id" or (field.name == "bucket_size" and value is None):
                continue
            if field.name in ("join_lookups", "crawl_lookups") and value == 0:
                continue  # a joiner that only looks itself up (a server)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"DHTConfig.{field.name} must be a positive number, not {value!r}")
        if self.expert_expiration <= self.expert_update_period:
            raise ValueError("expert_expiration must exceed expert_update_period")
        if self.watch_age < self.expert_cache_age:
            raise ValueError("watch_age must be at least expert_cache_age (tombstones must reach every cache)")

    @property
    def protocol_id(self) -> str:
        """The stream protocol, e.g. ``/volunteer/default/dht/1.0.0``."""
        return protocol_id(self.swarm_id)


def protocol_id(swarm_id: str) -> str:
    """The DHT stream protocol of a swarm."""
    return f"/volunteer/{swarm_id}/dht/1.0.0"
