"""Issue 25: Lightning scripts behave as under Lightning 2.6.6 (override detection, the progress bar with several
loaders, names scripts import, ...). The hook call sequences are in tests/test_lightning_hook_order.py."""
import functools
import warnings
from unittest import mock

import pytest
import torch

from helpers import Linear, loader, quiet
from tasktrain import Callback, DataModule, TaskModule, Trainer
from tasktrain.exceptions import MisconfigurationException
from tasktrain.utilities import is_overridden


# -- 1. override detection ------------------------------------------------------------------------------------------
def test_a_hook_set_to_none_is_not_overridden_and_switches_validation_off():
    module = Linear()
    module.validation_step = None
    assert not is_overridden("validation_step", module)
    trainer = Trainer(max_epochs=1, **quiet(num_sanity_val_steps=2))
    trainer.fit(module, loader(16), loader(8))  # with validation_step None: no validation loop, no crash
    assert trainer.global_step == 2 and "val_loss" not in trainer.callback_metrics
    with pytest.raises(MisconfigurationException, match=r"No `validation_step\(\)` method defined to run `Trainer.val"):
        trainer.validate(module, loader(8))
    module.on_train_epoch_end = None  # a base hook switched off: not called, no crash
    Trainer(max_epochs=1, **quiet()).fit(module, loader(8))


def test_wrapped_hooks_are_unwrapped_and_called_once():
    calls = []

    class Counting(Linear):
        def on_train_epoch_start(self):
            calls.append("epoch_start")

    module = Counting()
    assert is_overridden("on_train_epoch_start", module)
    # functools.wraps over a base hook: what it wraps is the base's, so it is not an override
    base_hook = module.on_fit_start
    wrapped = functools.wraps(base_hook)(lambda *a: base_hook(*a))
    module.on_fit_start = wrapped
    assert not is_overridden("on_fit_start", module)
    # a partial (Lightning's test harness) and a Mock(wraps=...) over the override: still one override, called once
    module.on_train_epoch_start = functools.update_wrapper(functools.partial(module.on_train_epoch_start),
                                                           module.on_train_epoch_start)
    assert is_overridden("on_train_epoch_start", module)
    spy = mock.Mock(wraps=module.on_train_epoch_start)
    module.on_train_epoch_start = spy
    assert is_overridden("on_train_epoch_start", module)
    assert not is_overridden("on_train_epoch_end", module, TaskModule)
    module.on_train_epoch_end = mock.Mock()  # a Mock wrapping nothing: not an override (Lightning's rule)
    assert not is_overridden("on_train_epoch_end", module)
    Trainer(max_epochs=2, **quiet()).fit(module, loader(8))
    assert calls == ["epoch_start"] * 2 and spy.call_count == 2
    # a callback's hook wrapped the same way
    cb = Callback()
    cb.on_train_end = mock.Mock(wraps=Callback.on_train_end)
    assert not is_overridden("on_train_end", cb)
    with pytest.raises(ValueError, match="base class"):
        is_overridden("forward", torch.nn.Linear(1, 1))


class _Data(DataModule):
    def train_dataloader(self):
        return loader(8)


def test_datamodule_transfer_hooks_run_instead_of_the_modules_one_set_per_hook():
    seen = []

    class ModuleHooks(Linear):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append("module.before")
            return batch

        def on_after_batch_transfer(self, batch, dataloader_idx):
            seen.append("module.after")
            return batch

    class DataHooks(_Data):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append("datamodule.before")
            return batch

    from tasktrain.trainer.connectors.data_connector import warning_cache

    warning_cache.clear()  # (each warning is said once per process, as Lightning's)
    with pytest.warns(UserWarning) as record:
        Trainer(max_steps=1, **quiet()).fit(ModuleHooks(), datamodule=DataHooks())
    # Lightning decides per hook: the DataModule's where it overrides one (warning: the module's is not run),
    # else the module's (warning: a DataModule was given that does not override it); Lightning's words
    assert seen == ["datamodule.before", "module.after"]
    messages = " | ".join(str(w.message) for w in record)
    assert "You have overridden `on_before_batch_transfer` in both `TaskModule` and `DataModule`. It will use the " \
        "implementation from `DataModule` instance." in messages
    assert "You have overridden `on_after_batch_transfer` in `TaskModule` but have passed in a `DataModule`. It " \
        "will use the implementation from `TaskModule` instance." in messages
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DataModule: no warning (but Lightning's note that Linear's
        warnings.filterwarnings("ignore", "You defined a `validation_step` but have no `val_dataloader`")  # unused
        warnings.filterwarnings("ignore", "The `srun` command is available")  # (a host with SLURM: Lightning's too)
        Trainer(max_steps=1, **quiet()).fit(ModuleHooks(), loader(8))
    assert seen == ["module.before", "module.after"]


# -- 2. the progress bar with several evaluation loaders; get_metrics ------------------------------------------------
class _TwoLoaders(Linear):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]), prog_bar=True)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))


def test_default_progress_bar_with_two_validation_and_test_loaders(tmp_path, capsys):
    from tasktrain import CSVLogger
    from tasktrain.callbacks.progress import TQDMProgressBar

    bar = TQDMProgressBar()
    trainer = Trainer(max_epochs=1, callbacks=[bar], logger=CSVLogger(str(tmp_path)), enable_checkpointing=False)
    trainer.fit(_TwoLoaders(), loader(16), [loader(8), loader(16)])
    metrics = bar.get_metrics(trainer, trainer.module)
    # Lightning's: the logger's version as v_num, then the prog_bar values
    assert metrics["v_num"] == 0 and set(metrics) == {"v_num", "val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"}
    out = capsys.readouterr().out
    assert "Epoch 0" in out and "v_num=0" in out
    assert "Validation DataLoader 0" in out and "Validation DataLoader 1" in out
    results = trainer.test(_TwoLoaders(), [loader(8), loader(8)], verbose=False)
    assert len(results) == 2 and "Testing DataLoader 1" in capsys.readouterr().out


def test_progress_bar_get_metrics_keeps_epoch_end_values_and_warns_on_v_num():
    from tasktrain.callbacks.progress import TQDMProgressBar

    class EpochMetrics(Linear):
        def training_step(self, batch, batch_idx):
            self.log_dict({"step_metric": torch.tensor(-1.0), "shared_metric": 100.0}, logger=False, prog_bar=True)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self):
            self.log_dict({f"epoch_metric_{self.current_epoch}": float(self.current_epoch), "shared_metric": 111.0},
                          logger=False, prog_bar=True)

    bar = TQDMProgressBar()
    trainer = Trainer(max_epochs=3, callbacks=[bar], logger=False, enable_checkpointing=False)
    trainer.fit(EpochMetrics(), loader(16))
    metrics = bar.get_metrics(trainer, trainer.module)
    assert metrics["step_metric"] == -1 and metrics["shared_metric"] == 111
    assert [metrics[f"epoch_metric_{i}"] for i in range(3)] == [0, 1, 2] and "v_num" not in metrics

    class Override(TQDMProgressBar):
        def get_metrics(self, trainer, module):
            items = super().get_metrics(trainer, module)
            items.pop("v_num", None)
            return items

    class LogsVNum(Linear):
        def training_step(self, batch, batch_idx):
            self.log("v_num", 5.0, prog_bar=True)
            return super().training_step(batch, batch_idx)

    from tasktrain import CSVLogger

    with pytest.warns(UserWarning, match="already tracks a metric with the name"):
        Trainer(max_epochs=1, callbacks=[TQDMProgressBar()], enable_checkpointing=False,
                logger=CSVLogger(__import__("tempfile").mkdtemp())).fit(LogsVNum(), loader(8))
    override = Override()
    trainer = Trainer(max_epochs=1, callbacks=[override], enable_checkpointing=False,
                      logger=CSVLogger(__import__("tempfile").mkdtemp()))
    trainer.fit(Linear(), loader(8))
    assert "v_num" not in override.get_metrics(trainer, trainer.module)


# -- 3. training_step without batch_idx ---------------------------------------------------------------------------
# (Manual optimisation on 2 DDP processes, a GAN with two optimizers, and the other facts of
# ddp_scripts/lightning_compat_ddp.py are tested in tests/test_lightning_ddp.py: its one launch runs them first.)
def test_a_dataloader_iter_step_is_refused_before_training():
    class Iterating(Linear):
        def training_step(self, dataloader_iter):
            raise AssertionError("not reached")

    with pytest.raises(NotImplementedError, match=r"training_step\(self, dataloader_iter\): tasktrain does not run"):
        Trainer(max_epochs=1, **quiet()).fit(Iterating(), loader(8))


def test_step_methods_without_batch_idx_get_the_batch_alone():
    seen = []

    class NoIndex(Linear):
        def training_step(self, batch):
            seen.append("train")
            return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

        def validation_step(self, batch):
            seen.append("val")

        def predict_step(self, batch):
            return self(batch[0])

    class OtherNames(Linear):
        def training_step(self, x1, batch_nb1):  # any names: two parameters get the batch index
            assert isinstance(batch_nb1, int)
            seen.append(batch_nb1)
            return torch.nn.functional.mse_loss(self(x1[0]), x1[1])

    Trainer(max_epochs=1, **quiet()).fit(NoIndex(), loader(16), loader(8))
    assert seen == ["train", "train", "val"]
    assert len(Trainer(**quiet()).predict(NoIndex(), loader(16))) == 2
    seen.clear()
    Trainer(max_epochs=1, **quiet()).fit(OtherNames(), loader(16))
    assert seen == [0, 1]


# -- 4. torchmetrics Metric objects in self.log -------------------------------------------------------------------
class _Classifier(TaskModule):
    """Lightning's torchmetrics pattern: a metric per stage as attributes, the step calls it, self.log gets it."""

    def __init__(self):
        super().__init__()
        import torchmetrics

        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 3)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
        self.val_mae = torchmetrics.MeanAbsoluteError()
        self.val_batches = []

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.train_acc(logits, y)  # forward: updates the state, returns the batch's accuracy
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
        return torch.nn.functional.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_batches.append((logits.detach().clone(), y.clone()))
        self.val_acc.update(logits, y)  # update alone: nothing on_step, the epoch's value at its end
        self.val_mae(logits.argmax(-1).float(), y.float())
        self.log("val_acc", self.val_acc, metric_attribute="val_acc")
        self.log("val_mae", self.val_mae, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _class_data(n=24, seed=0):
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)),
                      batch_size=8)


def test_torchmetrics_metric_objects_are_logged_as_lightning_logs_them():
    pytest.importorskip("torchmetrics")  # the optional extra: requirements-dev.txt pins it, so the tests run it
    module = _Classifier()
    seen = {}

    class Watch(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.setdefault("step", []).append(float(trainer.callback_metrics["train_acc"]))
            seen.setdefault("forward", []).append(float(module.train_acc._forward_cache))

    trainer = Trainer(max_epochs=2, callbacks=[Watch()], **quiet())
    trainer.fit(module, _class_data(), _class_data(16, seed=1))
    # on_step: the value of each step's forward
    assert seen["step"] == seen["forward"] and len(seen["step"]) == 6
    # on_epoch: compute() over the epoch, then reset (the state is empty again after each epoch)
    logits, y = torch.cat([b[0] for b in module.val_batches[-2:]]), torch.cat([b[1] for b in module.val_batches[-2:]])
    assert float(trainer.callback_metrics["val_acc"]) == pytest.approx(float((logits.argmax(-1) == y).float().mean()))
    assert float(trainer.callback_metrics["val_mae"]) == pytest.approx(
        float((logits.argmax(-1).float() - y.float()).abs().mean()))
    assert {"train_acc", "train_acc_epoch", "val_acc", "val_mae"} <= set(trainer.callback_metrics)
    assert int(module.val_acc.tp.sum() + module.val_acc.fn.sum()) == 0 and module.train_acc._update_count == 0
    results = trainer.validate(module, _class_data(16, seed=1), verbose=False)
    assert results[0]["val_acc"] == pytest.approx(float(trainer.callback_metrics["val_acc"]))

    class Wrong(_Classifier):
        def validation_step(self, batch, batch_idx):
            self.val_acc.update(self(batch[0]), batch[1])
            self.log("val_acc", self.val_acc, metric_attribute="train_acc")

    with pytest.raises(ValueError, match="is not self.train_acc"):
        Trainer(max_epochs=1, **quiet()).validate(Wrong(), _class_data())


# -- 6. names real scripts import ------------------------------------------------------------------------------------
def test_lightning_core_and_trainer_paths():
    import tasktrain
    from tasktrain.core import DataModule as CoreDataModule, TaskModule as CoreTaskModule
    from tasktrain.core.datamodule import DataModule as DeepDataModule
    from tasktrain.core.module import TaskModule as DeepTaskModule
    from tasktrain.trainer import Trainer as TrainerFromPackage, seed_everything
    from tasktrain.trainer.states import RunningStage, TrainerFn, TrainerStatus

    assert CoreTaskModule is DeepTaskModule is tasktrain.TaskModule
    assert CoreDataModule is DeepDataModule is tasktrain.DataModule
    assert TrainerFromPackage is tasktrain.Trainer and seed_everything is tasktrain.seed_everything
    assert TrainerFn.FITTING == "fit" and RunningStage.SANITY_CHECKING == "sanity_check"
    assert TrainerStatus.FINISHED.stopped and not TrainerStatus.RUNNING.stopped


def test_trainer_state_is_lightnings_and_stays_out_of_checkpoints(tmp_path):
    stages = []

    class Stages(Linear):
        def training_step(self, batch, batch_idx):
            stages.append((self.trainer.state.fn, self.trainer.state.stage, self.trainer.state.status))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            stages.append((self.trainer.state.fn, self.trainer.state.stage, self.trainer.sanity_checking))
            super().validation_step(batch, batch_idx)

        def predict_step(self, batch, batch_idx):
            stages.append((self.trainer.state.fn, self.trainer.state.stage, self.trainer.predicting))
            return self(batch[0])

    trainer = Trainer(max_epochs=1, **quiet(num_sanity_val_steps=1))
    assert trainer.state.status == "initializing" and trainer.state.fn is None and not trainer.state.finished
    module = Stages()
    trainer.fit(module, loader(8), loader(8))
    assert stages == [("fit", "sanity_check", True), ("fit", "train", "running"), ("fit", "validate", False)]
    assert trainer.state.finished and trainer.state.status == "finished" and trainer.state.stage is None
    assert trainer.state.fn == "fit" and not trainer.training and trainer.state.global_step == 1
    stages.clear()
    trainer.predict(module, loader(8))
    assert stages == [("predict", "predict", True)] and trainer.state.fn == "predict" and trainer.state.finished
    path = str(tmp_path / "a.ckpt")
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["loops"]["train_state"]
    assert not {"status", "fn", "stage"} & set(saved) and saved["global_step"] == 1

    class Failing(Linear):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    trainer.max_epochs = 2  # (a second fit goes on from epoch 1, as Lightning's: it trains only with more epochs)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(), loader(8))
    assert trainer.state.status == "interrupted" and trainer.state.stopped and not trainer.state.finished


def test_load_from_checkpoint_calls_configure_model_and_datamodule_load_from_checkpoint(tmp_path):
    calls = []

    class Built(Linear):
        def configure_model(self):
            calls.append("configure_model")
            if not hasattr(self, "head"):
                self.head = torch.nn.Linear(1, 1)

        def on_load_checkpoint(self, checkpoint):
            calls.append("on_load_checkpoint")

    class Data(DataModule):
        def __init__(self, batch_size: int = 8):
            super().__init__()
            self.save_hyperparameters()
            self.position = 0

        def train_dataloader(self):
            return loader(16, batch_size=self.hparams.batch_size)

        def state_dict(self):
            return {"position": 7}

        def load_state_dict(self, state_dict):
            calls.append(("datamodule.load_state_dict", state_dict))
            self.position = state_dict["position"]

    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(Built(), datamodule=Data(batch_size=4))
    path = str(tmp_path / "m.ckpt")
    trainer.save_checkpoint(path)
    calls.clear()
    module = Built.load_from_checkpoint(path)  # the head configure_model makes is in the state dict: it loads
    assert calls == ["configure_model", "on_load_checkpoint"] and hasattr(module, "head")
    calls.clear()
    data = Data.load_from_checkpoint(path)
    assert data.hparams.batch_size == 4 and data.position == 7
    assert calls == [("datamodule.load_state_dict", {"position": 7})]
    assert Data.load_from_checkpoint(path, batch_size=2).hparams.batch_size == 2
    with pytest.raises(TypeError, match="not arguments of Data.__init__"):
        Data.load_from_checkpoint(path, shuffle=True)


def test_clip_gradients_override_runs_at_each_step_with_the_trainers_values():
    # Lightning's default configure_gradient_clipping calls self.clip_gradients with the Trainer's values: an
    # override of clip_gradients alone is what clips (in place of the Trainer's own GradientClipping)
    calls = []

    class OwnClipping(Linear):
        def clip_gradients(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            calls.append((gradient_clip_val, gradient_clip_algorithm, all(p.grad is not None for p in self.parameters())))
            # (another value than the Trainer's would be Lightning's MisconfigurationException: use only one)
            return super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    Trainer(max_steps=3, gradient_clip_val=0.25, gradient_clip_algorithm="value", **quiet()).fit(OwnClipping(), loader(8))
    assert calls == [(0.25, "value", True)] * 3


# -- the module's optimization hooks (issue 37): called as Lightning calls them ------------------------------------
class _WarmUp(Linear):
    """Lightning's documented learning-rate warm-up in optimizer_step, with accumulation and clipping on."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < 5:  # global_step counts the step just taken (Lightning's)
            for group in optimizer.param_groups:
                group["lr"] = min(1.0, float(self.trainer.global_step + 1) / 5) * self.hparams.lr


def _hand_written_warm_up(epochs, accumulate, clip):
    """The same run as a plain torch loop: windows of `accumulate` batches of 8 (losses divided by `accumulate`, the
    last, short window's too: Lightning's),
    clipping by norm, the warm-up after each step."""
    data = list(loader(40))  # 5 batches an epoch: windows of 2, 2, 1
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    for _ in range(epochs):
        for first in range(0, len(data), accumulate):
            window = data[first:first + accumulate]
            optimizer.zero_grad()
            for x, y in window:
                (torch.nn.functional.mse_loss(model(x), y) / accumulate).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            step += 1
            if step < 5:
                for group in optimizer.param_groups:
                    group["lr"] = min(1.0, float(step + 1) / 5) * 0.1
    return [p.detach().clone() for p in model.parameters()], step


def test_optimizer_step_warm_up_trains_as_a_hand_written_loop():
    module = _WarmUp()
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=0.3, **quiet())
    trainer.fit(module, loader(40))
    expected, steps = _hand_written_warm_up(epochs=2, accumulate=2, clip=0.3)
    assert trainer.global_step == steps == 6
    for got, want in zip(module.parameters(), expected):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-6)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)


def test_optimization_hooks_order_arguments_and_a_step_skipped_by_the_hook():
    calls = []

    class Hooked(Linear):
        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            calls.append(("zero_grad", epoch, batch_idx))
            optimizer.zero_grad()

        def backward(self, loss, *args, **kwargs):
            calls.append(("backward", round(float(loss.detach()), 6)))
            loss.backward(*args, **kwargs)

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            calls.append(("clip", gradient_clip_val, gradient_clip_algorithm))

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            calls.append(("step", epoch, batch_idx))
            if batch_idx == 3:  # a skipped step: the closure still runs (training_step and backward), no update
                optimizer_closure()
                return
            optimizer.step(closure=optimizer_closure)

    module = Hooked()
    before = [p.detach().clone() for p in module.parameters()]
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=2.0, **quiet())
    trainer.fit(module, loader(32))  # 4 batches: windows (0, 1), (2, 3)
    kinds = [c[0] for c in calls]
    # batch 0: the closure (zero_grad at the window's first, backward); batch 1: optimizer_step, whose
    # optimizer.step runs the closure, then the clipping; batches 2 and 3 the same, the step skipped by the hook
    assert kinds == ["zero_grad", "backward", "step", "backward", "clip", "zero_grad", "backward", "step", "backward"]
    assert ("zero_grad", 0, 0) in calls and ("zero_grad", 0, 2) in calls and ("clip", 2.0, None) in calls
    assert trainer.global_step == 1  # the second window's hook did not step
    assert not all(torch.equal(a, b) for a, b in zip(before, module.parameters()))

    class Forgetful(Linear):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            pass  # neither steps nor runs the closure

    with pytest.raises(MisconfigurationException, match="The closure hasn't been executed.*did not run the closure"):
        Trainer(max_steps=1, **quiet()).fit(Forgetful(), loader(8))


def test_backward_override_runs_under_a_context_and_deepspeed_refuses_it():
    entered = []

    class UnderContext(Linear):
        def backward(self, loss, *args, **kwargs):
            # what Lightning's tensor-parallel example does with loss_parallel(): backward inside a context
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                entered.append(float(loss))
                loss.backward(*args, **kwargs)

    module = UnderContext()
    reference = Linear()
    Trainer(max_steps=2, **quiet()).fit(module, loader(16))
    Trainer(max_steps=2, **quiet()).fit(reference, loader(16))
    assert len(entered) == 2
    for a, b in zip(module.parameters(), reference.parameters()):
        assert torch.equal(a, b)  # the override's backward is the backward: same training

    from tasktrain import DeepSpeed

    with pytest.raises(NotImplementedError, match="overrides backward, but DeepSpeed's engine runs the backward"):
        Trainer(strategy=DeepSpeed(stage=2), devices=1, max_steps=1, **quiet()).fit(UnderContext(), loader(8))
