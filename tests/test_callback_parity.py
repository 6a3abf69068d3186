"""Lightning 2.6's callback API (issue 37): the expected values are read from Lightning's source and docs
(src/lightning/pytorch/callbacks/*.py); Lightning is not installed in the test environment."""
import logging
import os

import pytest
import torch
import yaml
from helpers import Linear, loader

from tasktrain import EarlyStopping, ModelCheckpoint, Trainer
from tasktrain.utilities.exceptions import MisconfigurationException


def fit(callbacks, epochs=3, module=None, **kwargs):
    kwargs.setdefault("logger", False)
    trainer = Trainer(max_epochs=epochs, callbacks=callbacks, enable_progress_bar=False, num_sanity_val_steps=0,
                      **kwargs)
    trainer.fit(module or Linear(), loader(16), loader(8))
    return trainer


def ckpts(directory, ext=".ckpt"):
    return sorted(f for f in os.listdir(directory) if f.endswith(ext))


def test_misconfiguration_is_a_value_error():
    from tasktrain.exceptions import MisconfigurationException as core

    assert MisconfigurationException is core and issubclass(MisconfigurationException, ValueError)
    with pytest.raises(MisconfigurationException, match="mode"):
        ModelCheckpoint(mode="best")


def test_dirpath_none_is_resolved_by_fit(tmp_path):
    mc = ModelCheckpoint()
    fit([mc], epochs=1, default_root_dir=tmp_path)
    assert mc.dirpath == str(tmp_path / "checkpoints")
    mc = ModelCheckpoint()
    trainer = fit([mc], epochs=1, default_root_dir=tmp_path / "logged", logger=True)
    assert mc.dirpath == os.path.join(trainer.logger.log_dir, "checkpoints") and ckpts(mc.dirpath)
    # a second fit with another logger version resolves again; a dirpath of the user's is kept
    trainer = fit([mc], epochs=1, default_root_dir=tmp_path / "logged", logger=True)
    assert mc.dirpath == os.path.join(trainer.logger.log_dir, "checkpoints")
    mine = ModelCheckpoint(dirpath=tmp_path / "mine")
    fit([mine], epochs=1, default_root_dir=tmp_path)
    assert mine.dirpath == str(tmp_path / "mine")


@pytest.mark.parametrize("monitor", ["epoch", "step"])
def test_epoch_and_step_are_monitorable(tmp_path, monitor):
    mc = ModelCheckpoint(dirpath=tmp_path, monitor=monitor, mode="max", save_top_k=2)
    fit([mc])
    assert ckpts(tmp_path) == ["epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]
    assert mc.best_model_path == str(tmp_path / "epoch=2-step=6.ckpt")
    assert int(mc.best_model_score) == (2 if monitor == "epoch" else 6)
    assert mc.kth_best_model_path == str(tmp_path / "epoch=1-step=4.ckpt")
    assert int(mc.kth_value) == (1 if monitor == "epoch" else 4)
    assert int(mc.current_score) == (2 if monitor == "epoch" else 6)


def test_to_yaml_current_score_and_kth_best(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2, filename="{epoch}")
    fit([mc], epochs=4)
    mc.to_yaml()
    written = yaml.safe_load((tmp_path / "best_k_models.yaml").read_text())
    assert written == {p: pytest.approx(float(v)) for p, v in mc.best_k_models.items()} and len(written) == 2
    worst = max(mc.best_k_models, key=mc.best_k_models.get)
    assert mc.kth_best_model_path == worst and float(mc.kth_value) == pytest.approx(mc.best_k_models[worst])
    assert mc.current_score is not None  # the value of the last candidate (epoch 3)
    mc.to_yaml(tmp_path / "other.yaml")
    assert yaml.safe_load((tmp_path / "other.yaml").read_text()) == written
    state = mc.state_dict()
    assert state["kth_best_model_path"] == worst and state["current_score"] == pytest.approx(float(mc.current_score))


def test_every_n_epochs_zero_saves_nothing_on_schedule(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=0)
    fit([mc], epochs=2)
    assert not os.path.exists(tmp_path) or ckpts(tmp_path) == []


class Fails(Linear):
    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_save_on_exception_writes_a_checkpoint_when_fit_fails(tmp_path, capsys):
    mc = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=0, save_on_exception=True, save_last=True)
    with pytest.raises(RuntimeError, match="boom"):
        fit([mc], module=Fails())
    assert ckpts(tmp_path) == ["epoch=1-step=3.ckpt", "last.ckpt"]
    saved = torch.load(tmp_path / "epoch=1-step=3.ckpt", weights_only=True)
    assert saved["loops"]["train_state"]["global_step"] == 3
    assert "An RuntimeError was raised with message:             boom, saved checkpoint to" in capsys.readouterr().out
    off = ModelCheckpoint(dirpath=tmp_path / "off", every_n_epochs=0)
    with pytest.raises(RuntimeError, match="boom"):
        fit([off], module=Fails())
    assert not os.path.exists(tmp_path / "off") or ckpts(tmp_path / "off") == []


def test_class_attributes_name_the_files(tmp_path):
    class Named(ModelCheckpoint):
        FILE_EXTENSION = ".pt"
        CHECKPOINT_NAME_LAST = "{epoch}-last"

    mc = Named(dirpath=tmp_path, save_last=True, save_top_k=1, monitor="step", mode="max")
    fit([mc], epochs=3)
    assert ckpts(tmp_path, ".pt") == ["epoch=2-last.pt", "epoch=2-step=6.pt"]  # the earlier "{epoch}-last" files went
    assert mc.last_model_path == str(tmp_path / "epoch=2-last.pt") and ckpts(tmp_path) == []
    mc = ModelCheckpoint(dirpath=tmp_path / "inst", save_last=True)
    mc.CHECKPOINT_NAME_LAST = "final"
    fit([mc], epochs=1)
    assert "final.ckpt" in ckpts(tmp_path / "inst")


class Constant(Linear):
    def validation_step(self, batch, batch_idx):
        self.log("score", 1.0)


@pytest.mark.parametrize("check_on_train_epoch_end,stopped", [(True, 2), (False, 1), (None, 1)])
def test_early_stopping_check_on_train_epoch_end(caplog, check_on_train_epoch_end, stopped):
    # two validations per epoch (val_check_interval=0.5), the score never improves after the first: patience 2
    # counts epochs with True (Lightning: the train epoch end) and validation runs with False / None
    stopper = EarlyStopping("score", patience=2, verbose=True, check_on_train_epoch_end=check_on_train_epoch_end)
    with caplog.at_level(logging.INFO, logger="tasktrain.callbacks.early_stopping"):
        trainer = fit([stopper], epochs=5, module=Constant(), val_check_interval=0.5)
    assert stopper.stopped_epoch == stopped and trainer.should_stop
    assert stopper.check_on_train_epoch_end is (check_on_train_epoch_end is True)  # None resolved in setup: False
    out = caplog.text
    assert "Metric score improved. New best score: 1.000" in out
    assert ("Monitored metric score did not improve in the last 2 records. Best score: 1.000. Signaling Trainer to "
            "stop.") in out
    assert EarlyStopping("score").stopped_epoch == 0
    with pytest.raises(MisconfigurationException, match="check_on_train_epoch_end"):
        EarlyStopping("score", check_on_train_epoch_end="yes")


class Scheduled(Linear):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


def test_lr_monitor_history_momentum_and_weight_decay(tmp_path):
    from tasktrain import LearningRateMonitor
    from tasktrain.loggers import CSVLogger

    monitor = LearningRateMonitor("epoch", log_momentum=True, log_weight_decay=True)
    fit([monitor], module=Scheduled(), logger=CSVLogger(tmp_path))
    assert monitor.lrs == {"lr-SGD": [pytest.approx(0.1), pytest.approx(0.05), pytest.approx(0.025)]}
    assert monitor.last_momentum_values == {"lr-SGD-momentum": pytest.approx(0.9)}
    assert monitor.last_weight_decay_values == {"lr-SGD-weight_decay": pytest.approx(0.01)}
    with pytest.raises(MisconfigurationException, match="Cannot use `LearningRateMonitor` callback with `Trainer` "
                       "that has no logger"):
        fit([LearningRateMonitor()], epochs=1)


def test_timer_stages_interval_and_no_duration(caplog):
    from tasktrain import Timer

    timer = Timer()  # duration=None (Lightning's default): it measures, never stops
    trainer = fit([timer], epochs=2)
    assert trainer.current_epoch == 2 and not trainer.should_stop and timer.time_remaining() is None
    train, val = timer.time_elapsed("train"), timer.time_elapsed("validate")
    assert 0 < val < train and timer.time_elapsed("test") == 0.0 and timer.time_elapsed() == train
    assert timer.time_elapsed("train") == train  # ended: it no longer grows
    assert timer.state_dict()["time_elapsed"]["train"] == train
    timer = Timer(duration={"seconds": 0}, interval="epoch")  # spent at once: checked at fit start (Lightning's)
    trainer = fit([timer], epochs=3)
    assert trainer.current_epoch == 0 and trainer.global_step == 0 and timer.time_remaining() <= 0
    assert "Time limit reached. Elapsed time is 0:00:00. Signaling Trainer to stop." in caplog.messages
    resumed = Timer(duration=100)
    resumed.load_state_dict(timer.state_dict())
    assert resumed.time_elapsed() == pytest.approx(timer.time_elapsed()) and resumed.time_remaining() > 99
    with pytest.raises(MisconfigurationException, match="interval"):
        Timer(interval="batch")


def test_a_mock_callback_receives_the_hooks():
    from unittest.mock import Mock

    from tasktrain import Callback

    cb = Mock(spec=Callback)
    module = Linear()
    trainer = fit([cb], epochs=2, module=module, enable_checkpointing=False)
    cb.on_fit_start.assert_called_once_with(trainer, module)
    cb.on_train_start.assert_called_once_with(trainer, module)
    assert cb.on_train_epoch_end.call_count == 2 and cb.on_train_batch_end.call_count == 4
    assert cb.on_validation_end.call_count == 2
    cb.setup.assert_called_once_with(trainer, module, stage="fit")  # as Lightning calls it


def test_trainer_print_is_rank_zero_only(capsys, monkeypatch):
    trainer = Trainer(logger=False, enable_progress_bar=False)
    trainer.print("hello", 1, sep="-")
    assert capsys.readouterr().out == "hello-1\n"
    monkeypatch.setattr(type(trainer.strategy), "is_global_zero", property(lambda self: False))
    trainer.print("hidden")
    assert capsys.readouterr().out == ""


class Opaque:
    """Not plain data: a weights-only load refuses it."""

    def __init__(self, value):
        self.value = value


class WithObject(Linear):
    def on_save_checkpoint(self, checkpoint):
        checkpoint["opaque"] = Opaque(7)

    def on_load_checkpoint(self, checkpoint):
        self.loaded = checkpoint["opaque"].value


def test_fit_weights_only_false_reads_a_trusted_checkpoint(tmp_path):
    from tasktrain.checkpoint_io import CheckpointError

    trainer = fit([], epochs=1, module=WithObject(), enable_checkpointing=False)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    for weights_only in (None, True):
        with pytest.raises(CheckpointError, match=r"weights_only=False"):
            fit([], epochs=2, module=WithObject(), enable_checkpointing=False).fit(
                WithObject(), loader(16), ckpt_path=tmp_path / "run.ckpt", weights_only=weights_only)
    module = WithObject()
    trainer = Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(module, loader(16), ckpt_path=tmp_path / "run.ckpt", weights_only=False)
    assert module.loaded == 7 and trainer.global_step == 4
    with pytest.raises(ValueError, match="weights_only"):
        trainer.fit(module, loader(16), weights_only="no")


def test_namespace_hparams_pl_module_keywords_and_the_logo(capsys):
    """save_hyperparameters(Namespace), Callback hooks by Lightning's argument names, cli_lightning_logo at the top
    level (lightning.pytorch.cli_lightning_logo's place)."""
    from argparse import Namespace

    from tasktrain import Callback, TaskModule, cli_lightning_logo

    class FromArgs(Linear):
        def __init__(self, args):
            super().__init__()
            self.save_hyperparameters(args)

    module = FromArgs(Namespace(lr=0.05, layers=2))
    assert module.hparams.lr == 0.05 and dict(module.hparams) == {"lr": 0.05, "layers": 2}
    seen = []

    class Keyworded(Callback):
        def setup(self, trainer, pl_module, stage):
            super().setup(trainer=trainer, pl_module=pl_module, stage=stage)  # Lightning's names
            seen.append((isinstance(pl_module, TaskModule), stage))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            super().on_train_batch_end(trainer, pl_module=pl_module, outputs=outputs, batch=batch, batch_idx=batch_idx)

    fit([Keyworded()], epochs=1, module=module, enable_checkpointing=False)
    assert seen == [(True, "fit")]
    cli_lightning_logo()
    assert capsys.readouterr().out.strip()


def test_model_checkpoint_arguments_parse_as_the_cli_reads_them():
    """save_last is typed Optional[Union[bool, Literal["link"]]] (Lightning's), so jsonargparse (TaskCLI) parses
    "link", true and null; the other arguments keep Lightning's positional order."""
    import inspect

    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ModelCheckpoint, "checkpoint")
    for given, expected in (("link", "link"), ("true", True), ("null", None)):
        config = parser.parse_args(["--checkpoint.save_last", given, "--checkpoint.enable_version_counter", "false"])
        checkpoint = ModelCheckpoint(**config.checkpoint.as_dict())
        assert checkpoint.save_last == expected and checkpoint._enable_version_counter is False
    with pytest.raises(Exception):
        parser.parse_args(["--checkpoint.save_last", "copy"])
    assert list(inspect.signature(ModelCheckpoint).parameters)[:15] == [
        "dirpath", "filename", "monitor", "verbose", "save_last", "save_top_k", "save_on_exception",
        "save_weights_only", "mode", "auto_insert_metric_name", "every_n_train_steps", "train_time_interval",
        "every_n_epochs", "save_on_train_epoch_end", "enable_version_counter"]
