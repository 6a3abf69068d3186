"""A second `trainer.fit` of the same Trainer, beside Lightning 2.6's: it goes on from where the last fit stopped
(current_epoch, global_step, the loggers' step), trains nothing where max_epochs / max_steps is reached (no
on_train_start; Lightning's "`Trainer.fit` stopped: ..." note), trains again after a stop request, and a checkpoint
given to it wins over the counters; Lightning's refusal of a checkpoint past max_epochs. Each case runs in both
frameworks and compares the hooks seen (with current_epoch and global_step at each), the counters, the notes and
the weights."""
import logging

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = {"tasktrain": (tasktrain, ours), "lightning": (pl, theirs)}
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             limit_train_batches=4, limit_val_batches=2, num_sanity_val_steps=1)
EVENTS = ("setup", "on_fit_start", "on_sanity_check_start", "on_train_start", "on_train_epoch_start",
          "on_validation_start", "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown")


def _recorder(lib):
    class Recorder(lib.Callback):
        def __init__(self):
            self.calls = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.calls.append(f"batch {trainer.current_epoch}.{batch_idx}")

    def hook(event):
        def record(self, trainer, *args, **kwargs):
            self.calls.append(f"{event}({trainer.current_epoch},{trainer.global_step})")
        return record

    for event in EVENTS:
        setattr(Recorder, event, hook(event))
    return Recorder()


def _raise_limit(lib, trainer, **limits):
    """What a user raises to train on: Lightning's trainer.fit_loop.max_epochs / fit_loop.epoch_loop.max_steps,
    tasktrain's trainer.max_epochs / trainer.max_steps."""
    for name, value in limits.items():
        if lib is pl:
            setattr(trainer.fit_loop if name == "max_epochs" else trainer.fit_loop.epoch_loop, name, value)
        else:
            setattr(trainer, name, value)


class _Notes(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        if "`Trainer.fit` stopped" in record.getMessage():
            self.messages.append(record.getMessage())


def _fit(lib, trainer, module, recorder, seed, **kwargs):
    """One fit; what it showed. The seed is set first: the boring loaders draw their data when requested (the two
    frameworks leave the global generator at different places after a fit: their loaders draw differently)."""
    from lightning_utilities.core.rank_zero import rank_zero_only as lightning_rank_zero_only

    recorder.calls.clear()
    notes, logger = _Notes(), logging.getLogger("lightning.pytorch" if lib is pl else "tasktrain")
    saved = logger.level, logger.disabled, getattr(lightning_rank_zero_only, "rank", None)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    lightning_rank_zero_only.rank = 0
    logger.addHandler(notes)
    lib.seed_everything(seed, verbose=False)
    try:
        trainer.fit(module, **kwargs)
    finally:
        logger.removeHandler(notes)
        logger.setLevel(saved[0])
        logger.disabled = saved[1]
        if saved[2] is not None:
            lightning_rank_zero_only.rank = saved[2]
    steps = trainer.fit_loop.epoch_loop._batches_that_stepped if lib is pl else trainer.state.batches_that_stepped
    return dict(hooks=list(recorder.calls), epoch=trainer.current_epoch, step=trainer.global_step,
                batches_that_stepped=steps, notes=notes.messages, should_stop=trainer.should_stop,
                weights=[p.detach().clone() for p in module.parameters()])


class _StopAt:
    """trainer.should_stop = True at the end of epoch `epoch` (batch None) or after its batch `batch`."""

    def __init__(self, epoch, batch=None):
        self.epoch, self.batch = epoch, batch

    def on_train_epoch_end(self, trainer, module):
        if self.batch is None and trainer.current_epoch == self.epoch:
            trainer.should_stop = True

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            trainer.should_stop = True


def _scenario(name, lib, classes, tmp_path):
    quiet = {**QUIET, "default_root_dir": tmp_path}  # (tasktrain's resume pointer is written there)
    rec = _recorder(lib)
    lib.seed_everything(1, verbose=False)
    if name == "max_epochs":  # reached: the second fit trains nothing; raised: it trains the epoch added
        trainer, module = lib.Trainer(max_epochs=2, callbacks=[rec], **quiet), classes.BoringModel()
        runs = [_fit(lib, trainer, module, rec, 2), _fit(lib, trainer, module, rec, 3)]
        _raise_limit(lib, trainer, max_epochs=3)
        return runs + [_fit(lib, trainer, module, rec, 4)]
    if name == "max_steps":  # stopped inside epoch 1: that epoch counts, the raised fit starts epoch 2 at batch 0
        trainer, module = lib.Trainer(max_steps=6, callbacks=[rec], **quiet), classes.BoringModel()
        runs = [_fit(lib, trainer, module, rec, 2), _fit(lib, trainer, module, rec, 3)]
        _raise_limit(lib, trainer, max_steps=11)
        return runs + [_fit(lib, trainer, module, rec, 4)]
    if name in ("should_stop", "stop_inside_epoch"):  # a stop request ends one fit, not the next
        stop = type("Stop", (_StopAt, lib.Callback), {})(0, None if name == "should_stop" else 1)
        args = {**quiet, "limit_val_batches": 0} if name == "stop_inside_epoch" else quiet
        trainer, module = lib.Trainer(max_epochs=3, callbacks=[rec, stop], **args), classes.BoringModel()
        return [_fit(lib, trainer, module, rec, 2), _fit(lib, trainer, module, rec, 3)]
    if name == "early_stopping":  # its state goes on too: the second fit stops after one more epoch
        class Flat(classes.BoringModel):
            def validation_step(self, batch, batch_idx):
                self.log("flat", 1.0)
                return super().validation_step(batch, batch_idx)

        stopper = (pl.callbacks.EarlyStopping if lib is pl else lib.EarlyStopping)(monitor="flat", patience=0)
        trainer, module = lib.Trainer(max_epochs=10, callbacks=[rec, stopper], **quiet), Flat()
        runs = [_fit(lib, trainer, module, rec, 2), _fit(lib, trainer, module, rec, 3)]
        return runs + [dict(stopped_epoch=stopper.stopped_epoch, wait_count=stopper.wait_count)]
    if name == "new_module":  # the counters are the Trainer's: a new module trains from where they are
        trainer = lib.Trainer(max_epochs=2, callbacks=[rec], **quiet)
        runs = [_fit(lib, trainer, classes.BoringModel(), rec, 2)]
        _raise_limit(lib, trainer, max_epochs=3)
        lib.seed_everything(5, verbose=False)
        return runs + [_fit(lib, trainer, classes.BoringModel(), rec, 3)]
    if name == "after_evaluation":  # validate / test leave the counters where they are
        trainer, module = lib.Trainer(max_epochs=1, callbacks=[rec], **quiet), classes.BoringModel()
        trainer.validate(module, verbose=False)
        trainer.test(module, verbose=False)
        runs = [dict(epoch=trainer.current_epoch, step=trainer.global_step), _fit(lib, trainer, module, rec, 2)]
        trainer.validate(module, verbose=False)
        runs.append(dict(epoch=trainer.current_epoch, step=trainer.global_step))
        _raise_limit(lib, trainer, max_epochs=2)
        return runs + [_fit(lib, trainer, module, rec, 3)]
    if name == "checkpoint_wins":  # ckpt_path on a used Trainer: the checkpoint's counters (after on_fit_start)
        first = lib.Trainer(max_epochs=1, **{**quiet, "default_root_dir": tmp_path / "first"})
        lib.seed_everything(1, verbose=False)
        first.fit(classes.BoringModel())
        first.save_checkpoint(tmp_path / "one.ckpt")
        lib.seed_everything(1, verbose=False)
        trainer, module = lib.Trainer(max_epochs=3, callbacks=[rec], **quiet), classes.BoringModel()
        return [_fit(lib, trainer, module, rec, 2), _fit(lib, trainer, module, rec, 3, ckpt_path=tmp_path / "one.ckpt")]
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["max_epochs", "max_steps", "should_stop", "stop_inside_epoch", "early_stopping",
                                  "new_module", "after_evaluation", "checkpoint_wins"])
def test_a_second_fit_goes_on_as_lightnings(name, tmp_path, capsys):
    ran = {key: _scenario(name, lib, classes, tmp_path / key) for key, (lib, classes) in LIBS.items()}
    mine, reference = ran["tasktrain"], ran["lightning"]
    assert len(mine) == len(reference)
    for i, (a, b) in enumerate(zip(mine, reference)):
        for key in b:
            if key == "weights":
                for x, y in zip(a[key], b[key]):
                    torch.testing.assert_close(x, y, msg=f"{name}: fit {i + 1}'s weights")
            else:
                assert a[key] == b[key], f"{name}: fit {i + 1}'s {key}"
    if name == "max_epochs":  # (what the comparison covers, spelled out)
        assert [run["epoch"] for run in mine] == [2, 2, 3] and [run["step"] for run in mine] == [8, 8, 12]
        assert "on_train_start(2,8)" not in mine[1]["hooks"] and "on_train_start(2,8)" in mine[2]["hooks"]
        assert mine[1]["notes"] == ["`Trainer.fit` stopped: `max_epochs=2` reached."]
        assert not torch.equal(mine[1]["weights"][0], mine[2]["weights"][0])


def test_a_checkpoint_past_max_epochs_is_refused_as_by_lightning(tmp_path):
    """Lightning's condition: the checkpoint's current_epoch (as saved) above max_epochs; equal trains nothing."""
    seen = {}
    for key, (lib, classes) in LIBS.items():
        folder = tmp_path / key
        saver = (pl.callbacks.ModelCheckpoint if lib is pl else lib.ModelCheckpoint)(
            dirpath=folder, save_top_k=-1, filename="{epoch}")
        trainer = lib.Trainer(max_epochs=3, callbacks=[saver], default_root_dir=folder,
                              **{**QUIET, "enable_checkpointing": True})
        lib.seed_everything(1, verbose=False)
        trainer.fit(classes.BoringModel())
        trainer.save_checkpoint(folder / "after.ckpt")
        outcomes = []
        for ckpt, max_epochs in (("epoch=2", 1), ("epoch=2", 2), ("after", 2), ("after", 3)):
            resumed = lib.Trainer(max_epochs=max_epochs, default_root_dir=folder / "resumed", **QUIET)
            try:
                resumed.fit(classes.BoringModel(), ckpt_path=folder / f"{ckpt}.ckpt")
                outcomes.append((resumed.current_epoch, resumed.global_step))
            except Exception as err:
                outcomes.append((type(err).__name__, str(err)))
        seen[key] = outcomes
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0] == ("MisconfigurationException", "You restored a checkpoint with current_epoch=2, "
                                    "but you have set Trainer(max_epochs=1).")
    assert seen["tasktrain"][2][1].startswith("You restored a checkpoint with current_epoch=3,")
    assert seen["tasktrain"][1] == seen["tasktrain"][3] == (3, 12)


def test_the_tuner_on_a_used_trainer_tries_from_step_0_and_puts_the_counters_back(tmp_path):
    """(tasktrain alone) The tuner's trial fits start from fresh counters: a trial on a used Trainer would otherwise
    go on from its step and stop at once; the counters are put back, and the next fit goes on from them."""
    from tasktrain.tuner import Tuner

    trainer = tasktrain.Trainer(max_epochs=2, default_root_dir=tmp_path, **QUIET)
    module = ours.BoringModel()
    trainer.fit(module)
    finder = Tuner(trainer).lr_find(module, num_training=5, early_stop_threshold=None, update_attr=False)
    assert len(finder.results["lr"]) == 5
    assert (trainer.current_epoch, trainer.global_step, trainer.max_epochs, trainer.max_steps) == (2, 8, 2, -1)
    trainer.max_epochs = 3
    trainer.fit(module)
    assert (trainer.current_epoch, trainer.global_step) == (3, 12)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_second_fit_draws_and_shuffles_as_lightnings(shuffle):
    """Lightning's epoch loop iterates the training loader again at a fit's first epoch when it is not epoch 0 and
    the fit does not resume a checkpoint (a second fit of the same Trainer): one more draw of the global generator,
    which a shuffling loader's order on one process and everything drawn later follow."""
    seen = {}
    for name, (lib, classes) in LIBS.items():
        lib.seed_everything(7, verbose=False)
        model = classes.BoringModel()
        train = torch.utils.data.DataLoader(classes.RandomDataset(32, 64), batch_size=4, shuffle=shuffle)
        val = torch.utils.data.DataLoader(classes.RandomDataset(32, 8), batch_size=4)
        trainer = lib.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                              enable_checkpointing=False, num_sanity_val_steps=0)
        trainer.fit(model, train, val)
        if lib is pl:
            trainer.fit_loop.max_epochs = 2
        else:
            trainer.max_epochs = 2
        trainer.fit(model, train, val)
        seen[name] = (trainer.global_step, model.layer.weight.detach().clone(), torch.rand(1).item())
    (steps, weight, draw), (l_steps, l_weight, l_draw) = seen.values()
    assert steps == l_steps == 32 and draw == l_draw
    torch.testing.assert_close(weight, l_weight, rtol=0, atol=0)
