"""Exact resume: an interrupted run, resumed from its checkpoint, ends bitwise equal to an uninterrupted one.

The run (resume_scripts/train.py) has dropout, shuffled data, gradient accumulation (2) and a step-interval
scheduler; 3 epochs of 5 optimizer steps. It is interrupted by an exception, by SIGTERM (Lightning's
SIGTERMException after the batch: exit status 0, no checkpoint of its own; resumed from ModelCheckpoint's last) and by
SIGKILL (resumed from the last checkpoint on disk), on one process and on DDP with 2 processes.
"""
import os
import subprocess
import sys

import pytest
import torch

from tasktrain.checkpoint_io import load_checkpoint_file

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_scripts", "train.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def run(root, out, *args, expect_ok=True, timeout=180):
    """expect_ok: True (exit status 0), False (non-zero), or "no traceback" (0, nothing raised: SIGTERM's)."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    proc = subprocess.run([sys.executable, SCRIPT, "--root", str(root), "--out", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert expect_ok is True or "Traceback" not in proc.stderr, proc.stderr
    else:
        assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    refs = {}

    def get(devices):
        if devices not in refs:
            d = tmp_path_factory.mktemp(f"ref{devices}")
            run(d, d / "out.pt", "--devices", str(devices))
            refs[devices] = torch.load(d / "out.pt")
        return refs[devices]

    return get


def assert_same_run(resumed, ref, steps=15):
    assert resumed["global_step"] == ref["global_step"] == steps
    assert resumed["epoch"] == ref["epoch"]
    for name, value in ref["params"].items():
        assert torch.equal(resumed["params"][name], value), f"{name} differs after resume"
    assert resumed["val_loss"] == ref["val_loss"]


# step 3: mid-epoch and mid-way through the scheduler; 5: the last step of epoch 0; 8: mid-epoch 1
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop, at", [("exception", 3), ("exception", 5), ("exception", 8), ("sigterm", 7),
                                      ("sigkill", 4)])
def test_single_process_resume_is_exact(tmp_path, reference, stop, at):
    out = tmp_path / "out.pt"
    proc = run(tmp_path, out, "--stop", stop, "--at", str(at), expect_ok="no traceback" if stop == "sigterm" else False)
    assert not out.exists()
    if stop == "sigterm":  # Lightning's: SIGTERMException right after that batch (step 7, saved by ModelCheckpoint)
        assert "Received SIGTERM" in proc.stderr
        assert not any(f.startswith("preempted-") for f in os.listdir(tmp_path / "checkpoints"))
        assert load_checkpoint_file(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 7
    run(tmp_path, out, "--resume")
    assert_same_run(torch.load(out), reference(1))


@pytest.mark.world_size(2)
@pytest.mark.timeout(400)
# 2 ranks x 5 batches of 4, accumulate 2: 3 steps per epoch, 9 in all
@pytest.mark.parametrize("stop, at, rank", [("exception", 2, 1), ("sigterm", 5, 0), ("sigkill", 7, 1)])
def test_ddp_resume_is_exact(tmp_path, reference, stop, at, rank):
    out = tmp_path / "out.pt"
    proc = run(tmp_path, out, "--devices", "2", "--stop", stop, "--at", str(at), "--rank", str(rank),
               expect_ok="no traceback" if stop == "sigterm" else False)
    assert not out.exists()
    if stop == "sigterm":
        # rank 0 got SIGTERM after step 5 (and passed it on to rank 1, the worker it started); both ranks agree at the
        # next log_every_n_steps (2) boundary and raise SIGTERMException there, together: the last save is step 6
        assert "Received SIGTERM" in proc.stderr
        assert load_checkpoint_file(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 6
    run(tmp_path, out, "--devices", "2", "--resume")
    assert_same_run(torch.load(out), reference(2), steps=9)


def test_last_with_nothing_saved_starts_fresh(tmp_path, reference):
    out = tmp_path / "out.pt"
    proc = run(tmp_path, out, "--resume")
    assert "there is no last checkpoint available. No checkpoint will be loaded" in proc.stderr  # Lightning's warning
    assert_same_run(torch.load(out), reference(1))
