"""libp2p Noise (`/noise`): XX handshake with identity payload, then ChaCha20-Poly1305 frames."""

from .driver import NoiseConnection, secure_inbound, secure_outbound
from .handshake import CipherState, Handshake
from .transport import NoiseTransport

NOISE_PROTOCOL = "/noise"

__all__ = ["NOISE_PROTOCOL", "CipherState", "Handshake", "NoiseConnection", "NoiseTransport", "secure_inbound", "secure_outbound"]
