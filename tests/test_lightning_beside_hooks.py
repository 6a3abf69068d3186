"""Lightning 2.6 beside tasktrain (issue 37): what the module's and the callbacks' hooks receive, and the warnings
the loop gives, under Lightning itself and under tasktrain (tiny model, CPU, one process, a few steps). Lightning is
a test dependency, imported inside the tests only."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
             accelerator="cpu", devices=1, max_epochs=1)
FRAMEWORKS = {"lightning": (L.Trainer, L.LightningModule), "tasktrain": (tasktrain.Trainer, tasktrain.TaskModule)}


pytestmark = pytest.mark.usefixtures("quiet_lightning")  # (conftest.py: Lightning's level put back after each test)


def _described(value):
    """A hook argument as plain values: tensors as (value, requires_grad), so the frameworks compare."""
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return (round(float(value), 5), value.requires_grad)
    return value


def _batch_end_outputs(framework, returns, manual=False, accumulate=1):
    Trainer, Module = FRAMEWORKS[framework]
    seen = []

    class Net(Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(2, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            return {"tensor": loss, "dict": {"loss": loss, "double": 2 * loss, "tag": [1]}, "none": None}[returns]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append(_described(outputs))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(**QUIET, limit_train_batches=2, **({} if manual else {"accumulate_grad_batches": accumulate})).fit(
            Net(), DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2))
    return seen


@pytest.mark.parametrize("returns, manual, accumulate", [
    ("dict", False, 2), ("none", False, 1), ("tensor", True, 1), ("dict", True, 1)])
def test_on_train_batch_end_receives_lightnings_outputs(returns, manual, accumulate):
    """Lightning's on_train_batch_end gets a dict: the loss without its graph (divided for accumulation in automatic
    optimisation), the other keys as returned; {} when training_step returned None."""
    theirs = _batch_end_outputs("lightning", returns, manual, accumulate)
    ours = _batch_end_outputs("tasktrain", returns, manual, accumulate)
    assert ours == theirs
    assert all(isinstance(outputs, dict) for outputs in ours) and len(ours) == 2
    if returns != "none":
        assert ours[0]["loss"][1] is False


def test_val_check_interval_attribute_is_lightnings():
    """trainer.val_check_interval reads 1.0 (the epoch's end) when not given and under fast_dev_run, as Lightning's."""
    for kwargs in (dict(), dict(val_check_interval=0.5), dict(val_check_interval=3), dict(fast_dev_run=2),
                   dict(fast_dev_run=True, val_check_interval=0.25)):
        values = [Trainer(logger=False, enable_progress_bar=False, **kwargs).val_check_interval
                  for Trainer, _ in FRAMEWORKS.values()]
        assert values[1] == values[0], kwargs
        assert type(values[1]) is type(values[0])


def _fit_warnings(framework, case):
    """The warnings of one fit (their categories' names and texts) and what on_train_batch_end received."""
    Trainer, Module = FRAMEWORKS[framework]
    seen, calls = [], [0]

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            if case == "eval submodule":
                self.frozen = torch.nn.Dropout().eval()

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append(None if outputs is None else sorted(outputs))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def none_when_even(items):  # a collate_fn that drops every other batch
        calls[0] += 1
        return None if calls[0] % 2 else torch.utils.data.default_collate(items)

    loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2,
                        collate_fn=none_when_even if case == "none batches" else None)
    trainer = Trainer(**QUIET, limit_train_batches=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), loader)
    texts = [(w.category.__name__, str(w.message)) for w in caught if "eval mode" in str(w.message)
             or "yielded None" in str(w.message)]
    return texts, seen, trainer.global_step


@pytest.mark.parametrize("case", ["eval submodule", "none batches", "plain"])
def test_fit_warnings_and_none_batches_match_lightning(case):
    """Lightning warns when a submodule is in eval mode at training start (the loop does not call train()), and
    when the training loader yields None: that batch runs no hook but on_train_batch_end (with None) and no step."""
    theirs, ours = _fit_warnings("lightning", case), _fit_warnings("tasktrain", case)
    assert ours == theirs
    assert len(ours[0]) == (0 if case == "plain" else 1)
    if case == "none batches":
        assert ours[1] == [None, ["loss"], None, ["loss"]] and ours[2] == 2


def test_tuner_skips_under_fast_dev_run_as_lightning():
    from lightning.pytorch.tuner import Tuner as LightningTuner

    from tasktrain.tuner import Tuner

    results = []
    for (Trainer, Module), TunerClass in zip(FRAMEWORKS.values(), (LightningTuner, Tuner)):
        class Net(Module):
            lr, batch_size = 0.1, 2

            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def train_dataloader(self):
                return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=self.batch_size)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.lr)
        tuner = TunerClass(Trainer(logger=False, enable_progress_bar=False, fast_dev_run=True))
        with pytest.warns(UserWarning) as caught:
            results.append((tuner.lr_find(Net()), tuner.scale_batch_size(Net()), Net.lr))
        results.append([str(w.message) for w in caught if "Skipping" in str(w.message)])
    assert results[2:] == results[:2]
    assert results[2] == (None, None, 0.1) and len(results[3]) == 2


def _manual_step_checkpoint(framework, folder, keep_states):
    """Manual optimisation with a step checkpoint: the best file's weights and the warnings about them."""
    Trainer, Module = FRAMEWORKS[framework]
    from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

    from tasktrain.callbacks import ModelCheckpoint

    class Net(Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(2, 1)
            self.automatic_optimization = False
            if keep_states:
                self.saved_models = {}

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            self.log("score", float([3, 1, 2, 4][batch_idx]))
            if keep_states:  # Lightning's documented way to checkpoint the weights the loss was computed with
                self.saved_models[batch_idx] = {k: v.detach().clone() for k, v in self.layer.state_dict().items()}
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    checkpoint = {"lightning": LightningModelCheckpoint, "tasktrain": ModelCheckpoint}[framework](
        dirpath=folder / framework, monitor="score", every_n_train_steps=1, save_weights_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(**{**QUIET, "enable_checkpointing": True}, limit_train_batches=4, callbacks=[checkpoint]).fit(
            Net(), DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=1))
    best = torch.load(checkpoint.best_model_path, weights_only=True)["state_dict"]
    return best, sum("no pre-optimization state was saved" in str(w.message) for w in caught)


@pytest.mark.parametrize("keep_states", [True, False])
def test_manual_optimization_step_checkpoint_matches_lightning(tmp_path, keep_states):
    """A step checkpoint of manual optimisation holds the weights before the step that the module kept in
    saved_models (Lightning's documented remedy), else the weights after it, with Lightning's warning."""
    theirs, ours = (_manual_step_checkpoint(name, tmp_path, keep_states) for name in FRAMEWORKS)
    assert sorted(ours[0]) == sorted(theirs[0])
    for name, value in theirs[0].items():
        torch.testing.assert_close(ours[0][name], value)
    assert ours[1] == theirs[1] and (ours[1] > 0) is not keep_states


@pytest.mark.parametrize("returns", ["str", "dict without loss"])
def test_bad_training_step_return_raises_lightnings_error(returns):
    def run(framework):
        Trainer, Module = FRAMEWORKS[framework]

        class Net(Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                loss = self.layer(batch[0]).sum()
                return "loss" if returns == "str" else {"total": loss}

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        with pytest.raises(Exception) as caught:
            Trainer(**QUIET, limit_train_batches=1).fit(Net(), DataLoader(TensorDataset(torch.ones(2, 2))))
        return type(caught.value).__name__, str(caught.value)

    theirs, ours = run("lightning"), run("tasktrain")
    assert ours[0] == theirs[0] == "MisconfigurationException"
    assert ours[1].startswith(theirs[1].rstrip("."))


@pytest.mark.parametrize("where", ["training_step", "on_validation_end", "test_step"])
def test_a_run_that_raises_calls_on_exception_and_no_teardown_hooks_as_lightning(where):
    """Lightning calls the teardown hooks (callbacks', the module's, the DataModule's) at a run's end only: a run that
    raised gets on_exception, and the loggers' finalize("failed")."""
    seen = {}
    for lib in (tasktrain, L):
        calls = []

        class Rec(lib.Callback):
            def on_exception(self, trainer, module, exception):
                calls.append(("callback", "on_exception", type(exception).__name__))

            def teardown(self, trainer, module, stage):
                calls.append(("callback", "teardown", str(stage)))

        class Module(lib.LightningModule if lib is L else lib.TaskModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def _step(self, batch):
                if where in ("training_step", "test_step") and self.trainer.state.fn in ("fit", "test") \
                        and (where == "training_step") == (self.trainer.state.fn == "fit"):
                    raise ValueError("boom")
                return self.layer(batch[0]).pow(2).mean()

            def training_step(self, batch, batch_idx):
                return self._step(batch)

            def validation_step(self, batch, batch_idx):
                self._step(batch)

            def test_step(self, batch, batch_idx):
                self._step(batch)

            def on_validation_end(self):
                if where == "on_validation_end":
                    raise ValueError("boom")

            def on_exception(self, exception):
                calls.append(("module", "on_exception", type(exception).__name__))

            def teardown(self, stage):
                calls.append(("module", "teardown", str(stage)))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        class Data(lib.LightningDataModule if lib is L else lib.DataModule):
            def _loader(self):
                return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)

            train_dataloader = val_dataloader = test_dataloader = _loader

            def on_exception(self, exception):
                calls.append(("datamodule", "on_exception", type(exception).__name__))

            def teardown(self, stage):
                calls.append(("datamodule", "teardown", str(stage)))

        trainer = lib.Trainer(**{**QUIET, "max_epochs": 1, "num_sanity_val_steps": 0}, callbacks=[Rec()])
        # the strategy's hook (Lightning's Strategy.on_exception), last
        trainer.strategy.on_exception = lambda exc: calls.append(("strategy", "on_exception", type(exc).__name__))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match="boom"):
                if where == "test_step":
                    trainer.test(Module(), datamodule=Data(), verbose=False)
                else:
                    trainer.fit(Module(), datamodule=Data())
        seen[lib.__name__] = calls
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert not any(event == "teardown" for _, event, _ in seen["tasktrain"])
    assert seen["tasktrain"][-1] == ("strategy", "on_exception", "ValueError")


def test_load_from_checkpoint_on_load_checkpoint_sees_hyper_parameters_as_lightning(tmp_path):
    """Lightning's test_load_from_checkpoint_hook_calls: load_from_checkpoint calls configure_model, then
    on_load_checkpoint with the saved checkpoint plus "hyper_parameters" (empty where the module saved none, holding
    the arguments given to load_from_checkpoint); a DataModule's load_from_checkpoint calls load_state_dict with what
    its state_dict saved. Both files are written by a fit of each framework."""
    seen = {}
    for lib in (tasktrain, L):
        calls = []

        class Module(lib.LightningModule if lib is L else lib.TaskModule):
            def __init__(self, width=2, tag="fit"):
                super().__init__()
                self.layer = torch.nn.Linear(width, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            def configure_model(self):
                calls.append(("configure_model",))

            def on_load_checkpoint(self, checkpoint):
                calls.append(("on_load_checkpoint", checkpoint.get("hyper_parameters"),
                              "state_dict" in checkpoint, Data.__qualname__ in checkpoint))

        class Data(lib.LightningDataModule if lib is L else lib.DataModule):
            def train_dataloader(self):
                return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)

            def state_dict(self):
                return {"foo": "bar"}

            def load_state_dict(self, state):
                calls.append(("load_state_dict", state))

        trainer = lib.Trainer(**{**QUIET, "limit_train_batches": 1})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(), datamodule=Data())
            path = str(tmp_path / f"{lib.__name__}.ckpt")
            trainer.save_checkpoint(path)
            calls.clear()
            Module.load_from_checkpoint(path)
            Module.load_from_checkpoint(path, tag="loaded")
            Data.load_from_checkpoint(path)
        seen[lib.__name__] = calls
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert ("on_load_checkpoint", {"tag": "loaded"}, True, True) in seen["tasktrain"]


def test_evaluation_loaders_without_a_batch_skip_the_loop_as_lightning():
    """Lightning's evaluation and prediction loops skip (no hook, validate/test return [], predict None) when their
    loaders' batch counts sum to 0: an empty list, tuple or dict of loaders (val_dataloader() returning [], Lightning's
    test_rich_progress_bar_empty_val_dataloader_model) or zero-length loaders; the fit trains on, and the sanity check's
    own hooks still run. tasktrain refused an empty list and ran the hooks for zero-length loaders."""
    seen = {}
    for lib in (tasktrain, L):
        calls = []
        Trainer, Module = FRAMEWORKS["lightning" if lib is L else "tasktrain"]

        class Net(Module):
            def __init__(self, val=None):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)
                self.val = val

            def training_step(self, batch, batch_idx):
                calls.append("training_step")
                return self.layer(batch[0]).sum()

            def validation_step(self, batch, batch_idx):
                calls.append("validation_step")

            test_step = predict_step = validation_step

            def val_dataloader(self):
                return self.val

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        class Rec(lib.Callback):
            pass

        for hook in ("on_sanity_check_start", "on_validation_start", "on_validation_epoch_end", "on_test_start",
                     "on_predict_start", "on_predict_epoch_end"):
            setattr(Rec, hook, lambda self, *args, _name=hook: calls.append(_name))
        empty = DataLoader(TensorDataset(torch.ones(0, 2)), batch_size=2)
        train = DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)
        results = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for val in ([], {}, empty):
                trainer = Trainer(**{**QUIET, "limit_train_batches": 1, "num_sanity_val_steps": 2}, callbacks=[Rec()])
                trainer.fit(Net(val), train)
                results.append(("fit", list(trainer.num_val_batches), trainer.global_step))
            trainer = Trainer(**QUIET, callbacks=[Rec()])
            for data in ([], (), {}, empty):
                results.append(("validate", trainer.validate(Net(), data, verbose=False)))
                results.append(("test", trainer.test(Net(), data, verbose=False)))
                results.append(("predict", trainer.predict(Net(), data)))
        seen[lib.__name__] = (calls, results)
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert seen["tasktrain"][0].count("training_step") == 3 and "validation_step" not in seen["tasktrain"][0]


def test_datamodule_hooks_are_profiled_as_lightnings(tmp_path):
    """profiler="simple" records each DataModule hook the run calls once, as Lightning's "[LightningDataModule]<class>.
    <hook>": prepare_data, setup, state_dict (the checkpoint), teardown; and
    load_state_dict on a resume."""
    seen = {}
    for lib in (tasktrain, L):
        import importlib

        classes = importlib.import_module(f"{lib.__name__}.demos.boring_classes")

        class Data(classes.BoringDataModule):
            def state_dict(self):
                return {"temp": 1}

            def prepare_data(self):
                pass

        def trainer():
            return lib.Trainer(default_root_dir=tmp_path / lib.__name__, max_steps=1, limit_val_batches=0,
                               profiler="simple", enable_model_summary=False, enable_progress_bar=False, logger=False)

        runs = []
        first = trainer()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first.fit(classes.BoringModel(), datamodule=Data())
            second = trainer()
            second.fit(classes.BoringModel(), datamodule=Data(), ckpt_path=first.checkpoint_callback.best_model_path)
        for run in (first, second):
            runs.append(sorted((name, len(durations))
                               for name, durations in run.profiler.recorded_durations.items()
                               if "DataModule]" in name))
        seen[lib.__name__] = runs
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert [name.split(".")[-1] for name, _ in seen["tasktrain"][0]] == ["prepare_data", "setup", "state_dict",
                                                                         "teardown", "train_dataloader"]
    # (the resumed fit is already at max_steps: it saves nothing)
    assert [name.split(".")[-1] for name, _ in seen["tasktrain"][1]] == ["load_state_dict", "prepare_data", "setup",
                                                                         "teardown", "train_dataloader"]


def test_every_entry_point_restores_the_datamodule_state_as_lightning(tmp_path):
    """fit / validate / test / predict with ckpt_path: the DataModule's load_state_dict gets the state it saved
    (Lightning restores it at every entry point; tasktrain did at fit only)."""
    import importlib

    seen = {}
    for lib in (tasktrain, L):
        classes = importlib.import_module(f"{lib.__name__}.demos.boring_classes")

        class Data(classes.BoringDataModule):
            def state_dict(self):
                return {"my": "state_dict"}

            def load_state_dict(self, state_dict):
                self.restored = state_dict

        def trainer():
            return lib.Trainer(default_root_dir=tmp_path / lib.__name__, max_epochs=2, limit_train_batches=2,
                               limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1,
                               enable_model_summary=False, enable_progress_bar=False, logger=False)

        first = lib.Trainer(default_root_dir=tmp_path / lib.__name__, max_epochs=1, limit_train_batches=2,
                            limit_val_batches=1, enable_model_summary=False, enable_progress_bar=False, logger=False)
        restored = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first.fit(classes.BoringModel(), datamodule=Data())
            for fn in ("fit", "validate", "test", "predict"):
                data = Data()
                getattr(trainer(), fn)(classes.BoringModel(), datamodule=data,
                                       ckpt_path=first.checkpoint_callback.best_model_path)
                restored[fn] = getattr(data, "restored", None)
        seen[lib.__name__] = restored
    assert seen["tasktrain"] == seen["lightning.pytorch"] == {fn: {"my": "state_dict"} for fn in
                                                              ("fit", "validate", "test", "predict")}


def test_datamodule_loader_hooks_and_from_datasets_as_lightning():
    """A DataModule's loader hook it does not define raises Lightning's MisconfigurationException when called (it
    returned None); from_datasets' loaders (batch size, sampler, workers, pin_memory; lists and dicts) are Lightning's;
    a fit over a DataModule without val_dataloader still trains without validation."""
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter([torch.zeros(2)] * 4)

    def described(loader):
        if isinstance(loader, (list, tuple)):
            return [described(one) for one in loader]
        if isinstance(loader, dict):
            return {key: described(one) for key, one in loader.items()}
        return loader.batch_size, type(loader.sampler).__name__, loader.num_workers, loader.pin_memory

    seen = {}
    for lib, base in ((tasktrain, tasktrain.DataModule), (L, L.LightningDataModule)):
        out = []
        for dataset in (TensorDataset(torch.zeros(8, 2)), Stream()):
            dm = base.from_datasets(dataset, [dataset, dataset], {"a": dataset}, dataset, batch_size=4)
            out.append([described(getattr(dm, f"{s}_dataloader")()) for s in ("train", "val", "test", "predict")])
        for hook in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
            with pytest.raises(Exception) as missing:
                getattr(base.from_datasets(), hook)()
            out.append((type(missing.value).__name__, str(missing.value).split(" to be used")[0]))

        class TrainOnly(base):
            def train_dataloader(self):
                return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)

        class Net(lib.LightningModule if lib is L else lib.TaskModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = lib.Trainer(**{**QUIET, "max_epochs": 1})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Net(), datamodule=TrainOnly())
        out.append((trainer.global_step, trainer.num_val_batches))
        # the module's own loader hooks: the base's raise the same error when called; a fit given a loader while
        # the module defines none trains (the Trainer never calls a hook the module does not define)
        for hook in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
            with pytest.raises(Exception) as missing:
                getattr(Net(), hook)()
            out.append((type(missing.value).__name__, str(missing.value).split(" to be used")[0]))
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 1})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
        out.append((trainer.global_step, trainer.num_val_batches))
        seen[lib.__name__] = out
    assert seen["tasktrain"] == seen["lightning.pytorch"]
    assert seen["tasktrain"][2] == ("MisconfigurationException", "`train_dataloader` must be implemented")
    assert seen["tasktrain"][-5] == ("MisconfigurationException", "`train_dataloader` must be implemented")


@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
@pytest.mark.parametrize("case", ["one loader, idx required", "several, no idx", "several, hook without idx",
                                  "one loader, idx default", "several, *args"])
def test_dataloader_idx_in_the_signature_is_checked_as_lightning(stage, case):
    """Lightning checks, when an evaluation or predict run starts, that the step and the module's batch hooks take
    dataloader_idx when several loaders are read in turn, and do not require it with one: its RuntimeError, before
    any hook. tasktrain failed with a TypeError mid-run (or ran)."""
    import lightning.pytorch as L

    prefix = {"fit": "validation", "validate": "validation", "test": "test", "predict": "predict"}[stage]

    def run(lib, base):
        calls = []

        class Net(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            def on_validation_start(self):
                calls.append("on_validation_start")

        def step_required(self, batch, batch_idx, dataloader_idx):
            calls.append(dataloader_idx)

        def step_default(self, batch, batch_idx, dataloader_idx=0):
            calls.append(dataloader_idx)

        def step_plain(self, batch, batch_idx):
            calls.append("step")

        def step_args(self, batch, batch_idx, *args):
            calls.append(args)

        def hook_plain(self, batch, batch_idx):
            calls.append("hook")

        step = {"one loader, idx required": step_required, "several, no idx": step_plain,
                "several, hook without idx": step_default, "one loader, idx default": step_default,
                "several, *args": step_args}[case]
        setattr(Net, f"{prefix}_step", step)
        if case == "several, hook without idx":
            setattr(Net, f"on_{prefix}_batch_start", hook_plain)
        one = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
        loaders = one if case.startswith("one") else [one, DataLoader(TensorDataset(torch.randn(2, 2)), batch_size=2)]
        trainer = lib.Trainer(**{**QUIET, "max_epochs": 1, "num_sanity_val_steps": 0})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if stage == "fit":
                    trainer.fit(Net(), one, loaders)
                else:
                    getattr(trainer, stage)(Net(), loaders, **({} if stage == "predict" else {"verbose": False}))
        except Exception as err:
            return type(err).__name__, str(err), calls
        return "ran", calls

    ours, theirs = run(tasktrain, tasktrain.TaskModule), run(L, L.LightningModule)
    assert ours == theirs
    assert (ours[0] == "RuntimeError") == (case in ("one loader, idx required", "several, no idx",
                                                    "several, hook without idx"))
