"""Issue 38: a run the user can trust. A non-finite state is never saved as a good one; limits and loaders that would
train nothing are errors before training; a finished run resumed says so and writes nothing; Ctrl-C runs
on_exception, prints one line per rank and exits 1, as Lightning (real processes receiving SIGINT)."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Callback, ModelCheckpoint, OnExceptionCheckpoint, Trainer
from tasktrain import checkpoint_io as ckpt_io
from tasktrain.trainer import resume
from tasktrain.trainer.guards import NonFiniteCheckpointWarning

from helpers import Linear, loader

HERE = os.path.dirname(os.path.abspath(__file__))
QUIET = dict(enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


# -- a poisoned state is never saved -----------------------------------------------------------------------------------
class NaNFrom(Linear):
    """The loss goes NaN in the step after `at` optimizer steps (SGD then writes NaN into the weights)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step >= self.at else loss


class InfWeightsAt(Callback):
    """The weights go inf after optimizer step `at` while every loss so far was finite."""

    def __init__(self, at):
        self.at = at

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                module.layer.weight.fill_(float("inf"))


def _weights_finite(path):
    state = torch.load(path, weights_only=True)["state_dict"]
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize("poison, async_save", [("loss", False), ("weights", False), ("loss", True)])
def test_nonfinite_state_is_never_saved(tmp_path, poison, async_save):
    module = NaNFrom(at=3) if poison == "loss" else NaNFrom(at=10 ** 9)
    callbacks = [InfWeightsAt(4)] if poison == "weights" else []
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=2, monitor="step",
                                 mode="max", save_last=True, async_save=async_save)
    callbacks += [checkpoint, OnExceptionCheckpoint(dirpath=tmp_path / "exc")]
    # log_every_n_steps=50: the loop's own loss check alone would come far too late
    trainer = Trainer(max_epochs=3, callbacks=callbacks, logger=False, default_root_dir=tmp_path,
                      log_every_n_steps=50, **QUIET)
    with pytest.warns(NonFiniteCheckpointWarning, match="Not saving") as record:
        with pytest.raises(FloatingPointError, match="non-finite"):
            trainer.fit(module, loader(n=32, batch_size=4))
    # the failing step's save and the exception save are skipped, each said once
    assert len([w for w in record if w.category is NonFiniteCheckpointWarning]) == 2
    assert not (tmp_path / "exc" / "on_exception.ckpt").exists()
    files = sorted(glob.glob(str(tmp_path / "ckpt" / "*.ckpt")))
    assert files, "the finite checkpoints before the failure were deleted"
    for path in files:
        assert _weights_finite(path), f"{path} holds non-finite weights"
    # the top k and best stay on finite files of the steps before (step 4 went non-finite: 2 and 3 remain)
    assert sorted(os.path.basename(p) for p in checkpoint.best_k_models) == ["epoch=0-step=2.ckpt",
                                                                              "epoch=0-step=3.ckpt"]
    assert all(os.path.exists(p) for p in checkpoint.best_k_models)
    last = resume.resolve_ckpt_path(trainer, "last")  # what a resume continues from: finite
    assert last == str(tmp_path / "ckpt" / "last.ckpt") and _weights_finite(last)
    assert torch.load(last, weights_only=True)["loops"]["train_state"]["global_step"] == 3


class RaiseAfterPoison(Callback):
    """At optimizer step `at`: the weights go inf, then an error ends fit (before ModelCheckpoint's save of it)."""

    def __init__(self, at):
        self.at = at

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.at:
            with torch.no_grad():
                module.layer.weight.fill_(float("inf"))
            raise RuntimeError("boom")


def test_save_on_exception_checks_finiteness_before_writing(tmp_path, capfd):
    """ModelCheckpoint(save_on_exception=True): the guard comes first in its save path, so a poisoned state ends as
    the user's error, with no exception checkpoint, and last/top-k stay on the finite files."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_last=True, save_on_exception=True)
    trainer = Trainer(max_epochs=1, callbacks=[RaiseAfterPoison(3), checkpoint], logger=False,
                      default_root_dir=tmp_path, **QUIET)
    with pytest.warns(NonFiniteCheckpointWarning, match="Not saving"):
        with pytest.raises(RuntimeError, match="boom"):
            trainer.fit(Linear(), loader(n=32, batch_size=4))
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert all(_weights_finite(p) for p in tmp_path.glob("*.ckpt"))
    assert os.path.basename(checkpoint.last_model_path) == "last.ckpt"
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["loops"]["train_state"]["global_step"] == 2
    out = capfd.readouterr()
    assert "saved checkpoint" not in out.out and "hook failed" not in out.err, out


def test_finiteness_is_checked_at_saves_only(tmp_path, monkeypatch):
    """No per-step work: the losses and weights are looked at when a checkpoint is about to be written, once per
    state (ModelCheckpoint asks, then save_checkpoint asks again: one check)."""
    from tasktrain.trainer import guards

    calls = []
    real = guards.nonfinite_reason
    monkeypatch.setattr(guards, "nonfinite_reason", lambda trainer: calls.append(trainer.global_step) or real(trainer))
    trainer = Trainer(max_epochs=2, logger=False, default_root_dir=tmp_path, log_every_n_steps=1,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)], **QUIET)
    trainer.fit(Linear(), loader(n=32, batch_size=4))  # 16 steps, a save at the end of each epoch
    assert calls == [8, 16]


def test_save_checkpoint_after_fit_refuses_nonfinite_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")  # a launch that can restart records its newest checkpoint
    trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, default_root_dir=tmp_path, **QUIET)
    module = Linear()
    trainer.fit(module, loader())
    assert trainer.save_checkpoint(tmp_path / "good.ckpt") is True
    with torch.no_grad():
        module.layer.bias.fill_(float("nan"))
    with pytest.warns(NonFiniteCheckpointWarning, match="the weights went non-finite"):
        assert trainer.save_checkpoint(tmp_path / "bad.ckpt") is False
    assert not (tmp_path / "bad.ckpt").exists()
    assert ckpt_io.read_last_pointer(str(tmp_path)) == str(tmp_path / "good.ckpt")


# -- no silent no-ops ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(max_epochs=-5), dict(max_steps=-5), dict(max_epochs=1.5),
                                    dict(min_epochs=-1), dict(min_steps=-2), dict(limit_train_batches=-1),
                                    dict(limit_val_batches=1.5), dict(limit_test_batches="all"),
                                    dict(limit_predict_batches=-0.5), dict(val_check_interval=0),
                                    dict(val_check_interval=-1), dict(val_check_interval=2.5)])
def test_invalid_limits_raise_at_construction(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        Trainer(logger=False, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(max_epochs=-1, max_steps=3), dict(max_steps=-1, max_epochs=1),
                                    dict(limit_train_batches=0.5, limit_val_batches=0, val_check_interval=1.0),
                                    dict(min_epochs=0, min_steps=0, val_check_interval=3),
                                    dict(max_epochs=3.0, min_steps=2)])
def test_valid_limits_are_accepted(kwargs):
    Trainer(logger=False, **kwargs)


@pytest.mark.parametrize("data", ["empty", "drop_last", "list"])
def test_empty_training_loader_raises_before_training(tmp_path, data):
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    if data == "empty":
        train = DataLoader(TensorDataset(x[:0], y[:0]), batch_size=4)
    elif data == "list":  # (train_dataloader() returning [])
        train = []
    else:
        train = DataLoader(TensorDataset(x, y), batch_size=4, drop_last=True)
    trainer = Trainer(max_epochs=2, logger=False, default_root_dir=tmp_path, **QUIET)
    said = {"empty": "its dataset is empty", "list": "it is an empty list", "drop_last": "its dataset has 3 rows, fewer than batch_size=4, and drop_last=True"}[data]
    with pytest.raises(ValueError, match="yields no batches: " + said):
        trainer.fit(Linear(), train)
    assert not glob.glob(str(tmp_path / "**" / "*.ckpt"), recursive=True)


def test_limit_train_batches_zero_trains_nothing_and_writes_nothing(tmp_path, capfd):
    trainer = Trainer(max_epochs=2, limit_train_batches=0, logger=False, default_root_dir=tmp_path, **QUIET)
    trainer.fit(Linear(), loader())
    assert "limit_train_batches=0: fit trains nothing" in capfd.readouterr().err
    assert trainer.global_step == 0 and trainer.current_epoch == 0  # Lightning's counters after a skipped loop
    assert not glob.glob(str(tmp_path / "**" / "*.ckpt"), recursive=True)


def test_resuming_a_finished_run_says_so_and_writes_nothing(tmp_path, capfd):
    from tasktrain.loggers import CSVLogger

    def trainer():
        return Trainer(max_epochs=1, logger=CSVLogger(tmp_path), default_root_dir=tmp_path, **QUIET)

    first = trainer()
    first.fit(Linear(), loader())
    logs = sorted(glob.glob(str(tmp_path / "**" / "version_*"), recursive=True))
    assert len(logs) == 1
    files = sorted(glob.glob(str(tmp_path / "**" / "*"), recursive=True))
    capfd.readouterr()
    again = trainer()
    module = Linear()
    again.fit(module, loader(), ckpt_path=first.checkpoint_callback.best_model_path)
    err = capfd.readouterr().err
    assert "is a finished run" in err and "max_epochs=1" in err
    assert again.global_step == first.global_step
    # nothing written: no checkpoint, no metrics; only the logger's next version folder, empty, as Lightning's
    # (its logger's experiment is made when the run starts, before the restore finds the run finished)
    new = sorted(set(glob.glob(str(tmp_path / "**" / "*"), recursive=True)) - set(files))
    assert new == [str(tmp_path / "lightning_logs" / "version_1")] and not os.listdir(new[0])


# -- Ctrl-C -------------------------------------------------------------------------------------------------------------
def _interrupt(root, devices, timeout=120):
    """Start interrupt.py, wait until every rank trains, then Ctrl-C: SIGINT to its whole process group, as a
    terminal sends it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("TASKTRAIN_")}

    def own_group_with_sigint():  # (a shell starts background jobs with SIGINT ignored; a terminal does not)
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "guard_scripts", "interrupt.py"), "--root",
                             str(root), "--devices", str(devices)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=own_group_with_sigint)
    try:
        deadline = time.monotonic() + timeout
        while not all((root / f"ready{r}").exists() for r in range(devices)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_ctrl_c_runs_on_exception_prints_one_line_per_rank_and_exits_1(tmp_path, devices):
    code, out, err = _interrupt(tmp_path, devices)
    assert code == 1, out + err
    assert "Traceback" not in err and "fit returned" not in out
    for rank in range(devices):
        line = err.count(f"rank {rank}: Detected KeyboardInterrupt, attempting graceful shutdown ...")
        if rank > 0 and line == 0:
            # a worker that was waiting in a collective rank 0 never joined cannot run Python: rank 0 stops it after
            # the grace period and says so, in one line (seen about once in 8 runs on 2 loaded cores)
            assert err.count(f"rank {rank} (pid ") == 1 and "had not stopped" in err, err
            continue
        assert line == 1, err
        assert (tmp_path / f"on_exception{rank}").read_text() == "KeyboardInterrupt"
    if devices == 2:  # the first fit of the same processes: a NaN loss on rank 1 only stops both before its save
        for rank in range(2):
            assert "went non-finite" in (tmp_path / f"fpe{rank}").read_text()
        assert sorted(os.listdir(tmp_path / "nan")) == ["epoch=0-step=1.ckpt",
                                                        "epoch=0-step=2.ckpt", "last.ckpt"]
        said = [(tmp_path / f"fpe_log{rank}").read_text() for rank in range(2)]
        assert said[0] == said[1] and said[0].startswith("The training loss became nan on rank 1 at epoch 0, batch 2"), said
    if devices == 1:  # OnExceptionCheckpoint saved the state at the interrupt
        assert "saved" in out and torch.load(tmp_path / "on_exception.ckpt", weights_only=True)["loops"]["train_state"]["global_step"] >= 3
