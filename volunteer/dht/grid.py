"""The expert directory in the DHT: uid grammar, declarations, choosing hosts, and the lookups
over a running DHTNode (``get_experts``, ``walk_grid``,
``list_experts``, ``grid_experts``). Heartbeats that keep a host's experts declared are in
``declare.py`` (``ExpertDeclarer``).

Uids are ``prefix.i.j…``: a prefix (letters, digits, ``_``, ``-``) then one or more indices
(decimal, no leading zeros). A grid prefix is a uid's prefix plus some of its leading indices and a
trailing dot: ``ffn.3.5.7`` has grid prefixes ``ffn.3.`` and ``ffn.3.5.``.

A host declares, under sub-key = its PeerID bytes, one record per uid (key = the uid) and one per
grid prefix (key = the prefix). Every value is a msgpack map (a Declaration)::

    {"p": host PeerID bytes, "a": [multiaddr bytes], "l": load, "h": heartbeat time,
     "v": version,                                                       # uid records only
     "n": {next index: an expert uid of this host below that index},    # prefix records only
     "w": {next index: version of the uid "n" names there}}             # prefix records only

A version is the expert's count of optimizer updates (replicas: the freshest replica is the one
to catch up from). "v" and "w" are left out when zero, and absent decodes as 0, so records of
hosts that predate versions still decode.

Beam search over these records (``BeamSearch``, ``find_best_experts``) is ``beam.py``.

Timings for the driver (DHTConfig): re-declare every ``expert_update_period`` (5 s) with
expiration ``now + expert_expiration`` (15 s), so a crashed host's experts vanish within 20 s;
on leave, publish ``make_tombstones`` with the last expiration used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence, Union

import msgpack

from ..errors import DHTRecordError, ExpertUIDError, PeerIDError
from ..net.identity import PeerID
from .config import MAX_DECLARED_VERSION, MAX_GRID_DEPTH, MAX_GRID_INDEX, MAX_SYNCED_AGE, MAX_UID_LENGTH, DHTConfig
from .records import Record

if TYPE_CHECKING:
    from .node import DHTNode

DELIMITER = "."
_UID = re.compile(r"^([A-Za-z0-9_-]+)((?:\.(?:0|[1-9][0-9]*))+)$")
_PREFIX = re.compile(r"^([A-Za-z0-9_-]+)\.((?:(?:0|[1-9][0-9]*)\.)*)$")

Found = Union[Mapping[bytes, Record], Iterable[Record]]


# --- uid grammar ---------------------------------------------------------------------------
def parse_uid(uid: str) -> tuple[str, tuple[int, ...]]:
    """Split ``ffn.3.5`` into ``("ffn", (3, 5))``; raises ExpertUIDError."""
    match = _UID.match(uid) if isinstance(uid, str) and len(uid) <= MAX_UID_LENGTH else None
    if match is None:
        raise ExpertUIDError(f"invalid expert uid {uid!r}: expected prefix.i.j with non-negative indices")
    coords = tuple(int(x) for x in match.group(2)[1:].split(DELIMITER))
    if len(coords) > MAX_GRID_DEPTH or max(coords) >= MAX_GRID_INDEX:
        raise ExpertUIDError(f"expert uid {uid!r} is deeper or wider than the grid limits")
    return match.group(1), coords


def parse_prefix(prefix: str) -> tuple[str, tuple[int, ...]]:
    """Split a grid prefix ``ffn.3.`` into ``("ffn", (3,))``; raises ExpertUIDError."""
    match = _PREFIX.match(prefix) if isinstance(prefix, str) and len(prefix) <= MAX_UID_LENGTH else None
    if match is None:
        raise ExpertUIDError(f"invalid grid prefix {prefix!r}: expected prefix. or prefix.i.")
    coords = tuple(int(x) for x in match.group(2).split(DELIMITER) if x)
    return match.group(1), coords


def is_valid_uid(uid: object) -> bool:
    """Whether ``uid`` follows the grammar."""
    try:
        parse_uid(uid)  # type: ignore[arg-type]
    except ExpertUIDError:
        return False
    return True


def make_uid(prefix: str, coords: Sequence[int]) -> str:
    """``make_uid("ffn", [3, 5]) == "ffn.3.5"`` (validated)."""
    uid = DELIMITER.join([prefix, *(str(int(c)) for c in coords)])
    parse_uid(uid)
    return uid


def grid_prefixes(uid: str) -> list[str]:
    """The grid prefixes a uid is declared under: ``ffn.3.5.7`` → ``["ffn.", "ffn.3.", "ffn.3.5."]``.

    The root (``ffn.``) lets ``volunteer experts`` list a grid without knowing its size."""
    name, coords = parse_uid(uid)
    return [DELIMITER.join([name, *map(str, coords[:n])]) + DELIMITER for n in range(0, len(coords))]


def expert_key(uid_or_prefix: str) -> bytes:
    """The DHT key of a uid or grid prefix."""
    return uid_or_prefix.encode("ascii")


# --- declarations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HostInfo:
    """What a host says about itself in every declaration."""

    peer: PeerID
    addrs: tuple[bytes, ...] = ()
    load: float = 0.0


def _is_version(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DECLARED_VERSION


def _is_synced_age(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= MAX_SYNCED_AGE)


@dataclass(frozen=True)
class Declaration:
    """A decoded declaration value; ``expiration`` comes from its record (0 if not from one).

    ``version``: the expert's version (uid records; for a uid found through a prefix record, the
    version that record lists for it, see ``for_child``). ``child_versions``: prefix records'
    (next index, version of the uid ``children`` names there), only the non-zero ones."""

    peer: PeerID
    addrs: tuple[bytes, ...]
    load: float
    heartbeat: float
    children: tuple[tuple[int, str], ...] = ()  # prefix records: (next index, a uid below it)
    expiration: float = 0.0
    version: int = 0
    child_versions: tuple[tuple[int, int], ...] = ()
    # uid records of replicated experts: seconds between the replicas' last averaging and this
    # heartbeat ("y"; a duration, so no clock crosses the wire); None: never synced
    synced_age: float | None = None
    # prefix records: (next index, sync age of the uid ``children`` names there), for the synced
    # ones ("z"): a trainer's grid walk learns how far replicas may have drifted apart
    child_synced_ages: tuple[tuple[int, float], ...] = ()

    def encode(self) -> bytes:
        """The msgpack value stored in the DHT."""
        msg: dict = {
            "p": self.peer.to_bytes(),
            "a": list(self.addrs),
            "l": float(self.load),
            "h": float(self.heartbeat),
        }
        if self.version:
            msg["v"] = int(self.version)
        if self.synced_age is not None:
            msg["y"] = float(self.synced_age)
        if self.children:
            msg["n"] = {int(c): uid for c, uid in self.children}
        versions = {int(c): int(v) for c, v in self.child_versions if v}
        if versions:
            msg["w"] = versions
        if self.child_synced_ages:
            msg["z"] = {int(c): float(age) for c, age in self.child_synced_ages}
        return msgpack.packb(msg, use_bin_type=True)

    def for_child(self, index: int) -> "Declaration":
        """This prefix record as the declaration of the uid it lists under ``index``: same host,
        load and heartbeat, with that uid's version and sync age."""
        return replace(self, version=dict(self.child_versions).get(index, 0),
                       synced_age=dict(self.child_synced_ages).get(index))

    @classmethod
    def decode(cls, data: bytes, config: DHTConfig, expiration: float = 0.0) -> "Declaration":
        """Parse a value; raises DHTRecordError (code ``bad-declaration``) for anything malformed."""
        if len(data) > config.max_value_size:
            raise DHTRecordError("declaration too large", "bad-declaration")
        try:
            msg = msgpack.unpackb(
                data, raw=False, strict_map_key=False, max_ext_len=0
            )
        except Exception:  # msgpack raises several unrelated types
            raise DHTRecordError("declaration is not msgpack", "bad-declaration") from None
        try:
            peer = PeerID.from_bytes(msg["p"])
            addrs = tuple(msg.get("a", ()))
            load, heartbeat = msg["l"], msg["h"]
            children = msg.get("n", {})
            version = msg.get("v", 0)
            child_versions = msg.get("w", {})
            synced_age = msg.get("y")
            child_ages = msg.get("z", {})
            ok = (
                len(addrs) <= config.max_addrs
                and all(isinstance(a, bytes) and len(a) <= config.max_addr_size for a in addrs)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (load, heartbeat))
                and math.isfinite(load)
                and math.isfinite(heartbeat)
                and isinstance(children, dict)
                and all(
                    isinstance(c, int) and not isinstance(c, bool) and isinstance(u, str) for c, u in children.items()
                )
                and _is_version(version)
                and isinstance(child_versions, dict)
                and all(c in children and _is_version(v) for c, v in child_versions.items())
                and (synced_age is None or _is_synced_age(synced_age))
                and isinstance(child_ages, dict)
                and all(c in children and _is_synced_age(a) for c, a in child_ages.items())
            )
        except (TypeError, KeyError, AttributeError, ValueError, PeerIDError):
            ok = False
        if not ok:
            raise DHTRecordError("declaration has missing or mistyped fields", "bad-declaration")
        return cls(
            peer, addrs, float(load), float(heartbeat), tuple(sorted(children.items())), expiration,
            version, tuple(sorted((c, v) for c, v in child_versions.items() if v)),
            None if synced_age is None else float(synced_age),
            tuple(sorted((c, float(a)) for c, a in child_ages.items())),
        )


def make_declarations(
    uids: Iterable[str],
    host: HostInfo,
    now: float,
    expiration: float,
    *,
    loads: Mapping[str, float] | None = None,
    versions: Mapping[str, int] | None = None,
    synced_ages: Mapping[str, float] | None = None,
    config: DHTConfig | None = None,
) -> list[tuple[bytes, bytes, bytes, float]]:
    """``(key, sub-key, value, expiration)`` for every uid and grid prefix of this host.

    One record per uid (its own load from ``loads``, else the host's; its version from
    ``versions``, else 0) and one per grid prefix listing, for each next index, one of the host's
    uids below it (the least loaded) with that uid's version. Sign each with ``records.sign`` and
    store them on the closest peers of each key. Raises DHTRecordError for a version out of range.
    """
    config = config or DHTConfig()
    loads = loads or {}
    versions = versions or {}
    subkey = host.peer.to_bytes()
    uids = sorted(set(uids))
    for uid in uids:
        if not _is_version(versions.get(uid, 0)):
            raise DHTRecordError(f"version of {uid!r} must be an int in 0..2**63-1", "bad-declaration")
    children: dict[str, dict[int, str]] = {}
    out = []
    for uid in uids:
        name, coords = parse_uid(uid)
        load = float(loads.get(uid, host.load))
        age = (synced_ages or {}).get(uid)
        decl = Declaration(host.peer, host.addrs, load, now, version=versions.get(uid, 0),
                           synced_age=None if age is None else min(max(0.0, float(age)), MAX_SYNCED_AGE))
        out.append((expert_key(uid), subkey, decl.encode(), float(expiration)))
        for depth, prefix in enumerate(grid_prefixes(uid)):
            below = children.setdefault(prefix, {})
            best = below.get(coords[depth])
            if best is None or loads.get(uid, host.load) < loads.get(best, host.load):
                below[coords[depth]] = uid
    for prefix, below in sorted(children.items()):
        listed = tuple(sorted(below.items()))
        child_versions = tuple((c, versions.get(uid, 0)) for c, uid in listed)
        child_ages = tuple(
            (c, min(max(0.0, float(ages[uid])), MAX_SYNCED_AGE)) for c, uid in listed if uid in (ages := synced_ages or {})
        )
        decl = Declaration(host.peer, host.addrs, float(host.load), now, listed, child_versions=child_versions,
                           child_synced_ages=child_ages)
        out.append((expert_key(prefix), subkey, decl.encode(), float(expiration)))
    for key, _, value, _ in out:
        if len(value) > config.max_value_size:
            raise DHTRecordError(f"declaration for {key!r} exceeds max_value_size", "too-large")
    return out


def make_tombstones(
    uids: Iterable[str], peer: PeerID, expiration: float, *, prefixes: bool = True
) -> list[tuple[bytes, bytes, None, float]]:
    """Tombstones for every key ``make_declarations`` wrote; ``expiration`` = the last one declared.
    ``prefixes=False``: the uid records only (the prefix records still list other uids of ours)."""
    keys = set()
    for uid in uids:
        keys.add(uid)
        if prefixes:
            keys.update(grid_prefixes(uid))
    return [(expert_key(k), peer.to_bytes(), None, float(expiration)) for k in sorted(keys)]


def _records(found: Found) -> Iterable[Record]:
    return found.values() if isinstance(found, Mapping) else found


def select_alive(found: Found, now: float, config: DHTConfig | None = None) -> list[Declaration]:
    """Declarations of hosts alive at ``now``, best first.

    Skips tombstones, expired records and values that do not decode or that name a host other
    than the record's signer. Order: fresh heartbeats before stale ones (older than
    ``heartbeat_stale``), then lowest load, then newest heartbeat.
    """
    config = config or DHTConfig()
    alive = []
    for record in _records(found):
        if record.value is None or record.expiration <= now:
            continue
        try:
            decl = Declaration.decode(record.value, config, record.expiration)
        except DHTRecordError:
            continue
        if decl.peer != record.signer:
            continue
        alive.append(decl)
    stale_before = now - config.heartbeat_stale
    alive.sort(key=lambda d: (d.heartbeat < stale_before, d.load, -d.heartbeat))
    return alive


# --- the directory over a running DHTNode ------------------------------------------------------
# A trainer's expert lookups need this many peers' records for a key (and, besides, answers from
# the key's closest known peers: ``DHTConfig.value_witnesses``, what beats censors). Every host
# stores its declarations on the same closest peers of a key, so two holders almost always have
# every host's sub-key; but two censors among a key's holders (DHT servers that answer with their
# own records and each other only) answer first often enough to hide an honest host: in the
# 10-node simulation (tests/unit/test_dht_query.py) quorum 2 missed the live honest host in 11 of
# 400 fresh lookups (82 before a value lookup asked past stale reporters), quorum 3 in none. Beam
# search keeps BEAM_QUORUM (2): it runs every step, reuses its lookups for expert_cache_age,
# and the mixture's view of the grid (``grid_experts``, GRID_QUORUM) is what picks hosts.
EXPERT_QUORUM = 3
# Holders whose answers end a beam search's prefix lookups: quorum 3 made a 64x64 beam search ~10%
# slower on loopback (31.5 vs 28.2 ms median, benchmarks/dht.py).
BEAM_QUORUM = 2
# A mixture's view of a whole grid (``grid_experts``: which hosts serve each uid, refreshed in the
# background, off the step's path) merges one holder more. Holders that lack some hosts' records
# (a key's closest peers changed since those hosts' last heartbeat) or censor them (answer with
# their own only) would otherwise leave the trainer a host short: in the 10-node simulation with
# two censors (tests/unit/test_dht_query.py) quorum 2 missed the honest host in 53 to 97 of 400 lookups,
# quorum 3 in none; in the digits runs the trainer's audits often found no third replica.
GRID_QUORUM = 3
# A cold beam search fetches a grid's whole first dimension at once when it has at most this many
# keys (max_keys_per_request: one FIND_VALUE per peer asked); wider grids fetch what they need.
GRID_PREFETCH_KEYS = 64


def survey_quorum(dht: DHTNode) -> int:
    """The quorum of a survey that decides placement, catch-up, sync or a hand-off: every one of
    the k closest peers that holds the key answers (S/Kademlia's many paths as the model), so two
    holders that answer with their own records only cannot hide the others, as they can from a
    trainer's quorum of ``EXPERT_QUORUM``."""
    return dht.config.k


async def get_experts(
    dht: DHTNode, uids: Iterable[str], *, max_age: float = 0.0, quorum: int = EXPERT_QUORUM
) -> dict[str, list[Declaration]]:
    """Hosts serving each uid now, best first (fresh heartbeat, then lowest load); ``max_age`` as in
    ``DHTNode.get_many``; ``quorum``: how many holders' answers end the lookup (``survey_quorum``)."""
    uids = [u for u in dict.fromkeys(uids)]
    found = await dht.get_many([expert_key(u) for u in uids], quorum=quorum, max_age=max_age)
    now = dht.clock()
    return {uid: select_alive(found[expert_key(uid)], now, dht.config) for uid in uids}


def select_left(found: Found, now: float) -> frozenset[PeerID]:
    """The hosts whose record in ``found`` is an unexpired tombstone: a signed "I left" (a
    graceful leave publishes them before handing its experts off)."""
    return frozenset(
        record.signer
        for record in _records(found)
        if record.value is None and record.expiration > now
    )


async def get_hosts_and_leavers(
    dht: DHTNode, uid: str, *, quorum: int = EXPERT_QUORUM
) -> tuple[list[Declaration], frozenset[PeerID]]:
    """``get_experts`` of one uid, plus the hosts that tombstoned it (``select_left``)."""
    key = expert_key(uid)
    found = await dht.get_many([key], quorum=quorum, tombstones=True)
    now = dht.clock()
    return select_alive(found[key], now, dht.config), select_left(found[key], now)


async def walk_grid(
    dht: DHTNode, prefix: str, *, depth: int | None = None, limit: int = 4096, quorum: int = EXPERT_QUORUM
) -> dict[str, list[Declaration]]:
    """Live experts under ``prefix`` from the grid's prefix records alone, one batched round per
    level: ``{uid: [hosts that list it, best first]}``. A host's record under ``name.i.`` names
    one of its uids per next index (``name.i.j`` itself at the last level), so every (uid, host)
    pair of a grid shows up. ``depth`` stops after that many levels (a grid's dimensions);
    ``limit`` bounds the prefixes fetched; ``quorum``: holders whose answers end each key's lookup."""
    level = [prefix.rstrip(".") + "."]
    result: dict[str, list[Declaration]] = {}
    fetched = 0
    for _ in range(depth or 64):
        fetched += len(level)
        found = await dht.get_many([expert_key(p) for p in level], quorum=quorum)
        now = dht.clock()
        next_level: set[str] = set()
        for key in level:
            for decl in select_alive(found[expert_key(key)], now, dht.config):
                for index, uid in decl.children:
                    if uid == f"{key}{index}" and is_valid_uid(uid):
                        result.setdefault(uid, []).append(decl.for_child(index))  # a leaf at this level
                    elif uid.startswith(f"{key}{index}."):
                        next_level.add(f"{key}{index}.")
        level = sorted(next_level)[: max(0, limit - fetched)]
        if not level:
            break
    return result


async def list_experts(dht: DHTNode, prefix: str, *, limit: int = 4096) -> dict[str, list[Declaration]]:
    """Every live expert under ``prefix`` at any depth, with each uid's own records (per-expert
    load and heartbeat): what ``volunteer experts`` shows."""
    uids = await walk_grid(dht, prefix, limit=limit)
    hosts = await get_experts(dht, sorted(uids))
    return {uid: decls for uid, decls in hosts.items() if decls}


async def grid_experts(
    dht: DHTNode, prefix: str, depth: int, *, quorum: int = GRID_QUORUM
) -> dict[str, list[Declaration]]:
    """Every live expert of a ``depth``-dimensional grid in ``depth`` rounds (mixtures of experts
    cache this between batches), each key merged from ``quorum`` holders' answers."""
    found = await walk_grid(dht, prefix, depth=depth, quorum=quorum)
    return {uid: hosts for uid, hosts in found.items() if uid.count(".") == depth}


__all__ = [
    "Declaration",
    "BEAM_QUORUM",
    "EXPERT_QUORUM",
    "GRID_QUORUM",
    "HostInfo",
    "expert_key",
    "get_experts",
    "grid_experts",
    "grid_prefixes",
    "is_valid_uid",
    "list_experts",
    "make_declarations",
    "make_tombstones",
    "get_hosts_and_leavers",
    "select_left",
    "survey_quorum",
    "make_uid",
    "parse_prefix",
    "parse_uid",
    "select_alive",
    "walk_grid",
]
