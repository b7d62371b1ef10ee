"""Raw TCP doing a step's network work on the rig, for benchmarks/wan.py: what plain sockets
achieve moving the same payload in the same exchanges over the same lines, with nothing else.

    python _wan_rawtcp.py serve --port P
    python _wan_rawtcp.py step HOST:PORT ... --out BYTES --back BYTES --steps N --warmup W

``serve`` answers each request on each connection (a header ``!II``: request bytes, reply bytes,
then the request) with the reply bytes once the whole request is in. ``step`` keeps one
connection per volunteer (TCP_NODELAY, as our streams and p2pd's run) and per step does two
exchanges, forward then backward, each sending every volunteer an equal share of half ``--out``
at once and waiting for all replies (an equal share of half ``--back`` each). No compute, no
framing or encryption: the floor that the rig's lines and the kernel's TCP give those bytes.
Prints one JSON line ``{"steps": [...]}`` in _wan_train.train's format.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _wan_train import default_ifname, line_bytes  # noqa: E402

HEADER = struct.Struct("!II")
CHUNK = 1 << 16
CONNECT_TIMEOUT = 30.0
EXCHANGE_TIMEOUT = 120.0


def _receive_exactly(sock: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        data = sock.recv(min(left, CHUNK))
        if not data:
            raise ConnectionError(f"closed with {left} of {n} bytes still to come")
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def _answer(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while True:
            try:
                head = _receive_exactly(conn, HEADER.size)
            except ConnectionError:
                return  # the trainer is done
            request, reply = HEADER.unpack(head)
            _receive_exactly(conn, request)
            conn.sendall(bytes(reply))


def serve(port: int) -> int:
    """Answer requests on ``port`` until killed."""
    listener = socket.create_server(("0.0.0.0", port), reuse_port=True)
    print("READY", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_answer, args=(conn,), daemon=True).start()


def _exchange(conns: list[socket.socket], out: int, back: int) -> None:
    """Every connection sends ``out`` bytes and receives ``back``, all at once."""
    errors: list[BaseException] = []

    def one(conn: socket.socket) -> None:
        try:
            conn.sendall(HEADER.pack(out, back) + bytes(out))
            _receive_exactly(conn, back)
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(EXCHANGE_TIMEOUT)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"exchange failed: {errors or 'timed out'}")


def steps(targets: list[str], out: int, back: int, count: int, warmup: int) -> list[dict]:
    """``warmup`` then ``count`` timed steps of two exchanges (forward, backward)."""
    ifname = default_ifname()
    conns = []
    for target in targets:
        host, _, port = target.rpartition(":")
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        conn.settimeout(EXCHANGE_TIMEOUT)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(conn)
    share_out = out // 2 // len(conns)
    share_back = back // 2 // len(conns)
    measured = []
    try:
        for i in range(warmup + count):
            tx0, rx0 = line_bytes(ifname)
            t0 = time.monotonic()
            _exchange(conns, share_out, share_back)  # forward
            _exchange(conns, share_out, share_back)  # backward
            t1 = time.monotonic()
            tx, rx = line_bytes(ifname)
            if i >= warmup:
                measured.append({"t0": t0, "t1": t1, "tx0": tx0, "rx0": rx0, "tx": tx, "rx": rx})
    finally:
        for conn in conns:
            conn.close()
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--port", type=int, required=True)
    p = sub.add_parser("step")
    p.add_argument("targets", nargs="+", help="HOST:PORT of each volunteer")
    p.add_argument("--out", type=int, required=True, help="payload bytes per step, trainer -> volunteers")
    p.add_argument("--back", type=int, required=True, help="payload bytes per step, volunteers -> trainer")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    a = parser.parse_args()
    if a.command == "serve":
        return serve(a.port)
    print(json.dumps({"steps": steps(a.targets, a.out, a.back, a.steps, a.warmup)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
