"""hivemind's msgpack dialect: ``use_bin_type``, strict types, and three extension types.

- 0x40: a tuple (msgpack has only arrays; hivemind keeps tuples apart because DHT keys and
  sub-keys may be tuples and must stay hashable);
- 0x50: a dictionary DHT value, ``[maxsize, latest_expiration, [[subkey, value, expiration], ...]]``;
- 0x51: a batch tensor descriptor (hivemind's ``BatchTensorDescriptor``), a map of its fields.

Decoding is bounded (``limits.DecodeLimits``): the input and every str, bin and ext payload in
bytes, every array and map in elements, ext nesting in depth, and the whole value in objects, so
a few bytes of empty maps cannot become hundreds of MiB of dicts. Any malformed or oversized
input raises ``MalformedValue`` (a RemoteProtocolError), never anything else.

How the object budget holds: msgpack calls our hooks once for every array and map it completes,
and each call counts its elements. Elements of containers still being built are not yet
counted, but each is at least one input byte, so what a refused value built before the refusal
is at most ``max_objects`` objects plus one small scalar per input byte.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import RemoteProtocolError
from .limits import DEFAULT_DECODE_LIMITS, DecodeLimits

TUPLE_EXT = 0x40
DICTIONARY_EXT = 0x50
TENSOR_DESCRIPTOR_EXT = 0x51
# tuples in tuples in dictionaries: real values nest two or three deep
MAX_EXT_DEPTH = 16


class MalformedValue(RemoteProtocolError):
    """Bytes that are not a value of hivemind's msgpack dialect."""


@dataclass(frozen=True)
class ValueWithExpiration:
    """A value (msgpack bytes or a DictionaryValue) and the DHT time it expires at."""

    value: Any
    expiration_time: float


@dataclass
class DictionaryValue:
    """hivemind's ``DictionaryDHTValue``: sub-keys, each with a value and an expiration of its own.

    ``items`` maps a sub-key to ``ValueWithExpiration(bytes, expiration)``; the latest expiration of
    any sub-key is the expiration of the whole.
    """

    items: dict[Any, ValueWithExpiration] = field(default_factory=dict)
    # hivemind's default is float('inf') and it is on the wire as such
    maxsize: float | None = math.inf
    latest_expiration_time: float = -math.inf

    def store(self, subkey: Any, value: bytes, expiration_time: float) -> bool:
        """Keep ``value`` under ``subkey`` unless what is there expires later (the later expiration wins)."""
        self.latest_expiration_time = max(self.latest_expiration_time, expiration_time)
        current = self.items.get(subkey)
        if current is not None and current.expiration_time >= expiration_time:
            return False
        self.items[subkey] = ValueWithExpiration(value, expiration_time)
        return True

    def drop_expired(self, now: float) -> None:
        """Forget the sub-keys that have expired at ``now``."""
        for subkey in [k for k, item in self.items.items() if item.expiration_time < now]:
            del self.items[subkey]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)


@dataclass(frozen=True)
class TensorDescriptor:
    """hivemind's ``BatchTensorDescriptor`` without torch: ``size`` has ``None`` for the batch
    dimension; ``dtype`` and ``layout`` are torch's names (``"torch.float32"``)."""

    size: tuple
    dtype: str | None = "torch.float32"
    layout: str | None = "torch.strided"
    requires_grad: bool = False
    pin_memory: bool = False
    compression: int = 0
    device_type: str | None = None
    device_index: int | None = None


def _encode(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(TUPLE_EXT, dumps(list(obj)))
    if isinstance(obj, DictionaryValue):
        items = [[key, item.value, item.expiration_time] for key, item in obj.items.items()]
        return msgpack.ExtType(DICTIONARY_EXT, dumps([obj.maxsize, obj.latest_expiration_time, items]))
    if isinstance(obj, TensorDescriptor):
        # field order as hivemind's asdict() gives it, so that our bytes equal hivemind's
        fields = {
            "size": tuple(obj.size),
            "dtype": obj.dtype,
            "layout": obj.layout,
            "requires_grad": obj.requires_grad,
            "pin_memory": obj.pin_memory,
            "compression": int(obj.compression),
            "device_type": obj.device_type,
            "device_index": obj.device_index,
        }
        return msgpack.ExtType(TENSOR_DESCRIPTOR_EXT, dumps(fields))
    raise TypeError(f"hivemind's msgpack cannot encode {type(obj).__name__}")


def dumps(obj: Any) -> bytes:
    """``obj`` in hivemind's msgpack dialect (TypeError for what it cannot carry)."""
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=_encode)


class _Decoder:
    def __init__(self, limits: DecodeLimits) -> None:
        self.limits = limits
        self.depth = 0
        self.objects = 0

    def _count(self, objects: int) -> None:
        self.objects += objects
        if self.objects > self.limits.max_objects:
            raise MalformedValue(f"msgpack value holds more than {self.limits.max_objects} objects")

    # Every object once: the root of each ``loads`` here, and each element (each key and value
    # of a map) when its container completes. An ext type is an element of its container, and
    # its payload's root one more object.
    def _array(self, items: list) -> list:
        self._count(len(items))
        return items

    def _map(self, items: dict) -> dict:
        self._count(2 * len(items))
        return items

    def loads(self, data: bytes) -> Any:
        limits = self.limits
        self._count(1)
        return msgpack.unpackb(
            data, raw=False, ext_hook=self.ext, strict_map_key=False, list_hook=self._array, object_hook=self._map,
            max_str_len=limits.max_bytes, max_bin_len=limits.max_bytes, max_ext_len=limits.max_bytes,
            max_array_len=limits.max_container, max_map_len=limits.max_container,
        )

    def ext(self, code: int, data: bytes) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_EXT_DEPTH:
                raise MalformedValue("msgpack extension types nested too deep")
            if code == TUPLE_EXT:
                items = self.loads(data)
                if not isinstance(items, list):
                    raise MalformedValue("tuple extension does not hold an array")
                return tuple(items)
            if code == DICTIONARY_EXT:
                return self._dictionary(self.loads(data))
            if code == TENSOR_DESCRIPTOR_EXT:
                return self._descriptor(self.loads(data))
            # hivemind keeps unknown ext types as raw bytes (with a warning); so do we
            return bytes(data)
        finally:
            self.depth -= 1

    @staticmethod
    def _dictionary(raw: Any) -> DictionaryValue:
        if not (isinstance(raw, list) and len(raw) == 3 and isinstance(raw[2], list)):
            raise MalformedValue("dictionary value is not [maxsize, latest_expiration, items]")
        maxsize, latest, items = raw
        if maxsize is not None and not isinstance(maxsize, (int, float)):
            raise MalformedValue("dictionary value maxsize is not a number")
        if not isinstance(latest, (int, float)):
            raise MalformedValue("dictionary value expiration is not a number")
        result = DictionaryValue(maxsize=maxsize)
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                raise MalformedValue("dictionary item is not [subkey, value, expiration]")
            subkey, value, expiration = item
            if not isinstance(value, bytes) or not isinstance(expiration, (int, float)):
                raise MalformedValue("dictionary item has a non-bytes value or a non-numeric expiration")
            try:
                hash(subkey)
            except TypeError:
                raise MalformedValue("dictionary sub-key is not hashable") from None
            result.store(subkey, value, float(expiration))
        result.latest_expiration_time = float(latest)
        return result

    @staticmethod
    def _descriptor(raw: Any) -> TensorDescriptor:
        if not isinstance(raw, dict) or not isinstance(raw.get("size"), (tuple, list)):
            raise MalformedValue("tensor descriptor is not a map with a size")
        size = tuple(raw["size"])
        if not all(dim is None or isinstance(dim, int) for dim in size):
            raise MalformedValue("tensor descriptor size holds a non-integer")
        strings = {name: raw.get(name) for name in ("dtype", "layout", "device_type")}
        if not all(value is None or isinstance(value, str) for value in strings.values()):
            raise MalformedValue("tensor descriptor names are not strings")
        index = raw.get("device_index")
        compression = raw.get("compression", 0)
        if not (index is None or isinstance(index, int)) or not isinstance(compression, int):
            raise MalformedValue("tensor descriptor has a non-integer device index or compression")
        return TensorDescriptor(
            size=size,
            dtype=strings["dtype"],
            layout=strings["layout"],
            requires_grad=bool(raw.get("requires_grad", False)),
            pin_memory=bool(raw.get("pin_memory", False)),
            compression=compression,
            device_type=strings["device_type"],
            device_index=index,
        )


def loads(data: bytes, limits: DecodeLimits = DEFAULT_DECODE_LIMITS) -> Any:
    """A value from hivemind's msgpack, within ``limits``; any malformed input, or one that
    exceeds them, raises ``MalformedValue``."""
    if len(data) > limits.max_bytes:
        raise MalformedValue(f"msgpack value of {len(data)} bytes exceeds {limits.max_bytes}")
    try:
        return _Decoder(limits).loads(bytes(data))
    except MalformedValue:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        raise MalformedValue(f"malformed msgpack value: {type(exc).__name__}: {exc}"[:300]) from None


__all__ = [
    "DICTIONARY_EXT",
    "DictionaryValue",
    "MalformedValue",
    "TENSOR_DESCRIPTOR_EXT",
    "TUPLE_EXT",
    "TensorDescriptor",
    "ValueWithExpiration",
    "dumps",
    "loads",
]
