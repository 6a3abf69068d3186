"""Issue 37: ModelCheckpoint, EarlyStopping, LearningRateMonitor and Timer configured as a Lightning user does, run
under Lightning 2.6 itself (a test dependency, imported here only) and under tasktrain, side by side: the same tiny
Linear model, data and optimizer (CPU, one process, a few steps), then the files written (names and order of the
writes, links), the monitored scores, the callbacks' state_dict keys, the logged keys and the messages compared."""
import csv
import glob
import logging
import os
import warnings

import pytest
import torch
from helpers import loader

import tasktrain

EPOCHS = 2  # 2 steps an epoch: loader(16) in batches of 8, validation on loader(8)


@pytest.fixture(scope="module")
def L():
    import lightning

    return lightning


def lit_module(L, scheduler=False):
    class LitLinear(L.LightningModule):  # tests/helpers.Linear, as a LightningModule
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return configure(self, scheduler)

    return LitLinear()


def tt_module(scheduler=False):
    from helpers import Linear

    class Scheduled(Linear):
        def configure_optimizers(self):
            return configure(self, scheduler)

    return Scheduled()


def configure(module, scheduler):
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9 if scheduler else 0.0)
    if not scheduler:
        return optimizer
    return {"optimizer": optimizer,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5), "interval": "step"}}


def run(framework, L, root, callbacks, epochs=EPOCHS, logger=False, scheduler=False):
    """fit under `framework` ("lightning" or "tasktrain"); returns (trainer, the basenames of the checkpoint writes in
    their order)."""
    common = dict(max_epochs=epochs, callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, default_root_dir=root, log_every_n_steps=1)
    if framework == "lightning":
        if logger:
            logger = L.pytorch.loggers.CSVLogger(root, name="csv")
        trainer = L.Trainer(accelerator="cpu", devices=1, logger=logger, **common)
        module = lit_module(L, scheduler)
    else:
        if logger:
            logger = tasktrain.CSVLogger(root, name="csv")
        trainer = tasktrain.Trainer(logger=logger, **common)
        module = tt_module(scheduler)
    writes = []
    save = trainer.save_checkpoint

    def recorded(filepath, weights_only=False, *args, **kwargs):
        writes.append(os.path.basename(filepath))
        return save(filepath, weights_only)

    trainer.save_checkpoint = recorded
    trainer.fit(module, loader(16), loader(8))
    return trainer, writes


def folder(directory):
    """The checkpoint folder as a user's glob sees it: names, and where each link points."""
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "*")))
    links = {n: os.readlink(os.path.join(directory, n)) for n in names if os.path.islink(os.path.join(directory, n))}
    return names, links


def number(value):
    return None if value is None else round(float(value), 5)


CONFIGS = {
    # top 2 by a metric, last written after each top-k file (a second write, as Lightning does)
    "top2_last": dict(monitor="val_loss", save_top_k=2, save_last=True),
    # a step schedule, every file kept, last a link to the newest
    "steps_link": dict(every_n_train_steps=2, save_top_k=-1, save_last="link"),
    # verbose, a metric in the name, mode max: only the first epoch is a top-1 file
    "verbose_max": dict(filename="{epoch}-{val_loss:.2f}", monitor="val_loss", mode="max", verbose=True),
    # nothing kept but last: written once, when training ends
    "last_only": dict(save_top_k=0, save_last=True),
    # the step monitored (an int tensor): the scores keep the logged tensor's type
    "by_step": dict(monitor="step", mode="max", save_top_k=2),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_model_checkpoint_beside_lightning(L, tmp_path, caplog, capsys, config):
    seen = {}
    for framework, cls in (("lightning", L.pytorch.callbacks.ModelCheckpoint),
                           ("tasktrain", tasktrain.ModelCheckpoint)):
        directory = tmp_path / framework / "ckpt"
        checkpoint = cls(str(directory), **CONFIGS[config])  # dirpath positional, as Lightning's signature has it
        caplog.clear()
        capsys.readouterr()
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
            _, writes = run(framework, L, tmp_path / framework, [checkpoint])
        printed = capsys.readouterr().out.splitlines() + [r.getMessage() for r in caplog.records]
        messages = [line.replace(str(directory), "DIR") for line in printed if line.startswith("Epoch ")]
        stored = torch.load(os.path.join(directory, writes[-1]), weights_only=False)["callbacks"] if writes else {}
        seen[framework] = dict(
            writes=writes, folder=folder(directory), messages=messages,
            best=(os.path.basename(checkpoint.best_model_path), number(checkpoint.best_model_score)),
            kth=(os.path.basename(checkpoint.kth_best_model_path), number(getattr(checkpoint, "kth_value", None))),
            last=os.path.basename(checkpoint.last_model_path),
            top_k={os.path.basename(p): number(v) for p, v in checkpoint.best_k_models.items()},
            state_keys=list(checkpoint.state_dict()),
            # the scores are the logged tensors themselves, as Lightning keeps them (a user's .item() works)
            types=sorted({(type(v).__name__, str(getattr(v, "dtype", ""))) for v in [
                *checkpoint.best_k_models.values(), checkpoint.best_model_score, checkpoint.current_score,
                checkpoint.kth_value]}),
            stored_keys=[list(v) for k, v in stored.items() if k.startswith("ModelCheckpoint")])
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"]["writes"] or config == "last_only"  # the comparison saw files


@pytest.mark.parametrize("config", [CONFIGS["steps_link"], dict(monitor="val_loss", mode="max", save_last="link")])
def test_async_save_with_save_last_link_ends_as_lightnings_link(L, tmp_path, config):
    """tasktrain's async_save=True (background writes) with save_last="link" leaves the folder Lightning's synchronous
    saves leave: the same files, `last.ckpt` a symbolic link to the newest file written (with mode="max" only the
    first epoch's file is top-1: the second epoch links to it again)."""
    seen = {}
    for framework, cls, extra in (("lightning", L.pytorch.callbacks.ModelCheckpoint, {}),
                                  ("tasktrain", tasktrain.ModelCheckpoint, dict(async_save=True))):
        directory = tmp_path / framework / "ckpt"
        checkpoint = cls(str(directory), **config, **extra)
        run(framework, L, tmp_path / framework, [checkpoint])
        seen[framework] = (folder(directory), os.path.basename(checkpoint.last_model_path),
                           os.path.basename(checkpoint.best_model_path))
    assert seen["tasktrain"] == seen["lightning"]
    assert os.path.islink(tmp_path / "tasktrain" / "ckpt" / "last.ckpt")


def test_save_on_exception_files_and_message_beside_lightning(L, tmp_path, caplog, capsys):
    seen = {}
    for framework in ("lightning", "tasktrain"):
        base = lit_module(L) if framework == "lightning" else tt_module()

        class Fails(type(base)):
            def training_step(self, batch, batch_idx):
                if self.global_step == 3:
                    raise RuntimeError("boom")
                return super().training_step(batch, batch_idx)

        directory = tmp_path / framework / "ckpt"
        cls = L.pytorch.callbacks.ModelCheckpoint if framework == "lightning" else tasktrain.ModelCheckpoint
        common = dict(max_epochs=EPOCHS, enable_progress_bar=False, enable_model_summary=False, logger=False,
                      num_sanity_val_steps=0, default_root_dir=tmp_path / framework,
                      callbacks=[cls(str(directory), save_on_exception=True, save_last=True)])
        trainer = L.Trainer(accelerator="cpu", devices=1, **common) if framework == "lightning" else \
            tasktrain.Trainer(**common)
        caplog.clear()
        capsys.readouterr()
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"), pytest.raises(RuntimeError, match="boom"):
            trainer.fit(Fails(), loader(16), loader(8))
        printed = capsys.readouterr().out.splitlines() + [r.getMessage() for r in caplog.records]
        seen[framework] = (folder(directory), [line.replace(str(directory), "DIR") for line in printed
                                               if "was raised with message" in line])
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][1] == ["An RuntimeError was raised with message:             boom, saved checkpoint to "
                                    "DIR/epoch=1-step=3.ckpt"]


def test_version_counter_beside_lightning(L, tmp_path):
    """A second fit into the same folder: names taken by the first run's files get -v1 (enable_version_counter), and
    Lightning's "exists and is not empty" warning."""
    seen = {}
    for framework, cls in (("lightning", L.pytorch.callbacks.ModelCheckpoint),
                           ("tasktrain", tasktrain.ModelCheckpoint)):
        directory = str(tmp_path / framework / "ckpt")
        run(framework, L, tmp_path / framework, [cls(directory, monitor="val_loss", save_last=True)], epochs=1)
        with pytest.warns(UserWarning, match="exists and is not empty"):
            _, writes = run(framework, L, tmp_path / framework, [cls(directory, monitor="val_loss", save_last=True)],
                            epochs=1)
        _, off = run(framework, L, tmp_path / framework,
                     [cls(directory, monitor="val_loss", save_last=True, enable_version_counter=False)], epochs=1)
        seen[framework] = writes, off, folder(directory)
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0] == ["epoch=0-step=2-v1.ckpt", "last-v1.ckpt"]


def test_early_stopping_beside_lightning(L, tmp_path, caplog, capsys):
    seen = {}
    for framework, cls in (("lightning", L.pytorch.callbacks.EarlyStopping), ("tasktrain", tasktrain.EarlyStopping)):
        stopper = cls(monitor="val_loss", patience=1, mode="max", verbose=True)
        caplog.clear()
        capsys.readouterr()
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
            trainer, _ = run(framework, L, tmp_path / framework, [stopper], epochs=6)
        printed = capsys.readouterr().out.splitlines() + [r.getMessage() for r in caplog.records]
        seen[framework] = dict(
            stopped=(stopper.stopped_epoch, stopper.wait_count, trainer.current_epoch, trainer.global_step),
            best=number(stopper.best_score), reason=str(stopper.stopping_reason),
            reason_message=stopper.stopping_reason_message,
            messages=[line for line in printed if line.startswith(("Metric ", "Monitored "))],
            # None resolved in setup (validation once an epoch: checked at the train epoch end)
            resolved=stopper._check_on_train_epoch_end, keys=list(stopper.state_dict()))
        # what a subclass reads or overrides: the sign convention of min_delta, best_score a tensor (inf at start),
        # Lightning's state_key and mode error, the decomposed steps
        fresh = [cls("val_loss", min_delta=0.5, mode=mode) for mode in ("min", "max")]
        seen[framework]["fresh"] = [(es.state_key, es.min_delta, type(es.best_score), float(es.best_score),
                                     es.monitor_op, es.order_dict[es.mode]) for es in fresh]
        with pytest.raises(Exception) as error:  # MisconfigurationException (ours is a ValueError too)
            cls("val_loss", mode="lowest")
        seen[framework]["mode_error"] = (type(error.value).__name__, str(error.value))
        seen[framework]["steps"] = [callable(getattr(cls, name, None)) for name in (
            "_run_early_stopping_check", "_evaluate_stopping_criteria", "_improvement_message",
            "_validate_condition_metric", "_should_skip_check", "_log_info")]
        seen[framework]["evaluate"] = [fresh[0]._evaluate_stopping_criteria(torch.tensor(v)) for v in (2.0, 1.8, 1.0)]
        seen[framework]["evaluate"].append(fresh[0]._improvement_message(torch.tensor(0.2)))
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"]["stopped"][0] == 1 and seen["tasktrain"]["resolved"] is True
    assert seen["tasktrain"]["fresh"][0][0] == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"
    assert all(seen["tasktrain"]["steps"])
    # Lightning's keys, in its order, and no others
    lightning_keys = list(L.pytorch.callbacks.EarlyStopping(monitor="val_loss").state_dict())
    assert seen["tasktrain"]["keys"] == lightning_keys


EARLY_STOPPING_WHEN = {  # (Trainer arguments, trainer.val_check_interval written after Trainer(...) or not)
    "default": ({}, ()), "fraction": (dict(val_check_interval=0.5), ()),
    "one_batch": (dict(val_check_interval=1), ()),  # (1 == 1.0: Lightning's test lets an int 1 through)
    "every_2_epochs": (dict(check_val_every_n_epoch=2), ()),
    "steps_across_epochs": (dict(val_check_interval=3, check_val_every_n_epoch=None), ()),
    "written_none": ({}, (None,)), "written_fraction": ({}, (0.25,)),
    "time_then_written_1": (dict(val_check_interval={"minutes": 5}), (1.0,)),
}


@pytest.mark.parametrize("case", list(EARLY_STOPPING_WHEN))
def test_early_stopping_resolves_where_it_checks_as_lightning(L, case):
    """check_on_train_epoch_end=None resolved in setup by Lightning's test, on trainer.val_check_interval as it reads
    then: == 1.0 and check_val_every_n_epoch == 1 (a value written after Trainer(...) counts; None does not pass)."""
    flags, written = EARLY_STOPPING_WHEN[case]
    seen = {}
    for framework, lib in (("lightning", L.pytorch), ("tasktrain", tasktrain)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, **flags)
        for value in written:
            trainer.val_check_interval = value
        stopper = lib.callbacks.EarlyStopping("val_loss")
        stopper.setup(trainer, None, "fit")
        seen[framework] = stopper._check_on_train_epoch_end
    assert seen["tasktrain"] == seen["lightning"]


def test_early_stopping_with_a_time_val_check_interval_checks_after_each_validation(L):
    """A kept difference, a bug in Lightning (docs/lightning.md): with a time val_check_interval Lightning's Trainer has
    no val_check_interval attribute, and its EarlyStopping's setup fails on reading it; tasktrain's reads the interval
    as given, checks after each validation run, and its fit stops there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = L.pytorch.Trainer(logger=False, enable_progress_bar=False, val_check_interval="00:00:05:00")
    with pytest.raises(AttributeError, match="val_check_interval"):
        L.pytorch.callbacks.EarlyStopping("val_loss").setup(theirs, None, "fit")
    from tasktrain.demos.boring_classes import BoringModel

    class Logs(BoringModel):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", 1.0)  # never improves: patience 1 stops at the second check

    stopper = tasktrain.EarlyStopping("val_loss", patience=1)
    trainer = tasktrain.Trainer(max_epochs=5, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                                val_check_interval={"minutes": 5}, logger=False, enable_progress_bar=False,
                                enable_model_summary=False, enable_checkpointing=False, callbacks=[stopper])
    trainer._val_check_time_interval = 0.0  # (the interval is up after every batch: validation after each)
    trainer.fit(Logs())
    assert stopper._check_on_train_epoch_end is False
    assert (trainer.global_step, stopper.stopped_epoch) == (2, 0)  # (checked at validation ends, inside epoch 0)


def test_learning_rate_monitor_and_timer_beside_lightning(L, tmp_path, caplog, capsys):
    seen = {}
    for framework, callbacks in (("lightning", L.pytorch.callbacks), ("tasktrain", tasktrain)):
        monitor = callbacks.LearningRateMonitor(logging_interval="step", log_momentum=True)
        timer = callbacks.Timer(duration=dict(days=1), interval="step")
        trainer, _ = run(framework, L, tmp_path / framework, [monitor, timer], logger=True, scheduler=True)
        trainer.logger.save()
        with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        columns = {k for row in rows for k, v in row.items() if v not in ("", None)}
        seen[framework] = dict(
            lrs={k: [number(v) for v in vs] for k, vs in monitor.lrs.items()},
            logged=sorted(c for c in columns if c.startswith("lr-")),
            lr_values=[number(row["lr-SGD"]) for row in rows if row.get("lr-SGD")],
            timer_keys=list(timer.state_dict()), timer_ran=timer.time_elapsed("train") > 0)
        # a duration already spent: the run stops after its first step, with Lightning's message
        stopper = callbacks.Timer(duration="00:00:00:00", interval="step")
        caplog.clear()
        capsys.readouterr()
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
            trainer, _ = run(framework, L, tmp_path / framework / "timer", [stopper])
        printed = capsys.readouterr().out.splitlines() + [r.getMessage() for r in caplog.records]
        seen[framework]["timer_stop"] = (trainer.global_step, [m for m in printed if "Time limit reached" in m])
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"]["lrs"]["lr-SGD"] and seen["tasktrain"]["timer_stop"][1]


def test_constructor_arguments_are_lightnings(L, tmp_path):
    """The same names in the same positional order (tasktrain's extras after them: ModelCheckpoint's async_save),
    and the same defaults; EarlyStopping's strict: a missing metric fails (RuntimeError), or with strict=False the
    check is skipped and the run goes on."""
    import inspect

    for name in ("ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "Timer"):
        theirs = inspect.signature(getattr(L.pytorch.callbacks, name)).parameters
        ours = inspect.signature(getattr(tasktrain, name)).parameters
        assert list(ours)[:len(theirs)] == list(theirs), name
        assert [ours[p].default for p in theirs] == [theirs[p].default for p in theirs], name
    for framework, cls in (("lightning", L.pytorch.callbacks.EarlyStopping), ("tasktrain", tasktrain.EarlyStopping)):
        trainer, _ = run(framework, L, tmp_path / framework, [cls("not_logged", strict=False)], epochs=1)
        assert trainer.current_epoch == 1 and not trainer.should_stop
        with pytest.raises(RuntimeError, match="not_logged"):
            run(framework, L, tmp_path / framework, [cls("not_logged")], epochs=1)


def _error(cls, **kwargs):
    with pytest.raises(Exception) as info:
        cls(**kwargs)
    return type(info.value).__name__, str(info.value)


def test_model_checkpoint_api_beside_lightning(L, tmp_path, monkeypatch):
    """What Lightning users call or override on ModelCheckpoint, without training: the errors (type, and Lightning's
    message first: ours may add what to do), state_key, the names format_checkpoint_name and _format_checkpoint_name
    give (class constants changed on an instance, versions, prefixes, "/" and "." in metric names, a missing field
    written as 0), the schedule attributes, "~" in dirpath, _find_last_checkpoints, _link_checkpoint, and the state a
    checkpoint from another folder restores."""
    from datetime import timedelta
    from unittest.mock import Mock

    theirs, ours = L.pytorch.callbacks.ModelCheckpoint, tasktrain.ModelCheckpoint
    for bad in (dict(save_top_k=-3), dict(every_n_epochs=-3), dict(every_n_train_steps=-3), dict(mode="unknown"),
                dict(every_n_train_steps=2, every_n_epochs=2),
                dict(train_time_interval=timedelta(minutes=1), every_n_epochs=1)):
        (their_type, their_message), (our_type, our_message) = _error(theirs, **bad), _error(ours, **bad)
        assert our_type == their_type == "MisconfigurationException" and our_message.startswith(their_message), bad
    for config in (dict(monitor="val_loss"), dict(monitor="acc", mode="max", every_n_train_steps=3),
                   dict(train_time_interval=timedelta(seconds=5)), dict(every_n_epochs=0)):
        lit, tt = theirs(**config), ours(**config)
        assert tt.state_key == lit.state_key, config
        assert (tt._every_n_train_steps, tt._every_n_epochs, tt._train_time_interval, tt.every_n_epochs) == \
               (lit._every_n_train_steps, lit._every_n_epochs, lit._train_time_interval, lit.every_n_epochs)
    for name in ("CHECKPOINT_JOIN_CHAR", "CHECKPOINT_EQUALS_CHAR", "CHECKPOINT_NAME_LAST", "FILE_EXTENSION",
                 "STARTING_VERSION"):
        assert getattr(ours, name) == getattr(theirs, name), name

    def names(cls):
        out = []
        for dirpath, filename, metrics, kwargs in (
                (tmp_path, None, {"epoch": 3, "step": 2}, {}),
                (None, "{epoch:03d}-{acc}", {"epoch": 3, "acc": 0.03}, {}),
                (tmp_path, "name", {}, dict(ver=3)), (tmp_path, "name", {}, dict(prefix="test")),
                (None, "{epoch}_{val/loss:.5f}", {"epoch": 4, "val/loss": 0.03}, {}),
                (".", "{epoch}-{step}", {"epoch": torch.tensor(1), "step": torch.tensor(7)}, {}),
                (tmp_path, "{missing:d}", {}, {})):
            out.append(cls(dirpath=dirpath, filename=filename).format_checkpoint_name(dict(metrics), **kwargs))
        checkpoint = cls(dirpath=tmp_path)
        checkpoint.CHECKPOINT_JOIN_CHAR, checkpoint.CHECKPOINT_EQUALS_CHAR = "@", ":"
        out.append(checkpoint._format_checkpoint_name("{epoch},{acc:.5f}", {"epoch": 3, "acc": 0.03}, prefix="test"))
        out.append(checkpoint._format_checkpoint_name("mAP@0.50={val/mAP@0.50:.4f}", {"val/mAP@0.50": 0.2},
                                                      auto_insert_metric_name=False))
        out.append(cls(dirpath="~/ckpts").dirpath)
        return out

    with pytest.warns(UserWarning, match=r"uses \{missing\}, which was not logged: it is written as 0"):
        assert names(ours) == names(theirs)

    last_dir = tmp_path / "last_files"
    last_dir.mkdir()
    for name in ("last.ckpt", "last-1.ckpt", "last-v1.ckpt", "last.pt", "epoch=0.ckpt", "not-last.ckpt"):
        (last_dir / name).touch()
    assert ours(dirpath=last_dir)._find_last_checkpoints(None) == theirs(dirpath=last_dir)._find_last_checkpoints(None)
    for cls in (theirs, ours):  # a relative link, replacing a file that was there
        (tmp_path / f"{cls.__module__}.target").touch()
        link = tmp_path / f"{cls.__module__}.link"
        link.touch()
        cls._link_checkpoint(Mock(), filepath=str(tmp_path / f"{cls.__module__}.target"), linkpath=str(link))
        assert os.path.islink(link) and not os.path.isabs(os.readlink(link))

    # a state saved in another folder: only best_model_path is restored, with Lightning's warning
    saved = ours(dirpath=tmp_path / "first", monitor="val_loss", save_top_k=-1, save_last=True)
    saved.best_model_path, saved.best_model_score = str(tmp_path / "first" / "a.ckpt"), torch.tensor(0.5)
    saved.best_k_models, saved.last_model_path = {saved.best_model_path: torch.tensor(0.5)}, "last.ckpt"
    restored = {}
    for cls in (theirs, ours):
        checkpoint = cls(dirpath=tmp_path / "second", monitor="val_loss", save_top_k=-1, save_last=True)
        with pytest.warns(UserWarning, match="The dirpath has changed from .* Only `best_model_path` will be reloaded"):
            checkpoint.load_state_dict(saved.state_dict())
        restored[cls] = (checkpoint.best_model_path, checkpoint.best_model_score, checkpoint.best_k_models,
                         checkpoint.last_model_path, checkpoint.kth_best_model_path)
    assert restored[ours] == restored[theirs] == (saved.best_model_path, None, {}, "", "")


def test_model_checkpoint_state_under_the_old_key_still_loads(tmp_path):
    """state_key is Lightning's now; a checkpoint that tasktrain wrote under its earlier key (sorted settings, None
    for an unused schedule) restores the callback all the same."""
    from tasktrain.trainer.run_state import Callbacks

    checkpoint = tasktrain.ModelCheckpoint(monitor="val_loss")
    old_key = "ModelCheckpoint{'every_n_epochs': 1, 'every_n_train_steps': None, 'mode': 'min', 'monitor': 'val_loss'}"
    assert checkpoint.state_key != old_key
    state = {"best_model_path": "a.ckpt", "best_model_score": 0.25, "best_k_models": {"a.ckpt": 0.25}}
    Callbacks([checkpoint]).load_state_dict({old_key: state})
    assert (checkpoint.best_model_path, float(checkpoint.best_model_score)) == ("a.ckpt", 0.25)


def test_resume_keeps_the_resumed_from_file_beside_lightning(L, tmp_path):
    """Resuming into the same folder: the file the fit resumed from is never deleted by the top k (Lightning's rule),
    and the writes and the folder are Lightning's."""
    seen = {}
    for framework in ("lightning", "tasktrain"):
        cls = L.pytorch.callbacks.ModelCheckpoint if framework == "lightning" else tasktrain.ModelCheckpoint
        directory = tmp_path / framework / "ckpt"
        config = dict(monitor="step", mode="max", save_top_k=2, every_n_train_steps=2)
        trainer, first = run(framework, L, tmp_path / framework, [cls(directory, **config)], epochs=2)
        resume_from = str(directory / first[-1])
        common = dict(max_epochs=4, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      default_root_dir=tmp_path / framework, logger=False, callbacks=[cls(directory, **config)])
        if framework == "lightning":
            trainer, module = L.Trainer(accelerator="cpu", devices=1, **common), lit_module(L)
        else:
            trainer, module = tasktrain.Trainer(**common), tt_module()
        with pytest.warns(UserWarning, match="exists and is not empty"):
            trainer.fit(module, loader(16), loader(8), ckpt_path=resume_from)
        seen[framework] = first, folder(directory)
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][1][0] == ["epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt", "epoch=3-step=8.ckpt"]


def test_resuming_from_a_weights_only_checkpoint_is_lightnings_key_error(L, tmp_path):
    """A fit resumed from a ModelCheckpoint(save_weights_only=True) file: Lightning's KeyError (its words first)."""
    seen = {}
    for framework in ("lightning", "tasktrain"):
        cls = L.pytorch.callbacks.ModelCheckpoint if framework == "lightning" else tasktrain.ModelCheckpoint
        directory = tmp_path / framework / "ckpt"
        trainer, files = run(framework, L, tmp_path / framework, [cls(directory, save_weights_only=True)], epochs=1)
        common = dict(max_epochs=2, enable_progress_bar=False, enable_model_summary=False, logger=False,
                      enable_checkpointing=False, default_root_dir=tmp_path / framework)
        if framework == "lightning":
            trainer, module = L.Trainer(accelerator="cpu", devices=1, **common), lit_module(L)
        else:
            trainer, module = tasktrain.Trainer(**common), tt_module()
        with pytest.raises(KeyError) as refused:
            trainer.fit(module, loader(16), loader(8), ckpt_path=str(directory / files[-1]))
        seen[framework] = str(refused.value).split(" This is probably")[0]
    assert seen["tasktrain"] == seen["lightning"] == "'Trying to restore optimizer state but checkpoint contains only " \
                                                     "the model."


def test_a_missing_ckpt_path_is_lightnings_file_not_found(L, tmp_path):
    """fit / validate given a ckpt_path where no file is: Lightning's FileNotFoundError and words, before training."""
    seen = {}
    for framework in ("lightning", "tasktrain"):
        common = dict(max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                      enable_checkpointing=False, default_root_dir=tmp_path / framework)
        if framework == "lightning":
            trainer, module = L.Trainer(accelerator="cpu", devices=1, **common), lit_module(L)
        else:
            trainer, module = tasktrain.Trainer(**common), tt_module()
        before = [p.detach().clone() for p in module.parameters()]
        missing = str(tmp_path / "missing.ckpt")
        with pytest.raises(FileNotFoundError) as fit_refused:
            trainer.fit(module, loader(16), ckpt_path=missing)
        with pytest.raises(FileNotFoundError) as validate_refused:
            trainer.validate(module, loader(8), ckpt_path=missing)
        untouched = all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
        seen[framework] = [str(e.value).split(" (")[0] for e in (fit_refused, validate_refused)], untouched
    assert seen["tasktrain"] == seen["lightning"] == ([f"Checkpoint file not found: {tmp_path}/missing.ckpt"] * 2,
                                                      True)


def test_learning_rate_monitor_names_as_lightnings(L):
    """Names and histories worked out as Lightning does, on the same optimizers and scheduler configs (a stand-in
    trainer: the naming reads only these): schedulers' optimizers first, param-group names, "-1" for a second
    optimizer of a class, the history moved to "/pg1" when a group is added, callback_metrics filled; duplicate group
    names refused."""
    from types import SimpleNamespace

    def trainer_of(optimizers, configs):
        return SimpleNamespace(optimizers=optimizers, lr_scheduler_configs=configs, callback_metrics={}, loggers=[1],
                               strategy=SimpleNamespace(root_device=torch.device("cpu")))

    def params(n=1):
        return [torch.nn.Parameter(torch.zeros(1)) for _ in range(n)]

    seen = {}
    for framework, cls in (("lightning", L.pytorch.callbacks.LearningRateMonitor),
                           ("tasktrain", tasktrain.LearningRateMonitor)):
        sgd = torch.optim.SGD(params(), lr=0.1, momentum=0.9)
        adam = torch.optim.Adam([{"params": params(), "name": "head"}, {"params": params()}], lr=0.01)
        adam2 = torch.optim.Adam(params(), lr=0.02, weight_decay=0.5)
        scheduler = torch.optim.lr_scheduler.StepLR(adam2, 1)
        config = SimpleNamespace(scheduler=scheduler, name=None, interval="epoch", frequency=1)
        trainer = trainer_of([sgd, adam, adam2], [config])
        monitor = cls(log_momentum=True, log_weight_decay=True)
        monitor.on_train_start(trainer, None)
        names = list(monitor.lrs)
        step = monitor._extract_stats(trainer, "step")
        epoch = monitor._extract_stats(trainer, "epoch")
        sgd.add_param_group({"params": params(), "lr": 0.3})  # BaseFinetuning's unfreeze
        monitor._extract_stats(trainer, "any")
        seen[framework] = dict(names=names, step=step, epoch=epoch, lrs=monitor.lrs,
                               metrics=sorted(trainer.callback_metrics),
                               momentum=dict(monitor.last_momentum_values),
                               decay=dict(monitor.last_weight_decay_values))
        twin = torch.optim.SGD([{"params": params(), "name": "x"}, {"params": params(), "name": "x"}], lr=0.1)
        with pytest.raises(Exception, match="duplicated parameter group names"):
            cls().on_train_start(trainer_of([twin], []), None)
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"]["names"] == ["lr-Adam", "lr-SGD", "lr-Adam-1/head", "lr-Adam-1/pg2"]
    assert seen["tasktrain"]["lrs"]["lr-SGD/pg1"] == [0.1, 0.1, 0.1]


def test_save_checkpoint_override_sees_every_write_beside_lightning(L, tmp_path):
    """_save_checkpoint(trainer, filepath), Lightning's override point for every file ModelCheckpoint writes (an
    upload, a copy): called for the same files in the same order; under async_save (which writes in the background
    and would skip it) such an override is refused at set-up."""
    seen = {}
    for framework, base in (("lightning", L.pytorch.callbacks.ModelCheckpoint), ("tasktrain", tasktrain.ModelCheckpoint)):
        calls = []

        class Uploading(base):
            def _save_checkpoint(self, trainer, filepath):
                super()._save_checkpoint(trainer, filepath)
                calls.append(os.path.basename(filepath))

        checkpoint = Uploading(tmp_path / framework, monitor="val_loss", save_top_k=2, save_last=True)
        _, writes = run(framework, L, tmp_path / framework, [checkpoint])
        seen[framework] = calls, writes
    assert seen["tasktrain"] == seen["lightning"] and seen["tasktrain"][0]

    class Uploading(tasktrain.ModelCheckpoint):
        def _save_checkpoint(self, trainer, filepath):
            super()._save_checkpoint(trainer, filepath)

    trainer = tasktrain.Trainer(max_epochs=1, callbacks=[Uploading(tmp_path / "async", async_save=True)],
                                enable_progress_bar=False, enable_model_summary=False, logger=False)
    with pytest.raises(ValueError, match="overrides _save_checkpoint, which async_save=True does not call"):
        trainer.fit(tt_module(), loader(16), loader(8))


def test_narrower_override_points_beside_lightning(L, tmp_path):
    """Lightning's other override points of ModelCheckpoint: _save_monitor_checkpoint / _save_none_monitor_checkpoint
    (the top-k save with and without a monitor), _save_last_checkpoint naming `last` from the candidates it is given
    (a subclass adds its own field), _should_save_on_train_epoch_end (where the epoch schedule saves): called as
    often, with the same candidates, the same files written."""
    seen = {}
    for framework, base in (("lightning", L.pytorch.callbacks.ModelCheckpoint), ("tasktrain", tasktrain.ModelCheckpoint)):
        calls = []

        class Tagged(base):
            CHECKPOINT_NAME_LAST = "{tag}-last"

            def _save_monitor_checkpoint(self, trainer, monitor_candidates):
                calls.append(("monitor", int(monitor_candidates["step"])))
                super()._save_monitor_checkpoint(trainer, monitor_candidates)

            def _save_none_monitor_checkpoint(self, trainer, monitor_candidates):
                calls.append(("none", int(monitor_candidates["step"])))
                super()._save_none_monitor_checkpoint(trainer, monitor_candidates)

            def _save_last_checkpoint(self, trainer, monitor_candidates):
                super()._save_last_checkpoint(trainer, {**monitor_candidates, "tag": torch.tensor(7)})

        class AtValidationEnds(base):
            def _should_save_on_train_epoch_end(self, trainer):
                calls.append("asked")
                return False

        callbacks = [Tagged(tmp_path / framework, monitor="val_loss", save_top_k=1, save_last=True),
                     Tagged(tmp_path / framework / "none", filename="n{step}", save_top_k=1),
                     AtValidationEnds(tmp_path / framework / "ends", filename="e{step}", save_top_k=-1)]
        trainer, writes = run(framework, L, tmp_path / framework, callbacks)
        seen[framework] = sorted(set(calls), key=str), writes, callbacks[0].last_model_path.endswith("tag=7-last.ckpt")
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][2] and ("none", 4) in seen["tasktrain"][0] and "asked" in seen["tasktrain"][0]


def test_a_file_lightning_wrote_evaluates_and_resumes_a_fit_at_an_epoch_boundary(L, tmp_path):
    """A checkpoint Lightning's fit wrote: tasktrain's validate(ckpt_path=) restores its weights (the loss Lightning's
    validate of the same file gives); a fit resumes from one saved at an epoch's end (ModelCheckpoint's default) or
    after a fit as Lightning's resume of the same file does (weights, optimizer momentum and scheduler, counters)."""
    saver = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt")
    trainer, _ = run("lightning", L, tmp_path / "lightning", [saver], epochs=1, scheduler=True)
    trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    path = saver.best_model_path  # epoch=0-step=2.ckpt: the epoch's end
    theirs = trainer.validate(lit_module(L), loader(8), ckpt_path=path, verbose=False)
    common = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path / "t",
                  num_sanity_val_steps=0)
    ours = tasktrain.Trainer(**common).validate(tt_module(), loader(8), ckpt_path=path, verbose=False)
    assert ours[0]["val_loss"] == pytest.approx(theirs[0]["val_loss"], rel=1e-6)
    assert ours[0]["val_loss"] != pytest.approx(tasktrain.Trainer(**common).validate(tt_module(), loader(8),
                                                                                     verbose=False)[0]["val_loss"])

    def resumed(lib, module, ckpt_path):
        starts = []
        marker = (L.pytorch.callbacks.Callback if lib is L.pytorch else tasktrain.Callback)
        recorder = type("Starts", (marker,), {"on_train_epoch_start": lambda self, t, m: starts.append(
            (t.current_epoch, t.global_step))})()
        kwargs = dict(accelerator="cpu", devices=1) if lib is L.pytorch else {}
        fit = lib.Trainer(max_epochs=3, callbacks=[recorder], **kwargs, **common)
        fit.fit(module, loader(16), loader(8), ckpt_path=ckpt_path)
        return dict(weights=[p.detach().tolist() for p in module.parameters()], step=fit.global_step,
                    epoch=fit.current_epoch, lr=fit.optimizers[0].param_groups[0]["lr"], starts=starts,
                    stepped=fit.fit_loop.epoch_loop._batches_that_stepped)

    for ckpt_path in (path, str(tmp_path / "after_fit.ckpt")):
        mine = resumed(tasktrain, tt_module(scheduler=True), ckpt_path)
        assert mine == resumed(L.pytorch, lit_module(L, scheduler=True), ckpt_path)
        assert mine["starts"] == [(1, 2), (2, 4)] and mine["step"] == 6


def test_a_file_lightning_saved_inside_an_epoch_resumes_as_lightnings_restart(L, tmp_path):
    """A checkpoint Lightning's fit saved inside an epoch (every_n_train_steps: in on_train_batch_end; a validation
    inside the epoch; OnExceptionCheckpoint's, inside a batch), resumed by tasktrain's fit as by Lightning's: the batch indices, global_step and the loggers'
    step the hooks see go on from the saved batch; a plain DataLoader is read again from its first batch (Lightning's
    restart, with its warning), a StatefulDataLoader goes on from the state Lightning saved; the same weights after.
    A tasktrain checkpoint saved later in the epoch read again resumes with the data that epoch read."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from helpers import regression_data

    common = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                  val_check_interval=2)  # 4 batches an epoch, a validation after batch 1 and at the epoch's end

    def stateful():
        return StatefulDataLoader(regression_data(32, 0), batch_size=8)

    def fit(lib, make_loader, ckpt_path=None, callbacks=(), epochs=2):
        seen = []
        marker = L.pytorch.callbacks.Callback if lib is L.pytorch else tasktrain.Callback

        class Seen(marker):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                seen.append((trainer.current_epoch, batch_idx, trainer.global_step, round(float(batch[0][0, 0]), 4),
                             trainer.fit_loop.epoch_loop._batches_that_stepped, trainer.fit_loop.total_batch_idx))

            def on_validation_start(self, trainer, module):
                seen.append(("validation", trainer.global_step))

            def on_train_epoch_start(self, trainer, module):
                seen.append(("epoch start", trainer.current_epoch))

        kwargs = dict(accelerator="cpu", devices=1) if lib is L.pytorch else {}
        trainer = lib.Trainer(max_epochs=epochs, callbacks=[Seen(), *callbacks], default_root_dir=tmp_path / "runs",
                              **kwargs, **common)
        module = lit_module(L, scheduler=True) if lib is L.pytorch else tt_module(scheduler=True)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer.fit(module, make_loader(), loader(8), ckpt_path=ckpt_path)
        told = [str(w.message) for w in said if "ended before the epoch ended" in str(w.message)]
        return dict(seen=seen, weights=[p.detach().tolist() for p in module.parameters()], step=trainer.global_step,
                    told=told, lr=trainer.optimizers[0].param_groups[0]["lr"])

    for make_loader, name in ((lambda: loader(32), "plain"), (stateful, "stateful")):
        steps = L.pytorch.callbacks.ModelCheckpoint(tmp_path / name, every_n_train_steps=1, save_top_k=-1,
                                                    filename="s{step}", auto_insert_metric_name=False)
        validations = L.pytorch.callbacks.ModelCheckpoint(tmp_path / name, save_top_k=-1, filename="v{step}",
                                                          auto_insert_metric_name=False)
        fit(L.pytorch, make_loader, callbacks=[steps, validations], epochs=1)
        for saved in ("s1", "v2") if name == "plain" else ("s2",):
            path = str(tmp_path / name / f"{saved}.ckpt")
            mine = fit(tasktrain, make_loader, path)
            assert mine == fit(L.pytorch, make_loader, path), (name, saved)
            assert mine["step"] == 8 and mine["seen"][0][:2] == (0, int(saved[1]))  # (no epoch start: it goes on)
            if name == "plain":  # the loader from its first batch at the saved index, Lightning's warning said
                assert mine["seen"][0][3] == -1.1258 and len(mine["told"]) == 1
            else:  # the stateful loader from its saved state: the batch that index reads in a whole epoch
                assert mine["seen"][0][3] == -0.5692 and not mine["told"]

    class Boom(L.pytorch.callbacks.Callback):  # an exception inside batch 2, before its step: OnExceptionCheckpoint's
        def on_before_optimizer_step(self, trainer, module, optimizer):
            if trainer.global_step == 2:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit(L.pytorch, lambda: loader(32), epochs=1,
            callbacks=[L.pytorch.callbacks.OnExceptionCheckpoint(tmp_path / "exc"), Boom()])
    path = str(tmp_path / "exc" / "on_exception.ckpt")
    mine = fit(tasktrain, lambda: loader(32), path)
    assert mine == fit(L.pytorch, lambda: loader(32), path)
    assert mine["seen"][0][:4] == (0, 2, 2, -1.1258)  # at the failed batch's index, from the loader's first batch
    # a tasktrain checkpoint written in the epoch read again goes on with the data that epoch read
    ours = tasktrain.ModelCheckpoint(tmp_path / "ours", every_n_train_steps=1, save_top_k=-1, filename="s{step}",
                                     auto_insert_metric_name=False)
    whole = fit(tasktrain, lambda: loader(32), str(tmp_path / "plain" / "s1.ckpt"), callbacks=[ours])
    part = fit(tasktrain, lambda: loader(32), str(tmp_path / "ours" / "s2.ckpt"))
    assert whole["seen"][1] == ("validation", 2)  # (after batch 1: the file of its on_train_batch_end skips it)
    assert part["seen"] == whole["seen"][2:] and part["weights"] == whole["weights"] and part["lr"] == whole["lr"]


def test_lightnings_trainer_resumes_a_file_tasktrain_wrote(L, tmp_path):
    """A tasktrain checkpoint carries Lightning's loop progress (ckpt["loops"]["fit_loop"], validate_loop, test_loop,
    predict_loop: trainer.fit_loop.state_dict()), the same dicts Lightning's checkpoint of the same point holds (at an
    epoch's end and inside an epoch), so that Lightning's Trainer resumes the file as tasktrain does (the batches the
    hooks see, the counters, the weights and learning rate after); tasktrain's own keys beside them still rule its
    resume."""
    common = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    for framework, lib in (("lightning", L.pytorch), ("tasktrain", tasktrain)):
        savers = [lib.callbacks.ModelCheckpoint(tmp_path / framework, save_top_k=-1, filename="e{step}",
                                                auto_insert_metric_name=False),
                  lib.callbacks.ModelCheckpoint(tmp_path / framework, every_n_train_steps=1, save_top_k=-1,
                                                filename="s{step}", auto_insert_metric_name=False)]
        kwargs = dict(accelerator="cpu", devices=1) if lib is L.pytorch else {}
        lib.Trainer(max_epochs=1, callbacks=savers, default_root_dir=tmp_path / "r", **kwargs, **common).fit(
            lit_module(L, scheduler=True) if lib is L.pytorch else tt_module(scheduler=True), loader(16), loader(8))
    for name in ("e2", "s1"):
        theirs, ours = (torch.load(tmp_path / framework / f"{name}.ckpt", weights_only=False)["loops"]
                        for framework in ("lightning", "tasktrain"))
        for loop in ("fit_loop", "validate_loop", "test_loop", "predict_loop"):
            assert ours[loop] == theirs[loop], (name, loop)

    def resumed(lib):
        seen = []
        marker = L.pytorch.callbacks.Callback if lib is L.pytorch else tasktrain.Callback

        class Seen(marker):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                seen.append((trainer.current_epoch, batch_idx, trainer.global_step,
                             trainer.fit_loop.epoch_loop._batches_that_stepped))

        kwargs = dict(accelerator="cpu", devices=1) if lib is L.pytorch else {}
        trainer = lib.Trainer(max_epochs=3, callbacks=[Seen()], default_root_dir=tmp_path / "r", **kwargs, **common)
        module = lit_module(L, scheduler=True) if lib is L.pytorch else tt_module(scheduler=True)
        trainer.fit(module, loader(16), loader(8), ckpt_path=tmp_path / "tasktrain" / "e2.ckpt")
        return dict(seen=seen, weights=[p.detach().tolist() for p in module.parameters()], step=trainer.global_step,
                    lr=trainer.optimizers[0].param_groups[0]["lr"])

    mine = resumed(tasktrain)
    assert mine == resumed(L.pytorch)
    assert mine["seen"][0] == (1, 0, 2, 2) and mine["step"] == 6


def test_ckpt_path_last_and_the_folder_beside_lightning(L, tmp_path):
    """ckpt_path="last" resolves as Lightning's (the newest last file; none: its warning and a fresh fit), a fit with
    an OnExceptionCheckpoint and no ckpt_path continues "last", and a checkpoint folder that is default_root_dir
    holds the same files (nothing of tasktrain's beside them)."""
    seen = {}
    for framework in ("lightning", "tasktrain"):
        pl = L.pytorch if framework == "lightning" else tasktrain
        root = tmp_path / framework

        class Crash(pl.Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                if trainer.global_step == 3 and trainer.max_epochs == 3:
                    raise RuntimeError("crash")

        def fit(epochs, callbacks, ckpt_path=None):
            common = dict(max_epochs=epochs, callbacks=callbacks, enable_progress_bar=False, logger=False,
                          enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root)
            trainer = (L.Trainer(accelerator="cpu", devices=1, **common) if framework == "lightning"
                       else tasktrain.Trainer(**common))
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                try:
                    trainer.fit(lit_module(L) if framework == "lightning" else tt_module(), loader(16), loader(8),
                                ckpt_path=ckpt_path)
                except RuntimeError:
                    pass
            messages = [str(w.message).replace(str(root), "ROOT") for w in said
                        if "ckpt_path" in str(w.message) or "Checkpoint directory" in str(w.message)]
            return trainer.global_step, os.path.basename(trainer.ckpt_path or ""), messages

        results = [fit(2, [pl.callbacks.ModelCheckpoint(root, save_last=True), Crash()]),
                   sorted(os.listdir(root)),
                   fit(3, [pl.callbacks.ModelCheckpoint(root, save_last=True)], "last"),
                   fit(3, [pl.callbacks.ModelCheckpoint(root / "other")], "last"),
                   fit(3, [pl.callbacks.OnExceptionCheckpoint(root / "exc"), Crash()]),
                   fit(4, [pl.callbacks.OnExceptionCheckpoint(root / "exc")])]
        seen[framework] = results
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][1] == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert seen["tasktrain"][2][:2] == (6, "last.ckpt") and seen["tasktrain"][5][:2] == (8, "on_exception.ckpt")


def test_evaluation_after_fit_without_a_module_uses_the_best_as_lightning(L, tmp_path):
    """trainer.validate()/test() with no module and no ckpt_path after a fit: Lightning's "best" (here an earlier
    epoch's weights, mode="max"), with its warning; without a ModelCheckpoint its error."""
    seen = {}
    for framework in ("lightning", "tasktrain"):
        pl = L.pytorch if framework == "lightning" else tasktrain
        best = pl.callbacks.ModelCheckpoint(tmp_path / framework, monitor="val_loss", mode="max")
        trainer, _ = run(framework, L, tmp_path / framework, [best], epochs=3)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            metrics = trainer.validate(dataloaders=loader(8), verbose=False)
        said = [str(w.message) for w in said if "ckpt_path" in str(w.message)]
        plain = run(framework, L, tmp_path / f"{framework}-none", [], epochs=1)[0]
        plain_error = None
        plain.callbacks.remove(plain.checkpoint_callback)  # the default ModelCheckpoint both add
        try:
            plain.test(dataloaders=loader(8), verbose=False)
        except ValueError as err:
            plain_error = str(err)
        seen[framework] = (os.path.basename(best.best_model_path), round(metrics[0]["val_loss"], 5), said,
                           plain_error)
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0] == "epoch=0-step=2.ckpt" and seen["tasktrain"][3]


def hooked_module(base, log):
    """tests/helpers.Linear under `base` (LightningModule or TaskModule) with a step ReduceLROnPlateau on train_loss
    and an epoch StepLR, recording the hooks around the epoch's end and what each saved checkpoint holds."""
    class Hooked(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.9)
            epochly = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
            # strict=False: after a resume Lightning has no train_loss for the step its checkpoint was saved before
            return [optimizer], [{"scheduler": plateau, "interval": "step", "monitor": "train_loss", "strict": False},
                                 {"scheduler": epochly, "interval": "epoch"}]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            log.append(f"batch_end {self.current_epoch}/{batch_idx}")

        def on_validation_end(self):
            log.append("validation_end")

        def on_train_epoch_end(self):
            log.append("train_epoch_end")
            self.log("epoch_value", float(self.current_epoch))

        def lr_scheduler_step(self, scheduler, metric):
            log.append("step " + type(scheduler).__name__)
            super().lr_scheduler_step(scheduler, metric)

        def on_save_checkpoint(self, checkpoint):
            log.append(("save", checkpoint["epoch"], checkpoint["global_step"],
                        [s["last_epoch"] for s in checkpoint["lr_schedulers"]],
                        sorted(self.trainer.callback_metrics)))

    return Hooked()


@pytest.mark.parametrize("save_on_train_epoch_end", [False, True, None])
def test_epoch_end_validation_checkpoint_saved_and_resumed_where_lightning_does(L, tmp_path, save_on_train_epoch_end):
    """With check_val_every_n_epoch=2, ModelCheckpoint saves the epoch-end validation's checkpoint at its
    on_validation_end where saves are at validation ends (False; None resolves to False): before the step
    ReduceLROnPlateau steps after that validation and before on_train_epoch_end (its value not in the file's
    callback_metrics yet); True saves at on_train_epoch_end. Hook order, scheduler states, the files written and the
    folder are Lightning's; a resume from that file runs the epoch's end (on_train_epoch_end, not the validation
    again) as Lightning's does, and in tasktrain it ends on the uninterrupted fit's weights (Lightning's resume does not:
    it skips the pending plateau step)."""
    seen, weights, plateau_steps = {}, {}, {}
    for framework in ("lightning", "tasktrain"):
        log = []
        if framework == "lightning":
            base, cls = L.LightningModule, L.pytorch.callbacks.ModelCheckpoint
        else:
            base, cls = tasktrain.TaskModule, tasktrain.ModelCheckpoint

        def fit(directory, epochs, ckpt_path=None):
            checkpoint = cls(directory, save_top_k=-1, save_last=True, save_on_train_epoch_end=save_on_train_epoch_end)
            common = dict(max_epochs=epochs, callbacks=[checkpoint], enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path / framework,
                          logger=False, check_val_every_n_epoch=2)
            if framework == "lightning":
                trainer = L.Trainer(accelerator="cpu", devices=1, **common)
            else:
                trainer = tasktrain.Trainer(**common)
            writes, save = [], trainer.save_checkpoint
            trainer.save_checkpoint = lambda path, weights_only=False: (writes.append(os.path.basename(path)),
                                                                        save(path, weights_only))
            module = hooked_module(base, log)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(module, loader(16), loader(8), ckpt_path=ckpt_path)
            return module.layer.weight.detach().clone(), writes

        directory = tmp_path / framework / "ckpt"
        full, writes = fit(directory, 3)
        first = list(log)
        log.clear()
        resumed, resumed_writes = fit(tmp_path / framework / "again", 3, str(directory / "epoch=1-step=4.ckpt"))
        # (the plateau's steps after the resume are compared below: tasktrain takes the one the file was saved
        # before, Lightning skips it)
        plateau_steps[framework] = [e[3][0] for e in log if e[0] == "save"]
        seen[framework] = dict(first=first, writes=writes, folder=folder(directory), resumed_writes=resumed_writes,
                               resumed=[e[:3] + (e[3][1:],) + e[4:] if e[0] == "save" else e for e in log
                                        if not (isinstance(e, str) and e.startswith("step Reduce"))])
        weights[framework] = full, resumed
    assert seen["tasktrain"] == seen["lightning"]
    pending = 0 if save_on_train_epoch_end else 1
    assert plateau_steps["tasktrain"] == [n + pending for n in plateau_steps["lightning"]] and plateau_steps["lightning"]
    first = seen["tasktrain"]["first"]
    save_at = first.index(next(e for e in first if e[0] == "save" and e[1] == 1))
    if save_on_train_epoch_end:  # after epoch 1's hooks (epoch 1's validation ran and all of its 4 steps)
        assert first[save_at - 4:save_at] == ["batch_end 1/1", "validation_end", "step ReduceLROnPlateau",
                                              "train_epoch_end"] and first[save_at][3] == [4, 2]
    else:  # after the validation, before the plateau step and the epoch's end: 3 plateau steps of 4 taken
        assert first[save_at - 1] == "batch_end 1/1" and first[save_at + 2:save_at + 4] == [
            "validation_end", "step ReduceLROnPlateau"]
        assert first[save_at][3] == [3, 2] and first[save_at + 4] == "train_epoch_end"
        # the resumed fit runs epoch 1's end first: no validation, no batch again
        assert seen["tasktrain"]["resumed"][0] == "train_epoch_end"
    assert torch.equal(weights["tasktrain"][1], weights["tasktrain"][0])  # tasktrain's resume is exact
    assert torch.equal(weights["tasktrain"][0], weights["lightning"][0])  # the same uninterrupted fit as Lightning


def test_resume_from_a_mid_epoch_validation_checkpoint_takes_the_pending_plateau_step(tmp_path):
    """val_check_interval=0.5: the file saved at the mid-epoch validation's end comes before the step plateau
    scheduler's step of that batch; it keeps the watched value (train_state's plateau_step_values) and the resumed fit
    takes the step first, ending on the uninterrupted fit's weights and scheduler state (Lightning's resume skips it)."""
    def fit(directory, ckpt_path=None):
        log = []
        trainer = tasktrain.Trainer(max_epochs=2, val_check_interval=0.5, num_sanity_val_steps=0, logger=False,
                                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                                    callbacks=[tasktrain.ModelCheckpoint(directory, save_top_k=-1)])
        module = hooked_module(tasktrain.TaskModule, log)
        trainer.fit(module, loader(32), loader(8), ckpt_path=ckpt_path)
        return module.layer.weight.detach().clone(), trainer.lr_scheduler_configs[0].scheduler.state_dict()

    full, plateau = fit(tmp_path / "a")
    saved = torch.load(tmp_path / "a" / "epoch=0-step=2.ckpt", weights_only=True)
    assert list(saved["loops"]["train_state"]["plateau_step_values"]) == ["train_loss"]
    assert saved["lr_schedulers"][0]["last_epoch"] == 1  # the second step still to come
    resumed, resumed_plateau = fit(tmp_path / "b", str(tmp_path / "a" / "epoch=0-step=2.ckpt"))
    assert torch.equal(resumed, full) and resumed_plateau == plateau


STEP_SAVES = {  # every_n_train_steps where Lightning 2.6 saves: at the batch, or deferred to a validation's end
    "no_monitor": (dict(every_n_train_steps=4, save_top_k=-1), {}),
    "monitor_not_logged_yet": (dict(every_n_train_steps=4, monitor="val_loss", save_top_k=2), {}),
    "epoch_end_saves": (dict(every_n_train_steps=4, monitor="train_loss", save_top_k=-1, save_on_train_epoch_end=True),
                        {}),
    "stale_value_and_last": (dict(every_n_train_steps=4, monitor="val_loss", save_top_k=-1, save_last=True), {}),
    "inside_validations": (dict(every_n_train_steps=3, monitor="val_loss", save_top_k=-1),
                           dict(val_check_interval=0.5)),
    "validation_end_saves": (dict(every_n_train_steps=4, save_top_k=-1, save_on_train_epoch_end=False), {}),
}


def _step_saves(lib, classes, root, checkpoint, trainer_args):
    """A fit of 2 epochs of 8 batches, validation of 2 batches: each save as (the hook it came from, the step), and
    the files."""
    saves, _, _, files = _recorded_fit(lib, classes, root, checkpoint, dict(limit_val_batches=2, **trainer_args),
                                       epochs=2, batches=8)
    return saves, files


@pytest.mark.parametrize("case", list(STEP_SAVES))
def test_step_saves_where_and_what_lightning_saves(L, tmp_path, case):
    from lightning.pytorch.demos import boring_classes as theirs

    from tasktrain.demos import boring_classes as ours

    checkpoint, trainer_args = STEP_SAVES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = _step_saves(tasktrain, ours, tmp_path / "ours", checkpoint, trainer_args)
        theirs_ = _step_saves(L.pytorch, theirs, tmp_path / "theirs", checkpoint, trainer_args)
    assert mine == theirs_
    assert mine[0]  # (each case saves something)


def test_a_step_checkpoint_of_a_loader_without_length_resumes(tmp_path):
    """Lightning's #20565 case: a step save at an epoch's last batch (now at the batch's end, inside the epoch) of a
    loader without a length, limited by limit_train_batches, resumes to more epochs (it raised a TypeError)."""
    from tasktrain.demos.boring_classes import BoringModel, RandomIterableDataset

    dataset = RandomIterableDataset(size=32, count=10)

    class Iterable(BoringModel):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(dataset)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(dataset)

    args = dict(default_root_dir=tmp_path, limit_train_batches=2, limit_val_batches=None, logger=False,
                enable_model_summary=False, enable_progress_bar=False)
    model = Iterable()
    tasktrain.Trainer(max_epochs=2, callbacks=tasktrain.ModelCheckpoint(save_last=True, every_n_train_steps=1),
                      **args).fit(model)
    path = tmp_path / "checkpoints" / "epoch=1-step=4.ckpt"
    assert path.is_file()
    trainer = tasktrain.Trainer(max_epochs=4, callbacks=tasktrain.ModelCheckpoint(save_last=True, every_n_train_steps=1),
                                **args)
    trainer.fit(model, ckpt_path=str(path))
    assert trainer.global_step == 8 and trainer.current_epoch == 4


def _url_round_trip(lib, classes, root, base_url):
    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                 accelerator="cpu", devices=1, limit_train_batches=2, limit_val_batches=0)
    trainer = lib.Trainer(max_epochs=1, **quiet)
    trainer.fit(classes.BoringModel())
    trainer.save_checkpoint(os.path.join(root, f"{lib.__name__}.ckpt"))
    url = f"{base_url}/{lib.__name__}.ckpt"
    loaded = classes.BoringModel.load_from_checkpoint(url)
    resumed = lib.Trainer(max_epochs=2, **quiet)
    resumed.fit(classes.BoringModel(), ckpt_path=url)
    same = all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                  trainer.lightning_module.state_dict().values()))
    return same, resumed.current_epoch, resumed.global_step


def test_a_checkpoint_at_a_url_loads_and_resumes_as_under_lightning(L, tmp_path):
    import functools
    import http.server
    import threading

    from lightning.pytorch.demos import boring_classes as theirs

    from tasktrain.demos import boring_classes as ours

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    torch_home = os.environ.get("TORCH_HOME")
    os.environ["TORCH_HOME"] = str(tmp_path / "hub")  # torch.hub's download cache: this test's own
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        theirs_out = _url_round_trip(L.pytorch, theirs, tmp_path, base)
        ours_out = _url_round_trip(tasktrain, ours, tmp_path, base)
    finally:
        server.shutdown()
        server.server_close()
        os.environ.pop("TORCH_HOME") if torch_home is None else os.environ.update(TORCH_HOME=torch_home)
    assert ours_out == theirs_out == (True, 2, 4)


def test_checkpoints_at_file_system_urls_as_lightnings(L, tmp_path, monkeypatch):
    """Lightning writes and reads checkpoints at fsspec URLs: a ModelCheckpoint `dirpath` and a `default_root_dir` of
    "memory://..." (fsspec's in-memory file system, standing for s3:// and the like) get the same top-k and last
    files, a resume and load_from_checkpoint read them back; a "file://" URL is the local folder (ckpt_path,
    load_from_checkpoint, default_root_dir). Without fsspec the error names it."""
    import fsspec

    memory = fsspec.filesystem("memory")
    found = {}
    for name in ("lightning", "tasktrain"):
        url = f"memory://ck-{name}-{os.getpid()}"
        monitor = L.pytorch.callbacks.ModelCheckpoint if name == "lightning" else tasktrain.ModelCheckpoint
        checkpoint = monitor(dirpath=url, monitor="val_loss", save_top_k=1, save_last=True)
        trainer, _ = run(name, L, f"memory://root-{name}-{os.getpid()}", [checkpoint], epochs=2)
        files = sorted(os.path.basename(p) for p in memory.find(url.split("://")[1]))
        make = lit_module(L) if name == "lightning" else tt_module()
        loaded = type(make).load_from_checkpoint(checkpoint.last_model_path)
        resumed = (L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, max_epochs=3, num_sanity_val_steps=0,
                             enable_checkpointing=False) if name == "lightning" else
                   tasktrain.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                                     max_epochs=3, num_sanity_val_steps=0, enable_checkpointing=False))
        resumed.fit(type(make)(), loader(16), loader(8), ckpt_path=checkpoint.best_model_path)
        # the default ModelCheckpoint under a default_root_dir URL, and a file:// default_root_dir and ckpt_path
        default = run(name, L, f"memory://dflt-{name}-{os.getpid()}", [], epochs=1)[0].checkpoint_callback
        local = run(name, L, f"file://{tmp_path / name}", [], epochs=1)[0]
        # (Lightning's best_model_path there reads "file:/tmp/...": its default_root_dir normalises the URL)
        from_file_url = type(make).load_from_checkpoint(f"file://{tmp_path / name}/checkpoints/epoch=0-step=2.ckpt")
        found[name] = (files, os.path.basename(checkpoint.best_model_path), checkpoint.best_model_path.startswith(url),
                       torch.equal(loaded.layer.weight, trainer.lightning_module.layer.weight), resumed.global_step,
                       default.best_model_path.split("://")[0], memory.exists(default.best_model_path.split("://")[1]),
                       sorted(os.listdir(tmp_path / name / "checkpoints")),
                       torch.equal(from_file_url.layer.weight, local.lightning_module.layer.weight))
    assert found["tasktrain"] == found["lightning"]
    files, best, under_url, same_weights, step, scheme, written, local_files, file_url_loads = found["tasktrain"]
    assert files == ["epoch=1-step=4.ckpt", "last.ckpt"] and under_url and same_weights and step == 6
    assert scheme == "memory" and written and local_files == ["epoch=0-step=2.ckpt"] and file_url_loads
    assert not os.path.exists("memory:")  # (no local folder named after the URL)
    # a kept difference, a Lightning bug: its ModelCheckpoint takes the real path of a file:// dirpath as given, so
    # its files go to a folder named "file:" under the working directory; tasktrain's go to the folder the URL names
    url = f"file://{tmp_path}/ck"
    assert L.pytorch.callbacks.ModelCheckpoint(dirpath=url).dirpath == os.path.realpath(url) != str(tmp_path / "ck")
    assert tasktrain.ModelCheckpoint(dirpath=url).dirpath == os.path.realpath(tmp_path / "ck")

    monkeypatch.setitem(__import__("sys").modules, "fsspec", None)  # as without the package
    with pytest.raises(ImportError, match="memory://x.ckpt.*fsspec"):
        tasktrain.TaskModule.load_from_checkpoint("memory://x.ckpt")


VALIDATION_COUNT_SAVES = {  # (ModelCheckpoint, Trainer, (epoch, val_loop._max_batches written at its start)...)
    # validation inside the epoch, but the val loader is empty: Lightning saves at the epoch's end
    "empty_val_loader": (dict(save_top_k=-1), dict(val_check_interval=0.5, val_length=0), ()),
    "limit_val_batches_0": (dict(save_top_k=-1), dict(val_check_interval=0.5, limit_val_batches=0), ()),
    # written to 0 before epoch 1: that epoch validates no more and saves at its end
    "written_0_between_epochs": (dict(save_top_k=-1), dict(val_check_interval=0.5), ((1, [0]),)),
    # written to 0 at fit start, then back to 1 before epoch 1: validation ends again, one batch each
    "written_0_then_1": (dict(save_top_k=-1, monitor="val_loss"), dict(val_check_interval=0.5), ((0, [0]), (1, [1]))),
    # a step save at the epoch's last batch: deferred to the validation only while validation counts are above 0
    "step_save_deferral": (dict(every_n_train_steps=4, monitor="train_loss", save_top_k=-1),
                           dict(check_val_every_n_epoch=1, val_check_interval=0.5), ((1, [0]),)),
    # a time val_check_interval: saves at validation ends only, so none here before `last` at the fit's end
    "time_interval_without_validation": (dict(save_top_k=-1, save_last=True),
                                         dict(val_check_interval="00:00:10:00", limit_val_batches=0), ()),
    # a time val_check_interval overwritten with a float after Trainer(...): Lightning keeps the time (its
    # _val_check_time_interval), so still saves at validation ends only
    "time_interval_kept_after_a_float_write": (dict(save_top_k=-1, save_last=True),
                                               dict(val_check_interval="00:00:10:00", limit_val_batches=0,
                                                    then_val_check_interval=0.5), ()),
    # reload_dataloaders_every_n_epochs counts the loaders again: the write lasts until then
    "recounted_on_reload": (dict(save_top_k=-1), dict(val_check_interval=0.5, reload_dataloaders_every_n_epochs=2),
                            ((1, [0]),)),
}


def _validation_count_saves(lib, classes, root, checkpoint, trainer_args, writes):
    """A fit of 3 epochs of 4 batches, validation of 2 batches: _recorded_fit's records."""
    return _recorded_fit(lib, classes, root, checkpoint, {"limit_val_batches": 2, **trainer_args}, epochs=3,
                         batches=4, writes=writes)


def _recorded_fit(lib, classes, root, checkpoint, trainer_args, epochs, batches, writes=()):
    """A fit of `epochs` epochs of `batches` batches of `classes`' BoringModel logging train_loss and val_loss, with a
    ModelCheckpoint(dirpath=root, **checkpoint) and, before it, a callback noting the hook the loop is in; returns each
    save as (the hook it came from, the step), each validation batch as (epoch, step), trainer.num_val_batches at each
    epoch's end, and the files. `writes`: (epoch, count) pairs, fit_loop.epoch_loop.val_loop._max_batches = count at
    that epoch's start. `val_length` in trainer_args: the val data set's length (0: an empty loader; default 64,
    BoringModel's own)."""
    hook, saves, validated, counts = {"now": None}, [], [], []
    trainer_args = dict(trainer_args)
    val_length = trainer_args.pop("val_length", 64)
    then_interval = trainer_args.pop("then_val_check_interval", None)  # written to the trainer before the fit

    class Where(lib.Callback):  # (before the ModelCheckpoint, which both frameworks run last)
        def on_train_epoch_start(self, trainer, module):
            for epoch, count in writes:
                if epoch == trainer.current_epoch:
                    trainer.fit_loop.epoch_loop.val_loop._max_batches = count

        def on_train_epoch_end(self, trainer, module):
            hook["now"] = "on_train_epoch_end"
            counts.append(list(trainer.num_val_batches))

    for name in ("on_train_batch_end", "on_validation_end", "on_train_end"):
        setattr(Where, name, (lambda n: lambda self, *args, **kwargs: hook.__setitem__("now", n))(name))

    class Logged(classes.BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"])
            return out

        def validation_step(self, batch, batch_idx):
            validated.append((self.trainer.current_epoch, self.trainer.global_step))
            out = super().validation_step(batch, batch_idx)
            self.log("val_loss", out["x"])
            return out

        def val_dataloader(self):
            return torch.utils.data.DataLoader(classes.RandomDataset(32, val_length))

        def on_save_checkpoint(self, checkpoint):
            saves.append((hook["now"], self.trainer.global_step))

    lib.seed_everything(1, verbose=False)
    trainer = lib.Trainer(max_epochs=epochs, limit_train_batches=batches, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0,
                          callbacks=[Where(), lib.callbacks.ModelCheckpoint(dirpath=root, **checkpoint)],
                          **trainer_args)
    if then_interval is not None:
        trainer.val_check_interval = then_interval
    trainer.fit(Logged())
    return saves, validated, counts, sorted(os.listdir(root))


@pytest.mark.parametrize("case", list(VALIDATION_COUNT_SAVES))
def test_save_points_follow_the_validation_counts_as_lightnings(L, tmp_path, case):
    """ModelCheckpoint's choice between epoch ends and validation ends (_should_save_on_train_epoch_end), asked from
    the trainer's state at each point as Lightning asks it: an empty val loader or limit_val_batches=0 with validation
    inside the epoch saves at epoch ends; a write to fit_loop.epoch_loop.val_loop._max_batches between epochs changes
    the batches each validation runs (0: none, no hook) and the save points from there on, until the loaders are
    counted again (reload_dataloaders_every_n_epochs). The same saves, hooks, validation batches and files as
    Lightning's."""
    from lightning.pytorch.demos import boring_classes as theirs

    from tasktrain.demos import boring_classes as ours

    checkpoint, trainer_args, writes = VALIDATION_COUNT_SAVES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = _validation_count_saves(tasktrain, ours, tmp_path / "ours", checkpoint, trainer_args, writes)
        theirs_ = _validation_count_saves(L.pytorch, theirs, tmp_path / "theirs", checkpoint, trainer_args, writes)
    assert mine == theirs_
    assert mine[0]  # (each case saves something)
    if writes:  # (the write took: fewer validation batches than the 2 x 2 an epoch of the unwritten fit)
        assert len(mine[1]) < 3 * 4
