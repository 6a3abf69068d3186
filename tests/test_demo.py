"""`make demo` trains examples/digits.py on 2 processes: it must reach the accuracy the README promises."""
import os
import re
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "digits.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.world_size(2)
@pytest.mark.timeout(240)
def test_demo_reaches_095_on_two_processes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    proc = subprocess.run([sys.executable, EXAMPLE, "--strategy", "ddp", "--devices", "2", "--root", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    accuracy = float(re.search(r"final validation accuracy: ([0-9.]+)", proc.stdout).group(1))
    assert accuracy >= 0.95, proc.stdout
    assert "world_size=2" in proc.stdout
    logs = tmp_path / "lightning_logs" / "version_0"
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(logs))
    assert "last.ckpt" in os.listdir(logs / "checkpoints")
