"""``TcpStream``: a connected TCP socket as a trio stream, with less Python per read and write
than ``trio.SocketStream``.

trio's socket stream wraps every send and receive in two context managers (error translation,
conflict detection), the socket wrapper's non-blocking helper, and a cancellation sandwich
whose second half yields to the scheduler after every operation that did not have to wait: a
whole pass of the event loop (an epoll call, its instruments' checks) for each write of an
expert call. Here a read or a write that need not wait costs one system call and a few lines of
Python; it raises ``Cancelled`` first when the task is cancelled, as trio's does, and yields
to the scheduler only when it had to wait or after ``FAIR_TURNS`` operations in a row that did
not, so a task that always finds data still lets the others run.
"""

from __future__ import annotations

import contextlib
import errno
import socket

import trio

from ..streams import check_max_bytes

RECEIVE_SIZE = 65536  # bytes a receive_some without max_bytes asks the kernel for
FAIR_TURNS = 16  # reads and writes in a row that found the socket ready, before one yields anyway
# Unsent bytes the kernel holds before a write must wait: trio's SocketStream default, kept so
# that a bulk stream does not queue seconds of data ahead of a small reply on a slow link
NOTSENT_LOWAT = 16 * 1024


class _OneAtATime:
    """``with``: BusyResourceError if another task is already inside (trio's conflict check)."""

    __slots__ = ("_busy", "_message")

    def __init__(self, message: str) -> None:
        self._busy = False
        self._message = message

    def __enter__(self) -> None:
        if self._busy:
            raise trio.BusyResourceError(self._message)
        self._busy = True

    def __exit__(self, *exc_info: object) -> None:
        self._busy = False


class TcpStream(trio.abc.HalfCloseableStream):
    """A connected stream socket (``socket``, non-blocking from here on) as a trio stream.

    ``fair_turns``: ready operations in a row before one yields. trio's stream contract has
    every operation yield (``fair_turns=1``: what ``trio.testing``'s stream checks hold it to);
    the default trades that for a pass of the event loop less per message."""

    # A receive_some cancelled loses no bytes: cancelled only before its recv (at its wait), never
    # after (its turn is shielded). A yamux stream's own task may then read the connection itself.
    receive_cancel_safe = True

    def __init__(self, sock: socket.socket, *, fair_turns: int = FAIR_TURNS) -> None:
        sock.setblocking(False)
        # what trio.SocketStream sets on every TCP socket (both fail harmlessly elsewhere)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, NOTSENT_LOWAT)
        self.socket = sock
        self._closed = False
        self._sending = _OneAtATime("another task is already sending on this TCP stream")
        self._receiving = _OneAtATime("another task is already receiving on this TCP stream")
        self._shut_write = False
        self._turns = 0  # operations in a row that did not yield
        self._fair_turns = fair_turns

    async def send_all(self, data) -> None:
        with self._sending:
            self._check_open()
            if self._shut_write:
                raise trio.ClosedResourceError("cannot send data after sending EOF")
            with memoryview(data) as view:
                if not view.nbytes:
                    await trio.lowlevel.checkpoint()
                    return
                await trio.lowlevel.checkpoint_if_cancelled()
                waited = False
                sent, total = 0, view.nbytes
                sock = self.socket
                while sent < total:
                    try:
                        sent += sock.send(view[sent:] if sent else view)
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(sock)
                        waited = True
                    except OSError as exc:
                        raise _translated(exc) from exc
            await self._take_turn(waited)

    async def wait_send_all_might_not_block(self) -> None:
        with self._sending:
            self._check_open()
            await trio.lowlevel.wait_writable(self.socket)

    async def send_eof(self) -> None:
        with self._sending:
            self._check_open()
            await trio.lowlevel.checkpoint()
            if self._shut_write:
                return
            self._shut_write = True
            try:
                self.socket.shutdown(socket.SHUT_WR)
            except OSError as exc:
                raise _translated(exc) from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        check_max_bytes(max_bytes)
        with self._receiving:
            self._check_open()
            await trio.lowlevel.checkpoint_if_cancelled()
            size = RECEIVE_SIZE if max_bytes is None else max_bytes
            sock = self.socket
            waited = False
            while True:
                try:
                    data = sock.recv(size)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                    waited = True
                except OSError as exc:
                    raise _translated(exc) from exc
            await self._take_turn(waited)
            return data

    async def _take_turn(self, waited: bool) -> None:
        """Yield to the scheduler every ``FAIR_TURNS`` operations that did not wait (an operation
        that waited has yielded already)."""
        if waited:
            self._turns = 0
            return
        self._turns += 1
        if self._turns >= self._fair_turns:
            self._turns = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this TCP stream was closed")

    def getsockopt(self, level: int, option: int, buffersize: int = 0):
        """The socket's option (as ``trio.SocketStream.getsockopt``)."""
        return self.socket.getsockopt(level, option, buffersize) if buffersize else self.socket.getsockopt(level, option)

    def setsockopt(self, level: int, option: int, value) -> None:
        self.socket.setsockopt(level, option, value)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.socket)  # tasks waiting on it get ClosedResourceError
            self.socket.close()
        await trio.lowlevel.checkpoint()


def _translated(exc: OSError) -> Exception:
    """What trio's socket stream raises for a failed socket call."""
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


def stream_of(sock: trio.socket.SocketType) -> TcpStream:
    """A ``TcpStream`` over a connected trio socket, which it takes over (its descriptor moves
    to a plain socket object; the trio socket object is detached, not closed)."""
    plain = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    return TcpStream(plain)


__all__ = ["FAIR_TURNS", "NOTSENT_LOWAT", "RECEIVE_SIZE", "TcpStream", "stream_of"]
