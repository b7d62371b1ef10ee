"""libp2p Noise (`/noise`): XX handshake with identity payload, then ChaCha20-Poly1305 frames.

Sans-I/O cores in ``handshake`` (with ``payload``) and ``transport``; the trio driver in ``driver``.
"""

from .driver import NoiseConnection, secure_inbound, secure_outbound
from .handshake import PROTOCOL_NAME, Handshake, SymmetricState
from .payload import SIGNATURE_PREFIX, RemoteIdentity, encode_payload, verify_payload
from .transport import CipherState, NoiseTransport

NOISE_PROTOCOL = "/noise"

__all__ = [
    "NOISE_PROTOCOL",
    "PROTOCOL_NAME",
    "SIGNATURE_PREFIX",
    "CipherState",
    "Handshake",
    "NoiseConnection",
    "NoiseTransport",
    "RemoteIdentity",
    "SymmetricState",
    "encode_payload",
    "secure_inbound",
    "secure_outbound",
    "verify_payload",
]
