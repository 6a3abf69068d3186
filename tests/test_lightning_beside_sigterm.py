"""SIGTERM beside Lightning 2.6 (issue 37): the same cases (lightning_scripts/sigterm_beside.py) send SIGTERM to the
process from a callback hook at one batch, under Lightning and under tasktrain: in fit (mid-epoch, at an epoch's last
batch, in its validation, in its sanity check, with a ModelCheckpoint), validate, test (at the last batch), predict,
and a fit with ModelCheckpoint(save_on_exception=True). Compared: every hook called with trainer.received_sigterm at
each, what the entry point did (SIGTERMException or a return), the flag after it, the trainer's status, the calls of
the handler the script had before and whether it was given back, and the files written. The last case again under
tasktrain in a process of its own, its SIGTERMException uncaught: the exit status. (Two processes:
tests/test_resume.py's DDP SIGTERM case, where the ranks agree on the signal.)"""
import os
import subprocess
import sys

import pytest

pytest.importorskip("lightning.pytorch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lightning_scripts"))
from sigterm_beside import run_cases  # noqa: E402

SCRIPT = os.path.join(HERE, "lightning_scripts", "sigterm_beside.py")


@pytest.mark.timeout(120)
def test_sigterm_in_every_stage_as_lightning(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, SCRIPT, "tasktrain", str(tmp_path / "uncaught")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # (meanwhile, the cases)
    mine, theirs = run_cases("tasktrain", str(tmp_path / "tasktrain")), run_cases("lightning", str(tmp_path / "lightning"))
    output = proc.communicate(timeout=100)[0]
    # the uncaught SIGTERMException ends the script silently with status 0, after ModelCheckpoint(save_on_exception=
    # True) saved; Lightning's is a SystemExit without a code too (its exc.code, None, is in the records compared)
    assert proc.returncode == 0 and "Traceback" not in output, output
    assert "[rank: 0] Received SIGTERM: 15" in output and "not reached" not in output, output
    assert os.listdir(tmp_path / "uncaught" / "fit_save_on_exception" / "checkpoints") == ["epoch=0-step=2.ckpt"]
    assert mine.keys() == theirs.keys()
    for case in theirs:
        assert mine[case] == theirs[case], case
    # what that is (Lightning's): the run raises after the batch that saw the signal, the on_exception hooks run and
    # nothing else (no on_train_end / on_fit_end / teardown); the script's own handler is called and given back
    for case in ("fit_mid_epoch", "fit_last_batch_of_epoch", "fit_in_validation", "fit_in_sanity_check",
                 "fit_with_checkpointing", "validate", "fit_save_on_exception"):
        record = mine[case]
        assert record["outcome"] == ["SIGTERMException", None] and record["status"] == "interrupted", case
        assert record["hooks"][-1][0] in ("on_exception", "on_save_checkpoint"), case
        assert not {"on_train_end", "on_fit_end", "teardown"} & {h[0] for h in record["hooks"]}, case
    for record in mine.values():
        assert record["user_handler_calls"] == 1 and record["handler_back"] and record["after"] is True
    assert mine["fit_mid_epoch"]["hooks"][-2:] == [["on_train_batch_end", 1, True],
                                                   ["on_exception", ["SIGTERMException", 2, 0], True]]
    # the epoch's last batch: its validation starts, and stops after its first batch (not the last)
    assert [h[:2] for h in mine["fit_last_batch_of_epoch"]["hooks"][-3:]] == [
        ["on_validation_batch_start", 0], ["on_validation_batch_end", 0], ["on_exception", ["SIGTERMException", 4, 0]]]
    # test's last batch and predict: no exception, the run ends as usual
    assert mine["test_last_batch"]["outcome"] == "returned" and mine["test_last_batch"]["hooks"][-1][0] == "teardown"
    assert mine["predict"]["outcome"] == "returned" and mine["predict"]["predictions"] == 3
    # no checkpoint of SIGTERM's own; ModelCheckpoint(save_on_exception=True) saves, in on_exception
    assert mine["fit_with_checkpointing"]["files"] == []
    assert mine["fit_save_on_exception"]["files"] == ["checkpoints/epoch=0-step=2.ckpt"]
