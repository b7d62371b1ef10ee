"""Untrusted msgpack in, one guard: the floor beneath ``dht`` that every signed record shares.

A vouch, a receipt and a profile all arrive from peers we do not trust; each is parsed the same
way: refuse it unread past its size bound, unpack it with every length bounded by that size and no
extension types, and refuse anything that is not the container it should be. Only the error
differs (a record refused in the DHT, a protocol violation on an expert call), so the caller
names it.
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack


def unpack_bounded(data: bytes, limit: int, what: str, error: Callable[[str], Exception],
                   kind: type | None = None) -> Any:
    """``data`` parsed as msgpack, at most ``limit`` bytes and (if given) of type ``kind``;
    otherwise ``error(message)`` is raised, with ``what`` naming the thing in the message."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise error(f"{what} is not bytes")
    if len(data) > limit:
        raise error(f"{what} of {len(data)} bytes exceeds {limit}")
    try:
        item = msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0, max_str_len=limit,
                               max_bin_len=limit, max_array_len=limit, max_map_len=limit)
    except Exception:  # msgpack raises several unrelated types for bad bytes
        raise error(f"{what} is not valid msgpack") from None
    if kind is not None and not isinstance(item, kind):
        raise error(f"{what} must be a msgpack {_KINDS.get(kind, kind.__name__)}")
    return item


_KINDS: dict[type, str] = {list: "array", dict: "map"}

__all__ = ["unpack_bounded"]
