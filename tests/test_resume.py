"""Exact resume: an interrupted run, resumed from its checkpoint, ends bitwise equal to an uninterrupted one.

The run (resume_scripts/train.py) has dropout, shuffled data, gradient accumulation (2) and a step-interval
scheduler; 3 epochs of 5 optimizer steps. It is interrupted by an exception, by SIGTERM (Lightning's
SIGTERMException after the batch: exit status 0, no checkpoint of its own; resumed from ModelCheckpoint's last) and by
SIGKILL (resumed from the last checkpoint on disk), on one process and on DDP with 2 processes.
"""
import json
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


# step 3: mid-epoch and mid-way through the scheduler; 5: the last step of epoch 0; 8: mid-epoch 1
SINGLE = [("exception", 3), ("exception", 5), ("exception", 8), ("sigterm", 7), ("sigkill", 4)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The one-process runs in three processes, not eleven (each costs ~5 s of CPU in imports): the SIGKILL stop in a
    child forked from the process that then runs the three exception stops one after the other (each caught by the
    script and recorded: fit raised it; the child must end by SIGKILL); SIGTERM in a process of its own (its exit
    status is checked); then one fresh process runs the uninterrupted reference, every resume, and a resume with
    nothing saved. What each test checks of an interrupted run is read before that process starts. Returns {case:
    facts}, the reference and the resume with nothing saved."""
    roots = {case: tmp_path_factory.mktemp(f"{case[0]}{case[1]}") for case in SINGLE}
    facts = {case: {} for case in SINGLE}
    first = [dict(root=str(roots[c]), out=str(roots[c] / "out.pt"), stop=c[0], at=c[1]) for c in SINGLE
             if c[0] == "sigkill"]  # (forked first, before that process trains)
    first += [dict(root=str(roots[c]), out=str(roots[c] / "out.pt"), stop=c[0], at=c[1]) for c in SINGLE
              if c[0] == "exception"]
    run_cases(first)
    for stop, at in SINGLE:
        root = roots[stop, at]
        if stop == "exception":
            facts[stop, at]["raised"] = (root / "raised.txt").read_text()
        elif stop == "sigterm":  # (the SIGKILL run was forked above: run_cases checked that the kill ended it)
            proc = run(root, root / "out.pt", "--stop", stop, "--at", str(at), expect_ok="no traceback")
            facts[stop, at]["stderr"] = proc.stderr
        facts[stop, at]["out_written"] = (root / "out.pt").exists()
        checkpoints = root / "checkpoints"
        facts[stop, at]["preempted"] = [f for f in os.listdir(checkpoints) if f.startswith("preempted-")]
        facts[stop, at]["last_step"] = load_checkpoint_file(checkpoints / "last.ckpt")["global_step"]
    ref, empty = tmp_path_factory.mktemp("ref1"), tmp_path_factory.mktemp("nothing_saved")
    cases = [dict(root=str(ref), out=str(ref / "out.pt"))]
    cases += [dict(root=str(roots[c]), out=str(roots[c] / "out.pt"), resume=True) for c in SINGLE]
    cases.append(dict(root=str(empty), out=str(empty / "out.pt"), resume=True))
    stderr = run_cases(cases).stderr
    for case in SINGLE:
        facts[case]["resumed"] = torch.load(roots[case] / "out.pt")
    nothing_saved = stderr[stderr.index(f"[case {len(cases) - 1}]"):]
    return facts, torch.load(ref / "out.pt"), (torch.load(empty / "out.pt"), nothing_saved)


def run_cases(cases, timeout=300):
    """resume_scripts/train.py --cases: one-process runs one after the other in one process."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    proc = subprocess.run([sys.executable, SCRIPT, "--cases", json.dumps(cases)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def assert_same_run(resumed, ref, steps=15):
    assert resumed["global_step"] == ref["global_step"] == steps
    assert resumed["epoch"] == ref["epoch"]
    for name, value in ref["params"].items():
        assert torch.equal(resumed["params"][name], value), f"{name} differs after resume"
    assert resumed["val_loss"] == ref["val_loss"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stop, at", SINGLE)
def test_single_process_resume_is_exact(single, stop, at):
    facts, ref, _ = single
    got = facts[stop, at]
    assert not got["out_written"]
    if stop == "exception":
        assert got["raised"] == f"interrupted at step {at}"  # fit raised the interruption out
    if stop == "sigterm":  # Lightning's: SIGTERMException right after that batch (step 7, saved by ModelCheckpoint)
        assert "Received SIGTERM" in got["stderr"]
        assert not got["preempted"]
        assert got["last_step"] == 7
    assert_same_run(got["resumed"], ref)


# 2 ranks x 5 batches of 4, accumulate 2: 3 steps per epoch, 9 in all
DDP = [("exception", 2, 1), ("sigterm", 5, 0), ("sigkill", 7, 1)]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """The 2-process runs in four launches, not seven: each interruption in a launch of its own (it ends the run),
    what the test checks of it read at once; then one launch runs the uninterrupted reference and the three resumes
    one after the other (the launched worker runs the same script: every fit on both ranks)."""
    roots = {case: tmp_path_factory.mktemp("ddp-%s-%d-%d" % case) for case in DDP}
    facts = {case: {} for case in DDP}
    for stop, at, rank in DDP:
        root = roots[stop, at, rank]
        proc = run(root, root / "out.pt", "--devices", "2", "--stop", stop, "--at", str(at), "--rank", str(rank),
                   expect_ok="no traceback" if stop == "sigterm" else False)
        facts[stop, at, rank].update(stderr=proc.stderr, out_written=(root / "out.pt").exists(),
                                     last_step=load_checkpoint_file(root / "checkpoints" / "last.ckpt")["global_step"])
    ref = tmp_path_factory.mktemp("ref2")
    cases = [dict(root=str(ref), out=str(ref / "out.pt"), devices=2)]
    cases += [dict(root=str(roots[c]), out=str(roots[c] / "out.pt"), devices=2, resume=True) for c in DDP]
    run_cases(cases, timeout=400)
    for case in DDP:
        facts[case]["resumed"] = torch.load(roots[case] / "out.pt")
    return facts, torch.load(ref / "out.pt")


@pytest.mark.world_size(2)
@pytest.mark.timeout(800)
@pytest.mark.parametrize("stop, at, rank", DDP)
def test_ddp_resume_is_exact(ddp, stop, at, rank):
    facts, ref = ddp
    got = facts[stop, at, rank]
    assert not got["out_written"]
    if stop == "sigterm":
        # rank 0 got SIGTERM after step 5 (and passed it on to rank 1, the worker it started); both ranks agree at the
        # next log_every_n_steps (2) boundary and raise SIGTERMException there, together: the last save is step 6
        assert "Received SIGTERM" in got["stderr"]
        assert got["last_step"] == 6
    assert_same_run(got["resumed"], ref, steps=9)


@pytest.mark.timeout(600)
def test_last_with_nothing_saved_starts_fresh(single):
    _, ref, (resumed, stderr) = single
    assert "there is no last checkpoint available. No checkpoint will be loaded" in stderr  # Lightning's warning
    assert_same_run(resumed, ref)
