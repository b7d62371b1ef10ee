"""Every bound of the hivemind personality, in one place (DESIGN.md: limits are part of the protocol)."""

from __future__ import annotations

from dataclasses import dataclass

# p2pd's persistentConnMaxMsgSize default (hivemind DEFAULT_MAX_MSG_SIZE): one unary message.
MAX_UNARY_MESSAGE = 4 * 1024 * 1024
# hivemind clients switch to the *_stream RPCs above this payload (MAX_UNARY_PAYLOAD_SIZE).
MAX_UNARY_PAYLOAD = MAX_UNARY_MESSAGE // 2
# One frame of a stream call. hivemind splits tensors into chunks of ~2 MiB (DEFAULT_MAX_MSG_SIZE
# // 2 in its moe client), so 16 MiB leaves room for metadata without letting a peer make us buffer GBs.
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
class DHTLimits:
    """Bounds of the hivemind DHT service (our storage and what one request may ask of it)."""

    # keys per store or find request (hivemind batches a few dozen at most)
    max_keys_per_request: int = 256
    # one value (msgpack bytes) as hivemind sends it; experts' declarations are tens of bytes
    max_value_bytes: int = 1024 * 1024
    # keys kept in our storage, and sub-keys in one dictionary value
    max_stored_keys: int = 100_000
    max_subkeys: int = 4096
    # total bytes of values we keep
    max_stored_bytes: int = 256 * 1024 * 1024
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
    # hivemind's DHTHandlerThread: declare every 30 s, records expire 60 s after each declaration
    declare_period: float = 30.0
    declare_expiration: float = 60.0


DEFAULT_EXPERT_LIMITS = ExpertLimits()


@dataclass(frozen=True)
class KadLimits:
    """Bounds of our ``/ipfs/kad/1.0.0`` peer routing (``kad.KadPeerRouting``)."""

    # one kad message (go-libp2p-kad-dht's own bound is 4 MiB)
    max_message: int = 4 * 1024 * 1024
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
