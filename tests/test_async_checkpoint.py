"""Background checkpoints (issue 29): the rules of docs/checkpointing.md, one process (the multi-process kills and
restarts are tests/test_restart.py).

The writes are held or slowed by wrapping the file writer the one-file strategies use (strategies.base.atomic_save),
so that what the loop sees while a write is in flight can be looked at.
"""
import json
import os
import signal
import threading
import time

import pytest
import torch

import tasktrain.strategies.base as base
from tasktrain import Accelerator, Callback, ModelCheckpoint, Trainer
from tasktrain.checkpoint_io import (POINTER_NAME, CheckpointError, load_checkpoint_file, restart_checkpoint,
                                     stage_to_cpu, write_last_pointer)
from tasktrain.trainer import resume

from helpers import Linear, loader, quiet

REAL_SAVE = base.atomic_save


def pointer(root):
    with open(os.path.join(root, POINTER_NAME)) as f:
        return os.path.basename(json.load(f)["path"])


class Gate:
    """Wraps the background file write: records its start and end, holds the write of `hold` until released."""

    def __init__(self, hold=None, sleep=0.0, fail=None):
        self.hold, self.sleep, self.fail = hold, sleep, fail
        self.release = threading.Event()
        self.events = []

    def __call__(self, obj, path):
        name = os.path.basename(path)
        self.events.append(("start", name))
        if self.fail:
            raise OSError(self.fail)
        if self.hold is not None and self.hold in name:
            assert self.release.wait(30), "the test never released the held write"
        time.sleep(self.sleep)
        REAL_SAVE(obj, path)
        self.events.append(("end", name))


class Look(Callback):
    """At the start of step `at`'s batch (the save of step at-1 is in flight), call `look`; record the weights of
    every step as the checkpoint of that step must hold them."""

    def __init__(self, at, look):
        self.at, self.look, self.weights = at, look, {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.weights[trainer.global_step] = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.at:
            self.look(trainer)


def fit(tmp_path, gate, monkeypatch, callbacks=(), top_k=1, **kwargs):
    monkeypatch.setattr(base, "atomic_save", gate)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")  # a launch that can restart: the record a restart reads
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=top_k, save_last=True,
                                 async_save=True)
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, callbacks=[checkpoint, *callbacks],
                      **quiet(enable_checkpointing=True, **kwargs))
    return trainer, checkpoint


def test_a_checkpoint_counts_only_once_complete_and_the_previous_stays_until_then(tmp_path, monkeypatch):
    gate = Gate(hold="step=3")
    seen = {}

    def look(trainer):  # step 3's write is held: nothing of it may count yet
        cb = trainer.checkpoint_callback
        seen.update(pointer=pointer(tmp_path), best=os.path.basename(cb.best_model_path),
                    files=sorted(os.listdir(tmp_path / "ckpt")), in_flight=trainer.strategy.checkpoint_writer.in_flight)
        threading.Timer(0.3, gate.release.set).start()

    trainer, cb = fit(tmp_path, gate, monkeypatch, [Look(3, look)])
    trainer.fit(Linear(), loader(n=32, batch_size=8))
    assert seen["in_flight"]
    assert seen["pointer"] == seen["best"] == "epoch=0-step=2.ckpt"
    assert "epoch=0-step=2.ckpt" in seen["files"] and "epoch=0-step=3.ckpt" not in seen["files"]  # top_k=1 keeps 2
    # one write at a time: the save of step 4 started only once step 3's write had ended
    assert gate.events.index(("start", "epoch=0-step=4.ckpt")) > gate.events.index(("end", "epoch=0-step=3.ckpt"))
    # fit's end waited for the last write: complete, counted, pointed to; the evicted ones are gone
    assert pointer(tmp_path) == os.path.basename(cb.best_model_path) == "epoch=0-step=4.ckpt"
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    assert cb.best_k_models == {}  # no monitor: best_model_path is the newest file (Lightning's rule)


def test_the_staged_copy_is_the_state_of_its_step_while_training_goes_on(tmp_path, monkeypatch):
    gate = Gate(hold="step=2")
    look = Look(2, lambda trainer: threading.Timer(0.3, gate.release.set).start())
    trainer, cb = fit(tmp_path, gate, monkeypatch, [look], top_k=-1)
    trainer.fit(Linear(), loader(n=32, batch_size=8))
    for step in (2, 4):
        saved = load_checkpoint_file(tmp_path / "ckpt" / f"epoch=0-step={step}.ckpt")
        assert saved["loops"]["train_state"]["global_step"] == step
        for name, value in look.weights[step].items():
            assert torch.equal(saved["state_dict"][name], value)
    assert not torch.equal(look.weights[2]["layer.weight"], look.weights[3]["layer.weight"])  # training moved on
    # the file counts itself as the newest (best_model_path without a monitor: a resume from it sees it)
    saved = load_checkpoint_file(tmp_path / "ckpt" / "epoch=0-step=2.ckpt")
    assert saved["callbacks"][cb.state_key]["best_model_path"] == str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt")


def test_an_error_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    class Boom(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 2:
                raise RuntimeError("boom")

    trainer, cb = fit(tmp_path, Gate(sleep=0.3), monkeypatch, [Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Linear(), loader(n=32, batch_size=8))
    assert not trainer.strategy.checkpoint_writer.in_flight
    assert pointer(tmp_path) == "epoch=0-step=2.ckpt"
    assert load_checkpoint_file(tmp_path / "ckpt" / "epoch=0-step=2.ckpt")["loops"]["train_state"]["global_step"] == 2


def test_sigterm_waits_for_the_write_in_flight_and_last_moves_forward(tmp_path, monkeypatch):
    from tasktrain.exceptions import SIGTERMException

    class Term(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer, cb = fit(tmp_path, Gate(sleep=0.3), monkeypatch, [Term()])
    with pytest.raises(SIGTERMException):  # after that batch (step 3), as Lightning's (issue 37)
        trainer.fit(Linear(), loader(n=32, batch_size=8))
    files = sorted(os.listdir(tmp_path / "ckpt"))
    # step 3's background save was in flight when SIGTERM ended the run: its on_exception finished it, complete
    assert files == ["epoch=0-step=3.ckpt", "last.ckpt"]
    assert load_checkpoint_file(tmp_path / "ckpt" / "epoch=0-step=3.ckpt")["loops"]["train_state"]["global_step"] == 3
    assert pointer(tmp_path) == "epoch=0-step=3.ckpt"
    assert resume.resolve_ckpt_path(trainer, "last") == str(tmp_path / "ckpt" / "last.ckpt")


def test_a_failed_background_write_is_raised_and_never_becomes_last(tmp_path, monkeypatch):
    trainer, cb = fit(tmp_path, Gate(fail="No space left on device"), monkeypatch)
    with pytest.raises(CheckpointError, match="No space left on device"):
        trainer.fit(Linear(), loader(n=32, batch_size=8))
    assert not os.path.exists(tmp_path / POINTER_NAME)
    assert cb.best_model_path == "" and cb.best_k_models == {}


def test_stage_to_cpu_shares_nothing_and_keeps_plain_values():
    weight = torch.ones(3)
    state = {"w": weight, "nested": [(weight, 1), {"size": torch.Size([2, 3])}], "name": "x"}
    staged = stage_to_cpu(state)
    weight.add_(1)
    assert torch.equal(staged["w"], torch.ones(3)) and torch.equal(staged["nested"][0][0], torch.ones(3))
    assert staged["nested"][1]["size"] == torch.Size([2, 3]) and isinstance(staged["nested"][1]["size"], torch.Size)
    assert staged["name"] == "x" and staged["nested"][0][1] == 1


def test_accelerator_save_state_in_the_background(tmp_path, monkeypatch):
    from tasktrain.utils import ProjectConfiguration

    monkeypatch.setattr(base, "fsync_save", _slow(base.fsync_save))
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=1)
    accelerator = Accelerator(project_config=config)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    first = accelerator.save_state(async_save=True)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on while the write is in flight
    assert not os.path.exists(first)  # not there until complete
    second = accelerator.save_state(async_save=True)  # waits for the first
    assert os.path.isdir(first)
    accelerator.wait_for_checkpoint()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [os.path.basename(second)]  # total_limit, once complete
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(second)
    assert torch.equal(model.weight, saved["weight"] + 1.0)
    with pytest.raises(ValueError, match="layout"):
        accelerator.save_state(str(tmp_path / "x"), layout="accelerate", async_save=True)
    accelerator.end_training()


def _slow(fn):
    def slow(*args, **kwargs):
        time.sleep(0.3)
        return fn(*args, **kwargs)

    return slow


def test_the_restart_rule(tmp_path, monkeypatch):
    ckpt = tmp_path / "a.ckpt"
    ckpt.write_bytes(b"x")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    write_last_pointer(str(tmp_path), str(ckpt), 3, 0)
    assert restart_checkpoint(str(tmp_path), None) is None  # the first start: ckpt_path as given
    assert restart_checkpoint(str(tmp_path), "init.ckpt") == "init.ckpt"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restart_checkpoint(str(tmp_path), None) == str(ckpt)  # a restart: the newest of this launch
    assert restart_checkpoint(str(tmp_path), "init.ckpt") == str(ckpt)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-2")  # another launch's pointer is not this run's
    assert restart_checkpoint(str(tmp_path), None) is None
    assert restart_checkpoint(str(tmp_path / "empty"), "init.ckpt") == "init.ckpt"  # none recorded yet


def test_deepspeed_refuses_what_it_cannot_write_in_the_background():
    from tasktrain import DeepSpeed

    with pytest.raises(ValueError, match="save_16bit_model"):
        DeepSpeed(stage=2, save_16bit_model=True).check_async_save()
    with pytest.raises(ValueError, match="save_weights_only"):
        DeepSpeed(stage=2).check_async_save(weights_only=True)


def test_async_save_must_be_a_bool():
    with pytest.raises(ValueError, match="async_save"):
        ModelCheckpoint(async_save="yes")


def test_launch_max_restarts_goes_to_the_elastic_agent(tmp_path, monkeypatch, capsys):
    import torch.distributed.run as run

    from tasktrain.cli import main as cli

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    seen = {}
    monkeypatch.setattr(run, "run", lambda args: seen.update(args=args))
    saved = dict(os.environ)  # run_workers sets the workers' variables in this process
    try:
        os.environ.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        assert cli.main(["launch", "--num_processes", "2", "--use_cpu", "--max_restarts", "3", str(script)]) == 0
        assert seen["args"].max_restarts == 3 and seen["args"].rdzv_id not in ("", "none")
        assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert cli.main(["launch", "--num_processes", "2", "--use_cpu", "--max_restarts", "-1", str(script)]) == 2
        assert "--max_restarts -1" in capsys.readouterr().err
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_trainer_max_restarts_errors(tmp_path, monkeypatch):
    from tasktrain.strategies.launcher import check_restarts

    with pytest.raises(ValueError, match="max_restarts"):
        Trainer(max_restarts=-1, logger=False)
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    trainer = Trainer(max_restarts=2, max_steps=1, **quiet(default_root_dir=tmp_path))
    with pytest.raises(ValueError, match="tasktrain launch --num_processes 1 --max_restarts 2"):
        trainer.fit(Linear(), loader())  # one process: nothing of its own to restart
    with pytest.raises(RuntimeError, match="not started by torch's elastic agent"):
        check_restarts(2)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    with pytest.raises(RuntimeError, match="restarts up to 3 times"):
        check_restarts(2)
    check_restarts(3)



def test_writer_gives_up_on_a_dead_rank_after_a_sigterm(tmp_path, monkeypatch):
    """Rank 0's background write waits for the other ranks' parts (wait_for_marks). A rank that died mid-save never
    writes its part, and its launcher SIGTERMs the survivors: once a SIGTERM has come and the checkpoint's files have
    stopped changing, the write ends with an error (not made 'last') instead of waiting until the launcher kills
    the process. Without a SIGTERM it waits; after one, a part still being written keeps the wait going."""
    from tasktrain import checkpoint_io
    from tasktrain.checkpoint_io import CheckpointWriter, mark_done, note_sigterm, wait_for_marks
    monkeypatch.setattr(checkpoint_io, "GIVE_UP_QUIET", 0.5)
    part = tmp_path / "part"
    part.mkdir()
    mark_done(str(part), 0)  # rank 0's part is written; rank 1's never comes
    writer = CheckpointWriter()
    writer.start(lambda: wait_for_marks(str(part), 2), str(part))
    time.sleep(1.0)
    assert writer.in_flight  # no SIGTERM: it waits (a live rank's part may come)
    note_sigterm()  # what the Trainer's SIGTERM handler does
    asked = time.monotonic()
    with pytest.raises(CheckpointError, match=r"given up waiting for ranks \[1\].*not made 'last'"):
        writer.wait()
    assert time.monotonic() - asked < 5
    assert not writer.in_flight
    # after a SIGTERM, a rank still writing its part (files changing) is waited for until its mark comes
    writer.start(lambda: wait_for_marks(str(part), 2), str(part))
    note_sigterm()

    def slow_rank():
        for i in range(6):
            (part / "rank1.bin").write_bytes(b"x" * (i + 1))
            time.sleep(0.3)  # 1.8 s in all: longer than the quiet time, never quiet for it
        mark_done(str(part), 1)
    writing = threading.Thread(target=slow_rank)
    writing.start()
    writer.wait()
    writing.join()
    assert writer.completed == 1
