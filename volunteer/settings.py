"""The settings schema: which keys config.toml's tables and a swarm file's ``[experts]`` take,
of which types, and the one check each value goes through wherever it is set (the file, or the
flag of the same name), so that a setting means one thing and is refused in the same words.

``validate_table`` checks a parsed TOML table against a schema (key → type, or a nested schema)
and its values against their checks; the swarm file's own top-level keys are ``swarmfile``'s.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, fields
from typing import Callable

from .errors import VolunteerError
from .net.resources import ResourceLimits
from .sizes import parse_size


class SwarmFileError(VolunteerError):
    """A swarm name, swarm file, config file setting or --experts spec that cannot be used."""


@dataclass(frozen=True)
class Typed:
    """A schema entry whose expected type is better said in words than by its Python type."""

    types: tuple
    words: str


MULTIADDR_LIST = Typed((list,), "a list of multiaddr strings")

# --- values: one check per setting, for config.toml, a swarm file and the flag alike -------------
# Each takes what the file holds (a number, a string) or the flag's text, and returns the value to
# use, or raises ValueError saying what is expected: a setting means one thing wherever it is set.

def _number(value: object, integer: bool) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            raise ValueError(f"expected {'a whole number' if integer else 'a number'}, got {value!r}") from None
    if integer and isinstance(value, float):
        raise ValueError(f"expected a whole number, got {value!r}")
    if not isinstance(value, (int, float)) or value != value or value in (math.inf, -math.inf):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def at_least(low: float, *, integer: bool = True, example: str = "") -> "Callable[[object], float]":
    """A check: a number (whole unless ``integer`` is False) of ``low`` or more."""
    def check(value: object) -> float:
        number = _number(value, integer)
        if number < low:
            raise ValueError(f"expected {'a whole number' if integer else 'a number'} of {low:g} or more"
                             f"{f', e.g. {example}' if example else ''}, got {value!r}")
        return number
    return check


def fraction(value: object) -> float:
    """A check: a fraction in (0, 1] (of the GPU's memory)."""
    number = _number(value, False)
    if not 0 < number <= 1:
        raise ValueError(f"expected a fraction in (0, 1], e.g. 0.5, got {value!r}")
    return float(number)


def _positive_size(value: object, example: str, *, quantity: str = "bytes", reading: str = "",
                   whole: bool = False) -> float:
    """``value`` (a number, or text: a plain number or a size such as ``example``) above zero,
    whole bytes if ``whole``; ValueError in words that give ``example`` (``reading`` says what it
    means). A negative number is refused as one below zero, not as text that is not a size."""
    if isinstance(value, str):
        text = value
        try:
            value = float(text)
        except ValueError:
            try:
                value = parse_size(text.strip())
            except ValueError:
                raise ValueError(f"not a size: {text!r} (e.g. {example}{reading})") from None
    number = _number(value, False)
    if whole:
        number = int(number)  # a fraction of a byte is no byte
    if not number > 0:
        raise ValueError(f"expected {quantity} above 0 (e.g. {example}), got {value!r}")
    return number


def rate(value: object) -> float:
    """A check: bytes per second above zero, a number or a size such as 5MiB."""
    return float(_positive_size(value, "5MiB", quantity="bytes per second", reading=" for 5 MiB/s"))


# device names torch takes that make sense for experts; anything else is refused in one line
# before torch lists its twenty device types at the user
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d+)?")


def size(value: object) -> int:
    """A check: bytes above zero, a number or a size such as 8GiB."""
    return int(_positive_size(value, "8GiB", whole=True))


def device_name(value: object) -> str:
    """A check: a device experts can run on."""
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"unknown device {value!r}: use auto, cpu, cuda or cuda:N (e.g. cuda:0), or mps")
    return value


def one_of(*choices: str) -> "Callable[[object], str]":
    """A check: one of ``choices``."""
    def check(value: object) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)
    return check


JOIN_CHECKS: dict = {  # [join] / [experts] values, and the flags of the same names
    "hidden_dim": at_least(1, example="64"), "max_batch": at_least(1, example="1024"),
    "max_gpu_memory": fraction, "max_upload": rate, "max_experts": at_least(0, example="8"), "max_ram": size,
    "device": device_name, "share_tracebacks": one_of("full", "redacted", "none"), "cpu_threads": at_least(1, example="4"),
}

JOIN_SETTINGS = {  # config.toml's [join] keys and a swarm file's [experts] keys, with their types
    "experts": str, "hidden_dim": int, "device": str, "max_batch": int, "listen": list,
    "max_gpu_memory": (int, float), "max_upload": Typed((int, float, str), "a number or a size such as 5MiB"),
    "expert_file": str, "mdns": bool, "share_tracebacks": str, "max_experts": int, "port_mapping": bool,
    "cpu_threads": int, "max_ram": Typed((int, str), "a number of bytes or a size such as 8GiB"),
}

# config.toml's [limits]: the resource manager's bounds (volunteer.net.resources.ResourceLimits,
# sized for a 24 GiB desktop) and the expert servers' request budgets (ours, and the hivemind
# door's), for a machine that wants others
LIMIT_SETTINGS = {
    **{f.name: (int, float) for f in fields(ResourceLimits)},
    "max_request_bytes_per_peer": int, "max_request_bytes_total": int, "backward_window": (int, float),
    "hivemind_request_bytes_per_peer": int, "hivemind_request_bytes_per_address": int,
    "hivemind_request_bytes_total": int,
}
LIMIT_CHECKS: dict = {  # [limits] values: every bound is a count or bytes above zero
    **{key: at_least(1, integer=False) for key in LIMIT_SETTINGS}, "backward_window": at_least(0, integer=False),
}
EXPERT_LIMITS = (
    "max_request_bytes_per_peer", "max_request_bytes_total", "backward_window",
    "hivemind_request_bytes_per_peer", "hivemind_request_bytes_per_address", "hivemind_request_bytes_total",
)
# config.toml's [run]: consent and the run-when policies (volunteer/donor/policy.py checks values)
RUN_SETTINGS = {
    "consent": bool, "on_battery": bool, "when_idle": (int, float), "max_other_load": (int, float),
    "pause_programs": list, "compute_hours": (str, list), "network_hours": (str, list), "daily_transfer": (int, str),
    "gpus": list, "exclude_gpus": list, "failure_limit": int, "pause_on_gpu_use": bool,
}
CONFIG_KEYS: dict = {"join": JOIN_SETTINGS, "limits": LIMIT_SETTINGS, "run": RUN_SETTINGS}  # config.toml's tables
CONFIG_CHECKS: dict = {"join": JOIN_CHECKS, "limits": LIMIT_CHECKS}  # their values' checks (run: donor/policy.py)

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


def validate_table(data: dict, schema: dict, *, where: str, prefix: str = "", checks: dict | None = None) -> None:
    """Check a parsed TOML table against ``schema`` (key → type, tuple of types, or a nested
    schema for a sub-table) and its values against ``checks`` (key → check, or a nested dict),
    replacing each checked value with the one to use (``"5MiB"`` → 5242880.0). Raises
    SwarmFileError in one line: an unknown key with the known ones (and the likeliest one meant),
    a value of the wrong type with the type expected, or a value out of range with the range."""
    checks = checks or {}
    for key, value in list(data.items()):
        dotted = f"{prefix}{key}"
        kind = schema.get(key)
        if kind is None:
            close = difflib.get_close_matches(key, list(schema), n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            raise SwarmFileError(f"{where}: unknown setting {dotted} ({hint}known: {', '.join(schema)})")
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise SwarmFileError(f"{where}: {dotted} has the wrong type: expected a table [{dotted}], got {_value_type_name(value)}")
            nested = checks.get(key)
            validate_table(value, kind, where=where, prefix=f"{dotted}.", checks=nested if isinstance(nested, dict) else None)
            continue
        kinds = kind.types if isinstance(kind, Typed) else kind if isinstance(kind, tuple) else (kind,)
        # TOML's true is a Python int too: a bool passes only where a bool is asked for
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise SwarmFileError(
                f"{where}: {dotted} has the wrong type: expected {_type_name(kind)}, got {_value_type_name(value)}"
            )
        check = checks.get(key)
        if callable(check):
            try:
                data[key] = check(value)
            except ValueError as exc:
                raise SwarmFileError(f"{where}: {dotted}: {exc}") from None


__all__ = [
    "CONFIG_CHECKS",
    "CONFIG_KEYS",
    "EXPERT_LIMITS",
    "JOIN_CHECKS",
    "JOIN_SETTINGS",
    "LIMIT_CHECKS",
    "LIMIT_SETTINGS",
    "MULTIADDR_LIST",
    "RUN_SETTINGS",
    "SwarmFileError",
    "Typed",
    "at_least",
    "device_name",
    "fraction",
    "one_of",
    "rate",
    "validate_table",
]
