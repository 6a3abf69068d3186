"""Issue 25: the hook call sequences of fit (automatic and manual optimisation), fit without validation, resumed to a
larger max_epochs / max_steps, validate, test (0 and 2 batches), predict, the DataModule's hooks and the
argument-name variants, hook name by hook name with argument counts, against lists written from Lightning 2.6.6's
behaviour (its tests/tests_pytorch/models/test_hooks.py records the same runs).

Each expected list is Lightning's, unmodified: when fit asks for its loaders (val_dataloader after
on_sanity_check_start, train_dataloader before on_train_start) and restores a checkpoint (the module's and
callbacks' part before configure_optimizers) included; within each event the order is Lightning's (the callbacks'
hooks, then the module's).
  (the optimization hooks, optimizer_step with its closure, optimizer_zero_grad, backward,
  configure_gradient_clipping and clip_gradients, are called where Lightning calls them: no difference.)

The recorder overrides every hook in its class (tasktrain calls a module's hook only where it is overridden, so a
recorder that wraps instances, as Lightning's test does, would see only the overridden ones); each records after
the call returns, as Lightning's does, so a hook called inside another comes first (train(False) inside
on_validation_model_eval, forward inside training_step).
"""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tasktrain import Callback, DataModule, TaskModule, Trainer

# module hooks the loop may call (Lightning's test hooks every LightningModule method but log/optimizers, plus
# nn.Module's forward, zero_grad and train)
MODULE_HOOKS = [
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_validation_start", "on_validation_end",
    "on_test_start", "on_test_end", "on_predict_start", "on_predict_end", "on_train_batch_start",
    "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start",
    "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end", "on_validation_model_zero_grad",
    "on_validation_model_eval", "on_validation_model_train", "on_test_model_eval", "on_test_model_train",
    "on_predict_model_eval", "on_train_epoch_start", "on_train_epoch_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end", "on_predict_epoch_start",
    "on_predict_epoch_end", "on_before_zero_grad", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "configure_model", "prepare_data", "setup", "teardown", "train_dataloader",
    "val_dataloader", "test_dataloader", "predict_dataloader", "transfer_batch_to_device",
    "on_before_batch_transfer", "on_after_batch_transfer", "on_load_checkpoint", "on_save_checkpoint", "forward",
    "training_step", "validation_step", "test_step", "predict_step", "configure_callbacks", "configure_optimizers",
    "lr_scheduler_step", "manual_backward", "zero_grad", "train", "optimizer_step", "optimizer_zero_grad", "backward",
    "configure_gradient_clipping", "clip_gradients",
]
CALLBACK_HOOKS = [
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end", "on_train_start",
    "on_train_end", "on_validation_start", "on_validation_end", "on_test_start", "on_test_end", "on_predict_start",
    "on_predict_end", "state_dict", "load_state_dict", "on_save_checkpoint", "on_load_checkpoint",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
]
DATAMODULE_HOOKS = ["prepare_data", "setup", "teardown", "train_dataloader", "val_dataloader", "test_dataloader",
                    "predict_dataloader", "state_dict", "load_state_dict"]
# (the transfer hooks are not overridden, as in Lightning's test, whose wrappers its is_overridden looks through:
# the module's run)


class RandomDataset(Dataset):
    def __init__(self, size=32, length=64):
        self.data = torch.randn(length, size, generator=torch.Generator().manual_seed(0))

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return len(self.data)


class Boring(TaskModule):
    """Lightning's BoringModel: a Linear(32, 2), batches of 2 from 64 random vectors, SGD with StepLR."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        return {"loss": self(batch).sum()}

    def validation_step(self, batch, batch_idx):
        return {"x": self(batch).sum()}

    def test_step(self, batch, batch_idx):
        return {"y": self(batch).sum()}

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def test_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def predict_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=2)


def _recording(base, names, prefix):
    """A subclass of `base` overriding each of `names`: it calls the base's and records (name, argument count)."""

    def make(name):
        def hook(self, *args, **kwargs):
            out = getattr(super(cls, self), name)(*args, **kwargs)
            self._called.append((prefix + name, len(args) + len(kwargs)))
            return out

        hook.__name__ = name
        return hook

    cls = type(f"Recording{base.__name__}", (base,), {name: make(name) for name in names})
    return cls


_RecordingModule = _recording(Boring, MODULE_HOOKS, "")


class HookedModel(_RecordingModule):
    def __init__(self, called, automatic=True):
        super().__init__()
        object.__setattr__(self, "_called", called)  # not a submodule, not in hparams
        self.automatic_optimization = automatic

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:
            return super().training_step(batch, batch_idx)
        loss = self(batch).sum()
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step(lambda: self._called.append(("closure", 0)))
        self._called.append(("training_step", 2))
        return {"loss": loss}


    # overridden as Lightning's test does: they do nothing (the mode stays as the evaluation left it) and record
    def on_validation_model_train(self):
        self._called.append(("on_validation_model_train", 0))

    def on_test_model_train(self):
        self._called.append(("on_test_model_train", 0))


class _RecordingCallback(_recording(Callback, CALLBACK_HOOKS, "Callback.")):
    def __init__(self, called):
        self._called = called

    def state_dict(self):
        self._called.append(("Callback.state_dict", 0))
        return {"foo": True}


class HookedDataModule(_recording(DataModule, DATAMODULE_HOOKS, "")):
    def __init__(self, called):
        super().__init__()
        self._called = called

    def train_dataloader(self):
        self._called.append(("train_dataloader", 0))  # (the base's raises, as Lightning's: not called)
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def val_dataloader(self):
        self._called.append(("val_dataloader", 0))  # (the base's raises, as Lightning's: not called)
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def test_dataloader(self):
        self._called.append(("test_dataloader", 0))  # (the base's raises, as Lightning's: not called)
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def predict_dataloader(self):
        self._called.append(("predict_dataloader", 0))  # (the base's raises, as Lightning's: not called)
        return DataLoader(RandomDataset(32, 64), batch_size=2)


# -- Lightning's sequences (written from its test_hooks.py and loops), as (name, argument count) ------------------
def _auto_batches(batches, start=0, last_batch=None):
    out = []
    for i in range(start, batches):
        out += [("on_before_batch_transfer", 2), ("transfer_batch_to_device", 3), ("on_after_batch_transfer", 2),
                ("Callback.on_train_batch_start", 4), ("on_train_batch_start", 2), ("forward", 1),
                ("training_step", 2), ("Callback.on_before_zero_grad", 3), ("on_before_zero_grad", 1),
                ("optimizer_zero_grad", 3), ("Callback.on_before_backward", 3), ("on_before_backward", 1),
                ("backward", 1), ("Callback.on_after_backward", 2), ("on_after_backward", 0),
                ("Callback.on_before_optimizer_step", 3), ("on_before_optimizer_step", 1), ("clip_gradients", 3),
                ("configure_gradient_clipping", 3), ("optimizer_step", 4),
                *([("lr_scheduler_step", 2)] if i == (batches - 1 if last_batch is None else last_batch) else []),
                ("Callback.on_train_batch_end", 5), ("on_train_batch_end", 3)]
    return out


def _manual_batches(batches):
    out = []
    for i in range(batches):
        out += [("on_before_batch_transfer", 2), ("transfer_batch_to_device", 3), ("on_after_batch_transfer", 2),
                ("Callback.on_train_batch_start", 4), ("on_train_batch_start", 2), ("forward", 1),
                ("Callback.on_before_backward", 3), ("on_before_backward", 1), ("backward", 1),
                ("Callback.on_after_backward", 2), ("on_after_backward", 0), ("manual_backward", 1), ("closure", 0),
                ("Callback.on_before_optimizer_step", 3), ("on_before_optimizer_step", 1), ("training_step", 2),
                ("Callback.on_train_batch_end", 5), ("on_train_batch_end", 3)]
    return out


def _eval_epoch(fn, batches):
    out = [(f"Callback.on_{fn}_epoch_start", 2), (f"on_{fn}_epoch_start", 0)]
    for _ in range(batches):
        out += [("on_before_batch_transfer", 2), ("transfer_batch_to_device", 3), ("on_after_batch_transfer", 2),
                (f"Callback.on_{fn}_batch_start", 4), (f"on_{fn}_batch_start", 2), ("forward", 1),
                (f"{fn}_step", 2), (f"Callback.on_{fn}_batch_end", 5), (f"on_{fn}_batch_end", 3)]
    return out + [(f"Callback.on_{fn}_epoch_end", 2), (f"on_{fn}_epoch_end", 0)]


def _validation(batches, model_train=True):
    return [("train", 1), ("on_validation_model_eval", 0), ("Callback.on_validation_start", 2),
            ("on_validation_start", 0), *_eval_epoch("validation", batches), ("Callback.on_validation_end", 2),
            ("on_validation_end", 0), *([("on_validation_model_train", 0)] if model_train else [])]


def _start(stage):
    return [("configure_callbacks", 0), ("prepare_data", 0), ("Callback.setup", 3), ("setup", 1),
            ("configure_model", 0)]


def _end(stage):
    return [("Callback.teardown", 3), ("teardown", 1)]


def _save():
    return [("Callback.state_dict", 0), ("Callback.on_save_checkpoint", 3), ("on_save_checkpoint", 1)]


def _fit_end():
    return [("Callback.on_train_end", 2), ("on_train_end", 0), ("Callback.on_fit_end", 2), ("on_fit_end", 0),
            *_end("fit")]


def _show(called, expected):
    import difflib

    return "\n".join(difflib.unified_diff([f"{n} {a}" for n, a in expected], [f"{n} {a}" for n, a in called],
                                          "expected", "called", lineterm="", n=2))


def _check(called, expected):
    assert called == expected, _show(called, expected)


def _trainer(tmp_path, called=None, **kwargs):
    args = dict(default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False, logger=False)
    args.update(kwargs)
    return Trainer(callbacks=[_RecordingCallback(called)] if called is not None else [], **args)


# -- the runs ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("automatic", [True, False])
@pytest.mark.parametrize("override_model_train", [True, False])
def test_fit(tmp_path, automatic, override_model_train):
    called = []
    model = HookedModel(called, automatic)
    if not override_model_train:
        model.on_validation_model_train = None  # Lightning's way to switch a hook off: the mode is restored instead
    trainer = _trainer(tmp_path, called, max_epochs=1, limit_train_batches=2, limit_val_batches=2)
    trainer.fit(model)
    _check(called, [
        *_start("fit"), ("configure_optimizers", 0), ("Callback.on_fit_start", 2), ("on_fit_start", 0),
        ("zero_grad", 0), ("Callback.on_sanity_check_start", 2), ("val_dataloader", 0),
        *_validation(2, override_model_train), ("Callback.on_sanity_check_end", 2), ("train_dataloader", 0),
        ("Callback.on_train_start", 2), ("on_train_start", 0), ("Callback.on_train_epoch_start", 2),
        ("on_train_epoch_start", 0), *(_auto_batches(2) if automatic else _manual_batches(2)),
        ("zero_grad", 0), ("on_validation_model_zero_grad", 0), *_validation(2, override_model_train),
        ("Callback.on_train_epoch_end", 2), ("on_train_epoch_end", 0), *_save(), *_fit_end()])


def test_fit_without_sanity_check_requests_the_val_loader_at_train_start(tmp_path):
    called = []
    trainer = _trainer(tmp_path, called, max_epochs=1, limit_train_batches=2, limit_val_batches=2,
                       num_sanity_val_steps=0)
    trainer.fit(HookedModel(called))
    # Lightning's fit loop asks for the validation loader before on_train_start when the first epoch validates
    _check(called, [
        *_start("fit"), ("configure_optimizers", 0), ("Callback.on_fit_start", 2), ("on_fit_start", 0),
        ("zero_grad", 0), ("train_dataloader", 0), ("val_dataloader", 0), ("Callback.on_train_start", 2),
        ("on_train_start", 0), ("Callback.on_train_epoch_start", 2), ("on_train_epoch_start", 0), *_auto_batches(2),
        ("zero_grad", 0), ("on_validation_model_zero_grad", 0), *_validation(2),
        ("Callback.on_train_epoch_end", 2), ("on_train_epoch_end", 0), *_save(), *_fit_end()])


def test_fit_without_sanity_check_requests_the_val_loader_at_the_first_validation(tmp_path):
    called = []
    trainer = _trainer(tmp_path, called, max_epochs=2, limit_train_batches=1, limit_val_batches=1,
                       num_sanity_val_steps=0, check_val_every_n_epoch=2)
    trainer.fit(HookedModel(called))
    # (recorded from Lightning 2.6.6 itself: the first epoch does not validate, the loader comes at epoch 1's end)
    shown = {"Callback.on_fit_start", "train_dataloader", "val_dataloader", "Callback.on_train_start",
             "Callback.on_train_epoch_start", "on_validation_model_zero_grad"}
    assert [name for name, _ in called if name in shown] == [
        "Callback.on_fit_start", "train_dataloader", "Callback.on_train_start", "Callback.on_train_epoch_start",
        "Callback.on_train_epoch_start", "on_validation_model_zero_grad", "val_dataloader"]


def _first_checkpoint(tmp_path, **kwargs):
    trainer = _trainer(tmp_path, [], limit_val_batches=0, **kwargs)
    trainer.fit(Boring())
    return trainer.checkpoint_callback.best_model_path


def _load():
    return [("on_load_checkpoint", 1), ("Callback.on_load_checkpoint", 3), ("Callback.load_state_dict", 1)]


def test_fit_no_validation_and_resume_to_more_epochs(tmp_path):
    path = _first_checkpoint(tmp_path, max_epochs=1, limit_train_batches=2)
    called = []
    trainer = _trainer(tmp_path, called, max_epochs=2, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(HookedModel(called), ckpt_path=path)
    _check(called, [
        *_start("fit"), *_load(), ("configure_optimizers", 0), ("Callback.on_fit_start", 2), ("on_fit_start", 0),
        ("zero_grad", 0), ("train_dataloader", 0), ("Callback.on_train_start", 2), ("on_train_start", 0),
        ("Callback.on_train_epoch_start", 2), ("on_train_epoch_start", 0), *_auto_batches(2),
        ("Callback.on_train_epoch_end", 2), ("on_train_epoch_end", 0), *_save(), *_fit_end()])


def test_fit_no_validation_and_resume_mid_epoch_to_more_steps(tmp_path):
    path = _first_checkpoint(tmp_path, max_steps=1)
    called = []
    trainer = _trainer(tmp_path, called, max_steps=3, limit_val_batches=0)
    trainer.fit(HookedModel(called), ckpt_path=path)
    # a mid-epoch resume does not start the epoch again: no on_train_epoch_start; StepLR steps at the epoch's end,
    # which these 3 steps do not reach
    _check(called, [
        *_start("fit"), *_load(), ("configure_optimizers", 0), ("Callback.on_fit_start", 2), ("on_fit_start", 0),
        ("zero_grad", 0), ("train_dataloader", 0), ("Callback.on_train_start", 2), ("on_train_start", 0),
        *_auto_batches(3, start=1, last_batch=31), ("Callback.on_train_epoch_end", 2), ("on_train_epoch_end", 0),
        *_save(), *_fit_end()])


@pytest.mark.parametrize("batches", [0, 2])
@pytest.mark.parametrize("verb,noun,loader", [("validate", "validation", "val"), ("test", "test", "test")])
@pytest.mark.parametrize("override_model_train", [True, False])
def test_validate_and_test(tmp_path, batches, verb, noun, loader, override_model_train):
    called = []
    model = HookedModel(called)
    if not override_model_train:
        setattr(model, f"on_{noun}_model_train", None)
    trainer = _trainer(tmp_path, called, max_epochs=1, limit_val_batches=batches, limit_test_batches=batches)
    getattr(trainer, verb)(model, verbose=False)
    hooks = [(f"{loader}_dataloader", 0), ("train", 1), (f"on_{noun}_model_eval", 0),
             (f"Callback.on_{noun}_start", 2), (f"on_{noun}_start", 0), *_eval_epoch(noun, batches),
             (f"Callback.on_{noun}_end", 2), (f"on_{noun}_end", 0),
             *([(f"on_{noun}_model_train", 0)] if override_model_train else [])]
    _check(called, [*_start(verb), ("zero_grad", 0), *(hooks if batches else []), *_end(verb)])


def test_predict(tmp_path):
    called = []
    trainer = _trainer(tmp_path, called, limit_predict_batches=2)
    trainer.predict(HookedModel(called))
    batches = []
    for _ in range(2):
        batches += [("on_before_batch_transfer", 2), ("transfer_batch_to_device", 3), ("on_after_batch_transfer", 2),
                    ("Callback.on_predict_batch_start", 4), ("on_predict_batch_start", 2), ("forward", 1),
                    ("predict_step", 2), ("Callback.on_predict_batch_end", 5), ("on_predict_batch_end", 3)]
    _check(called, [
        *_start("predict"), ("zero_grad", 0), ("predict_dataloader", 0), ("train", 1), ("on_predict_model_eval", 0),
        ("Callback.on_predict_start", 2), ("on_predict_start", 0), ("Callback.on_predict_epoch_start", 2),
        ("on_predict_epoch_start", 0), *batches, ("Callback.on_predict_epoch_end", 2), ("on_predict_epoch_end", 0),
        ("Callback.on_predict_end", 2), ("on_predict_end", 0), *_end("predict")])


def test_datamodule_hooks(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=2, limit_test_batches=2,
                       limit_predict_batches=2, reload_dataloaders_every_n_epochs=1)
    called = []
    trainer.fit(Boring(), datamodule=HookedDataModule(called))
    # (the DataModule's transfer hooks are not overridden: none of them is called)
    _check(called, [("prepare_data", 0), ("setup", 1), ("val_dataloader", 0), ("train_dataloader", 0),
                    ("state_dict", 0), ("teardown", 1)])
    for verb, loader in (("validate", "val"), ("test", "test"), ("predict", "predict")):
        called = []
        kwargs = {"verbose": False} if verb != "predict" else {}
        getattr(trainer, verb)(Boring(), datamodule=HookedDataModule(called), **kwargs)
        _check(called, [("prepare_data", 0), ("setup", 1), (f"{loader}_dataloader", 0), ("teardown", 1)])


def test_hooks_with_different_argument_names(tmp_path):
    class CustomNames(Boring):
        def check(self, x, batch_nb):
            assert isinstance(x, torch.Tensor) and x.shape == (1, 32) and isinstance(batch_nb, int)

        def training_step(self, x1, batch_nb1):
            self.check(x1, batch_nb1)
            return super().training_step(x1, batch_nb1)

        def validation_step(self, x2, batch_nb2):
            self.check(x2, batch_nb2)
            return super().validation_step(x2, batch_nb2)

        def test_step(self, x3, batch_nb3, dataloader_idx):  # (dataloader_idx keeps its name, as in Lightning)
            self.check(x3, batch_nb3)
            assert isinstance(dataloader_idx, int)
            return super().test_step(x3, batch_nb3)

        def predict_step(self, x4, batch_nb4, dataloader_idx):
            self.check(x4, batch_nb4)
            return super().predict_step(x4, batch_nb4, dataloader_idx)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64))

        def val_dataloader(self):
            return DataLoader(RandomDataset(32, 64))

        def test_dataloader(self):
            return [DataLoader(RandomDataset(32, 64)), DataLoader(RandomDataset(32, 64))]

        def predict_dataloader(self):
            return [DataLoader(RandomDataset(32, 64)), DataLoader(RandomDataset(32, 64))]

    model = CustomNames()
    trainer = Trainer(default_root_dir=str(tmp_path), fast_dev_run=5, enable_progress_bar=False)
    trainer.fit(model)
    assert trainer.global_step == 5
    trainer.test(model, verbose=False)
    predictions = trainer.predict(model)
    assert len(predictions) == 2 and all(len(p) == 5 for p in predictions)


def test_load_from_checkpoint_hook_calls(tmp_path):
    called = []
    trainer = _trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(HookedModel(called))
    path = str(tmp_path / "file.ckpt")
    trainer.save_checkpoint(path)
    called.clear()
    HookedModel.load_from_checkpoint(path, called=called)
    _check(called, [("configure_model", 0), ("on_load_checkpoint", 1)])
