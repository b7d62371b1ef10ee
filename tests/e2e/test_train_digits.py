"""examples/train_digits.py as a user runs it: a local testnet (relay + 4 volunteer processes),
a trainer reaching 95% test accuracy through remote experts, with 10% of expert calls failing
and one volunteer killed (SIGKILL) mid-training, while another CPU-bound process competes for
the machine (a loaded machine once made a training step raise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT = 400  # seconds for the whole example
# A busy loop for at most as long as the example may run; killed as soon as the example ends.
BURNER = f"import time\nend = time.monotonic() + {RUN_LIMIT + 20}\nwhile time.monotonic() < end:\n    pass\n"


def run_example(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), *args],
                          capture_output=True, text=True, timeout=RUN_LIMIT, cwd=ROOT)


def test_reaches_95_percent_with_failures_and_a_crash_on_a_busy_machine():
    burner = subprocess.Popen([sys.executable, "-c", BURNER])
    try:
        result = run_example("--fail-rate", "0.1", "--kill-volunteer-at-epoch", "2", "--epochs", "25")
    finally:
        burner.kill()
        burner.wait()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "killed volunteer process" in out
    assert "expert calls failed on purpose" in out
    assert "reached 95% test accuracy" in out
    assert "re-routed to a second round" in out
    best = float(out.rsplit("best ", 1)[1].split(")")[0])
    assert best >= 0.95
