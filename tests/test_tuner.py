"""tasktrain.tuner: the learning-rate finder on a problem whose good rates are known, the batch-size finder's
search (both branches of a trial, through the real out-of-memory path and a replaced trial), and what both leave
behind: the module's weights and the trainer's settings as they were."""
import pytest
import torch
from helpers import quiet
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import ModelCheckpoint, TaskModule, Trainer
from tasktrain.profilers import SimpleProfiler
from tasktrain.tuner import Tuner
from tasktrain.tuner import batch_size_scaling


def regression(n=256, seed=0):
    w = torch.randn(8, 1, generator=torch.Generator().manual_seed(100))
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x @ w)


class Regressor(TaskModule):
    """Least squares with SGD: the Hessian of the loss is 2 E[x x^T] ~ 2 I, so a rate above ~1 diverges and the
    loss falls fastest for rates of order 0.1-0.5."""

    def __init__(self, lr=1e-4, batch_size=16):
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(regression(), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(regression(64, seed=1), batch_size=self.batch_size)


def test_lr_find_suggests_a_rate_in_the_known_good_range_and_restores_everything(tmp_path):
    module = Regressor(batch_size=64)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    checkpoint = ModelCheckpoint(dirpath=tmp_path)
    profiler = SimpleProfiler()
    # (max_epochs bounds the sweep as in Lightning: 30 epochs of 4 batches leave room for 100 steps)
    trainer = Trainer(max_epochs=30, callbacks=[checkpoint], logger=False, enable_progress_bar=False,
                      profiler=profiler)
    callbacks = list(trainer.callbacks)
    finder = Tuner(trainer).lr_find(module, min_lr=1e-5, max_lr=10.0, num_training=100)
    lr = finder.suggestion()
    assert lr is not None and 1e-5 < lr < 10.0, finder.results  # (its exact value: test_lightning_beside_finders)
    assert module.hparams.lr == lr  # update_attr: the hyper-parameter configure_optimizers reads
    assert len(finder.results["lr"]) < 100  # the loss blew up past lr ~1: the sweep stopped early
    rates = finder.results["lr"]
    assert rates == sorted(rates) and rates[0] == pytest.approx(1e-5)
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert trainer.callbacks == callbacks and trainer.max_epochs == 30 and trainer.max_steps == -1
    assert trainer.global_step == 0 and trainer.current_epoch == 0  # where it was, not where the sweep ended
    # the Tuner's run is profiled as Lightning's (its set-up and teardown hooks, the finder's on_fit_start), the
    # sweep's steps too (Lightning's profiler sees them: tests/test_lightning_beside_finders.py)
    assert trainer.profiler is profiler and "[Callback]LearningRateFinder.on_fit_start" in profiler.recorded_durations
    assert len(profiler.recorded_durations["[Strategy]SingleDeviceStrategy.training_step"]) == len(finder.results["lr"])
    assert not list(tmp_path.iterdir())  # nothing was checkpointed during the sweep
    trainer.fit(module)
    assert trainer.global_step == 30 * 4 and trainer.optimizers[0].param_groups[0]["lr"] == lr  # (the fit ran at it)


def test_lr_find_linear_mode_without_early_stop_and_the_attribute_checks():
    module = Regressor()
    finder = Tuner(Trainer(**quiet())).lr_find(module, min_lr=1e-4, max_lr=1e-2, num_training=20, mode="linear",
                                               early_stop_threshold=None, update_attr=False)
    assert len(finder.results["lr"]) == 20 and finder.results["lr"][-1] == pytest.approx(1e-2)
    # Lightning's scheduler count: step 0 at min_lr, step k at (k + 1) / num_training of the way
    assert finder.results["lr"][0] == 1e-4
    assert finder.results["lr"][1] - finder.results["lr"][0] == pytest.approx((1e-2 - 1e-4) * 2 / 20)
    assert module.hparams.lr == 1e-4

    class NoRate(Regressor):
        def __init__(self):
            super().__init__()
            del self.hparams["lr"]

        def configure_optimizers(self):  # (the fit's set-up runs first: the finder's check is at on_fit_start)
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    with pytest.raises(AttributeError, match="should have one of these fields: \('lr', 'learning_rate'\)"):
        Tuner(Trainer(**quiet())).lr_find(NoRate())

    class SkipsSome(Regressor):  # Lightning's rule: a step whose training_step returned None is a NaN point
        def training_step(self, batch, batch_idx):
            return None if batch_idx % 3 == 0 else super().training_step(batch, batch_idx)

    finder = Tuner(Trainer(**quiet())).lr_find(SkipsSome(), num_training=20, early_stop_threshold=None,
                                               update_attr=False)
    losses = torch.tensor(finder.results["loss"])
    assert len(losses) == 20 and torch.isnan(losses).tolist() == [i % 16 % 3 == 0 for i in range(20)]  # 16 a epoch


def test_scale_batch_size_power_and_binsearch_with_a_replaced_trial(monkeypatch):
    tried = []

    def fits_up_to_24(trainer, model, loaders):
        tried.append(model.batch_size)
        return model.batch_size <= 24

    monkeypatch.setattr(batch_size_scaling, "run_trial", fits_up_to_24)
    module = Regressor()
    assert Tuner(Trainer(**quiet())).scale_batch_size(module, mode="power") == 16
    assert tried == [2, 4, 8, 16, 32] and module.batch_size == 16
    tried.clear()
    assert Tuner(Trainer(**quiet())).scale_batch_size(module, mode="binsearch", init_val=4, margin=0) == 24
    assert tried == [4, 8, 16, 32, 24, 28, 26, 25]
    tried.clear()
    assert Tuner(Trainer(**quiet())).scale_batch_size(module, mode="binsearch", init_val=4) == 22  # 24 less 5%
    tried.clear()
    assert Tuner(Trainer(**quiet())).scale_batch_size(module, mode="power", init_val=100) == 24
    assert tried == [100, 50, 25, 12, 24, 48]  # none fit at first: halved until one does, then doubled again
    tried.clear()
    assert Tuner(Trainer(**quiet())).scale_batch_size(module, mode="power", max_val=12, init_val=3) == 12
    assert tried == [3, 6, 12]  # capped at max_val, and stopped there


class OutOfMemoryAbove(Regressor):
    """A batch larger than `fits` raises the error a GPU raises when it runs out of memory."""

    def __init__(self, fits):
        super().__init__()
        self.fits = fits

    def training_step(self, batch, batch_idx):
        if batch[0].shape[0] > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("mode, expected", [("power", 16), ("binsearch", 19)])  # (binsearch: 20 less its 5% margin)
def test_scale_batch_size_through_real_trials(mode, expected):
    module = OutOfMemoryAbove(fits=20)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = Trainer(max_epochs=2, **quiet())
    assert Tuner(trainer).scale_batch_size(module, mode=mode, steps_per_trial=2) == expected
    assert module.batch_size == expected and trainer.max_epochs == 2 and trainer.limit_train_batches == 1.0
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_scale_batch_size_stops_at_the_dataset_length_and_raises_other_errors():
    assert Tuner(Trainer(**quiet())).scale_batch_size(Regressor(), steps_per_trial=1, init_val=64) == 256

    class Broken(Regressor):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        Tuner(Trainer(**quiet())).scale_batch_size(Broken())
    with pytest.raises(ValueError, match="dataloaders passed directly to `.fit\(\)`"):
        Tuner(Trainer(**quiet())).scale_batch_size(Regressor(), train_dataloaders=Regressor().train_dataloader())
