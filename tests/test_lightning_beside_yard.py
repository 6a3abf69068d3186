"""Differences found by the yardstick (Lightning 2.6's own tests/tests_pytorch with imports renamed to tasktrain,
/work/YARD.md), each checked here beside Lightning itself (a test dependency, imported only here) on CPU."""
import os
import sys
import warnings

import pytest
import torch

import tasktrain
from tasktrain.demos.boring_classes import BoringModel


@pytest.fixture(scope="module")
def L():
    import lightning

    return lightning


def caught(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


def test_load_from_checkpoint_of_an_empty_state_dict_warns_as_lightning(L, tmp_path):
    """tests_pytorch/core/test_saving.py::test_load_from_checkpoint_warn_on_empty_state_dict: strict=False and a
    checkpoint whose state dict is empty load, with the missing keys' warning and then "contains no parameters"."""
    path = tmp_path / "empty.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "pytorch-lightning_version": L.__version__}, path)

    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    ours, ours_said = caught(lambda: BoringModel.load_from_checkpoint(path, strict=False))
    theirs, theirs_said = caught(lambda: LitBoringModel.load_from_checkpoint(path, strict=False))
    said = [m.replace(str(tmp_path), "<tmp>") for m in ours_said]
    assert said == [m.replace(str(tmp_path), "<tmp>") for m in theirs_said]
    assert said[-1] == f"The state dict in {path!r} contains no parameters.".replace(str(tmp_path), "<tmp>")
    assert ours.device.type == theirs.device.type == "cpu"


def test_mlflow_logger_warns_of_metric_names_as_lightning(L, tmp_path, monkeypatch):
    """tests_pytorch/loggers/test_mlflow.py::test_mlflow_logger_with_unexpected_characters: a metric name MLflow
    refuses is cleaned with Lightning's RuntimeWarning and words (a filter or pytest.warns on the category holds);
    the logger's store becomes MLflow's process-wide one, as Lightning's (mlflow.set_tracking_uri)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store, for Lightning's logger too
    # Lightning's logger makes its URI MLflow's process-wide one (mlflow.set_tracking_uri, which also sets
    # $MLFLOW_TRACKING_URI): both put back after the test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    import mlflow
    import mlflow.tracking._tracking_service.utils as tracking_utils

    monkeypatch.setattr(tracking_utils, "_tracking_uri", tracking_utils._tracking_uri)
    from lightning.pytorch.loggers import MLFlowLogger as LitMLFlowLogger

    from tasktrain.loggers import MLFlowLogger

    seen = []
    for name, cls in (("ours", MLFlowLogger), ("theirs", LitMLFlowLogger)):
        logger = cls(experiment_name="exp", tracking_uri=f"file:{tmp_path / name}")
        logger.experiment
        # the logger's store is MLflow's process-wide one (mlflow.log_*() in the user's code writes there)
        assert mlflow.get_tracking_uri() == f"file:{tmp_path / name}", name
        if name == "ours":  # $MLFLOW_TRACKING_URI stays the user's: a logger built later defaults as Lightning's
            assert "MLFLOW_TRACKING_URI" not in os.environ
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            logger.log_metrics({"[some_metric]": 10.0}, step=0)
        seen.append([(w.category, str(w.message)) for w in said if w.category is not DeprecationWarning])
    assert seen[0] == seen[1] == [(RuntimeWarning, "MLFlow only allows '_', '/', '.' and ' ' special characters in "
                                                   "metric name. Replacing [some_metric] with some_metric.")]


class FakeWandb:
    """Just enough of the `wandb` module for both loggers' media and artifact calls, recording what they make."""

    def __init__(self):
        import types

        self.module = types.ModuleType("wandb")
        self.module.__version__ = "0.31.0"
        self.module.run = None
        for kind in ("Image", "Audio", "Video"):
            setattr(self.module, kind, self.media(kind))
        calls = self.calls = []

        class Artifact:
            def __init__(self, how, name, artifact_type):
                self.how, self.name, self.artifact_type = how, name, artifact_type

            def download(self, root=None):
                calls.append(("download", self.how, self.name, self.artifact_type, root))
                return f"{root}/{self.name}"

        class Api:
            def artifact(self, name, type=None):
                return Artifact("api", name, type)

        class Run:
            def log(self, metrics):
                calls.append(("log", metrics))

            def use_artifact(self, name, type=None):
                return Artifact("run", name, type)

        self.module.Api, self.Run = Api, Run

    def install(self, monkeypatch):
        """In sys.modules as `wandb`, with the two submodules Lightning's experiment property imports."""
        module_type = type(self.module)
        monkeypatch.setitem(sys.modules, "wandb", self.module)
        sdk_lib = module_type("wandb.sdk.lib")
        sdk_lib.RunDisabled = type("RunDisabled", (), {})
        monkeypatch.setitem(sys.modules, "wandb.sdk", module_type("wandb.sdk"))
        monkeypatch.setitem(sys.modules, "wandb.sdk.lib", sdk_lib)
        wandb_run = module_type("wandb.wandb_run")
        wandb_run.Run = self.Run
        monkeypatch.setitem(sys.modules, "wandb.wandb_run", wandb_run)

    @staticmethod
    def media(kind):
        class Media:
            def __init__(self, data, **kwargs):
                self.seen = (kind, data, kwargs)

            def __eq__(self, other):
                return self.seen == other.seen

        return Media


def test_wandb_logger_media_and_artifacts_as_lightning(L, tmp_path, monkeypatch):
    """tests_pytorch/loggers/test_wandb.py::test_wandb_log_media and ::test_wandb_logger_download_artifact: Lightning's
    WandbLogger.log_image / log_audio / log_video (a list, and per-item keyword lists), download_artifact (a static
    method: through the active run, else wandb.Api) and use_artifact, called alike on a stand-in wandb."""
    from lightning.pytorch.loggers import WandbLogger as LitWandbLogger

    from tasktrain.loggers import WandbLogger

    def run(cls):
        fake = FakeWandb()
        fake.install(monkeypatch)
        logger = cls(experiment=fake.Run())
        logger.log_image("images", ["a.png", "b.png"], step=3, caption=["one", "two"])
        logger.log_audio("audios", ["a.wav"], sample_rate=[16000])
        logger.log_video("videos", ["a.mp4"], step=1, fps=[4], format=["gif"])
        said = []
        for call in (lambda: logger.log_image("images", "a.png"), lambda: logger.log_video("v", [1, 2], fps=[4])):
            with pytest.raises((TypeError, ValueError)) as err:
                call()
            said.append((err.type, str(err.value)))
        paths = [cls.download_artifact("team/proj/model:v1", save_dir=tmp_path, artifact_type="model")]
        fake.module.run = fake.Run()
        paths.append(cls.download_artifact("team/proj/model:v2"))
        paths.append(cls.download_artifact("team/proj/model:v3", use_artifact=False))
        used = logger.use_artifact("team/proj/data:v0", "dataset")
        return fake.calls, said, paths, (used.how, used.name, used.artifact_type)

    ours, theirs = run(WandbLogger), run(LitWandbLogger)
    assert ours == theirs
    assert ours[0][0] == ("log", {"images": [FakeWandb.media("Image")("a.png", caption="one"),
                                             FakeWandb.media("Image")("b.png", caption="two")],
                                  "trainer/global_step": 3})
    assert ours[1] == [(TypeError, 'Expected a list as "images", found <class \'str\'>'),
                       (ValueError, "Expected 2 items but only found 1 for fps")]


def test_wandb_run_is_made_before_the_other_loggers_experiments_as_lightning(L, tmp_path, monkeypatch):
    """tests_pytorch/loggers/test_wandb.py::test_wandb_logger_experiment_called_first: the Trainer creates W&B's run
    before the other loggers' experiments, whatever their order (wandb.init must precede TensorBoard's writers for
    sync_tensorboard=True), as Lightning's; and with sync_tensorboard the x-axis is TensorBoard's global_step."""
    from unittest import mock

    import lightning.pytorch as lp

    import tasktrain.loggers

    def run(lib, loggers, model):
        order = []
        with mock.patch.object(loggers.TensorBoardLogger, "experiment",
                               new_callable=lambda: mock.PropertyMock(side_effect=lambda: order.append("tb") or mock.MagicMock())), \
                mock.patch.object(loggers.WandbLogger, "experiment",
                                  new_callable=lambda: mock.PropertyMock(side_effect=lambda: order.append("wandb") or mock.MagicMock())):
            trainer = lib.Trainer(default_root_dir=tmp_path, limit_train_batches=0, limit_val_batches=0, max_steps=1,
                                  enable_progress_bar=False, enable_model_summary=False,
                                  logger=[loggers.TensorBoardLogger(tmp_path), loggers.WandbLogger(save_dir=tmp_path)])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(model)
        return order[0]

    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    assert run(tasktrain, tasktrain.loggers, BoringModel()) == run(lp, lp.loggers, LitBoringModel()) == "wandb"

    fake = FakeWandb()
    defined = []
    fake.module.init = lambda **kwargs: fake.Run()
    fake.Run.define_metric = lambda self, *args, **kwargs: defined.append((args, kwargs))
    monkeypatch.setitem(sys.modules, "wandb", fake.module)
    tasktrain.loggers.WandbLogger(save_dir=tmp_path, sync_tensorboard=True).experiment
    assert defined == [(("*",), {"step_metric": "global_step"})]
    del fake.Run.define_metric  # a run object without define_metric (test_wandb_pickle's): no x-axis, no error
    assert isinstance(tasktrain.loggers.WandbLogger(save_dir=tmp_path).experiment, fake.Run)


def test_wandb_checkpoint_artifact_metadata_as_lightning(L, tmp_path, monkeypatch):
    """tests_pytorch/loggers/test_wandb.py::test_wandb_log_model: the metadata of an uploaded checkpoint is Lightning's
    (the settings under the callback's class name, by Lightning's attribute names: `_every_n_train_steps`)."""
    import lightning.pytorch as lp

    def run(lib, model, folder):
        fake = FakeWandb()
        made = []

        class Artifact:
            def __init__(self, name, type, metadata):
                made.append((name, type, metadata))

            def add_file(self, *args, **kwargs):
                pass

        fake.module.Artifact = Artifact
        fake.Run.id = "1"
        fake.Run.log_artifact = lambda self, *args, **kwargs: None
        fake.install(monkeypatch)
        logger = lib.loggers.WandbLogger(experiment=fake.Run(), log_model="all")
        trainer = lib.Trainer(default_root_dir=tmp_path / folder, logger=logger, max_epochs=1, limit_train_batches=2,
                              limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False,
                              callbacks=[lib.callbacks.ModelCheckpoint(dirpath=tmp_path / folder)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
        return made

    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    ours, theirs = run(tasktrain, BoringModel(), "ours"), run(lp, LitBoringModel(), "theirs")
    assert ours == theirs
    assert ours[0][2]["ModelCheckpoint"] == {"monitor": None, "mode": "min", "save_last": None, "save_top_k": 1,
                                             "save_weights_only": False, "_every_n_train_steps": 0}


def _subclass_with_kwargs(base):
    class Custom(base):
        def __init__(self, batch_size=64):
            super().__init__()
            self.save_hyperparameters()

    class WithKwargs(Custom):
        def __init__(self, *args, subclass_arg=1200, **kwargs):
            super().__init__(*args, **kwargs)
            self.save_hyperparameters()

    return WithKwargs


def test_load_from_checkpoint_of_a_module_whose_init_takes_kwargs_as_lightning(L, tmp_path):
    """tests_pytorch/models/test_hparams.py::test_collect_init_arguments: a plain save_hyperparameters() records
    hparams_name "kwargs"; an __init__ with `**kwargs` must not take that as the argument the hyper-parameters came from
    (Lightning leaves *args / **kwargs out of the names). Before, tasktrain called cls(kwargs={...}): a TypeError."""
    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    got = {}
    for name, base in (("tasktrain", BoringModel), ("lightning", LitBoringModel)):
        cls = _subclass_with_kwargs(base)
        path = tmp_path / f"{name}.ckpt"
        torch.save({"state_dict": cls(batch_size=179).state_dict(), "hyper_parameters": {"batch_size": 179,
                    "subclass_arg": 1200}, "hparams_name": "kwargs", "pytorch-lightning_version": L.__version__}, path)
        loaded = cls.load_from_checkpoint(path)
        again = cls.load_from_checkpoint(path, batch_size=99)
        got[name] = (dict(sorted(loaded.hparams.items())), again.hparams.batch_size)
    assert got["tasktrain"] == got["lightning"] == ({"batch_size": 179, "subclass_arg": 1200}, 99)


def test_datamodule_load_from_checkpoint_whose_init_takes_kwargs_as_lightning(L, tmp_path):
    """The same rule for DataModule.load_from_checkpoint (Lightning's _load_state serves both)."""
    import lightning.pytorch as lp

    got = {}
    for name, base in (("tasktrain", tasktrain.DataModule), ("lightning", lp.LightningDataModule)):
        class Data(base):
            def __init__(self, size=3, **kwargs):
                super().__init__()
                self.save_hyperparameters()

        path = tmp_path / f"{name}.ckpt"
        torch.save({"state_dict": {}, "datamodule_hyper_parameters": {"size": 5, "extra": 1},
                    "datamodule_hparams_name": "kwargs", "pytorch-lightning_version": L.__version__}, path)
        got[name] = dict(sorted(Data.load_from_checkpoint(path).hparams.items()))
    assert got["tasktrain"] == got["lightning"] == {"extra": 1, "size": 5}


def test_save_hyperparameters_ignore_in_a_subclass_drops_what_the_base_saved_as_lightning(L):
    """tests_pytorch/models/test_hparams.py::test_hparams_ignore_in_subclass_overrides_base: the base class's
    save_hyperparameters(ignore="arg1") and then the subclass's save_hyperparameters(ignore="arg2"): arg1 comes back
    (the subclass did not ignore it) and arg2, which the base saved, goes. Before, tasktrain kept arg2."""
    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    got = {}
    for name, base in (("tasktrain", BoringModel), ("lightning", LitBoringModel)):
        class Base(base):
            def __init__(self, arg1, arg2, arg3):
                super().__init__()
                self.save_hyperparameters(ignore="arg1")

        class Sub(Base):
            def __init__(self, arg1, arg2, arg3):
                super().__init__(arg1=arg1, arg2=arg2, arg3=arg3)
                self.save_hyperparameters(ignore=("arg2", 7))  # (a name that is not a string is left out)

        module = Sub(arg1=14, arg2=90, arg3=50)
        got[name] = (dict(sorted(module.hparams.items())), dict(sorted(module.hparams_initial.items())))
    assert got["tasktrain"] == got["lightning"] == ({"arg1": 14, "arg3": 50},) * 2


def test_save_hyperparameters_of_a_dataclass_module_as_lightning(L):
    """tests_pytorch/models/test_hparams.py::test_dataclass_lightning_module / test_dataclass_with_init_false_fields: a
    dataclass module calling save_hyperparameters() from __post_init__ saves its fields that __init__ takes (not the
    ignored ones, not init=False ones). Before, tasktrain saved nothing (there is no __init__ frame to read)."""
    from dataclasses import dataclass, field

    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    got = {}
    for name, base in (("tasktrain", BoringModel), ("lightning", LitBoringModel)):
        @dataclass(eq=False)
        class Fields(base):
            mandatory: int
            optional: str = "optional"
            ignore_me: bool = False
            derived: int = field(default=999, init=False)

            def __post_init__(self):
                super().__init__()
                self.save_hyperparameters(ignore=("ignore_me",))

        module = Fields(33, optional="cocofruit")
        got[name] = (dict(module.hparams), module.derived)
    assert got["tasktrain"] == got["lightning"] == ({"mandatory": 33, "optional": "cocofruit"}, 999)


def test_a_hyper_parameter_that_cannot_be_pickled_leaves_hparams_when_a_run_starts_as_lightning(L, tmp_path):
    """tests_pytorch/models/test_hparams.py::test_hparams_pickle_warning: a lambda saved by save_hyperparameters()
    leaves module.hparams when fit starts, with Lightning's warning, so the checkpoint does not hold it and
    load_from_checkpoint builds the module with the __init__ default. Before, tasktrain kept it, the checkpoint held its
    repr string, and load_from_checkpoint passed that string to __init__ as the function."""
    import glob

    import lightning.pytorch as lp
    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    got = {}
    for name, lib, base in (("tasktrain", tasktrain, BoringModel), ("lightning", lp, LitBoringModel)):
        class Unpicklable(base):
            def __init__(self, foo="bar", pickle_me=(lambda x: x + 1), ignore=False):
                super().__init__()
                self.save_hyperparameters(ignore=["pickle_me"] if ignore else None)

        said = []
        for ignore in (False, True):
            module = Unpicklable(ignore=ignore)
            trainer = lib.Trainer(default_root_dir=tmp_path / name / str(ignore), max_steps=1, logger=False,
                                  enable_progress_bar=False, enable_model_summary=False)
            _, messages = caught(lambda: trainer.fit(module))
            said += [m for m in messages if "cannot be pickled" in m]
        (path,) = glob.glob(str(tmp_path / name / "False" / "**" / "*.ckpt"), recursive=True)
        loaded = Unpicklable.load_from_checkpoint(path)
        got[name] = (said, sorted(module.hparams), sorted(loaded.hparams), loaded.hparams.pickle_me(1))
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"] == (["Attribute 'pickle_me' removed from hparams because it cannot be pickled. You can "
                                 "suppress this warning by setting `self.save_hyperparameters(ignore=['pickle_me'])`."],
                                ["foo", "ignore"], ["foo", "ignore", "pickle_me"], 2)
