"""A CheckpointIO of the user's on two real processes (ddp_spawn, gloo on 127.0.0.1), called as Lightning's strategies
call it: every rank loads the checkpoint a fit resumes from; rank 0 alone saves and removes files. In the same run a
precision plugin's step hooks (Lightning's, overridden) on every rank, under DDP's wrapper and its gradient sync. Apart
from the
Lightning comparisons (tests/test_lightning_beside_plugins.py) so that the spawned processes do not import Lightning."""
import json
import os

import pytest
import torch
import torch.distributed as dist

import tasktrain
from tasktrain.demos.boring_classes import BoringModel
from tasktrain.plugins import CheckpointIO, MixedPrecision

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
             accelerator="cpu", limit_train_batches=2, limit_val_batches=1)


class RankRecordingIO(CheckpointIO):
    """Appends each call, with the caller's rank, to a file (the spawned processes' objects do not come back)."""

    def __init__(self, record):
        self.record = record

    def _note(self, *call):
        rank = dist.get_rank() if dist.is_initialized() else 0
        with open(self.record, "a") as f:
            f.write(json.dumps([rank, *call]) + "\n")

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self._note("save", os.path.basename(path))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        self._note("load", os.path.basename(path))
        return torch.load(path, map_location="cpu", weights_only=True)

    def remove_checkpoint(self, path):
        self._note("remove", os.path.basename(path))
        os.remove(path)


class RankRecordingPrecision(MixedPrecision):
    """Lightning's step hooks overridden (each calling super), noting to the same file."""

    def __init__(self, record):
        super().__init__("bf16-mixed", "cpu")
        self.record = record

    _note = RankRecordingIO._note

    def connect(self, model, optimizers, lr_schedulers):
        self._note("connect", type(model).__name__)
        return super().connect(model, optimizers, lr_schedulers)

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        self._note("backward", type(model).__name__)
        super().backward(tensor, model, optimizer, *args, **kwargs)

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        out = super().optimizer_step(optimizer, model, closure, **kwargs)
        # the gradients the step took: DDP's all-reduce made them the same on both ranks (their batches differ)
        self._note("step", repr(sum(float(p.grad.sum()) for p in model.parameters())))
        return out


@pytest.mark.world_size(2)
@pytest.mark.timeout(120)
def test_rank_zero_saves_and_removes_every_rank_loads(tmp_path):
    first = tasktrain.Trainer(max_epochs=1, enable_checkpointing=False, **QUIET)
    first.fit(BoringModel())
    start = str(tmp_path / "start.ckpt")
    first.save_checkpoint(start)
    record = tmp_path / "calls.jsonl"
    checkpoint = tasktrain.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), save_top_k=1, monitor="step",
                                                     mode="max", filename="{step}")
    trainer = tasktrain.Trainer(devices=2, strategy="ddp_spawn", max_epochs=3, callbacks=[checkpoint],
                                plugins=[RankRecordingIO(str(record)), RankRecordingPrecision(str(record))],
                                default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(BoringModel(), ckpt_path=start)
    calls = [tuple(json.loads(line)) for line in record.read_text().splitlines()]
    assert sorted(c for c in calls if c[1] == "load") == [(0, "load", "start.ckpt"), (1, "load", "start.ckpt")]
    # two steps per epoch; epochs 2 and 3 trained after the resume
    assert [c for c in calls if c[1] in ("save", "remove")] == [(0, "save", "step=4.ckpt"), (0, "save", "step=6.ckpt"),
                                                                 (0, "remove", "step=4.ckpt")]
    for rank in (0, 1):  # each rank's precision hooks: 4 batches, each its own step (module the BoringModel itself)
        assert [c[1:] for c in calls if c[0] == rank and c[1] == "connect"] == [("connect", "DistributedDataParallel")]
        assert [c[1:] for c in calls if c[0] == rank and c[1] == "backward"] == [("backward", "BoringModel")] * 4
    steps = [[c[2] for c in calls if c[0] == rank and c[1] == "step"] for rank in (0, 1)]
    assert len(steps[0]) == 4 and steps[0] == steps[1]
    assert os.listdir(tmp_path / "ckpts") == ["step=6.ckpt"]
