"""The basics a renamed Lightning script or test leans on, beside Lightning itself: tasktrain.demos.boring_classes
(the same seed gives the same data, module and, after the same fit, the same weights), seed_everything and
isolate_rng, the Trainer's notes on its arguments, loaders without a length, Lightning's module paths."""
import inspect
import logging
import os
import random
import warnings

import numpy as np
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _fit(lib, classes, model_name, datamodule=False, **kwargs):
    lib.seed_everything(7, verbose=False)
    model = getattr(classes, model_name)()
    args = dict(max_epochs=2, limit_train_batches=5, limit_val_batches=3, **QUIET)
    args.update(kwargs)
    trainer = lib.Trainer(**args)
    if model_name == "DemoModel":  # (it has no loaders of its own)
        trainer.fit(model, torch.utils.data.DataLoader(classes.RandomDataset(32, 64), batch_size=2))
    elif datamodule:
        trainer.fit(model, datamodule=classes.BoringDataModule())
    else:
        trainer.fit(model)
    return model, trainer


@pytest.mark.parametrize("model_name,datamodule", [("BoringModel", False), ("BoringModel", True),
                                                   ("ManualOptimBoringModel", False), ("DemoModel", False)])
def test_a_boring_fit_ends_on_lightnings_weights(model_name, datamodule):
    mine, trainer = _fit(tasktrain, ours, model_name, datamodule)
    reference, lightning_trainer = _fit(pl, theirs, model_name, datamodule)
    assert trainer.global_step == lightning_trainer.global_step > 0
    for (name, a), (_, b) in zip(mine.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    if model_name == "BoringModel":  # StepLR(step_size=1) stepped once per epoch, as Lightning's
        assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.1 ** 2)


def test_the_datasets_draw_lightnings_numbers():
    for name, args in (("RandomDataset", (32, 8)), ("RandomDictDataset", (4, 3))):
        torch.manual_seed(3)
        a = getattr(ours, name)(*args)
        torch.manual_seed(3)
        b = getattr(theirs, name)(*args)
        assert len(a) == len(b) == args[1]
        for i in range(len(a)):
            x, y = a[i], b[i]
            if isinstance(x, dict):
                assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
            else:
                assert torch.equal(x, y)
    for name in ("RandomIterableDataset", "RandomIterableDatasetWithLen"):
        torch.manual_seed(3)
        a = list(getattr(ours, name)(4, 5))
        torch.manual_seed(3)
        b = list(getattr(theirs, name)(4, 5))
        assert len(a) == 5 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(ours.RandomIterableDatasetWithLen(4, 5)) == 5
    assert not hasattr(ours.RandomIterableDataset(4, 5), "__len__")
    torch.manual_seed(0)
    net_a = ours.Net()
    torch.manual_seed(0)
    net_b = theirs.Net()
    x = torch.randn(2, 1, 28, 28)
    net_a.eval(), net_b.eval()
    torch.testing.assert_close(net_a(x), net_b(x))


def test_the_iterable_boring_datamodule_is_lightnings():
    """IterableBoringDataModule: per stage two loaders (a RandomDataset's, a RandomIterableDataset's) of 4-value
    vectors, 16 / 32 / 64 / 128 of them; the same draws under both for the same seed."""
    seen = []
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        lib.seed_everything(0, verbose=False)
        dm = classes.IterableBoringDataModule()
        loaders = {}
        for stage, name in (("fit", "train"), ("validate", "val"), ("test", "test"), ("predict", "predict")):
            dm.setup(stage)
            loaders[name] = [(type(dl.dataset).__name__, torch.cat(list(dl))) for dl in
                             getattr(dm, f"{name}_dataloader")()]
        seen.append(loaders)
    ours_loaders, their_loaders = seen
    assert ours_loaders.keys() == their_loaders.keys()
    for name in ours_loaders:
        assert [kind for kind, _ in ours_loaders[name]] == [kind for kind, _ in their_loaders[name]]
        for (_, a), (_, b) in zip(ours_loaders[name], their_loaders[name]):
            torch.testing.assert_close(a, b)
    assert [(kind, tuple(x.shape)) for kind, x in ours_loaders["train"]] == [("RandomDataset", (16, 4)),
                                                                              ("RandomIterableDataset", (16, 4))]


def test_the_no_length_datamodule_trains_by_max_steps():
    tasktrain.seed_everything(0, verbose=False)
    trainer = tasktrain.Trainer(max_steps=4, limit_val_batches=2, **QUIET)
    trainer.fit(ours.BoringModel(), datamodule=ours.BoringDataModuleNoLen())
    assert trainer.global_step == 4 and trainer.num_training_batches in (None, float("inf"))


def test_a_finite_iterable_dataset_trains_max_epochs_as_under_lightning():
    """A loader without a length (RandomIterableDataset) ends each epoch where it runs out, as Lightning's: max_epochs
    passes of it, no max_steps needed."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        lib.seed_everything(1, verbose=False)
        model = classes.BoringModel()
        trainer = lib.Trainer(max_epochs=3, limit_val_batches=0, **QUIET)
        trainer.fit(model, torch.utils.data.DataLoader(classes.RandomIterableDataset(32, 10), batch_size=4))
        seen[lib.__name__] = (trainer.global_step, trainer.current_epoch, model.layer.weight.detach().clone())
    (steps, epochs, weight), (l_steps, l_epochs, l_weight) = seen.values()
    assert (steps, epochs) == (l_steps, l_epochs) == (9, 3)
    torch.testing.assert_close(weight, l_weight)


def _validations_over_a_stream(lib, classes, batches, stop_at=None, **kwargs):
    """When a fit over a loader without a length validates (the global step at each on_validation_start), and its
    epoch scheduler's lr at the end (BoringModel's StepLR steps at each epoch's end)."""
    seen = []

    class Model(classes.BoringModel):
        def on_validation_start(self):
            seen.append(self.trainer.global_step)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx == stop_at:
                self.trainer.should_stop = True

    model = Model()
    trainer = lib.Trainer(num_sanity_val_steps=0, limit_val_batches=1, **QUIET, **kwargs)
    trainer.fit(model, torch.utils.data.DataLoader(classes.RandomIterableDataset(32, 2 * batches), batch_size=2),
                model.val_dataloader())
    return seen, trainer.global_step, trainer.current_epoch, trainer.optimizers[0].param_groups[0]["lr"]


@pytest.mark.parametrize("case, validated_at", [
    (dict(batches=10, max_steps=3), []), (dict(batches=10, max_steps=5, val_check_interval=2), [2, 4]),
    (dict(batches=8, max_epochs=1, val_check_interval=2), [2, 4, 6, 8]), (dict(batches=8, max_epochs=2, stop_at=2), [3]),
    (dict(batches=0, max_epochs=2), [])])
def test_a_loader_without_a_length_validates_at_its_end_only_where_it_ran_out_as_lightning(case, validated_at):
    """The epoch of a loader without a length ends with a validation (and its epoch schedulers step) only where the
    loader ran out, not where max_steps or a stop request cut it; with a val_check_interval of batches, only at its
    multiples, once (tasktrain validated at such a cut, and twice where a multiple or a stop request was the end)."""
    ours_seen = _validations_over_a_stream(tasktrain, ours, **case)
    assert ours_seen == _validations_over_a_stream(pl, theirs, **case)
    assert ours_seen[0] == validated_at


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _logged(logger_name, fn):
    """INFO messages of `logger_name` while fn runs, whatever earlier tests of this process did to the loggers'
    levels or to the ranks Lightning's and tasktrain's rank_zero_only believe they are on."""
    from lightning_utilities.core.rank_zero import rank_zero_only as lightning_rank_zero_only

    from tasktrain.utilities import rank_zero_only

    handler, logger = _Records(), logging.getLogger(logger_name)
    saved = (logger.level, logger.disabled, getattr(lightning_rank_zero_only, "rank", None), rank_zero_only.rank)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    lightning_rank_zero_only.rank = rank_zero_only.rank = 0
    logger.addHandler(handler)
    try:
        fn()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.disabled = saved[1]
        if saved[2] is not None:
            lightning_rank_zero_only.rank = saved[2]
        rank_zero_only.rank = saved[3]
    return handler.messages


def test_seed_everything_and_isolate_rng_as_lightnings(monkeypatch):
    from lightning.fabric.utilities.seed import seed_everything as theirs_seed
    from lightning.pytorch.utilities.seed import isolate_rng as theirs_isolate

    from tasktrain.utilities.seed import isolate_rng, reset_seed

    assert [(p.name, p.default) for p in inspect.signature(tasktrain.seed_everything).parameters.values()] == \
        [(p.name, p.default) for p in inspect.signature(theirs_seed).parameters.values()]
    monkeypatch.delenv("RANK", raising=False)
    mine = _logged("tasktrain", lambda: tasktrain.seed_everything(5))
    lightning = _logged("lightning.fabric", lambda: theirs_seed(5))
    assert mine == lightning == ["Seed set to 5"]
    for bad in (-1, 2**32):
        with pytest.raises(ValueError) as error:
            tasktrain.seed_everything(bad)
        with pytest.raises(ValueError) as lightning_error:
            theirs_seed(bad)
        assert str(error.value) == str(lightning_error.value)
    for var in ("TASKTRAIN_GLOBAL_SEED", "PL_GLOBAL_SEED"):
        monkeypatch.delenv(var, raising=False)
    with pytest.warns(UserWarning, match="No seed found, seed set to 0"):
        assert tasktrain.seed_everything() == 0
    monkeypatch.setenv("TASKTRAIN_GLOBAL_SEED", "9")
    assert tasktrain.seed_everything(verbose=False) == 9
    draws = torch.rand(2)
    torch.rand(5)
    reset_seed()  # seeds again with 9
    assert torch.equal(torch.rand(2), draws)
    for isolate in (isolate_rng, theirs_isolate):
        tasktrain.seed_everything(3, verbose=False)
        with isolate():
            torch.rand(3), np.random.rand(3), random.random()
        assert (torch.rand(1).item(), np.random.rand(), random.random()) == \
            (tasktrain.seed_everything(3, verbose=False) and (torch.rand(1).item(), np.random.rand(), random.random()))


def test_isolate_rng_leaves_the_states_where_a_raising_block_left_them_as_lightnings():
    """Lightning's isolate_rng puts the states back after its `yield` only: a block that raises leaves torch's,
    numpy's and python's generators where it left them; so does tasktrain's (and the exception goes through). So
    after a fit whose sanity check raised."""
    from lightning.pytorch.utilities.seed import isolate_rng as theirs_isolate

    from tasktrain.utilities.seed import isolate_rng

    seen = []
    for isolate in (isolate_rng, theirs_isolate):
        tasktrain.seed_everything(3, verbose=False)
        with pytest.raises(KeyboardInterrupt):
            with isolate():
                torch.rand(3), np.random.rand(3), random.random()
                raise KeyboardInterrupt
        seen.append((torch.rand(1).item(), np.random.rand(), random.random()))
    tasktrain.seed_everything(3, verbose=False)
    torch.rand(3), np.random.rand(3), random.random()
    assert seen[0] == seen[1] == (torch.rand(1).item(), np.random.rand(), random.random())
    # the fit's sanity check runs under it: a validation_step that fails there, the error caught around fit, the
    # generators are where the check left them (the fit is interrupted, as under Lightning)
    after = []
    for lib, boring in ((tasktrain, ours), (pl, theirs)):
        class Fails(boring.BoringModel):
            def validation_step(self, batch, batch_idx):
                torch.rand(5)
                raise RuntimeError("validation failed")

        lib.seed_everything(1, verbose=False)
        model = Fails()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(max_steps=1, num_sanity_val_steps=1, logger=False, enable_progress_bar=False,
                                  enable_model_summary=False, enable_checkpointing=False)
            with pytest.raises(RuntimeError, match="validation failed"):
                trainer.fit(model)
        after.append((str(trainer.state.status), torch.rand(1).item()))
    assert after[0] == after[1] and after[0][0].endswith("INTERRUPTED")


def test_seed_everything_workers_seeds_each_worker_and_rank_apart(monkeypatch):
    from tasktrain.trainer.seed import add_worker_init_fn, worker_init_function

    loader = torch.utils.data.DataLoader(range(4), num_workers=2)
    tasktrain.seed_everything(1, verbose=False)  # workers=False: the loader is left alone
    add_worker_init_fn(loader, rank=0)
    assert loader.worker_init_fn is None
    tasktrain.seed_everything(1, workers=True, verbose=False)
    add_worker_init_fn(loader, rank=1)
    assert loader.worker_init_fn.func is worker_init_function and loader.worker_init_fn.keywords == {"rank": 1}
    seen = set()
    for rank in (0, 1):
        for worker in (0, 1):
            torch.manual_seed(1000 + worker)  # what torch gives a worker: base seed + worker id
            worker_init_function(worker, rank=rank)
            seen.add((np.random.randint(1 << 30), random.random(), torch.rand(1).item()))
    assert len(seen) == 4
    tasktrain.seed_everything(1, verbose=False)


@pytest.mark.parametrize("argument", ["limit_train_batches", "limit_val_batches", "limit_test_batches",
                                      "limit_predict_batches", "overfit_batches", "val_check_interval"])
@pytest.mark.parametrize("value", [1, 1.0])
def test_the_trainer_notes_what_one_and_one_point_zero_mean(monkeypatch, argument, value):
    monkeypatch.delenv("RANK", raising=False)
    kwargs = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    mine = _logged("tasktrain", lambda: tasktrain.Trainer(**{argument: value}, **kwargs))
    lightning = _logged("lightning.pytorch", lambda: pl.Trainer(**{argument: value}, **kwargs))
    # (Lightning doubles a period; its litlogger advertisement is not repeated: docs/lightning.md)
    lightning = [m.replace("..", ".") for m in lightning if "litlogger" not in m]
    assert mine == lightning and len(mine) == 3 and "was configured" in mine[-1]  # (after the device lines)
    mine = _logged("tasktrain", lambda: tasktrain.Trainer(fast_dev_run=3, **kwargs))
    lightning = _logged("lightning.pytorch", lambda: pl.Trainer(fast_dev_run=3, **kwargs))
    assert mine == [m for m in lightning if "litlogger" not in m] and "fast_dev_run" in mine[-1]
    with pytest.raises(tasktrain.exceptions.MisconfigurationException,
                       match="You have passed invalid value 1.5 for limit_val_batches, it has to be in"):
        tasktrain.Trainer(limit_val_batches=1.5)


def test_lightnings_module_paths():
    from tasktrain.callbacks.callback import Callback
    from tasktrain.callbacks.model_checkpoint import ModelCheckpoint
    from tasktrain.callbacks.rich_model_summary import RichModelSummary
    from tasktrain.utilities.model_helpers import is_overridden
    from tasktrain.utilities.warnings import PossibleUserWarning

    assert Callback is tasktrain.Callback and ModelCheckpoint is tasktrain.ModelCheckpoint
    assert RichModelSummary is tasktrain.callbacks.RichModelSummary and is_overridden is tasktrain.utilities.is_overridden
    assert issubclass(PossibleUserWarning, UserWarning)
    assert tasktrain.demos.boring_classes.BoringModel is ours.BoringModel


def test_max_epochs_unset_is_lightnings_at_fit():
    from tasktrain.utilities.warnings import PossibleUserWarning

    kwargs = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                  limit_train_batches=1, limit_val_batches=0)
    trainer = tasktrain.Trainer(max_time={"seconds": 0.5}, **kwargs)
    trainer.fit(ours.BoringModel())
    assert trainer.max_epochs == -1 and trainer.current_epoch > 1  # the Timer ended it, not 1000 epochs
    trainer = tasktrain.Trainer(max_steps=-1, **kwargs)
    with pytest.warns(PossibleUserWarning, match="`max_epochs` was not set. Setting it to 1000 epochs"):
        trainer.fit(ours.BoringModel(), torch.utils.data.DataLoader(ours.RandomDataset(32, 1)))
    assert trainer.max_epochs == 1000 and trainer.current_epoch == 1000


@pytest.mark.parametrize("every,interval", [(1, "00:00:00:03"), (2, {"seconds": 2}), (None, "00:00:00:03")])
def test_val_check_interval_as_a_time_validates_where_lightning_does(monkeypatch, every, interval):
    """A fake clock both frameworks read (time.monotonic), moved 1 s by each training batch: the validations land
    after the same batches."""
    clock = [0.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        steps = []

        class Tick(lib.Callback):
            def on_train_batch_end(self, trainer, *args):
                clock[0] += 1.0

            def on_validation_end(self, trainer, module):
                if not trainer.sanity_checking:
                    steps.append(trainer.global_step)

        lib.seed_everything(0, verbose=False)
        trainer = lib.Trainer(max_epochs=4, limit_train_batches=4, limit_val_batches=1, val_check_interval=interval,
                              check_val_every_n_epoch=every, callbacks=[Tick()], num_sanity_val_steps=0, **QUIET)
        trainer.fit(classes.BoringModel())
        seen[lib.__name__] = steps
    assert seen["tasktrain"] == seen["lightning.pytorch"] and seen["tasktrain"], seen


def test_lightnings_validation_schedule_refusals():
    from tasktrain.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="should be an integer or a time-based duration"):
        tasktrain.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
    with pytest.raises(MisconfigurationException, match="Invalid time format for `val_check_interval`: '1:2'"):
        tasktrain.Trainer(val_check_interval="1:2")
    trainer = tasktrain.Trainer(limit_train_batches=4, val_check_interval=10, **QUIET)
    with pytest.raises(ValueError, match=r"`val_check_interval` \(10\) must be less than or equal to the number of"):
        trainer.fit(ours.BoringModel())
    trainer = tasktrain.Trainer(max_steps=3, val_check_interval=0.5, **QUIET)
    with pytest.raises(MisconfigurationException, match="When using an IterableDataset for `train_dataloader`"):
        trainer.fit(ours.BoringModel(), torch.utils.data.DataLoader(ours.RandomIterableDataset(32, 8)))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_training_step_returning_none_skips_the_batch_as_lightning(monkeypatch, accumulate):
    from tasktrain.trainer import loop

    monkeypatch.setitem(loop._warned_once, "skip", False)  # (said once per process, as Lightning's)
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Skips(classes.BoringModel):
            calls = []

            def training_step(self, batch, batch_idx):
                return None if batch_idx % 3 == 1 else super().training_step(batch, batch_idx)

            def on_before_optimizer_step(self, optimizer):  # called for every step, a skipped one's too
                self.calls.append(("before_step", self.trainer.global_step, self.layer.weight.grad is None))

            def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                self.calls.append(("clip", gradient_clip_val))
                self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

        lib.seed_everything(3, verbose=False)
        model = Skips()
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=6, limit_val_batches=0, gradient_clip_val=0.05,
                              accumulate_grad_batches=accumulate, **QUIET)
        if lib is tasktrain:
            with pytest.warns(UserWarning, match="`training_step` returned `None`. If this was on purpose"):
                trainer.fit(model)
        else:
            trainer.fit(model)
        seen[lib.__name__] = (trainer.global_step, model.layer.weight.detach().clone(), model.calls)
    (steps, weight, calls), (l_steps, l_weight, l_calls) = seen.values()
    assert steps == l_steps == 6 // accumulate
    torch.testing.assert_close(weight, l_weight)
    assert calls == l_calls and len(calls) == 2 * steps
    assert accumulate == 2 or ("before_step", 1, True) in calls  # (batch 1 skipped: a step on no gradients)


def _precision(name):
    """fp16 AMP on a CPU is Lightning's MixedPrecision plugin (precision="16-mixed" there runs bf16-mixed)."""
    from tasktrain.plugins import MixedPrecision

    return dict(plugins=[MixedPrecision(name, "cpu")]) if name == "16-mixed" else dict(precision=name)


def test_a_skipped_step_under_fp16_leaves_the_scaler_for_the_next_one(monkeypatch):
    """16-mixed (GradScaler): a step whose training_step returned None has no gradients to unscale; the next step's
    gradients are unscaled before on_before_optimizer_step sees them, as under 32-true."""
    from tasktrain.trainer import loop

    monkeypatch.setitem(loop._warned_once, "skip", True)
    norms = {}
    for precision in ("32-true", "16-mixed"):
        class Skips(ours.BoringModel):
            seen = []

            def training_step(self, batch, batch_idx):  # (small: the scaled fp16 gradients stay finite)
                return None if batch_idx == 1 else {"loss": super().training_step(batch, batch_idx)["loss"] * 1e-4}

            def on_before_optimizer_step(self, optimizer):
                grad = self.layer.weight.grad
                self.seen.append(None if grad is None else float(grad.norm()))

        tasktrain.seed_everything(3, verbose=False)
        model = Skips()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (fp16 on a CPU: tasktrain warns that it is slow)
            tasktrain.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, **_precision(precision),
                              **QUIET).fit(model)
        norms[precision] = model.seen
    assert norms["32-true"][1] is None and norms["16-mixed"][1] is None
    for full, half in zip(norms["32-true"][2:], norms["16-mixed"][2:]):
        assert half == pytest.approx(full, rel=2e-2)  # (scaled gradients would be 65536 times larger)


def test_manual_optimization_under_fp16_shows_unscaled_gradients_to_the_hook():
    norms = {}
    for precision in ("32-true", "16-mixed"):
        class Manual(ours.BoringModel):
            seen = []

            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(self.step(batch) * 1e-4)  # (small: the scaled fp16 gradients stay finite)
                opt.step()

            def on_before_optimizer_step(self, optimizer):
                self.seen.append(float(self.layer.weight.grad.norm()))

        tasktrain.seed_everything(3, verbose=False)
        model = Manual()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (fp16 on a CPU: tasktrain warns that it is slow)
            tasktrain.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, **_precision(precision),
                              **QUIET).fit(model)
        norms[precision] = model.seen
    assert len(norms["16-mixed"]) == 3
    assert norms["16-mixed"] == pytest.approx(norms["32-true"], rel=2e-2)


def test_a_resumed_fit_runs_the_sanity_check_as_lightning(tmp_path):
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        sanity = []

        class Sanity(lib.Callback):
            def on_sanity_check_start(self, trainer, module):
                sanity.append(trainer.global_step)

        kwargs = dict(QUIET, enable_checkpointing=True, limit_train_batches=2, limit_val_batches=2,
                      default_root_dir=str(tmp_path / lib.__name__))
        first = lib.Trainer(max_epochs=1, callbacks=[Sanity()], **kwargs)
        first.fit(classes.BoringModel())
        path = first.checkpoint_callback.best_model_path
        lib.Trainer(max_epochs=2, callbacks=[Sanity()], **kwargs).fit(classes.BoringModel(), ckpt_path=path)
        seen[lib.__name__] = len(sanity)
    assert seen["tasktrain"] == seen["lightning.pytorch"] == 2


@pytest.mark.parametrize("stop_at, every", [(2, 1), (2, 2), (4, 1)])
def test_a_stop_request_inside_an_epoch_validates_once_more_as_lightning(stop_at, every):
    """should_stop set in on_train_batch_end inside an epoch: Lightning validates after that batch (its ModelCheckpoint
    and EarlyStopping see the last weights), in the epochs check_val_every_n_epoch names; at the epoch's last batch
    the epoch-end validation is that one."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        events = []

        class StopAt(lib.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if trainer.global_step == stop_at + 4:  # in the second epoch
                    trainer.should_stop = True

            def on_validation_end(self, trainer, module):
                events.append(("val", trainer.global_step, trainer.current_epoch))

            def on_train_epoch_end(self, trainer, module):
                events.append(("epoch_end", trainer.global_step, trainer.current_epoch))

        lib.seed_everything(0, verbose=False)
        trainer = lib.Trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=1, num_sanity_val_steps=0,
                              check_val_every_n_epoch=every, callbacks=[StopAt()], **QUIET)
        trainer.fit(classes.BoringModel())
        seen[lib.__name__] = events, trainer.global_step, trainer.current_epoch
    assert seen["tasktrain"] == seen["lightning.pytorch"], seen


def _hook_calls(lib, classes):
    """What a module and a DataModule see of the hooks Lightning calls with its own arguments: the base's validation
    and test steps (super()), configure_gradient_clipping's arguments, and which transfer hook runs when the
    DataModule's is only wrapped around its base (a recording wrapper: functools.update_wrapper over a partial)."""
    import functools

    calls = []
    base = lib.LightningModule if lib is pl else tasktrain.TaskModule

    class Net(classes.BoringModel):
        def validation_step(self, batch, batch_idx):
            calls.append(("validation_step", base.validation_step(self, batch, batch_idx)))

        def test_step(self, batch, batch_idx):
            calls.append(("test_step", base.test_step(self, batch, batch_idx)))

        def configure_gradient_clipping(self, optimizer, *args, **kwargs):
            calls.append(("clip", len(args), kwargs))
            super().configure_gradient_clipping(optimizer, *args, **kwargs)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            calls.append(("module transfer", dataloader_idx))
            return batch

    class Data(classes.BoringDataModule):
        def __init__(self):
            super().__init__()
            hook = self.on_before_batch_transfer
            wrapper = functools.partial(lambda fn, *a: calls.append(("datamodule transfer",)) or fn(*a), hook)
            self.on_before_batch_transfer = functools.update_wrapper(wrapper, hook)

    trainer = lib.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, limit_test_batches=1,
                          num_sanity_val_steps=0, gradient_clip_val=0.5, **QUIET)
    data = Data()
    trainer.fit(Net(), datamodule=data)
    trainer.test(trainer.lightning_module, datamodule=data, verbose=False)
    return calls


def test_the_hooks_get_lightnings_arguments_and_the_base_steps():
    ours_calls, theirs_calls = _hook_calls(tasktrain, ours), _hook_calls(pl, theirs)
    assert ours_calls == theirs_calls
    assert ("validation_step", None) in ours_calls and ("test_step", None) in ours_calls
    assert ("clip", 0, {"gradient_clip_val": 0.5, "gradient_clip_algorithm": None}) in ours_calls
    assert ("module transfer", 0) in ours_calls and ("datamodule transfer",) not in ours_calls


def _plateau_lrs(lib, classes, patch=False):
    lrs, calls = [], []

    class Net(classes.BoringModel):
        def on_train_epoch_start(self):
            lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

        def on_train_epoch_end(self):  # the watched value exists only once the epoch's hooks ran
            self.log("epoch_value", 1.0)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "epoch_value"}}

    trainer = lib.Trainer(max_epochs=4, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0, **QUIET)
    if patch:  # Lightning's tests wrap it (test_model_checkpoint.mock_training_epoch_loop): the scheduler steps with
        # what the patch returns, here an improving value, so the plateau never cuts the rate
        read = trainer.fit_loop.epoch_loop._get_monitor_value

        def improving(key):
            calls.append((trainer.current_epoch, key, float(read(key))))
            return torch.tensor(1.0 - trainer.current_epoch)

        trainer.fit_loop.epoch_loop._get_monitor_value = improving
    trainer.fit(Net())
    if patch:
        return lrs, calls, trainer.fit_loop.epoch_loop.val_loop._max_batches
    return lrs


def test_a_plateau_scheduler_watches_a_value_logged_in_on_train_epoch_end():
    # Lightning steps the metric-watching epoch schedulers after on_train_epoch_end (its fit loop's epoch end)
    ours_lrs, theirs_lrs = _plateau_lrs(tasktrain, ours), _plateau_lrs(pl, theirs)
    assert ours_lrs == theirs_lrs == [1.0, 1.0, 0.5, 0.25]


def test_a_patched_get_monitor_value_is_what_the_plateau_scheduler_steps_with():
    ours_lrs, ours_calls, ours_max = _plateau_lrs(tasktrain, ours, patch=True)
    theirs_lrs, theirs_calls, theirs_max = _plateau_lrs(pl, theirs, patch=True)
    assert ours_lrs == theirs_lrs == [1.0] * 4
    assert ours_calls == theirs_calls == [(epoch, "epoch_value", 1.0) for epoch in range(4)]
    assert ours_max == theirs_max == [1]  # (val_loop._max_batches: the read view Lightning's tests use)


def _dropout_fit(lib, classes, ckpt_path=None, **kwargs):
    class DropoutModel(classes.BoringModel):
        def __init__(self):
            super().__init__()
            self.dropout = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.layer(self.dropout(x))

    lib.seed_everything(0, verbose=False)
    model = DropoutModel()
    args = dict(max_epochs=3, limit_train_batches=4, limit_val_batches=2, **QUIET)
    args.update(kwargs)
    lib.Trainer(**args).fit(model, ckpt_path=ckpt_path)
    return model, torch.rand(1)


@pytest.mark.parametrize("kwargs", [{}, {"limit_val_batches": 0}, {"reload_dataloaders_every_n_epochs": 1}],
                         ids=["validation", "no-validation", "reload"])
def test_dropout_draws_lightnings_numbers_in_every_epoch(kwargs):
    """Each iter() of a DataLoader without a generator draws its base seed from torch's global generator: Lightning
    iterates the training loader once per epoch (twice when it reloads it), the validation loader once per
    validation. The Trainer's own order has a generator, so the loop draws that seed itself: dropout from the
    second epoch on, and any draw after fit, are Lightning's (issue 37)."""
    mine, after_mine = _dropout_fit(tasktrain, ours, **kwargs)
    reference, after_reference = _dropout_fit(pl, theirs, **kwargs)
    for (name, a), (_, b) in zip(mine.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    torch.testing.assert_close(after_mine, after_reference)


@pytest.mark.parametrize("stop_at", [4, 6], ids=["epoch-end", "mid-epoch"])
def test_a_resumed_dropout_fit_draws_as_the_uninterrupted_one(tmp_path, stop_at):
    """The loop's draw of the training loader's base seed is made where a pass starts at the epoch's first batch:
    a fit resumed mid-epoch gets the generator's state from after it and makes none, so the resumed fit ends on the
    uninterrupted one's weights and generator, whether it stopped at an epoch's end (4 batches) or inside one."""
    class Stop(tasktrain.Callback):
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.should_stop or trainer.global_step == stop_at

    def fit(folder, callbacks=(), ckpt_path=None):
        save = tasktrain.callbacks.ModelCheckpoint(dirpath=tmp_path / folder, save_last=True, every_n_train_steps=1,
                                                   save_top_k=0)
        return _dropout_fit(tasktrain, ours, enable_checkpointing=True, callbacks=[save, *callbacks],
                            ckpt_path=ckpt_path)

    weights, after = fit("whole")
    fit("stopped", [Stop()])
    resumed, resumed_after = fit("resumed", ckpt_path=str(tmp_path / "stopped" / "last.ckpt"))
    torch.testing.assert_close(resumed.layer.weight, weights.layer.weight, rtol=0, atol=0)
    torch.testing.assert_close(resumed_after, after, rtol=0, atol=0)


def test_a_shuffling_loader_leaves_the_generator_where_lightning_does():
    """On one process Lightning keeps a shuffling loader's RandomSampler, which draws its seed from the global
    generator at each epoch's first batch; the loop makes that draw and takes the epoch's order from it (the batches
    themselves: tests/test_lightning_beside_order.py): what is drawn after fit is Lightning's."""
    def fit(lib, classes):
        class Shuffled(classes.BoringModel):
            def train_dataloader(self):
                return torch.utils.data.DataLoader(classes.RandomDataset(32, 64), batch_size=2, shuffle=True)

        lib.seed_everything(0, verbose=False)
        lib.Trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=2, **QUIET).fit(Shuffled())
        return torch.rand(1)

    torch.testing.assert_close(fit(tasktrain, ours), fit(pl, theirs))


def test_setup_and_teardown_get_the_stage_as_lightnings_trainer_fn():
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        calls = []

        class Stages(classes.BoringModel):
            def setup(self, stage):
                calls.append(("setup", type(stage).__name__, stage == "validate", stage.value))

            def teardown(self, stage):
                calls.append(("teardown", type(stage).__name__, stage == "validate", stage.value))

        lib.Trainer(limit_val_batches=1, **QUIET).validate(Stages())
        seen[lib.__name__] = calls
    ours_calls, theirs_calls = seen.values()
    assert ours_calls == theirs_calls == [("setup", "TrainerFn", True, "validate"),
                                          ("teardown", "TrainerFn", True, "validate")]


def test_loop_limits_read_as_lightnings_before_and_after_fit():
    """max_epochs unset reads None until a fit decides it; min_epochs / min_steps stay None when not given (a fit
    with min_steps sets min_epochs to 1); num_sanity_val_steps=-1 reads inf; the minimum's message is said once."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        limits = []
        for kwargs in (dict(), dict(max_steps=0), dict(max_epochs=3), dict(min_steps=2, num_sanity_val_steps=-1)):
            trainer = lib.Trainer(**kwargs, **QUIET)
            limits.append((trainer.max_epochs, trainer.max_steps, trainer.min_epochs, trainer.min_steps,
                           trainer.num_sanity_val_steps))
        trainer = lib.Trainer(max_steps=3, min_steps=2, limit_val_batches=0, **QUIET)
        trainer.fit(classes.BoringModel())
        limits.append((trainer.max_epochs, trainer.min_epochs, trainer.min_steps))

        class Stops(classes.BoringModel):  # asks to stop at every batch; min_epochs keeps it going
            def training_step(self, batch, batch_idx):
                self.trainer.should_stop = True
                return super().training_step(batch, batch_idx)

        records = []
        handler = logging.Handler()
        handler.emit = records.append  # (each package's logger may not propagate: listen to it directly)
        package_logger = logging.getLogger("tasktrain" if lib is tasktrain else "lightning.pytorch")
        package_logger.addHandler(handler)
        try:
            trainer = lib.Trainer(min_epochs=3, max_epochs=5, limit_train_batches=2, limit_val_batches=0, **QUIET)
            trainer.fit(Stops())
        finally:
            package_logger.removeHandler(handler)
        said = [r.getMessage() for r in records if "has not been met" in r.getMessage()]
        seen[lib.__name__] = limits, trainer.current_epoch, said
        for name, infinite in (("max_steps", " \\(infinite steps\\)"), ("max_epochs", "")):
            with pytest.raises(Exception, match=rf"`{name}` must be a non-negative integer or -1{infinite}. You passed "
                                                r"in -2") as refused:
                lib.Trainer(**{name: -2})
            assert type(refused.value).__name__ == "MisconfigurationException"
    # (Lightning's message goes through rank_zero_info, whose rank and level earlier tests in the process may have
    # changed: its count is checked on ours, against Lightning's once-per-Trainer warning cache)
    assert seen["tasktrain"][:2] == seen["lightning.pytorch"][:2]
    limits, epochs, said = seen["tasktrain"]
    assert limits[:4] == [(None, -1, None, None, 2), (None, 0, None, None, 2), (3, -1, None, None, 2),
                          (None, -1, None, 2, float("inf"))]
    assert limits[4] == (-1, 1, 2) and epochs == 3 and len(said) == 1 and "`min_epochs=3` or `min_steps=None`" in said[0]


def test_trainer_ckpt_path_is_what_each_run_loaded_and_can_be_set_as_lightning(tmp_path):
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        root = tmp_path / lib.__name__
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, default_root_dir=root,
                              logger=False, enable_progress_bar=False, enable_model_summary=False)
        model = classes.BoringModel()
        trainer.fit(model)
        best = trainer.checkpoint_callback.best_model_path
        paths = [trainer.ckpt_path]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.validate(ckpt_path="best", verbose=False)
            paths.append(trainer.ckpt_path)
            trainer.test(model, verbose=False)  # a module and no path: nothing loaded
            paths.append(trainer.ckpt_path)
            trainer.ckpt_path = best  # every following run loads it
            trainer.test(model, verbose=False)
            paths.append(trainer.ckpt_path)
            trainer.predict(model)
            paths.append(trainer.ckpt_path)
        with pytest.warns(UserWarning, match=r"`trainer.ckpt_path = .*` was called but then you passed "
                                             r"`trainer.fit\(ckpt_path='best'\)`. The latter will be loaded."):
            trainer.validate(model, ckpt_path="best", verbose=False)
        trainer.test(model, verbose=False)  # the setting ended with that run
        paths.append(trainer.ckpt_path)
        seen[lib.__name__] = [p if p is None else os.path.relpath(p, root) for p in paths]
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    name = seen["tasktrain"][1]
    assert name.endswith(".ckpt") and seen["tasktrain"] == [None, name, None, name, name, None]


def test_trainer_model_is_the_wrapper_and_the_eval_hooks_switch_it_as_lightning():
    """trainer.model is what the forward goes through (DDP's wrapper under "ddp"); the default eval hooks switch it,
    the loop gives the module's modes back and leaves the wrapper as the hook left it (Lightning's behaviour)."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Modes(classes.BoringModel):
            seen_modes = []

            def _note(self, where):
                self.seen_modes.append((where, type(self.trainer.model).__name__, self.trainer.model.training,
                                        self.training))

            def on_train_start(self):
                self._note("train_start")

            def on_validation_start(self):
                self._note("validation_start")

            def on_train_batch_start(self, batch, batch_idx):
                self._note("train_batch")

            def on_test_start(self):
                self._note("test_start")

        model = Modes()
        trainer = lib.Trainer(strategy="ddp", accelerator="cpu", devices=1, max_steps=2, limit_val_batches=1,
                              val_check_interval=1, num_sanity_val_steps=1, **QUIET)
        try:
            trainer.fit(model)
            trainer.test(model, verbose=False)
        finally:  # Lightning's world of one outlives its run (ours ends at teardown): not left to later tests
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        with pytest.raises(TypeError, match=r"`Trainer.validate\(\)` requires a `(Task|Lightning)Module` when it "
                                            r"hasn't been passed in a previous run"):
            lib.Trainer(**QUIET).validate()
        with pytest.raises(TypeError, match=r"`model` must be a `(Task|Lightning)Module` or "
                                            r"`torch._dynamo.OptimizedModule`, got `Linear`"):
            lib.Trainer(**QUIET).fit(torch.nn.Linear(1, 1))
        seen[lib.__name__] = Modes.seen_modes
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert ("train_batch", "DistributedDataParallel", False, True) in seen["tasktrain"]  # (the wrapper stays in eval)


def test_the_trainer_state_enums_print_compare_and_hash_as_lightnings():
    from lightning.pytorch.trainer import states as theirs_states
    from tasktrain.trainer import states as our_states

    def facts(states):
        seen = []
        for enum_name in ("TrainerFn", "TrainerStatus", "RunningStage"):
            for member in getattr(states, enum_name):
                other = "FIT" if member.value == "fit" else member.value.upper()
                seen.append((str(member), format(member), f"{member}", "%s" % member, repr(member), member.value,
                             member == member.value, member == other, member != other, member != member.value,
                             hash(member) == hash(member.value), {member.value: 1}.get(member),
                             member in {other.lower()}, getattr(member, "dataloader_prefix", None),
                             getattr(member, "evaluating", None), getattr(member, "stopped", None)))
            enum = getattr(states, enum_name)
            name = next(iter(enum.__members__))
            seen.append((enum.from_str(name.lower()), enum.from_str(enum[name].value.upper(), source="value"),
                         enum.from_str(enum[name].value, source="any")))
            for source in ("key", "value", "any"):
                with pytest.raises(ValueError) as error:
                    enum.from_str("nothing", source=source)
                with pytest.warns(UserWarning) as warned:
                    assert enum.try_from_str("nothing", source=source) is None
                seen.append((str(error.value), str(warned[0].message)))
        seen.append(states.TrainerFn.VALIDATING == states.RunningStage.VALIDATING)
        return seen

    ours_facts, theirs_facts = facts(our_states), facts(theirs_states)
    assert ours_facts == theirs_facts
    assert ("TrainerFn.FITTING", "TrainerFn.FITTING") == ours_facts[0][:2]


def test_trainer_state_stopped_and_finished_after_a_run_as_lightnings():
    seen = []
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        trainer = lib.Trainer(max_steps=1, limit_val_batches=0, **QUIET)
        before = (trainer.state.stopped, trainer.state.finished)
        trainer.fit(classes.BoringModel())
        seen.append((before, trainer.state.stopped, trainer.state.finished, trainer.state.fn.value))
    assert seen[0] == seen[1] == ((False, False), True, True, "fit")


def test_evaluation_grad_modes_are_lightnings(monkeypatch):
    """no_grad for the fit's sanity check and validation (hooks included), inference_mode for validate / test /
    predict, as Lightning."""
    # one process: a gloo group an earlier test left in this process would make Lightning's check choose no_grad
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Modes(classes.BoringModel):
            modes = []

            def _note(self, where):
                self.modes.append((where, torch.is_inference_mode_enabled(), torch.is_grad_enabled()))

            def validation_step(self, batch, batch_idx):
                self._note("validation_step")
                return super().validation_step(batch, batch_idx)

            def on_validation_epoch_end(self):
                self._note("on_validation_epoch_end")

            def on_validation_end(self):
                self._note("on_validation_end")

            def test_step(self, batch, batch_idx):
                self._note("test_step")

            def predict_step(self, batch, batch_idx, dataloader_idx=0):
                self._note("predict_step")

        model = Modes()
        trainer = lib.Trainer(max_steps=1, limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1,
                              num_sanity_val_steps=1, **QUIET)
        trainer.fit(model)
        trainer.validate(model, verbose=False)
        trainer.test(model, verbose=False)
        trainer.predict(model)
        seen[lib.__name__] = Modes.modes
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert seen["tasktrain"][:3] == [("validation_step", False, False), ("on_validation_epoch_end", False, False),
                                     ("on_validation_end", False, False)]
    assert seen["tasktrain"][-1] == ("predict_step", True, False)


def test_trainer_small_rules_as_lightnings(tmp_path):
    """trainer.interrupted, default_root_dir with ~ expanded, gradient_clip_val's type, save_checkpoint before any
    run: Lightning's values, types and words."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        facts = [lib.Trainer(default_root_dir="~/runs/../trainer", **QUIET).default_root_dir]
        with pytest.raises(TypeError, match=r"`gradient_clip_val` should be an int or a float. Got \(1, 2\)."):
            lib.Trainer(gradient_clip_val=(1, 2))
        trainer = lib.Trainer(default_root_dir=tmp_path, **QUIET)
        with pytest.raises(AttributeError, match=r"Saving a checkpoint is only possible if a model is attached to the "
                                                 r"Trainer. Did you call `Trainer.save_checkpoint\(\)` before"):
            trainer.save_checkpoint(tmp_path / "early.ckpt")

        class Fails(classes.BoringModel):
            def training_step(self, batch, batch_idx):
                raise KeyboardInterrupt  # (Lightning's: the run ends, interrupted)

        trainer = lib.Trainer(max_steps=1, **QUIET)
        facts.append(trainer.interrupted)
        try:
            trainer.fit(Fails())
        except (KeyboardInterrupt, SystemExit):
            pass
        facts.append(trainer.interrupted)
        seen[lib.__name__] = facts
    assert seen["tasktrain"] == seen["lightning.pytorch"] == [os.path.expanduser("~/trainer"), False, True]


def test_a_weights_only_save_calls_the_modules_hook_only_as_lightning(tmp_path):
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        calls = []

        class Saves(lib.Callback):
            def on_save_checkpoint(self, trainer, pl_module, checkpoint):
                calls.append(("callback", sorted(checkpoint)))

        class Model(classes.BoringModel):
            def on_save_checkpoint(self, checkpoint):
                calls.append(("module", "optimizer_states" in checkpoint))

        trainer = lib.Trainer(max_steps=1, callbacks=[Saves()], default_root_dir=tmp_path, **QUIET)
        trainer.fit(Model())
        trainer.save_checkpoint(tmp_path / f"{lib.__name__}-weights.ckpt", weights_only=True)
        trainer.save_checkpoint(tmp_path / f"{lib.__name__}-full.ckpt")
        with pytest.raises(TypeError, match=r"`Trainer.save_checkpoint\(..., storage_options=...\)` with "
                                            r"`storage_options` arg is not supported for `TorchCheckpointIO`"):
            trainer.save_checkpoint(tmp_path / "never.ckpt", storage_options={"a": 1})
        seen[lib.__name__] = [c[0] for c in calls], calls[0], calls[-1]
    # (the refused storage_options save still dumps the checkpoint, as Lightning raises from its CheckpointIO)
    assert seen["tasktrain"][0] == seen["lightning.pytorch"][0] == ["module"] + ["callback", "module"] * 2
    assert seen["tasktrain"][1] == ("module", False) and seen["tasktrain"][2] == ("module", True)


@pytest.mark.parametrize("skip", ["none_batches", "fp16_overflow"])
def test_step_schedulers_step_at_every_window_end_counting_the_epochs_batches_as_lightning(skip):
    """frequency counts the epoch's batches (batch_idx + 1, again each epoch), and a window that stepped nothing
    (every training_step returned None, or GradScaler skipped an overflowing step) still steps the scheduler."""
    # (16-mixed on CPU needs no probe: the overflow is made by the loss itself, times GradScaler's scale, on any CPU;
    # the plugin, as precision="16-mixed" on a CPU is bf16-mixed in both)
    import lightning.pytorch.plugins as their_plugins

    import tasktrain.plugins as our_plugins

    seen = {}
    for lib, classes, plugins in ((tasktrain, ours, our_plugins), (pl, theirs, their_plugins)):
        class Sched(classes.BoringModel):
            def training_step(self, batch, batch_idx):
                if skip == "none_batches" and batch_idx in (2, 3):
                    return None
                out = super().training_step(batch, batch_idx)
                if skip == "fp16_overflow" and batch_idx == 1:
                    out["loss"] = out["loss"] * 1e36  # finite, but inf once GradScaler scales it
                return out

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=1.0)
                sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 3}}

            def on_train_batch_end(self, outputs, batch, batch_idx):
                self.lrs = getattr(self, "lrs", []) + [self.trainer.optimizers[0].param_groups[0]["lr"]]

        model = Sched()
        kwargs = dict(plugins=[plugins.MixedPrecision("16-mixed", "cpu")]) if skip == "fp16_overflow" else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.Trainer(max_epochs=2, limit_train_batches=5, limit_val_batches=0, accumulate_grad_batches=1,
                        **kwargs, **QUIET).fit(model)
        seen[lib.__name__] = model.lrs
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert seen["tasktrain"] == [1.0, 1.0, 0.5, 0.5, 0.5] + [0.5, 0.5, 0.25, 0.25, 0.25]  # batches 3 of each epoch


def test_a_shuffling_predict_loader_is_sharded_as_lightnings_on_several_processes():
    """Each rank predicts its own part of a shuffling predict loader, in Lightning's order
    (UnrepeatedDistributedSamplerWrapper: the loader's draw, positions permuted by the epoch, unpadded)."""
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper

    from tasktrain.trainer.data import prepare_eval_loader, set_sampler_epoch

    dataset = torch.utils.data.TensorDataset(torch.arange(11))
    for epoch in (0, 3):
        ours_by_rank, theirs_by_rank = [], []
        for rank in (0, 1):
            loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True,
                                                 generator=torch.Generator().manual_seed(5))
            sharded = prepare_eval_loader(loader, 2, rank, "predict")
            set_sampler_epoch(sharded, epoch)
            ours_by_rank.append([int(i) for (batch,) in sharded for i in batch])
            # Lightning's rebuilt loader: its sampler over the loader's RandomSampler, the loader's generator kept
            generator = torch.Generator().manual_seed(5)
            reference = torch.utils.data.RandomSampler(dataset, generator=generator)
            theirs = UnrepeatedDistributedSamplerWrapper(reference, num_replicas=2, rank=rank, shuffle=True, seed=0)
            theirs.set_epoch(epoch)
            rebuilt = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=theirs, generator=generator)
            theirs_by_rank.append([int(i) for (batch,) in rebuilt for i in batch])
        assert ours_by_rank == theirs_by_rank
        assert sorted(ours_by_rank[0] + ours_by_rank[1]) == list(range(11)) and len(ours_by_rank[0]) == 6


def test_predict_loaders_on_several_processes_hold_lightnings_sampler_classes():
    """A callback's isinstance check of `trainer.predict_dataloaders` on several processes holds as under Lightning:
    the sampler is an UnrepeatedDistributedSampler (so a DistributedSampler) and the batch sampler an
    _IndexBatchSamplerWrapper, each the class its framework's `overrides.distributed` exports (Lightning's own
    test_trainer.py checks this in a "ddp_spawn" predict), for a sequential and a shuffling loader alike."""
    from lightning.pytorch.trainer.states import RunningStage
    from torch.utils.data import DistributedSampler

    import tasktrain.overrides.distributed as our_overrides
    from lightning.pytorch.overrides import distributed as their_overrides
    from tasktrain.trainer.data import prepare_eval_loader

    def describe(loader, overrides):
        batches = loader.batch_sampler
        sampler = batches.sampler  # (the loader's own `sampler` is DataLoader's default beside a batch sampler)
        return (isinstance(sampler, overrides.UnrepeatedDistributedSampler), isinstance(sampler, DistributedSampler),
                isinstance(batches, overrides._IndexBatchSamplerWrapper), type(loader.sampler).__name__,
                sampler.num_replicas, sampler.rank, sampler.num_samples, sampler.total_size, len(loader),
                [int(i) for (batch,) in loader for i in batch])

    dataset = torch.utils.data.TensorDataset(torch.arange(11))
    lit = pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", logger=False)  # (rank 0; nothing launched)
    for shuffle in (False, True):
        def loader():
            return torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=shuffle,
                                               generator=torch.Generator().manual_seed(5))
        ours = describe(prepare_eval_loader(loader(), 2, 0, "predict"), our_overrides)
        theirs = describe(lit._data_connector._prepare_dataloader(loader(), shuffle=shuffle,  # (its runs: is_shuffled)
                                                                  mode=RunningStage.PREDICTING), their_overrides)
        assert ours == theirs
        assert ours[:3] == (True, True, True) and ours[4:9] == (2, 0, 6, 11, 3)


def test_datamodule_from_datasets_and_str_as_lightnings():
    """from_datasets hands batch_size / num_workers to an __init__ that takes them, keeps a class's own hook where no
    dataset is given, does not shuffle an iterable dataset, builds the same loaders; str() lists the loaders."""

    class Iterable(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    def run(base, boring):
        class Data(base):
            def __init__(self, batch_size=1, other=None):
                super().__init__()
                self.batch_size, self.other = batch_size, other

            def test_dataloader(self):
                return torch.utils.data.DataLoader(boring.RandomDataset(32, 8))

        dm = Data.from_datasets(boring.RandomDataset(32, 64), val_dataset=[boring.RandomDataset(32, 16), Iterable()],
                                predict_dataset=Iterable(), batch_size=4, num_workers=0, other=5)
        train, val, test, predict = (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader(),
                                     dm.predict_dataloader())
        loaders = [train, *val, test, predict]
        desc = [(type(dl.sampler).__name__, dl.batch_size, dl.num_workers, dl.pin_memory) for dl in loaders]
        return dm.batch_size, dm.other, desc, str(dm), str(boring.BoringDataModule())

    ours_, theirs_ = run(tasktrain.DataModule, ours), run(pl.LightningDataModule, theirs)
    assert ours_ == theirs_
    assert ours_[0] == 4 and "1. size=16 ; 2. size=NA" in ours_[3]


def test_an_inner_task_module_gets_the_outer_ones_trainer_as_lightnings():
    """Setting module.trainer (the Trainer does at each run) sets it on child TaskModules too: an ensemble member's
    self.trainer (its global_step, its logger...) works in the outer module's run, as in Lightning."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Ensemble(classes.BoringModel):
            def __init__(self):
                super().__init__()
                self.member = classes.BoringModel()

            def training_step(self, batch, batch_idx):
                steps.append(self.member.trainer.global_step)  # (it raised: the member was not attached)
                return super().training_step(batch, batch_idx)

        model, steps = Ensemble(), []
        trainer = lib.Trainer(max_steps=2, limit_val_batches=0, **QUIET)
        trainer.fit(model)
        seen[lib.__name__] = model.member.trainer is trainer, steps
    assert seen["tasktrain"] == seen["lightning.pytorch"] == (True, [0, 1]), seen


@pytest.mark.parametrize(("argument", "value"), [("val_check_interval", -0.1), ("val_check_interval", 1.2),
                                                 ("overfit_batches", -0.1), ("overfit_batches", 1.2),
                                                 ("limit_test_batches", -1), ("fast_dev_run", -1)])
def test_an_invalid_limit_is_refused_with_lightnings_type_and_first_sentence(argument, value):
    """val_check_interval, overfit_batches and fast_dev_run values that Lightning refuses were refused with tasktrain's
    words only (overfit_batches and fast_dev_run as plain ValueErrors); Lightning's MisconfigurationException and
    sentence now come first, as for the limit_*_batches."""
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException) as theirs:
        pl.Trainer(**{argument: value}, logger=False)
    with pytest.raises(tasktrain.exceptions.MisconfigurationException) as mine:
        tasktrain.Trainer(**{argument: value}, logger=False)
    assert str(theirs.value).startswith("You have passed invalid value" if argument != "fast_dev_run" else
                                        "fast_dev_run=-1 is not a valid configuration")
    assert str(mine.value).startswith(str(theirs.value))


@pytest.mark.parametrize("argument", ["limit_train_batches", "limit_val_batches", "limit_test_batches",
                                      "limit_predict_batches", "overfit_batches", "val_check_interval"])
def test_a_whole_float_above_one_is_a_batch_count_as_under_lightning(argument):
    """Lightning reads a whole float above 1 (limit_train_batches=3.0, 1e50) as that many batches; it was refused."""
    kwargs = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    mine, theirs = tasktrain.Trainer(**{argument: 3.0}, **kwargs), pl.Trainer(**{argument: 3.0}, **kwargs)
    assert getattr(mine, argument) == getattr(theirs, argument) == 3
    assert type(getattr(mine, argument)) is type(getattr(theirs, argument)) is int


@pytest.mark.parametrize("kwargs, cuda", [({}, False), ({"precision": "bf16-mixed"}, False),
                                          ({"precision": "16-mixed"}, False),
                                          ({"precision": "16-mixed", "strategy": "deepspeed"}, False),
                                          ({"precision": "64-true"}, False), ({}, True),
                                          ({"precision": "bf16-mixed"}, True)])
def test_a_trainers_construction_logs_lightnings_device_and_precision_lines(kwargs, cuda, monkeypatch):
    """Lightning's rank-zero INFO lines at Trainer(...): "Using bfloat16 Automatic Mixed Precision (AMP)" where it
    builds its own AMP plugin (not under DeepSpeed), "GPU available: ..., used: ...", "TPU available: ..."; a user's
    log capture sees the same lines, in the same order, on tasktrain's logger. Both branches of the host's CUDA are
    pinned (torch's probes patched), whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)

    def construct(lib, logger_name):
        records = []
        handler = logging.Handler(logging.DEBUG)
        handler.emit = records.append
        logger = logging.getLogger(logger_name)
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lib.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_checkpointing=False, **kwargs)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        return [(r.levelname, r.getMessage()) for r in records]

    theirs_, ours_ = construct(pl, "lightning.pytorch"), construct(tasktrain, "tasktrain")
    # (Lightning's logger connector also advertises litlogger at each construction; tasktrain writes to no such
    # service, its LitLogger is refused: docs/lightning.md, Loggers)
    theirs_ = [(level, text) for level, text in theirs_ if "litlogger" not in text]
    assert ours_ == theirs_
    amp = kwargs.get("precision", "").endswith("mixed") and "strategy" not in kwargs
    assert [text for _, text in ours_] == (["Using bfloat16 Automatic Mixed Precision (AMP)"] if amp else []) + [
        f"GPU available: {cuda}{' (cuda)' if cuda else ''}, used: False",
        "TPU available: False, using: 0 TPU cores"]


@pytest.mark.parametrize("cuda, mps, srun, slurm", [
    (False, False, False, None), (True, False, False, None), (False, True, False, None), (False, False, True, None),
    (False, False, True, "interactive"), (False, False, True, "job"), (True, False, True, None),
    (False, False, True, "lsf")])
def test_lightnings_gpu_and_srun_hints_are_given_where_lightning_gives_them(cuda, mps, srun, slurm, monkeypatch,
                                                                            tmp_path):
    """Lightning's PossibleUserWarnings of a Trainer's construction and run: "GPU available but not used" where CUDA
    (or MPS on an ARM processor) is there and the accelerator is the CPU; "The `srun` command is available on your
    system but is not used" where srun is installed and did not start the process (an interactive job's shell does not
    count), at the construction and again at each run's start without a checkpoint path. The host's probes are pinned
    (torch's CUDA / MPS, the processor, `shutil.which("srun")`, SLURM's variables), both branches of each. "lsf": an
    LSF job's jsrun task (rank 0), where Lightning's connector detects LSF after asking SLURM, so the hint is given."""
    import platform
    import shutil
    import socket

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setattr(platform, "processor", lambda: "arm" if mps else "x86_64")
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: (("/usr/bin/srun" if srun else None) if name == "srun"
                                                                 else which(name, *a, **k)))
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_", "JSM_", "LSB_"))]:
        monkeypatch.delenv(name)
    if slurm == "lsf":  # (LSFEnvironment's constructor sets MASTER_ADDR / MASTER_PORT: set here, so restored after)
        rankfile = tmp_path / "rankfile"
        rankfile.write_text(f"launch\n{socket.gethostname()}\n")
        for name, value in dict(LSB_JOBID="1234", LSB_DJOB_RANKFILE=str(rankfile), JSM_NAMESPACE_SIZE="1",
                                JSM_NAMESPACE_RANK="0", JSM_NAMESPACE_LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT="29500").items():
            monkeypatch.setenv(name, value)
    elif slurm:  # a SLURM job step of one task (srun'd), or the shell of an interactive job
        for name, value in dict(SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                                SLURM_JOB_NAME=slurm, SLURM_STEP_ID="0", SLURM_NTASKS_PER_NODE="1", SLURM_NNODES="1",
                                SLURM_JOB_ID="1234", SLURM_NODELIST="127.0.0.1").items():
            monkeypatch.setenv(name, value)

    def hints(lib, classes):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trainer = lib.Trainer(accelerator="cpu", devices=1, limit_val_batches=1, **QUIET)
            trainer.validate(classes.BoringModel(), verbose=False)
        if slurm == "lsf":  # (LSF detected by both, as the environment a strategy of several processes would use)
            assert type(trainer._accelerator_connector.cluster_environment).__name__ == "LSFEnvironment"
        return [(w.category.__name__, str(w.message)) for w in seen
                if "srun" in str(w.message) or "GPU available" in str(w.message)]

    from lightning.fabric.accelerators.mps import MPSAccelerator

    MPSAccelerator.is_available.cache_clear()  # (Lightning caches its probe's answer)
    try:
        ours_, theirs_ = hints(tasktrain, ours), hints(pl, theirs)
    finally:
        MPSAccelerator.is_available.cache_clear()
    assert ours_ == theirs_
    gpu = [("PossibleUserWarning", "GPU available but not used. You can set it by doing `Trainer(accelerator='gpu')`.")]
    srun_hint = [message for _, message in ours_ if "srun" in message]
    assert [hint for hint in ours_ if "GPU" in hint[1]] == (gpu if cuda or mps else [])
    assert len(srun_hint) == (2 if srun and slurm != "job" else 0)  # the construction's and the run's
    assert all(m.startswith("The `srun` command is available on your system but is not used. HINT:") for m in srun_hint)
