"""Every bound of the hivemind personality, in one place (DESIGN.md: limits are part of the protocol)."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024

# p2pd's persistentConnMaxMsgSize default (hivemind DEFAULT_MAX_MSG_SIZE): one unary message.
MAX_UNARY_MESSAGE = 4 * 1024 * 1024
# hivemind clients switch to the *_stream RPCs above this payload (MAX_UNARY_PAYLOAD_SIZE).
MAX_UNARY_PAYLOAD = MAX_UNARY_MESSAGE // 2
# One frame of a stream call. hivemind splits tensors into parts of DEFAULT_MAX_MSG_SIZE (4 MiB,
# split_for_streaming in its moe client and server), so 16 MiB leaves room for metadata without
# letting a peer make us buffer GBs.
MAX_STREAM_FRAME = 16 * 1024 * 1024
# Frames one stream call may send us before its end marker (a forward of a very large batch).
MAX_STREAM_FRAMES = 4096
# Bytes all frames of one stream call may add up to.
MAX_STREAM_TOTAL = 256 * 1024 * 1024
# A unary call's id is a UUID (16 bytes); protocol ids are short ascii names.
CALL_ID_BYTES = 16
MAX_PROTOCOL_NAME = 256
# An RPC error message we send or keep (hivemind sends repr(exception)).
MAX_ERROR_MESSAGE = 4096

# hivemind DHT ids are 160-bit.
DHTID_BYTES = 20


@dataclass(frozen=True)
class DoorLimits:
    """What one hivemind service's callers may make us hold (``door.Door``): request bytes being
    read or served at once, per peer, per source address (a household's peers, or one attacker's
    many identities) and for all peers (reserved from the Host's resource manager as lengths are
    announced), the largest unary request, and how fast a request must arrive: after ``grace``
    seconds, ``min_rate`` bytes a second on average (half of a 1 Mbit/s home uplink, so two calls
    at once still pass on the slowest links we expect)."""

    per_peer: int
    per_address: int
    total: int
    max_request: int
    min_rate: float = 64 * 1024
    grace: float = 2.0
    # each part of an answer must be taken within this long (and its bytes at ``min_rate``):
    # generous, since what an answer holds is reserved anyway, and a busy loop of our own, or a
    # caller's, counts against it too
    answer_grace: float = 10.0


@dataclass(frozen=True)
class DecodeLimits:
    """What one msgpack value may make us build (``serializer.loads``). Every msgpack object
    counts, ext payloads' included: a 1-byte empty map is a 64-byte dict, so bytes alone do not
    bound memory. hivemind's largest honest value is a dictionary value of one grid dimension's
    sub-keys (``[maxsize, latest, [[subkey, value, expiration], ...]]``: about 5 objects a
    sub-key), so 65536 objects hold 4096 sub-keys with room to spare and cost at most ~5 MiB."""

    # objects in one decoded value (containers, scalars, ext types)
    max_objects: int = 65536
    # elements of one array or map (a dictionary value's item list: at most DHTLimits.max_subkeys)
    max_container: int = 8192
    # bytes of the whole input, and of one str, bin or ext payload in it: the largest value
    # hivemind's DHT carries, a dictionary of a grid dimension's declarations, is ~600 KiB. Scalars
    # inside unfinished containers are counted late, and the costliest (a 2-character str) takes
    # ~22 bytes of memory per input byte: a refused value peaks at ~22 MiB plus the object budget
    max_bytes: int = 1024 * 1024


DEFAULT_DECODE_LIMITS = DecodeLimits()


@dataclass(frozen=True)
class DHTLimits:
    """Bounds of the hivemind DHT service (our storage and what one request may ask of it).

    Sizes follow what hivemind 1.1's own DHT sends (``hivemind/dht/node.py``, ``protocol.py``,
    ``moe/server/dht_handler.py``): a find asks for at most ``chunk_size`` (16) keys; a store
    carries one key's items from ``store_many`` (a server declaring its experts: one item per
    expert under a grid prefix) or a new neighbour's hand-off of small records; values are
    expert declarations, averaging keys and progress records of tens to hundreds of bytes;
    sub-keys are grid coordinates (ints), peer ids (~40 bytes) or public keys (~400 bytes).
    """

    # keys per find request (hivemind asks for at most chunk_size = 16 at once)
    max_keys_per_request: int = 256
    # items per store request: store_many sends all of one key's sub-keys in one call, so a
    # server declaring a whole grid dimension sends one item per expert (as many as max_subkeys)
    max_store_items: int = 4096
    # one regular or sub-key value (msgpack bytes); hivemind's records are < 1 KiB
    max_value_bytes: int = 64 * 1024
    # one sub-key, msgpack-packed (an RSA public key, the largest hivemind uses, is ~400 bytes),
    # and the objects it decodes to (hivemind's are one int or bytes; a tuple of a few leaves room)
    max_subkey_bytes: int = 1024
    max_subkey_objects: int = 64
    # keys kept in our storage, and sub-keys in one dictionary value
    max_stored_keys: int = 100_000
    max_subkeys: int = 4096
    # bytes our storage may hold, every entry counted as its value, its decoded sub-key's memory
    # and ``entry_overhead`` (the Python objects that keep it and its bookkeeping: measured with
    # tracemalloc at ~540 bytes an entry, regular or sub-key): 48 MiB is ~75000 declarations
    max_stored_bytes: int = 48 * MiB
    entry_overhead: int = 576
    # what one peer's stores may hold of it: a server declaring 4096 experts holds ~6 MiB;
    # a full storage takes room from the largest holder first
    max_stored_bytes_per_peer: int = 12 * MiB
    # clocks disagree (hivemind's own bound is 3 s); an expiration further than this ahead of our
    # clock is capped to it, so a peer can't pin a record forever
    max_expiration_ahead: float = 24 * 3600.0
    # nearest peers returned per key (hivemind's bucket_size)
    bucket_size: int = 20
    # contacts kept in the routing table
    max_contacts: int = 2048
    # peers asked in parallel during a lookup, and lookup rounds
    alpha: int = 3
    max_lookup_rounds: int = 8
    # one RPC to a hivemind peer (hivemind's wait_timeout default is 3 s)
    rpc_timeout: float = 5.0
    # the door: one request as it arrives is at most 1 MiB (a store of 4096 declarations is
    # ~600 KiB; p2pd's own bound is 4 MiB, which hivemind's DHT never comes near); hivemind runs
    # 4 DHT workers a node, each with one request of a few KiB in flight, so 4 MiB a peer is room
    # for four of the largest stores at once; 8 MiB an address (a household's few nodes), 16 MiB
    # for all peers (thousands of honest requests at once)
    door: DoorLimits = DoorLimits(per_peer=4 * MiB, per_address=8 * MiB, total=16 * MiB, max_request=1 * MiB)


DEFAULT_DHT_LIMITS = DHTLimits()


@dataclass(frozen=True)
class ExpertLimits:
    """Bounds and periods of the hivemind expert service (``experts.HivemindExperts``)."""

    # tensors one ExpertRequest may carry (inputs, or inputs + output gradients)
    max_tensors: int = 64
    # parts a streamed tensor may be split into (hivemind splits at DEFAULT_MAX_MSG_SIZE, 4 MiB)
    max_parts: int = MAX_STREAM_FRAMES
    # bytes of one tensor once its streamed parts are joined
    max_tensor_bytes: int = MAX_STREAM_TOTAL
    # our stream answers are split into parts of this many buffer bytes: a frame stays far below
    # any reader's bound, hivemind's included
    stream_part_bytes: int = MAX_UNARY_PAYLOAD
    # a caller has this long to deliver its request, and the expert this long to answer it
    read_timeout: float = 60.0
    # ... and its bytes must keep arriving (``DoorLimits``: ``min_rate`` after ``grace``): a
    # tensor may take a few seconds to start on a slow link; the budgets of the door are
    # ``ExpertsConfig.hivemind_request_bytes_*``
    min_body_rate: float = 64 * 1024
    body_grace: float = 5.0

    def door(self, per_peer: int, per_address: int, total: int) -> DoorLimits:
        """The expert service's door limits with the budgets ``ExpertsConfig`` gives."""
        return DoorLimits(per_peer, per_address, total, MAX_UNARY_MESSAGE, self.min_body_rate, self.body_grace)
    # hivemind's DHTHandlerThread: declare every 30 s, records expire 60 s after each declaration
    declare_period: float = 30.0
    declare_expiration: float = 60.0


DEFAULT_EXPERT_LIMITS = ExpertLimits()


@dataclass(frozen=True)
class KadLimits:
    """Bounds of our ``/ipfs/kad/1.0.0`` peer routing (``kad.KadPeerRouting``)."""

    # one kad message (go-libp2p-kad-dht's own bound is 4 MiB)
    max_message: int = 4 * 1024 * 1024
    # what callers may make us hold: requests are FIND_NODE/PING of a ~40-byte key (64 KiB is
    # generous), a few at once a peer
    door: DoorLimits = DoorLimits(per_peer=256 * 1024, per_address=1 * MiB, total=8 * MiB, max_request=64 * 1024)
    # peers in one answer (go's bucket size), and addresses kept per peer of an answer
    max_closer: int = 20
    max_addrs: int = 16
    # requests one inbound stream may carry (go reuses streams) and how long it may sit idle
    max_requests_per_stream: int = 256
    idle_timeout: float = 60.0
    # one request we make, peers asked at once, and rounds of a lookup
    rpc_timeout: float = 5.0
    alpha: int = 3
    max_rounds: int = 6


DEFAULT_KAD_LIMITS = KadLimits()
