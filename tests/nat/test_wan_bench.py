"""benchmarks/wan.py runs end to end on the rig: a relay, four volunteers and a trainer in five
homes on the fibre line, tiny experts (``ffn``, and ``transformer`` blocks fed whole sequences),
two measured steps; it prints the table and a last line a script can read. (Its figures are the
benchmark's business, not this test's.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.nat import rig as rigmod

pytestmark = [pytest.mark.nat, pytest.mark.slow]
LAST_LINE = re.compile(r"wan: limit ratio worst \d+\.\d\d, vs hivemind worst (\d+\.\d\d×|n/a)")


@pytest.mark.parametrize("expert_class, label", [("ffn", "fibre"), ("transformer", "fibre/tfm")])
def test_a_smoke_run_completes_and_ends_with_a_well_formed_line(nat_ok, expert_class, label):
    result = subprocess.run(
        [sys.executable, str(rigmod.REPO / "benchmarks" / "wan.py"), "--profiles", "fibre", "--steps", "2",
         "--warmup", "1", "--hidden", "16", "--compute-repeats", "1", "--skip-hivemind",
         "--expert-class", expert_class],
        capture_output=True, text=True, timeout=600, cwd=rigmod.REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]
    assert any(line.split()[:2] == [label, "ours"] for line in lines)
    assert any(line.split()[:3] == [label, "raw", "tcp"] for line in lines)  # the measured floor ran too
    assert "paths ['direct tcp']" in result.stdout  # the volunteers' forwarded ports were used (no loss: TCP)
    # where the time goes: the calls' network share, and every volunteer's compute utilisation read
    assert re.search(r"^fibre: the trainer's calls spent \d+% of their time on the network; volunteers' compute "
                     r"utilisation (\d+%, ){3}\d+%$", result.stdout, re.M), result.stdout[-3000:]
