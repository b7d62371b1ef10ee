"""``volunteer perf``: measure a link to any libp2p peer with the perf protocol."""

from __future__ import annotations

import argparse
import json
import sys

from contextlib import nullcontext
from typing import Any

import trio

from ..errors import DialError, HandshakeError, NegotiationError, VolunteerError
from ..net.stack import open_stack
from ..net.multiaddr import Multiaddr
from ..net.perf import PERF, PerfResult, perf_stream
from ..sizes import format_size, parse_size, size_arg
from .netcmds import add_identity_flag, add_listen_flag, listen_addrs, load_identity



def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perf",
        help="measure throughput to any libp2p peer (/perf/1.0.0)",
        description=(
            "Measure a link with the libp2p perf protocol: connection setup time, upload and download "
            "throughput, and the path taken (direct or relayed). Works against any peer that serves "
            "/perf/1.0.0 (every volunteer node and relay does, within per-peer limits)."
        ),
        epilog=(
            "examples:\n"
            "  volunteer perf /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...\n"
            "  volunteer perf --upload 16MiB --download 64MiB --streams 4 /ip4/198.51.100.1/tcp/4001/p2p/12D3KooW...\n"
            "  volunteer perf --json /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW... | jq .download_MBps"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("addr", metavar="MULTIADDR", help="the peer's multiaddr, ideally ending in /p2p/PEER_ID")
    p.add_argument("--upload", type=size_arg, default=parse_size("16MiB"), metavar="SIZE", help="bytes to upload (default 16MiB)")
    p.add_argument("--download", type=size_arg, default=parse_size("16MiB"), metavar="SIZE", help="bytes to download (default 16MiB)")
    p.add_argument("--streams", type=int, default=1, metavar="N", help="parallel perf streams (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole measurement (default 120)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_listen_flag(p)
    add_identity_flag(p)
    p.set_defaults(run=run_perf)


def run_perf(args: argparse.Namespace) -> int:
    if args.streams < 1:
        raise VolunteerError("--streams must be at least 1")
    target = Multiaddr(args.addr)
    keypair = load_identity(args)
    result = trio.run(measure, target, keypair, args.upload, args.download, args.streams, args.timeout, not args.json,
                      listen_addrs(args, target))
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print_result(result)
    return 0


async def measure(target, keypair, upload: int, download: int, streams: int, timeout: float, show_progress: bool,
                  listen: list[str] | None = None) -> PerfResult:
    """Connect to ``target`` and run ``streams`` perf exchanges in parallel (listening on ``listen``,
    so a relayed path can be hole-punched)."""
    async with open_stack(keypair, listen or []) as host:
        try:
            with trio.fail_after(timeout):
                started = trio.current_time()
                try:
                    conn = await host.connect(target)
                except (DialError, HandshakeError) as exc:
                    raise VolunteerError(f"unreachable: {exc}") from None
                setup = trio.current_time() - started
                up_times: list[float] = []
                down_times: list[float] = []
                progress = _progress_bars(show_progress)
                with progress if progress is not None else nullcontext():
                    on_up = on_down = None
                    if progress is not None:
                        up_task = progress.add_task("upload  ", total=upload * streams)
                        down_task = progress.add_task("download", total=download * streams)
                        on_up, on_down = (lambda n: progress.advance(up_task, n)), (lambda n: progress.advance(down_task, n))

                    async def one() -> None:
                        try:
                            # Negotiated up front (not lazily): a refusal must not look like a reset upload.
                            stream = await conn.new_stream([PERF], lazy=False)
                        except NegotiationError:
                            raise VolunteerError(f"{conn.remote_peer} does not speak {PERF}") from None
                        try:
                            up, down = await perf_stream(stream, upload, download, on_up, on_down)
                        except NegotiationError:
                            raise VolunteerError(f"{conn.remote_peer} does not speak {PERF}") from None
                        except trio.BrokenResourceError:
                            raise VolunteerError(f"{conn.remote_peer} refused or reset the perf stream (its perf limits?)") from None
                        up_times.append(up)
                        down_times.append(down)

                    began = trio.current_time()
                    async with trio.open_nursery() as nursery:
                        for _ in range(streams):
                            nursery.start_soon(one)
                    total = trio.current_time() - began
        except trio.TooSlowError:
            raise VolunteerError(f"timeout: perf did not finish within {timeout:g}s") from None
        return PerfResult(
            peer=str(conn.remote_peer), path=conn.describe_path(), transport=conn.transport, setup_seconds=setup,
            upload_bytes=upload * streams, download_bytes=download * streams,
            upload_seconds=max(up_times), download_seconds=max(down_times), streams=streams, total_seconds=total,
        )


def _progress_bars(show: bool) -> Any:
    """rich's transfer bars on a terminal; None otherwise, without importing rich (a scripted or
    ``--json`` run starts ~20 ms sooner)."""
    if not (show and sys.stderr.isatty()):
        return None
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True), transient=True,
    )


def print_result(result: PerfResult) -> None:
    from rich.console import Console

    console = Console()
    console.print(f"perf to [bold]{result.peer}[/] via {result.path} over {result.transport}, {result.streams} stream(s)")
    console.print(f"  connection setup  {result.setup_seconds * 1000:8.1f} ms")
    console.print(f"  upload   {format_size(result.upload_bytes):>10}  {result.upload_seconds:7.3f} s  {result.upload_mbps:9.1f} MB/s")
    console.print(f"  download {format_size(result.download_bytes):>10}  {result.download_seconds:7.3f} s  {result.download_mbps:9.1f} MB/s")
