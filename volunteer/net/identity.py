"""Identities: Ed25519 keypairs, libp2p public keys and PeerIDs, and key files.

PeerIDs follow the libp2p peer-ids spec: the multihash of the deterministically encoded
``PublicKey`` protobuf (identity multihash when that encoding is at most 42 bytes, as for
Ed25519, else sha2-256), shown as base58btc (``12D3KooW…``) or as a CIDv1 (``bafz…``).
We create only Ed25519 keys, but verify signatures from RSA, secp256k1 and ECDSA peers too,
so any libp2p peer can talk to us.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from functools import total_ordering
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from .. import paths
from ..errors import KeyFileError, PeerIDError, RemoteProtocolError
from .limits import MAX_PEER_ID_BYTES, MAX_PUBLIC_KEY_BYTES
from .pb import keys_pb2
from .pb.decode import parse
from .varint import decode_uvarint, decode_uvarint_exact, encode_uvarint

RSA, ED25519, SECP256K1, ECDSA = 0, 1, 2, 3
KEY_TYPE_NAMES = {RSA: "RSA", ED25519: "Ed25519", SECP256K1: "Secp256k1", ECDSA: "ECDSA"}
IDENTITY_MULTIHASH = 0x00
SHA256_MULTIHASH = 0x12
MAX_INLINE_KEY_LENGTH = 42  # spec: keys encoding to at most 42 bytes are inlined (identity multihash)
LIBP2P_KEY_CODEC = 0x72  # multicodec of a CID that holds a PeerID


class PublicKey:
    """A libp2p public key of any supported type; ``verify`` never raises on a bad signature."""

    __slots__ = ("key_type", "raw", "_verifier")

    def __init__(self, key_type: int, raw: bytes) -> None:
        if key_type not in KEY_TYPE_NAMES:
            raise PeerIDError(f"unknown key type {key_type}")
        self.key_type = key_type
        self.raw = bytes(raw)
        self._verifier = _load_verifier(key_type, self.raw)

    def verify(self, data: bytes, signature: bytes) -> bool:
        try:
            if self.key_type == ED25519:
                self._verifier.verify(bytes(signature), bytes(data))
            elif self.key_type == RSA:
                self._verifier.verify(bytes(signature), bytes(data), padding.PKCS1v15(), hashes.SHA256())
            else:
                self._verifier.verify(bytes(signature), bytes(data), ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True

    def to_protobuf(self) -> bytes:
        """Deterministic encoding (Type, then Data), as the spec requires for PeerIDs."""
        return bytes((0x08, self.key_type, 0x12)) + encode_uvarint(len(self.raw)) + self.raw

    @classmethod
    def from_protobuf(cls, data: bytes) -> "PublicKey":
        if len(data) > MAX_PUBLIC_KEY_BYTES:
            raise PeerIDError(f"public key of {len(data)} bytes exceeds {MAX_PUBLIC_KEY_BYTES}")
        try:
            msg = parse(keys_pb2.PublicKey, data, "public key")
        except RemoteProtocolError as exc:
            raise PeerIDError(str(exc)) from None
        return cls(msg.Type, msg.Data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and (self.key_type, self.raw) == (other.key_type, other.raw)

    def __hash__(self) -> int:
        return hash((self.key_type, self.raw))

    def __repr__(self) -> str:
        return f"PublicKey({KEY_TYPE_NAMES[self.key_type]} {self.raw[:8].hex()}…)"


def _load_verifier(key_type: int, raw: bytes):
    try:
        if key_type == ED25519:
            if len(raw) != 32:
                raise ValueError("Ed25519 public keys are 32 bytes")
            return ed25519.Ed25519PublicKey.from_public_bytes(raw)
        if key_type == SECP256K1:
            return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), raw)
        key = serialization.load_der_public_key(raw)
        if key_type == RSA and not isinstance(key, rsa.RSAPublicKey):
            raise ValueError("not an RSA key")
        if key_type == ECDSA and not isinstance(key, ec.EllipticCurvePublicKey):
            raise ValueError("not an ECDSA key")
        return key
    except (ValueError, TypeError) as exc:
        raise PeerIDError(f"invalid {KEY_TYPE_NAMES[key_type]} public key: {exc}") from None


class KeyPair:
    """An Ed25519 identity: signs handshakes, records and vouchers."""

    __slots__ = ("_private", "public_key", "peer_id")

    def __init__(self, private: ed25519.Ed25519PrivateKey) -> None:
        self._private = private
        raw_public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = PublicKey(ED25519, raw_public)
        self.peer_id = PeerID.from_public_key(self.public_key)

    @classmethod
    def generate(cls) -> "KeyPair":
        return cls(ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> "KeyPair":
        if len(seed) != 32:
            raise PeerIDError("an Ed25519 seed is 32 bytes")
        return cls(ed25519.Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(bytes(data))

    def private_bytes(self) -> bytes:
        return self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def to_protobuf(self) -> bytes:
        """libp2p PrivateKey protobuf; Data is seed‖public (64 bytes) as go-libp2p writes it."""
        msg = keys_pb2.PrivateKey(Type=ED25519, Data=self.private_bytes() + self.public_key.raw)
        return msg.SerializeToString()

    @classmethod
    def from_protobuf(cls, data: bytes) -> "KeyPair":
        try:
            msg = parse(keys_pb2.PrivateKey, data, "private key")
        except RemoteProtocolError as exc:
            raise PeerIDError(str(exc)) from None
        if msg.Type != ED25519:
            raise PeerIDError(f"only Ed25519 identities are supported, not {KEY_TYPE_NAMES.get(msg.Type, msg.Type)}")
        if len(msg.Data) not in (32, 64):
            raise PeerIDError(f"an Ed25519 private key is 32 or 64 bytes, not {len(msg.Data)}")
        keypair = cls.from_seed(msg.Data[:32])
        if len(msg.Data) == 64 and msg.Data[32:] != keypair.public_key.raw:
            raise PeerIDError("private key's embedded public key does not match")
        return keypair

    def __repr__(self) -> str:
        return f"KeyPair({self.peer_id})"


@total_ordering
class PeerID:
    """A peer's identity: the multihash of its public key. Immutable, hashable, ordered by bytes."""

    __slots__ = ("_bytes", "_text")

    def __init__(self, multihash: bytes) -> None:
        self._bytes = bytes(multihash)
        self._text: str | None = None

    @classmethod
    def from_public_key(cls, key: PublicKey) -> "PeerID":
        encoded = key.to_protobuf()
        if len(encoded) <= MAX_INLINE_KEY_LENGTH:
            return cls(bytes((IDENTITY_MULTIHASH,)) + encode_uvarint(len(encoded)) + encoded)
        return cls(bytes((SHA256_MULTIHASH, 32)) + hashlib.sha256(encoded).digest())

    @classmethod
    def from_bytes(cls, data: bytes) -> "PeerID":
        data = bytes(data)
        if not data or len(data) > MAX_PEER_ID_BYTES:
            raise PeerIDError(f"peer ID of {len(data)} bytes is out of bounds")
        header = decoded = None
        try:
            header = decode_uvarint(data)
            decoded = decode_uvarint(data, header[1]) if header is not None else None
        except RemoteProtocolError:
            pass
        if header is None or decoded is None:
            raise PeerIDError("peer ID is not a multihash")
        code = header[0]
        length, pos = decoded
        if pos + length != len(data):
            raise PeerIDError("peer ID multihash length does not match its digest")
        if code == SHA256_MULTIHASH:
            if length != 32:
                raise PeerIDError("sha2-256 peer ID must have a 32-byte digest")
        elif code == IDENTITY_MULTIHASH:
            PublicKey.from_protobuf(data[pos:])  # an inlined key must be a real key
        else:
            raise PeerIDError(f"unsupported multihash code {code:#x} in peer ID")
        return cls(data)

    @classmethod
    def from_string(cls, text: str) -> "PeerID":
        text = text.strip()
        if not text:
            raise PeerIDError("empty peer ID")
        if text.startswith(("1", "Qm")):
            try:
                return cls.from_bytes(base58.b58decode(text))
            except ValueError as exc:
                raise PeerIDError(f"invalid base58 peer ID {text!r}: {exc}") from None
        return cls._from_cid(text)

    @classmethod
    def _from_cid(cls, text: str) -> "PeerID":
        prefix, body = text[0], text[1:]
        try:
            if prefix in "bB":
                raw = base64.b32decode(body.upper() + "=" * (-len(body) % 8))
            elif prefix == "z":
                raw = base58.b58decode(body)
            else:
                raise ValueError(f"unsupported multibase prefix {prefix!r}")
            version, pos = decode_uvarint(raw) or (None, 0)
            codec, pos = decode_uvarint(raw, pos) or (None, 0)
        except Exception as exc:
            raise PeerIDError(f"invalid peer ID {text!r}: {exc}") from None
        if version != 1 or codec != LIBP2P_KEY_CODEC:
            raise PeerIDError(f"{text!r} is not a CIDv1 with the libp2p-key codec")
        return cls.from_bytes(raw[pos:])

    def to_bytes(self) -> bytes:
        return self._bytes

    def to_base58(self) -> str:
        if self._text is None:
            self._text = base58.b58encode(self._bytes).decode()
        return self._text

    def to_cid(self) -> str:
        raw = encode_uvarint(1) + encode_uvarint(LIBP2P_KEY_CODEC) + self._bytes
        return "b" + base64.b32encode(raw).decode().lower().rstrip("=")

    def extract_public_key(self) -> PublicKey | None:
        """The public key inlined in an identity-multihash peer ID (Ed25519), else None."""
        if self._bytes[0] != IDENTITY_MULTIHASH:
            return None
        _length, pos = decode_uvarint_exact(self._bytes, 1)
        return PublicKey.from_protobuf(self._bytes[pos:])

    def matches(self, key: PublicKey) -> bool:
        return PeerID.from_public_key(key) == self

    def short(self) -> str:
        """The last 6 characters, for logs and the dashboard."""
        return "…" + self.to_base58()[-6:]

    def __str__(self) -> str:
        return self.to_base58()

    def __repr__(self) -> str:
        return f"PeerID({self.short()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PeerID) and self._bytes == other._bytes

    def __lt__(self, other: "PeerID") -> bool:
        return self._bytes < other._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)


# --- key files -----------------------------------------------------------------------------


def names_a_peer(data: bytes) -> bool:
    """Whether ``data`` (from an untrusted record) parses as a PeerID."""
    try:
        PeerID.from_bytes(data)
    except Exception:  # noqa: BLE001 - whatever the parser raised, it names nobody
        return False
    return True

def signed_by(peer: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` over ``message`` is by the key of the PeerID whose bytes are ``peer``:
    the check every signed record a peer hands us makes (a vouch, a receipt, an accusation). A
    malformed PeerID, or one that embeds no key, is a bad record, not an error."""
    try:
        key = PeerID.from_bytes(peer).extract_public_key()
    except Exception:  # noqa: BLE001 - whatever the parser raised, the record is bad
        return False
    return key is not None and key.verify(message, signature)


def default_identity_path() -> Path:
    """$VOLUNTEER_IDENTITY, else the config dir's identity.key (see ``volunteer.paths``)."""
    return paths.identity_path()


def save_keypair(path: str | os.PathLike, keypair: KeyPair) -> None:
    """Write the key atomically, readable by the owner only (0600; parent dirs 0700)."""
    path = Path(path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".identity-", dir=path.parent)  # mkstemp creates 0600
    except OSError as exc:
        raise KeyFileError(f"cannot create identity key file {path}: {_why_not_writable(path, exc)}; "
                           "pass --identity PATH in a directory of yours") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(keypair.to_protobuf())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _why_not_writable(path: Path, exc: OSError) -> str:
    """Why a file cannot be made at ``path``, as the user can act on it: the ancestor that is a
    file, not a directory, or the system's reason."""
    for parent in path.parents:
        if parent.exists():
            return f"{parent} is not a directory" if not parent.is_dir() else (exc.strerror or str(exc))
    return exc.strerror or str(exc)


def load_keypair(path: str | os.PathLike) -> KeyPair:
    """Load a key file; refuse one that others can read (on POSIX)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"identity key file {path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read identity key file {path}: {exc.strerror}") from None
    if os.name != "nt" and mode & 0o077:
        raise KeyFileError(
            f"identity key file {path} is accessible by other users (mode {mode & 0o777:o}); "
            f"run: chmod 600 {path}"
        )
    try:
        return KeyPair.from_protobuf(data)
    except PeerIDError as exc:
        raise KeyFileError(f"identity key file {path} is not a libp2p Ed25519 key: {exc}") from None


def load_or_create_keypair(path: str | os.PathLike | None = None) -> tuple[KeyPair, bool]:
    """Load the identity at ``path`` (default location when None), creating it on first use."""
    path = Path(path) if path is not None else default_identity_path()
    if path.exists():
        return load_keypair(path), False
    keypair = KeyPair.generate()
    save_keypair(path, keypair)
    return keypair, True
