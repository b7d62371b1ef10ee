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
QUIC_DIAL_DELAY = 0.5  # extra wait before QUIC addresses when TCP ones came first: TCP is cheaper for us
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

# --- NAT wing: DCUtR hole punching (net/nat/dcutr.py, punch.py, messages.py) ---
DCUTR_MAX_MESSAGE = 4096  # a HolePunch message: a type and a few addresses
DCUTR_MAX_ATTEMPTS = 3  # CONNECT/SYNC rounds per relayed connection; the last swaps roles
DCUTR_MAX_PUNCH_ADDRS = 4  # addresses punched per transport and attempt, at most (each TCP one opens a socket)
DCUTR_MAX_ADDRS_READ = 4 * DCUTR_MAX_PUNCH_ADDRS  # addresses looked at in a message before filtering
DCUTR_MAX_CONCURRENT_PUNCHES = 8
DCUTR_DIAL_TIMEOUT = 5.0  # longer than one SYN retransmission (1 s), for the SYN the NAT dropped first
DCUTR_STREAM_TIMEOUT = 15.0  # one CONNECT/SYNC round on the dcutr stream
DCUTR_RELAY_GRACE = 2.0  # seconds the relayed connection lives on after the direct one is up
DCUTR_OBSERVATION_WAIT = 2.0  # seconds to wait for identify to tell us an observed address before CONNECT
OBSERVATION_DIAL_GRACE = 0.5  # ... of which, at least, for an observation dial (UDP dropped: it never answers)
OBSERVATION_DIAL_GRACE_FACTOR = 8.0  # ... or this many times the identify that started it took
DCUTR_MAX_OUTCOMES = 100  # punch outcomes kept for the dashboard

# --- NAT wing: observed addresses (net/nat/observed.py) ---
MAX_OBSERVATIONS = 256  # observers remembered (one observation each, the newest)
OBSERVATION_TTL = 30 * 60.0  # forget what a peer told us after half an hour
MIN_OBSERVERS = 2  # distinct observers (by IP) needed before we call the NAT mapping

# --- NAT wing: circuit relay v2 client (net/nat/circuit.py, relay_client.py, schedule.py) ---
CIRCUIT_MAX_MESSAGE = 4096  # hop and stop messages
RELAY_REQUEST_TIMEOUT = 10.0  # one RESERVE or CONNECT exchange with a relay
MAX_RESERVATION_TTL = 24 * 3600.0  # we never trust a relay's expiry further out than this
CLOCK_SKEW_ALLOWANCE = 30.0  # relays' clocks disagree with ours; refresh this much early
MIN_RESERVATION_REFRESH = 5.0  # never refresh sooner than this after a grant (a relay granting 1 s TTLs)
WANT_RESERVATIONS = 2  # relays we keep a slot on at once
RESERVATION_MAX_BACKOFF = 60.0  # seconds between retries of a failing relay, at most (2^failures before)

# --- NAT wing: AutoNAT v1 (net/nat/autonat.py, manager.py) ---
AUTONAT_MAX_MESSAGE = 4096
AUTONAT_MAX_DIAL_ADDRS = 4  # addresses a server dials back, at most
AUTONAT_DIAL_BACK_TIMEOUT = 10.0
AUTONAT_REQUEST_TIMEOUT = 20.0
AUTONAT_RATE_PER_PEER = 3  # dial-back requests a server takes from one peer per AUTONAT_RATE_WINDOW
AUTONAT_RATE_TOTAL = 30  # ... and from everyone together
AUTONAT_RATE_WINDOW = 60.0
AUTONAT_PROBE_INTERVAL = 120.0  # re-check this often once reachability is known
AUTONAT_UNKNOWN_PROBE_INTERVAL = 15.0  # ... and this often while it is not
AUTONAT_REQUIRED_CONFIRMATIONS = 3  # distinct servers that must agree (fewer if fewer exist)
AUTONAT_MEMORY = 8  # servers' latest answers kept
RESERVE_WHEN_UNKNOWN_AFTER = 0.0  # no verdict by then: reserve relay slots anyway, to be reachable at once
# (a NATed node's "private" verdict waits for the server's dial-back timeout; a "public" one releases them)

# --- libp2p TLS (net/tls/) ---
TLS_MAX_CERTIFICATE = 16 * 1024  # a libp2p certificate: one self-signed cert with a small extension
TLS_MAX_SIGNED_KEY = 4096  # the extension's DER SignedKey: a public key protobuf and a signature
TLS_CERT_BACKDATE = 3600.0  # seconds our certificate is valid before now: peers' clocks run behind
TLS_CERT_LIFETIME = 100 * 365 * 24 * 3600.0  # a host key outlives any process that holds it

# --- QUIC (net/transport/quic/) ---
QUIC_MAX_STREAMS = 256  # concurrent streams the peer may open on one connection (go-libp2p: 256)
QUIC_STREAM_WINDOW = 2 * 1024 * 1024  # unread bytes one stream may hold: the credit we grant beyond what was read
QUIC_CONNECTION_WINDOW = 16 * 1024 * 1024  # unread bytes of all streams of one connection
QUIC_SEND_BUFFER = 1024 * 1024  # bytes written to a stream and not yet acknowledged before a writer waits
QUIC_SEND_CHUNK = 256 * 1024  # a large write is queued in pieces this big, each waiting for room
QUIC_ACCEPT_BACKLOG = 256  # streams the peer opened that nobody accepted yet
QUIC_IDLE_TIMEOUT = 30.0  # a connection that hears nothing this long is gone (go-libp2p: 30 s)
QUIC_KEEPALIVE_INTERVAL = 15.0  # a PING this often keeps NAT mappings and the idle timer alive
QUIC_MAX_DATAGRAM = 1452  # what we send; what we read is one whole UDP datagram (65535)
# ... and to a peer on loopback (MTU 64 KiB), once its transport parameters allow it: aioquic's
# cost is per packet, so bigger datagrams carry several times the bytes for the same CPU
QUIC_LOOPBACK_DATAGRAM = 16 * 1024
QUIC_CONNECTION_ID_LENGTH = 8
LOSSY_PATH_SHARE = 0.002  # a connection that lost this share of what it sent (unrepaired) ranks after a repaired one
LOSSY_PATH_MIN_BYTES = 256 * 1024  # ... once it sent this much (a few early retransmissions are not a path's loss rate)
REPAIRED_PATH_MIN_BYTES = 1024 * 1024  # ... and a repaired one once it sent this much (the losses that turned its repairs on are in its count)
REPAIRED_PATH_WINDOW = 2 * 1024 * 1024  # ... and must lose, over about the last this many bytes sent in congestion avoidance,
REPAIRED_STEADY_SHARE = 0.01  # ... this share or more (a slow start's overshoot alone is not the path's loss)
FULL_QUEUE_SHARE = 0.05  # ... and either this much (no line loses that much at random) or repairs rebuild under LOSSY_PATH_SHARE
LOSSY_PATH_CHECK_INTERVAL = 1.0  # seconds between looks at the connections' loss (net/lossy_paths.py)
LOSSY_PATH_REDIAL_AFTER = 60.0  # after a failed QUIC dial to a lossy peer, wait this long before the next
QUIC_PACING_SLOW_START = 2.0  # pacing rate in windows per round trip while in slow start (Linux TCP's)
QUIC_PACING_AVOIDANCE = 1.2  # ... and after it
QUIC_LOSS_WINDOW = 500  # packets per window of the loss count that turns repairs on (two windows counted)
QUIC_LOSS_TOLERANCE = 0.02  # with repairs on, loss below this share of recent packets is not congestion
QUIC_REPAIR_HELLOS = 3  # hellos sent when a handshake is done (one lost alone must not cost the repairs)
QUIC_MAX_PENDING_HANDSHAKES = 64  # inbound handshakes in flight per endpoint (spoofable sources)
QUIC_ADDRESS_PENDING_HANDSHAKES = 16  # ... from one source address
QUIC_MAX_CONNECTIONS_PER_ENDPOINT = 1024  # connection ids are routed per connection: this bounds the table
QUIC_UNKNOWN_DATAGRAM_LOG_INTERVAL = 10.0  # at most one log line per reason this often for dropped datagrams
QUIC_HOLE_PUNCH_TIMEOUT = 5.0  # a UDP punch sends packets this long, at most (go-libp2p's holePunch)
QUIC_HOLE_PUNCH_FIRST_GAP = 0.01  # seconds between the first punch packets; the gap grows with jitter
QUIC_HOLE_PUNCH_MAX_GAP = 0.2  # ... up to this (DCUtR: random intervals between 10 and 200 ms)
QUIC_HOLE_PUNCH_PACKET = 64  # bytes of random payload in each punch packet
DCUTR_PUNCH_RTTS = 8.0  # a punch's dials and handshakes get this many relayed round trips ...
DCUTR_MIN_PUNCH = 2.0  # ... but at least this long (one lost SYN is retransmitted after 1 s) ...
DCUTR_MAX_PUNCH = 5.0  # ... and at most this long: a failed attempt ends well inside DCUTR_STREAM_TIMEOUT
TCP_REFUSED_REDIAL_DELAY = 0.05  # a punched SYN refused (RST from the peer's router) is re-sent this much later
DCUTR_REPUNCH_INTERVAL = 30.0  # after a network change, a relayed peer is punched again at most this often

# --- NAT wing: router port mapping (net/nat/portmap/: NAT-PMP, PCP, UPnP IGD) ---
PORTMAP_SERVER_PORT = 5351  # NAT-PMP and PCP servers listen here on the default gateway
PORTMAP_MAX_MESSAGE = 1100  # a PCP message is at most 1100 bytes (RFC 6887); NAT-PMP's are 16 at most
PORTMAP_LIFETIME = 7200  # seconds of mapping we ask for (RFC 6886 recommends two hours)
PORTMAP_MAX_LIFETIME = 24 * 3600  # a granted lifetime is never trusted further out than this
PORTMAP_MIN_RENEW = 30.0  # renew no sooner than this after a grant (a gateway granting 10 s leases)
PORTMAP_FIRST_RETRANSMIT = 0.25  # a request unanswered this long is sent again, the wait doubling (RFC 6886)
PORTMAP_TRIES = 4  # ... this many sends in all: 0.25 + 0.5 + 1 + 2 s before giving up on a gateway
PORTMAP_UPNP_DISCOVER_MS = 1000  # SSDP discovery waits this long for routers to answer (milliseconds)
PORTMAP_UPNP_TIMEOUT = 10.0  # one UPnP IGD call (discovery, a SOAP request) gives up after this
PORTMAP_RETRY_INTERVAL = 30.0  # after a network change, mapping is tried again at most this often
PORTMAP_MAX_BACKOFF = 600.0  # seconds between retries after failures, at most
PORTMAP_REMOVE_DEADLINE = 2.0  # on leaving, mappings that the router has not deleted by then are left to expire
PORTMAP_CONFIRM_SERVERS = 3  # AutoNAT servers asked to dial a new mapping back, at most

# --- NAT wing: birthday probing against one hard NAT (net/nat/birthday.py, prober.py) ---
BIRTHDAY_SOCKETS = 256  # sockets the hard side opens per attempt (Tailscale's figure)
BIRTHDAY_PROBES = 2048  # probes the easy side sends per attempt: with 256 ports open, 99.97 % find one
# (1,024 found one ~98 % of the time: in a 78-pair matrix with ~25 birthday pairs, one or two needed
# a second attempt, 9 s later: past the 8 s a donor should wait)
BIRTHDAY_BURST = 32  # probes (or first packets of sockets) sent together ...
BIRTHDAY_BURST_INTERVAL = 0.02  # ... this often: 2,048 probes take 1.3 s (1,600 packets, ~100 KB, per second)
BIRTHDAY_PORT_LOW = 1024  # the ports a hard NAT hands out, probed at random
BIRTHDAY_PORT_HIGH = 65535
BIRTHDAY_EASY_DELAY = 0.05  # the easy side starts probing this much later: the hard side's mappings exist by then
BIRTHDAY_BUDGET = 4.0  # seconds one birthday probe may take, its QUIC handshake included
