"""``benchmarks/scale_processes.py`` at a tiny size: a relay and four real ``volunteer join``
daemons, a trainer in this test's child process; the figures must be sane (every lookup found
its live host, the killed daemon's experts vanished and its replacement's appeared, idle
daemons' memory and CPU were read). No timing assertions: the times only have to exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_four_daemons_give_sane_figures(tmp_path):
    out = tmp_path / "figures.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VOLUNTEER_CONFIG_DIR": str(tmp_path / "cfg")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale_processes.py"), "-n", "4", "--minutes", "0.3", "--kills", "1",
         "--idle-seconds", "5", "--no-sim", "--dir", str(tmp_path / "net"), "--json", str(out)],
        capture_output=True, text=True, timeout=540, env=env, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["warmup_missing"] == 0
    for kind in ("expert", "grid", "beam"):
        assert figures[kind]["count"] > 0, kind
        assert figures[kind]["success"] == 100.0, (kind, figures[kind])
    assert len(figures["vanish_s"]) == 1, figures  # the killed daemon's expert vanished
    assert len(figures["appear_s"]) == 1, figures  # and its replacement's appeared
    idle = figures["idle"]
    assert idle["pss_median"] > 0 and idle["rss_median"] >= idle["pss_median"]
    assert 0 <= idle["cpu_median"] <= idle["cpu_max"]
    assert figures["msgs_per_peer_min"] > 0 and figures["bytes_per_peer_min"] > 0
    assert done.stdout.splitlines()[-1].startswith("scale_processes: 4 daemons,")
