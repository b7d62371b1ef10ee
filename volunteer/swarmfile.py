"""Where a volunteer's files live, what a swarm file says, and the ``--experts`` grid syntax.

Paths follow XDG (``~/.config/volunteer``, ``~/.local/state/volunteer``, ``$XDG_RUNTIME_DIR``),
with Windows' APPDATA / LOCALAPPDATA as the fallbacks there; every one can be moved by an
environment variable (``VOLUNTEER_CONFIG_DIR``, ``VOLUNTEER_STATE_DIR``, ``VOLUNTEER_RUNTIME_DIR``)
and by a flag of the command that uses it.

A swarm file (TOML)::

    name = "demo"                       # what users type: volunteer join demo
    id = "demo"                         # protocol swarm id (default: name); swarms never mix
    kind = "volunteer"                  # or "hivemind": a hivemind 1.1 swarm (bootstrap = its
                                        # initial peers; id never goes on hivemind's wire)
    bootstrap = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
    relays = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
    [experts]                           # defaults for `join` (flags win)
    experts = "ffn:expert.[0:4].[0:4]"
    hidden_dim = 64
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import VolunteerError
from .net.multiaddr import Multiaddr


class SwarmFileError(VolunteerError):
    """A swarm name, file or --experts spec that cannot be used."""


def _base(env: str, xdg: str, default: str, windows: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    if sys.platform == "win32" and os.environ.get(windows):
        return Path(os.environ[windows]) / "volunteer"
    return Path(os.environ.get(xdg) or Path.home() / default) / "volunteer"


def config_dir() -> Path:
    """Identity key, ``config.toml``, ``swarms/*.toml``."""
    return _base("VOLUNTEER_CONFIG_DIR", "XDG_CONFIG_HOME", ".config", "APPDATA")


def state_dir() -> Path:
    """Logs and checkpoints."""
    return _base("VOLUNTEER_STATE_DIR", "XDG_STATE_HOME", ".local/state", "LOCALAPPDATA")


def runtime_dir() -> Path:
    """The control socket (per-user, 0700)."""
    if os.environ.get("VOLUNTEER_RUNTIME_DIR"):
        path = Path(os.environ["VOLUNTEER_RUNTIME_DIR"]).expanduser()
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "volunteer"
    else:
        path = state_dir() / "run"
    return path


def identity_path() -> Path:
    """$VOLUNTEER_IDENTITY, else the config dir's ``identity.key``."""
    if os.environ.get("VOLUNTEER_IDENTITY"):
        return Path(os.environ["VOLUNTEER_IDENTITY"]).expanduser()
    return config_dir() / "identity.key"


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

    @property
    def entry_points(self) -> list[Multiaddr]:
        """Bootstrap peers and relays, each once (relays serve the DHT too)."""
        out: list[Multiaddr] = []
        for addr in [*self.bootstrap, *self.relays]:
            if addr not in out:
                out.append(addr)
        return out

    def to_toml(self) -> str:
        lines = [f'name = "{self.name}"', f'id = "{self.id}"']
        if self.kind != "volunteer":
            lines.append(f'kind = "{self.kind}"')
        lines.append("bootstrap = [" + ", ".join(f'"{a}"' for a in self.bootstrap) + "]")
        lines.append("relays = [" + ", ".join(f'"{a}"' for a in self.relays) + "]")
        if self.experts:
            lines.append("[experts]")
            for key, value in self.experts.items():
                lines.append(f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"')
        return "\n".join(lines) + "\n"


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
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SwarmFileError(f"cannot read swarm file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SwarmFileError(f"swarm file {path} is not valid TOML: {exc}") from None
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
    if not isinstance(experts, dict):
        raise SwarmFileError(f"swarm file {path}: [experts] must be a table")
    kind = data.get("kind", "volunteer")
    if kind not in SWARM_KINDS:
        raise SwarmFileError(f"swarm file {path}: kind must be one of {', '.join(SWARM_KINDS)}, got {kind!r}")
    if kind == "hivemind":
        for key, feature in HIVEMIND_UNSUPPORTED.items():
            if key in data:
                raise SwarmFileError(f"swarm file {path}: {key}: {feature} is not supported by volunteer's hivemind personality")
    return SwarmSpec(name, swarm_id, addrs["bootstrap"], addrs["relays"], experts, path, kind)


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
    known = config_dir() / "swarms" / f"{text}.toml"
    if known.is_file():
        return load_swarm_file(known)
    raise SwarmFileError(
        f"unknown swarm {text!r}: no {known} (pass a swarm file, a bootstrap multiaddr, or run `volunteer testnet`)"
    )


JOIN_SETTINGS = {  # config.toml's [join] keys and their types (same names as the flags)
    "experts": str, "hidden_dim": int, "device": str, "max_batch": int, "listen": list,
    "max_gpu_memory": float, "max_upload": (int, float), "expert_file": str, "mdns": bool,
}


def load_config(path: str | os.PathLike | None = None) -> dict:
    """The user's ``config.toml`` (default ``<config dir>/config.toml``; missing is fine):
    defaults for ``volunteer join`` under ``[join]``, e.g. ``device = "cuda:0"``. Flags and the
    swarm file's ``[experts]`` win over it."""
    explicit = path is not None
    path = Path(path) if explicit else config_dir() / "config.toml"
    if not path.is_file():
        if explicit:
            raise SwarmFileError(f"no config file {path}")
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SwarmFileError(f"config file {path}: {exc}") from None
    join = data.get("join", {})
    if not isinstance(join, dict):
        raise SwarmFileError(f"config file {path}: [join] must be a table")
    for key, value in join.items():
        kind = JOIN_SETTINGS.get(key)
        if kind is None:
            raise SwarmFileError(f"config file {path}: unknown setting join.{key} (known: {', '.join(JOIN_SETTINGS)})")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise SwarmFileError(f"config file {path}: join.{key} has the wrong type")
    return dict(join)


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
]
