"""The hivemind personality: speak hivemind 1.1's wire (its RPC framings over libp2p streams, its
DHT) from a volunteer Host, as a service of its own beside our DHT and experts.

Layers inside: ``framing`` / ``serializer`` / ``dhtid`` / ``dht_protocol`` / ``storage`` /
``lookup`` are pure (bytes in, bytes or events out, ``now`` passed in); ``rpc`` and ``dht`` are the
thin trio drivers; ``expert_wire`` (pure) and ``experts`` (the ``HivemindExperts`` service) serve
our experts to hivemind clients; ``kad_wire`` (pure) and ``kad`` (``KadPeerRouting``) find peers by
id over ``/ipfs/kad/1.0.0``; ``unsupported`` answers hivemind's averaging RPCs with a clear error;
``client`` and ``trainer`` let our RemoteExpert / RemoteMixtureOfExperts (``Swarm.join``) call
hivemind-hosted experts (``HivemindDirectory``); ``member`` joins a volunteer to hivemind's DHT
(the services a node runs are listed by ``volunteer.kinds.hivemind``); ``listing`` feeds
``volunteer experts``. See docs in each module. ``HivemindExperts`` is loaded on first
use: it brings torch, which a DHT-only node does not need.
"""

from .dht import HivemindDHT
from .dhtid import key_id, random_id
from .errors import HivemindError, HivemindFrameError, HivemindRPCError, HivemindUnsupported
from .serializer import DictionaryValue, TensorDescriptor, ValueWithExpiration, dumps, loads



def __getattr__(name: str):
    if name == "HivemindExperts":
        from .experts import HivemindExperts

        return HivemindExperts
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DictionaryValue",
    "HivemindExperts",
    "HivemindDHT",
    "HivemindError",
    "HivemindFrameError",
    "HivemindRPCError",
    "HivemindUnsupported",
    "TensorDescriptor",
    "ValueWithExpiration",
    "dumps",
    "key_id",
    "loads",
    "random_id",
]
