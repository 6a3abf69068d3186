import math

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from helpers import Linear, loader, quiet, regression_data
from tasktrain import TaskModule, Trainer, seed_everything
from tasktrain.exceptions import MisconfigurationException


def test_fit_trains_and_counts():
    module = Linear()
    before = module.layer.weight.detach().clone()
    trainer = Trainer(max_epochs=3, **quiet())
    trainer.fit(module, loader(), loader())
    assert trainer.global_step == 12 and trainer.current_epoch == 3  # like Lightning: the count of finished epochs
    assert not torch.equal(before, module.layer.weight)
    assert float(trainer.callback_metrics["val_loss"]) < 5.0
    assert module.training  # train mode restored after validation


def test_validate_test_predict_return_values():
    module = Linear()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(module, loader())
    (val,) = trainer.validate(module, loader())
    (test,) = trainer.test(module, loader())
    x, y = regression_data()[:]
    expected = torch.nn.functional.mse_loss(module(x), y).item()
    assert val["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert test["test_loss"] == pytest.approx(expected, rel=1e-5)
    preds = trainer.predict(module, DataLoader(x, batch_size=8))
    assert len(preds) == 4 and torch.allclose(torch.cat(preds), module(x).detach())


def test_evaluation_runs_in_inference_mode_and_eval_mode():
    """Lightning's rule: the fit's validation under no_grad (a callback may change the weights there and train on),
    validate / test / predict under inference_mode; eval mode in all, the train mode given back after."""
    seen = []

    class Probe(Linear):
        def validation_step(self, batch, batch_idx):
            seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled(), self.training))

        def on_validation_epoch_end(self):  # hooks too: an in-place change of a weight here trains on after
            seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled(), self.training))

    module = Probe()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(module, loader(), loader())
    assert set(seen) == {(False, False, False)} and module.training
    seen.clear()
    trainer.validate(module, loader())
    assert set(seen) == {(True, False, False)} and module.training


def test_gradient_accumulation_matches_hand_computed_sgd():
    # 5 batches, accumulate 2: windows [0,1], [2,3], [4] -- the last partial window steps, its loss divided by 2 as
    # every window's (Lightning's rule: accumulate_grad_batches, not the window's size)
    data = regression_data(40)
    module = Linear(lr=0.05)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(module.layer.state_dict())
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for window in ([0, 1], [2, 3], [4]):
        for b in window:
            x, y = data[b * 8:(b + 1) * 8]
            (torch.nn.functional.mse_loss(reference(x), y) / 2).backward()
        opt.step()
        opt.zero_grad()
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, **quiet())
    trainer.fit(module, DataLoader(data, batch_size=8))
    assert trainer.global_step == 3
    torch.testing.assert_close(module.layer.weight, reference.weight)
    torch.testing.assert_close(module.layer.bias, reference.bias)


@pytest.mark.parametrize("form", ["optimizer", "list", "tuple", "dict_sched", "dict_step", "list_of_dicts"])
def test_configure_optimizers_forms(form):
    class M(Linear):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {
                "optimizer": opt,
                "list": [opt],
                "tuple": ([opt], [sched]),
                "dict_sched": {"optimizer": opt, "lr_scheduler": sched},
                "dict_step": {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 2}},
                "list_of_dicts": [{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}],
            }[form]

    module = M()
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(module, loader())  # 4 steps per epoch, 8 in all
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    expected = {"optimizer": 1.0, "list": 1.0, "tuple": 0.25, "dict_sched": 0.25, "dict_step": 0.5 ** 4,
                "list_of_dicts": 0.25}[form]
    assert lr == pytest.approx(expected)


def test_reduce_lr_on_plateau_uses_monitor():
    class M(Linear):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1e-3)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "flat"}}

        def validation_step(self, batch, batch_idx):
            self.log("flat", 1.0)  # never improves: every epoch after the first is a plateau

    trainer = Trainer(max_epochs=3, **quiet())
    trainer.fit(M(), loader(), loader())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-5)


@pytest.mark.parametrize("bad, message", [
    (lambda self: {"lr_scheduler": None}, "no 'optimizer' key"),
    (lambda self: "adam", "returned a str"),
    (lambda self: {"optimizer": torch.optim.SGD(self.parameters(), lr=1), "lr_scheduler": {
        "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(torch.optim.SGD(self.parameters(), lr=1))}},
     "ReduceLROnPlateau needs a metric"),
])
def test_bad_configure_optimizers_errors_before_first_step(bad, message):
    calls = []

    class M(Linear):
        configure_optimizers = bad

        def training_step(self, batch, batch_idx):
            calls.append(batch_idx)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=message):
        Trainer(max_epochs=1, **quiet()).fit(M(), loader())
    assert calls == []


def test_missing_training_step_is_clear():
    class NoStep(TaskModule):
        def configure_optimizers(self):
            return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1)

    with pytest.raises(MisconfigurationException, match=r"No `training_step\(\)` method defined"):
        Trainer(max_epochs=1, **quiet()).fit(NoStep(), loader())


@pytest.mark.parametrize("returned, error, message", [
    (lambda self, loss: "loss", MisconfigurationException, "a dict, or None.*returned str at batch 0"),
    (lambda self, loss: {"x": loss}, MisconfigurationException, "the 'loss' key needs to be present"),
    # (Lightning's: torch's backward refuses it)
    (lambda self, loss: loss.repeat(3), RuntimeError, "grad can be implicitly created only for scalar outputs"),
    (lambda self, loss: loss.detach(), RuntimeError, "element 0 of tensors does not require grad"),
])
def test_bad_training_step_return(returned, error, message):
    class M(Linear):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return returned(self, torch.nn.functional.mse_loss(self(x), y))

    module = M()
    before = module.layer.weight.detach().clone()
    with pytest.raises(error, match=message):
        Trainer(max_epochs=1, **quiet()).fit(module, loader())
    assert torch.equal(before, module.layer.weight)  # it failed before any optimizer step


def test_unknown_precision_and_strategy_list_valid_values():
    with pytest.raises(ValueError, match="bf16-mixed"):
        Trainer(precision="fp8")
    with pytest.raises(ValueError, match="ddp"):
        Trainer(strategy="horovod")
    with pytest.raises(ValueError, match="accelerator"):
        Trainer(accelerator="tpu")


class Forever(IterableDataset):
    def __iter__(self):
        while True:
            yield torch.randn(4), torch.randn(1)


def test_an_infinite_loader_trains_until_a_limit_or_a_stop():
    """Lightning's rule: a loader without a length is allowed with any limits (max_epochs=-1 asks for no end); here
    a callback's stop request ends it."""
    from tasktrain import Callback

    class StopAt(Callback):
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.global_step >= 7

    trainer = Trainer(max_epochs=-1, callbacks=[StopAt()], **quiet())
    trainer.fit(Linear(), DataLoader(Forever(), batch_size=4))
    assert trainer.global_step == 7 and trainer.current_epoch == 1  # (the epoch it stopped inside counts)
    trainer = Trainer(max_steps=5, **quiet())
    trainer.fit(Linear(), DataLoader(Forever(), batch_size=4))
    assert trainer.global_step == 5


def test_nan_loss_names_the_step():
    class M(Linear):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.global_step == 2 else loss

    with pytest.raises(FloatingPointError, match="epoch 0, batch 2"):
        Trainer(max_epochs=1, log_every_n_steps=1, **quiet()).fit(M(), loader())


def test_limits_and_val_schedule():
    calls = []

    class M(Linear):
        def on_validation_start(self):
            calls.append((self.current_epoch, self.trainer.state.batch_in_epoch, self.trainer.sanity_checking))

    trainer = Trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=1, val_check_interval=2,
                      num_sanity_val_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(M(), loader(64), loader())
    # sanity check, then after batch 2 and at the end of each epoch
    assert calls == [(0, 0, True), (0, 2, False), (0, 4, False), (1, 2, False), (1, 4, False)]
    calls.clear()
    trainer = Trainer(max_epochs=4, check_val_every_n_epoch=2, **quiet())
    trainer.fit(M(), loader(), loader())
    assert [c[0] for c in calls] == [1, 3]


def test_max_steps_stops_mid_epoch():
    trainer = Trainer(max_steps=6, **quiet())
    trainer.fit(Linear(), loader())
    # the epoch it stopped inside counts once the loop ended, as in Lightning 2.6 (its position stays in the state)
    assert trainer.global_step == 6 and trainer.current_epoch == 2 and trainer.state.epoch == 1


def test_log_semantics_on_step_on_epoch_and_weighted_mean():
    class M(Linear):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("both", float(batch_idx), on_step=True, on_epoch=True)
            self.log("total", 1.0, on_epoch=True, reduce_fx="sum")
            self.log("biggest", float(batch_idx), on_epoch=True, on_step=False, reduce_fx="max")
            self.log_dict({"a": 1.0, "b": 2.0}, on_step=True)
            return loss

        def validation_step(self, batch, batch_idx):
            # batches of 8, 8 and 4: a weighted mean counts samples, not batches
            self.log("val_idx", float(batch_idx))

    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(M(), loader(32), DataLoader(regression_data(20), batch_size=8))
    m = trainer.callback_metrics
    assert float(m["both_epoch"]) == pytest.approx(1.5) and float(m["both"]) == pytest.approx(1.5)
    assert float(m["total"]) == 4 and float(m["biggest"]) == 3
    assert float(m["a"]) == 1.0 and float(m["b"]) == 2.0
    assert float(m["val_idx"]) == pytest.approx((0 * 8 + 1 * 8 + 2 * 4) / 20)


def test_log_rejects_non_scalar():
    class M(Linear):
        def training_step(self, batch, batch_idx):
            self.log("vec", torch.ones(3))
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="the tensor must have a single element"):
        Trainer(max_epochs=1, **quiet()).fit(M(), loader())


def test_module_attributes_and_hparams():
    seen = {}

    class M(Linear):
        def __init__(self, lr=0.1, width=3, name="x"):
            super().__init__(lr)
            self.save_hyperparameters()

        def on_train_epoch_end(self):
            seen.update(trainer=self.trainer, device=self.device, step=self.global_step, epoch=self.current_epoch)

    module = M(width=5)
    assert dict(module.hparams) == {"lr": 0.1, "width": 5, "name": "x"}
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(module, loader())
    assert seen == {"trainer": trainer, "device": torch.device("cpu"), "step": 8, "epoch": 1}


def test_manual_optimization():
    class Manual(Linear):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    module = Manual()
    before = module.layer.weight.detach().clone()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(module, loader())
    assert trainer.global_step == 4 and not torch.equal(before, module.layer.weight)

    # Accumulation is the loop's, and the loop does not step here: asking for it is an error before any training.
    module = Manual()
    before = module.layer.weight.detach().clone()
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=2 .*manual optimisation"):
        Trainer(max_epochs=1, accumulate_grad_batches=2, **quiet()).fit(module, loader())
    assert torch.equal(before, module.layer.weight)


def test_module_dataloader_hooks():
    class M(Linear):
        def train_dataloader(self):
            return loader()

        def val_dataloader(self):
            return loader(16)

    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(M())
    assert trainer.global_step == 4 and "val_loss" in trainer.callback_metrics


def test_seed_everything_makes_runs_repeat():
    def run():
        seed_everything(7)

        class Drop(Linear):
            def __init__(self):
                super().__init__()
                self.drop = torch.nn.Dropout(0.5)

            def forward(self, x):
                return self.layer(self.drop(x))

        module = Drop()
        Trainer(max_epochs=2, deterministic=True, **quiet()).fit(module, loader(shuffle=True))
        return module.layer.weight.detach().clone()

    try:
        assert torch.equal(run(), run())
    finally:
        torch.use_deterministic_algorithms(False)


def test_launch_config_fills_unset_arguments_and_explicit_ones_win(monkeypatch):
    from tasktrain import GradientClipping

    monkeypatch.setenv("TASKTRAIN_LAUNCH", "1")
    monkeypatch.setenv("TASKTRAIN_PRECISION", "bf16-mixed")
    monkeypatch.setenv("TASKTRAIN_GRADIENT_ACCUMULATION_STEPS", "3")
    monkeypatch.setenv("TASKTRAIN_GRADIENT_CLIPPING", "0.5")
    trainer = Trainer(**quiet())
    clip = [c for c in trainer.callbacks if isinstance(c, GradientClipping)]
    assert trainer.precision == "bf16-mixed" and trainer.accumulate_grad_batches == 3
    assert len(clip) == 1 and clip[0].max_norm == 0.5
    with pytest.warns(UserWarning, match="overrides precision='bf16-mixed'"):
        trainer = Trainer(precision="32-true", accumulate_grad_batches=2, **quiet())
    assert trainer.precision == "32-true" and trainer.accumulate_grad_batches == 2
