"""`trainer.fit_loop` (tasktrain/trainer/lightning_loops.py: Lightning's loop attributes as a view of the Trainer's
state) beside Lightning 2.6's: a recording callback reads the same attributes (epoch, batch, scheduler, optimizer and
evaluation progress, batch indices, is_last_batch, ...) at every hook of the same runs under both frameworks (a fit
with a validation inside the epoch and at its end, accumulation with an epoch ended by on_train_batch_start's -1,
manual optimisation, a fit stopped inside an epoch, a second fit after `fit_loop.max_epochs = N`, fits resumed from a
checkpoint saved inside an epoch (tasktrain's, and Lightning's file resumed by both) and at an epoch's end, one counted
in steps, and check_val_every_n_epoch=None with a val_check_interval that the epochs' length is no multiple of) and the
readings must be equal, hook by hook."""
import logging
import pickle

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = {"tasktrain": (tasktrain, ours), "lightning": (pl, theirs)}
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             limit_train_batches=4, limit_val_batches=1, num_sanity_val_steps=1)
HOOKS = ("setup", "on_fit_start", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
         "on_train_epoch_start", "on_train_batch_start", "on_before_backward", "on_after_backward",
         "on_before_zero_grad", "on_before_optimizer_step", "on_train_batch_end", "on_validation_start",
         "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_validation_end", "on_train_epoch_end", "on_train_end", "on_fit_end",
         "on_save_checkpoint", "on_test_start", "on_test_batch_end", "on_test_end", "teardown")


def _reading(trainer):
    loop = trainer.fit_loop
    progress = loop.epoch_progress
    optimizer = loop.epoch_loop.automatic_optimization.optim_progress.optimizer
    return (progress.current.ready, progress.current.started, progress.current.processed, progress.current.completed,
            progress.total.processed, _known(lambda: (loop.batch_idx, loop.epoch_loop.batch_idx)),
            _known(lambda: loop.total_batch_idx), loop.restarting, loop.done, loop.epoch_loop.global_step,
            loop.max_epochs, loop.max_steps, loop.epoch_loop.max_steps, loop.min_epochs, loop.min_steps,
            *(_known(lambda: (evaluation.batch_progress.current.completed, evaluation.batch_progress.total.completed))
              for evaluation in (loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop)),
            _known(lambda: loop.epoch_loop._batches_that_stepped),
            *(_counts(progress) for progress in (loop.epoch_loop.batch_progress.current,
                                                 loop.epoch_loop.batch_progress.total)),
            loop.epoch_loop.batch_progress.is_last_batch, trainer.is_last_batch,
            *(_known(lambda: (_counts(evaluation.batch_progress.current), _counts(evaluation.batch_progress.total)))
              for evaluation in (loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop)),
            *((p.ready, p.completed) for p in (loop.epoch_loop.scheduler_progress.current,
                                               loop.epoch_loop.scheduler_progress.total, optimizer.step.current,
                                               optimizer.step.total,
                                               loop.epoch_loop.manual_optimization.optim_step_progress.total)),
            *((p.ready, p.started, p.completed) for p in (optimizer.zero_grad.current, optimizer.zero_grad.total)),
            loop.epoch_loop.automatic_optimization.optim_progress.optimizer_steps,
            # the evaluation loops' other attributes (index 34 on), the training epoch's length and validation, and
            # the evaluation loop of the run (ThroughputMonitor's reading)
            *((evaluation.batch_progress.is_last_batch, evaluation.max_batches,
               _defined(lambda: evaluation.num_dataloaders), evaluation._has_run)
              for evaluation in (loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop)),
            loop.max_batches,
            # (read where callbacks read it: in a fit; Lightning's enable_validation outside one is the module's loader)
            loop.epoch_loop._should_check_val_epoch() if trainer.state.fn == "fit" else None,
            _raises(lambda: _counts(trainer._evaluation_loop.batch_progress.total)),
            loop._should_accumulate())  # (ThroughputMonitor's)


def _defined(read):
    try:
        return read()
    except AssertionError:  # Lightning: num_dataloaders outside the loop's run (no loaders held)
        return "undefined"


def _raises(read):
    try:
        return read()
    except RuntimeError as error:  # (both frameworks: outside the scope it is defined in)
        return f"raises {error}"


def _counts(tracker):
    return tracker.ready, tracker.started, tracker.processed, tracker.completed


def _known(read):
    try:
        return read()
    except RuntimeError:  # tasktrain: where it keeps no count to give it from (lightning_loops.py; checked below)
        return "unknown"


def _recorder(lib, stop_at=None, save_at=None):
    """Reads the view at each hook; `stop_at` (epoch, batch): should_stop after that batch; `save_at` (epoch, batch,
    path): trainer.save_checkpoint(path) after that batch."""

    class Recorder(lib.Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.seen.append(("on_train_batch_end", _reading(trainer)))
            if stop_at == (trainer.current_epoch, batch_idx):
                trainer.should_stop = True
            if save_at is not None and save_at[:2] == (trainer.current_epoch, batch_idx):
                trainer.save_checkpoint(save_at[2])

    def hook(event):
        def record(self, trainer, *args, **kwargs):
            self.seen.append((event, _reading(trainer)))
        return record

    for event in HOOKS:
        if event != "on_train_batch_end":
            setattr(Recorder, event, hook(event))
    return Recorder()


def _run(lib, classes, tmp_path, name):
    checkpoint_cls = pl.callbacks.ModelCheckpoint if lib is pl else lib.ModelCheckpoint
    lib.seed_everything(1, verbose=False)
    if name == "fit":  # a validation after batch 2 and at the epoch's end
        rec = _recorder(lib)
        trainer = lib.Trainer(max_epochs=2, val_check_interval=2, callbacks=[rec], **QUIET)
        trainer.fit(classes.BoringModel())
    elif name == "accumulate_and_cut":  # windows of 2; on_train_batch_start's -1 ends epoch 1 at its batch 2
        class Cut(classes.BoringModel):
            def on_train_batch_start(self, batch, batch_idx):
                return -1 if (self.current_epoch, batch_idx) == (1, 2) else None

            def configure_optimizers(self):  # (a scheduler stepped each step too: both step at the cut)
                optimizers, schedulers = super().configure_optimizers()
                every_step = torch.optim.lr_scheduler.StepLR(optimizers[0], step_size=1)
                return optimizers, schedulers + [{"scheduler": every_step, "interval": "step"}]

        rec = _recorder(lib)
        trainer = lib.Trainer(max_epochs=3, accumulate_grad_batches=2, callbacks=[rec], **QUIET)
        trainer.fit(Cut())
    elif name == "evaluate":  # validate twice (two loaders), test once, then a fit: each loop counts its own
        rec = _recorder(lib)
        trainer = lib.Trainer(max_epochs=1, callbacks=[rec], **{**QUIET, "limit_val_batches": 2})
        class TwoLoaders(classes.BoringModel):
            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                return super().validation_step(batch, batch_idx)

        module = TwoLoaders()
        loaders = [module.val_dataloader(), module.val_dataloader()]
        trainer.validate(module, loaders, verbose=False)
        trainer.validate(module, verbose=False)
        trainer.test(module, verbose=False)
        trainer.fit(module)
    elif name == "manual":  # manual optimisation: its own step count (optim_step_progress), none in automatic's
        class Manual(classes.BoringModel):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch, batch_idx):
                optimizer = self.optimizers()
                optimizer.zero_grad()
                loss = self.step(batch)
                self.manual_backward(loss)
                if batch_idx % 2:
                    optimizer.step()
                return loss

        rec = _recorder(lib)
        trainer = lib.Trainer(max_epochs=2, callbacks=[rec], **QUIET)
        trainer.fit(Manual())
    elif name == "stop_inside_epoch":  # the epoch stopped inside ends; a second fit goes on after it
        rec = _recorder(lib, stop_at=(0, 1))
        trainer = lib.Trainer(max_epochs=2, callbacks=[rec], **{**QUIET, "limit_val_batches": 0})
        module = classes.BoringModel()
        trainer.fit(module)
        trainer.fit_loop.max_epochs = 3  # (Lightning's documented way to train on)
        trainer.fit(module)
    elif name in ("resume_inside_epoch", "resume_epoch_end", "resume_by_steps", "resume_last_batch",
                  "resume_last_batch_of_last_epoch", "resume_last_batch_at_max_epochs",
                  "resume_lightnings_file_inside_epoch"):
        path = tmp_path / f"{name}.ckpt"
        if name == "resume_lightnings_file_inside_epoch":  # the file Lightning wrote, resumed by each framework
            first = pl.Trainer(callbacks=[_recorder(pl, stop_at=(1, 1), save_at=(1, 1, path))], max_epochs=2,
                               **QUIET)
            first.fit(theirs.BoringModel())
            first = None
        elif name.startswith("resume_last_batch"):  # saved in the epoch's last on_train_batch_end (before its end)
            epoch = 0 if name == "resume_last_batch" else 1
            first = lib.Trainer(max_epochs=2, callbacks=[_recorder(lib, save_at=(epoch, 3, path))], **QUIET)
        elif name == "resume_epoch_end":
            saver = checkpoint_cls(dirpath=tmp_path, filename="saved", save_top_k=-1)
            first = lib.Trainer(max_epochs=1, callbacks=[saver], **{**QUIET, "enable_checkpointing": True})
            path = tmp_path / "saved.ckpt"
        else:
            limits = dict(max_steps=6) if name == "resume_by_steps" else dict(max_epochs=2)
            first = lib.Trainer(callbacks=[_recorder(lib, stop_at=(1, 1), save_at=(1, 1, path))], **limits, **QUIET)
        if first is not None:
            first.fit(classes.BoringModel())
        rec = _recorder(lib)
        limits = dict(max_steps=10) if name == "resume_by_steps" else dict(max_epochs=3)
        if name.endswith("at_max_epochs"):  # (the restored epoch was the last: nothing left to train)
            limits = dict(max_epochs=2)
        trainer = lib.Trainer(callbacks=[rec], **limits, **QUIET)
        trainer.fit(classes.BoringModel(), ckpt_path=path)
    elif name.startswith("val_by_total_batches"):
        # check_val_every_n_epoch=None: a validation every 3 batches of the whole run, over epochs of 4 (or 5: the
        # whole loader, 64 samples in batches of 16), resumed from a checkpoint saved inside epoch 1
        limits = dict(check_val_every_n_epoch=None, val_check_interval=3, max_epochs=3)
        if name.endswith("unlimited"):
            limits["limit_train_batches"] = 1.0

            class Module(classes.BoringModel):
                def train_dataloader(self):
                    return torch.utils.data.DataLoader(classes.RandomDataset(32, 80), batch_size=16)
        elif name.endswith("cut"):  # on_train_batch_start's -1 ends epoch 1 at its batch 2 (taken, not trained)
            class Module(classes.BoringModel):
                def on_train_batch_start(self, batch, batch_idx):
                    return -1 if (self.current_epoch, batch_idx) == (1, 2) else None
        else:
            Module = classes.BoringModel
        if name.endswith("resumed"):
            path = tmp_path / f"{name}.ckpt"
            first = lib.Trainer(callbacks=[_recorder(lib, stop_at=(1, 1), save_at=(1, 1, path))],
                                **{**QUIET, **limits})
            first.fit(Module())
        rec = _recorder(lib)
        trainer = lib.Trainer(callbacks=[rec], **{**QUIET, **limits})
        trainer.fit(Module(), ckpt_path=path if name.endswith("resumed") else None)
    else:
        raise AssertionError(name)
    return rec.seen, _reading(trainer)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["fit", "evaluate", "accumulate_and_cut", "manual", "stop_inside_epoch",
                                  "resume_inside_epoch", "resume_lightnings_file_inside_epoch", "resume_epoch_end",
                                  "resume_by_steps", "val_by_total_batches",
                                  "val_by_total_batches_unlimited", "val_by_total_batches_resumed",
                                  "val_by_total_batches_cut"])
def test_fit_loop_reads_as_lightnings_at_every_hook(name, tmp_path):
    ran = {key: _run(lib, classes, tmp_path / key, name) for key, (lib, classes) in LIBS.items()}
    (mine, mine_after), (reference, reference_after) = ran["tasktrain"], ran["lightning"]
    assert [event for event, _ in mine] == [event for event, _ in reference]
    for i, ((event, a), (_, b)) in enumerate(zip(mine, reference)):
        # batch_idx and total_batch_idx: known everywhere (TrainState's batch counters, saved in checkpoints)
        assert "unknown" not in (a[5], a[6]), f"{name}: reading {i} ({event})"
        # the evaluation batches: known everywhere (TrainState.eval_batches, saved in checkpoints)
        assert "unknown" not in (a[15], a[16], a[17], a[23], a[24], a[25]), f"{name}: reading {i} ({event})"
        # the loggers' step: known everywhere, a fit resumed from on_train_batch_end's checkpoint included
        assert a[18] != "unknown", f"{name}: reading {i} ({event})"
        a = _undefined_where_lightnings_is(a, b)
        assert _same(a, b), f"{name}: reading {i} ({event}): tasktrain {a}, Lightning {b}"
    assert _same(_undefined_where_lightnings_is(mine_after, reference_after), reference_after)
    if name == "fit":  # (what the comparison covers, spelled out)
        batch_ends = [reading for event, reading in mine if event == "on_train_batch_end"]
        assert [r[6] for r in batch_ends] == list(range(8))  # total_batch_idx over both epochs
        assert not any("unknown" in reading for event, reading in mine)
        assert [r[15] for e, r in mine if e == "on_validation_end"] == [(1, 1), (1, 1), (1, 2), (1, 1), (1, 2)]
        epoch_ends = [reading for event, reading in mine if event == "on_train_epoch_end"]
        assert [r[:4] for r in epoch_ends] == [(1, 1, 1, 0), (2, 2, 2, 1)]
        # the loggers' step at each validation: after batch 2 (not counted yet), at the epoch's end (without its last)
        assert [r[18] for e, r in mine if e == "on_validation_start"] == [0, 1, 3, 5, 7]
    if name == "evaluate":
        assert [r[16:18] for e, r in mine if e in ("on_validation_end", "on_test_end")][:3] == [
            ((4, 4), (0, 0)), ((2, 6), (0, 0)), ((2, 6), (64, 64))]
    if name.startswith("val_by_total_batches"):  # (which batches validate: every 3rd of the run, across epochs)
        validated = [(r[5][0], r[6], r[9]) for e, r in mine if e == "on_validation_start"]
        expected = {"val_by_total_batches": [(-1, -1, 0), (2, 2, 3), (1, 5, 6), (0, 8, 9), (3, 11, 12)],
                    "val_by_total_batches_unlimited": [(-1, -1, 0), (2, 2, 3), (0, 5, 6), (3, 8, 9), (1, 11, 12), (4, 14, 15)],
                    "val_by_total_batches_resumed": [(0, 8, 9), (3, 11, 12)],
                    "val_by_total_batches_cut": [(-1, -1, 0), (2, 2, 3), (1, 5, 6), (1, 8, 8)]}[name]
        assert validated == expected
    if name == "manual":  # (manual steps counted, the automatic loop's none)
        assert mine_after[30] == (4, 4) and mine_after[28] == (0, 0)
    if name == "accumulate_and_cut":  # scheduler steps: epoch 0's 2 optimizer steps + its end; epoch 1's step at
        # batch 1, then at the cut (batch 2) the step and the epoch schedulers, before on_train_epoch_end
        assert [r[27] for e, r in mine if e == "on_train_epoch_end"][:2] == [(3, 3), (6, 6)]
    if name == "resume_epoch_end":  # trainer.is_last_batch restored: True until the next epoch's first batch
        assert [r[22] for e, r in mine if e in ("on_train_start", "on_train_epoch_start")][:2] == [True, True]
    if name in ("resume_inside_epoch", "resume_lightnings_file_inside_epoch"):
        assert any(reading[7] for _, reading in mine) and not mine_after[7]  # restarting, then not
        # saved in epoch 1's on_train_batch_end of batch 1: the resumed loop goes on at batch 2 (no epoch start)
        assert [r[5] for e, r in mine if e == "on_train_batch_end"][:3] == [(2, 2), (3, 3), (0, 0)]
        assert [e for e, _ in mine].count("on_train_epoch_start") == 1



@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["resume_last_batch", "resume_last_batch_of_last_epoch",
                                  "resume_last_batch_at_max_epochs"])
def test_resume_from_an_epochs_last_batch_runs_its_end_where_lightning_skips_it(name, tmp_path):
    """A kept difference, a bug in Lightning (issue 37, docs/lightning.md): resumed from a checkpoint saved in an
    epoch's LAST on_train_batch_end (a ModelCheckpoint(every_n_train_steps) landing there), Lightning's restarted loop
    counts that epoch done without its end (no validation, no on_train_epoch_end, no epoch-interval scheduler that
    watches a metric) and runs the next epoch without its on_train_epoch_start (a BackboneFinetuning milestone there
    never fires). tasktrain goes on as the uninterrupted fit: the epoch's end, then each later epoch whole."""
    ran = {key: _run(lib, classes, tmp_path / key, name) for key, (lib, classes) in LIBS.items()}
    events = {key: [event for event, _ in seen] for key, (seen, _) in ran.items()}
    counts = {key: (e.count("on_train_epoch_start"), e.count("on_train_epoch_end"), e.count("on_validation_start"))
              for key, e in events.items()}
    # saved in epoch 0 (of max_epochs 3), in epoch 1 (of 3), in epoch 1 (of 2: nothing left after its end)
    expected = {"resume_last_batch": ((2, 3, 3), (1, 2, 2)), "resume_last_batch_of_last_epoch": ((1, 2, 2), (0, 1, 1)),
                "resume_last_batch_at_max_epochs": ((0, 1, 1), (0, 0, 0))}[name]
    assert (counts["tasktrain"], counts["lightning"]) == expected
    mine = events["tasktrain"]
    after_start = mine[mine.index("on_train_start") + 1:]
    assert after_start[0] == "on_validation_start"  # the saved epoch's validation, then its end, before any batch
    assert after_start.index("on_train_epoch_end") < (after_start + ["on_train_batch_start"]).index("on_train_batch_start")


def _undefined_where_lightnings_is(mine, reference):
    """Lightning's num_dataloaders is undefined outside the loop's run; tasktrain's is then the loaders of max_batches
    (checked here)."""
    mine = list(mine)
    for index in (34, 35, 36):
        if reference[index][2] == "undefined":
            assert mine[index][2] == len(mine[index][1])
            mine[index] = mine[index][:2] + ("undefined",) + mine[index][3:]
    return tuple(mine)


def _same(mine, reference):
    return all(a == b or a == "unknown" for a, b in zip(mine, reference))


def test_the_view_writes_the_limits_and_refuses_to_be_replaced():
    trainer = tasktrain.Trainer(max_epochs=2, max_steps=-1, logger=False, enable_progress_bar=False)
    assert trainer.fit_loop is trainer.fit_loop
    trainer.fit_loop.max_epochs, trainer.fit_loop.min_epochs = 5, 1
    trainer.fit_loop.epoch_loop.max_steps, trainer.fit_loop.epoch_loop.min_steps = 7, 2
    assert (trainer.max_epochs, trainer.min_epochs, trainer.max_steps, trainer.min_steps) == (5, 1, 7, 2)
    assert trainer.fit_loop.max_steps == 7 and not trainer.fit_loop.done
    with pytest.raises(AttributeError):  # (Lightning's fit_loop.max_steps has no setter either)
        trainer.fit_loop.max_steps = 3
    with pytest.raises(AttributeError, match="read view"):
        trainer.fit_loop = object()
    with pytest.raises(AttributeError, match="counters are read only"):  # the counters are the Trainer's
        trainer.fit_loop.epoch_progress.current.completed = 3
    optimizer = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer
    with pytest.raises(AttributeError, match="counters are read only"):  # (Lightning's tests move global_step so)
        optimizer.step.total.completed = 3
    with pytest.raises(AttributeError, match="progress `current` is read only"):
        trainer.fit_loop.epoch_progress.current = None
    # a Lightning internal written or patched would be ignored by the Trainer, which runs no loop object: refused
    with pytest.raises(AttributeError, match=r"trainer.fit_loop.epoch_loop.val_loop._has_run cannot be set"):
        trainer.fit_loop.epoch_loop.val_loop._has_run = True
    # but for val_loop._max_batches (Lightning's tests write it): the counts the next validations run, the Trainer's
    # num_val_batches (test_lightning_beside_checkpoint: the batches run and the save points, beside Lightning)
    trainer.fit_loop.epoch_loop.val_loop._max_batches = [0, float("inf")]
    assert trainer.num_val_batches == [0, float("inf")] == trainer.fit_loop.epoch_loop.val_loop.max_batches
    with pytest.raises(ValueError, match=r"val_loop._max_batches = \[1.5\]: each loader's count must be a whole"):
        trainer.fit_loop.epoch_loop.val_loop._max_batches = [1.5]
    with pytest.raises(AttributeError, match=r"trainer.test_loop._evaluation_step: Lightning's loop internal"):
        trainer.test_loop._evaluation_step
    with pytest.raises(AttributeError, match="cannot be set"):
        optimizer.step = None
    assert not hasattr(trainer.fit_loop, "_combined_loader") and trainer.fit_loop.max_epochs == 5
    trainer.validate_loop.batch_progress.total.completed  # (every view made)
    copy = pickle.loads(pickle.dumps(trainer))  # a Trainer holding its views still pickles (ddp_spawn sends it)
    assert copy.fit_loop.max_epochs == 5 and copy.fit_loop._trainer is copy


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_max_batches_write_during_the_sanity_check_reads_as_lightnings():
    """val_loop._max_batches written in a validation_step of the sanity check: that check runs its batches still, and
    from the write on num_sanity_val_batches, the val loop's max_batches and the fit's validations follow it, as
    under Lightning (whose num_sanity_val_batches is worked out from the val loop's counts at each read)."""

    def case(lib, boring):
        seen = []

        class Writes(boring.BoringModel):
            def validation_step(self, batch, batch_idx):
                trainer = self.trainer
                seen.append((trainer.sanity_checking, trainer.current_epoch, batch_idx,
                             list(trainer.num_sanity_val_batches), list(trainer.num_val_batches),
                             list(trainer.fit_loop.epoch_loop.val_loop.max_batches)))
                if trainer.sanity_checking and batch_idx == 0:
                    trainer.fit_loop.epoch_loop.val_loop._max_batches = [1]
                return super().validation_step(batch, batch_idx)

        trainer = lib.Trainer(max_epochs=2, **dict(QUIET, limit_train_batches=2, limit_val_batches=3,
                                                     num_sanity_val_steps=2))
        trainer.fit(Writes())
        return seen, list(trainer.num_sanity_val_batches), list(trainer.num_val_batches)

    ours_, theirs_ = (case(*LIBS[name]) for name in ("tasktrain", "lightning"))
    assert ours_ == theirs_
    assert [step[:3] for step in ours_[0]] == [(True, 0, 0), (True, 0, 1), (False, 0, 0), (False, 1, 0)]


@pytest.mark.parametrize("interval", ["batch", "epoch", None])
def test_predict_loop_batch_indices_read_as_lightnings(interval, tmp_path):
    """trainer.predict_loop.epoch_batch_indices at each predict hook, with a writer at each batch, at the epoch's end,
    or none; two loaders, the second one shuffled (the indices are the sampler's draw)."""
    import copy

    from torch.utils.data import DataLoader

    seen = {}
    for key, (lib, classes) in LIBS.items():
        writer_cls = pl.callbacks.BasePredictionWriter if lib is pl else lib.callbacks.BasePredictionWriter

        class Writer(writer_cls):
            def write_on_batch_end(self, *args):
                pass

            def write_on_epoch_end(self, *args):
                pass

        class Reader(lib.Callback):
            def __init__(self):
                self.seen = []

        for event in ("on_predict_start", "on_predict_batch_start", "on_predict_batch_end", "on_predict_epoch_end",
                      "on_predict_end", "teardown"):
            setattr(Reader, event, lambda self, trainer, *args, event=event, **kwargs: self.seen.append(
                (event, copy.deepcopy(trainer.predict_loop.epoch_batch_indices),  # (Lightning's list grows)
                 _predict_reading(trainer.predict_loop, "batch" in event))))

        class TwoLoaders(classes.BoringModel):
            def predict_step(self, batch, batch_idx, dataloader_idx=0):
                return super().predict_step(batch, batch_idx)

        reader = Reader()
        callbacks = [reader] + ([Writer(interval)] if interval else [])
        trainer = lib.Trainer(callbacks=callbacks, logger=False, enable_progress_bar=False, limit_predict_batches=2,
                              default_root_dir=tmp_path)
        data = classes.RandomDataset(32, 16)
        lib.seed_everything(3, verbose=False)
        trainer.predict(TwoLoaders(), [DataLoader(data, batch_size=4), DataLoader(data, batch_size=4, shuffle=True)],
                        return_predictions=False)
        seen[key] = reader.seen, trainer.predict_loop.epoch_batch_indices, _predict_reading(trainer.predict_loop, True)
    assert seen["tasktrain"] == seen["lightning"]
    if interval == "epoch":
        assert seen["tasktrain"][0][-3][1][0] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # (on_predict_epoch_end, loader 0)
    # (what the comparison covers: the counts move, the predictions are kept after the run, two loaders)
    assert [reading[2][0] for reading in seen["tasktrain"][0][:4]] == [
        ((0, 0, 0, 0), (0, 0, 0, 0)), ((1, 0, 0, 0), (1, 0, 0, 0)), ((1, 1, 1, 0), (1, 1, 1, 0)),
        ((2, 1, 1, 1), (2, 1, 1, 1))]
    assert seen["tasktrain"][2][:4] == (((4, 4, 4, 4), (4, 4, 4, 4)), True, [2, 2], 2)
    if interval == "epoch":  # (kept for the writer: 2 batches of 4 per loader; not returned, emptied at the end)
        assert seen["tasktrain"][0][-3][2][5] == [[4, 4], [4, 4]] and seen["tasktrain"][2][5] == []
    if interval == "batch":  # (the writer's indices of the last batch: the shuffled loader's)
        assert len(seen["tasktrain"][2][4]) == 4


def _predict_reading(loop, in_batch):
    """predict_loop's batch_progress (current, total), is_last_batch (in the batch hooks: Lightning sets it at the
    first batch), max_batches, num_dataloaders (Lightning's: while the run holds its loaders), current_batch_indices
    and the predictions' batch sizes."""
    return ((tuple(_counts(loop.batch_progress.current)), tuple(_counts(loop.batch_progress.total))),
            loop.batch_progress.is_last_batch if in_batch else None, loop.max_batches,
            _defined(lambda: loop.num_dataloaders), list(loop.current_batch_indices),
            [[len(p) for p in predictions] for predictions in loop.predictions])


class _Notes(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("`Trainer.fit` stopped") or "has not been met" in message:
            self.seen.append((record.levelname, message))


@pytest.mark.parametrize("case", ["stop", "stop_after_min_epochs", "max_steps"])
def test_the_notes_on_why_fit_stopped_are_lightnings(case):
    """fit's end notes on the package logger, levels and words: max_steps / max_epochs at INFO, a stop request that
    min_epochs held back at INFO, and (was missing) Lightning's DEBUG note when should_stop ended the fit, seen once the
    package logger is set to DEBUG."""
    def notes(lib, classes, name):
        class StopAfterFirstStep(lib.Callback):
            def on_train_batch_end(self, trainer, *args):
                trainer.should_stop = True

        limits = {"stop": dict(max_epochs=5, callbacks=[StopAfterFirstStep()]),
                  "stop_after_min_epochs": dict(max_epochs=5, min_epochs=2, callbacks=[StopAfterFirstStep()]),
                  "max_steps": dict(max_steps=3)}[case]
        handler, logger = _Notes(), logging.getLogger(name)
        level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
        try:
            lib.Trainer(**{**QUIET, "limit_train_batches": 2, "limit_val_batches": 0}, **limits).fit(classes.BoringModel())
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        return handler.seen

    mine, lightnings = notes(tasktrain, ours, "tasktrain"), notes(pl, theirs, "lightning.pytorch")
    if case != "max_steps":
        assert mine[-1] == ("DEBUG", "`Trainer.fit` stopped: `trainer.should_stop` was set.")
    assert mine == lightnings


@pytest.mark.parametrize("case", ["val loader", "no val loader", "limit_val_batches=0", "every 2nd epoch",
                                  "val_dataloader hook"])
def test_whether_the_fit_validates_reads_as_lightnings_from_its_first_hook(case):
    """trainer.enable_validation and fit_loop.epoch_loop._should_check_val_epoch() in the module's and a callback's
    hooks before the loop starts (prepare_data, setup, configure_model, configure_optimizers, on_fit_start): Lightning
    knows them from the data the fit was given, before the setup hooks."""
    def run(lib, classes):
        seen = []

        def read(where, trainer):
            seen.append((where, trainer.enable_validation, trainer.fit_loop.epoch_loop._should_check_val_epoch()))

        class Reads(lib.Callback):
            def setup(self, trainer, module, stage):
                read("callback setup", trainer)

            def on_fit_start(self, trainer, module):
                read("on_fit_start", trainer)

        class Model(classes.BoringModel):
            def prepare_data(self):
                read("prepare_data", self.trainer)

            def setup(self, stage):
                read("setup", self.trainer)

            def configure_model(self):
                read("configure_model", self.trainer)

            def configure_optimizers(self):
                read("configure_optimizers", self.trainer)
                return super().configure_optimizers()

        if case != "val_dataloader hook":
            Model.val_dataloader = None  # (Lightning's BoringModel defines one: the fit's own loaders here)
        settings = dict(QUIET, max_epochs=1, limit_train_batches=1, num_sanity_val_steps=0)
        settings.update(limit_val_batches=0) if case == "limit_val_batches=0" else None
        settings.update(check_val_every_n_epoch=2) if case == "every 2nd epoch" else None
        val = None if case in ("no val loader", "val_dataloader hook") else classes.BoringModel().val_dataloader()
        module = Model()
        lib.Trainer(callbacks=[Reads()], **settings).fit(module, module.train_dataloader(), val)
        return seen

    mine, reference = run(tasktrain, ours), run(pl, theirs)
    assert mine == reference
    expected = case in ("val loader", "val_dataloader hook")
    assert [r[2] for r in mine] == [expected] * 6, mine  # (what the comparison covers: every hook read)


def test_no_grad_context_of_a_loops_run_as_lightnings():
    """tasktrain.loops.utilities._no_grad_context (Lightning's decorator of a loop's run) picks the grad mode by the
    rule of tasktrain's evaluation runs: inference mode where the loop's `inference_mode` asks, else no_grad; its
    refusals of what is not a loop, or a loop without `inference_mode`, are Lightning's."""
    def case(lib, boring):
        loops = __import__(f"{lib.__name__}.loops", fromlist=["_Loop"])
        utilities = __import__(f"{lib.__name__}.loops.utilities", fromlist=["_no_grad_context"])
        trainer = lib.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
        seen = []

        class NotALoop:
            @utilities._no_grad_context
            def run(self):
                pass

        class WithoutFlag(loops._Loop):
            @utilities._no_grad_context
            def run(self):
                pass

        class Flagged(loops._Loop):
            def __init__(self, inference_mode):
                super().__init__(trainer)
                self.inference_mode = inference_mode

            @utilities._no_grad_context
            def run(self, x):
                return x, torch.is_grad_enabled(), torch.is_inference_mode_enabled()

        for run in (NotALoop().run, WithoutFlag(trainer).run):
            with pytest.raises(TypeError) as error:
                run()
            seen.append(str(error.value))
        seen += [Flagged(True).run(1), Flagged(False).run(2), torch.is_grad_enabled()]
        return seen

    got = {name: case(*LIBS[name]) for name in LIBS}
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"][2:] == [(1, False, True), (2, False, False), True]
