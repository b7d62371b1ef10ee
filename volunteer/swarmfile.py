"""What a swarm file and ``config.toml`` say, and the ``--experts`` grid syntax.

Where the files live is ``volunteer.paths`` (re-exported here for the callers that import it
from this module). Swarm files and the config file are validated alike by the settings schema
(``volunteer.settings``: ``validate_table``, each setting's type and check): an unknown key is one
line naming it and the known ones, and every value's type and range is checked.

A swarm file (TOML)::

    name = "demo"                       # what users type: volunteer join demo
    id = "demo"                         # protocol swarm id (default: name); swarms never mix
    kind = "volunteer"                  # or "hivemind": a hivemind 1.1 swarm (bootstrap = its
                                        # initial peers; id never goes on hivemind's wire)
    bootstrap = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
    relays = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
    trainers = "open"                   # who may train: "open" (default), or ["12D3KooW...", ...]
    organiser = "CAESIK..."             # optional: certificates this key signs admit trainers
    forwards = "everyone"               # or "trainers": forwards answered for admitted ones only
    receipts = true                     # exact audits (signed receipts, snapshots, recompute):
                                        # the default for our kind; false opts out (a hivemind
                                        # swarm has none)
    [experts]                           # defaults for `join` (flags win)
    experts = "ffn:expert.[0:4].[0:4]"
    hidden_dim = 64
    [[grid]]                            # the swarm's experts: placement, replicas, trainers
    prefix = "expert"
    size = [4, 8]
    expert = "ffn"
    hidden_dim = 1024
    replicas = 2
    sync_period = 30                    # optional, seconds

``volunteer testnet`` marks the swarm file it writes with a ``[testnet]`` table (its ``pid``), so
that it is removed when that testnet stops and a real swarm's file is never overwritten.
"""

from __future__ import annotations

import base64
import itertools
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import tomli_w

from .dht.config import MAX_GRID_DEPTH, MAX_GRID_INDEX, MAX_UID_LENGTH
from .dht.grid import DELIMITER, parse_uid
from .errors import VolunteerError
from .net.identity import PeerID, PublicKey
from .net.multiaddr import Multiaddr
from .settings import (
    CONFIG_CHECKS,
    CONFIG_KEYS,
    JOIN_CHECKS,
    JOIN_SETTINGS,
    LIMIT_SETTINGS,
    MULTIADDR_LIST,
    SwarmFileError,
    validate_table,
)
from .paths import config_dir, config_file, identity_path, runtime_dir, state_dir, swarms_dir


class GridSpecError(SwarmFileError, ValueError):
    """A ``[[grid]]`` table of a swarm file is malformed (missing key, wrong type, bad value)."""


# --- the swarm's grids ([[grid]]): trainers and volunteers (placement, replica sync) read them ----
DEFAULT_SYNC_PERIOD = 30.0  # seconds between replica syncs of a grid that sets no sync_period
MAX_GRID_EXPERTS = 1 << 16  # uids in one grid: placement enumerates them every re-check
MAX_REPLICAS = 64
MAX_GRIDS = 64
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CLASS = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEYS = ("prefix", "size", "expert", "hidden_dim", "replicas", "sync_period")


@dataclass(frozen=True)
class GridSpec:
    """One grid of experts the swarm keeps: ``prefix.i.j`` for every index below ``size``, each of
    class ``expert_class`` and width ``hidden_dim``, held by ``replicas`` volunteers that average
    their parameters every ``sync_period`` seconds."""

    prefix: str
    size: tuple[int, ...]
    expert_class: str
    hidden_dim: int
    replicas: int = 1
    sync_period: float = DEFAULT_SYNC_PERIOD

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", tuple(self.size))
        if not isinstance(self.prefix, str) or not _PREFIX.match(self.prefix):
            raise GridSpecError(f"grid prefix {self.prefix!r}: use 1-64 letters, digits, '_' or '-'")
        if not 1 <= len(self.size) <= MAX_GRID_DEPTH:
            raise GridSpecError(f"grid {self.prefix!r}: size needs 1 to {MAX_GRID_DEPTH} dimensions")
        if not all(type(n) is int and 1 <= n <= MAX_GRID_INDEX for n in self.size):
            raise GridSpecError(f"grid {self.prefix!r}: every size must be an integer in 1..{MAX_GRID_INDEX}")
        if math.prod(self.size) > MAX_GRID_EXPERTS:
            raise GridSpecError(f"grid {self.prefix!r} has {math.prod(self.size)} experts; the limit is {MAX_GRID_EXPERTS}")
        longest = DELIMITER.join([self.prefix, *(str(n - 1) for n in self.size)])
        if len(longest) > MAX_UID_LENGTH:
            raise GridSpecError(f"grid {self.prefix!r}: its uids would exceed {MAX_UID_LENGTH} characters")
        if not isinstance(self.expert_class, str) or not _CLASS.match(self.expert_class):
            raise GridSpecError(f"grid {self.prefix!r}: expert class {self.expert_class!r} is not a class name")
        if type(self.hidden_dim) is not int or self.hidden_dim < 1:
            raise GridSpecError(f"grid {self.prefix!r}: hidden_dim must be a positive integer")
        if type(self.replicas) is not int or not 1 <= self.replicas <= MAX_REPLICAS:
            raise GridSpecError(f"grid {self.prefix!r}: replicas must be an integer in 1..{MAX_REPLICAS}")
        period = self.sync_period
        if isinstance(period, bool) or not isinstance(period, (int, float)) or not 0 < period < math.inf:
            raise GridSpecError(f"grid {self.prefix!r}: sync_period must be a positive number of seconds")
        object.__setattr__(self, "sync_period", float(period))

    @property
    def count(self) -> int:
        """Number of experts in the grid."""
        return math.prod(self.size)

    def uids(self) -> Iterator[str]:
        """Every uid of the grid, in index order: ``expert.0.0``, ``expert.0.1``, …"""
        for coords in itertools.product(*(range(n) for n in self.size)):
            yield DELIMITER.join([self.prefix, *map(str, coords)])

    def contains(self, uid: str) -> bool:
        """Whether ``uid`` is one of this grid's experts."""
        try:
            prefix, coords = parse_uid(uid)
        except ValueError:
            return False
        return prefix == self.prefix and len(coords) == len(self.size) and all(
            c < n for c, n in zip(coords, self.size)
        )


def parse_grid(table: object, where: str = "[[grid]]") -> GridSpec:
    """A GridSpec from one ``[[grid]]`` table as ``tomllib`` returns it; GridSpecError names
    ``where`` (the file and table number) and the offending key."""
    if not isinstance(table, Mapping):
        raise GridSpecError(f"{where} must be a table")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise GridSpecError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    missing = [key for key in _KEYS[:4] if key not in table]
    if missing:
        raise GridSpecError(f"{where}: missing {missing[0]!r}")
    size = table["size"]
    if isinstance(size, int) and not isinstance(size, bool):
        size = [size]
    if not isinstance(size, (list, tuple)):
        raise GridSpecError(f"{where}: size must be a list of integers, e.g. [4, 8]")
    try:
        return GridSpec(
            prefix=table["prefix"],
            size=tuple(size),
            expert_class=table["expert"],
            hidden_dim=table["hidden_dim"],
            replicas=table.get("replicas", 1),
            sync_period=table.get("sync_period", DEFAULT_SYNC_PERIOD),
        )
    except GridSpecError as exc:
        raise GridSpecError(f"{where}: {exc}") from None


def parse_grids(tables: object, where: str = "swarm file") -> list[GridSpec]:
    """Every ``[[grid]]`` table of a swarm file (the value of its ``grid`` key); prefixes must be
    distinct, since a uid names one expert of one grid."""
    if not isinstance(tables, Sequence) or isinstance(tables, (str, bytes)):
        raise GridSpecError(f"{where}: grid must be an array of tables ([[grid]])")
    if len(tables) > MAX_GRIDS:
        raise GridSpecError(f"{where}: {len(tables)} grids; the limit is {MAX_GRIDS}")
    grids = [parse_grid(table, f"{where} [[grid]] #{n + 1}") for n, table in enumerate(tables)]
    seen: set[str] = set()
    for grid in grids:
        if grid.prefix in seen:
            raise GridSpecError(f"{where}: two grids share the prefix {grid.prefix!r}")
        seen.add(grid.prefix)
    return grids


def grid_of(uid: str, grids: Sequence[GridSpec]) -> GridSpec | None:
    """The grid ``uid`` belongs to, or None (an expert outside every declared grid)."""
    for grid in grids:
        if grid.contains(uid):
            return grid
    return None


@dataclass
class SwarmSpec:
    """A swarm to join: its protocol id and whom to ask first."""

    name: str
    id: str
    bootstrap: list[Multiaddr] = field(default_factory=list)
    relays: list[Multiaddr] = field(default_factory=list)
    experts: dict = field(default_factory=dict)  # defaults for `volunteer join`
    path: Path | None = None
    kind: str = "volunteer"  # "hivemind": join a hivemind 1.1 swarm (volunteer.hivemind)
    grids: list[GridSpec] = field(default_factory=list)  # [[grid]]: what the swarm's experts are
    testnet_pid: int | None = None  # set in a file written by `volunteer testnet`: its process
    # who may train (experts.trainers.TrainerPolicy): "open", or a list of trainer peer IDs;
    # an organiser's public key (base64 libp2p protobuf) whose certificates admit trainers;
    # whether forwards are answered for "everyone" or only for admitted "trainers"
    trainers: str | list = "open"
    organiser: str | None = None
    forwards: str = "everyone"
    # exact audits: volunteers sign receipts and keep snapshots, trainers require receipts (on
    # unless the file opts out; never for hivemind's kind, whose wire carries none)
    receipts: bool = True

    def __post_init__(self) -> None:
        if self.kind != "volunteer":
            self.receipts = False

    @property
    def entry_points(self) -> list[Multiaddr]:
        """Bootstrap peers and relays, each once (relays serve the DHT too)."""
        out: list[Multiaddr] = []
        for addr in [*self.bootstrap, *self.relays]:
            if addr not in out:
                out.append(addr)
        return out

    def to_toml(self) -> str:
        """The swarm file's text (written with tomli-w: quoting and escaping are its job)."""
        data: dict = {
            "name": self.name,
            "id": self.id,
            "bootstrap": [str(a) for a in self.bootstrap],
            "relays": [str(a) for a in self.relays],
        }
        if self.kind != "volunteer":
            data["kind"] = self.kind
        if self.experts:
            data["experts"] = dict(self.experts)
        if self.testnet_pid is not None:
            data["testnet"] = {"pid": self.testnet_pid}
        if self.trainers != "open":
            data["trainers"] = list(self.trainers)
        if self.organiser is not None:
            data["organiser"] = self.organiser
        if self.forwards != "everyone":
            data["forwards"] = self.forwards
        if not self.receipts and self.kind == "volunteer":
            data["receipts"] = False  # opted out
        if self.grids:  # [[grid]] tables, as parse_grid reads them back
            data["grid"] = [{"prefix": g.prefix, "size": list(g.size), "expert": g.expert_class, "hidden_dim": g.hidden_dim,
                             "replicas": g.replicas, "sync_period": g.sync_period} for g in self.grids]
        return tomli_w.dumps(data)


# --- a swarm file's own keys (its [experts] table takes config.toml's [join] settings) -------------

SWARM_KEYS: dict = {  # a swarm file's top-level keys; a dict value is a table checked in turn
    "name": str,
    "id": str,
    "bootstrap": MULTIADDR_LIST,
    "relays": MULTIADDR_LIST,
    "experts": JOIN_SETTINGS,
    "grid": list,  # [[grid]]: the expert grids the swarm declares (volunteer.replicas.grid checks each)
    "kind": str,  # which protocols the swarm speaks (e.g. "hivemind")
    "testnet": {"pid": int},  # written by `volunteer testnet` only
    "trainers": (str, list),  # who may train: "open" or a list of trainer peer IDs
    "organiser": str,  # the organiser's public key: its `volunteer trainer-cert` certificates admit trainers
    "forwards": str,  # "everyone" (default) or "trainers": who gets forwards answered
    "receipts": bool,  # exact audits: every reply receipted, disputes settled by recompute
}


def _trainer_settings(data: dict, path: Path) -> tuple[str | list, str | None, str]:
    """The swarm file's trainers, organiser and forwards, checked (one line on anything off)."""
    trainers = data.get("trainers", "open")
    if isinstance(trainers, str) and trainers != "open":
        raise SwarmFileError(f'swarm file {path}: trainers must be "open" or a list of trainer peer IDs, got {trainers!r}')
    if isinstance(trainers, list):
        for text in trainers:
            if not isinstance(text, str):
                raise SwarmFileError(f"swarm file {path}: trainers must be a list of peer ID strings")
            try:
                PeerID.from_string(text)
            except VolunteerError as exc:
                raise SwarmFileError(f"swarm file {path}: trainers: {text[:60]!r} is not a peer ID ({exc})") from None
    organiser = data.get("organiser")
    if organiser is not None:
        try:
            PublicKey.from_protobuf(base64.b64decode(organiser.encode(), validate=True))
        except (ValueError, VolunteerError):
            raise SwarmFileError(
                f"swarm file {path}: organiser must be the organiser's public key as `volunteer trainer-cert --init` prints it"
            ) from None
    forwards = data.get("forwards", "everyone")
    if forwards not in ("everyone", "trainers"):
        raise SwarmFileError(f'swarm file {path}: forwards must be "everyone" or "trainers", got {forwards!r}')
    if data.get("kind") == "hivemind" and (trainers != "open" or organiser is not None or forwards != "everyone"):
        raise SwarmFileError(f"swarm file {path}: a hivemind swarm is open (its trainers present no certificate): "
                             "drop trainers, organiser and forwards")
    if data.get("kind") == "hivemind" and data.get("receipts"):
        raise SwarmFileError(f"swarm file {path}: hivemind's replies carry no receipts: drop receipts")
    return trainers, organiser, forwards


def _read_toml(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise SwarmFileError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SwarmFileError(f"{what} {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SwarmFileError(f"{what} {path} is not valid TOML: {exc}") from None


SWARM_KINDS = ("volunteer", "hivemind")
# hivemind features a swarm file might ask for that we refuse rather than ignore
HIVEMIND_UNSUPPORTED = {
    "averaging": "hivemind's decentralized averaging (DecentralizedAverager / Optimizer RPCs)",
    "averager": "hivemind's decentralized averaging (DecentralizedAverager / Optimizer RPCs)",
    "validators": "hivemind's signed-record validators (RSASignatureValidator, SchemaValidator)",
    "record_validators": "hivemind's signed-record validators (RSASignatureValidator, SchemaValidator)",
    "authorizer": "hivemind's RPC authorizers",
}


def load_swarm_file(path: str | os.PathLike) -> SwarmSpec:
    """Parse a swarm TOML file; raises SwarmFileError with the file and the problem."""
    path = Path(path)
    data = _read_toml(path, "swarm file")
    if data.get("kind") == "hivemind":  # hivemind's own features get a clearer line than "unknown"
        for key, feature in HIVEMIND_UNSUPPORTED.items():
            if key in data:
                raise SwarmFileError(f"swarm file {path}: {key}: {feature} is not supported by volunteer's hivemind personality")
    validate_table(data, SWARM_KEYS, where=f"swarm file {path}", checks={"experts": JOIN_CHECKS})
    name = data.get("name") or path.stem
    swarm_id = data.get("id") or name
    if not isinstance(name, str) or not isinstance(swarm_id, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", swarm_id):
        raise SwarmFileError(f"swarm file {path}: id must be 1-64 letters, digits, '_', '.', '-'")
    addrs = {}
    for key in ("bootstrap", "relays"):
        values = data.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SwarmFileError(f"swarm file {path}: {key} must be a list of multiaddr strings")
        try:
            addrs[key] = [Multiaddr(v) for v in values]
        except VolunteerError as exc:
            raise SwarmFileError(f"swarm file {path}: bad {key} address: {exc}") from None
        for addr in addrs[key]:
            if addr.peer_id is None:
                raise SwarmFileError(f"swarm file {path}: {addr} needs a /p2p/PEER-ID at the end")
    experts = data.get("experts", {})
    kind = data.get("kind", "volunteer")
    if kind not in SWARM_KINDS:
        raise SwarmFileError(f"swarm file {path}: kind must be one of {', '.join(SWARM_KINDS)}, got {kind!r}")
    grids = _parse_grids(data.get("grid", []), path)
    testnet_pid = data.get("testnet", {}).get("pid")
    trainers, organiser, forwards = _trainer_settings(data, path)
    return SwarmSpec(name, swarm_id, addrs["bootstrap"], addrs["relays"], experts, path, kind, grids, testnet_pid,
                     trainers, organiser, forwards, data.get("receipts", True))


def _parse_grids(tables: object, path: Path) -> list[GridSpec]:
    # absent or empty: a swarm without declared grids (--experts names what to host)
    if isinstance(tables, list) and not tables:
        return []
    return parse_grids(tables, f"swarm file {path}")


SWARM_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # it goes into protocol ids and file names


def check_swarm_id(text: str) -> str:
    """``text`` if it can be a swarm id; SwarmFileError saying what one may hold if not."""
    if not SWARM_ID.fullmatch(text) or text in (".", ".."):
        raise SwarmFileError(f"bad swarm id {text[:80]!r}: use 1-64 letters, digits, '_', '.', '-' (e.g. demo)")
    return text


def resolve_swarm(text: str, *, swarm_id: str | None = None) -> SwarmSpec:
    """SWARM as users type it: a bootstrap multiaddr, a path to a swarm file, or a name from
    ``<config>/swarms/NAME.toml``."""
    if text.startswith("/") and not text.endswith(".toml"):
        if Path(text).is_file():
            return load_swarm_file(text)
        try:
            addr = Multiaddr(text)
        except VolunteerError as exc:
            raise SwarmFileError(f"{text!r} is neither a swarm file nor a multiaddr: {exc}") from None
        if addr.peer_id is None:
            raise SwarmFileError(f"{text} needs a /p2p/PEER-ID at the end to be a bootstrap peer")
        sid = check_swarm_id(swarm_id or "default")
        return SwarmSpec(sid, sid, [addr], [addr])
    candidate = Path(text).expanduser()
    if candidate.suffix == ".toml" or candidate.is_file():
        if not candidate.is_file():
            raise SwarmFileError(f"no swarm file {candidate}")
        return load_swarm_file(candidate)
    known = swarms_dir() / f"{text}.toml"
    if known.is_file():
        return load_swarm_file(known)
    raise SwarmFileError(
        f"unknown swarm {text!r}: no {known}; ask the swarm's organiser for its swarm file and save it there "
        f"(or pass its path, or a bootstrap multiaddr); `volunteer testnet --name {text}` starts a local one to try"
    )


def read_config(path: str | os.PathLike | None = None) -> dict:
    """The user's whole ``config.toml`` (default ``<config dir>/config.toml``; missing is fine),
    validated: ``[join]`` (defaults for ``volunteer join``) and ``[limits]`` (resource bounds)."""
    explicit = path is not None
    path = Path(path) if path is not None else config_file()
    if not path.is_file():
        if explicit:
            raise SwarmFileError(f"no config file {path}")
        return {}
    data = _read_toml(path, "config file")
    validate_table(data, CONFIG_KEYS, where=f"config file {path}", checks=CONFIG_CHECKS)
    return data


def load_config(path: str | os.PathLike | None = None) -> dict:
    """Defaults for ``volunteer join`` from config.toml's ``[join]``, e.g. ``device = "cuda:0"``.
    Flags and the swarm file's ``[experts]`` win over it."""
    return dict(read_config(path).get("join", {}))


def load_run(path: str | os.PathLike | None = None) -> dict:
    """config.toml's ``[run]``: consent and the run-when policies (``volunteer/donor/policy.py``)."""
    return dict(read_config(path).get("run", {}))


def load_limits(path: str | os.PathLike | None = None) -> dict:
    """Overrides of the default bounds from config.toml's ``[limits]`` (e.g. ``peer_memory =
    268435456``): ResourceLimits fields and the expert server's request budget."""
    return dict(read_config(path).get("limits", {}))


_RANGE = re.compile(r"^\[(\d+):(\d+)\]$")


def parse_experts_spec(text: str) -> tuple[str, list[str]]:
    """``ffn:expert.[0:4].[0:8]`` → ("ffn", ["expert.0.0", …, "expert.3.7"]); also plain uids,
    comma-separated: ``ffn:expert.0.1,expert.2.3``."""
    cls, sep, pattern = text.partition(":")
    if not sep or not cls or not pattern:
        raise SwarmFileError(f"--experts {text!r}: expected CLASS:PATTERN, e.g. ffn:expert.[0:4].[0:8]")
    uids: list[str] = []
    for part in _split_top(pattern):
        name, _, rest = part.partition(".")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or not rest:
            raise SwarmFileError(f"--experts {text!r}: expected NAME.INDEX… after the class (e.g. expert.[0:4])")
        combos: list[list[int]] = [[]]
        for piece in rest.split("."):
            match = _RANGE.match(piece)
            if match:
                lo, hi = int(match.group(1)), int(match.group(2))
                if not lo < hi or hi - lo > 4096:
                    raise SwarmFileError(f"--experts {text!r}: range [{lo}:{hi}] is empty or too large")
                values: Sequence[int] = range(lo, hi)
            elif piece.isdigit():
                values = [int(piece)]
            else:
                raise SwarmFileError(f"--experts {text!r}: {piece!r} is neither an index nor [a:b]")
            combos = [c + [v] for c in combos for v in values]
            if len(combos) > 4096:
                raise SwarmFileError(f"--experts {text!r}: more than 4096 experts on one host")
        uids.extend(".".join([name, *map(str, c)]) for c in combos)
    return cls, list(dict.fromkeys(uids))


def _split_top(pattern: str) -> list[str]:
    return [p for p in pattern.split(",") if p]


__all__ = [
    "DEFAULT_SYNC_PERIOD",
    "GridSpec",
    "GridSpecError",
    "MAX_GRID_EXPERTS",
    "CONFIG_KEYS",
    "JOIN_SETTINGS",
    "LIMIT_SETTINGS",
    "SWARM_KEYS",
    "SwarmFileError",
    "SwarmSpec",
    "grid_of",
    "parse_grid",
    "parse_grids",
    "config_dir",
    "identity_path",
    "load_config",
    "load_limits",
    "read_config",
    "load_swarm_file",
    "parse_experts_spec",
    "resolve_swarm",
    "runtime_dir",
    "state_dir",
    "swarms_dir",
    "validate_table",
]
# CONFIG_KEYS, JOIN_SETTINGS, LIMIT_SETTINGS, SwarmFileError and validate_table are the settings
# schema's (volunteer.settings), named here too for the callers that read them with a swarm file
