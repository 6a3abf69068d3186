"""Lightning's callbacks under their Lightning names (issue 17): LambdaCallback, OnExceptionCheckpoint,
BaseFinetuning / BackboneFinetuning, weight averaging (EMA, SWA), ThroughputMonitor, the LearningRateMonitor
and ModelCheckpoint options, ModelSummary. Each test fails without the behaviour it names."""
import csv
import os
from datetime import timedelta

import pytest
import torch
from helpers import Linear, loader, quiet
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import (BackboneFinetuning, BaseFinetuning, CSVLogger, EMAWeightAveraging, LambdaCallback,
                       LearningRateMonitor, ModelCheckpoint, ModelSummary, OnExceptionCheckpoint,
                       StochasticWeightAveraging, TaskModule, ThroughputMonitor, Trainer, WeightAveraging)
from tasktrain.callbacks import model_summary
from tasktrain.callbacks.base import EVENTS


def read_csv(logger):
    logger.save()
    with open(logger.metrics_file_path, newline="") as f:
        return list(csv.DictReader(f))


# -- LambdaCallback ------------------------------------------------------------------------------------------------
def test_lambda_callback_calls_the_given_functions_only():
    seen = []
    cb = LambdaCallback(on_train_epoch_end=lambda trainer, module: seen.append(("epoch", trainer.current_epoch)),
                        on_train_batch_end=lambda trainer, module, out, batch, i: seen.append(("batch", i)))
    trainer = Trainer(max_epochs=2, callbacks=[cb], **quiet())
    trainer.fit(Linear(), loader(16))
    assert seen == [("batch", 0), ("batch", 1), ("epoch", 0), ("batch", 0), ("batch", 1), ("epoch", 1)]
    hooked = [e for e in EVENTS if any(getattr(f, "func", None) is getattr(cb, e, None)
                                       for f in trainer._callback_hooks[e])]
    assert sorted(hooked) == ["on_train_batch_end", "on_train_epoch_end"]  # the others cost nothing


def test_lambda_callback_refuses_an_unknown_event():
    with pytest.raises(TypeError, match="on_train_epoch_ends"):
        LambdaCallback(on_train_epoch_ends=print)


# -- OnExceptionCheckpoint -----------------------------------------------------------------------------------------
class FailsAt(Linear):
    def __init__(self, at=None):
        super().__init__()
        self.at = at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.at:
            raise RuntimeError("the data went bad")
        return super().training_step(batch, batch_idx)


def test_on_exception_checkpoint_saves_a_resumable_checkpoint_and_a_good_run_removes_it(tmp_path):
    cb = OnExceptionCheckpoint(tmp_path)
    with pytest.raises(RuntimeError, match="went bad"):
        Trainer(max_epochs=3, callbacks=[cb], **quiet(enable_checkpointing=True)).fit(FailsAt(at=5), loader(32))
    ckpt = torch.load(cb.ckpt_path, weights_only=True)
    assert ckpt["loops"]["train_state"]["global_step"] == 5 and "optimizer_states" in ckpt
    resumed = Linear()
    trainer = Trainer(max_epochs=3, callbacks=[OnExceptionCheckpoint(tmp_path)], **quiet(enable_checkpointing=True))
    trainer.fit(resumed, loader(32), ckpt_path=cb.ckpt_path)
    assert trainer.global_step == 12
    assert not os.path.exists(cb.ckpt_path)  # a good run removes the stale failure's file


def test_a_failing_on_exception_checkpoint_is_reported_and_the_original_error_raised(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # the checkpoint's directory cannot be made under a file
    with pytest.raises(RuntimeError, match="went bad"):
        Trainer(max_epochs=3, callbacks=[OnExceptionCheckpoint(blocker / "ckpts")],
                **quiet(enable_checkpointing=True)).fit(FailsAt(at=1), loader(32))
    err = capsys.readouterr().err
    assert "an on_exception hook failed too (OnExceptionCheckpoint.on_exception)" in err


def test_on_exception_checkpoint_refuses_several_processes(tmp_path, monkeypatch):
    trainer = Trainer(max_epochs=1, callbacks=[OnExceptionCheckpoint(tmp_path)], **quiet(enable_checkpointing=True))
    monkeypatch.setattr(type(trainer.strategy), "world_size", 2, raising=False)
    with pytest.raises(ValueError, match="one process only"):
        trainer.fit(Linear(), loader(16))


# -- Finetuning ----------------------------------------------------------------------------------------------------
class WithBackbone(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
        self.head = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(self.backbone(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1, momentum=0.9)


def _group_lrs(trainer):
    return [g["lr"] for g in trainer.optimizers[0].param_groups]


def test_backbone_finetuning_unfreezes_at_its_epoch_and_raises_the_rate():
    lrs = []
    record = LambdaCallback(on_train_epoch_end=lambda trainer, module: lrs.append(_group_lrs(trainer)))
    module = WithBackbone()
    frozen = module.backbone[0].weight.detach().clone()
    trainer = Trainer(max_epochs=4, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=2,
                                                                  lambda_func=lambda epoch: 3.0), record], **quiet())
    trainer.fit(module, loader(16))
    # epochs 0-1: head only; 2: backbone at 0.1 * 0.1; 3: x3 (capped at the head's rate when it would pass it)
    assert lrs[0] == lrs[1] == [0.1]
    assert lrs[2] == pytest.approx([0.1, 0.01]) and lrs[3] == pytest.approx([0.1, 0.03])
    assert not torch.equal(module.backbone[0].weight, frozen)
    assert module.backbone[1].weight.requires_grad  # train_bn=True: BatchNorm was never frozen


def test_backbone_finetuning_resume_restores_the_added_group():
    module = WithBackbone()
    cb = BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 2.0)
    trainer = Trainer(max_epochs=2, callbacks=[cb], **quiet())
    trainer.fit(module, loader(16))
    trainer.save_checkpoint("mid.ckpt")
    full = Trainer(max_epochs=3, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1,
                                                               lambda_func=lambda epoch: 2.0)], **quiet())
    full.fit(WithBackbone(), loader(16))
    resumed_module = WithBackbone()
    resumed = Trainer(max_epochs=3, callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1,
                                                                  lambda_func=lambda epoch: 2.0)], **quiet())
    resumed.fit(resumed_module, loader(16), ckpt_path="mid.ckpt")
    assert _group_lrs(resumed) == pytest.approx([0.1, 0.02]) and _group_lrs(full) == pytest.approx([0.1, 0.02])
    for a, b in zip(resumed_module.parameters(), full.module.parameters()):
        torch.testing.assert_close(a, b)  # the backbone group's momentum came back too


def test_finetuning_needs_a_backbone():
    with pytest.raises(AttributeError, match="backbone"):
        Trainer(max_epochs=1, callbacks=[BackboneFinetuning()], **quiet()).fit(Linear(), loader(16))


def test_base_finetuning_helpers():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    BaseFinetuning.freeze(net, train_bn=False)
    assert not any(p.requires_grad for p in net.parameters())
    BaseFinetuning.make_trainable(net[2])
    assert [p.requires_grad for p in net.parameters()] == [False, False, False, False, True, True]
    optimizer = torch.optim.SGD(net[2].parameters(), lr=1.0)
    with pytest.warns(UserWarning, match="already exist within another group"):
        BaseFinetuning.unfreeze_and_add_param_group(net, optimizer, initial_denom_lr=4.0)
    assert [g["lr"] for g in optimizer.param_groups] == [1.0, 0.25]
    assert len(optimizer.param_groups[1]["params"]) == 4


# -- weight averaging ----------------------------------------------------------------------------------------------
class Weights(LambdaCallback):
    """The module's weights after every optimizer step."""

    def __init__(self):
        self.after_step = []
        super().__init__(on_train_batch_end=lambda trainer, module, *a: self.after_step.append(
            module.layer.weight.detach().clone()))


def test_ema_matches_a_hand_computation_and_is_evaluated_then_kept():
    weights = Weights()
    seen_in_validation = []
    probe = LambdaCallback(on_validation_epoch_start=lambda trainer, module: seen_in_validation.append(
        module.layer.weight.detach().clone()))
    ema = EMAWeightAveraging(decay=0.5)
    module = Linear()
    trainer = Trainer(max_epochs=2, callbacks=[weights, ema, probe], **quiet(limit_val_batches=1))
    trainer.fit(module, loader(32), loader(8))
    expected = weights.after_step[0]
    for w in weights.after_step[1:]:
        expected = 0.5 * expected + 0.5 * w
    torch.testing.assert_close(module.layer.weight, expected)  # the module keeps the average after fit
    after_first_epoch = weights.after_step[0]
    for w in weights.after_step[1:4]:
        after_first_epoch = 0.5 * after_first_epoch + 0.5 * w
    torch.testing.assert_close(seen_in_validation[0], after_first_epoch)  # validation saw the average


def test_weight_averaging_checkpoint_holds_both_and_resume_continues_the_average(tmp_path):
    def run(epochs, ckpt=None, save=None):
        cb = EMAWeightAveraging(decay=0.7)
        module = Linear()
        trainer = Trainer(max_epochs=epochs, callbacks=[cb], **quiet())
        trainer.fit(module, loader(32), ckpt_path=ckpt)
        return trainer, module, cb

    # a checkpoint taken mid-fit (epoch end of epoch 0)
    saver = LambdaCallback(on_train_epoch_end=lambda trainer, module: trainer.save_checkpoint(str(tmp_path / "e0.ckpt"))
                           if trainer.current_epoch == 0 else None)
    module = Linear()
    ema = EMAWeightAveraging(decay=0.7)
    Trainer(max_epochs=2, callbacks=[saver, ema], **quiet()).fit(module, loader(32))
    ckpt = torch.load(tmp_path / "e0.ckpt", weights_only=True)
    assert set(ckpt) >= {"state_dict", "current_model_state", "averaging_state"}
    assert not torch.equal(ckpt["state_dict"]["layer.weight"], ckpt["current_model_state"]["layer.weight"])
    assert int(ckpt["averaging_state"]["n_averaged"]) == 4
    _, resumed, _ = run(2, ckpt=str(tmp_path / "e0.ckpt"))
    torch.testing.assert_close(resumed.layer.weight, module.layer.weight)  # same average as the unbroken run


def test_weight_averaging_refuses_sharded_parameters(monkeypatch):
    trainer = Trainer(max_epochs=1, callbacks=[WeightAveraging()], **quiet())

    def shards(who):
        raise ValueError(f"{who} needs the whole parameters")

    monkeypatch.setattr(trainer.strategy, "check_full_parameters", shards)
    with pytest.raises(ValueError, match="WeightAveraging"):
        trainer.fit(Linear(), loader(16))


class BNNet(Linear):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(1, momentum=0.5)

    def forward(self, x):
        return self.norm(self.layer(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)


def test_swa_averages_epoch_starts_from_its_start_switches_the_rate_and_recomputes_batch_norm():
    ends, lrs = [], []
    record = LambdaCallback(on_train_epoch_end=lambda trainer, module: (
        ends.append(module.layer.weight.detach().clone()), lrs.append(trainer.optimizers[0].param_groups[0]["lr"])))
    module = BNNet()
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2, annealing_strategy="linear")
    data = loader(32)
    Trainer(max_epochs=4, callbacks=[record, swa], **quiet()).fit(module, data)
    # Lightning's rule: the starts of epochs 1, 2, 3 (0-based), i.e. the ends of epochs 0, 1, 2
    torch.testing.assert_close(module.layer.weight, torch.stack(ends[:3]).mean(0))
    assert lrs[0] == 0.1 and lrs[1] == pytest.approx(0.075) and lrs[2] == lrs[3] == pytest.approx(0.05)
    with torch.no_grad():  # BatchNorm's statistics: the averaged weights' batches, averaged with equal weights
        pre = [module.layer(x) for x, _ in data]
    torch.testing.assert_close(module.norm.running_mean, torch.stack([p.mean(0) for p in pre]).mean(0))
    torch.testing.assert_close(module.norm.running_var, torch.stack([p.var(0) for p in pre]).mean(0))


# -- ThroughputMonitor -----------------------------------------------------------------------------------------------
def test_throughput_monitor_writes_lightnings_names_with_consistent_rates(tmp_path):
    logger = CSVLogger(tmp_path)
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0], length_fn=lambda b: 3 * b[0].shape[0],
                                window_size=2)
    module = Linear()
    module.flops_per_batch = 1000
    Trainer(max_epochs=1, callbacks=[monitor], logger=logger, log_every_n_steps=2, enable_progress_bar=False,
            enable_checkpointing=False, num_sanity_val_steps=0).fit(module, loader(48), loader(16))
    rows = [r for r in read_csv(logger) if r.get("train/batches")]
    assert [int(r["step"]) for r in rows] == [1, 3, 5]  # Lightning's step (batches_that_stepped)
    assert [int(float(r["train/samples"])) for r in rows] == [16, 32, 48]
    assert [int(float(r["train/lengths"])) for r in rows] == [48, 96, 144]
    for r in rows:
        assert float(r["train/device/samples_per_sec"]) == pytest.approx(8 * float(r["train/device/batches_per_sec"]))
        assert float(r["train/device/items_per_sec"]) == pytest.approx(24 * float(r["train/device/batches_per_sec"]))
        assert float(r["train/device/flops_per_sec"]) == pytest.approx(1000 * float(r["train/device/batches_per_sec"]))
        assert "train/batches_per_sec" not in r or r["train/batches_per_sec"] == ""  # global rates: several ranks
    times = [float(r["train/time"]) for r in rows]
    assert times == sorted(times) and times[0] > 0
    val = [r for r in read_csv(logger) if r.get("validate/batches")]
    assert [int(float(r["validate/samples"])) for r in val] == [16]  # after its 2nd batch (every 2nd), as Lightning


# -- LearningRateMonitor options -------------------------------------------------------------------------------------
class WithOptimizer(Linear):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def configure_optimizers(self):
        return self.make(self.parameters())


@pytest.mark.parametrize("make, momentum, decay", [
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01), 0.9, 0.01),
    (lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.8, 0.99), weight_decay=0.02), 0.8, 0.02),
])
def test_lr_monitor_logs_momentum_and_weight_decay(tmp_path, make, momentum, decay):
    logger = CSVLogger(tmp_path)
    Trainer(max_epochs=1, logger=logger, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
            callbacks=[LearningRateMonitor("step", log_momentum=True, log_weight_decay=True)]).fit(
        WithOptimizer(make), loader(16))
    name = "lr-" + type(make(Linear().parameters())).__name__
    rows = [r for r in read_csv(logger) if r.get(name)]
    assert rows and all(float(r[f"{name}-momentum"]) == pytest.approx(momentum) for r in rows)
    assert all(float(r[f"{name}-weight_decay"]) == pytest.approx(decay) for r in rows)


def test_lr_monitor_warns_when_an_optimizer_has_no_momentum(tmp_path):
    with pytest.warns(RuntimeWarning, match=r"You have set log_momentum=True, but some optimizers do not have "
                      r"momentum. This will log a value 0 for the momentum \(Adagrad has no momentum"):
        Trainer(max_epochs=1, logger=CSVLogger(tmp_path), enable_progress_bar=False, enable_checkpointing=False,
                callbacks=[LearningRateMonitor(log_momentum=True)]).fit(
            WithOptimizer(lambda p: torch.optim.Adagrad(p, lr=0.1)), loader(16))


# -- ModelCheckpoint options -----------------------------------------------------------------------------------------
def ckpt_names(path):
    return sorted(f for f in os.listdir(path) if f.endswith(".ckpt"))


def test_auto_insert_metric_name_false(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, filename="e{epoch:02d}-{val_loss:.2f}", auto_insert_metric_name=False,
                         monitor="val_loss", save_top_k=-1)
    Trainer(max_epochs=2, callbacks=[mc], logger=False, enable_progress_bar=False, num_sanity_val_steps=0).fit(
        Linear(), loader(16), loader(8))
    names = ckpt_names(tmp_path)
    assert len(names) == 2 and names[0].startswith("e00-") and "val_loss" not in names[0] and "=" not in names[0]


def test_step_schedule_alone_saves_no_epoch_ends(tmp_path):
    # Lightning's default: every_n_epochs is 1 only when no step or time schedule is given
    mc = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    Trainer(max_epochs=2, callbacks=[mc], logger=False, enable_progress_bar=False).fit(Linear(), loader(16))
    assert ckpt_names(tmp_path) == ["epoch=1-step=3.ckpt"]


def test_train_time_interval_saves_when_the_time_is_up(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("tasktrain.callbacks.checkpoint.time.monotonic", lambda: clock[0])
    tick = LambdaCallback(on_train_batch_start=lambda *a: clock.__setitem__(0, clock[0] + 25.0))
    mc = ModelCheckpoint(dirpath=tmp_path, train_time_interval=timedelta(seconds=60), save_top_k=-1)
    Trainer(max_epochs=1, callbacks=[tick, mc], logger=False, enable_progress_bar=False).fit(Linear(), loader(64))
    # 25 s per step: due after steps 3 (75 s) and 6 (150 - 75 = 75 s); no epoch-end save with a time schedule
    assert ckpt_names(tmp_path) == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]


@pytest.mark.parametrize("flag, expected", [
    (True, ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt", "epoch=3-step=8.ckpt"]),
    (False, ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]),  # only the epochs that ended with a validation
    (None, ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]),  # check_val_every_n_epoch=2: Lightning picks False
])
def test_save_on_train_epoch_end(tmp_path, flag, expected):
    mc = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, save_on_train_epoch_end=flag)
    Trainer(max_epochs=4, callbacks=[mc], logger=False, enable_progress_bar=False, num_sanity_val_steps=0,
            check_val_every_n_epoch=2).fit(Linear(), loader(16), loader(8))
    assert ckpt_names(tmp_path) == expected


# -- ModelSummary ----------------------------------------------------------------------------------------------------
def test_model_summary_is_printed_at_fit_start_by_default(capsys, monkeypatch):
    from tasktrain.callbacks import progress

    monkeypatch.setattr(progress, "rich_available", lambda: False)  # the default without rich: ModelSummary's table
    Trainer(max_epochs=1, **quiet()).fit(Linear(), loader(16))
    out = capsys.readouterr().out
    assert "| Name  | Type   | Params | Mode" in out and "0 | layer | Linear | 5      | train" in out
    assert "5         Trainable params" in out and "5         Total params" in out
    Trainer(max_epochs=1, enable_model_summary=False, **quiet()).fit(Linear(), loader(16))
    assert "Trainable params" not in capsys.readouterr().out


def test_model_summary_depth_sizes_and_no_forward_without_an_example(capsys, monkeypatch):
    class Deep(Linear):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(1, 3), torch.nn.Linear(3, 1))
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.block(self.layer(x))

    module = Deep()
    Trainer(max_epochs=1, callbacks=[ModelSummary(max_depth=2)], **quiet(limit_train_batches=1)).fit(module, loader(8))
    out = capsys.readouterr().out
    assert "block.1" in out and "In sizes" not in out and module.calls == 1  # the training step's only
    module = Deep()
    module.example_input_array = torch.zeros(5, 4)
    Trainer(max_epochs=1, **quiet(limit_train_batches=1)).fit(module, loader(8))
    out = capsys.readouterr().out
    assert "In sizes" in out and "[5, 4]" in out and "[5, 1]" in out and "block.1" not in out


def test_model_summary_given_with_enable_model_summary_false_runs_and_bad_depth(capsys):
    # Lightning: enable_model_summary=False only stops the default one; a ModelSummary the user gives runs
    Trainer(max_epochs=1, enable_model_summary=False, callbacks=[ModelSummary()], **quiet()).fit(Linear(), loader(8))
    assert "Trainable params" in capsys.readouterr().out
    with pytest.raises(ValueError, match="max_depth"):
        ModelSummary(max_depth=-2)
    assert str(model_summary.summarize(torch.nn.Linear(1000, 1000))).splitlines()[-5].startswith("1.0 M")


# -- BasePredictionWriter --------------------------------------------------------------------------------------------
from tasktrain import BasePredictionWriter, GradientAccumulationScheduler  # noqa: E402


class Writer(BasePredictionWriter):
    def __init__(self, interval):
        super().__init__(interval)
        self.batches, self.epoch = [], None

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append((batch_idx, list(batch_indices), prediction.clone(), dataloader_idx))

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        self.epoch = ([p.clone() for p in predictions], batch_indices)


def test_prediction_writer_gets_the_dataset_indices_of_each_batch():
    data = DataLoader(TensorDataset(torch.arange(10.0).unsqueeze(1).repeat(1, 4)), batch_size=4, shuffle=True)
    writer = Writer("batch_and_epoch")
    module = Linear()
    out = Trainer(callbacks=[writer], **quiet()).predict(module, data)
    assert [b[0] for b in writer.batches] == [0, 1, 2] and all(b[3] == 0 for b in writer.batches)
    seen = [i for b in writer.batches for i in b[1]]
    assert sorted(seen) == list(range(10)) and seen != list(range(10))  # shuffled: the indices tell the order
    for _, indices, prediction, _ in writer.batches:
        expected = module(torch.tensor(indices, dtype=torch.float32).unsqueeze(1).repeat(1, 4))
        torch.testing.assert_close(prediction, expected.detach())
    predictions, indices = writer.epoch
    assert indices == [[b[1] for b in writer.batches]] and len(predictions) == 3 and len(out) == 3


def test_return_predictions_false_keeps_nothing_but_an_epoch_writer_still_gets_them():
    batch_writer, epoch_writer = Writer("batch"), Writer("epoch")
    seen = []
    probe = LambdaCallback(on_predict_batch_end=lambda trainer, *a: seen.append(len(trainer.predictions)))
    trainer = Trainer(callbacks=[batch_writer, probe], **quiet())
    assert trainer.predict(Linear(), loader(16), return_predictions=False) is None
    assert len(batch_writer.batches) == 2 and seen == [0, 0]  # nothing held in memory
    assert Trainer(callbacks=[epoch_writer], **quiet()).predict(Linear(), loader(16), return_predictions=False) is None
    assert len(epoch_writer.epoch[0]) == 2 and epoch_writer.epoch[1] == [[list(range(8)), list(range(8, 16))]]
    with pytest.raises(NotImplementedError, match="write_on_batch_end"):
        Trainer(callbacks=[BasePredictionWriter("batch")], **quiet()).predict(Linear(), loader(8))
    with pytest.raises(ValueError, match="write_interval"):
        BasePredictionWriter("step")


# -- GradientAccumulationScheduler ---------------------------------------------------------------------------------
def test_gradient_accumulation_scheduler_changes_the_window_by_epoch():
    steps = []
    record = LambdaCallback(on_train_epoch_end=lambda trainer, module: steps.append(trainer.global_step))
    sizes = []
    record_window = LambdaCallback(on_before_optimizer_step=lambda trainer, module, opt: sizes.append(
        trainer.accumulate_grad_batches))
    trainer = Trainer(max_epochs=4, callbacks=[GradientAccumulationScheduler({1: 2, 3: 3}), record, record_window],
                      **quiet())
    trainer.fit(Linear(), loader(48))  # 6 batches per epoch
    # epoch 0: 6 steps of 1; epochs 1-2: 3 steps of 2; epoch 3: 2 steps of 3
    assert steps == [6, 9, 12, 14]
    assert sizes == [1] * 6 + [2] * 6 + [3] * 2
    assert trainer.accumulate_grad_batches == 3  # the last factor stays after fit, as in Lightning


def test_gradient_accumulation_scheduler_matches_a_hand_loop():
    module = Linear()
    Trainer(max_epochs=2, callbacks=[GradientAccumulationScheduler({1: 2})], **quiet()).fit(module, loader(32))
    ref = Linear()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    batches = list(loader(32))
    for x, y in batches:  # epoch 0: a step per batch
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    for i in range(0, 4, 2):  # epoch 1: windows of 2, each loss divided by 2
        for x, y in batches[i:i + 2]:
            (torch.nn.functional.mse_loss(ref(x), y) / 2).backward()
        opt.step()
        opt.zero_grad()
    torch.testing.assert_close(module.layer.weight, ref.layer.weight)


def test_gradient_accumulation_scheduler_refusals():
    with pytest.raises(ValueError, match="Either remove `accumulate_grad_batches`"):
        Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({0: 2})],
                **quiet()).fit(Linear(), loader(16))

    class Manual(Linear):
        automatic_optimization = False

    with pytest.raises(RuntimeError, match="manual optimization"):
        Trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})], **quiet()).fit(Manual(), loader(16))
    with pytest.raises(ValueError, match="Accumulation factor should be an int greater than 0"):
        GradientAccumulationScheduler({0: 0})


# -- under DeepSpeed (one process, the real engine) -------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_deepspeed_refuses_what_it_cannot_do_and_the_summary_counts_zero3_parameters(capsys, monkeypatch):
    from tasktrain import DeepSpeed
    from tasktrain.callbacks import progress

    monkeypatch.setattr(progress, "rich_available", lambda: False)  # the default without rich: ModelSummary's table

    with pytest.raises(ValueError, match="ZeRO stage 3 shards them"):
        Trainer(strategy=DeepSpeed(stage=3), devices=1, max_epochs=1, callbacks=[EMAWeightAveraging()],
                **quiet()).fit(Linear(), loader(16))
    # Lightning's refusals under DeepSpeed (issue 37), at Lightning's points: BaseFinetuning at set-up in any stage
    # (NotImplementedError), a GradientAccumulationScheduler, even a constant one, at train start (RuntimeError: after
    # on_fit_start and the sanity check; the engine is built with the schedule's first window until then)
    class Validated(WithBackbone):
        def validation_step(self, batch, batch_idx):
            pass

    refused = {}
    for stage in ("fit", "validate"):
        with pytest.raises(NotImplementedError) as refused["finetuning"]:
            getattr(Trainer(strategy=DeepSpeed(stage=2), devices=1, max_epochs=1, callbacks=[BackboneFinetuning()],
                            **quiet()), stage)(Validated(), loader(16))
    seen = []
    record = LambdaCallback(on_fit_start=lambda *a: seen.append("fit_start"),
                            on_sanity_check_end=lambda trainer, m: seen.append(
                                trainer.strategy.engine.gradient_accumulation_steps()))
    with pytest.raises(RuntimeError) as refused["accumulation"]:
        Trainer(strategy=DeepSpeed(stage=2), devices=1, max_epochs=2, callbacks=[
            GradientAccumulationScheduler({0: 2, 1: 1}), record], **quiet(num_sanity_val_steps=1)).fit(
            Linear(), loader(16), loader(8))
    assert seen == ["fit_start", 2]
    # Lightning's own callbacks' checks against its DeepSpeedStrategy (they need no engine to refuse): same types,
    # same text (then our hint)
    from types import SimpleNamespace

    from lightning.pytorch import LightningModule, callbacks as lightning_callbacks
    from lightning.pytorch.strategies import DeepSpeedStrategy

    lightning_trainer = SimpleNamespace(strategy=DeepSpeedStrategy(stage=2), accumulate_grad_batches=1)
    lightning_module = LightningModule()
    lightning_module.backbone = torch.nn.Linear(4, 4)
    for name, check in (("accumulation", lambda: lightning_callbacks.GradientAccumulationScheduler(
            {0: 2}).on_train_start(lightning_trainer, lightning_module)),
            ("finetuning", lambda: lightning_callbacks.BackboneFinetuning().setup(
                lightning_trainer, lightning_module, "validate"))):
        with pytest.raises(refused[name].type) as theirs:
            check()
        assert str(refused[name].value).startswith(str(theirs.value).replace("DeepSpeedStrategy", "DeepSpeed"))
    with pytest.raises(ValueError, match="Unfreezer changed which parameters require gradients"):
        DeepSpeed(stage=2).trainable_parameters_changed("Unfreezer")
    capsys.readouterr()
    class Forward(WithBackbone):
        def forward(self, x):
            return self.head(self.backbone(x))

    module = Forward()
    module.example_input_array = torch.zeros(2, 4)
    Trainer(strategy=DeepSpeed(stage=3), devices=1, max_epochs=1, limit_train_batches=1, logger=False,
            enable_progress_bar=False, enable_checkpointing=False).fit(module, loader(16))
    out = capsys.readouterr().out
    # the whole parameters are counted, not the (empty) local shards; the example forward runs (on every rank, as
    # Lightning runs it: ZeRO-3 gathers the parameters there) and gives the sizes
    assert "65        Total params" in out and "In sizes" in out and "| [2, 4]   | [2, 8]" in out
    # Lightning's DeepSpeedSummary column: this device's partition (one device: all of it)
    assert "| Params | Params per Device | Mode" in out and "| 56     | 56                | train" in out


def test_swa_resume_continues_the_average_and_the_swa_schedule(tmp_path):
    def swa():
        return StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2, annealing_strategy="linear")

    saver = LambdaCallback(on_train_epoch_end=lambda trainer, module: trainer.save_checkpoint(str(tmp_path / "e2.ckpt"))
                           if trainer.current_epoch == 2 else None)
    full = BNNet()
    Trainer(max_epochs=4, callbacks=[swa(), saver], **quiet()).fit(full, loader(32))
    ckpt = torch.load(tmp_path / "e2.ckpt", weights_only=True)
    assert ckpt["callbacks"]["StochasticWeightAveraging"]["n_averaged"] == 2  # the starts of epochs 1 and 2
    assert ckpt["callbacks"]["StochasticWeightAveraging"]["scheduler_state"] is not None
    resumed = BNNet()
    trainer = Trainer(max_epochs=4, callbacks=[swa()], **quiet())
    trainer.fit(resumed, loader(32), ckpt_path=str(tmp_path / "e2.ckpt"))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)
    for a, b in zip(resumed.state_dict().values(), full.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_swa_recomputes_batch_norm_over_several_training_loaders():
    """A fit over a dict of loaders: the statistics' pass reads the combined batches (max_size_cycle) the fit read,
    each given to the module as the dict (it iterated the dict's keys before)."""
    class DictNet(BNNet):
        def forward(self, batch):
            return self.norm(self.layer(batch["a"][0] if isinstance(batch, dict) else batch))

        def training_step(self, batch, batch_idx):
            x, y = batch["a"]
            return torch.nn.functional.mse_loss(self(x), y) + 0 * sum(p.sum() for p in batch["b"])

    module = DictNet()
    data = {"a": loader(32), "b": loader(16)}
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)
    Trainer(max_epochs=2, callbacks=[swa], **quiet()).fit(module, data)
    with torch.no_grad():
        pre = [module.layer(x) for x, _ in data["a"]]
    torch.testing.assert_close(module.norm.running_mean, torch.stack([p.mean(0) for p in pre]).mean(0))
