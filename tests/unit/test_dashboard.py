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


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- the dashboard a donor wants -------------------------------------------------------
import json  # noqa: E402
import logging  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import trio  # noqa: E402

from volunteer.donor import contributions as contrib  # noqa: E402
from volunteer.donor import history as hist  # noqa: E402
from volunteer.cli.dashboard import allocate, log_summaries, logging_through, summary_line  # noqa: E402
from volunteer.cli.gpu import INSTALL_HINT, GpuMonitor  # noqa: E402
from volunteer.cli.rates import Window  # noqa: E402
from volunteer.cli.roles import classify_connections, role_of  # noqa: E402
from volunteer.widgets import duration, short  # noqa: E402


def test_one_short_id_and_one_duration():
    from volunteer.net.identity import KeyPair

    peer = KeyPair.generate().peer_id
    assert short(peer) == peer.short() == short(str(peer)) == "…" + str(peer)[-6:]
    assert short("abc") == "abc" and short(None) == "" and "\n" not in short("a\nb\nc" * 5)
    assert [duration(v) for v in (0.4, 7, 42, 245, 7380, 3 * 86400 + 4 * 3600, None, -1, float("nan"))] == [
        "0.4s", "7s", "42s", "4m05s", "2h03m", "3d04h", "–", "–", "–"]


def test_no_stale_ways_of_shortening_ids_or_writing_durations():
    from pathlib import Path

    root = Path(__file__).parents[2]
    for path in [*(root / "volunteer" / "cli").glob("*.py"), *(root / "relay").glob("*.py")]:
        source = path.read_text()
        for stale in ('["peer_id"][-', "uptime(", "s ago\")"):
            assert stale not in source, (path.name, stale)


def gpu_stub(**overrides):
    """A stand-in for pynvml: one GPU at 57% with 1200 of 8000 MiB, 64 °C, 120 of 250 W."""
    calls = SimpleNamespace(init=0)

    def init():
        calls.init += 1

    stub = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, nvmlInit=init,
        nvmlDeviceGetHandleByIndex=lambda index: f"gpu{index}",
        nvmlDeviceGetName=lambda handle: b"NVIDIA Test 4090",
        nvmlDeviceGetUtilizationRates=lambda handle: SimpleNamespace(gpu=57),
        nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(used=1200 * 2**20, total=8000 * 2**20),
        nvmlDeviceGetTemperature=lambda handle, sensor: 64,
        nvmlDeviceGetPowerUsage=lambda handle: 120_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda handle: 250_000,
        calls=calls,
    )
    for name, value in overrides.items():
        setattr(stub, name, value)
    return stub


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40), (160, 48)])
def test_gpu_panel_with_a_stubbed_nvml(width, height):
    stub = gpu_stub()
    monitor = GpuMonitor(stub)
    figures = monitor.read("cuda:0")
    assert figures == {"available": True, "name": "NVIDIA Test 4090", "utilization_pct": 57, "memory_used_mb": 1200,
                       "memory_total_mb": 8000, "temperature_c": 64, "power_w": 120.0, "power_limit_w": 250.0}
    monitor.read("cuda:0")
    assert stub.calls.init == 1  # NVML starts once
    text = render_text(dict(FULL, gpu=figures), width=width, height=height)
    for value in ("57%", "1200 / 8000 MiB", "64°C", "120 / 250 W"):
        assert value in text, (value, text)
    check_fits(text, width, height)


def test_gpu_figures_a_board_does_not_report_are_left_out():
    def unsupported(*args):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    figures = GpuMonitor(gpu_stub(nvmlDeviceGetPowerUsage=unsupported, nvmlDeviceGetTemperature=unsupported)).read("cuda")
    assert figures["available"] and figures["power_w"] is None and figures["temperature_c"] is None
    text = render_text(dict(FULL, gpu=figures), width=160, height=48)
    assert "57%" in text and "· n/a · n/a / 250 W" in text


def test_gpu_panel_says_why_it_is_not_available(monkeypatch):
    import builtins

    def failing_init():
        raise RuntimeError("NVML Shared Library Not Found")

    cases = {
        "cpu": (GpuMonitor(gpu_stub()), "experts run on cpu, not a CUDA GPU"),
        "cuda:0": (GpuMonitor(gpu_stub(nvmlInit=failing_init)), "NVML unavailable: NVML Shared Library Not Found"),
    }
    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    monkeypatch.delitem(__import__("sys").modules, "pynvml", raising=False)
    cases["cuda:1"] = (GpuMonitor(), f"no nvidia-ml-py: {INSTALL_HINT}")
    for device, (monitor, reason) in cases.items():
        figures = monitor.read(device)
        assert figures == {"available": False, "reason": reason}
        assert monitor.read(device) == figures  # remembered, not retried
        text = render_text(dict(FULL, gpu=figures), width=160, height=48)
        assert f"GPU n/a ({reason})" in text, text


@pytest.mark.slow
def test_rows_fill_the_terminal_before_anything_hides():
    big = dict(FULL, experts=[dict(FULL["experts"][0], uid=f"expert.{i // 8}.{i % 8}") for i in range(32)],
               connections=[dict(FULL["connections"][0], peer_id=f"12D3KooWPeer{i:04d}x", role="trainer") for i in range(6)])
    text = render_text(big, width=160, height=48)
    check_fits(text, 160, 48)
    assert "more" not in text and all(f"expert.{i // 8}.{i % 8}" in text for i in range(32))
    small = render_text(big, width=80, height=24)
    check_fits(small, 80, 24)
    assert "more" in small
    assert allocate(10, [30, 2, 5]) == [8, 1, 1] and allocate(10, [3, 2, 9]) == [3, 2, 5] and allocate(0, [3, 3]) == [1, 1] and allocate(50, [2, 0]) == [2, 1]


def test_connections_say_who_each_peer_is():
    swarm = "lab"
    assert role_of("R", frozenset(), swarm_id=swarm, relays={"R"}, served=set()) == "relay"
    assert role_of("X", frozenset({"/libp2p/circuit/relay/0.2.0/hop"}), swarm_id=swarm, relays=set(), served=set()) == "relay"
    assert role_of("T", frozenset({"/volunteer/lab/dht/1.0.0"}), swarm_id=swarm, relays=set(), served={"T"}) == "trainer"
    assert role_of("V", frozenset({"/volunteer/lab/dht/1.0.0"}), swarm_id=swarm, relays=set(), served=set()) == "volunteer"
    assert role_of("V", frozenset({"/volunteer/other/dht/1.0.0"}), swarm_id=swarm, relays=set(), served=set()) == "peer"
    rows = classify_connections([{"peer_id": "not a peer id"}, {"peer_id": "R"}], None, swarm,
                                {"relays": [{"peer_id": "R"}]}, set())
    assert [r["role"] for r in rows] == ["peer", "relay"]
    shown = render_text(dict(FULL, connections=[dict(c, role=r) for c, r in zip(FULL["connections"], ("trainer", "relay"))]),
                        width=80, height=24)
    assert "trainer" in shown and "relay" in shown


def test_plain_words_for_reachability_and_nat():
    text = render_text(dict(FULL, reachable_after_s=2.3, reachability=dict(FULL["reachability"], nat_type="unknown")), width=80, height=24)
    assert "NAT mapping unknown" not in text
    assert "not known yet whether hole punching works" in text and "after 2.3s" in text
    text = render_text(dict(FULL, reachability=dict(FULL["reachability"], nat_type="endpoint-dependent")), width=120, height=40)
    assert "hole punching unlikely" in text


@pytest.mark.slow
def test_coverage_versions_sync_ages_refusals_upload_and_checkpoints_render():
    snapshot = dict(
        FULL,
        experts=[dict(FULL["experts"][0], version=7, last_sync_age_s=12.0),
                 dict(FULL["experts"][0], uid="expert.0.2", version=3, last_sync_age_s=None)],
        coverage={"grids": [{"prefix": "expert", "size": [4, 8], "total": 32, "hosted": 28, "replicas_target": 2,
                             "under_replicated": 3, "unhosted": 4}],
                  "warnings": ["expert.3.[4:8] has no host"]},
        refusals={"connections": {"memory": 2}, "experts": {"busy_total": 3}},
        upload={"rate_bps": 1024 * 1024, "limit_bps": 4 * 1024 * 1024, "bytes_sent": 10},
        checkpoints={"dir": "/var/ckpt/lab", "writable": False, "last_save": 1.0, "last_save_age_s": 185.0},
        contributions={"session": {"requests": 1234, "samples": 45600, "compute_s": 192.0, "bytes_sent": 2**20, "trainers": 7},
                       "total": {"requests": 10234, "samples": 99000, "compute_s": 15000.0, "bytes_sent": 2**30, "trainers": 52},
                       "since": 1700000000.0},
    )
    for width, height in ((80, 24), (120, 40), (160, 48)):
        check_fits(render_text(snapshot, width=width, height=height), width, height)
    text = render_text(snapshot, width=160, height=48)
    for value in ("ver", "synced", "12s ago", "never", "28/32 hosted", "3 under-replicated, 4 unhosted",
                  "expert.3.[4:8] has no host", "1.0 MiB/s of 4.0 MiB/s max (25%)", "refused 2 connections, 3 experts",
                  "/var/ckpt/lab", "NOT writable", "last saved 3m05s ago", "session 1,234 req", "45,600 samples", "3m12s compute",
                  "7 trainers", "total 10,234 req", "52 trainers", "kept since 2023-11-1", "4h10m compute"):
        assert value in text, (value, text)


def test_windowed_rates_and_batch_sizes():
    window = Window(span=10.0)
    assert window.rate("e") is None
    window.observe("e", 0.0, 0, 0, 0)
    for second in range(1, 31):  # 4 req/s at batch 2 for 20 s, then 10 req/s at batch 8
        requests = 4 * min(second, 20) + 10 * max(0, second - 20)
        samples = 8 * min(second, 20) + 80 * max(0, second - 20)
        batches = 4 * min(second, 20) + 10 * max(0, second - 20)
        window.observe("e", float(second), requests, samples, batches)
        window.observe("e", second + 0.01, requests, samples, batches)  # a second reader, same moment
    assert window.rate("e", 0) == pytest.approx(10.0, rel=0.05)
    assert window.ratio("e", 1, 2) == pytest.approx(8.0)  # not the lifetime mean (4.4)
    window.forget({"other"})
    assert window.rate("e") is None


@pytest.mark.slow
def test_contributions_survive_a_restart_and_count_trainers_in_bounded_memory(tmp_path):
    """The session and lifetime figures the status shows come from the one record (the history):
    a restart keeps the lifetime, starts the session over, and an older version's separate
    totals file is folded in once."""
    path = hist.history_path(tmp_path, "lab/../x")
    first = hist.load(path)
    first.add(1000.0, {"calls": 10, "samples": 80, "cpu_s": 1.0, "gpu_s": 0.5, "bytes_sent": 4096})
    for peer in ("a", "b", "a"):
        first.served(1000.0, peer)
    assert first.contributions_view()["session"] == {"requests": 10, "samples": 80, "compute_s": 1.5, "bytes_sent": 4096, "trainers": 2}
    assert hist.save(path, first)
    second = hist.load(path)
    second.add(2000.0, {"calls": 5, "samples": 5, "cpu_s": 0.5, "bytes_sent": 1})
    second.served(2000.0, "b")
    second.served(2000.0, "c")
    view = second.contributions_view()
    assert view["session"]["trainers"] == 2 and view["since"] == 1000.0
    assert view["total"] == {"requests": 15, "samples": 85, "compute_s": 2.0, "bytes_sent": 4097, "trainers": 3}
    assert view["total"]["requests"] == sum(b.calls for b in second.days.values())  # one vocabulary, one count
    legacy = hist.legacy_path(tmp_path, "lab/../x")
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"requests": 40, "samples": "many", "compute_s": 9.0, "trainers": ["zz", 5, "00ff"], "since": 500.0}))
    assert hist.adopt_legacy_totals(second, legacy) and not legacy.exists()
    assert not hist.adopt_legacy_totals(second, legacy)  # once
    total = second.contributions_view()["total"]
    assert total["requests"] == 40 and total["samples"] == 85 and total["compute_s"] == 9.0 and total["trainers"] == 5  # two kept hashes parse
    assert second.contributions_view()["since"] == 500.0
    sketch = contrib.DistinctSketch(size=256)
    for i in range(20_000):
        sketch.add(f"trainer-{i % 5000}")
    assert len(sketch.hashes) == 256
    assert 4000 < sketch.count() < 6000  # estimated within ~6%/sqrt(256) x a margin
    assert contrib.DistinctSketch.from_json(sketch.to_json(), size=256).count() == sketch.count()


@pytest.mark.trio_timeout(1500)  # virtual seconds: the clock autojumps
async def test_no_dashboard_mode_logs_a_summary_every_five_minutes(autojump_clock):
    lines: list[str] = []
    snapshot = dict(FULL, connections=[dict(c, role="trainer") for c in FULL["connections"]],
                    contributions={"session": {"requests": 12, "bytes_sent": 2048, "trainers": 2}})
    with trio.move_on_after(3 * 300 + 1):
        await log_summaries(lambda: snapshot, lines.append)
    assert len(lines) == 3
    assert lines[0] == summary_line(snapshot)
    for value in ("running", "up 1h02m", "private", "2 trainer", "1 experts 3.2 req/s", "12 requests", "2.0 KiB sent", "2 trainers"):
        assert value in lines[0], (value, lines[0])
    broken: list[str] = []

    def failing() -> dict:
        raise RuntimeError("daemon gone")

    with trio.move_on_after(301):
        await log_summaries(failing, broken.append)
    assert broken == ["status summary failed: RuntimeError('daemon gone')"]


def test_logging_moves_off_the_terminal_while_the_dashboard_runs(capsys):
    import io

    from rich.console import Console

    root = logging.getLogger()
    handler = logging.StreamHandler()  # what logging.basicConfig installs: stderr
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    out = io.StringIO()
    try:
        with logging_through(Console(file=out, width=100)):
            assert handler not in root.handlers
            logging.getLogger("volunteer.test").warning("a warning for the Log panel only")
            logging.getLogger("volunteer.test").info("an info line through rich")
        assert handler in root.handlers
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert "a warning for the Log panel only" not in capsys.readouterr().err
    assert "an info line through rich" in out.getvalue() and "Log panel only" not in out.getvalue()


def test_coverage_counts_the_uid_lists_the_replica_manager_reports_and_says_when_it_is_stale():
    from volunteer.replicas.coverage import coverage
    from volunteer.swarmfile import GridSpec

    grid = GridSpec("expert", (4, 4), "ffn", 8, replicas=2)
    view = coverage([grid], {"expert.0.0": {"a": 0, "b": 0}, "expert.0.1": {"a": 0}})
    text = render_text(dict(FULL, coverage=dict(view, surveyed_age_s=75.0)), width=160, height=48)
    assert "1 under-replicated, 14 unhosted" in text and "· covered" not in text
    assert "coverage 1m15s old: expert" in text
    check_fits(render_text(dict(FULL, coverage=dict(view, surveyed_age_s=75.0)), width=80, height=24), 80, 24)
    fresh = render_text(dict(FULL, coverage=dict(view, surveyed_age_s=2.0)), width=160, height=48)
    assert "old:" not in fresh
    full = coverage([grid], {uid: {"a": 0, "b": 0} for uid in grid.uids()})
    assert "· covered" in render_text(dict(FULL, coverage=full), width=160, height=48)


def test_at_80x24_every_list_still_shows_rows():
    busy = dict(FULL, coverage={"grids": [{"prefix": "expert", "total": 16, "hosted": 0, "replicas_target": 1,
                                            "under_replicated": [], "unhosted": [f"expert.{i}" for i in range(16)]}]},
                experts=[dict(FULL["experts"][0], uid=f"expert.{i // 4}.{i % 4}") for i in range(16)],
                connections=[dict(FULL["connections"][0], peer_id=f"12D3KooWPeer{i:04d}xxxxxxxxTR{i:02d}") for i in range(6)])
    text = render_text(busy, width=80, height=24)
    check_fits(text, 80, 24)
    assert "expert.0.0" in text  # a row of the Experts table, not only "+16 more"
    assert "xTR00" in text  # a row of the Connections table
    assert "+15 more" in text and "+5 more" in text


def test_a_wide_terminal_shows_long_log_lines_whole():
    message = "expert expert.0.1 failed for …abc: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.8 GiB total)"
    text = render_text(dict(FULL, log=[dict(FULL["log"][0], message=message)]), width=160, height=40)
    check_fits(text, 160, 40)
    assert message in text


def test_the_experts_title_says_who_trains_and_who_was_refused():
    snapshot = dict(FULL, trainers={"policy": "open: anyone may train", "rollbacks": 1, "trainers": {
        "12D3KooWTrainerTrainerTrainerTrainerTrainerAA": {"applied": 40, "clipped": 0, "refused": 0, "refused_for": 0.0},
        "12D3KooWOtherOtherOtherOtherOtherOtherOtherBB": {"applied": 2, "clipped": 3, "refused": 97, "refused_for": 540.0},
    }})
    text = render_text(snapshot, width=160, height=40)
    assert "trainers: 2 (1 refused, 3 clipped, 1 rolled back)" in text, text
    check_fits(text, 160, 40)
    check_fits(render_text(dict(snapshot, trainers={"trainers": "junk"}), width=80, height=24), 80, 24)
