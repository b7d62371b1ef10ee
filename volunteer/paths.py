"""Where a volunteer's files live: the one implementation every command and layer uses.

The platform's conventions come from ``platformdirs`` (XDG on Linux: ``~/.config/volunteer``,
``~/.local/state/volunteer``, ``$XDG_RUNTIME_DIR/volunteer``; ``%APPDATA%`` / ``%LOCALAPPDATA%``
on Windows; ``~/Library/...`` on macOS). Each can be moved by an environment variable, checked
first and in every command alike:

* ``VOLUNTEER_CONFIG_DIR``: identity key, ``config.toml``, ``swarms/*.toml``
* ``VOLUNTEER_STATE_DIR``: logs, checkpoints, contribution totals
* ``VOLUNTEER_RUNTIME_DIR``: the daemon's control socket
* ``VOLUNTEER_IDENTITY``: the identity key file itself

It sits on the bottom floor (beside ``volunteer.errors``) so that ``volunteer.net`` can use it
for the default identity key without reaching up.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "volunteer"


def _override(env: str) -> Path | None:
    value = os.environ.get(env)
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """Identity key, ``config.toml``, ``swarms/*.toml``."""
    return _override("VOLUNTEER_CONFIG_DIR") or Path(platformdirs.user_config_dir(APP, appauthor=False, roaming=True))


def state_dir() -> Path:
    """Logs, checkpoints and what this machine has contributed."""
    return _override("VOLUNTEER_STATE_DIR") or Path(platformdirs.user_state_dir(APP, appauthor=False))


def runtime_dir() -> Path:
    """The control socket's directory (per-user, 0700).

    ``$XDG_RUNTIME_DIR/volunteer`` where the session has one; otherwise under the state dir
    rather than platformdirs' guess (``/run/user/UID`` may not exist, or not be ours, in a
    container or under ``su``)."""
    override = _override("VOLUNTEER_RUNTIME_DIR")
    if override:
        return override
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(platformdirs.user_runtime_dir(APP, appauthor=False))
    return state_dir() / "run"


def identity_path() -> Path:
    """``$VOLUNTEER_IDENTITY``, else the config dir's ``identity.key``."""
    return _override("VOLUNTEER_IDENTITY") or config_dir() / "identity.key"


def relay_identity_path() -> Path:
    """``$VOLUNTEER_RELAY_IDENTITY``, else the config dir's ``relay.key``: a relay's own key, never
    the donor's (two nodes with one peer ID confuse everyone, themselves first)."""
    return _override("VOLUNTEER_RELAY_IDENTITY") or config_dir() / "relay.key"


def swarms_dir() -> Path:
    """Named swarm files: ``volunteer join NAME`` reads ``<config dir>/swarms/NAME.toml``."""
    return config_dir() / "swarms"


def config_file() -> Path:
    """The user's settings (``[join]`` defaults for the flags)."""
    return config_dir() / "config.toml"


__all__ = ["config_dir", "config_file", "identity_path", "relay_identity_path", "runtime_dir", "state_dir", "swarms_dir"]
