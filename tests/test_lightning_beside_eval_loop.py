"""The evaluation loop beside Lightning 2.6 (issue 37; Lightning's own tests: loops/test_evaluation_loop.py).
The same module and callbacks run under both frameworks and what they record is compared exactly:

- the evaluation loaders' samplers get `set_epoch` with Lightning's epoch, `fit_loop.epoch_progress.current.processed`
  (not current_epoch): in a fit at each run (its sanity check, each validation), in validate / test / predict as their
  loaders are set up (a loader without batches too);
- the epoch values logged in an evaluation reach the loggers (log_metrics) after on_<stage>_epoch_end and before
  on_<stage>_end, as Lightning's evaluation loop's on_run_end writes them (a callback's on_validation_end, where
  ModelCheckpoint and EarlyStopping act, finds them written).
Lightning is a test dependency, imported inside the tests only."""
import os
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from helpers import EpochSampler

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.callbacks.base import Logger as OurLogger  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)


class Noted(EpochSampler):
    """An EpochSampler whose set_epoch calls go to one shared list as (tag, epoch)."""

    def __init__(self, n, calls, tag):
        super().__init__(n, calls)
        self.tag = tag

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.calls[-1] = (self.tag, epoch)


def _loader(classes, calls, tag, n=8, batch_sampler=False):
    data = classes.RandomDataset(32, n)
    sampler = Noted(n, calls, tag)
    if batch_sampler:  # (set_epoch reaches the batch sampler's sampler)
        return DataLoader(data, batch_sampler=BatchSampler(sampler, 2, False))
    return DataLoader(data, sampler=sampler, batch_size=2)


def _set_epoch_calls(lib, classes, case, tmp_path):
    calls = []

    def loader(tag, n=8):
        return _loader(classes, calls, tag, n, batch_sampler=case == "batch sampler")

    class Module(classes.BoringModel):
        def on_validation_start(self):
            calls.append(("on_validation_start", self.current_epoch))

        def on_train_epoch_end(self):
            if fail_at_epoch_end and self.current_epoch == 1:
                raise ValueError("stop")

    fail_at_epoch_end = case == "fit failed in on_train_epoch_end"
    kw = dict(QUIET, default_root_dir=tmp_path, limit_train_batches=2, limit_val_batches=1, limit_test_batches=1,
              limit_predict_batches=1)
    if case == "resumed from a save in on_train_epoch_end":
        save = lib.callbacks.ModelCheckpoint(dirpath=tmp_path, save_on_train_epoch_end=True, save_top_k=-1,
                                             filename="{epoch}")
        lib.Trainer(max_epochs=1, callbacks=[save], **kw).fit(Module(), loader("train"), loader("val"))
        calls.append("resumed")
        trainer = lib.Trainer(max_epochs=3, enable_checkpointing=False, **kw)
        trainer.fit(Module(), loader("train"), loader("val"), ckpt_path=os.path.join(tmp_path, "epoch=0.ckpt"))
        return calls
    trainer = lib.Trainer(max_epochs=2, enable_checkpointing=False, **kw)
    try:
        trainer.fit(Module(), loader("train"), loader("val"))
    except ValueError:
        calls.append("failed")
    trainer.validate(Module(), loader("validate"), verbose=False)
    trainer.test(Module(), loader("test"), verbose=False)
    trainer.predict(Module(), loader("predict"))
    # loaders without a batch: no loop runs, but validate / test / predict set their samplers' epoch
    trainer.validate(Module(), loader("empty validate", 0), verbose=False)
    trainer.test(Module(), loader("empty test", 0), verbose=False)
    trainer.predict(Module(), loader("empty predict", 0))
    lib.Trainer(**kw).validate(Module(), loader("a new trainer's validate"), verbose=False)
    return calls


@pytest.mark.parametrize("case", ["sampler", "batch sampler", "resumed from a save in on_train_epoch_end",
                                  "fit failed in on_train_epoch_end"])
def test_evaluation_samplers_get_lightnings_epoch(tmp_path, case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _set_epoch_calls(pl, theirs, case, tmp_path / "lightning")
        got = _set_epoch_calls(tasktrain, ours, case, tmp_path / "tasktrain")
    assert got == expected
    if case == "sampler":  # (Lightning's test_evaluation_loop_sampler_set_epoch_called: sanity check, each epoch)
        val = [epoch for tag, epoch in got if tag == "val"]
        assert val == [0, 0, 1]
        assert ("validate", 2) in got and ("empty test", 2) in got
    if case == "resumed from a save in on_train_epoch_end":  # epochs processed: 1, while current_epoch is still 0
        assert got[got.index("resumed") + 1:][:2] == [("val", 1), ("on_validation_start", 0)]


def _patched_random_sampler_calls(lib, classes, batch_sampler):
    """Lightning's test_evaluation_loop_sampler_set_epoch_called: torch's own RandomSampler with a set_epoch put on
    the instance, in the training and the validation loader (the Trainer reads a rebuild of a training loader like
    this one, on its own order: set_epoch still reaches the sampler of the loader given, as Lightning's)."""
    calls = []

    def loader(tag):
        data = classes.RandomDataset(32, 8)
        sampler = RandomSampler(data)
        sampler.set_epoch = lambda epoch: calls.append((tag, epoch))
        if batch_sampler:
            return DataLoader(data, batch_sampler=BatchSampler(sampler, 2, True))
        return DataLoader(data, sampler=sampler, batch_size=2)

    trainer = lib.Trainer(**QUIET, limit_train_batches=1, limit_val_batches=1, max_epochs=2,
                          enable_checkpointing=False)
    trainer.fit(classes.BoringModel(), loader("train"), loader("val"))
    trainer.validate(classes.BoringModel(), loader("validate"), verbose=False)
    return calls


@pytest.mark.parametrize("batch_sampler", [False, True])
def test_set_epoch_put_on_a_random_sampler_is_called_as_in_lightning(batch_sampler):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _patched_random_sampler_calls(pl, theirs, batch_sampler)
        got = _patched_random_sampler_calls(tasktrain, ours, batch_sampler)
    assert got == expected
    assert got == [("val", 0), ("train", 0), ("val", 0), ("train", 1), ("val", 1), ("validate", 2)]


class _Record:
    def __init__(self, order):
        super().__init__()
        self.order = order

    @property
    def name(self):
        return "record"

    @property
    def version(self):
        return 0

    @property
    def experiment(self):
        return None

    def log_metrics(self, metrics, step=None):
        self.order.append(("log_metrics", step, tuple(sorted(metrics))))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class LitRecord(_Record, pl.loggers.Logger):
    pass


class OurRecord(_Record, OurLogger):
    pass


def _logging_order(lib, classes, logger_class, tmp_path):
    order = []

    def seen(hook, trainer):
        order.append((hook, tuple(sorted(trainer.callback_metrics)), tuple(sorted(trainer.logged_metrics))))

    class Module(classes.BoringModel):
        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            self.log("val_step", out["x"])
            return out

        def on_validation_epoch_end(self):
            seen("module.on_validation_epoch_end", self.trainer)
            self.log("val_end", 1.0)

        def on_validation_end(self):
            seen("module.on_validation_end", self.trainer)

        def test_step(self, batch, batch_idx):
            out = super().test_step(batch, batch_idx)
            self.log("test_step", out["y"])
            return out

        def on_test_epoch_end(self):
            seen("module.on_test_epoch_end", self.trainer)

        def on_test_end(self):
            seen("module.on_test_end", self.trainer)

    class Watch(lib.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            seen("callback.on_validation_epoch_end", trainer)

        def on_validation_end(self, trainer, pl_module):
            seen("callback.on_validation_end", trainer)

    trainer = lib.Trainer(**dict(QUIET, logger=logger_class(order)), default_root_dir=tmp_path, max_epochs=2,
                          limit_train_batches=2, limit_val_batches=2, limit_test_batches=2, num_sanity_val_steps=1,
                          log_every_n_steps=1, enable_checkpointing=False, callbacks=[Watch()])
    module = Module()
    trainer.fit(module)
    order.append("validate")
    trainer.validate(module, verbose=False)
    order.append("test")
    trainer.test(module, verbose=False)
    return order


def test_epoch_values_reach_the_logger_before_on_validation_end_as_in_lightning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _logging_order(pl, theirs, LitRecord, tmp_path / "lightning")
        got = _logging_order(tasktrain, ours, OurRecord, tmp_path / "tasktrain")
    assert got == expected
    # (Lightning's test_log_epoch_metrics_before_on_evaluation_end): each run's epoch values are written after its
    # epoch-end hooks, before its on_<stage>_end (none in the sanity check)
    names = [entry[0] if isinstance(entry, tuple) else entry for entry in got]
    run = ["callback.on_validation_epoch_end", "module.on_validation_epoch_end", "log_metrics",
           "callback.on_validation_end", "module.on_validation_end"]
    sanity = [name for name in run if name != "log_metrics"]
    test = ["module.on_test_epoch_end", "log_metrics", "module.on_test_end"]
    assert names == sanity + run + run + ["validate"] + run + ["test"] + test
