"""A py-libp2p 0.8.1 peer for interop tests and benchmarks. Runs under .interop/pylibp2p's Python.

    serve [--port N]                 Noise + yamux host on 127.0.0.1 serving /echo/1.0.0, ping,
                                     identify and /perf/1.0.0; prints `READY <multiaddr>` and runs
                                     until stdin closes.
    --quic (before the command)      listen and dial over QUIC v1 (py-libp2p's aioquic transport)
                                     instead of TCP + Noise + yamux
    dial-echo MULTIADDR [--size N] [--protocol P]
    dial-ping MULTIADDR [--count N]
    dial-identify MULTIADDR
    dial-perf MULTIADDR [--upload N] [--download N]
    pair-bench [--size-mib N]        py-libp2p ↔ py-libp2p echo, perf, setup and ping figures
Each dial-* command prints one JSON line and exits 0 on success, 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import struct
import sys
import time

import multiaddr
import trio

from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.peerinfo import info_from_p2p_addr

logging.basicConfig(level=logging.ERROR)
for name in ("libp2p", "multiaddr"):
    logging.getLogger(name).setLevel(logging.ERROR)

ECHO = TProtocol("/echo/1.0.0")
PERF = TProtocol("/perf/1.0.0")
PING = TProtocol("/ipfs/ping/1.0.0")
READ_SIZE = 1 << 20


async def read_some(stream) -> bytes:
    try:
        return await stream.read(READ_SIZE)
    except StreamEOF:
        return b""


async def echo_handler(stream) -> None:
    try:
        while data := await read_some(stream):
            await stream.write(data)
    finally:
        await stream.close()


async def perf_handler(stream) -> None:
    """/perf/1.0.0 server: u64 wanted, read upload to EOF, send wanted bytes."""
    header = b""
    while len(header) < 8:
        chunk = await read_some(stream)
        if not chunk:
            await stream.reset()
            return
        header += chunk
    (wanted,) = struct.unpack(">Q", header[:8])
    while await read_some(stream):
        pass
    block = bytes(min(wanted, 1 << 16) or 1)
    remaining = wanted
    while remaining:
        part = block[: min(remaining, len(block))]
        await stream.write(part)
        remaining -= len(part)
    await stream.close()


LISTEN = {"tcp": "/ip4/127.0.0.1/tcp/{port}", "quic": "/ip4/127.0.0.1/udp/{port}/quic-v1"}
TRANSPORT = "tcp"


def listen_addr(port: int = 0) -> multiaddr.Multiaddr:
    return multiaddr.Multiaddr(LISTEN[TRANSPORT].format(port=port))


async def half_close(stream) -> None:
    """Close our sending side only. py-libp2p's QUIC stream.close() closes both sides (reads then
    fail), its yamux close() only ours: over QUIC the half-close is close_write()."""
    await (stream.close_write() if TRANSPORT == "quic" else stream.close())


def make_host():
    if TRANSPORT == "quic":
        return new_host(key_pair=create_new_key_pair(os.urandom(32)), listen_addrs=[listen_addr()], enable_quic=True)
    return new_host(key_pair=create_new_key_pair(os.urandom(32)))


async def serve(args) -> None:
    host = make_host()
    listen = [listen_addr(args.port)]
    async with host.run(listen_addrs=listen):
        host.set_stream_handler(ECHO, echo_handler)
        # py-libp2p's own perf server (libp2p.perf.PerfService), not a stand-in.
        from libp2p.perf import PerfService

        await PerfService(host).start()
        addr = next(a for a in host.get_addrs() if ("/quic-v1" if TRANSPORT == "quic" else "/tcp/") in str(a))
        full = str(addr) if "/p2p/" in str(addr) else f"{addr}/p2p/{host.get_id().to_string()}"
        print("READY", full, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


async def connect(host, target: str):
    info = info_from_p2p_addr(multiaddr.Multiaddr(target))
    await host.connect(info)
    return info.peer_id


async def dial_echo(args) -> dict:
    host = make_host()
    async with host.run(listen_addrs=[listen_addr()]):
        peer = await connect(host, args.addr)
        stream = await host.new_stream(peer, [TProtocol(args.protocol)])
        payload = os.urandom(args.size)
        received = bytearray()
        started = time.perf_counter()

        async def writer():
            view = memoryview(payload)
            for start in range(0, len(view), 1 << 20):
                await stream.write(bytes(view[start : start + (1 << 20)]))
            await half_close(stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            while len(received) < args.size:
                chunk = await read_some(stream)
                if not chunk:
                    break
                received += chunk
        seconds = time.perf_counter() - started
        return {"ok": bytes(received) == payload, "bytes": len(received), "seconds": seconds}


async def dial_ping(args) -> dict:
    from libp2p.host.ping import PingService

    host = make_host()
    async with host.run(listen_addrs=[listen_addr()]):
        peer = await connect(host, args.addr)
        rtts = await PingService(host).ping(peer, ping_amt=args.count)
        return {"ok": len(rtts) == args.count, "rtts_ms": rtts}  # py-libp2p reports whole milliseconds


async def dial_identify(args) -> dict:
    from libp2p.identity.identify.identify import ID as IDENTIFY
    from libp2p.identity.identify.pb.identify_pb2 import Identify

    host = make_host()
    async with host.run(listen_addrs=[listen_addr()]):
        peer = await connect(host, args.addr)
        stream = await host.new_stream(peer, [IDENTIFY])
        data = b""
        while chunk := await read_some(stream):
            data += chunk
        # varint-delimited; skip the length prefix
        pos = 0
        while data[pos] & 0x80:
            pos += 1
        msg = Identify()
        msg.ParseFromString(data[pos + 1 :])
        return {
            "ok": True,
            "agent": msg.agent_version,
            "protocols": list(msg.protocols),
            "listen_addrs": [str(multiaddr.Multiaddr(a)) for a in msg.listen_addrs],
            "observed_addr": str(multiaddr.Multiaddr(msg.observed_addr)) if msg.observed_addr else None,
        }


async def perf_client(stream, upload: int, download: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    await stream.write(struct.pack(">Q", download))
    block = bytes(1 << 16)
    remaining = upload
    while remaining:
        part = block[: min(remaining, len(block))]
        await stream.write(part)
        remaining -= len(part)
    await stream.close()
    uploaded = time.perf_counter()
    received = 0
    while chunk := await read_some(stream):
        received += len(chunk)
    return uploaded - started, time.perf_counter() - uploaded, received


async def dial_perf(args) -> dict:
    """py-libp2p's own perf client (PerfService.measure_performance)."""
    from libp2p.perf import PerfService

    host = make_host()
    async with host.run(listen_addrs=[listen_addr()]):
        service = PerfService(host)
        await service.start()
        final = None
        async for output in service.measure_performance(multiaddr.Multiaddr(args.addr), args.upload, args.download):
            if output["type"] == "final":
                final = output
        return {
            "ok": final is not None and final["download_bytes"] == args.download and final["upload_bytes"] == args.upload,
            "uploaded": final["upload_bytes"], "downloaded": final["download_bytes"], "seconds": final["time_seconds"],
        }


async def pair_bench(args) -> dict:
    """Both py-libp2p hosts in this process, as py-libp2p's own benchmarks do."""
    size = args.size_mib << 20
    server, client = make_host(), make_host()
    result: dict = {}
    async with server.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]), client.run(
        listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    ):
        server.set_stream_handler(ECHO, echo_handler)
        server.set_stream_handler(PERF, perf_handler)
        addr = next(a for a in server.get_addrs() if "/tcp/" in str(a))
        target = str(addr) if "/p2p/" in str(addr) else f"{addr}/p2p/{server.get_id().to_string()}"
        started = time.perf_counter()
        peer = await connect(client, target)
        result["setup_ms_p50"] = (time.perf_counter() - started) * 1000
        # py-libp2p's PingService reports whole milliseconds: time 32-byte pings ourselves.
        ping = await client.new_stream(peer, [PING])
        rtts = []
        for _ in range(200):
            payload = os.urandom(32)
            sent = time.perf_counter()
            await ping.write(payload)
            echoed = b""
            while len(echoed) < 32:
                echoed += await read_some(ping)
            rtts.append(time.perf_counter() - sent)
        await ping.close()
        rtts.sort()
        result["ping_ms_p50"] = rtts[len(rtts) // 2] * 1000
        result["ping_ms_p99"] = rtts[int(len(rtts) * 0.99)] * 1000
        stream = await client.new_stream(peer, [ECHO])
        payload = bytes(1 << 20)
        started = time.perf_counter()
        received = 0

        async def writer():
            for _ in range(size >> 20):
                await stream.write(payload)
            await stream.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            while received < size:
                chunk = await read_some(stream)
                if not chunk:
                    break
                received += len(chunk)
        result["echo_MBps"] = 2 * size / (time.perf_counter() - started) / 1e6
        stream = await client.new_stream(peer, [PERF])
        up, down, got = await perf_client(stream, size, size)
        result["perf_MBps"] = 2 * size / (up + down) / 1e6
        result["ok"] = received == size and got == size
    return result


def main() -> int:
    global TRANSPORT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quic", action="store_true", help="QUIC v1 instead of TCP")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--port", type=int, default=0)
    p = sub.add_parser("dial-echo")
    p.add_argument("addr")
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--protocol", default=str(ECHO))
    p = sub.add_parser("dial-ping")
    p.add_argument("addr")
    p.add_argument("--count", type=int, default=3)
    p = sub.add_parser("dial-identify")
    p.add_argument("addr")
    p = sub.add_parser("dial-perf")
    p.add_argument("addr")
    p.add_argument("--upload", type=int, default=1 << 20)
    p.add_argument("--download", type=int, default=1 << 20)
    p = sub.add_parser("pair-bench")
    p.add_argument("--size-mib", type=int, default=64)
    args = parser.parse_args()
    TRANSPORT = "quic" if args.quic else "tcp"
    if args.command == "serve":
        trio.run(serve, args)
        return 0
    runner = {"dial-echo": dial_echo, "dial-ping": dial_ping, "dial-identify": dial_identify,
              "dial-perf": dial_perf, "pair-bench": pair_bench}[args.command]
    try:
        result = trio.run(runner, args)
    except BaseException as exc:  # report any failure as one JSON line: the test shows it
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
