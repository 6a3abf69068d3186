"""Trainer(barebones=True) beside Lightning 2.6 (issue 37): the settings it refuses (Lightning's ValueErrors, word for
word), what the Trainer holds after construction, its two notes, self.log's warning, and a plain fit's weights and
hook calls. The defaults that became None for it keep their values without barebones."""
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402
from test_lightning_beside_basics import _logged  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = ((tasktrain, ours), (pl, theirs))


def _outcome(make):
    """'ok' (or what make returns, where it returns something), or the exception's class name and words."""
    try:
        made = make()
    except Exception as error:  # noqa: BLE001 (the exception is the result)
        return type(error).__name__, str(error)
    return "ok" if made is None or isinstance(made, (tasktrain.Trainer, pl.Trainer)) else made


@pytest.mark.parametrize("setting,values", [
    ("enable_checkpointing", (True, 1, False, None)), ("logger", (True, [], False, None)),
    ("enable_progress_bar", (True, False, None)), ("log_every_n_steps", (1, 50, 0, None)),
    ("enable_model_summary", (True, False, None)), ("num_sanity_val_steps", (2, -1, 0, None)),
    ("fast_dev_run", (True, 2, 0, False)), ("detect_anomaly", (True, False)), ("profiler", ("simple", None))])
def test_barebones_refuses_what_lightning_refuses_in_its_words(setting, values):
    for value in values:
        mine = _outcome(lambda: tasktrain.Trainer(barebones=True, **{setting: value}))
        lightning = _outcome(lambda: pl.Trainer(barebones=True, **{setting: value}))
        assert mine == lightning, (setting, value)
    assert mine == "ok" and lightning == "ok"  # (each list ends on a value barebones accepts)
    assert _outcome(lambda: tasktrain.Trainer(barebones=True, **{setting: values[0]}))[0] == "ValueError"


def _held(trainer):
    """What a Trainer holds after construction, in names both frameworks share."""
    return dict(
        barebones=trainer.barebones, logger=type(trainer.logger).__name__, loggers=len(trainer.loggers),
        checkpoint_callback=type(trainer.checkpoint_callback).__name__,
        checkpoint_callbacks=len(trainer.checkpoint_callbacks),
        progress_bar_callback=type(trainer.progress_bar_callback).__name__,
        log_every_n_steps=trainer.log_every_n_steps, num_sanity_val_steps=trainer.num_sanity_val_steps,
        callbacks=sorted(type(c).__name__ for c in trainer.callbacks if not isinstance(c, tasktrain.loggers.Logger)),
        fast_dev_run=trainer.fast_dev_run, _detect_anomaly=trainer._detect_anomaly)  # (the private name scripts read)


@pytest.mark.parametrize("kwargs", [dict(barebones=True), dict(), dict(barebones=False, logger=False),
                                    dict(barebones=True, max_time={"seconds": 60}), dict(detect_anomaly=True)])
def test_what_the_trainer_holds_is_lightnings(tmp_path, kwargs):
    mine = _held(tasktrain.Trainer(default_root_dir=str(tmp_path), **kwargs))
    lightning = _held(pl.Trainer(default_root_dir=str(tmp_path), **kwargs))
    assert mine == lightning
    if kwargs.get("barebones"):
        assert mine["logger"] == mine["checkpoint_callback"] == mine["progress_bar_callback"] == "NoneType"
        assert mine["log_every_n_steps"] == mine["num_sanity_val_steps"] == 0
    else:  # the defaults that are None in the signature: Lightning's values
        assert (mine["log_every_n_steps"], mine["num_sanity_val_steps"]) == (50, 2)
        assert mine["checkpoint_callback"] == "ModelCheckpoint"


@pytest.mark.parametrize("callback", ["ModelCheckpoint", "TQDMProgressBar", "ModelSummary", "EarlyStopping"])
def test_a_callback_given_beside_barebones_is_lightnings(tmp_path, callback):
    def build(lib):
        kwargs = {"monitor": "x"} if callback == "EarlyStopping" else {}
        trainer = lib.Trainer(barebones=True, default_root_dir=str(tmp_path),
                              callbacks=[getattr(lib.callbacks, callback)(**kwargs)])
        return sorted(type(c).__name__ for c in trainer.callbacks)

    mine, lightning = _outcome(lambda: build(tasktrain)), _outcome(lambda: build(pl))
    assert mine == lightning
    refused = callback in ("ModelCheckpoint", "TQDMProgressBar")  # (enable_checkpointing / _progress_bar=False)
    assert mine[0] == "MisconfigurationException" if refused else mine == [callback]


def test_the_defaults_are_lightnings_signature():
    import inspect

    names = ("logger", "enable_checkpointing", "enable_progress_bar", "log_every_n_steps", "enable_model_summary",
             "num_sanity_val_steps", "barebones", "fast_dev_run", "detect_anomaly", "profiler")
    mine = inspect.signature(tasktrain.Trainer).parameters
    lightning = inspect.signature(pl.Trainer).parameters
    assert {n: mine[n].default for n in names} == {n: lightning[n].default for n in names}


def test_barebones_notes_are_lightnings(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    seen = {}
    for lib, classes in LIBS:
        def build_and_fit():
            trainer = lib.Trainer(barebones=True, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
            trainer.fit(classes.BoringModel())

        name = "tasktrain" if lib is tasktrain else "lightning.pytorch"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            said = _logged(name, build_and_fit)
        seen[name] = [m.replace("LightningModule", "TaskModule") for m in said if "barebones" in m]
    assert seen["tasktrain"] == seen["lightning.pytorch"] and len(seen["tasktrain"]) == 2
    assert "deactivated:" in seen["tasktrain"][0] and "started running" in seen["tasktrain"][1]


HOOKS = ("setup", "on_fit_start", "on_sanity_check_start", "on_train_start", "on_train_epoch_start",
         "on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
         "on_before_zero_grad", "on_train_batch_end", "on_validation_start", "on_validation_epoch_start",
         "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end",
         "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown", "on_save_checkpoint")


def _barebones_fit(lib, classes, logs):
    calls = []

    def recorder(name):
        return lambda self, *args, **kwargs: calls.append(name)

    Recorder = type("Recorder", (lib.Callback,), {name: recorder(name) for name in HOOKS})

    class Logs(classes.BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            if logs:
                self.log("train_loss", out["loss"])
                self.log_dict({"a": 1.0, "b": 2.0}, prog_bar=True)
            return out

        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            if logs:
                self.log("val_loss", out["x"])
            return out

    lib.seed_everything(3, verbose=False)
    model = Logs()
    trainer = lib.Trainer(barebones=True, max_epochs=2, limit_train_batches=3, limit_val_batches=2,
                          callbacks=[Recorder()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
    said = [str(w.message) for w in caught if "barebones" in str(w.message)]
    return dict(weights={k: v.clone() for k, v in model.state_dict().items()}, calls=calls, said=said,
                metrics=(dict(trainer.callback_metrics), dict(trainer.logged_metrics),
                         dict(trainer.progress_bar_metrics)), step=trainer.global_step)


@pytest.mark.parametrize("logs", [False, True])
def test_a_barebones_fit_is_lightnings(logs):
    mine, lightning = (_barebones_fit(lib, classes, logs) for lib, classes in LIBS)
    assert mine["step"] == lightning["step"] == 6
    assert mine["weights"].keys() == lightning["weights"].keys()
    for name, value in lightning["weights"].items():
        torch.testing.assert_close(mine["weights"][name], value)
    assert mine["calls"] == lightning["calls"] and "on_sanity_check_start" not in mine["calls"]
    assert mine["metrics"] == lightning["metrics"] == ({}, {}, {})  # self.log logs nothing under barebones
    assert mine["said"] == lightning["said"]
    # Lightning warns at each call (3 names per training step, 1 per validation step)
    assert len(mine["said"]) == (6 * 3 + 2 * 2 if logs else 0)
