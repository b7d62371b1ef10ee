"""Kademlia DHT over Host streams with signed, expiring records and live-expert declarations.

Sans-I/O cores: ``messages`` (wire format), ``routing`` (k-buckets), ``records`` (signed records,
bounded storage), ``query`` (lookup iterators), ``state`` (a node's request handling), ``experts``
(uid grammar, declarations, beam search). ``config.DHTConfig`` holds every bound.
"""

from .config import DHTConfig, protocol_id
from .experts import (
    BeamSearch,
    Declaration,
    ExpertMatch,
    HostInfo,
    find_best_experts,
    grid_prefixes,
    is_valid_uid,
    make_declarations,
    make_tombstones,
    make_uid,
    parse_uid,
    select_alive,
)
from .query import Lookup, ValueLookup
from .records import Record, Storage, owned_subkey, sign
from .routing import Contact, RoutingTable, key_id, node_id
from .state import Handled, NodeState

__all__ = [
    "BeamSearch",
    "Contact",
    "DHTConfig",
    "Declaration",
    "ExpertMatch",
    "Handled",
    "HostInfo",
    "Lookup",
    "NodeState",
    "Record",
    "RoutingTable",
    "Storage",
    "ValueLookup",
    "find_best_experts",
    "grid_prefixes",
    "is_valid_uid",
    "key_id",
    "make_declarations",
    "make_tombstones",
    "make_uid",
    "node_id",
    "owned_subkey",
    "parse_uid",
    "protocol_id",
    "select_alive",
    "sign",
]
