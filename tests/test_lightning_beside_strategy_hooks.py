"""Lightning's loop-facing Strategy methods that a strategy subclass of one's own overrides (issue 37): the same
subclass of SingleDeviceStrategy, run under both libraries, records its calls (and the module's hooks around them);
the records must be equal. The methods tasktrain cannot call are refused before the run, naming the method
(tasktrain/strategies/loop_hooks.py)."""
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain
import tasktrain.strategies
from tasktrain.strategies.loop_hooks import REFUSED

LIBS = {"ours": (tasktrain, tasktrain.TaskModule, tasktrain.strategies.SingleDeviceStrategy),
        "theirs": (pl, pl.LightningModule, pl.strategies.SingleDeviceStrategy)}


def _loader(n=4):
    return DataLoader(TensorDataset(torch.arange(n * 2, dtype=torch.float32).view(n, 2)), batch_size=2)


def _module_class(base, calls):
    class Model(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            calls.append(("module.training_step", batch_idx))
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            calls.append(("module.validation_step", batch_idx))

        def test_step(self, batch, batch_idx):
            calls.append(("module.test_step", batch_idx))

        def predict_step(self, batch, batch_idx):
            calls.append(("module.predict_step", batch_idx))
            return self.layer(batch[0])

        def configure_optimizers(self):
            calls.append(("module.configure_optimizers",))
            return torch.optim.Adam(self.parameters(), lr=0.1)

        def on_fit_start(self):
            calls.append(("module.on_fit_start",))

        def on_train_start(self):
            calls.append(("module.on_train_start",))

        def on_train_end(self):
            calls.append(("module.on_train_end",))

        def on_train_batch_start(self, batch, batch_idx):
            calls.append(("module.on_train_batch_start", batch_idx))

        def on_before_backward(self, loss):
            calls.append(("module.on_before_backward",))

        def on_after_backward(self):
            calls.append(("module.on_after_backward",))

        def on_validation_start(self):
            calls.append(("module.on_validation_start",))

        def on_validation_end(self):
            calls.append(("module.on_validation_end",))

        def on_test_start(self):
            calls.append(("module.on_test_start",))

        def on_test_end(self):
            calls.append(("module.on_test_end",))

        def on_predict_start(self):
            calls.append(("module.on_predict_start",))

        def on_predict_end(self):
            calls.append(("module.on_predict_end",))
    return Model


def _strategy_class(base, calls):
    class Recording(base):
        def setup(self, trainer):
            calls.append(("setup", trainer.state.fn))
            super().setup(trainer)
            calls.append(("setup done", type(self.lightning_module).__name__))

        def on_train_start(self):
            calls.append(("on_train_start",))

        def on_train_end(self):
            calls.append(("on_train_end",))

        def on_validation_start(self):
            calls.append(("on_validation_start",))

        def on_validation_end(self):
            calls.append(("on_validation_end",))

        def on_test_start(self):
            calls.append(("on_test_start",))

        def on_test_end(self):
            calls.append(("on_test_end",))

        def on_predict_start(self):
            calls.append(("on_predict_start",))

        def on_predict_end(self):
            calls.append(("on_predict_end",))

        def on_train_batch_start(self, batch, batch_idx):
            calls.append(("on_train_batch_start", batch_idx, batch[0].shape[0]))
            return -1  # (not read: the module's -1 ends an epoch, the strategy's does not)

        def process_dataloader(self, dataloader):
            calls.append(("process_dataloader", type(dataloader).__name__))
            return dataloader

        def training_step(self, *args, **kwargs):
            calls.append(("training_step", len(args)))
            return super().training_step(*args, **kwargs)

        def post_training_step(self):
            calls.append(("post_training_step",))

        def pre_backward(self, closure_loss):
            calls.append(("pre_backward", closure_loss.requires_grad))

        def post_backward(self, closure_loss):
            calls.append(("post_backward",))

        def validation_step(self, *args, **kwargs):
            calls.append(("validation_step", len(args)))
            return super().validation_step(*args, **kwargs)

        def test_step(self, *args, **kwargs):
            calls.append(("test_step", len(args)))
            return super().test_step(*args, **kwargs)

        def predict_step(self, *args, **kwargs):
            calls.append(("predict_step", len(args)))
            return super().predict_step(*args, **kwargs)
    return Recording


def _trainer(lib, strategy, tmp_path, **kwargs):
    kwargs = {"max_steps": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0, "logger": False,
              "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False, **kwargs}
    return lib.Trainer(accelerator="cpu", strategy=strategy, default_root_dir=str(tmp_path), **kwargs)


def _record(name, tmp_path):
    calls = []
    lib, module_base, strategy_base = LIBS[name]
    module = _module_class(module_base, calls)()
    strategy = _strategy_class(strategy_base, calls)(device=torch.device("cpu"))
    trainer = _trainer(lib, strategy, tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, _loader(), _loader())
        calls.append(("-- validate",))
        trainer.validate(module, _loader())
        calls.append(("-- test",))
        trainer.test(module, _loader())
        calls.append(("-- predict",))
        trainer.predict(module, _loader())
    return calls


def test_a_subclass_overrides_are_called_where_lightning_calls_them(tmp_path):
    ours, theirs = _record("ours", tmp_path), _record("theirs", tmp_path)
    assert ("setup", "fit") in ours and ("on_train_start",) in ours and ("pre_backward", True) in ours  # (not empty)
    assert ours == theirs


def _resume_record(name, tmp_path, after_setup, restore_optimizer, move):
    calls = []
    lib, module_base, strategy_base = LIBS[name]
    Model = _module_class(module_base, [])
    first = _trainer(lib, "auto", tmp_path / name / "first", max_steps=1)
    first.fit(Model(), _loader())
    path = str(tmp_path / name / "first.ckpt")
    first.save_checkpoint(path)
    saved = first.lightning_module.layer.weight.detach().clone()

    class Restoring(strategy_base):
        def setup(self, trainer):
            calls.append(("setup",))
            super().setup(trainer)

        @property
        def restore_checkpoint_after_setup(self):
            return after_setup

        @property
        def lightning_restore_optimizer(self):
            return restore_optimizer

        def load_checkpoint(self, checkpoint_path, weights_only=None):
            calls.append(("load_checkpoint",))
            return super().load_checkpoint(checkpoint_path, weights_only)

        def load_model_state_dict(self, checkpoint, strict=True):
            calls.append(("load_model_state_dict", sorted(checkpoint["state_dict"]), strict))
            if move:
                super().load_model_state_dict(checkpoint, strict=strict)

        def load_optimizer_state_dict(self, checkpoint):
            calls.append(("load_optimizer_state_dict", len(checkpoint["optimizer_states"])))
            if move:
                super().load_optimizer_state_dict(checkpoint)

    model = Model()
    strategy = Restoring(device=torch.device("cpu"))
    trainer = _trainer(lib, strategy, tmp_path / name / "second")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, _loader(), ckpt_path=path)
        adam_steps = [int(state["step"]) for state in trainer.optimizers[0].state.values()]
        calls.append(("-- validate", adam_steps))
        with torch.no_grad():
            model.layer.weight.fill_(5.0)
        trainer.validate(model, _loader(), ckpt_path=path)
    calls.append(("weights loaded", torch.equal(model.layer.weight.detach(), saved)))
    return calls


@pytest.mark.parametrize("after_setup", [False, True])
@pytest.mark.parametrize("restore_optimizer", [False, True])
@pytest.mark.parametrize("move", [False, True])
def test_checkpoint_restore_hooks_are_lightnings(tmp_path, after_setup, restore_optimizer, move):
    ours = _resume_record("ours", tmp_path, after_setup, restore_optimizer, move)
    theirs = _resume_record("theirs", tmp_path, after_setup, restore_optimizer, move)
    assert ("load_model_state_dict", ["layer.bias", "layer.weight"], True) in ours
    assert ours == theirs


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_override_tasktrain_cannot_call_is_refused_before_the_run(name):
    body = property(lambda self: True) if name == "handles_gradient_accumulation" else (lambda self, *args: None)
    for base in (tasktrain.strategies.SingleDeviceStrategy, tasktrain.strategies.DDPStrategy):
        own = type("Mine", (base,), {name: body})
        with pytest.raises(NotImplementedError, match=f"Mine.{name}: .*Override "):
            tasktrain.Trainer(accelerator="cpu", devices=1, strategy=own(), logger=False)
    with pytest.raises(NotImplementedError, match="SingleDeviceStrategy.setup_distributed"):  # (an instance's own, too)
        strategy = tasktrain.strategies.SingleDeviceStrategy()
        strategy.setup_distributed = lambda: None
        tasktrain.Trainer(accelerator="cpu", strategy=strategy, logger=False)


def test_a_setup_override_must_call_super(tmp_path):
    class Forgetful(tasktrain.strategies.SingleDeviceStrategy):
        def setup(self, trainer):
            pass

    Model = _module_class(tasktrain.TaskModule, [])
    trainer = _trainer(tasktrain, Forgetful(device="cpu"), tmp_path)
    with pytest.raises(NotImplementedError, match=r"Forgetful.setup\(trainer\) did not call super\(\).setup"):
        trainer.fit(Model(), _loader())


def test_defaults_are_lightnings():
    for name, (lib, _, base) in LIBS.items():
        strategy = base(device=torch.device("cpu"))
        assert strategy.restore_checkpoint_after_setup is False
        assert strategy.lightning_restore_optimizer is True
        assert strategy.handles_gradient_accumulation is False
        loader = _loader()
        assert strategy.process_dataloader(loader) is loader
        assert strategy.on_train_start() is None and strategy.post_training_step() is None


@pytest.mark.parametrize("name", sorted(LIBS))
def test_process_dataloader_is_called_on_each_loader(name, tmp_path):
    """Lightning's test_process_dataloader_gets_called_as_expected (strategies/test_single_device.py), through the
    entry points: once per loader, two validation loaders twice; what it returns is what the run reads."""
    lib, module_base, strategy_base = LIBS[name]
    seen = []

    class Halving(strategy_base):
        def process_dataloader(self, dataloader):
            seen.append(len(dataloader.dataset))
            return DataLoader(dataloader.dataset, batch_size=1)  # (batches of one from here on)

    calls = []
    module = _module_class(module_base, calls)()
    trainer = _trainer(lib, Halving(device=torch.device("cpu")), tmp_path / name, limit_val_batches=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.validate(module, [_loader(4), _loader(6)])
    assert seen == [4, 6]
    assert [c for c in calls if c[0] == "module.validation_step"] == [("module.validation_step", i) for i in
                                                                        [*range(4), *range(6)]]


def test_deepspeed_handles_gradient_accumulation_as_lightnings():
    pytest.importorskip("deepspeed")
    assert tasktrain.strategies.DeepSpeedStrategy().handles_gradient_accumulation is True
    assert pl.strategies.DeepSpeedStrategy().handles_gradient_accumulation is True


@pytest.mark.parametrize("name", sorted(LIBS))
def test_manual_backward_calls_pre_and_post_backward(name, tmp_path):
    lib, module_base, strategy_base = LIBS[name]
    calls = []

    class Manual(_module_class(module_base, calls)):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            optimizer.zero_grad()
            calls.append(("module.training_step", batch_idx))
            self.manual_backward(self.layer(batch[0]).sum())
            optimizer.step()

    Recording = _strategy_class(strategy_base, calls)
    trainer = _trainer(lib, Recording(device=torch.device("cpu")), tmp_path / name, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Manual(), _loader())
    calls[:] = [call for call in calls if call[0] in ("module.training_step", "training_step", "post_training_step",
                                                      "pre_backward", "post_backward", "module.on_before_backward",
                                                      "module.on_after_backward")]
    assert calls == [call for batch_idx in (0, 1) for call in (
        ("training_step", 2), ("module.training_step", batch_idx), ("pre_backward", True),
        ("module.on_before_backward",), ("module.on_after_backward",), ("post_backward",), ("post_training_step",))]
