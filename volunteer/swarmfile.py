"""What a swarm file and ``config.toml`` say, and the ``--experts`` grid syntax.

Where the files live is ``volunteer.paths`` (re-exported here for the callers that import it
from this module). Swarm files and the config file are validated alike (``validate_table``): an
unknown key is one line naming it and the known ones, and every value's type is checked.

A swarm file (TOML)::

    name = "demo"                       # what users type: volunteer join demo
    id = "demo"                         # protocol swarm id (default: name); swarms never mix
    bootstrap = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
    relays = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
    [experts]                           # defaults for `join` (flags win)
    experts = "ffn:expert.[0:4].[0:4]"
    hidden_dim = 64

``volunteer testnet`` marks the swarm file it writes with a ``[testnet]`` table (its ``pid``), so
that it is removed when that testnet stops and a real swarm's file is never overwritten.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from .errors import VolunteerError
from .net.multiaddr import Multiaddr
from .paths import config_dir, config_file, identity_path, runtime_dir, state_dir, swarms_dir


class SwarmFileError(VolunteerError):
    """A swarm name, file or --experts spec that cannot be used."""


@dataclass
class SwarmSpec:
    """A swarm to join: its protocol id and whom to ask first."""

    name: str
    id: str
    bootstrap: list[Multiaddr] = field(default_factory=list)
    relays: list[Multiaddr] = field(default_factory=list)
    experts: dict = field(default_factory=dict)  # defaults for `volunteer join`
    path: Path | None = None
    testnet_pid: int | None = None  # set in a file written by `volunteer testnet`: its process

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
        if self.experts:
            data["experts"] = dict(self.experts)
        if self.testnet_pid is not None:
            data["testnet"] = {"pid": self.testnet_pid}
        return tomli_w.dumps(data)


# --- validation: swarm files and config.toml alike ------------------------------------------------


@dataclass(frozen=True)
class Typed:
    """A schema entry whose expected type is better said in words than by its Python type."""

    types: tuple
    words: str


MULTIADDR_LIST = Typed((list,), "a list of multiaddr strings")

JOIN_SETTINGS = {  # config.toml's [join] keys and a swarm file's [experts] keys, with their types
    "experts": str, "hidden_dim": int, "device": str, "max_batch": int, "listen": list,
    "max_gpu_memory": (int, float), "max_upload": (int, float), "expert_file": str, "mdns": bool,
    "share_tracebacks": str,
}

SWARM_KEYS: dict = {  # a swarm file's top-level keys; a dict value is a table checked in turn
    "name": str,
    "id": str,
    "bootstrap": MULTIADDR_LIST,
    "relays": MULTIADDR_LIST,
    "experts": JOIN_SETTINGS,
    "grid": list,  # [[grid]]: the expert grids the swarm declares (volunteer.replicas.grid checks each)
    "kind": str,  # which protocols the swarm speaks (e.g. "hivemind")
    "testnet": {"pid": int},  # written by `volunteer testnet` only
}

CONFIG_KEYS: dict = {"join": JOIN_SETTINGS}  # config.toml's tables

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list", dict: "a table"}


def _type_name(kind) -> str:
    if isinstance(kind, Typed):
        return kind.words
    if isinstance(kind, dict):
        return "a table"
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        return "a number"
    return " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)


def _value_type_name(value) -> str:
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return _TYPE_NAMES[kind]
    return type(value).__name__


def validate_table(data: dict, schema: dict, *, where: str, prefix: str = "") -> None:
    """Check a parsed TOML table against ``schema`` (key → type, tuple of types, or a nested
    schema for a sub-table). Raises SwarmFileError in one line: an unknown key with the known
    ones (and the likeliest one meant), or a value of the wrong type with the type expected."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        kind = schema.get(key)
        if kind is None:
            close = difflib.get_close_matches(key, list(schema), n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            raise SwarmFileError(f"{where}: unknown setting {dotted} ({hint}known: {', '.join(schema)})")
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise SwarmFileError(f"{where}: {dotted} has the wrong type: expected a table [{dotted}], got {_value_type_name(value)}")
            validate_table(value, kind, where=where, prefix=f"{dotted}.")
            continue
        kinds = kind.types if isinstance(kind, Typed) else kind if isinstance(kind, tuple) else (kind,)
        # TOML's true is a Python int too: a bool passes only where a bool is asked for
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise SwarmFileError(
                f"{where}: {dotted} has the wrong type: expected {_type_name(kind)}, got {_value_type_name(value)}"
            )


def _read_toml(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise SwarmFileError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SwarmFileError(f"{what} {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SwarmFileError(f"{what} {path} is not valid TOML: {exc}") from None


def load_swarm_file(path: str | os.PathLike) -> SwarmSpec:
    """Parse a swarm TOML file; raises SwarmFileError with the file and the problem."""
    path = Path(path)
    data = _read_toml(path, "swarm file")
    validate_table(data, SWARM_KEYS, where=f"swarm file {path}")
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
    testnet_pid = data.get("testnet", {}).get("pid")
    return SwarmSpec(name, swarm_id, addrs["bootstrap"], addrs["relays"], experts, path, testnet_pid)


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
        sid = swarm_id or "default"
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


def load_config(path: str | os.PathLike | None = None) -> dict:
    """The user's ``config.toml`` (default ``<config dir>/config.toml``; missing is fine):
    defaults for ``volunteer join`` under ``[join]``, e.g. ``device = "cuda:0"``. Flags and the
    swarm file's ``[experts]`` win over it."""
    explicit = path is not None
    path = Path(path) if explicit else config_file()
    if not path.is_file():
        if explicit:
            raise SwarmFileError(f"no config file {path}")
        return {}
    data = _read_toml(path, "config file")
    validate_table(data, CONFIG_KEYS, where=f"config file {path}")
    return dict(data.get("join", {}))


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
        combos = [[]]
        for piece in rest.split("."):
            match = _RANGE.match(piece)
            if match:
                lo, hi = int(match.group(1)), int(match.group(2))
                if not lo < hi or hi - lo > 4096:
                    raise SwarmFileError(f"--experts {text!r}: range [{lo}:{hi}] is empty or too large")
                values = range(lo, hi)
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
    "CONFIG_KEYS",
    "JOIN_SETTINGS",
    "SWARM_KEYS",
    "SwarmFileError",
    "SwarmSpec",
    "config_dir",
    "identity_path",
    "load_config",
    "load_swarm_file",
    "parse_experts_spec",
    "resolve_swarm",
    "runtime_dir",
    "state_dir",
    "swarms_dir",
    "validate_table",
]
