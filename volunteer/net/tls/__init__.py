"""libp2p TLS (`tls/tls.md`): the certificates QUIC's TLS 1.3 handshake carries, made and checked.

A host proves its identity with a self-signed certificate on a fresh ECDSA P-256 key, whose
libp2p extension holds the host's public key and the host key's signature over the certificate
key. Both sides present one; the ALPN is ``libp2p``.
"""

from .certificate import (
    ALPN,
    EXTENSION_OID,
    SIGNATURE_PREFIX,
    Certificate,
    decode_signed_key,
    encode_signed_key,
    make_certificate,
    peer_of_certificate,
    verify_certificate,
)

__all__ = [
    "ALPN",
    "EXTENSION_OID",
    "SIGNATURE_PREFIX",
    "Certificate",
    "decode_signed_key",
    "encode_signed_key",
    "make_certificate",
    "peer_of_certificate",
    "verify_certificate",
]
