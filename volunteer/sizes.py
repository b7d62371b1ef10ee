"""Byte counts as people write and read them: ``64MiB``, ``1GB``, ``512k`` in, ``1.5 MiB`` out.

One spelling for every command, config key and page that takes or shows a size (``--upload``,
``--circuit-data``, ``max_upload = "5MiB"``, the dashboards): the floor beneath ``net``.
"""

from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$")


def parse_size(text: str) -> int:
    """'64MiB' → 67108864, '1GB' → 10**9, '512k' → 512000, '100' → 100; ValueError otherwise."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (try 64MiB, 1GB, 4096)")
    number, prefix, binary, _ = match.groups()
    power = " kmgt".index(prefix.lower()) if prefix else 0
    base = 1024 if binary else 1000
    return int(float(number) * base**power)


def format_size(count: int) -> str:
    """1536 → '1.5 KiB': binary units, one decimal."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def size_arg(text: str) -> int:
    """``parse_size`` as an argparse ``type=``: a bad size is a usage error (exit 2) in one line."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


__all__ = ["format_size", "parse_size", "size_arg"]
