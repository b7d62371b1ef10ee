"""AutoNAT v1 (`/libp2p/autonat/1.0.0`): are we reachable from the outside? Ask peers to dial back.

The client sends DIAL with its addresses; the server dials them back on a fresh connection and
answers OK or E_DIAL_ERROR. Reachability is decided from such evidence only: several agreeing
answers from distinct servers, never a guess from IP ranges. Servers follow the spec's safety
rules: dial only the requester's observed IP, never for a request that came through a relay,
never relayed addresses, at most a few addresses, rate-limited per peer and in total.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass

import trio
from google.protobuf.message import DecodeError

from ...errors import RemoteProtocolError, VolunteerError, describe
from ..identity import PeerID
from ..multiaddr import Multiaddr
from ..pb import autonat_pb2
from ..streams import BufferedStream, close_quietly
from ..varint import encode_uvarint

log = logging.getLogger(__name__)

AUTONAT = "/libp2p/autonat/1.0.0"
MAX_MESSAGE = 4096
MAX_DIAL_ADDRS = 4
DIAL_BACK_TIMEOUT = 10.0
REQUEST_TIMEOUT = 20.0
Message = autonat_pb2.Message
OK, E_DIAL_ERROR, E_DIAL_REFUSED, E_BAD_REQUEST = (
    Message.OK, Message.E_DIAL_ERROR, Message.E_DIAL_REFUSED, Message.E_BAD_REQUEST,
)


class Reachability(enum.Enum):
    UNKNOWN = "unknown"
    PUBLIC = "public"
    PRIVATE = "private"


# --- core: deciding from evidence -------------------------------------------------------


class ReachabilityTracker:
    """Keeps the latest answer from each server; decides when ``required`` distinct servers agree.

    A decision flips only when the contrary evidence reaches ``required`` too, so one odd answer
    does not make a node flap between public and private.
    """

    def __init__(self, required: int = 3, memory: int = 8) -> None:
        self.required = required
        self._answers: OrderedDict[PeerID, bool] = OrderedDict()
        self._memory = memory
        self.status = Reachability.UNKNOWN
        self.confirmed_addr: Multiaddr | None = None

    def record(self, server: PeerID, reachable: bool, addr: Multiaddr | None = None) -> Reachability:
        self._answers.pop(server, None)
        self._answers[server] = reachable
        while len(self._answers) > self._memory:
            self._answers.popitem(last=False)
        if reachable and addr is not None:
            self.confirmed_addr = addr
        yes = sum(self._answers.values())
        no = len(self._answers) - yes
        if yes >= self.required and yes > no:
            self.status = Reachability.PUBLIC
        elif no >= self.required and no > yes:
            self.status = Reachability.PRIVATE
            self.confirmed_addr = None
        return self.status

    @property
    def evidence(self) -> tuple[int, int]:
        yes = sum(self._answers.values())
        return yes, len(self._answers) - yes


def _ip(addr: Multiaddr) -> str | None:
    return addr.value_for("ip4") or addr.value_for("ip6")


def dialable_addrs(requested: list[Multiaddr], observed_ip: str) -> list[Multiaddr]:
    """The spec's safety filter: direct TCP addresses on the requester's own observed IP."""
    out = []
    for addr in requested:
        names = addr.without_peer_id().protocols()
        if addr.is_relayed() or len(names) != 2 or names[1] != "tcp" or _ip(addr) != observed_ip:
            continue
        if addr.without_peer_id() not in out:
            out.append(addr.without_peer_id())
    return out[:MAX_DIAL_ADDRS]


class RateLimit:
    """At most ``per_peer`` requests per peer and ``total`` overall in any ``window`` seconds."""

    def __init__(self, per_peer: int = 3, total: int = 30, window: float = 60.0) -> None:
        self.per_peer, self.total, self.window = per_peer, total, window
        self._all: deque[float] = deque()
        self._by_peer: dict[PeerID, deque[float]] = {}

    def allow(self, peer: PeerID, now: float) -> bool:
        for events in (self._all, *self._by_peer.values()):
            while events and events[0] <= now - self.window:
                events.popleft()
        self._by_peer = {p: e for p, e in self._by_peer.items() if e}
        mine = self._by_peer.setdefault(peer, deque())
        if len(self._all) >= self.total or len(mine) >= self.per_peer:
            return False
        self._all.append(now)
        mine.append(now)
        return True


# --- wire --------------------------------------------------------------------------------


async def _read(stream: BufferedStream) -> Message:
    body = await stream.receive_length_prefixed(MAX_MESSAGE, "autonat message")
    message = Message()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise RemoteProtocolError(f"malformed autonat message: {exc}") from None
    return message


async def _write(stream, message: Message) -> None:
    body = message.SerializeToString()
    await stream.send_all(encode_uvarint(len(body)) + body)


def _response(status: int, text: str = "", addr: Multiaddr | None = None) -> Message:
    message = Message(type=Message.DIAL_RESPONSE)
    message.dialResponse.status = status
    if text:
        message.dialResponse.statusText = text[:200]
    if addr is not None:
        message.dialResponse.addr = addr.to_bytes()
    return message


# --- server ------------------------------------------------------------------------------


class AutoNATServer:
    """Answers dial-back requests for others on a Host."""

    def __init__(self, host, rate: RateLimit | None = None) -> None:
        self.host = host
        self.rate = rate or RateLimit()
        self.served = 0
        self.refused = 0

    def install(self) -> None:
        self.host.set_handler(AUTONAT, self.handle)

    async def handle(self, stream) -> None:
        buffered = BufferedStream(stream)
        conn = stream.connection
        try:
            request = await _read(buffered)
        except RemoteProtocolError as exc:
            await _write(stream, _response(E_BAD_REQUEST, str(exc)))
            return
        if request.type != Message.DIAL or not request.HasField("dial"):
            await _write(stream, _response(E_BAD_REQUEST, "expected DIAL"))
            return
        if conn.remote_addr.is_relayed():
            self.refused += 1
            await _write(stream, _response(E_DIAL_REFUSED, "will not dial back over a relayed connection"))
            return
        peer = stream.remote_peer
        if request.dial.peer.HasField("id") and request.dial.peer.id and request.dial.peer.id != peer.to_bytes():
            await _write(stream, _response(E_BAD_REQUEST, "peer id does not match the connection"))
            return
        if not self.rate.allow(peer, trio.current_time()):
            self.refused += 1
            await _write(stream, _response(E_DIAL_REFUSED, "rate limited"))
            return
        requested = []
        for raw in request.dial.peer.addrs[: 4 * MAX_DIAL_ADDRS]:
            try:
                requested.append(Multiaddr.from_bytes(raw))
            except VolunteerError:
                continue
        addrs = dialable_addrs(requested, _ip(conn.remote_addr))
        if not addrs:
            self.refused += 1
            await _write(stream, _response(E_DIAL_REFUSED, f"no dialable address on your observed IP {_ip(conn.remote_addr)}"))
            return
        self.served += 1
        reached = await self._dial_back(peer, addrs)
        if reached is not None:
            await _write(stream, _response(OK, addr=reached))
        else:
            await _write(stream, _response(E_DIAL_ERROR, "dial back failed"))

    async def _dial_back(self, peer: PeerID, addrs: list[Multiaddr]) -> Multiaddr | None:
        for addr in addrs:
            try:
                with trio.fail_after(DIAL_BACK_TIMEOUT):
                    # A fresh connection from an ephemeral port: proves the address takes unsolicited dials.
                    conn = await self.host.dial_addr(addr, peer, local_port=0)
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.debug("autonat dial back to %s failed: %s", addr, describe(exc))
                continue
            await conn.aclose()
            return addr
        return None


# --- client ------------------------------------------------------------------------------


@dataclass
class ProbeResult:
    server: PeerID
    reachable: bool | None  # None: the server refused or failed, no evidence either way
    addr: Multiaddr | None = None
    text: str = ""


async def probe(host, server: PeerID | Multiaddr | str, addrs: list[Multiaddr]) -> ProbeResult:
    """Ask ``server`` to dial us back on ``addrs``."""
    with trio.fail_after(REQUEST_TIMEOUT):
        conn = await host.connect(server)
        stream = BufferedStream(await conn.new_stream([AUTONAT]))
        request = Message(type=Message.DIAL)
        request.dial.peer.id = host.peer_id.to_bytes()
        request.dial.peer.addrs.extend(a.to_bytes() for a in addrs[: 4 * MAX_DIAL_ADDRS])
        try:
            await _write(stream, request)
            reply = await _read(stream)
        finally:
            await close_quietly(stream)
    status = reply.dialResponse.status
    text = reply.dialResponse.statusText
    if status == OK:
        addr = Multiaddr.from_bytes(reply.dialResponse.addr) if reply.dialResponse.addr else None
        return ProbeResult(conn.remote_peer, True, addr, text)
    if status == E_DIAL_ERROR:
        return ProbeResult(conn.remote_peer, False, None, text)
    return ProbeResult(conn.remote_peer, None, None, text or Message.ResponseStatus.Name(status))
