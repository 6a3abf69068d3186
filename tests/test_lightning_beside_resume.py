"""Details of a resumed fit and of what a checkpoint holds, beside Lightning 2.6 (issue 37): reload_dataloaders_every_n_epochs
counts from the epoch each loader was last requested at (a resumed fit included); the sanity check of a fit resumed
from an epoch's end sees that epoch as current_epoch (and a checkpoint saved then resumes as the original); callbacks
with an empty state are not saved, and one the checkpoint has no state for keeps its own; WeightAveraging saves
Lightning's keys; a corrupt `.last_checkpoint.json` names itself and the fix."""
import os

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = {"tasktrain": (tasktrain, ours), "lightning": (pl, theirs)}
QUIET = dict(enable_progress_bar=False, enable_model_summary=False, limit_train_batches=2, limit_val_batches=1,
             num_sanity_val_steps=1)


def _callbacks(lib):
    return pl.callbacks if lib is pl else tasktrain.callbacks


def _classes(lib, classes, seen):
    """A boring module that notes each loader request and validation with current_epoch (and whether it is the
    sanity check), logs a constant (the loggers' rows are compared), and a logger that keeps the rows."""

    class Module(classes.BoringModel):
        def train_dataloader(self):
            seen.append(("train_dataloader", self.trainer.current_epoch))
            return super().train_dataloader()

        def val_dataloader(self):
            seen.append(("val_dataloader", self.trainer.sanity_checking, self.trainer.current_epoch))
            return super().val_dataloader()

        def validation_step(self, batch, batch_idx):
            seen.append(("validation_step", self.trainer.sanity_checking, self.trainer.current_epoch))
            self.log("v", 1.0)
            return super().validation_step(batch, batch_idx)

    base = pl.loggers.Logger if lib is pl else tasktrain.loggers.Logger

    class Rows(base):
        name, version = "rows", 0

        def log_metrics(self, metrics, step=None):
            seen.append(("log", step, tuple(sorted((k, float(v)) for k, v in metrics.items()))))

        def log_hyperparams(self, *args, **kwargs):
            pass

    return Module, Rows


def _saver(lib, when, path):
    """trainer.save_checkpoint(path) once: at epoch 0's end, after step 3 (inside epoch 1), or at the sanity check's
    end."""

    class Saver(lib.Callback):
        def on_train_epoch_end(self, trainer, module):
            if when == "epoch end" and trainer.current_epoch == 0:
                trainer.save_checkpoint(path)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if when == "mid epoch" and trainer.global_step == 3:
                trainer.save_checkpoint(path)

        def on_sanity_check_end(self, trainer, module):
            if when == "sanity" and not os.path.exists(path):
                trainer.save_checkpoint(path)

    return Saver()


def _resume_run(name, when, every, check_val, max_steps, root):
    lib, classes = LIBS[name]
    seen = []
    Module, Rows = _classes(lib, classes, seen)
    kwargs = dict(QUIET, reload_dataloaders_every_n_epochs=every, check_val_every_n_epoch=check_val,
                  default_root_dir=root)
    first = os.path.join(root, "first.ckpt")
    lib.seed_everything(1, verbose=False)
    lib.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, callbacks=[_saver(lib, when, first)],
                **kwargs).fit(Module())
    seen.clear()
    lib.seed_everything(2, verbose=False)
    folder = os.path.join(root, "kept")
    sanity = os.path.join(root, "sanity.ckpt")
    checkpoint = _callbacks(lib).ModelCheckpoint(dirpath=folder, save_top_k=-1)
    trainer = lib.Trainer(max_epochs=4, max_steps=max_steps, logger=Rows(),
                          callbacks=[checkpoint, _saver(lib, "sanity", sanity)], **kwargs)
    trainer.fit(Module(), ckpt_path=first)
    out = dict(resumed=list(seen), files=sorted(os.listdir(folder)))
    if not os.path.exists(sanity):  # no sanity check
        return out
    out["sanity_epoch"] = torch.load(sanity, weights_only=False)["epoch"]
    # the checkpoint written during the sanity check resumes as the one the fit started from
    seen.clear()
    lib.seed_everything(3, verbose=False)
    lib.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, **kwargs).fit(Module(), ckpt_path=sanity)
    out["from_sanity"] = list(seen)
    return out


@pytest.mark.parametrize("when,every,check_val,max_steps", [
    ("epoch end", 1, 1, -1), ("epoch end", 2, 1, -1), ("mid epoch", 2, 2, -1), ("epoch end", 1, 1, 7)])
def test_reloads_and_the_sanity_check_of_a_resumed_fit_are_lightnings(when, every, check_val, max_steps, tmp_path):
    """Lightning runs the sanity check of a resumed fit only when the checkpoint's epoch was finished and the fit
    does not count steps (max_steps); it then sees the checkpoint's epoch as current_epoch."""
    ours_, theirs_ = (_resume_run(name, when, every, check_val, max_steps, str(tmp_path / name)) for name in LIBS)
    sanity = [[event for event in run["resumed"] if event[0] == "validation_step" and event[1]]
              for run in (ours_, theirs_)]
    assert sanity[0] == sanity[1] == ([("validation_step", True, 0)] if max_steps == -1 and when == "epoch end"
                                      else [])
    if max_steps != -1:  # (Lightning's step-counted resume from an epoch's end then runs that epoch's end again,
        return  # its ModelCheckpoint writing epoch=0-step=2.ckpt once more: not followed)
    assert ours_ == theirs_
    if when == "epoch end" and max_steps == -1:  # (what Lightning shows, spelled out)
        loads = [event[1] for event in ours_["resumed"] if event[0] == "train_dataloader"]
        assert loads == ([0, 1, 2, 3] if every == 1 else [0, 2])  # requested at 0, again 1 or 2 epochs later


def test_a_loader_requested_early_is_reloaded_at_the_resumed_epoch_as_lightning(tmp_path):
    """configure_optimizers reads estimated_stepping_batches: the training loader is requested before the
    checkpoint's counters are restored (at current_epoch 0); the resumed fit at epoch 3 requests it again before
    its loop starts, as Lightning's does."""
    def run(name):
        lib, classes = LIBS[name]
        seen = []
        Module, _ = _classes(lib, classes, seen)

        class Early(Module):
            def configure_optimizers(self):
                seen.append(("stepping batches", self.trainer.estimated_stepping_batches))
                return super().configure_optimizers()

        root = str(tmp_path / name)
        kwargs = dict(QUIET, num_sanity_val_steps=0, limit_val_batches=0, logger=False, enable_checkpointing=False,
                      reload_dataloaders_every_n_epochs=2, default_root_dir=root)
        lib.seed_everything(1, verbose=False)
        trainer = lib.Trainer(max_epochs=3, **kwargs)
        trainer.fit(Module())
        trainer.save_checkpoint(os.path.join(root, "end.ckpt"))
        seen.clear()
        lib.seed_everything(1, verbose=False)
        lib.Trainer(max_epochs=5, **kwargs).fit(Early(), ckpt_path=os.path.join(root, "end.ckpt"))
        return seen

    assert run("tasktrain") == run("lightning")


class _Stateless:
    """A callback without state (Lightning saves nothing for it)."""


class _Counter:
    """A callback with state, which notes each load."""

    def __init__(self, count=0):
        self.count, self.loaded = count, []

    @property
    def state_key(self):
        return "Counter"

    def on_train_epoch_end(self, trainer, module):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state_dict):
        self.loaded.append(dict(state_dict))


def test_callbacks_without_state_are_not_saved_and_a_missing_one_keeps_its_own_as_lightning(tmp_path, recwarn):
    def run(name):
        lib, classes = LIBS[name]
        stateless = type("Stateless", (_Stateless, lib.Callback), {})
        counter = type("Counter", (_Counter, lib.Callback), {})
        cbs = _callbacks(lib)
        kwargs = dict(QUIET, logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path / name))
        path = str(tmp_path / name / "one.ckpt")
        lib.seed_everything(1, verbose=False)
        trainer = lib.Trainer(max_epochs=1, callbacks=[stateless(), cbs.LambdaCallback(on_fit_start=print), cbs.EarlyStopping(
            monitor="missing", check_finite=False, strict=False)], **kwargs)
        trainer.fit(classes.BoringModel())
        trainer.save_checkpoint(path)
        saved = sorted(torch.load(path, weights_only=False)["callbacks"])
        # a callback the checkpoint has no state for (added for the resumed fit): not loaded, keeps its own; no
        # warning (Lightning warns only about saved states no callback takes)
        recwarn.clear()
        added = counter(count=5)
        lib.Trainer(max_epochs=2, callbacks=[stateless(), added], **kwargs).fit(classes.BoringModel(), ckpt_path=path)
        warned = [str(w.message) for w in recwarn if "callbacks used to create the checkpoint" in str(w.message)]
        return saved, added.loaded, added.count, warned

    ours_, theirs_ = run("tasktrain"), run("lightning")
    assert ours_ == theirs_
    assert ours_[0] == [tasktrain.EarlyStopping(monitor="missing").state_key]  # only the callback with a state
    assert ours_[1:3] == ([], 6)  # never loaded; its own count went on
    assert len(ours_[3]) == 1 and "EarlyStopping" in ours_[3][0]  # the saved EarlyStopping state nobody took


def test_weight_averaging_state_is_lightnings_and_resumes_exactly(tmp_path):
    """WeightAveraging updated at epoch ends only (should_update(epoch_idx=...)): its saved state has Lightning's
    keys, and a fit resumed from an epoch-end checkpoint ends on the unbroken fit's average."""
    def averaging(lib):
        base = _callbacks(lib).WeightAveraging

        class EveryEpoch(base):
            def should_update(self, step_idx=None, epoch_idx=None):
                return epoch_idx is not None

        return EveryEpoch()

    def fit(name, epochs, ckpt_path=None, save=None):
        lib, classes = LIBS[name]
        callbacks = [averaging(lib)]
        if save is not None:  # after the averaging callback: the checkpoint holds epoch 0's update
            callbacks.append(_saver(lib, "epoch end", save))
        lib.seed_everything(1, verbose=False)
        module = classes.BoringModel()
        lib.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, callbacks=callbacks,
                    **dict(QUIET, num_sanity_val_steps=0)).fit(module, ckpt_path=ckpt_path)
        return module

    keys = {}
    for name in LIBS:
        path = str(tmp_path / f"{name}.ckpt")
        unbroken = fit(name, 3, save=path)
        keys[name] = {k: sorted(v) for k, v in torch.load(path, weights_only=False)["callbacks"].items()}
        if name == "tasktrain":
            resumed = fit(name, 3, ckpt_path=path)
            for a, b in zip(resumed.parameters(), unbroken.parameters()):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert keys["tasktrain"] == keys["lightning"]
    assert list(keys["tasktrain"].values()) == [["latest_update_step"]]


def test_a_corrupt_last_checkpoint_record_names_itself_and_the_fix(tmp_path):
    from tasktrain.checkpoint_io import POINTER_NAME, CheckpointError

    record = tmp_path / POINTER_NAME
    trainer = tasktrain.Trainer(max_epochs=1, default_root_dir=str(tmp_path), logger=False, **QUIET)
    for text in ('{"path": "/x/epoch=0', "[]"):  # cut short by a crash; not a record
        record.write_text(text)
        with pytest.raises(CheckpointError) as error:
            trainer.fit(ours.BoringModel(), ckpt_path="last")
        assert str(record) in str(error.value) and "delete" in str(error.value) and "ckpt_path=" in str(error.value)


def _saved_checkpoint(name, root, hparams, weights_only):
    """A short fit of a boring module (a scheduler; its hyper-parameters and a DataModule with a state and
    hyper-parameters where `hparams`) under `name`'s Trainer, then save_checkpoint: the dict written."""
    lib, classes = LIBS[name]

    class Module(classes.BoringModel):
        def __init__(self, width=32):
            super().__init__()
            if hparams:
                self.save_hyperparameters()

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]

    class Data(classes.BoringDataModule):
        def __init__(self, config=None):
            super().__init__()
            if hparams:
                self.save_hyperparameters(config)

        def state_dict(self):
            return {"seen": 2} if hparams else {}

    trainer = lib.Trainer(default_root_dir=root, max_steps=2, logger=False, enable_checkpointing=False, **QUIET)
    trainer.fit(Module(), datamodule=Data({"n": 64}))
    trainer.save_checkpoint(os.path.join(root, "x.ckpt"), weights_only=weights_only)
    return torch.load(os.path.join(root, "x.ckpt"), weights_only=False)


@pytest.mark.parametrize("hparams,weights_only", [(True, False), (False, True)])
def test_a_checkpoints_top_level_keys_and_values_are_lightnings(tmp_path, hparams, weights_only):
    """Lightning 2.6's layout: epoch, global_step, pytorch-lightning_version, state_dict, loops; callbacks,
    optimizer_states, lr_schedulers unless weights-only; the hyper-parameters (with hparams_name) and the
    DataModule's state (under its class name) only when there are any. tasktrain's own keys are under "loops"."""
    ours_, theirs_ = (_saved_checkpoint(name, str(tmp_path / name), hparams, weights_only) for name in LIBS)
    assert list(ours_) == list(theirs_)  # the same keys, in the same order
    # (the Lightning layout the file follows: Lightning's migrations read it; tasktrain's version is in loops)
    assert ours_["pytorch-lightning_version"] == "2.6.0" and ours_["loops"]["tasktrain_version"] == tasktrain.__version__
    for loop in ("fit_loop", "validate_loop", "test_loop", "predict_loop"):  # Lightning's loop progress, as Lightning's
        assert ours_["loops"][loop] == theirs_["loops"][loop], loop
    for key in set(ours_) - {"pytorch-lightning_version", "state_dict", "loops", "optimizer_states",
                             "lr_schedulers", "callbacks"}:
        assert ours_[key] == theirs_[key], key  # epoch, global_step, the hyper-parameters, the DataModule's state
    assert len(ours_.get("lr_schedulers", [])) == len(theirs_.get("lr_schedulers", []))
    assert ours_["loops"]["weights_only"] is weights_only and ours_["loops"]["train_state"]["global_step"] == 2


_EPOCH_HOOKS = ("on_fit_start", "on_sanity_check_start", "on_train_start", "on_train_epoch_start",
                "on_train_batch_start", "on_validation_start", "on_train_epoch_end", "on_train_end")


def _epoch_start_run(name, root, save_epoch, resume):
    """A fit whose callback saves in on_train_epoch_start of `save_epoch` (resume=False), or the fit resumed from
    that file: the hooks it calls, with (current_epoch, global_step, sanity_checking)."""
    lib, classes = LIBS[name]
    path, seen = os.path.join(root, "start.ckpt"), []

    def note(hook):
        def call(self, trainer, *args):
            seen.append((hook, trainer.current_epoch, trainer.global_step, trainer.sanity_checking))
            if hook == "on_train_epoch_start" and not resume and trainer.current_epoch == save_epoch:
                trainer.save_checkpoint(path)
        return call

    Saver = type("Saver", (lib.Callback,), {hook: note(hook) for hook in _EPOCH_HOOKS})
    lib.seed_everything(1, verbose=False)
    lib.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, callbacks=[Saver()], default_root_dir=root,
                **QUIET).fit(classes.BoringModel(), ckpt_path=path if resume else None)
    return seen


@pytest.mark.parametrize("save_epoch", [0, 1])
def test_a_checkpoint_saved_in_on_train_epoch_start_resumes_without_the_sanity_check_as_lightning(save_epoch,
                                                                                                 tmp_path):
    """Lightning's fit loop restarts "on the epoch's start" from such a file (its epoch is ready, not processed): no
    sanity check, on_train_epoch_start again. Lightning 2.6 then runs none of that epoch's batches where it is not
    the first (its batch progress is the last epoch's: a bug, docs/lightning.md); tasktrain trains them, as the
    uninterrupted fit does."""
    runs = {}
    for name in LIBS:
        whole = _epoch_start_run(name, str(tmp_path / name), save_epoch, resume=False)
        runs[name] = whole, _epoch_start_run(name, str(tmp_path / name), save_epoch, resume=True)
    (whole, mine), (_, theirs_) = runs["tasktrain"], runs["lightning"]
    assert whole == runs["lightning"][0]  # (the uninterrupted fits agree)
    assert not any(hook == "on_sanity_check_start" for hook, *_ in mine)
    resumed_at = whole.index(("on_train_epoch_start", save_epoch, 2 * save_epoch, False))
    assert mine == [("on_fit_start", 0, 0, False), ("on_train_start", save_epoch, 2 * save_epoch, False)] + \
        whole[resumed_at:]
    if save_epoch == 0:
        assert mine == theirs_
    else:  # Lightning's bug: the restored epoch ends at once, the fit ends one epoch's steps short
        assert theirs_[:3] == mine[:3] and theirs_[3][0] == "on_train_epoch_end"
        assert theirs_[-1][2] == mine[-1][2] - 2


class _PlainIterable:
    """A training iterable (not a DataLoader) of 4 batches, from `start` on."""

    def __init__(self):
        self.start, self.pos, self.loaded = 0, 0, []

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, 4):
            self.pos = i + 1
            yield torch.full((2, 32), float(i))

    def __len__(self):
        return 4


class _OwnStateIterable(_PlainIterable):
    """With state_dict / load_state_dict: its position, and where a loaded state makes it start (a state loaded is
    not the same as batches dropped: it starts at `pos` without reading)."""

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.loaded.append(dict(state))
        self.start = state["pos"]


@pytest.mark.parametrize("stateful", [True, False])
def test_an_iterable_with_its_own_state_resumes_from_it_as_lightning(stateful, tmp_path):
    """A training iterable with state_dict/load_state_dict (Lightning's stateful-iterable protocol) was read and
    dropped to its position on a mid-epoch resume, with a warning, its state never saved; Lightning saves its state
    and loads it back. Now the same under both: the state loaded, the same batches, no warning. Without the protocol
    both warn (PossibleUserWarning, Lightning's first words); tasktrain then reads and drops the batches trained on
    where Lightning reads the epoch again (a kept difference, docs/lightning.md)."""
    import warnings

    def run(lib, classes):
        seen, folder = [], tmp_path / lib.__name__

        class Module(classes.BoringModel):
            def training_step(self, batch, batch_idx):
                seen.append((self.current_epoch, batch_idx, batch[0, 0].item()))
                return super().training_step(batch, batch_idx)

        def data():
            return _OwnStateIterable() if stateful else _PlainIterable()

        kw = dict(default_root_dir=folder, max_epochs=2, enable_model_summary=False, enable_progress_bar=False,
                  logger=False, limit_val_batches=0)
        saver = _callbacks(lib).ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=-1)
        lib.Trainer(callbacks=[saver], **kw).fit(Module(), data())
        seen.clear()
        resumed = data()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lib.Trainer(enable_checkpointing=False, **kw).fit(Module(), resumed, ckpt_path=folder / "epoch=0-step=2.ckpt")
        said = [(w.category.__name__, str(w.message)[:90]) for w in caught if "resuming from a checkpoint" in str(w.message)]
        return seen, resumed.loaded, said

    mine, lightnings = run(tasktrain, ours), run(pl, theirs)
    if stateful:
        assert mine[1] == [{"pos": 2}] and mine[2] == []
        assert mine == lightnings
    else:
        assert mine[2] == lightnings[2] == [("PossibleUserWarning", "You're resuming from a checkpoint that ended "
                                             "before the epoch ended and your dataloader is")]
        assert [b for _, _, b in mine[0][:2]] == [2.0, 3.0]  # (Lightning's reads 0.0, 1.0: the epoch again)


@pytest.mark.parametrize("optimizer_states", ["empty", "saved"])
def test_a_checkpoint_without_loop_state_restores_what_it_holds_and_starts_the_loops_as_lightning(
        tmp_path, optimizer_states, quiet_lightning):
    """NeMo's pattern (Lightning's test_stateful_trainer_ckpt_path_support): a file with weights, optimizer and scheduler
    states but no "loops" given as ckpt_path. Lightning restores what it holds and its loops start from the Trainer's
    own counters (the file's "epoch" / "global_step" are not read: epoch 5 beside max_epochs=1 is not refused); the
    sanity check runs. tasktrain refused it (no loop state)."""
    torch.manual_seed(0)
    source = ours.BoringModel()
    optimizer = torch.optim.SGD(source.parameters(), lr=0.1, momentum=0.9)
    source(torch.ones(2, 32)).sum().backward()
    optimizer.step()
    saved = {"state_dict": source.state_dict(), "lr_schedulers": [], "epoch": 5, "global_step": 40,
             "pytorch-lightning_version": "2.0.0",  # (Lightning reads it: a KeyError without)
             "optimizer_states": {} if optimizer_states == "empty" else [optimizer.state_dict()]}
    path = tmp_path / "nemo.ckpt"
    torch.save(saved, path)

    def run(lib, classes):
        seen = []

        class Module(classes.BoringModel):
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

            def on_train_start(self):
                state = self.trainer.optimizers[0].state
                seen.append(("start", self.trainer.current_epoch, self.trainer.global_step,
                             torch.equal(self.layer.weight, source.layer.weight),
                             [s["momentum_buffer"].clone() for s in state.values()] if state else None))

            def validation_step(self, batch, batch_idx):
                seen.append(("val", self.trainer.sanity_checking))
                return super().validation_step(batch, batch_idx)

        trainer = lib.Trainer(default_root_dir=tmp_path / lib.__name__, max_epochs=1, logger=False, **QUIET)
        trainer.fit(Module(), ckpt_path=str(path))
        return seen, trainer.global_step, trainer.current_epoch

    mine, theirs_ = run(tasktrain, ours), run(pl, theirs)
    assert mine[1:] == theirs_[1:] == (2, 1)
    (m_start,), (t_start,) = ([e for e in seen if e[0] == "start"] for seen in (mine[0], theirs_[0]))
    assert m_start[:4] == t_start[:4] == ("start", 0, 0, True)
    if optimizer_states == "empty":
        assert m_start[4] is None and t_start[4] is None
    else:
        assert len(m_start[4]) == len(t_start[4]) == 2 and all(map(torch.equal, m_start[4], t_start[4]))
    # the sanity check, then the epoch's validation, in both
    assert [e for e in mine[0] if e[0] != "start"] == [e for e in theirs_[0] if e[0] != "start"] == [
        ("val", True), ("val", False)]


def test_a_checkpoint_of_weights_alone_gets_lightnings_key_error(tmp_path, quiet_lightning):
    path = tmp_path / "weights.ckpt"
    torch.save({"state_dict": ours.BoringModel().state_dict(), "pytorch-lightning_version": "2.0.0"}, path)
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        trainer = lib.Trainer(default_root_dir=tmp_path / lib.__name__, max_epochs=1, logger=False, **QUIET)
        with pytest.raises(KeyError, match="Trying to restore optimizer state but checkpoint contains only the model"):
            trainer.fit(classes.BoringModel(), ckpt_path=str(path))
