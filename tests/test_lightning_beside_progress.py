"""The progress bars beside Lightning 2.6 itself (a test-only dependency, never imported by the package): the same
module, loaders and bar configuration run under both, and what a user reads from the bar must be equal."""
import contextlib
import io
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning.pytorch")

import tasktrain  # noqa: E402


def _module(base):
    class Shown(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("shown", 0.25, prog_bar=True)
            self.log("hidden", 0.5)
            if batch_idx == 0:  # printed above the bar (tqdm.write), as LightningModule.print does
                self.print("printed", self.current_epoch, end="")
            return loss

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("val_shown", 1.5, prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Shown()


def _loader(n):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)


def _run(pkg, module_base, bar, tmp_path, **kwargs):
    """Fit under `pkg` (lightning.pytorch or tasktrain); what the bar says afterwards, and its output."""
    out = io.StringIO()
    trainer = pkg.Trainer(max_epochs=2, callbacks=[bar], enable_checkpointing=False, enable_model_summary=False,
                          default_root_dir=str(tmp_path), logger=pkg.loggers.CSVLogger(str(tmp_path)),
                          num_sanity_val_steps=1, **kwargs)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
            mock.patch("tqdm.tqdm.write") as write:
        trainer.fit(_module(module_base), _loader(24), [_loader(8), _loader(12)])
    seen = {
        "printed": write.call_args_list,
        "metrics": bar.get_metrics(trainer, trainer.lightning_module),
        "train": (bar.train_progress_bar.n, bar.train_progress_bar.total, bar.train_progress_bar.desc),
        "val": (bar.val_progress_bar.n, bar.val_progress_bar.total, bar.val_progress_bar.desc),
        "totals": (bar.total_train_batches, bar.total_val_batches),
        "flags": (bar.refresh_rate, bar.process_position, bar.is_enabled, bar.is_disabled),
        "descriptions": (bar.train_description, bar.validation_description, bar.test_description,
                         bar.predict_description, bar.sanity_check_description),
    }
    return seen, out.getvalue()


def test_tqdm_progress_bar_says_what_lightnings_says(tmp_path):
    refresh_rate = 2  # 6 batches an epoch: updates at 2, 4, 6
    ours, our_out = _run(tasktrain, tasktrain.TaskModule, tasktrain.TQDMProgressBar(refresh_rate=refresh_rate),
                         tmp_path / "ours")
    theirs, their_out = _run(L, L.LightningModule, L.callbacks.TQDMProgressBar(refresh_rate=refresh_rate),
                             tmp_path / "theirs")
    assert ours == theirs
    assert ours["printed"] == [mock.call("printed 0", end=""), mock.call("printed 1", end="")]
    for text in ("Epoch 1: 100%", "6/6", "shown=0.250", "v_num=0", "val_shown/dataloader_idx_1=1.500",
                 "Validation DataLoader 1", "Sanity Checking DataLoader 0"):
        assert (text in our_out) == (text in their_out) == True, text  # noqa: E712


def test_tqdm_number_format_enable_disable_and_refusals_as_lightnings():
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm as TheirTqdm
    from lightning.pytorch.utilities.exceptions import MisconfigurationException as TheirError

    from tasktrain.callbacks.progress.tqdm_progress import Tqdm
    from tasktrain.exceptions import MisconfigurationException

    for n in (0.25, 1.5, 3, 12345, 1e-7, 123456.789, "x", "7", "1.2", 0.0, 100):
        assert Tqdm.format_num(n) == TheirTqdm.format_num(n), n
    for bar in (tasktrain.TQDMProgressBar(refresh_rate=0), L.callbacks.TQDMProgressBar(refresh_rate=0)):
        assert bar.is_disabled and (bar.refresh_rate, bar.process_position) == (0, 0)
    for bar in (tasktrain.TQDMProgressBar(), L.callbacks.TQDMProgressBar()):
        bar.disable()
        assert bar.is_disabled
        bar.enable()
        assert bar.is_enabled
        with pytest.raises(TypeError, match="_train_progress_bar` reference has not been set yet"):
            bar.train_progress_bar
    for base in (tasktrain.ProgressBar(), L.callbacks.ProgressBar()):  # the base class draws nothing
        with pytest.raises(NotImplementedError):
            base.disable()
        with pytest.raises(TypeError, match="_trainer` reference has not been set yet"):
            base.trainer
    for pkg, error in ((tasktrain, MisconfigurationException), (L, TheirError)):
        with pytest.raises(error) as many:
            pkg.Trainer(callbacks=[pkg.callbacks.TQDMProgressBar(), pkg.callbacks.TQDMProgressBar()], logger=False)
        with pytest.raises(error) as disabled:
            pkg.Trainer(callbacks=[pkg.callbacks.TQDMProgressBar()], enable_progress_bar=False, logger=False)
        messages = (str(many.value), str(disabled.value))
        if pkg is tasktrain:
            ours = messages
    assert ours == messages


def test_tqdm_module_helpers_custom_bars_import_are_lightnings():
    # custom bars copied from Lightning's import these two from its tqdm_progress module
    from lightning.pytorch.callbacks.progress import tqdm_progress as theirs

    from tasktrain.callbacks.progress import tqdm_progress as ours

    for x in (None, float("inf"), float("nan"), 3, 0, 2.5):
        assert ours.convert_inf(x) == theirs.convert_inf(x), x
    counts = []
    for module in (ours, theirs):
        screen = io.StringIO()
        drawn, hidden = (module.Tqdm(total=5, file=screen, disable=off) for off in (False, True))
        module._update_n(drawn, 3)
        module._update_n(hidden, 3)
        counts.append((drawn.n, hidden.n, screen.getvalue().count("3/5")))
    assert counts[0] == counts[1] == (3, 0, 1)


def test_dummy_logger_as_lightnings(tmp_path):
    from lightning.pytorch.loggers.logger import DummyLogger as Theirs

    from tasktrain.loggers.logger import DummyLogger

    for logger in (DummyLogger(), Theirs()):
        assert (logger.name, logger.version) == ("", "") and logger[0] is logger
        assert logger.experiment.add_image("x", None) is None and logger.anything(1, k=2) is None
        assert logger.log_metrics({"a": 1.0}, step=0) is None and logger.log_hyperparams({"a": 1}) is None
    for pkg in (tasktrain, L):
        trainer = pkg.Trainer(fast_dev_run=True, default_root_dir=str(tmp_path), enable_progress_bar=False)
        assert [type(one).__name__ for one in trainer.loggers] == ["DummyLogger"]


def test_ddp_strategy_under_lightnings_name_takes_lightnings_keywords():
    from lightning.pytorch.strategies import DDPStrategy as Theirs

    from tasktrain.strategies import DDP, DDPStrategy

    ours = DDPStrategy(find_unused_parameters=True, static_graph=False, timeout=__import__("datetime").timedelta(60))
    theirs = Theirs(find_unused_parameters=True, static_graph=False, timeout=__import__("datetime").timedelta(60))
    assert isinstance(ours, DDP) and ours.ddp_kwargs == theirs._ddp_kwargs
    with pytest.raises(TypeError):  # an option DistributedDataParallel does not have is refused, not ignored
        DDPStrategy(find_unused_parameter=True)


def _epoch_metrics_seen(pkg, module_base, tmp_path):
    """What TQDMProgressBar.get_metrics returns each time the bar asks, over two epochs that validate at their end."""
    seen = []

    class Recording(pkg.callbacks.TQDMProgressBar):  # (tasktrain's redraw throttle left on: it does not change this)
        def get_metrics(self, trainer, module):
            seen.append((trainer.state.stage.value, trainer.current_epoch, trainer.global_step,
                         super().get_metrics(trainer, module)))
            return seen[-1][-1]

    class Logged(module_base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            self.log("a", float(self.global_step), prog_bar=True, on_step=False, on_epoch=True, reduce_fx="max")
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            self.log("b", float(self.global_step), prog_bar=True, on_step=False, on_epoch=True, reduce_fx="max")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pkg.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, callbacks=[Recording()],
                          logger=False, enable_checkpointing=False, enable_model_summary=False,
                          default_root_dir=str(tmp_path))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.fit(Logged(), _loader(8), _loader(4))
    return seen


def test_tqdm_shows_the_epochs_training_values_after_its_validation_as_lightning(tmp_path):
    # Lightning reduces an epoch's training values after the epoch-end validation: the bar's postfix at that
    # validation's end still shows the epoch before's ("a" absent in epoch 0), then the new one at the epoch's end
    ours = _epoch_metrics_seen(tasktrain, tasktrain.TaskModule, tmp_path / "ours")
    theirs = _epoch_metrics_seen(L, L.LightningModule, tmp_path / "theirs")
    assert ours == theirs
    assert ("validate", 0, 2, {"b": 2.0}) in ours and ("train", 0, 2, {"b": 2.0, "a": 1.0}) in ours


def _shown_after_logging_an_integer_tensor(pkg, module_base, tmp_path):
    class Logged(module_base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            self.log("count", torch.tensor([1]), prog_bar=True, on_epoch=False)
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    bar = pkg.callbacks.TQDMProgressBar()
    trainer = pkg.Trainer(max_epochs=1, limit_train_batches=1, callbacks=[bar], logger=False,
                          enable_checkpointing=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.fit(Logged(), _loader(4))
    return (trainer.callback_metrics["count"].dtype, repr(trainer.progress_bar_metrics["count"]),
            str(bar.train_progress_bar.postfix))


def test_an_integer_tensor_is_logged_and_shown_as_a_float_as_lightning(tmp_path):
    ours = _shown_after_logging_an_integer_tensor(tasktrain, tasktrain.TaskModule, tmp_path / "ours")
    theirs = _shown_after_logging_an_integer_tensor(L, L.LightningModule, tmp_path / "theirs")
    assert ours == theirs == (torch.float32, "1.0", "count=1.000")


def test_a_progress_bar_and_its_trainer_pickle_after_each_stage_as_lightning(tmp_path):
    """Lightning's progress bars pickle (with the Trainer they hold) after every stage; the run's hook tables and
    the optimizers' LightningOptimizer wrappers (a class made per optimizer class) must not stop that."""
    import pickle

    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoring

    from tasktrain.demos.boring_classes import BoringModel

    for name, pkg, model in (("lightning", L, LitBoring), ("tasktrain", tasktrain, BoringModel)):
        bar = pkg.callbacks.TQDMProgressBar()
        trainer = pkg.Trainer(max_epochs=1, callbacks=[bar], logger=False, enable_checkpointing=False,
                              enable_model_summary=False, default_root_dir=str(tmp_path / name),
                              limit_train_batches=2, limit_val_batches=2, limit_test_batches=2)
        module = model()
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            trainer.fit(module, module.train_dataloader(), module.val_dataloader())
            pickle.dumps(bar)
            trainer.validate(module, module.val_dataloader())
            trainer.test(module, module.test_dataloader())
            again = pickle.loads(pickle.dumps(bar))
        assert again._trainer.global_step == trainer.global_step == 2
        (opt,) = again._trainer.optimizers
        assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["lr"] == 0.1 * 0.1  # (StepLR stepped once)

    wrapped = tasktrain.trainer.optim.LightningOptimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.5))
    copy = pickle.loads(pickle.dumps(wrapped))
    assert type(copy).__name__ == "LightningSGD" and isinstance(copy, torch.optim.SGD)
    assert copy.param_groups[0]["lr"] == 0.5 and copy.optimizer is not wrapped.optimizer
