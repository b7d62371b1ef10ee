"""DHT messages: msgpack maps, one request and one response per stream, uvarint length-prefixed.

Protocol ``/volunteer/<swarm-id>/dht/1.0.0``. Every message is a msgpack map with an ``op`` and
short field names; unknown fields are ignored (room to grow), but every known field is checked
for type and bound. Anything else raises DHTMessageError; the responder answers with an ``error``
reply and closes the stream.

Requests (``cm``: the sender is in client mode, never add it to a routing table; ``ad``: its
multiaddrs, binary)::

    {op: "ping",       cm, ad}
    {op: "store",      cm, ad, rs: [record, ...], nr: 32-byte target ID}   # nr optional
    {op: "find_node",  cm, ad, tg: 32-byte target ID}
    {op: "find_value", cm, ad, ks: [key, ...], wt: true}   # wt (optional): watch these keys

``wt``: the requester caches what it finds (``get_many(max_age=...)``, beam search); for
``watch_age`` seconds the responder forwards it every tombstone it accepts under these keys, in a
STORE, before it answers the STORE that brought the tombstone (``watch.py``), so a leaver's
withdrawal reaches the caches before it returns. Peers that predate ``wt`` ignore it.

``nr``: the STORE also answers as a FIND_NODE for that target (its reply's ``ps``), so a store's
lookup asks the peers it stores on once, not twice. Peers that predate it reply without ``ps``:
the lookup then learns no contacts from them, as from a peer that knows nobody closer.

Responses::

    {op: "pong",   cm}
    {op: "stored", cm, ok: [code per record],              # "ok", "stale" or a refusal code
                   ps: [contact, ...]}                     # only when the STORE had nr
    {op: "nodes",  cm, ps: [contact, ...]}
    {op: "values", cm, ps: [contact, ...],                 # contacts shared by all keys
                       vs: [[[record, ...], [index into ps, ...]] per key, in request order]}
    {op: "error",  code, msg}

    record  = [key, sub-key, value | nil, expiration (float), signer PeerID bytes, signature]
    contact = [PeerID bytes, [multiaddr bytes, ...]]

Multiaddrs stay bytes here (bounded in size and count); the driver parses them when it dials.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Union

import msgpack

from ..errors import DHTMessageError, LocalProtocolError, PeerIDError
from ..net.identity import PeerID
from ..net.varint import decode_uvarint, encode_uvarint
from .config import DHTConfig
from .records import Record
from .routing import Contact

TARGET_SIZE = 32


# --- requests -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ping:
    """PING: are you alive?"""

    client_mode: bool = False
    addrs: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Store:
    """STORE many records in one round trip; ``near``: a 32-byte target to also answer a
    FIND_NODE for (the reply's ``closer``)."""

    records: tuple[Record, ...]
    client_mode: bool = False
    addrs: tuple[bytes, ...] = ()
    near: bytes | None = None


@dataclass(frozen=True)
class FindNode:
    """FIND_NODE: the k contacts closest to a 32-byte ID."""

    target: bytes
    client_mode: bool = False
    addrs: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class FindValue:
    """FIND_VALUE of many keys: records and closer contacts for each; ``watch``: forward me
    tombstones of these keys for a while (the requester caches the result)."""

    keys: tuple[bytes, ...]
    client_mode: bool = False
    addrs: tuple[bytes, ...] = ()
    watch: bool = False


Request = Union[Ping, Store, FindNode, FindValue]


# --- responses ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pong:
    """Reply to PING."""

    client_mode: bool = False


@dataclass(frozen=True)
class Stored:
    """Reply to STORE: one code per record; ``closer``: contacts closest to the STORE's ``near``."""

    codes: tuple[str, ...]
    client_mode: bool = False
    closer: tuple[Contact, ...] = ()


@dataclass(frozen=True)
class Nodes:
    """Reply to FIND_NODE."""

    peers: tuple[Contact, ...]
    client_mode: bool = False


@dataclass(frozen=True)
class KeyResult:
    """What a FIND_VALUE reply holds for one key."""

    records: tuple[Record, ...]
    closer: tuple[Contact, ...]


@dataclass(frozen=True)
class Values:
    """Reply to FIND_VALUE: one KeyResult per requested key, in order."""

    results: tuple[KeyResult, ...]
    client_mode: bool = False


@dataclass(frozen=True)
class ErrorReply:
    """The request was refused; ``code`` is machine-readable."""

    code: str
    message: str = ""


Response = Union[Pong, Stored, Nodes, Values, ErrorReply]

_REPLY_TO = {Ping: Pong, Store: Stored, FindNode: Nodes, FindValue: Values}


# --- framing ----------------------------------------------------------------------------------
def frame(body: bytes) -> bytes:
    """Length-prefix a message body."""
    return encode_uvarint(len(body)) + body


def unframe(data: bytes, config: DHTConfig) -> bytes:
    """The body of one complete framed message (tests and buffered callers); strict about lengths."""
    try:
        decoded = decode_uvarint(data)
    except Exception as exc:  # RemoteProtocolError for over-long varints
        raise DHTMessageError(f"bad length prefix: {exc}", hint="bad length prefix") from None
    if decoded is None:
        raise DHTMessageError("truncated length prefix", hint="truncated message")
    length, pos = decoded
    if length > config.max_message_size:
        raise DHTMessageError(f"message of {length} bytes exceeds {config.max_message_size}", hint="too large")
    if len(data) - pos != length:
        raise DHTMessageError("message length does not match its prefix", hint="bad length")
    return bytes(data[pos:])


# --- encoding -----------------------------------------------------------------------------------
def record_to_wire(record: Record) -> list:
    """The msgpack form of a record."""
    signer = record.signer.to_bytes()
    return [record.key, record.subkey, record.value, float(record.expiration), signer, record.signature]


def contact_to_wire(contact: Contact) -> list:
    """The msgpack form of a contact."""
    return [contact.peer.to_bytes(), list(contact.addrs)]


def _pack(obj: dict, config: DHTConfig) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > config.max_message_size:
        raise LocalProtocolError(f"DHT message of {len(body)} bytes exceeds {config.max_message_size}")
    return frame(body)


def encode_request(request: Request, config: DHTConfig) -> bytes:
    """Framed bytes of a request."""
    msg: dict[str, Any] = {"cm": bool(request.client_mode), "ad": list(request.addrs)}
    if isinstance(request, Ping):
        msg["op"] = "ping"
    elif isinstance(request, Store):
        msg["op"] = "store"
        msg["rs"] = [record_to_wire(r) for r in request.records]
        if request.near is not None:
            if len(request.near) != TARGET_SIZE:
                raise LocalProtocolError("a STORE's near target must be 32 bytes")
            msg["nr"] = bytes(request.near)
    elif isinstance(request, FindNode):
        if len(request.target) != TARGET_SIZE:
            raise LocalProtocolError("FIND_NODE target must be 32 bytes")
        msg["op"] = "find_node"
        msg["tg"] = bytes(request.target)
    elif isinstance(request, FindValue):
        msg["op"] = "find_value"
        msg["ks"] = list(request.keys)
        if request.watch:
            msg["wt"] = True
    else:
        raise LocalProtocolError(f"not a DHT request: {request!r}")
    return _pack(msg, config)


def encode_response(response: Response, config: DHTConfig) -> bytes:
    """Framed bytes of a response."""
    if isinstance(response, ErrorReply):
        msg: dict[str, Any] = {
            "op": "error",
            "code": response.code[:64],
            "msg": response.message[: config.max_error_text],
        }
        return _pack(msg, config)
    msg = {"cm": bool(response.client_mode)}
    if isinstance(response, Pong):
        msg["op"] = "pong"
    elif isinstance(response, Stored):
        msg["op"] = "stored"
        msg["ok"] = list(response.codes)
        if response.closer:
            msg["ps"] = [contact_to_wire(c) for c in response.closer]
    elif isinstance(response, Nodes):
        msg["op"] = "nodes"
        msg["ps"] = [contact_to_wire(c) for c in response.peers]
    elif isinstance(response, Values):
        table: dict[Contact, int] = {}
        per_key = []
        for result in response.results:
            indices = [table.setdefault(c, len(table)) for c in result.closer]
            per_key.append([[record_to_wire(r) for r in result.records], indices])
        msg["op"] = "values"
        msg["ps"] = [contact_to_wire(c) for c in table]
        msg["vs"] = per_key
    else:
        raise LocalProtocolError(f"not a DHT response: {response!r}")
    return _pack(msg, config)


# --- decoding -------------------------------------------------------------------------------------
def _fail(message: str) -> DHTMessageError:
    return DHTMessageError(message, hint=message)


def _unpack(body: bytes, config: DHTConfig) -> dict:
    if len(body) > config.max_message_size:
        raise _fail("message too large")
    try:
        msg = msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=config.max_message_size,
            max_str_len=config.max_message_size,
            max_array_len=max(config.max_records_per_request, config.max_contacts, config.max_keys_per_request, 6),
            max_map_len=32,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise _fail(f"malformed msgpack ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise _fail("message is not a map")
    return msg


def _field(msg: dict, name: str, kind: type | tuple, default: Any = None, required: bool = True) -> Any:
    if name not in msg:
        if required:
            raise _fail(f"missing field {name!r}")
        return default
    value = msg[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(f"field {name!r} has the wrong type")
    return value


def _list(value: Any, limit: int, what: str) -> list:
    if not isinstance(value, list):
        raise _fail(f"{what} is not a list")
    if len(value) > limit:
        raise _fail(f"{what}: {len(value)} entries exceed {limit}")
    return value


def _bytes(value: Any, limit: int, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise _fail(f"{what} is not bytes")
    if len(value) > limit:
        raise _fail(f"{what} of {len(value)} bytes exceeds {limit}")
    return value


# Every FIND_NODE reply names up to k peers, mostly the same ones again: parsing each (its public
# key included) was a quarter of a store's CPU on 32 nodes. PeerIDs are immutable; invalid input
# raises and is not cached.
_decode_peer = functools.lru_cache(maxsize=16384)(PeerID.from_bytes)


def _peer(value: Any, config: DHTConfig) -> PeerID:
    data = _bytes(value, config.max_peer_id_size, "peer ID")
    try:
        return _decode_peer(data)
    except PeerIDError as exc:
        raise _fail(f"invalid peer ID: {exc}") from None


def _addrs(value: Any, config: DHTConfig) -> tuple[bytes, ...]:
    items = _list(value, config.max_addrs, "addrs")
    return tuple(_bytes(a, config.max_addr_size, "multiaddr") for a in items)


def _record(value: Any, config: DHTConfig) -> Record:
    if not isinstance(value, list) or len(value) != 6:
        raise _fail("a record is a list of 6 fields")
    key, subkey, val, expiration, signer, signature = value
    if val is not None:
        val = _bytes(val, config.max_value_size, "value")
    if not isinstance(expiration, float) or not math.isfinite(expiration):
        raise _fail("record expiration is not a finite float")
    return Record(
        _bytes(key, config.max_key_size, "key"),
        _bytes(subkey, config.max_subkey_size, "sub-key"),
        val,
        expiration,
        _peer(signer, config),
        _bytes(signature, config.max_signature_size, "signature"),
    )


def _contact(value: Any, config: DHTConfig) -> Contact:
    if not isinstance(value, list) or len(value) != 2:
        raise _fail("a contact is [peer ID, addrs]")
    data = _bytes(value[0], config.max_peer_id_size, "peer ID")
    addrs = _addrs(value[1], config)
    try:
        return _make_contact(data, addrs)
    except PeerIDError as exc:
        raise _fail(f"invalid peer ID: {exc}") from None


# The same few dozen contacts come back in every reply (30 a reply, ~240 a store at 32 nodes):
# building each Contact (its node ID is a sha256) was a third of a concurrent store's client CPU.
# Contacts are immutable; the inputs are checked against the config's bounds before the cache.
@functools.lru_cache(maxsize=16384)
def _make_contact(peer: bytes, addrs: tuple[bytes, ...]) -> Contact:
    return Contact(_decode_peer(peer), addrs)


def decode_request(body: bytes, config: DHTConfig) -> Request:
    """Parse a request body (without its length prefix). Raises DHTMessageError."""
    msg = _unpack(body, config)
    op = _field(msg, "op", str)
    client_mode = _field(msg, "cm", bool, False, required=False)
    addrs = _addrs(msg.get("ad", []), config)
    if op == "ping":
        return Ping(client_mode, addrs)
    if op == "store":
        items = _list(_field(msg, "rs", list), config.max_records_per_request, "records")
        near = _field(msg, "nr", bytes, None, required=False)
        if near is not None and len(near) != TARGET_SIZE:
            raise _fail("a STORE's near target must be 32 bytes")
        return Store(tuple(_record(r, config) for r in items), client_mode, addrs, near)
    if op == "find_node":
        target = _field(msg, "tg", bytes)
        if len(target) != TARGET_SIZE:
            raise _fail("FIND_NODE target must be 32 bytes")
        return FindNode(target, client_mode, addrs)
    if op == "find_value":
        keys = _list(_field(msg, "ks", list), config.max_keys_per_request, "keys")
        if not keys:
            raise _fail("FIND_VALUE without keys")
        watch = _field(msg, "wt", bool, False, required=False)
        return FindValue(tuple(_bytes(k, config.max_key_size, "key") for k in keys), client_mode, addrs, watch)
    raise _fail(f"unknown request op {op[:32]!r}")


def decode_response(body: bytes, config: DHTConfig, request: Request | None = None) -> Response:
    """Parse a response body; with ``request``, also check it answers that request. Raises DHTMessageError.

    An ``error`` reply is returned as ErrorReply (the caller turns it into DHTRemoteError).
    """
    msg = _unpack(body, config)
    op = _field(msg, "op", str)
    if op == "error":
        code = _field(msg, "code", str)[:64]
        text = _field(msg, "msg", str, "", required=False)[: config.max_error_text]
        return ErrorReply(code, text)
    client_mode = _field(msg, "cm", bool, False, required=False)
    response: Response
    if op == "pong":
        response = Pong(client_mode)
    elif op == "stored":
        codes = _list(_field(msg, "ok", list), config.max_records_per_request, "codes")
        if not all(isinstance(c, str) and len(c) <= 64 for c in codes):
            raise _fail("STORE codes must be short strings")
        closer = _list(_field(msg, "ps", list, [], required=False), config.max_contacts, "contacts")
        response = Stored(tuple(codes), client_mode, tuple(_contact(c, config) for c in closer))
    elif op == "nodes":
        peers = _list(_field(msg, "ps", list), config.max_contacts, "contacts")
        response = Nodes(tuple(_contact(c, config) for c in peers), client_mode)
    elif op == "values":
        table = [_contact(c, config) for c in _list(_field(msg, "ps", list), config.max_contacts, "contacts")]
        results = []
        for item in _list(_field(msg, "vs", list), config.max_keys_per_request, "values"):
            if not isinstance(item, list) or len(item) != 2:
                raise _fail("a key result is [records, contact indices]")
            records = _list(item[0], config.max_records_per_request, "records")
            indices = _list(item[1], config.max_contacts, "contact indices")
            closer = []
            for i in indices:
                if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(table):
                    raise _fail("contact index out of range")
                closer.append(table[i])
            results.append(KeyResult(tuple(_record(r, config) for r in records), tuple(closer)))
        response = Values(tuple(results), client_mode)
    else:
        raise _fail(f"unknown response op {op[:32]!r}")
    if request is not None:
        check_reply(request, response)
    return response


def check_reply(request: Request, response: Response) -> None:
    """Raise DHTMessageError unless ``response`` is a well-formed answer to ``request``."""
    if isinstance(response, ErrorReply):
        return
    expected = _REPLY_TO[type(request)]
    if not isinstance(response, expected):
        raise _fail(f"{type(request).__name__} answered with {type(response).__name__}")
    if isinstance(request, Store) and isinstance(response, Stored) and len(response.codes) != len(request.records):
        raise _fail("STORE reply has the wrong number of codes")
    if isinstance(request, FindValue) and isinstance(response, Values):
        if len(response.results) != len(request.keys):
            raise _fail("FIND_VALUE reply has the wrong number of results")
        for key, result in zip(request.keys, response.results):
            if any(r.key != key for r in result.records):
                raise _fail("FIND_VALUE reply holds records of another key")
