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
    mine = run_cases("tasktrain", str(tmp_path / "tasktrain"))
    theirs = run_cases("lightning", str(tmp_path / "lightning"))
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signals", [("SIGUSR1",), ("SIGUSR1", "SIGTERM"), ("users SIGUSR1",)])
def test_slurms_requeue_signal_keeps_its_path_beside_sigterm(tmp_path, monkeypatch, signals):
    """Inside a SLURM job with SLURMEnvironment(auto_requeue=True, requeue_signal=SIGUSR1) (scontrol: a stand-in that
    notes its arguments), the requeue signal saves, requeues and ends the fit with exit status 0, also when SIGTERM
    comes with it (SLURM's own order at a time limit): SIGTERM does not turn the requeue into a SIGTERMException, and
    the script's SIGTERM handler is called too. SIGTERM stays ignored after the requeue (issue 40: SLURM ends the
    requeued job with it). A script with a SIGUSR1 handler of its own keeps it and nothing is requeued (Lightning's
    rule). (On a real cluster: tests/test_slurm.py.)"""
    import signal

    import tasktrain
    from tasktrain.demos.boring_classes import BoringModel, RandomDataset
    from tasktrain.plugins.environments import SLURMEnvironment
    from torch.utils.data import DataLoader

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.txt'}\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    users_own = signals == ("users SIGUSR1",)

    class Signal(tasktrain.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                for name in signals:
                    os.kill(os.getpid(), getattr(signal, name.split()[-1]))

    calls = []

    def users_handler(signum, frame):
        calls.append(signum)

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, users_handler),
                signal.SIGUSR1: signal.signal(signal.SIGUSR1, users_handler if users_own else signal.SIG_DFL)}
    try:
        trainer = tasktrain.Trainer(max_epochs=1, limit_train_batches=6, limit_val_batches=0, log_every_n_steps=1,
                                    logger=False, enable_progress_bar=False, enable_model_summary=False,
                                    default_root_dir=str(tmp_path / "run"), callbacks=[Signal()],
                                    plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)])
        module, data = BoringModel(), DataLoader(RandomDataset(32, 64), batch_size=2)
        if users_own:
            trainer.fit(module, data)
        else:
            with pytest.raises(SystemExit) as stop:
                trainer.fit(module, data)
        handlers_back = [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if users_own:  # its handler ran, the fit went on to its end; nothing saved or requeued
        assert calls == [signal.SIGUSR1] and trainer.global_step == 6 and not trainer.received_sigterm
        assert handlers_back == [users_handler, users_handler] and not (tmp_path / "scontrol.txt").exists()
        assert not (tmp_path / "run" / ".slurm-requeue").exists()
        return
    assert type(stop.value) is SystemExit and stop.value.code == 0  # requeued: not a SIGTERMException
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "4242"]
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["preempted-epoch=0-step=2.ckpt"]
    assert os.listdir(tmp_path / "run" / ".slurm-requeue") == ["4242.json"]
    assert trainer.received_sigterm is ("SIGTERM" in signals) and trainer.global_step == 2
    assert handlers_back == [signal.SIG_IGN, signal.SIG_DFL]
    assert calls == ([signal.SIGTERM] if "SIGTERM" in signals else [])
