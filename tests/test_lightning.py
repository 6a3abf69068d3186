"""Issue 17 (core): a Lightning script runs after renames alone; every hook is called or refused; DataModules."""
import importlib
import os

import pytest
import torch

from helpers import Linear, loader, quiet
from tasktrain import TaskModule, Trainer
from tasktrain.exceptions import MisconfigurationException


def test_rename_rule_module_paths():
    # every Lightning module path a script imports from, under the same name
    for path, names in {
        "tasktrain.utilities": ["rank_zero_only", "rank_zero_info", "rank_zero_warn", "rank_zero_debug",
                                "is_overridden", "move_data_to_device", "grad_norm", "AttributeDict"],
        "tasktrain.utilities.rank_zero": ["rank_zero_only", "rank_zero_info", "rank_zero_warn"],
        "tasktrain.utilities.types": ["STEP_OUTPUT", "OptimizerLRScheduler", "EVAL_DATALOADERS"],
        "tasktrain.callbacks.early_stopping": ["EarlyStopping", "EarlyStoppingReason"],
        "tasktrain.loggers": ["TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger"],
        "tasktrain.callbacks": ["Callback", "ModelCheckpoint", "EarlyStopping", "LearningRateMonitor"],
        "tasktrain": ["TaskModule", "Trainer", "Callback", "seed_everything"],
    }.items():
        module = importlib.import_module(path)
        for name in names:
            assert hasattr(module, name), f"{path}.{name} is missing"


def test_rank_zero_only_follows_the_trainer_rank(monkeypatch):
    from tasktrain.utilities import rank_zero_only

    calls = []

    @rank_zero_only
    def note(x):
        calls.append(x)
        return x

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert note(1) is None and calls == []
    assert rank_zero_only(lambda: 1, default=7)() == 7
    Trainer(max_steps=1, **quiet()).fit(Linear(), loader(8))  # one process: the trainer sets rank 0
    assert rank_zero_only.rank == 0 and note(2) == 2 and calls == [2]


def test_move_data_to_device_and_grad_norm():
    from tasktrain.utilities import grad_norm, move_data_to_device

    moved = move_data_to_device({"a": [torch.ones(2)], "b": 3}, "cpu")
    assert moved["b"] == 3 and moved["a"][0].device.type == "cpu"
    module = Linear()
    module(torch.ones(2, 4)).sum().backward()
    norms = grad_norm(module, 2)
    expected = torch.cat([p.grad.flatten() for p in module.parameters()]).norm()
    assert set(norms) == {"grad_2.0_norm/layer.weight", "grad_2.0_norm/layer.bias", "grad_2.0_norm_total"}
    assert torch.allclose(norms["grad_2.0_norm_total"], expected)
    with pytest.raises(ValueError, match="positive"):
        grad_norm(module, 0)


class _Scores(Linear):
    def __init__(self, scores):
        super().__init__()
        self.scores = scores

    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.scores[self.current_epoch]))


@pytest.mark.parametrize("scores,kwargs,reason", [
    ([3, 3, 3, 3], {"patience": 2}, "PATIENCE_EXHAUSTED"),
    ([3, 0.5, 3, 3], {"stopping_threshold": 1.0}, "STOPPING_THRESHOLD"),
    ([3, 50, 3, 3], {"divergence_threshold": 10.0}, "DIVERGENCE_THRESHOLD"),
    ([3, float("nan"), 3, 3], {}, "NON_FINITE_METRIC"),
    ([3, 2, 1, 0], {}, "NOT_STOPPED"),
])
def test_early_stopping_reason(scores, kwargs, reason):
    from tasktrain.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason

    stopper = EarlyStopping("score", verbose=False, **kwargs)
    Trainer(max_epochs=4, callbacks=[stopper], **quiet()).fit(_Scores(scores), loader(16), loader(8))
    assert stopper.stopping_reason is EarlyStoppingReason[reason]
    assert stopper.stopping_reason_message == stopper.reason
    assert (stopper.reason is None) == (reason == "NOT_STOPPED")
    again = EarlyStopping("score")
    again.load_state_dict(stopper.state_dict())
    assert again.stopping_reason is stopper.stopping_reason and again.stopping_reason_message == stopper.reason


def test_lightning_module_alias():
    trainer = Trainer(max_steps=1, **quiet())
    module = Linear()
    trainer.fit(module, loader(8))
    assert trainer.lightning_module is module is trainer.module


# -- hook coverage ------------------------------------------------------------------------------------------------
# Lightning 2.6.6's overridable hooks, read from its source (pytorch_lightning/core/hooks.py: ModelHooks, DataHooks,
# CheckpointHooks; core/module.py: LightningModule; callbacks/callback.py: Callback; core/datamodule.py), with
# (required arguments, optional arguments) after self. Kept here as data: installing pytorch-lightning for a test
# would pull torchmetrics and a second copy of the loop into the test environment.
LIGHTNING_MODULE_HOOKS = {
    "on_fit_start": ((), ()), "on_fit_end": ((), ()), "on_train_start": ((), ()), "on_train_end": ((), ()),
    "on_validation_start": ((), ()), "on_validation_end": ((), ()), "on_test_start": ((), ()),
    "on_test_end": ((), ()), "on_predict_start": ((), ()), "on_predict_end": ((), ()),
    "on_train_batch_start": (("batch", "batch_idx"), ()),
    "on_train_batch_end": (("outputs", "batch", "batch_idx"), ()),
    "on_validation_batch_start": (("batch", "batch_idx"), ("dataloader_idx",)),
    "on_validation_batch_end": (("outputs", "batch", "batch_idx"), ("dataloader_idx",)),
    "on_test_batch_start": (("batch", "batch_idx"), ("dataloader_idx",)),
    "on_test_batch_end": (("outputs", "batch", "batch_idx"), ("dataloader_idx",)),
    "on_predict_batch_start": (("batch", "batch_idx"), ("dataloader_idx",)),
    "on_predict_batch_end": (("outputs", "batch", "batch_idx"), ("dataloader_idx",)),
    "on_validation_model_zero_grad": ((), ()), "on_validation_model_eval": ((), ()),
    "on_validation_model_train": ((), ()), "on_test_model_eval": ((), ()), "on_test_model_train": ((), ()),
    "on_predict_model_eval": ((), ()),
    "on_train_epoch_start": ((), ()), "on_train_epoch_end": ((), ()), "on_validation_epoch_start": ((), ()),
    "on_validation_epoch_end": ((), ()), "on_test_epoch_start": ((), ()), "on_test_epoch_end": ((), ()),
    "on_predict_epoch_start": ((), ()), "on_predict_epoch_end": ((), ()),
    "on_before_zero_grad": (("optimizer",), ()), "on_before_backward": (("loss",), ()),
    "on_after_backward": ((), ()), "on_before_optimizer_step": (("optimizer",), ()),
    "configure_sharded_model": ((), ()), "configure_model": ((), ()),
    "prepare_data": ((), ()), "setup": (("stage",), ()), "teardown": (("stage",), ()),
    "train_dataloader": ((), ()), "val_dataloader": ((), ()), "test_dataloader": ((), ()),
    "predict_dataloader": ((), ()),
    "transfer_batch_to_device": (("batch", "device", "dataloader_idx"), ()),
    "on_before_batch_transfer": (("batch", "dataloader_idx"), ()),
    "on_after_batch_transfer": (("batch", "dataloader_idx"), ()),
    "on_load_checkpoint": (("checkpoint",), ()), "on_save_checkpoint": (("checkpoint",), ()),
    "forward": (("x",), ()), "training_step": (("batch", "batch_idx"), ()),
    "validation_step": (("batch", "batch_idx"), ()), "test_step": (("batch", "batch_idx"), ()),
    "predict_step": (("batch", "batch_idx"), ()), "configure_callbacks": ((), ()),
    "configure_optimizers": ((), ()), "backward": (("loss",), ()),
    "configure_gradient_clipping": (("optimizer",), ("gradient_clip_val", "gradient_clip_algorithm")),
    "lr_scheduler_step": (("scheduler", "metric"), ()),
    "optimizer_step": (("epoch", "batch_idx", "optimizer"), ("optimizer_closure",)),
    "optimizer_zero_grad": (("epoch", "batch_idx", "optimizer"), ()),
}
LIGHTNING_CALLBACK_HOOKS = {
    "setup": 3, "teardown": 3, "on_fit_start": 2, "on_fit_end": 2, "on_sanity_check_start": 2,
    "on_sanity_check_end": 2, "on_train_batch_start": 4, "on_train_batch_end": 5, "on_train_epoch_start": 2,
    "on_train_epoch_end": 2, "on_validation_epoch_start": 2, "on_validation_epoch_end": 2,
    "on_test_epoch_start": 2, "on_test_epoch_end": 2, "on_predict_epoch_start": 2, "on_predict_epoch_end": 2,
    "on_validation_batch_start": (4, 5), "on_validation_batch_end": (5, 6), "on_test_batch_start": (4, 5),
    "on_test_batch_end": (5, 6), "on_predict_batch_start": (4, 5), "on_predict_batch_end": (5, 6),
    "on_train_start": 2, "on_train_end": 2, "on_validation_start": 2, "on_validation_end": 2, "on_test_start": 2,
    "on_test_end": 2, "on_predict_start": 2, "on_predict_end": 2, "on_exception": 3, "state_dict": 0,
    "load_state_dict": 1, "on_save_checkpoint": 3, "on_load_checkpoint": 3, "on_before_backward": 3,
    "on_after_backward": 2, "on_before_optimizer_step": 3, "on_before_zero_grad": 3,
}
# Refused at fit() start with what to do instead (docs/lightning.md says why): Lightning deprecated it.
REFUSED_MODULE_HOOKS = {"configure_sharded_model"}


class _Full(Linear):
    """A module with its own loaders and a scheduler: every entry point runs without arguments."""

    def train_dataloader(self):
        return loader(16)

    def val_dataloader(self):
        return loader(8)

    def test_dataloader(self):
        return loader(8)

    def predict_dataloader(self):
        return loader(8)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}


def _recording(base, names, calls):
    def make(name):
        def hook(self, *args, **kwargs):
            calls.setdefault(name, []).append(len(args) + len(kwargs))
            inner = getattr(super(cls, self), name, None)
            return inner(*args, **kwargs) if inner is not None else None
        return hook

    cls = type(f"Recording{base.__name__}", (base,), {name: make(name) for name in names})
    return cls


def _arity_ok(name, counts, spec):
    low, high = (spec, spec) if isinstance(spec, int) else spec
    return all(low <= n <= high for n in counts), f"{name} was called with {sorted(set(counts))} arguments"


def _all_entry_points(module, callbacks=(), tmp="."):
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1,
                      callbacks=list(callbacks), logger=False, enable_progress_bar=False, default_root_dir=tmp)
    trainer.fit(module)
    trainer.save_checkpoint("full.ckpt")
    Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, callbacks=list(callbacks), logger=False,
            enable_progress_bar=False, default_root_dir=tmp).fit(module, ckpt_path="full.ckpt")
    trainer.validate(module, ckpt_path="full.ckpt")
    trainer.test(module)
    trainer.predict(module)
    return trainer


def test_every_lightning_module_hook_is_called_with_its_arguments_or_refused(tmp_path):
    called = [n for n in LIGHTNING_MODULE_HOOKS if n not in REFUSED_MODULE_HOOKS]
    calls = {}
    _all_entry_points(_recording(_Full, called, calls)(), tmp=str(tmp_path))
    for name in called:
        assert name in calls, f"LightningModule.{name} is overridden but never called"
        required, optional = LIGHTNING_MODULE_HOOKS[name]
        ok, why = _arity_ok(name, calls[name], (len(required), len(required) + len(optional)))
        assert ok, why
    for name in REFUSED_MODULE_HOOKS:
        calls = {}
        module = _recording(_Full, [name], calls)()
        with pytest.raises(NotImplementedError, match=f"overrides {name}, which tasktrain does not call: .+"):
            Trainer(max_epochs=1, **quiet()).fit(module)
        assert not calls


def test_every_lightning_callback_hook_is_called_with_its_arguments(tmp_path):
    from tasktrain import Callback

    class Stateful(Callback):  # (Lightning calls load_state_dict with a saved state that is not empty only)
        def state_dict(self):
            return {"seen": 1}

    calls = {}
    recorder = _recording(Stateful, LIGHTNING_CALLBACK_HOOKS, calls)()
    _all_entry_points(_Full(), [recorder], tmp=str(tmp_path))

    class Failing(_Full):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Trainer(max_epochs=1, callbacks=[recorder], **quiet()).fit(Failing())
    for name, spec in LIGHTNING_CALLBACK_HOOKS.items():
        assert name in calls, f"Callback.{name} is overridden but never called"
        ok, why = _arity_ok(name, calls[name], spec)
        assert ok, why


def test_on_train_batch_start_minus_one_ends_the_epoch():
    class SkipRest(Linear):
        def __init__(self):
            super().__init__()
            self.seen, self.epoch_ends = [], 0

        def on_train_batch_start(self, batch, batch_idx):
            self.seen.append((self.current_epoch, batch_idx))
            return -1 if batch_idx == 1 else None

        def on_train_epoch_end(self):
            self.epoch_ends += 1

    module = SkipRest()
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(module, loader(32))  # 4 batches an epoch: batch 0 trains, batch 1 ends the epoch
    assert module.seen == [(0, 0), (0, 1), (1, 0), (1, 1)] and module.epoch_ends == 2
    assert trainer.global_step == 2 and trainer.current_epoch == 2


def test_current_epoch_after_early_stopping_is_lightnings():
    # Lightning counts the finished epochs: stopping at the end of epoch index 1 leaves current_epoch == 2
    from tasktrain.callbacks.early_stopping import EarlyStopping

    stopper = EarlyStopping("score", patience=1, verbose=False)
    trainer = Trainer(max_epochs=5, callbacks=[stopper], **quiet())
    trainer.fit(_Scores([3, 3, 3, 3, 3]), loader(16), loader(8))
    assert stopper.stopped_epoch == 1 and trainer.current_epoch == 2


def test_configure_callbacks_replace_the_trainers_of_the_same_type(tmp_path):
    from tasktrain import ModelCheckpoint

    mine = ModelCheckpoint(dirpath=str(tmp_path / "mine"))

    class WithCallbacks(Linear):
        def configure_callbacks(self):
            return [mine]

    trainer = Trainer(max_epochs=1, logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(WithCallbacks(), loader(8))
    assert trainer.checkpoint_callbacks == [mine] and trainer.callbacks[-1] is mine
    assert os.listdir(tmp_path / "mine")


def test_transfer_hooks_see_the_batch_in_order():
    order = []

    class Hooks(Linear):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            order.append(("before", dataloader_idx))
            return [batch[0] * 0, batch[1]]

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            order.append(("transfer", device.type))
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            order.append(("after", bool((batch[0] == 0).all())))
            return batch

    Trainer(max_steps=1, **quiet()).fit(Hooks(), loader(8))
    assert order == [("before", 0), ("transfer", "cpu"), ("after", True)]


def test_lr_scheduler_step_hook_steps_the_scheduler():
    class Custom(_Full):
        stepped = 0

        def lr_scheduler_step(self, scheduler, metric):
            type(self).stepped += 1
            assert metric is None
            scheduler.step()

    module = Custom()
    Trainer(max_epochs=2, limit_train_batches=1, **quiet()).fit(module)
    assert Custom.stepped == 2 and module.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01 * 0.1 ** 2)


def test_prepare_data_runs_once_before_setup_and_configure_model_before_the_optimizer():
    order = []

    class Prepared(Linear):
        def prepare_data(self):
            order.append("prepare_data")

        def setup(self, stage):
            order.append(f"setup:{stage.value}")  # (str(stage) is "TrainerFn.FITTING", as Lightning's)

        def configure_model(self):
            order.append("configure_model")
            if not hasattr(self, "head"):
                self.head = torch.nn.Linear(1, 1)

        def configure_optimizers(self):
            order.append("configure_optimizers")
            assert hasattr(self, "head")
            return super().configure_optimizers()

    Trainer(max_steps=1, **quiet()).fit(Prepared(), loader(8))
    assert order == ["prepare_data", "setup:fit", "configure_model", "configure_optimizers"]


# -- DataModule -----------------------------------------------------------------------------------------------------
LIGHTNING_DATAMODULE_HOOKS = {
    "prepare_data": 0, "setup": 1, "teardown": 1, "train_dataloader": 0, "val_dataloader": 0, "test_dataloader": 0,
    "predict_dataloader": 0, "transfer_batch_to_device": 3, "on_before_batch_transfer": 2,
    "on_after_batch_transfer": 2, "state_dict": 0, "load_state_dict": 1, "on_exception": 1,
}


class _Data(__import__("tasktrain").DataModule):
    def __init__(self, n=16):
        super().__init__()
        self.n, self.epochs_seen = n, 0

    def setup(self, stage):
        self.stage = stage

    def train_dataloader(self):
        return loader(self.n)

    def val_dataloader(self):
        return loader(8)

    def test_dataloader(self):
        return loader(8)

    def predict_dataloader(self):
        return loader(8)

    def state_dict(self):
        return {"epochs_seen": self.epochs_seen}

    def load_state_dict(self, state_dict):
        self.epochs_seen = state_dict["epochs_seen"]


def test_every_lightning_datamodule_hook_is_called(tmp_path):
    calls = {}
    data = _recording(_Data, LIGHTNING_DATAMODULE_HOOKS, calls)()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, num_sanity_val_steps=1, logger=False,
                      enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(Linear(), datamodule=data)
    trainer.save_checkpoint("dm.ckpt")
    Trainer(max_epochs=2, limit_train_batches=2, logger=False, enable_progress_bar=False,
            default_root_dir=str(tmp_path)).fit(Linear(), datamodule=data, ckpt_path="dm.ckpt")
    trainer.validate(Linear(), datamodule=data)
    trainer.test(Linear(), datamodule=data)
    trainer.predict(Linear(), datamodule=data)

    class Failing(Linear):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Trainer(max_epochs=1, **quiet()).fit(Failing(), datamodule=data)
    for name, count in LIGHTNING_DATAMODULE_HOOKS.items():
        assert name in calls, f"DataModule.{name} is overridden but never called"
        assert set(calls[name]) == {count}, f"DataModule.{name} was called with {calls[name]} arguments"


def test_datamodule_entry_points_state_and_rules(tmp_path):
    from tasktrain import DataModule

    data = _Data(32)
    module = Linear()
    trainer = Trainer(max_epochs=1, **quiet(default_root_dir=str(tmp_path)))
    trainer.fit(module, data)  # a DataModule where the loaders go is the datamodule
    assert trainer.datamodule is data and data.trainer is trainer and data.stage == "fit"
    assert trainer.num_training_batches == 4  # its train_dataloader, not the module's (it has none)
    data.epochs_seen = 5
    trainer.save_checkpoint("a.ckpt")
    assert torch.load("a.ckpt", weights_only=False)["_Data"] == {"epochs_seen": 5}
    # trainer.datamodule stays, but a run given no DataModule takes the module's loaders (Lightning's loop sources):
    # this module has no test_dataloader, Lightning's error (checked beside Lightning in test_lightning_beside_connectors)
    with pytest.raises(MisconfigurationException, match="`test_dataloader` must be implemented"):
        trainer.test(module)
    assert trainer.datamodule is data
    result = trainer.test(module, datamodule=data)  # (no module checkpoint: "best", as Lightning)
    assert data.stage == "test" and "test_loss" in result[0]
    assert len(trainer.predict(module, datamodule=data)) == 1
    with pytest.raises(ValueError, match="both dataloaders and a datamodule"):
        trainer.fit(module, loader(8), datamodule=data)
    with pytest.raises(TypeError, match="tasktrain.DataModule"):
        trainer.fit(module, datamodule=object())
    assert isinstance(data, DataModule)


def test_datamodule_transfer_hooks_win_over_the_modules():
    seen = []

    class ModuleHooks(Linear):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append("module")
            return batch

    class DataHooks(_Data):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append("datamodule")
            return batch

    Trainer(max_steps=1, **quiet()).fit(ModuleHooks(), datamodule=DataHooks())
    assert seen == ["datamodule"]


def test_prepare_data_per_node_and_setup_order():
    order = []

    class Ordered(_Data):
        def prepare_data(self):
            order.append("dm.prepare_data")

        def setup(self, stage):
            order.append("dm.setup")

        def teardown(self, stage):
            order.append("dm.teardown")

    class M(Linear):
        def prepare_data(self):
            order.append("module.prepare_data")

        def setup(self, stage):
            order.append("module.setup")

        def teardown(self, stage):
            order.append("module.teardown")

    Trainer(max_steps=1, **quiet()).fit(M(), datamodule=Ordered())
    assert order == ["dm.prepare_data", "module.prepare_data", "dm.setup", "module.setup", "dm.teardown",
                     "module.teardown"]


# -- several evaluation loaders ---------------------------------------------------------------------------------------
class _TwoLoaders(Linear):
    def __init__(self):
        super().__init__()
        self.seen = []

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.seen.append(("val", dataloader_idx, batch_idx))
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))
        if dataloader_idx == 1:  # (one loader per unsuffixed name: Lightning refuses the same name from two)
            self.log("shared", float(batch_idx), add_dataloader_idx=False)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y) * (dataloader_idx + 1))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen.append(("end", dataloader_idx, batch_idx))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return torch.full((batch[0].shape[0],), float(dataloader_idx))


def test_several_validation_loaders_get_dataloader_idx_and_metric_suffixes():
    module = _TwoLoaders()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(module, loader(16), [loader(8), loader(16)])
    assert trainer.num_val_batches == [1, 2]
    assert module.seen == [("val", 0, 0), ("end", 0, 0), ("val", 1, 0), ("end", 1, 0), ("val", 1, 1),
                           ("end", 1, 1)]
    metrics = trainer.callback_metrics
    assert {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1", "shared"} <= set(metrics)
    assert "val_loss" not in metrics
    assert float(metrics["shared"]) == pytest.approx(0.5)  # the mean over the second loader's two batches
    results = trainer.test(module, dataloaders={"a": loader(8), "b": loader(8)})
    assert len(results) == 2 and set(results[0]) == {"test_loss/dataloader_idx_0"}
    assert results[1]["test_loss/dataloader_idx_1"] == pytest.approx(2 * results[0]["test_loss/dataloader_idx_0"])
    predictions = trainer.predict(module, dataloaders=[loader(8), loader(16)])
    assert [len(p) for p in predictions] == [1, 2] and float(predictions[1][1][0]) == 1.0
    one = trainer.predict(module, dataloaders=loader(8))  # one loader: a flat list, as before
    assert len(one) == 1 and isinstance(one[0], torch.Tensor)


def test_module_attributes_logger_loggers_dtype_freeze():
    from tasktrain.loggers import CSVLogger

    module = Linear()
    assert module.logger is None and module.loggers == [] and module.dtype == torch.float32
    csv = CSVLogger(".")
    Trainer(max_steps=1, logger=[csv], enable_progress_bar=False, enable_checkpointing=False).fit(module, loader(8))
    assert module.logger is csv and module.loggers == [csv]
    assert module.double().dtype == torch.float64
    module.freeze()
    assert not module.training and not any(p.requires_grad for p in module.parameters())
    module.unfreeze()
    assert module.training and all(p.requires_grad for p in module.parameters())


# -- Trainer arguments -------------------------------------------------------------------------------------------------
def test_fast_dev_run_runs_n_batches_without_checkpoints_loggers_or_early_stopping(tmp_path):
    from tasktrain import EarlyStopping

    trainer = Trainer(fast_dev_run=True, max_epochs=5, default_root_dir=str(tmp_path), enable_progress_bar=False,
                      callbacks=[EarlyStopping("never_logged")])
    from tasktrain.loggers.logger import DummyLogger

    # Lightning's: the loggers are replaced by one DummyLogger, so that self.logger.experiment... still runs
    assert trainer.fast_dev_run is True and len(trainer.loggers) == 1 and isinstance(trainer.logger, DummyLogger)
    assert trainer.logger.experiment.add_image("x", None) is None and trainer.logger[0] is trainer.logger
    assert trainer.logger.version == "" and trainer.logger.name == ""
    assert Trainer(fast_dev_run=True, logger=False).loggers == []  # no logger asked: none
    module = Linear()
    trainer.fit(module, loader(32), loader(32))
    assert trainer.global_step == 1 and trainer.num_val_batches == [1] and trainer.current_epoch == 1
    assert not os.path.exists(tmp_path / "checkpoints") and os.listdir(tmp_path) == []
    assert Trainer(fast_dev_run=3, **quiet()).test(module, loader(64))[0]["test_loss"] > 0
    two = Trainer(fast_dev_run=2, **quiet())
    assert two.fast_dev_run == 2 and len(two.predict(module, loader(64))) == 2
    with pytest.raises(ValueError, match="fast_dev_run"):
        Trainer(fast_dev_run=-1)


def test_min_epochs_and_min_steps_hold_back_a_stop_request():
    from tasktrain.callbacks.early_stopping import EarlyStopping

    stopper = EarlyStopping("score", patience=1, verbose=False)
    trainer = Trainer(max_epochs=10, min_epochs=4, callbacks=[stopper], **quiet())
    trainer.fit(_Scores([3] * 10), loader(16), loader(8))
    assert trainer.current_epoch == 4 and stopper.stopped_epoch == 3
    stopper = EarlyStopping("score", patience=1, verbose=False)
    trainer = Trainer(max_epochs=10, min_steps=5, callbacks=[stopper], **quiet())  # 2 steps an epoch
    trainer.fit(_Scores([3] * 10), loader(16), loader(8))
    # the request is kept and honoured at the first batch where min_steps allows it, inside epoch index 2, which
    # then counts (Lightning's rule)
    assert trainer.current_epoch == 3 and trainer.global_step == 5


def test_overfit_batches_repeats_the_same_unshuffled_batches():
    seen = []

    class Record(Linear):
        def training_step(self, batch, batch_idx):
            seen.append(batch[0][:, 0].tolist())
            return super().training_step(batch, batch_idx)

    trainer = Trainer(max_epochs=2, overfit_batches=2, **quiet())
    trainer.fit(Record(), loader(32, shuffle=True), loader(32))
    data = regression = __import__("helpers").regression_data(32)
    first = [data.tensors[0][i * 8:(i + 1) * 8, 0].tolist() for i in range(2)]
    assert seen == first + first and trainer.num_val_batches == [2]
    with pytest.raises(ValueError, match="overfit_batches"):
        Trainer(overfit_batches=1.5)
    del regression


def test_inference_mode_detect_anomaly_and_benchmark(monkeypatch):
    modes = []

    class Probe(Linear):
        def training_step(self, batch, batch_idx):
            modes.append(("anomaly", torch.is_anomaly_enabled()))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            modes.append(("inference", torch.is_inference_mode_enabled(), torch.is_grad_enabled()))

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    Trainer(max_steps=1, inference_mode=False, detect_anomaly=True, benchmark=True, **quiet()).fit(
        Probe(), loader(8), loader(8))
    assert modes == [("anomaly", True), ("inference", False, False)] and torch.backends.cudnn.benchmark is True
    assert not torch.is_anomaly_enabled()
    modes.clear()
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(Probe(), loader(8), loader(8))  # the fit's validation: no_grad (Lightning's), inference_mode
    trainer.validate(trainer.module, loader(8))  # outside a fit
    assert modes == [("anomaly", False), ("inference", False, False), ("inference", True, False)]


def test_a_plugin_of_another_type_is_refused_with_what_to_do():
    from tasktrain.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="Found invalid type for plugin.*tasktrain.plugins"):
        Trainer(plugins=[object()])  # (plugins: tests/test_lightning_beside_plugins.py)
    assert Trainer(plugins=None, **quiet()).fast_dev_run == 0


def test_logger_none_is_the_default_logger_as_in_lightning(tmp_path):
    from tasktrain.loggers import TensorBoardLogger

    trainer = Trainer(logger=None, default_root_dir=str(tmp_path))
    assert len(trainer.loggers) == 1 and isinstance(trainer.logger, TensorBoardLogger)
    assert Trainer(logger=False).loggers == []


def test_reload_dataloaders_every_n_epochs_calls_the_hooks_again():
    class Reloading(Linear):
        calls = {"train": 0, "val": 0}

        def train_dataloader(self):
            self.calls["train"] += 1
            return loader(8 * self.calls["train"])  # one more batch each time

        def val_dataloader(self):
            self.calls["val"] += 1
            return loader(8)

    module = Reloading()
    trainer = Trainer(max_epochs=4, reload_dataloaders_every_n_epochs=2, **quiet())
    trainer.fit(module)
    assert module.calls == {"train": 2, "val": 2} and trainer.global_step == 1 + 1 + 2 + 2
    module = Reloading()
    module.calls = {"train": 0, "val": 0}
    Trainer(max_epochs=3, **quiet()).fit(module)
    assert module.calls == {"train": 1, "val": 1}


@pytest.mark.parametrize("kwargs,expected", [
    ({"max_epochs": 3, "accumulate_grad_batches": 3}, 6),  # 4 batches: windows of 3 and 1 each epoch
    ({"max_epochs": 3, "max_steps": 5}, 5),
    ({"max_epochs": 3, "limit_train_batches": 2}, 6),
    ({"max_epochs": 2, "limit_train_batches": 0.5, "accumulate_grad_batches": 2}, 2),
])
def test_estimated_stepping_batches_inside_configure_optimizers(kwargs, expected):
    class OneCycle(Linear):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            total = self.trainer.estimated_stepping_batches
            self.estimated = total
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    module = OneCycle()
    trainer = Trainer(**quiet(**kwargs))
    trainer.fit(module, loader(32))  # OneCycleLR raises if stepped more than total_steps
    assert module.estimated == expected == trainer.global_step
    assert trainer.val_dataloaders is None


def test_sync_batchnorm_on_one_process_leaves_the_module():
    class BN(Linear):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(1)

    module = BN()
    Trainer(max_steps=1, sync_batchnorm=True, **quiet()).fit(module, loader(8))
    assert type(module.norm) is torch.nn.BatchNorm1d  # Lightning converts for several processes only


def test_self_log_lightning_options(monkeypatch):
    class Options(Linear):
        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.log("peak", float(batch_idx), reduce_fx=torch.max, on_epoch=True, on_step=False)
            self.log("total", 1.0, reduce_fx=sum, on_epoch=True, on_step=False)
            self.log("with_graph", loss, enable_graph=True)
            self.log("rank0", 5.0, rank_zero_only=True)
            return loss

    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(Options(), loader(32))
    metrics = trainer.callback_metrics
    assert float(metrics["peak"]) == 3.0 and float(metrics["total"]) == 4.0 and float(metrics["rank0"]) == 5.0
    assert metrics["with_graph"].requires_grad and not metrics["peak"].requires_grad

    class NotRankZero(Options):
        def training_step(self, batch, batch_idx):
            monkeypatch.setattr(Trainer, "global_rank", property(lambda self: 1))
            self.log("rank0_only", 1.0, rank_zero_only=True)
            monkeypatch.undo()
            return super().training_step(batch, batch_idx)

    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(NotRankZero(), loader(8))
    assert "rank0_only" not in trainer.callback_metrics

    def refused(**kwargs):
        class Bad(Linear):
            def training_step(self, batch, batch_idx):
                self.log("x", 1.0, **kwargs)
                return super().training_step(batch, batch_idx)
        return Bad()

    for kwargs, message in (({"rank_zero_only": True, "sync_dist": True}, "cannot be synchronised"),
                            ({"metric_attribute": "acc"}, "is not self.acc"),
                            ({"sync_dist_group": object()}, "all ranks only"),
                            ({"reduce_fx": lambda v: v}, r"reduce_fx=\{min,max,mean,sum\}\)` are supported")):
        with pytest.raises(ValueError, match=message):
            Trainer(max_steps=1, **quiet()).fit(refused(**kwargs), loader(8))


def test_to_torchscript_script_and_trace(tmp_path):
    module = Linear()
    x = torch.randn(3, 4)
    scripted = module.to_torchscript(str(tmp_path / "m.pt"))
    assert torch.allclose(torch.jit.load(str(tmp_path / "m.pt"))(x), module(x)) and module.training
    module.example_input_array = torch.ones(2, 4)
    traced = module.to_torchscript(method="trace")
    assert torch.allclose(traced(x), module(x)) and torch.allclose(scripted(x), module(x))
    with pytest.raises(ValueError, match="'script' or 'trace'"):
        module.to_torchscript(method="compile")


def test_to_onnx_names_the_missing_packages_or_exports(monkeypatch, tmp_path):
    import importlib.util

    module = Linear()
    real_find_spec = importlib.util.find_spec
    # without the packages (pinned, whatever this machine has)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("onnx") else
                        real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"onnx and onnxscript .*tasktrain\[onnx\]"):
        module.to_onnx(str(tmp_path / "m.onnx"), torch.ones(1, 4))
    # with them: torch.onnx.export gets the module in eval mode and the input as a tuple
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name.startswith("onnx") else
                        real_find_spec(name, *a))
    seen = []
    monkeypatch.setattr(torch.onnx, "export", lambda model, args, path, **kw: seen.append((model.training, args,
                                                                                            path, kw)))
    with pytest.raises(ValueError, match="input_sample"):
        module.to_onnx(str(tmp_path / "m.onnx"))
    module.to_onnx("m.onnx", torch.ones(1, 4), opset_version=18)
    assert seen[0][0] is False and isinstance(seen[0][1], tuple) and seen[0][3] == {"opset_version": 18}
    assert module.training


# -- a Lightning script ported by renames, on 1 and 2 processes ------------------------------------------------------------
@pytest.fixture(scope="module", params=[1, 2], ids=["1-process", "2-processes"])
def ported(request, tmp_path_factory):
    import json
    import sys

    from ddp_scripts.common import run

    devices = request.param
    out = str(tmp_path_factory.mktemp(f"ported{devices}"))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_scripts", "ported.py")
    code, stdout, stderr, _ = run([sys.executable, script, out, "--devices", str(devices)], 240, out)
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    facts = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(devices)]
    return devices, out, facts


@pytest.mark.timeout(300)
def test_ported_lightning_script(ported):
    devices, out, facts = ported
    assert all(f == facts[0] for f in facts)  # every rank saw the same (synchronised metrics, agreed stops)
    f = facts[0]
    batches = 6 // devices  # 48 training samples, batch 8, sharded
    assert f["fit"] == {"global_step": 2 * batches, "current_epoch": 2, "total_steps": 2 * batches,
                        "num_training_batches": batches, "datamodule_is_trainers": True,
                        "batches_moved": 2 * batches + (2 if devices == 1 else 1) + 2 * 2 // devices}
    assert f["stages"] == ["fit", "validate", "test", "predict", "fit"]
    with open(os.path.join(out, "data", "prepare_calls")) as calls:
        assert calls.read() == "x" * 5  # once per entry point on the machine, not once per rank
    assert sorted(os.listdir(out)).count("rank_zero_only_ran_on_0") == 1
    assert not any(name.startswith("rank_zero_only_ran_on_1") for name in os.listdir(out))
    assert f["predict_rows"] == 16 // devices and f["unsharded_predict_rows"] == 16
    assert f["datamodule_state"] == {"batch_size": 8}
    assert f["resumed"] == {"batch_size": 8, "global_step": 2 * batches}  # restored before its loaders were made
    assert f["events"] == {"on_fit_start": 1, "on_train_epoch_start": 2, "on_before_optimizer_step": 2 * batches,
                           "on_save_checkpoint": 4, "on_test_end": 1,  # 2 epochs: each file, then last
                           "on_validation_batch_end[0]": (2 if devices == 1 else 1) + 3 * 2 // devices}
    assert f["validate"][0]["val_loss"] == pytest.approx(f["test"][0]["test_loss"])
    c = f["classifier"]
    assert c["metrics"] == ["val_acc/dataloader_idx_0", "val_acc/dataloader_idx_1", "val_batches_0", "val_batches_1"]
    assert c["val_batches"] == [4.0, 2.0] and c["num_val_batches"] == [4 // devices, 2 // devices]
    assert (c["stopping_reason"], c["stopped_epoch"], c["current_epoch"]) == ("PATIENCE_EXHAUSTED", 1, 2)
    assert [sorted(r) for r in c["validate"]] == [["val_acc/dataloader_idx_0", "val_batches_0"],
                                                  ["val_acc/dataloader_idx_1", "val_batches_1"]]
    if devices == 1:
        assert f["sync_batchnorm"] == "ran"
    else:
        assert "SyncBatchNorm runs on GPUs only" in f["sync_batchnorm"]


# Lightning 2.6's LightningModule methods a user calls (core/module.py), each present with Lightning's meaning
LIGHTNING_MODULE_METHODS = ["optimizers", "lr_schedulers", "print", "log", "log_dict", "all_gather", "manual_backward",
                            "toggle_optimizer", "untoggle_optimizer", "toggled_optimizer", "clip_gradients", "freeze",
                            "unfreeze", "to_onnx", "to_torchscript", "to_tensorrt", "load_from_checkpoint",
                            "save_hyperparameters"]


def test_lightning_module_methods_exist():
    from tasktrain import TaskModule

    missing = [name for name in LIGHTNING_MODULE_METHODS if not callable(getattr(TaskModule, name, None))]
    assert not missing
    with pytest.raises(NotImplementedError, match="to_onnx"):
        Linear().to_tensorrt()


def test_gan_style_manual_optimisation_toggles_and_clips():
    seen = {}

    class TwoPlayers(TaskModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.generator, self.critic = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            opt_g, opt_c = self.optimizers()
            x = batch[0]
            kept = [len(self._param_requires_grad_state)]  # (Lightning's name: the states kept while toggled)
            with self.toggled_optimizer(opt_g):
                kept.append(len(self._param_requires_grad_state))
                seen["while_g"] = (all(p.requires_grad for p in self.generator.parameters()),
                                   any(p.requires_grad for p in self.critic.parameters()))
                loss = -self.critic(self.generator(x)).mean() * 1e3
                self.manual_backward(loss)
                seen["norm"] = float(self.clip_gradients(opt_g, gradient_clip_val=0.5))
                seen["clipped"] = float(torch.cat([p.grad.flatten() for p in self.generator.parameters()]).norm())
                opt_g.step()
                opt_g.zero_grad()
            seen["after"] = all(p.requires_grad for p in self.parameters())
            seen["kept"] = kept + [len(self._param_requires_grad_state)]
            assert self.optimizers(use_pl_optimizer=False)[0] is opt_g.optimizer

        def configure_optimizers(self):
            return [torch.optim.SGD(self.generator.parameters(), lr=0.1),
                    torch.optim.SGD(self.critic.parameters(), lr=0.1)]

    Trainer(max_steps=1, **quiet()).fit(TwoPlayers(), loader(8))
    assert seen["while_g"] == (True, False) and seen["after"] and seen["kept"] == [0, 4, 0]
    assert seen["norm"] > 0.5 and seen["clipped"] == pytest.approx(0.5, rel=1e-4)


def test_all_gather_refuses_groups_and_carries_gradients_with_sync_grads():
    class Gather(Linear):
        def training_step(self, batch, batch_idx):
            with pytest.raises(ValueError, match="all ranks only"):
                self.all_gather(torch.ones(1), group=object())
            mine = torch.ones(1, requires_grad=True)
            (self.all_gather(mine, sync_grads=True) * 2).sum().backward()  # (Lightning's: differentiable)
            self.sync_grad = mine.grad.tolist()
            self.gathered = self.all_gather(torch.ones(2))
            return super().training_step(batch, batch_idx)

    module = Gather()
    Trainer(max_steps=1, **quiet()).fit(module, loader(8))
    assert module.gathered.shape == (2,) and module.sync_grad == [2.0]  # (one device: as it is, as Lightning's)


def test_datamodule_save_hyperparameters_go_into_checkpoints():
    class WithHparams(_Data):
        def __init__(self, n=16, note="x"):
            super().__init__(n)
            self.save_hyperparameters()

    data = WithHparams(n=16, note="y")
    assert dict(data.hparams) == {"n": 16, "note": "y"}
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(Linear(), datamodule=data)
    trainer.save_checkpoint("h.ckpt")
    assert torch.load("h.ckpt", weights_only=False)["datamodule_hyper_parameters"] == {"n": 16, "note": "y"}


def test_datamodule_from_datasets_and_verbose(capsys):
    from tasktrain import DataModule

    data = DataModule.from_datasets(loader(16).dataset, val_dataset=[loader(8).dataset, loader(16).dataset],
                                    test_dataset=loader(8).dataset, batch_size=8)
    trainer = Trainer(max_epochs=1, **quiet())
    module = _TwoLoaders()
    trainer.fit(module, datamodule=data)
    assert trainer.num_training_batches == 2 and trainer.num_val_batches == [1, 2]
    capsys.readouterr()
    assert trainer.test(module, verbose=False, datamodule=data)[0]["test_loss"] > 0 and capsys.readouterr().out == ""
    trainer.test(module, verbose=True, datamodule=data)  # Lightning's results table (compared with Lightning's in test_lightning_beside_results)
    out = capsys.readouterr().out
    assert "Test metric" in out and "DataLoader 0" in out and "test_loss" in out


def test_trainer_callback_views_and_ckpt_path(tmp_path):
    from tasktrain import EarlyStopping, ProgressBar

    stopper = EarlyStopping("val_loss")
    trainer = Trainer(max_epochs=1, callbacks=[stopper], logger=False, default_root_dir=str(tmp_path))
    assert trainer.early_stopping_callback is stopper and trainer.early_stopping_callbacks == [stopper]
    assert isinstance(trainer.progress_bar_callback, ProgressBar) and trainer.ckpt_path is None
    assert Trainer(**quiet()).progress_bar_callback is None and Trainer(**quiet()).early_stopping_callback is None
    trainer.fit(Linear(), loader(8), loader(8))
    trainer.save_checkpoint("c.ckpt")
    again = Trainer(max_epochs=2, **quiet())
    again.fit(Linear(), loader(8), loader(8), ckpt_path="c.ckpt")
    assert again.ckpt_path == "c.ckpt"
