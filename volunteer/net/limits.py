"""Every bound of the network layer, named in one place (see DESIGN.md, "Limits are part of the protocol").

Protocol modules import these names instead of repeating numbers; tests and configs may pass
other values where an API takes them.
"""

from __future__ import annotations

# --- varints / length prefixes ------------------------------------------------
MAX_UVARINT_BYTES = 9  # multiformats unsigned-varint caps at 9 bytes (63 bits)

# --- multiaddr / peer IDs --------------------------------------------------------
MAX_MULTIADDR_BYTES = 1024
MAX_PEER_ID_BYTES = 128  # sha256 multihash of an RSA key is 34 bytes; identity hash of ed25519 is 38
MAX_PUBLIC_KEY_BYTES = 1024  # RSA-4096 public keys fit comfortably

# --- multistream-select ----------------------------------------------------------
MAX_MULTISTREAM_MESSAGE = 1024  # spec: protocol ids are short; go uses 1024 as well
MAX_MULTISTREAM_ROUNDS = 32  # protocols a dialer may propose before we give up

# --- noise -----------------------------------------------------------------------------
NOISE_MAX_MESSAGE = 65535  # 2-byte length prefix
NOISE_TAG_LEN = 16
NOISE_MAX_PLAINTEXT = NOISE_MAX_MESSAGE - NOISE_TAG_LEN  # 65519
NOISE_MAX_NONCE = 2**64 - 1  # nonce 2^64-1 is reserved by the Noise spec
MAX_HANDSHAKE_PAYLOAD = 8192

# --- yamux -------------------------------------------------------------------------------
YAMUX_INITIAL_WINDOW = 256 * 1024
YAMUX_MAX_WINDOW = 16 * 1024 * 1024
YAMUX_MAX_STREAMS = 4096  # open streams per connection, both directions
YAMUX_ACCEPT_BACKLOG = 256  # inbound streams opened by the peer and not yet accepted/acked
YAMUX_MAX_FRAME_PAYLOAD = 16 * 1024 * 1024  # a data frame can never exceed the max window
YAMUX_KEEPALIVE_INTERVAL = 30.0
YAMUX_PING_TIMEOUT = 30.0

# --- connection setup --------------------------------------------------------------------
HANDSHAKE_TIMEOUT = 10.0  # whole upgrade: multistream + noise + muxer, per connection
DIAL_TIMEOUT = 10.0  # per address
MAX_PENDING_HANDSHAKES = 64  # inbound connections being upgraded at once
MAX_CONNECTIONS = 1024
MAX_DIAL_ADDRS = 16  # addresses tried per peer dial
DIAL_STAGGER = 0.25  # seconds between starting dials to a peer's addresses (unless one failed already)
RELAY_DIAL_DELAY = 0.5  # extra wait before relayed addresses: a direct path is preferred
STREAM_NEGOTIATION_TIMEOUT = 10.0  # multistream on a new stream
MAX_INBOUND_STREAMS_PER_PROTOCOL = 512

# --- identify / ping ---------------------------------------------------------------------
MAX_IDENTIFY_MESSAGE = 64 * 1024
MAX_IDENTIFY_ADDRS = 64
MAX_IDENTIFY_PROTOCOLS = 256
PING_PAYLOAD = 32
PING_TIMEOUT = 10.0

# --- reading buffered streams ---------------------------------------------------------
READ_CHUNK = 1024 * 1024

# --- noise handshake payload and transport reads -------------------------------------
NOISE_MAX_MUXERS = 32  # muxer ids in the handshake's stream_muxers extension
NOISE_MAX_MUXER_NAME = 256  # bytes per muxer id (multistream ids are short)
NOISE_READ_CHUNK = 1024 * 1024  # socket reads of the transport phase: big reads keep per-frame Python work low

# --- stream pool (net/pool.py) ---
POOL_IDLE = 20.0  # seconds an idle request stream is reused; below SERVE_IDLE so a server never drops it first
SERVE_IDLE = 30.0  # request/response servers close a stream idle this long
MAX_IDLE_STREAMS_PER_KEY = 32  # idle streams kept per (peer, protocol)

# --- resource manager and hostile peers (net/resources.py; the defaults of ResourceLimits) ---
# Control frames (PING ACKs, RSTs for refused SYNs, window updates) a peer can make us queue
# before it reads them: 64 KiB is over 5,000 frames, far beyond any honest burst; a peer that
# floods past it without reading loses its connection (GoAway).
YAMUX_MAX_CONTROL_OUTBOX = 64 * 1024
YAMUX_GOAWAY_FLUSH_TIMEOUT = 1.0  # seconds we try to tell a misbehaving peer GoAway before closing
FIRST_MESSAGE_TIMEOUT = 2.0  # seconds from accept to the first multistream message (slowloris bound)
REFUSAL_WARN_INTERVAL = 10.0  # at most one WARNING line per refusal reason this often
