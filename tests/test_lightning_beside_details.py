"""Small behaviours a Lightning user sees, beside Lightning 2.6 (found by its own test suite under the renames):
ModelCheckpoint's names for a fixed `filename` (only the file a save replaces gives its name up; any other taken
name gets "-vN"), and `freeze()` / `unfreeze()` returning the module."""
import os

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = {"tasktrain": (tasktrain, ours, tasktrain.ModelCheckpoint),
        "lightning": (pl, theirs, pl.callbacks.ModelCheckpoint)}
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, limit_train_batches=1,
             limit_val_batches=1, num_sanity_val_steps=0)


@pytest.mark.parametrize("top_k, mode", [(-1, "min"), (2, "max"), (2, "min"), (1, "max")])
def test_a_fixed_checkpoint_name_is_versioned_as_lightnings(tmp_path, top_k, mode):
    seen = {}
    for key, (lib, classes, checkpoint_cls) in LIBS.items():
        directory = tmp_path / key
        saver = checkpoint_cls(dirpath=directory, filename="test", monitor="epoch", mode=mode, save_top_k=top_k)
        trainer = lib.Trainer(max_epochs=2, callbacks=[saver], default_root_dir=directory, **QUIET)
        lib.seed_everything(1, verbose=False)
        trainer.fit(classes.BoringModel())
        trainer.fit_loop.max_epochs = 4  # a second fit of the same Trainer writes into the same folder
        trainer.fit(classes.BoringModel())
        seen[key] = (sorted(os.listdir(directory)), sorted(os.path.basename(p) for p in saver.best_k_models),
                     os.path.basename(saver.best_model_path))
    assert seen["tasktrain"] == seen["lightning"]
    if top_k == -1:  # (every file kept: the second and later saves of "test" are versioned)
        assert seen["tasktrain"][0] == ["test-v1.ckpt", "test-v2.ckpt", "test-v3.ckpt", "test.ckpt"]


def test_freeze_and_unfreeze_return_the_module():
    for lib, classes, _ in LIBS.values():
        module = classes.BoringModel()
        assert module.freeze() is module and not module.training
        assert not any(p.requires_grad for p in module.parameters())
        assert module.unfreeze() is module and module.training
        assert all(p.requires_grad for p in module.parameters())


def test_hyper_parameter_files_as_lightnings_core_saving(tmp_path):
    """tasktrain.core.saving: hparams.yaml and meta_tags.csv written and read back as Lightning's helpers do."""
    import enum
    import threading
    import warnings
    from argparse import Namespace

    from lightning.pytorch.core import saving as theirs_saving

    from tasktrain.core import saving as ours_saving

    Color = enum.Enum("Color", "RED BLUE")
    seen = {}
    for key, saving in (("tasktrain", ours_saving), ("lightning", theirs_saving)):
        folder = tmp_path / key
        folder.mkdir()
        hparams = {"batch_size": 32, "lr": 0.008, "name": "adam", "sizes": [1, 2], "color": Color.RED,
                   "lock": threading.Lock()}
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            saving.save_hparams_to_yaml(folder / "hparams.yaml", dict(hparams), use_omegaconf=False)
            saving.save_hparams_to_tags_csv(folder / "meta_tags.csv", Namespace(an_int=1, a_float=2.0, text="a str"))
            loaded = (saving.load_hparams_from_yaml(folder / "hparams.yaml", use_omegaconf=False),
                      saving.load_hparams_from_tags_csv(folder / "meta_tags.csv"),
                      saving.load_hparams_from_yaml(folder / "missing.yaml"),
                      saving.load_hparams_from_tags_csv(folder / "missing.csv"))
        with pytest.raises(RuntimeError, match="Missing folder") as refused:
            saving.save_hparams_to_yaml(folder / "nowhere" / "hparams.yaml", {"a": 1})
        files = ((folder / "hparams.yaml").read_text(), (folder / "meta_tags.csv").read_text())
        notes = sorted((type(w.message).__name__, str(w.message).replace(str(folder), "DIR")) for w in said)
        seen[key] = loaded, files, notes, str(refused.value).replace(str(folder), "DIR")
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0][0] == {"batch_size": 32, "color": "RED", "lr": 0.008, "name": "adam", "sizes": [1, 2]}


@pytest.mark.parametrize("bar", ["rich", "tqdm"])
def test_a_faked_clock_validates_where_lightnings_does(bar):
    """A time-based val_check_interval under a fake time.monotonic (one second a read, as Lightning's own test fakes
    it): the progress bar keeps its own clock, so the validations fall where Lightning's do."""
    import time
    from unittest.mock import patch

    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        reads = iter(range(10_000))
        if lib is tasktrain:
            bars = {"rich": tasktrain.callbacks.RichProgressBar, "tqdm": tasktrain.callbacks.TQDMProgressBar}
        else:
            bars = {"rich": pl.callbacks.RichProgressBar, "tqdm": pl.callbacks.TQDMProgressBar}

        class Counted(classes.BoringModel):
            validated = []

            def on_validation_start(self):
                self.validated.append((self.trainer.current_epoch, self.trainer.global_step))

        module = Counted()
        module.validated = []
        with patch("time.monotonic", side_effect=lambda: next(reads)):
            trainer = lib.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False, max_epochs=4,
                                  limit_train_batches=2, limit_val_batches=1, val_check_interval="00:00:00:04",
                                  check_val_every_n_epoch=None, num_sanity_val_steps=0, callbacks=[bars[bar]()])
            trainer.fit(module)
        seen[key] = module.validated
        time.monotonic()  # (the real clock again)
    assert seen["tasktrain"] == seen["lightning"] and len(seen["tasktrain"]) >= 2


def test_an_hparams_file_is_read_as_plain_yaml_only(tmp_path):
    """A file a user hands us: the tuples yaml.dump writes load, a tag that builds Python objects is refused with an
    error naming the file (Lightning's full_load constructs some)."""
    from tasktrain.core import saving

    good = tmp_path / "hparams.yaml"
    saving.save_hparams_to_yaml(good, {"shape": (2, 3), "lr": 0.1}, use_omegaconf=False)
    assert "!!python/tuple" in good.read_text()
    assert saving.load_hparams_from_yaml(good, use_omegaconf=False) == {"shape": (2, 3), "lr": 0.1}
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text("x: !!python/object/new:os.system [echo pwned]\ny: !!python/name:os.system\n")
    with pytest.raises(ValueError, match="hostile.yaml is not an hparams file"):
        saving.load_hparams_from_yaml(hostile, use_omegaconf=False)


@pytest.mark.parametrize("interval, every", [(3, 2), (0.5, 2), (4, None)])
def test_mid_epoch_validation_only_in_the_epochs_check_val_every_n_epoch_names(interval, every):
    """val_check_interval validates inside an epoch only where check_val_every_n_epoch says (Lightning's
    _should_check_val_fx); None counts the interval over the whole run."""
    from torch.utils.data import DataLoader

    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        validated = []

        class Model(classes.BoringModel):
            def validation_step(self, batch, batch_idx):
                if batch_idx == 0:
                    validated.append((self.current_epoch, self.global_step))
                return super().validation_step(batch, batch_idx)

        data = classes.RandomDataset(32, 20)
        trainer = lib.Trainer(max_epochs=4, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                              enable_model_summary=False, num_sanity_val_steps=0, val_check_interval=interval,
                              check_val_every_n_epoch=every)
        trainer.fit(Model(), DataLoader(data, batch_size=2), DataLoader(data, batch_size=10))
        seen[key] = validated
    assert seen["tasktrain"] == seen["lightning"]
    assert len(seen["tasktrain"]) == {3: 6, 0.5: 4, 4: 10}[interval]


def test_a_fraction_limit_that_leaves_no_batch_is_lightnings_error():
    """limit_*_batches=0.5 of a one-batch loader would run nothing: Lightning's MisconfigurationException, the same
    words (tasktrain trained zero steps silently); a fraction of a loader without a length is refused but 1.0."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.randn(4, 32))

    def outcome(call):
        try:
            call()
        except Exception as error:  # noqa: BLE001 (the type and the words are what is compared)
            return type(error).__name__, str(error)
        return "ran"

    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        one_batch = classes.RandomDataset(32, 2)
        quiet = dict(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                     enable_model_summary=False, num_sanity_val_steps=0)
        seen[key] = [
            outcome(lambda: lib.Trainer(limit_train_batches=0.5, **quiet).fit(
                classes.BoringModel(), DataLoader(one_batch, batch_size=2))),
            outcome(lambda: lib.Trainer(limit_val_batches=0.1, **quiet).validate(
                classes.BoringModel(), DataLoader(one_batch, batch_size=1), verbose=False)),
            outcome(lambda: lib.Trainer(limit_test_batches=0.3, **quiet).test(
                classes.BoringModel(), DataLoader(one_batch, batch_size=1), verbose=False)),
            outcome(lambda: lib.Trainer(limit_predict_batches=0.2, **quiet).predict(
                classes.BoringModel(), DataLoader(one_batch, batch_size=1))),
            outcome(lambda: lib.Trainer(limit_train_batches=1.0, max_steps=2, **quiet).fit(
                classes.BoringModel(), DataLoader(Stream(), batch_size=2))),
            outcome(lambda: lib.Trainer(limit_train_batches=0.5, **quiet).fit(
                classes.BoringModel(), DataLoader(Stream(), batch_size=2))),
        ]
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0][0] == "MisconfigurationException" and seen["tasktrain"][4] == "ran"


def test_a_zero_limit_requests_no_loader(tmp_path):
    """limit_train_batches=0 / limit_predict_batches=0: Lightning's loops skip before their data is set up, so
    train_dataloader() / predict_dataloader() are not called (tasktrain called them: a loader that is expensive to
    build, or that fails on an empty split, was built all the same); the hooks that run and the counts are the
    same (found by Lightning's test_dataloaders_are_not_loaded_if_disabled_through_limit_batches)."""
    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        class Counted(classes.BoringModel):
            def __init__(self):
                super().__init__()
                self.called = []

            def train_dataloader(self):
                self.called.append("train_dataloader")
                return super().train_dataloader()

            def val_dataloader(self):
                self.called.append("val_dataloader")
                return super().val_dataloader()

            def predict_dataloader(self):
                self.called.append("predict_dataloader")
                return super().predict_dataloader()

            def on_train_start(self):
                self.called.append("on_train_start")

            def on_predict_start(self):
                self.called.append("on_predict_start")

        runs = []
        for stage, limits in (("fit", dict(limit_train_batches=0)), ("fit", dict(limit_train_batches=0.0,
                              num_sanity_val_steps=0)), ("predict", dict(limit_predict_batches=0))):
            module = Counted()
            trainer = lib.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                                  default_root_dir=tmp_path / key, **limits)
            out = getattr(trainer, stage)(module)
            runs.append((module.called, out, trainer.train_dataloader is None, trainer.num_training_batches,
                         trainer.global_step))
        seen[key] = runs
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0][0] == ["val_dataloader"] and seen["tasktrain"][2][0] == []


def test_two_stateful_callbacks_of_one_state_key_are_refused():
    """Two callbacks with a state under one state_key (two ModelCheckpoints that differ only in their folder): one
    checkpoint entry for both, a resume would hand both the same state. Lightning refuses them at Trainer() with a
    RuntimeError; tasktrain accepted them. Keys that differ, and stateless callbacks, are accepted by both."""
    import tasktrain.callbacks as ours_callbacks

    seen = {}
    for key, (lib, _, checkpoint_cls) in LIBS.items():
        callbacks = ours_callbacks if lib is tasktrain else pl.callbacks
        cases = [[checkpoint_cls("a"), checkpoint_cls("b")],
                 [checkpoint_cls("a"), checkpoint_cls("b", monitor="x")],
                 [callbacks.EarlyStopping("x"), callbacks.EarlyStopping("x")],
                 [callbacks.EarlyStopping("x"), callbacks.EarlyStopping("x", mode="max")],
                 [callbacks.LearningRateMonitor(), callbacks.LearningRateMonitor()]]
        outcomes = []
        for case in cases:
            try:
                lib.Trainer(callbacks=case, logger=False, enable_progress_bar=False, enable_model_summary=False)
                outcomes.append("accepted")
            except RuntimeError as error:
                outcomes.append(str(error))
        seen[key] = outcomes
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0].startswith("Found more than one stateful callback of type `ModelCheckpoint`")
    assert seen["tasktrain"][1] == "accepted" and seen["tasktrain"][4] == "accepted"


def test_overfit_batches_validates_on_the_first_batches_in_order():
    """overfit_batches with a shuffling val loader: Lightning warns and reads fit's validation loaders in order (as
    the training loader), so every validation sees the same first batches; tasktrain kept them shuffling (found by
    Lightning's test_overfit_batches_raises_warning_in_case_of_sequential_sampler)."""
    import warnings

    from torch.utils.data import DataLoader, SequentialSampler

    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        data = classes.RandomDataset(32, 64)
        read = []

        class Overfit(classes.BoringModel):
            def validation_step(self, batch, batch_idx):
                read.append((self.current_epoch, batch[0, 0].item()))
                return super().validation_step(batch, batch_idx)

            def val_dataloader(self):
                return DataLoader(data, batch_size=2, shuffle=True)

        trainer = lib.Trainer(max_epochs=2, overfit_batches=3, num_sanity_val_steps=0, logger=False,
                              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer.fit(Overfit())
        in_order = [data[i][0].item() for i in (0, 2, 4)]
        seen[key] = (read == [(epoch, x) for epoch in (0, 1) for x in in_order],
                     isinstance(trainer.val_dataloaders.sampler, SequentialSampler),
                     sorted({str(w.message) for w in said if "val dataloader" in str(w.message)}))
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][:2] == (True, True) and len(seen["tasktrain"][2]) == 1


@pytest.mark.parametrize("shuffle", [False, True])
def test_overfit_batches_trains_on_lightnings_loader_and_resumes_exactly(shuffle, tmp_path):
    """overfit_batches on one process: Lightning keeps a plain training loader whose sampler is sequential (the same
    object) and builds a shuffling one again with a SequentialSampler; trainer.train_dataloader and its samplers are
    Lightning's (it had tasktrain's resumable sampler), the batches trained on too. A fit stopped inside an epoch and
    resumed from its checkpoint trains on the interrupted fit's batches and ends on its weights."""
    import warnings

    from torch.utils.data import DataLoader

    def fit(lib, classes, max_steps=-1, ckpt_path=None, callbacks=()):
        torch.manual_seed(0)
        data = classes.RandomDataset(32, 16)
        read = []

        class Model(classes.BoringModel):
            def training_step(self, batch, batch_idx):
                read.append(round(batch[0, 0].item(), 5))
                return super().training_step(batch, batch_idx)

        loader = DataLoader(data, batch_size=2, shuffle=shuffle)
        model = Model()
        trainer = lib.Trainer(max_epochs=2, max_steps=max_steps, overfit_batches=3, num_sanity_val_steps=0,
                              logger=False, enable_progress_bar=False, enable_model_summary=False,
                              callbacks=list(callbacks), enable_checkpointing=bool(callbacks),
                              default_root_dir=str(tmp_path))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, loader, ckpt_path=ckpt_path)
        got = trainer.train_dataloader
        return (got is loader, type(got).__name__, type(got.sampler).__name__, type(got.batch_sampler).__name__,
                type(got.batch_sampler.sampler).__name__, read), model, trainer

    ours_, model, _ = fit(tasktrain, ours)
    theirs_, _, _ = fit(pl, theirs)
    assert ours_ == theirs_
    assert ours_[:5] == (not shuffle, "DataLoader", "SequentialSampler", "BatchSampler", "SequentialSampler")
    from tasktrain.callbacks import ModelCheckpoint

    fit(tasktrain, ours, max_steps=2, callbacks=[ModelCheckpoint(dirpath=str(tmp_path), save_last=True)])
    resumed, again, trainer = fit(tasktrain, ours, ckpt_path=str(tmp_path / "last.ckpt"))
    assert trainer.global_step == 6 and resumed[5] == ours_[5][2:]  # the batches after the 2nd, in order
    for a, b in zip(model.parameters(), again.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_trainer_arguments_from_pl_trainer_environment_variables(monkeypatch):
    """Lightning's Trainer reads an argument not passed from PL_TRAINER_<ARGUMENT> (a literal where it parses as
    one, else the string; empty is unset; a passed argument wins; a subclass reads PL_<ITS NAME>_...); tasktrain
    ignored them (found by Lightning's test_env_vars.py)."""
    import inspect

    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_ACCELERATOR", "cpu")
    monkeypatch.setenv("PL_TRAINER_LIMIT_VAL_BATCHES", "0.25")
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "")
    monkeypatch.setenv("PL_TRAINER_NOT_AN_ARGUMENT", "1")
    monkeypatch.setenv("PL_MYTRAINER_MIN_STEPS", "3")
    seen = {}
    for key, (lib, _, _) in LIBS.items():
        class MyTrainer(lib.Trainer):
            pass

        quiet = dict(enable_progress_bar=False, enable_model_summary=False)
        plain, passed, sub = lib.Trainer(**quiet), lib.Trainer(max_steps=42, logger=True, **quiet), MyTrainer(**quiet)
        seen[key] = [(t.logger is None, t.max_steps, type(t.accelerator).__name__, t.limit_val_batches, t.max_epochs,
                      t.min_steps) for t in (plain, passed, sub)]
        assert "max_steps" in inspect.signature(lib.Trainer).parameters  # (the CLI reads the signature)
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0][:2] == (True, 7) and seen["tasktrain"][1][:2] == (False, 42)
    assert seen["tasktrain"][2][5] == 3


@pytest.mark.parametrize("given", [{}, {"fast_dev_run": 0}, {"fast_dev_run": 1}, {"fast_dev_run": 3},
                                   {"overfit_batches": 2}, {"limit_val_batches": 0.5, "limit_test_batches": 4}])
def test_loop_limit_attributes_read_as_lightnings(given):
    """trainer.limit_*_batches read 1.0 when not limited (tasktrain: None, which `trainer.limit_val_batches > 0`
    refuses) and fast_dev_run keeps what was given (tasktrain: 0 for False)."""
    names = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
             "fast_dev_run", "overfit_batches")
    seen = {}
    for key, (lib, _, _) in LIBS.items():
        trainer = lib.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, **given)
        seen[key] = [(getattr(trainer, name), type(getattr(trainer, name)).__name__) for name in names]
    assert seen["tasktrain"] == seen["lightning"]


@pytest.mark.parametrize("case", [
    dict(limit_train_batches=0, max_epochs=2), dict(limit_train_batches=0, max_steps=5),
    dict(iterable=True, max_epochs=2), dict(iterable=True, max_steps=7),
    dict(max_epochs=3, accumulate_grad_batches=3), dict(max_epochs=2, max_steps=5),
    dict(max_epochs=-1, max_steps=4), dict(limit_train_batches=0.5, max_epochs=2)])
def test_estimated_stepping_batches_read_as_lightnings(case):
    """trainer.estimated_stepping_batches read in configure_optimizers: a loader without a length or a zero limit
    gives max_steps (-1 when unset), as Lightning's; otherwise ceil(batches / accumulation) x epochs, capped."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    case = dict(case)
    iterable = case.pop("iterable", False)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.randn(10, 32))

    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        read = []

        class Net(classes.BoringModel):
            def configure_optimizers(self):
                read.append(self.trainer.estimated_stepping_batches)
                return super().configure_optimizers()

            def train_dataloader(self):
                return DataLoader(Stream() if iterable else classes.RandomDataset(32, 64), batch_size=4)

        kwargs = dict(QUIET, limit_train_batches=1.0, limit_val_batches=0, enable_checkpointing=False)
        kwargs.update(case)
        lib.Trainer(**kwargs).fit(Net())
        seen[key] = read
    assert seen["tasktrain"] == seen["lightning"] and len(seen["tasktrain"]) == 1


def test_a_spawned_predict_refuses_return_predictions_as_lightning():
    """Under "ddp_spawn" Lightning returns no predictions by default and refuses return_predictions=True (its
    prediction loop's setter, run in the children: its parent raises torch's ProcessRaisedException); tasktrain
    refuses it with the same words before spawning, with an exception that is both torch's and a
    MisconfigurationException, and returns None by default (tests/test_ddp.py's spawned run checks that; gather=True
    brings them back)."""
    from torch.utils.data import DataLoader

    lit = pl.Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", logger=False)
    lit.predict_loop.return_predictions = None
    assert lit.predict_loop.return_predictions is False
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException) as theirs_error:
        lit.predict_loop.return_predictions = True
    trainer = tasktrain.Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", logger=False)
    loader = DataLoader(ours.RandomDataset(32, 4), batch_size=2)
    with pytest.raises(tasktrain.exceptions.MisconfigurationException) as ours_error:
        trainer.predict(ours.BoringModel(), loader, return_predictions=True)
    start = "`return_predictions` should be set to `False` when using the strategies that spawn or fork. Found True"
    assert str(theirs_error.value).startswith(start) and str(ours_error.value).startswith(start)
    # what Lightning's parent raises (a user's `except ProcessRaisedException` around predict catches ours too)
    assert isinstance(ours_error.value, torch.multiprocessing.ProcessRaisedException)


def test_a_validation_that_cannot_run_is_noted_as_lightning_notes_it():
    """Lightning's notes at fit when validation cannot run: loaders (the module's, a datamodule's or fit's) without a
    validation_step ("You passed in a `val_dataloader` but have no `validation_step`", a UserWarning), and a
    validation_step without loaders (a PossibleUserWarning); nothing when both or neither are there."""
    import warnings

    def run(lib, classes):
        seen = []
        for case in ("no step", "no step, fit's loader", "no loader", "both", "neither", "datamodule's loader"):
            class Module(classes.BoringModel):
                pass
            if case.startswith("no step") or case in ("neither", "datamodule's loader"):
                Module.validation_step = None
            if case in ("no loader", "neither", "no step, fit's loader", "datamodule's loader"):
                Module.val_dataloader = None
            kwargs = {}
            if case == "no step, fit's loader":
                kwargs["val_dataloaders"] = classes.BoringModel().val_dataloader()
            if case == "datamodule's loader":
                kwargs["datamodule"] = classes.BoringDataModule()
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                lib.Trainer(max_epochs=1, **{**QUIET, "enable_checkpointing": False}).fit(
                    Module(), **kwargs)
            seen.append((case, sorted((w.category.__name__, str(w.message)) for w in said
                                      if "Skipping val loop" in str(w.message))))
        return seen

    mine, reference = run(tasktrain, ours), run(pl, theirs)
    assert mine == reference
    assert dict(mine)["no loader"] == [("PossibleUserWarning", "You defined a `validation_step` but have no "
                                        "`val_dataloader`. Skipping val loop.")]
    assert len(dict(mine)["no step"]) == 1 and dict(mine)["both"] == dict(mine)["neither"] == []


def test_a_module_that_cannot_run_is_refused_with_lightnings_error_before_the_logger_makes_a_folder(tmp_path):
    """Lightning's configuration check before a run: a missing (or None) training_step / configure_optimizers,
    validation_step / test_step, a None predict_step, and manual optimisation with gradient_clip_val or
    accumulate_grad_batches are its MisconfigurationException with its words (tasktrain's hint may follow), raised
    before the default logger makes its version folder (was: NotImplementedError, and a folder left behind)."""

    def refusals(lib, classes, root):
        def module(**attributes):
            return type("Module", (classes.BoringModel,), attributes)()

        cases = [("fit", module(training_step=None), {}), ("fit", module(configure_optimizers=None), {}),
                 ("validate", module(validation_step=None), {}), ("test", module(test_step=None), {}),
                 ("predict", module(predict_step=None), {}),
                 ("fit", module(automatic_optimization=False), {"gradient_clip_val": 1.0}),
                 ("fit", module(automatic_optimization=False), {"accumulate_grad_batches": 2})]
        seen = []
        for index, (stage, model, flags) in enumerate(cases):
            directory = os.path.join(root, str(index))
            trainer = lib.Trainer(default_root_dir=directory, max_epochs=1, enable_progress_bar=False,
                                  enable_model_summary=False, **flags)
            with pytest.raises(Exception) as refused:
                getattr(trainer, stage)(model)
            seen.append((type(refused.value).__name__, str(refused.value), os.path.exists(directory)))
        return seen

    mine = refusals(tasktrain, ours, str(tmp_path / "tasktrain"))
    reference = refusals(pl, theirs, str(tmp_path / "lightning"))
    for (name, message, folder), (their_name, their_message, their_folder) in zip(mine, reference, strict=True):
        assert name == their_name == "MisconfigurationException"
        assert message.startswith(their_message), (message, their_message)
        assert folder is their_folder is False


def _not_loaders(lib, classes):
    """What each entry point raises for loaders that are not iterable, passed or returned by a hook (of the module or
    of a DataModule), or for a hook that is not defined at all."""
    import re
    import warnings

    seen = []
    for fn, arg, hook in (("fit", "train_dataloaders", "train_dataloader"), ("validate", "dataloaders", "val_dataloader"),
                          ("test", "dataloaders", "test_dataloader"), ("predict", "dataloaders", "predict_dataloader")):
        for given in (None, object(), [1, object()]):
            for where in ("passed", "module hook", "datamodule hook"):
                model = classes.BoringModel()
                for name in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
                    setattr(model, name, None)  # (as Lightning's test: the hooks "not implemented")
                datamodule = None
                if where == "datamodule hook":
                    datamodule = classes.BoringDataModule()
                    setattr(datamodule, hook, lambda given=given: given)
                elif where == "module hook":
                    setattr(model, hook, lambda given=given: given)
                trainer = lib.Trainer(fast_dev_run=1, logger=False, enable_progress_bar=False,
                                      enable_model_summary=False, enable_checkpointing=False)
                kwargs = {arg: given} if where == "passed" else {}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with pytest.raises(TypeError) as error:
                        getattr(trainer, fn)(model, datamodule=datamodule, **kwargs)
                seen.append((fn, where, re.sub(r" at 0x[0-9a-f]+", "", str(error.value))
                             .replace("LightningModule/LightningDataModule", "TaskModule/DataModule")))

    class NoLoaders(classes.BoringModel):
        train_dataloader = val_dataloader = lib.LightningModule.train_dataloader if lib is pl else \
            lib.TaskModule.train_dataloader
    with pytest.raises(ValueError if lib is tasktrain else Exception, match="`train_dataloader` must be implemented"):
        lib.Trainer(fast_dev_run=1, logger=False, enable_progress_bar=False).fit(NoLoaders())
    return seen


def test_loaders_that_are_not_iterable_are_refused_as_lightnings():
    """Lightning's TypeError, naming the entry point's argument or the hook that returned the object (each loader of a
    list checked), before the run starts; an undefined hook, Lightning's "must be implemented"."""
    import gc

    got = {key: _not_loaders(lib, classes) for key, (lib, classes, _) in LIBS.items()}
    gc.collect()  # (the refused runs' tracebacks hold reference cycles: collected now, not inside a later test)
    assert got["tasktrain"] == got["lightning"]
    assert ("fit", "passed", "An invalid dataloader was passed to `Trainer.fit(train_dataloaders=...)`. Found 1.") \
        in got["tasktrain"]


def _iterable_len_warnings(lib, classes):
    """Whether each entry point warns that an IterableDataset has a length, with and without one."""
    import warnings

    from torch.utils.data import DataLoader, IterableDataset

    data = classes.RandomDataset(32, 16)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(data)

    class SizedStream(Stream):
        def __len__(self):
            return len(data)

    seen = []
    for dataset in (SizedStream(), Stream()):
        trainer = lib.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                              enable_checkpointing=False)
        loader = DataLoader(dataset, batch_size=4)
        for fn, kwargs in (("validate", {"dataloaders": [loader]}),
                           ("fit", {"train_dataloaders": loader, "val_dataloaders": [loader]}),
                           ("test", {"dataloaders": loader}), ("predict", {"dataloaders": loader})):
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                getattr(trainer, fn)(classes.BoringModel(), **kwargs)
            seen.append((type(dataset).__name__, fn,
                         sum("Your `IterableDataset` has `__len__` defined" in str(w.message) for w in record) > 0))
    return seen


def test_an_iterable_dataset_with_a_length_warns_as_lightnings():
    got = {key: _iterable_len_warnings(lib, classes) for key, (lib, classes, _) in LIBS.items()}
    assert got["tasktrain"] == got["lightning"]
    assert [said for *_, said in got["tasktrain"]] == [True] * 4 + [False] * 4


def test_an_empty_evaluation_loader_warns_as_lightnings():
    from torch.utils.data import DataLoader

    seen = {}
    for key, (lib, classes, _) in LIBS.items():
        trainer = lib.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                              enable_checkpointing=False)
        with pytest.warns(UserWarning) as record:
            trainer.validate(classes.BoringModel(), DataLoader(classes.RandomDataset(32, 0)), verbose=False)
        seen[key] = ([str(w.message) for w in record if "Total length" in str(w.message)], trainer.num_val_batches)
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"] == (["Total length of `DataLoader` across ranks is zero. Please make sure this was your "
                                  "intention."], [0])
