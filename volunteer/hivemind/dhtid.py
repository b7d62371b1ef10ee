"""hivemind's DHT ids: 160-bit integers. A node's id is random (not derived from its peer id); a
key's id is SHA-1 of the key's msgpack encoding (of the bytes themselves for a bytes key)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from . import limits
from .errors import HivemindFrameError
from .serializer import dumps

ID_BITS = limits.DHTID_BYTES * 8


def random_id() -> int:
    """A fresh node id."""
    return int.from_bytes(hashlib.sha1(secrets.token_bytes(32)).digest(), "big")


def key_id(key: Any) -> int:
    """The id of a DHT key as hivemind computes it (``DHTID.generate(source=key)``)."""
    source = key if isinstance(key, bytes) else dumps(key)
    return int.from_bytes(hashlib.sha1(source).digest(), "big")


def id_to_bytes(ident: int) -> bytes:
    """An id as hivemind puts it on the wire (20 bytes, big-endian)."""
    return ident.to_bytes(limits.DHTID_BYTES, "big")


def id_from_bytes(data: bytes) -> int:
    """An id off the wire; anything but 20 bytes is the peer's protocol error."""
    if len(data) != limits.DHTID_BYTES:
        raise HivemindFrameError(f"DHT id of {len(data)} bytes (expected {limits.DHTID_BYTES})")
    return int.from_bytes(data, "big")


__all__ = ["ID_BITS", "id_from_bytes", "id_to_bytes", "key_id", "random_id"]
