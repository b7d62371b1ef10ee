"""hivemind's DHT protocol, sans-I/O: answering ``DHTProtocol.rpc_ping|rpc_store|rpc_find`` and
building and reading our own requests. No sockets and no clock: callers pass ``now`` (DHT time).

Protocol ids are hivemind's handler names: ``DHTProtocol.rpc_ping`` and so on (no slash, no
version). Requests and answers are ``hm_dht.proto`` messages carried by the unary framing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..net.identity import PeerID
from ..net.pb.decode import parse
from ..errors import PeerIDError
from .dhtid import id_from_bytes, id_to_bytes
from .errors import HivemindFrameError, HivemindUnsupported
from .limits import DEFAULT_DHT_LIMITS, DecodeLimits, DHTLimits
from .pb import hm_dht_pb2 as pb
from .serializer import DictionaryValue, ValueWithExpiration, dumps, loads
from .storage import Contact, Contacts, Storage

PING = "DHTProtocol.rpc_ping"
STORE = "DHTProtocol.rpc_store"
FIND = "DHTProtocol.rpc_find"
PROTOCOLS = (PING, STORE, FIND)

# hivemind's reserved sub-key tags: msgpack None for a regular value, empty for a whole dictionary
IS_REGULAR_VALUE = dumps(None)
IS_DICTIONARY = b""


@dataclass(frozen=True)
class StoreItem:
    """One entry of a store request: ``value`` is msgpack bytes (or a whole DictionaryValue), and
    ``subkey`` a sub-key object when adding one entry to a dictionary value."""

    key_id: int
    value: bytes | DictionaryValue
    expiration_time: float
    subkey: Any = None
    has_subkey: bool = False
    in_cache: bool = False

    def tag(self) -> bytes:
        """The subkey field hivemind puts on the wire for this item."""
        if isinstance(self.value, DictionaryValue):
            return IS_DICTIONARY
        return dumps(self.subkey) if self.has_subkey else IS_REGULAR_VALUE


@dataclass(frozen=True)
class FindAnswer:
    """What one peer said about one key: its value (if it had one) and its nearest contacts."""

    value: ValueWithExpiration | None
    nearest: list[Contact]


def _refuse_auth(request: Any) -> None:
    if request.auth:
        raise HivemindUnsupported("hivemind authorizers (signed RPCs) are not supported by this node")


def _sender(info: pb.NodeInfo | None) -> int | None:
    if info is None or not info.node_id:
        return None
    return id_from_bytes(info.node_id)


class DHTProtocolCore:
    """One node's side of hivemind's DHT protocol: its node id, storage and contacts.

    In client mode the node sends no node id (peers won't add it to their tables) and serves nothing.
    """

    def __init__(
        self,
        node_id: int,
        limits: DHTLimits = DEFAULT_DHT_LIMITS,
        *,
        client_mode: bool = False,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.limits = limits
        self.client_mode = client_mode
        self.storage = Storage(limits, on_refusal)
        # the storage charges what a decoded sub-key takes in memory
        self.subkey_decoding = DecodeLimits(max_bytes=limits.max_subkey_bytes, max_objects=limits.max_subkey_objects)
        self.contacts = Contacts(node_id, limits)

    def node_info(self) -> pb.NodeInfo:
        """Our NodeInfo as we send it (empty in client mode)."""
        return pb.NodeInfo() if self.client_mode else pb.NodeInfo(node_id=id_to_bytes(self.node_id))

    # --- serving ---------------------------------------------------------------------------

    def parse_ping(self, data: bytes) -> tuple[pb.PingRequest, int | None]:
        """A ping request and the node id it claims (None for a client-mode caller)."""
        request = parse(pb.PingRequest, data, "hivemind PingRequest")
        _refuse_auth(request)
        return request, _sender(request.peer if request.HasField("peer") else None)

    def answer_ping(self, sender: PeerID, sender_node: int | None, now: float, *, available: bool = False) -> bytes:
        """The ping answer; a caller that gave its node id (and, if it asked to be validated,
        answered our ping back: ``available``) joins our contacts."""
        if sender_node is not None:
            self.contacts.add(sender_node, sender)
        return pb.PingResponse(peer=self.node_info(), dht_time=now, available=available).SerializeToString()

    def handle_store(self, data: bytes, sender: PeerID, now: float) -> bytes:
        """Apply a store request; the answer says which items were kept (each charged to ``sender``)."""
        request = parse(pb.StoreRequest, data, "hivemind StoreRequest")
        _refuse_auth(request)
        count = len(request.keys)
        if count > self.limits.max_store_items:
            raise HivemindFrameError(f"store of {count} items exceeds {self.limits.max_store_items}")
        lengths = {len(request.subkeys), len(request.values), len(request.expiration_time), len(request.in_cache)}
        if lengths != {count}:
            raise HivemindFrameError("store request fields are not aligned")
        self._note(request, sender)
        results = []
        for key, tag, value, expiration in zip(request.keys, request.subkeys, request.values, request.expiration_time):
            results.append(self._store_one(id_from_bytes(key), bytes(tag), bytes(value), expiration, now, sender))
        return pb.StoreResponse(store_ok=results, peer=self.node_info()).SerializeToString()

    def _store_one(self, key: int, tag: bytes, value: bytes, expiration: float, now: float, sender: PeerID) -> bool:
        storage = self.storage
        if tag == IS_DICTIONARY:
            # a whole dictionary (a neighbour's hand-off): decoded within the object budget, each
            # sub-key then checked and charged as if stored alone
            dictionary = loads(value)
            if not isinstance(dictionary, DictionaryValue):
                raise HivemindFrameError("a dictionary store does not carry a dictionary value")
            if len(dictionary) > self.limits.max_subkeys:
                return False
            return all(
                storage.store_subkey(key, subkey, item.value, item.expiration_time, now, holder=sender)
                for subkey, item in dictionary.items.items()
            )
        if tag == IS_REGULAR_VALUE:
            return storage.store(key, value, expiration, now, holder=sender)
        if not storage.fits_subkey(len(tag)):  # refused before it is decoded
            return False
        subkey = loads(tag, self.subkey_decoding)
        try:
            hash(subkey)
        except TypeError:
            raise HivemindFrameError("store sub-key is not hashable") from None
        return storage.store_subkey(key, subkey, value, expiration, now, holder=sender, subkey_bytes=len(tag))

    def handle_find(self, data: bytes, sender: PeerID, now: float) -> bytes:
        """Answer a find request: each key's value if we hold it, and our contacts nearest to it."""
        request = parse(pb.FindRequest, data, "hivemind FindRequest")
        _refuse_auth(request)
        if len(request.keys) > self.limits.max_keys_per_request:
            raise HivemindFrameError(f"find of {len(request.keys)} keys exceeds {self.limits.max_keys_per_request}")
        requester = self._note(request, sender)
        response = pb.FindResponse(peer=self.node_info())
        for raw_key in request.keys:
            key = id_from_bytes(raw_key)
            item = self.storage.get(key, now)
            if item is None:
                result = pb.FindResult(type=pb.NOT_FOUND)
            elif isinstance(item.value, DictionaryValue):
                result = pb.FindResult(
                    type=pb.FOUND_DICTIONARY, value=dumps(item.value), expiration_time=item.expiration_time
                )
            else:
                result = pb.FindResult(type=pb.FOUND_REGULAR, value=item.value, expiration_time=item.expiration_time)
            for contact in self.contacts.nearest(key, self.limits.bucket_size, exclude=requester):
                result.nearest_node_ids.append(id_to_bytes(contact.node_id))
                result.nearest_peer_ids.append(contact.peer.to_bytes())
            response.results.append(result)
        return response.SerializeToString()

    def _note(self, request: Any, sender: PeerID) -> int | None:
        """A store or find that carries the caller's node id counts as a ping from it."""
        node = _sender(request.peer) if request.HasField("peer") else None
        if node is not None:
            self.contacts.add(node, sender)
        return node

    # --- asking ----------------------------------------------------------------------------

    def ping_request(self, validate: bool = False) -> bytes:
        """Our ping request."""
        return pb.PingRequest(peer=self.node_info(), validate=validate).SerializeToString()

    def read_ping(self, peer: PeerID, data: bytes) -> pb.PingResponse:
        """A ping answer; a peer that gives its node id joins our contacts."""
        response = parse(pb.PingResponse, data, "hivemind PingResponse")
        node = _sender(response.peer) if response.HasField("peer") else None
        if node is not None:
            self.contacts.add(node, peer)
        return response

    def store_request(self, items: Sequence[StoreItem]) -> bytes:
        """A store request for ``items``."""
        request = pb.StoreRequest(peer=self.node_info())
        for item in items:
            request.keys.append(id_to_bytes(item.key_id))
            request.subkeys.append(item.tag())
            request.values.append(dumps(item.value) if isinstance(item.value, DictionaryValue) else item.value)
            request.expiration_time.append(item.expiration_time)
            request.in_cache.append(item.in_cache)
        return request.SerializeToString()

    def read_store(self, peer: PeerID, data: bytes, count: int) -> list[bool]:
        """Which of ``count`` items the peer kept."""
        response = parse(pb.StoreResponse, data, "hivemind StoreResponse")
        if len(response.store_ok) != count:
            raise HivemindFrameError("store answer is not aligned with the request")
        node = _sender(response.peer) if response.HasField("peer") else None
        if node is not None:
            self.contacts.add(node, peer)
        return list(response.store_ok)

    def find_request(self, keys: Sequence[int]) -> bytes:
        """A find request for ``keys``."""
        return pb.FindRequest(keys=[id_to_bytes(k) for k in keys], peer=self.node_info()).SerializeToString()

    def read_find(self, peer: PeerID, data: bytes, keys: Sequence[int]) -> list[FindAnswer]:
        """What the peer said about each of ``keys``, in order."""
        response = parse(pb.FindResponse, data, "hivemind FindResponse")
        if len(response.results) != len(keys):
            raise HivemindFrameError("find answer is not aligned with the request")
        node = _sender(response.peer) if response.HasField("peer") else None
        if node is not None:
            self.contacts.add(node, peer)
        answers = []
        for result in response.results:
            if len(result.nearest_node_ids) != len(result.nearest_peer_ids):
                raise HivemindFrameError("find answer's nearest ids are not aligned")
            nearest = []
            for raw_node, raw_peer in list(zip(result.nearest_node_ids, result.nearest_peer_ids))[: self.limits.bucket_size]:
                try:
                    nearest.append(Contact(id_from_bytes(raw_node), PeerID.from_bytes(raw_peer)))
                except PeerIDError as exc:
                    raise HivemindFrameError(f"find answer holds a bad peer id: {exc}") from None
            value: ValueWithExpiration | None = None
            if result.type == pb.FOUND_REGULAR:
                value = ValueWithExpiration(bytes(result.value), result.expiration_time)
            elif result.type == pb.FOUND_DICTIONARY:
                dictionary = loads(result.value)
                if not isinstance(dictionary, DictionaryValue):
                    raise HivemindFrameError("FOUND_DICTIONARY does not carry a dictionary value")
                value = ValueWithExpiration(dictionary, result.expiration_time)
            answers.append(FindAnswer(value, nearest))
        return answers


def merge(best: ValueWithExpiration | None, found: ValueWithExpiration | None) -> ValueWithExpiration | None:
    """Two answers for one key made one: the later expiration wins; dictionaries merge by sub-key."""
    if found is None:
        return best
    if best is None:
        return found
    if isinstance(best.value, DictionaryValue) and isinstance(found.value, DictionaryValue):
        merged = DictionaryValue(dict(best.value.items))
        merged.latest_expiration_time = best.value.latest_expiration_time
        for subkey, item in found.value.items.items():
            merged.store(subkey, item.value, item.expiration_time)
        return ValueWithExpiration(merged, max(best.expiration_time, found.expiration_time))
    return found if found.expiration_time > best.expiration_time else best


__all__ = [
    "DHTProtocolCore",
    "FIND",
    "FindAnswer",
    "IS_DICTIONARY",
    "IS_REGULAR_VALUE",
    "PING",
    "PROTOCOLS",
    "STORE",
    "StoreItem",
    "merge",
]
