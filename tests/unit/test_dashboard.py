"""The dashboard rendered headless from status snapshots: every section, key values, fits 80x24."""

from __future__ import annotations

import pytest

from volunteer.cli.dashboard import SECTIONS, render_text

PEER = "12D3KooWGmK9x8ZyAbCdEfGhJkLmNpQrStUvWxYz1234567890ab"
FULL = {
    "version": "0.1.0", "peer_id": PEER, "swarm": "demo", "uptime_s": 3723.0, "paused": False,
    "listen_addrs": ["/ip4/192.0.2.2/tcp/4001"],
    "reachability": {"status": "private", "nat_type": "endpoint-independent", "observed_addrs": ["/ip4/203.0.113.101/tcp/4001"],
                     "relays": [{"peer_id": "12D3KooWRelayRelayRelayRelayRelayRelayRelay99", "addr": "/ip4/203.0.113.10/tcp/4001",
                                 "rtt_ms": 12.34, "expires_in_s": 3000, "reserved": True}]},
    "connections": [
        {"peer_id": "12D3KooWTrainerTrainerTrainerTrainerTrainerAA", "path": "hole-punched", "via": None, "rtt_ms": 0.5,
         "bytes_in": 10_000_000, "bytes_out": 20_000_000, "agent": "volunteer/0.1.0"},
        {"peer_id": "12D3KooWOtherOtherOtherOtherOtherOtherOtherBB", "path": "relayed",
         "via": "12D3KooWRelayRelayRelayRelayRelayRelayRelay99", "rtt_ms": 30.0, "bytes_in": 1, "bytes_out": 2},
    ],
    "dht": {"routing_table": 12, "records": 40, "last_declared_age_s": 1.2, "experts_declared": 8, "client_mode": True},
    "experts": [{"uid": "expert.0.1", "requests_per_s": 3.2, "mean_batch": 8.0, "p50_ms": 3.1, "p95_ms": 9.0,
                 "errors": 1, "last_error": "ExpertInputError: wrong shape", "requests": 100}],
    "compute": {"device": "cuda:0", "utilization_pct": 57, "memory_used_mb": 1200, "memory_total_mb": 8000},
    "log": [{"time": 1700000000.0, "level": "WARNING", "message": "relay 12D3…99 went away; reserving another"}],
}


def check_fits(text: str, width: int, height: int) -> None:
    lines = text.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= width
    assert len(lines) <= height, f"{len(lines)} lines:\n{text}"


@pytest.mark.parametrize("width,height", [(80, 24), (160, 40)])
def test_full_snapshot_shows_every_section_and_fits(width, height):
    text = render_text(FULL, width=width, height=height)
    for title in SECTIONS:
        assert title in text, title
    for value in ("12D3KooWGmK9", "expert.0.1", "hole-punched", "12.3 ms", "private", "endpoint-independent",
                  "client mode", "cuda:0", "57%", "went away"):
        assert value in text, (value, text)
    check_fits(text, width, height)


@pytest.mark.parametrize("width,height", [(80, 24), (160, 40)])
def test_empty_and_none_snapshots_do_not_crash(width, height):
    for snapshot in ({}, {key: None for key in FULL}, {"experts": [{"uid": None, "p50_ms": None}], "connections": [{}]}):
        text = render_text(snapshot, width=width, height=height)
        for title in SECTIONS:
            assert title in text
        check_fits(text, width, height)


def test_hundreds_of_rows_still_fit_80x24():
    big = dict(FULL)
    big["connections"] = [dict(FULL["connections"][0], peer_id=f"12D3KooWPeer{i:04d}xxxxxxxx", bytes_in=i) for i in range(200)]
    big["experts"] = [dict(FULL["experts"][0], uid=f"expert.{i // 10}.{i % 10}", requests_per_s=float(i)) for i in range(100)]
    big["log"] = [dict(FULL["log"][0], message=f"warning {i}") for i in range(50)]
    text = render_text(big, width=80, height=24)
    check_fits(text, 80, 24)
    assert "more" in text and "expert.9.9" in text  # the busiest expert is listed first
    assert "warning 49" in text
    paused = render_text(dict(FULL, paused=True), width=80, height=24)
    assert "PAUSED" in paused


def test_brackets_in_strings_are_shown_not_parsed_as_markup():
    snapshot = dict(FULL, swarm="lab[gpu]", experts=[dict(FULL["experts"][0], last_error="KeyError: [/ip4/1.2.3.4]")])
    text = render_text(snapshot, width=100, height=24)
    assert "lab[gpu]" in text and "[/ip4/1.2.3.4]" in text
    relay = dict(FULL["reachability"]["relays"][0], reserved=False, error="DialError: [/ip4/203.0.113.10] refused")
    text = render_text(dict(FULL, reachability=dict(FULL["reachability"], relays=[relay])), width=160, height=40)
    assert "[/ip4/203.0.113.10]" in text


@pytest.mark.parametrize("width,height", [(80, 24), (160, 40)])
def test_wrong_types_and_multiline_strings_neither_crash_nor_overflow(width, height):
    junk = [None, "x", float("nan"), True, [None], "[/]", "a\nb\nc"]
    for value in junk:
        for key in FULL:
            text = render_text(dict(FULL, **{key: value}), width=width, height=height)
            check_fits(text, width, height)
        for key in ("connections", "experts", "log"):
            text = render_text(dict(FULL, **{key: [value, {k: value for k in ("peer_id", "uid", "rtt_ms", "bytes_in", "time",
                                                                              "level", "message", "last_error", "p50_ms")}]}),
                               width=width, height=height)
            check_fits(text, width, height)
    multiline = dict(FULL, experts=[dict(FULL["experts"][0], uid=f"e.{i}", last_error="Traceback\n  x\nValueError") for i in range(9)],
                     log=[dict(FULL["log"][0], message="one\ntwo\nthree")] * 9)
    check_fits(render_text(multiline, width=width, height=height), width, height)
    check_fits(render_text(None, width=width, height=height), width, height)


async def test_live_dashboard_redraws_and_stops_on_cancel():
    import io

    import trio
    from rich.console import Console

    from volunteer.cli.dashboard import LiveDashboard

    calls = []

    def snapshot() -> dict:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("snapshot broke")
        return FULL

    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True, color_system=None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: LiveDashboard(console).run(snapshot, refresh_hz=20, task_status=task_status))
            while len(calls) < 5:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert "snapshot broke" in out.getvalue() and "expert.0.1" in out.getvalue()
