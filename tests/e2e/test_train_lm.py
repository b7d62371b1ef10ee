"""examples/train_lm.py as a user runs it, reduced (``--size tiny``: 40 steps): ``--compare``
trains locally, then through a testnet (a relay and 2 volunteer processes: fewer to start on a
loaded machine), prints both curves, a generated sample and where the time went, and ends within
1 % of the local run in validation bits per byte (the volunteers start from the local run's experts and ``auto`` sends tensors as
they are, or as float16 where the loaded machine's loopback looks slow: tests/integration/
test_train_lm.py measures what those cost)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT = 300  # seconds for the whole example
BAND = 0.01


def test_compare_tiny_stays_within_the_band_and_says_where_the_time_went(tmp_path):
    curve = tmp_path / "tiny.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_lm.py"), "--size", "tiny", "--compare", "--volunteers", "2",
         "--sample-bytes", "40",
         "--save-curve", str(curve)],
        capture_output=True, text=True, timeout=RUN_LIMIT, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    finals = dict(re.findall(r"^final: (local|swarm) \S* ?step 40 validation bpb ([0-9.]+)$", out, re.M))
    assert set(finals) == {"local", "swarm"}, out[-2000:]
    local, swarm = float(finals["local"]), float(finals["swarm"])
    assert abs(swarm / local - 1) < BAND, (swarm, local, out[-3000:])
    assert "sample:\ndef " in out, out[-3000:]
    assert re.search(r"waiting on the experts' calls", out), out[-3000:]
    assert re.search(r"volunteers' compute utilisation .*: \d+%, \d+%$", out, re.M), out[-2000:]
    assert "0 failed, 0 tokens short of k_min" in out, out[-3000:]
    saved = {m: json.loads((tmp_path / f"tiny-{m}.json").read_text()) for m in ("local", "swarm")}
    assert saved["local"]["steps"] == saved["swarm"]["steps"] == [10, 20, 30, 40]
    assert saved["swarm"]["settings"]["compression"] == "auto"
