"""Loggers as Lightning 2.6 accepts them (issue 37), beside Lightning itself: any object with Lightning's Logger
methods is a logger (a class of the user's with no base class, a Mock), given as `logger=` or in a list, returned by
`trainer.logger` / `trainer.loggers`, and called where Lightning calls it, on every rank (Lightning's own loggers
guard themselves with rank_zero_only; tasktrain's do the same). The same logger class runs under Lightning and under
tasktrain and the calls each received are compared exactly: method names, hyper-parameter and metric keys, steps,
statuses, the checkpoint folder, and on two processes the rank of each call. Lightning is a test dependency, imported
inside the tests only."""
import os
from unittest.mock import Mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv


class CallLog:
    """A logger of the user's own, with Lightning's Logger interface and no base class: it records every call."""

    group_separator = "/"

    def __init__(self, save_dir):
        self.save_dir = str(save_dir)
        self.name, self.version = "calls", 0
        self.calls, self.experiment_reads = [], 0

    @property
    def experiment(self):
        self.experiment_reads += 1
        return self

    def log_hyperparams(self, params, *args, **kwargs):
        self.calls.append(["log_hyperparams", sorted([key, value] for key, value in params.items())])

    def log_graph(self, model, input_array=None):
        self.calls.append(["log_graph"])

    def log_metrics(self, metrics, step=None):
        self.calls.append(["log_metrics", step, sorted(metrics)])

    def save(self):
        self.calls.append(["save"])

    def finalize(self, status):
        self.calls.append(["finalize", status])

    def after_save_checkpoint(self, checkpoint_callback):
        # the folder ModelCheckpoint chose from this logger (save_dir/name/version_0/checkpoints, Lightning's rule)
        self.calls.append(["after_save_checkpoint", os.path.relpath(checkpoint_callback.dirpath, self.save_dir)])


def module_class(base, fail_at=None):
    class Net(base):
        def __init__(self, lr=0.1):
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == fail_at:
                raise RuntimeError("boom")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y), on_step=True)

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Net


def loader(n=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


def run_both(tmp_path, make_logger, **kwargs):
    """The same runs under both: fit (2 epochs, a checkpoint each), validate, test, predict, then a fit that fails."""
    out = {}
    for name, pkg, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        logger = make_logger(tmp_path / name)
        trainer = pkg.Trainer(default_root_dir=str(tmp_path / name), logger=logger, max_epochs=2, limit_val_batches=2,
                              log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False, **kwargs)
        assert trainer.logger is logger and trainer.loggers == [logger]
        module = module_class(base)()
        trainer.fit(module, loader(), loader(4))
        assert module.logger is logger
        trainer.validate(module, loader(4))
        trainer.test(module, loader(4))
        trainer.predict(module, loader(4))
        failing = pkg.Trainer(default_root_dir=str(tmp_path / name), logger=[logger], max_epochs=1,
                              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        with pytest.raises(RuntimeError, match="boom"):
            failing.fit(module_class(base, fail_at=1)(), loader())
        out[name] = (logger, trainer)
    return out


def test_a_logger_of_the_users_own_gets_lightnings_calls(tmp_path):
    out = run_both(tmp_path, CallLog)
    (lit, lit_trainer), (ours, our_trainer) = out["lightning"], out["tasktrain"]
    assert ours.calls == lit.calls
    # what the sequence holds (so that two empty lists cannot pass): hyper-parameters then graph and save at each run's
    # start, metrics each followed by save, a checkpoint per epoch in the logger's folder, the run's status at its end
    assert ours.calls[:3] == [["log_hyperparams", [["lr", 0.1]]], ["log_graph"], ["save"]]
    assert ["log_metrics", 1, ["epoch", "loss_step"]] in ours.calls
    assert ["after_save_checkpoint", os.path.join("calls", "version_0", "checkpoints")] in ours.calls
    assert [c for c in ours.calls if c[0] == "finalize"] == [["finalize", "success"]] * 4 + [["finalize", "failed"]]
    assert ["log_metrics", 1, ["test_loss_step"]] in ours.calls
    assert ours.experiment_reads >= 1 and lit.experiment_reads >= 1  # created before the setup hooks, as there
    assert our_trainer.log_dir == ours.save_dir == lit_trainer.log_dir.replace("lightning", "tasktrain")


def test_a_mock_logger_and_a_list_with_tasktrains_own(tmp_path):
    calls = {}
    for name, pkg, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        mock, csv = Mock(), pkg.loggers.CSVLogger(str(tmp_path / name))
        trainer = pkg.Trainer(default_root_dir=str(tmp_path / name), logger=[mock, csv], max_epochs=1,
                              log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
                              enable_checkpointing=False)
        assert trainer.loggers == [mock, csv] and trainer.logger is mock
        trainer.fit(module_class(base)(), loader())
        calls[name] = [(c[0], sorted(c[2].get("metrics", {})), c[2].get("step")) for c in mock.method_calls]
        with open(os.path.join(csv.log_dir, "metrics.csv")) as f:
            calls[name + " csv"] = f.readline().strip()
        trainer.logger = None  # Lightning's setter: no logger
        assert trainer.loggers == [] and trainer.logger is None
    assert calls["tasktrain"] == calls["lightning"] and len(calls["tasktrain"]) > 4
    assert calls["tasktrain csv"] == calls["lightning csv"] == "epoch,loss_epoch,loss_step,step"


def test_a_value_that_is_not_a_logger_is_refused_before_training():
    with pytest.raises(TypeError, match=r"logger=3: not a logger, it has no log_metrics, log_hyperparams"):
        tasktrain.Trainer(logger=3)
    with pytest.raises(TypeError, match=r"logger=\[\.\.\., 'tb', \.\.\.\]: not a logger"):
        tasktrain.Trainer(logger=[Mock(), "tb"])

    class NoCheckpoints:  # Lightning's methods but after_save_checkpoint: fine without a ModelCheckpoint
        log_metrics = log_hyperparams = log_graph = save = finalize = staticmethod(lambda *a, **k: None)

    assert tasktrain.Trainer(logger=NoCheckpoints(), enable_checkpointing=False).loggers[0].__class__ is NoCheckpoints
    with pytest.raises(TypeError, match="it has no after_save_checkpoint"):
        tasktrain.Trainer(logger=NoCheckpoints())  # a ModelCheckpoint would call it


# The 2-process test (ddp_scripts/loggers_beside_lightning.py: a user's logger's calls on every rank) is in
# tests/test_lightning_beside_ddp_order.py: it reads that file's one launch, shared with two other scripts.


def test_the_hyperparameters_logged_are_those_saved_as_lightning_logs_them(tmp_path):
    """Lightning logs hparams_initial: a change to self.hparams after save_hyperparameters() is not what the loggers
    get (the module's merged with a DataModule's)."""
    logged = {}
    for name, pkg, base, data_base in (("lightning", L, L.LightningModule, L.LightningDataModule),
                                       ("tasktrain", tasktrain, tasktrain.TaskModule, tasktrain.DataModule)):
        class Data(data_base):
            def __init__(self, batch_size=2):
                super().__init__()
                self.save_hyperparameters()

            def train_dataloader(self):
                return loader()

        module, data = module_class(base)(lr=0.5), Data()
        module.hparams.lr = 0.25  # after the save: hparams holds it, hparams_initial does not
        assert module.hparams_initial == {"lr": 0.5}
        logger = CallLog(tmp_path / name)
        pkg.Trainer(default_root_dir=str(tmp_path / name), logger=logger, max_steps=1, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False).fit(module, datamodule=data)
        logged[name] = [c for c in logger.calls if c[0] == "log_hyperparams"]
    assert logged["tasktrain"] == logged["lightning"] == [["log_hyperparams", [["batch_size", 2], ["lr", 0.5]]]]


def test_trainer_log_dir_is_lightnings_for_each_kind_of_logger(tmp_path):
    """trainer.log_dir: a TensorBoardLogger's / CSVLogger's log_dir, any other logger's save_dir (even one of the
    Logger base class that has a log_dir of its own, and None where it has no folder), default_root_dir without."""
    seen = {}
    for name, pkg in (("lightning", L), ("tasktrain", tasktrain)):
        class Folders(pkg.loggers.Logger):
            name, version, experiment = "folders", 0, None

            def __init__(self, save_dir):
                super().__init__()
                self._save = save_dir

            @property
            def save_dir(self):
                return self._save

            @property
            def log_dir(self):
                return os.path.join(str(self._save), "own_log_dir")

            def log_hyperparams(self, *args, **kwargs):
                pass

            def log_metrics(self, *args, **kwargs):
                pass

        root = str(tmp_path / name)
        dirs = []
        for logger in (Folders(os.path.join(root, "s")), Folders(None), pkg.loggers.CSVLogger(root),
                       pkg.loggers.TensorBoardLogger(root), False):
            trainer = pkg.Trainer(default_root_dir=root, logger=logger)
            dirs.append(trainer.log_dir if trainer.log_dir is None else os.path.relpath(trainer.log_dir, root))
        seen[name] = dirs
    assert seen["tasktrain"] == seen["lightning"] == ["s", None, os.path.join("lightning_logs", "version_0"),
                                                      os.path.join("lightning_logs", "version_0"), "."]


@pytest.mark.parametrize("kind", ["CSVLogger", "TensorBoardLogger"])
def test_a_remote_save_dir_is_written_through_fsspec_as_lightnings(kind, tmp_path, monkeypatch):
    """Lightning writes a "memory://" / "s3://" save_dir through fsspec: so do tasktrain's file loggers (the same
    files, versions counted there, the CSV's rows, nothing written locally). A "file://" URL is the local folder in
    both. Without fsspec the error names it."""
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    fs = fsspec.filesystem("memory")
    found = {}
    for name, root in (("lightning", L), ("tasktrain", tasktrain)):
        url = f"memory://beside_remote_{name}_{os.getpid()}"
        for _ in range(2):  # the second logger takes version_1
            logger = getattr(root.loggers, kind)(save_dir=url)
            logger.log_hyperparams({"lr": 0.1})
            logger.log_metrics({"loss": 0.5}, step=0)
            logger.log_metrics({"loss": 0.25, "acc": 1.0}, step=1)
            logger.save()
            logger.finalize("success")
        folder = url.split("://")[1]
        names = sorted(os.path.relpath(p, "/" + folder) if p.startswith("/") else os.path.relpath(p, folder)
                       for p in fs.find(folder))
        names = [n if "tfevents" not in n else n.split("events")[0] + "events" for n in names]
        csv_text = [fs.cat(p).decode() for p in fs.find(folder) if p.endswith(".csv")]
        found[name] = (names, csv_text, logger.version)
        fs.rm("/" + folder, recursive=True)
    assert found["tasktrain"] == found["lightning"]
    names, csv_text, version = found["tasktrain"]
    assert version == 1 and "lightning_logs/version_1/hparams.yaml" in names
    assert os.listdir(tmp_path) == []  # nothing written locally
    ours = getattr(tasktrain.loggers, kind)(save_dir=f"file://{tmp_path}/local")
    theirs_dir = getattr(L.loggers, kind)(save_dir=f"file://{tmp_path}/local").log_dir  # (before ours writes)
    ours.log_metrics({"loss": 0.1}, step=0)
    ours.save()
    assert os.listdir(tmp_path / "local" / "lightning_logs" / "version_0")
    assert os.path.realpath(ours.log_dir) == os.path.realpath(theirs_dir.replace("file://", ""))
    monkeypatch.setitem(__import__("sys").modules, "fsspec", None)  # as without the package
    with pytest.raises(ImportError, match="memory://x.*fsspec"):
        getattr(tasktrain.loggers, kind)(save_dir="memory://x")


def test_loggers_receive_python_numbers_as_in_lightning(tmp_path):
    """Lightning hands a logger each tensor's `.item()` and any other value as it was given (a callback's counts stay
    ints), with "epoch" the int current_epoch: metrics.csv shows `epoch` 0 and ThroughputMonitor's `train/batches` 1,
    not 0.0 / 1.0. The value types each call received and the CSV file's counting columns are compared."""
    import csv
    import importlib

    kept = {"epoch", "step", "count", "plain", "train/batches", "train/samples", "validate/batches", "validate/samples"}
    seen = {}
    for name, pkg, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        loggers, callbacks = (importlib.import_module(f"{pkg.__name__}.{sub}") for sub in ("loggers", "callbacks"))

        class Types(CallLog):
            def log_metrics(self, metrics, step=None):
                self.calls.append([step, sorted((k, type(v).__name__) for k, v in metrics.items())])

        class Net(module_class(base)):
            def training_step(self, batch, batch_idx):
                self.log("count", torch.tensor(3))  # an int tensor: Lightning's self.log makes it a float
                self.log("plain", 2)
                return super().training_step(batch, batch_idx)

        types, csv_logger = Types(tmp_path / name), loggers.CSVLogger(str(tmp_path / name))
        monitor = callbacks.ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0], window_size=2)
        trainer = pkg.Trainer(default_root_dir=str(tmp_path / name), logger=[types, csv_logger], callbacks=[monitor],
                              max_steps=3, log_every_n_steps=1, val_check_interval=2, limit_val_batches=1,
                              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(Net(), loader(), loader(4))
        with open(os.path.join(csv_logger.log_dir, "metrics.csv")) as f:
            rows = [{k: v for k, v in row.items() if k in kept and v} for row in csv.DictReader(f)]
        seen[name] = (types.calls, rows)
    assert seen["tasktrain"] == seen["lightning"]
    calls, rows = seen["tasktrain"]
    assert [0, [("count", "float"), ("epoch", "int"), ("loss_step", "float"), ("plain", "float")]] in calls
    assert {"epoch": "0", "step": "0", "train/batches": "1", "train/samples": "2"} in rows


def test_csv_loggers_experiment_writer_and_steps_without_a_number_as_lightning(tmp_path):
    """CSVLogger.experiment is an ExperimentWriter (Lightning's public class, in csv_logs), with its attributes and
    log_hparams; a log_metrics with no step numbers the row by its place among the rows not saved yet, so it restarts
    at 0 after each flush (Lightning's rule): the files written by the same calls are equal under both."""
    from lightning.pytorch.loggers import CSVLogger as LightningCSV
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter as LightningWriter

    from tasktrain.loggers import CSVLogger
    from tasktrain.loggers.csv_logs import ExperimentWriter

    written = []
    for logger_class, writer_class, root in ((LightningCSV, LightningWriter, tmp_path / "pl"),
                                             (CSVLogger, ExperimentWriter, tmp_path / "tt")):
        assert (writer_class.NAME_METRICS_FILE, writer_class.NAME_HPARAMS_FILE) == ("metrics.csv", "hparams.yaml")
        logger = logger_class(root, name="", prefix="p", flush_logs_every_n_steps=2)
        writer = logger.experiment
        assert type(writer) is writer_class and writer.log_dir == logger.log_dir
        for value in range(5):
            logger.log_metrics({"a": torch.tensor(float(value))} if value % 2 else {"a": value, "b": 1.0})
        unsaved = [dict(row) for row in writer.metrics]  # the rows after the last flush, not on disk yet
        writer.log_hparams({"lr": 0.1})
        logger.log_metrics({"c": 3.0}, step=9)
        logger.finalize("success")
        with open(writer.metrics_file_path) as f:
            csv_text = f.read()
        with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
            written.append((unsaved, writer.metrics_keys, csv_text, f.read()))
    steps = [line.rsplit(",", 1)[1] for line in written[0][2].splitlines()[1:]]
    assert steps == ["0", "1", "0", "1", "0", "9"]  # (Lightning restarts its numbering after each flush)
    assert written[1] == written[0]


@pytest.mark.parametrize(("name", "module"), [("LitLogger", "litlogger")])
def test_lightnings_loggers_tasktrain_lacks_import_and_are_refused_when_created(name, module, tmp_path):
    """The import lines of a Lightning script hold under the rename (both of Lightning's paths), and creating the
    logger is a clear error naming what to use, before any Trainer exists."""
    import importlib

    lightning_class = getattr(importlib.import_module(f"lightning.pytorch.loggers.{module}"), name)
    assert lightning_class is getattr(L.loggers, name)  # (the two paths Lightning offers)
    ours = getattr(importlib.import_module(f"tasktrain.loggers.{module}"), name)
    assert ours is getattr(tasktrain.loggers, name) and issubclass(ours, tasktrain.loggers.Logger)
    with pytest.raises(NotImplementedError, match=f"{name}: tasktrain has no .*WandbLogger.*Writing a logger"):
        ours(save_dir=str(tmp_path))


def test_the_loggers_folders_exist_before_the_setup_hooks_as_in_lightning(tmp_path):
    """Lightning makes each logger's experiment before the setup hooks, so the version folder is there when a
    callback's setup writes a file into trainer.log_dir (as a CLI saves its config), and the CSV writer then does not
    warn that the folder is used: the same callbacks under both frameworks see and say the same."""
    import warnings

    def run(lib, base, root):
        seen = []

        class WritesInSetup(lib.Callback):
            def setup(self, trainer, module, stage):
                seen.append((stage, [os.path.isdir(logger.log_dir) for logger in trainer.loggers]))
                if stage == "fit":
                    with open(os.path.join(trainer.log_dir, "config.yaml"), "w") as f:
                        f.write("seed: 0\n")

        class Net(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                self.log("loss", self.layer(batch[0]).sum())
                return self.layer(batch[0]).sum()

            def test_step(self, batch, batch_idx):
                self.log("t", self.layer(batch[0]).sum())

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        loggers = [lib.loggers.CSVLogger(root, name="csv"), lib.loggers.TensorBoardLogger(root, name="tb")]
        trainer = lib.Trainer(default_root_dir=root, max_epochs=1, logger=loggers, callbacks=[WritesInSetup()],
                              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                              log_every_n_steps=1)
        data = DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=1)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer.fit(Net(), data)
            trainer.test(trainer.lightning_module, data, verbose=False)
        used = [str(w.message).replace(str(root), "") for w in said if "exists and is not empty" in str(w.message)]
        return seen, used, sorted(os.listdir(loggers[0].log_dir))

    ours = run(tasktrain, tasktrain.TaskModule, tmp_path / "tt")
    assert ours == run(L, L.LightningModule, tmp_path / "pl")
    assert ours[0] == [("fit", [True, True]), ("test", [True, True])] and ours[1] == []


def test_csv_writers_log_dir_check_is_lightnings_method(tmp_path, monkeypatch):
    """The writer's check of an already used folder is a method of Lightning's name (fabric's
    _ExperimentWriter._check_log_dir_exists, which Lightning's tests patch to make a second logger append): called,
    it warns and removes the old metrics.csv; patched away, a second logger of the same version appends to the first's
    file. The files are Lightning's either way."""
    import warnings

    from lightning.fabric.loggers.csv_logs import _ExperimentWriter as FabricWriter
    from lightning.pytorch.loggers import CSVLogger as LightningCSV

    from tasktrain.loggers import CSVLogger
    from tasktrain.loggers.csv_logs import ExperimentWriter

    def two_loggers(logger_class, root):
        for values in ({"a": 1, "b": 2}, {"a": 100, "b": 200}):
            logger = logger_class(root, name="test", version=0, flush_logs_every_n_steps=1)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                logger.log_metrics(values)
        with open(logger.experiment.metrics_file_path) as f:
            return f.read(), ["not empty" in str(w.message) for w in said]

    checked = [two_loggers(cls, tmp_path / f"{name}-checked") for cls, name in ((LightningCSV, "pl"), (CSVLogger, "tt"))]
    monkeypatch.setattr(FabricWriter, "_check_log_dir_exists", lambda self: None)
    monkeypatch.setattr(ExperimentWriter, "_check_log_dir_exists", lambda self: None)
    patched = [two_loggers(cls, tmp_path / f"{name}-patched") for cls, name in ((LightningCSV, "pl"), (CSVLogger, "tt"))]
    assert checked[1] == checked[0] and checked[0][0] == "a,b,step\n100,200,0\n" and checked[0][1] == [True]
    assert patched[1] == patched[0] and patched[0][0] == "a,b,step\n1,2,0\n100,200,0\n" and patched[0][1] == []


def test_tensorboard_available_flag_imports_from_lightnings_module_path():
    # scripts import Lightning's flag to skip TensorBoard work without the package; the renamed import must hold
    import lightning.pytorch.loggers.tensorboard as lightning_tb

    from tasktrain.loggers.tensorboard import _TENSORBOARD_AVAILABLE

    assert bool(_TENSORBOARD_AVAILABLE) == bool(lightning_tb._TENSORBOARD_AVAILABLE)
    assert str(_TENSORBOARD_AVAILABLE) == str(lightning_tb._TENSORBOARD_AVAILABLE)


# (at module level: ddp_spawn pickles the module for its child)
from lightning.pytorch.demos.boring_classes import BoringModel as _TheirBoringModel  # noqa: E402

from tasktrain.demos.boring_classes import BoringModel as _OurBoringModel  # noqa: E402


class _LogsInTheChild:
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("child_loss", out["loss"])
        return out


class _OursLogsInTheChild(_LogsInTheChild, _OurBoringModel):
    pass


class _TheirsLogsInTheChild(_LogsInTheChild, _TheirBoringModel):
    pass


def test_wandb_run_under_ddp_spawn_is_the_parents_as_lightnings(tmp_path, monkeypatch):
    """strategy="ddp_spawn" pickles the WandbLogger for its child: Lightning's __getstate__ starts the run in the parent
    (rank 0) and the child attaches to it through wandb's service (tests_pytorch/loggers/test_wandb.py::
    test_wandb_logger_init_before_spawn), so one offline run holds the child's metrics and what the parent logs after
    the fit, the checkpoints go under that run's id, and the parent's `experiment` is that run. Before, tasktrain's
    child made a run of its own and the parent, after the fit, yet another. Kept different: a `test` after wandb.finish()
    continues the run's id, where Lightning's child fails to attach to the finished run."""
    import glob
    import warnings

    import wandb
    from lightning.pytorch.loggers import WandbLogger as TheirWandbLogger
    from test_loggers import wandb_history

    from tasktrain.loggers import WandbLogger

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # (Lightning's offline=True sets it in the process: restored after)
    got = {}
    for lib, make, module_class in ((tasktrain, WandbLogger, _OursLogsInTheChild),
                                    (L, TheirWandbLogger, _TheirsLogsInTheChild)):
        save_dir = tmp_path / lib.__name__
        logger = make(save_dir=save_dir, project="spawn", offline=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(strategy="ddp_spawn", devices=1, accelerator="cpu", max_steps=2, limit_val_batches=0,
                                  limit_test_batches=1, logger=logger, log_every_n_steps=1, enable_progress_bar=False,
                                  enable_model_summary=False)
            trainer.fit(module_class())
        run = logger.experiment
        logger.log_metrics({"parent_after": 1.0}, step=5)
        wandb.finish()
        history = wandb_history(run)
        got[lib.__name__] = dict(
            runs=[os.path.basename(p).rsplit("-", 1)[1] == run.id for p in glob.glob(str(save_dir / "wandb" / "*run-*"))],
            version=logger.version == run.id,
            checkpoints=os.path.relpath(os.path.dirname(trainer.checkpoint_callback.best_model_path), save_dir) ==
            os.path.join("spawn", run.id, "checkpoints"),
            child_steps=[row["trainer/global_step"] for row in history if "child_loss" in row],
            parent_steps=[row["trainer/global_step"] for row in history if "parent_after" in row])
        # kept different (docs/logging.md): after wandb.finish() a later spawned run continues the run's id, where
        # Lightning's child tries to attach to the finished run and fails
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.test(module_class(), verbose=False)
            got[lib.__name__]["test_after_finish"] = logger.version == run.id and logger.experiment is not run
        except Exception as error:
            got[lib.__name__]["test_after_finish"] = f"Unable to attach to run {run.id}" in str(error)
        wandb.finish()
    assert got["tasktrain"] == got["lightning.pytorch"] == dict(runs=[True], version=True, checkpoints=True,
                                                                child_steps=[0, 1], parent_steps=[5],
                                                                test_after_finish=True)



_OFFLINE_TWICE = """
import json, os, sys, wandb
from lightning.pytorch.loggers import WandbLogger as TheirWandbLogger
from tasktrain.loggers import WandbLogger
got = []
for make in (WandbLogger, TheirWandbLogger):
    try:
        run = make(save_dir=os.path.join(sys.argv[1], make.__module__), project="offline", offline=True).experiment
        got.append([run.settings.mode, os.environ.get("WANDB_MODE")])
    except Exception as error:
        got.append([type(error).__name__, os.environ.get("WANDB_MODE")])
    wandb.finish()
print(json.dumps(got))
"""


def test_wandb_offline_is_this_runs_mode_where_lightning_sets_it_for_the_process(tmp_path):
    """WandbLogger(offline=True): tasktrain's passes mode="offline" to this run's wandb.init and leaves the environment
    alone. Lightning's sets WANDB_MODE=dryrun in the process's environment as the run starts
    (tests_pytorch/loggers/test_wandb.py::test_wandb_pickle reads it), so every later wandb.init there, and every process
    it starts, is offline too; and wandb reads its environment once per process, so after a first run (here tasktrain's
    offline one) Lightning's offline=True does not take: wandb goes online and, with no API key, refuses to start.
    Kept different (docs/logging.md); a fresh process, so no earlier test's wandb state decides the outcome."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_DIR"] = env["WANDB_CONFIG_DIR"] = env["WANDB_CACHE_DIR"] = str(tmp_path)
    env["NETRC"] = str(tmp_path / "netrc")  # (none: no API key from the machine's ~/.netrc either)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _OFFLINE_TWICE, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert ours == ["offline", None]
    assert theirs == ["UsageError", "dryrun"]
