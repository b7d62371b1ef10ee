"""Kademlia DHT over Host streams with signed, expiring records and the live-expert directory.

Sans-I/O cores: ``messages`` (wire format), ``routing`` (k-buckets), ``records`` (signed records,
bounded, fair storage), ``query`` (lookup iterators), ``state`` (a node's request handling, rate
limits and refusals), ``caches`` (lookup caches, the store fan-out plan), ``grid`` (uid grammar,
declarations, beam search). Drivers: ``node`` (``open_dht``, ``DHTNode``), ``grid``'s lookups over a
node, ``declare`` (``ExpertDeclarer``), ``mdns``. ``config.DHTConfig`` holds every bound.
"""

from .caches import ClosestPeers, RecentValues, StorePlan
from .config import DHTConfig, protocol_id
from .declare import ExpertDeclarer
from .beam import BeamSearch, ExpertMatch, find_best_experts
from .grid import (
    Declaration,
    HostInfo,
    get_experts,
    grid_experts,
    grid_prefixes,
    is_valid_uid,
    list_experts,
    make_declarations,
    make_tombstones,
    make_uid,
    parse_uid,
    select_alive,
    walk_grid,
)
from .node import DHTNode, open_dht
from .query import Lookup, ValueLookup
from .records import Record, Storage, owned_subkey, sign
from .routing import Contact, RoutingTable, key_id, node_id
from .state import Handled, NodeState, source_of

__all__ = [
    "BeamSearch",
    "ClosestPeers",
    "Contact",
    "DHTConfig",
    "DHTNode",
    "Declaration",
    "ExpertDeclarer",
    "ExpertMatch",
    "Handled",
    "HostInfo",
    "Lookup",
    "NodeState",
    "RecentValues",
    "Record",
    "RoutingTable",
    "StorePlan",
    "Storage",
    "ValueLookup",
    "find_best_experts",
    "get_experts",
    "grid_experts",
    "grid_prefixes",
    "is_valid_uid",
    "key_id",
    "list_experts",
    "make_declarations",
    "make_tombstones",
    "make_uid",
    "node_id",
    "open_dht",
    "owned_subkey",
    "parse_uid",
    "protocol_id",
    "select_alive",
    "sign",
    "source_of",
    "walk_grid",
]
