"""When a torchmetrics Metric logged with self.log is reset, beside Lightning 2.6 (issue 37; the yardstick's
core/test_metric_result_integration.py::test_result_collection_reload): after the epoch-end hooks, as Lightning's
results are reset (training: after on_train_epoch_end; an evaluation: after on_validation_end), so those hooks still
read the metric's state; a fit that raised keeps the state the epoch had gathered (nothing resets it), and the resumed
epoch's end reads it. The same module runs under both frameworks; the states each hook sees are compared."""
import os
import warnings
from contextlib import suppress

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("lightning.pytorch")
torchmetrics = pytest.importorskip("torchmetrics")

import tasktrain  # noqa: E402

FRAMEWORKS = {"lightning": pl, "tasktrain": tasktrain}
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)


class Counting(torchmetrics.Metric):
    def __init__(self):
        super().__init__()
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, value):
        self.total += value
        self.count += 1

    def compute(self):
        return self.total / self.count.clamp(min=1)


class Boom(Exception):
    pass


def _module(name, rows, boom_at=None):
    lib = FRAMEWORKS[name]
    base = pl.LightningModule if name == "lightning" else tasktrain.TaskModule

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.train_metric = Counting()
            self.val_metric = Counting()

        def _seen(self, where):
            rows.append((where, int(self.train_metric.count), int(self.val_metric.count)))

        def training_step(self, batch, batch_idx):
            if boom_at is not None and not self.trainer.fit_loop.restarting and batch_idx == boom_at:
                raise Boom
            self.train_metric(batch_idx)
            self.log("train_metric", self.train_metric, on_step=True, on_epoch=True)
            return self.layer(batch).sum()

        def validation_step(self, batch, batch_idx):
            self.val_metric.update(batch_idx)
            self.log("val_metric", self.val_metric)

        def on_train_epoch_start(self):
            self._seen("on_train_epoch_start")

        def on_train_epoch_end(self):
            self._seen("on_train_epoch_end")
            rows.append(("train compute", float(self.train_metric.compute())))

        def on_validation_start(self):
            self._seen("on_validation_start")

        def on_validation_epoch_end(self):
            self._seen("on_validation_epoch_end")

        def on_validation_end(self):
            self._seen("on_validation_end")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return lib, Module()


def _loader():
    return DataLoader(torch.ones(10, 2), batch_size=2)


def _fit(name):
    rows = []
    lib, module = _module(name, rows)
    trainer = lib.Trainer(max_epochs=2, limit_val_batches=3, num_sanity_val_steps=0, enable_checkpointing=False,
                          **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, _loader(), _loader())
    rows.append(("after fit", int(module.train_metric.count), int(module.val_metric.count)))
    return rows


def test_logged_metrics_are_reset_after_the_epoch_end_hooks_as_lightnings():
    theirs, mine = _fit("lightning"), _fit("tasktrain")
    assert mine == theirs
    assert ("on_train_epoch_end", 5, 0) in mine and ("on_validation_end", 5, 3) in mine


def _crash_and_resume(name, tmp_path):
    rows = []
    lib, module = _module(name, rows, boom_at=3)
    folder = str(tmp_path / name)
    kwargs = dict(max_epochs=1, limit_val_batches=0, default_root_dir=folder,
                  callbacks=[lib.callbacks.OnExceptionCheckpoint(folder)], **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with suppress(Boom):
            lib.Trainer(**kwargs).fit(module, _loader())
        rows.append(("after the crash", int(module.train_metric.count)))
        lib.Trainer(**kwargs).fit(module, _loader(), ckpt_path=os.path.join(folder, "on_exception.ckpt"))
    return rows


def test_a_resumed_epoch_end_reads_the_state_the_crashed_run_left(tmp_path):
    theirs, mine = _crash_and_resume("lightning", tmp_path), _crash_and_resume("tasktrain", tmp_path)
    assert mine == theirs
    assert ("train compute", 2.0) in mine  # batches 0..2 of the crashed run, 3 and 4 of the resumed one
