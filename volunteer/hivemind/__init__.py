"""The hivemind personality: speak hivemind 1.1's wire (its RPC framings over libp2p streams, its
DHT) from a volunteer Host, as a service of its own beside our DHT and experts.

Layers inside: ``framing`` / ``serializer`` / ``dhtid`` / ``dht_protocol`` / ``storage`` /
``lookup`` are pure (bytes in, bytes or events out, ``now`` passed in); ``rpc`` and ``dht`` are the
thin trio drivers. See docs in each module.
"""

from .dht import HivemindDHT
from .dhtid import key_id, random_id
from .errors import HivemindError, HivemindFrameError, HivemindRPCError, HivemindUnsupported
from .serializer import DictionaryValue, TensorDescriptor, ValueWithExpiration, dumps, loads

__all__ = [
    "DictionaryValue",
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
