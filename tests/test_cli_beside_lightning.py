"""TaskCLI beside Lightning 2.6's LightningCLI (issue 37), where Lightning's own CLI tests (the yardstick,
scripts/lightning_yardstick.py, test_cli.py) found them apart: the same script or the same code under both CLIs, and
what each did compared.

- With no datamodule_class, an optional --data group of any DataModule (subclass mode, default None): `fit
  --data=SubData --data.batch_size=4` trains on it, no --data on the model's own loaders; --print_config shows
  `data: null`, below the header comment `# tasktrain==<version>` (Lightning's `# lightning.pytorch==<version>`).
- trainer_class and model_class may be functions that build the object (their arguments become the group's).
- trainer_defaults' callbacks are appended to the command line's callbacks (never replaced by them), and a trainer
  class without a callbacks argument gets a warning that they are left out.
- Lightning's words where a user's warning filter or `match=` reads them: the warning that --optimizer overrides the
  module's configure_optimizers, the warning that args and sys.argv were both given, the error that a saved
  config.yaml would be overwritten.
- The CLI's SaveConfigCallback pickles (its parser's instantiators hold the CLI), so strategy="ddp_spawn" runs.
"""
import json
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # a test dependency (requirements-dev.txt), imported in tests only
pytest.importorskip("jsonargparse")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "cli_scripts", "data_group.py")
LIBS = ("lightning", "tasktrain")
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.max_epochs=1", "--trainer.accelerator=cpu",
         "--trainer.devices=1"]

# the script run several times in one interpreter (torch imported once), as `python data_group.py ARGS` would run it
_RUNS = """import contextlib, io, json, os, runpy, sys
script, runs = sys.argv[1], json.loads(sys.argv[2])
results = []
for args in runs:
    sys.argv = [script, *args]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code or 0
    results.append([code, out.getvalue()])
print("RUNS " + json.dumps(results))
"""


def run_script(lib, runs, cwd):
    env = {**os.environ, "CLI_LIB": lib, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _RUNS, SCRIPT, json.dumps(runs)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)
    assert proc.returncode == 0 and "RUNS " in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RUNS ")[-1])


@pytest.fixture(scope="module")
def data_runs(tmp_path_factory):
    out = {}
    for lib in LIBS:
        folder = tmp_path_factory.mktemp(lib)
        out[lib] = run_script(lib, [
            ["fit", "--data=SubData", "--data.batch_size=4", *QUIET, f"--trainer.default_root_dir={folder}"],
            ["fit", *QUIET, f"--trainer.default_root_dir={folder}"],
            ["fit", "--print_config"],
        ], str(folder))
    return out


def test_data_group_picks_a_datamodule_by_name_as_lightnings(data_runs):
    ours, theirs = data_runs["tasktrain"][0], data_runs["lightning"][0]
    assert ours[0] == theirs[0] == 0
    ours, theirs = json.loads(ours[1].splitlines()[-1]), json.loads(theirs[1].splitlines()[-1])
    assert ours == theirs
    # SubData's loader: 16 samples in batches of 4
    assert ours == {"datamodule": "SubData", "batch_size": 4, "global_step": 4,
                    "data_config": {"class_path": "SubData", "init_args": {"batch_size": 4, "samples": 16}}}


def test_without_data_the_model_loaders_are_used_as_lightnings(data_runs):
    ours, theirs = data_runs["tasktrain"][1], data_runs["lightning"][1]
    assert ours[0] == theirs[0] == 0
    ours, theirs = json.loads(ours[1].splitlines()[-1]), json.loads(theirs[1].splitlines()[-1])
    assert ours == theirs == {"datamodule": None, "batch_size": None, "global_step": 2, "data_config": None}


def test_print_config_shows_the_data_group_as_lightnings(data_runs):
    import yaml

    ours, theirs = (yaml.safe_load(data_runs[lib][2][1]) for lib in ("tasktrain", "lightning"))
    assert "data" in ours and ours["data"] is None and theirs["data"] is None
    # the header comment naming the package and its version (Lightning's dump_header)
    assert data_runs["lightning"][2][1].startswith(f"# lightning.pytorch=={L.__version__}\n")
    assert data_runs["tasktrain"][2][1].startswith(f"# tasktrain=={tasktrain.__version__}\n")


# -- in-process cases: the same code under both CLIs ----------------------------------------------------------------

def classes(lib):
    """(Trainer, module base, Callback, CLI, SaveConfigCallback) of one library."""
    if lib == "lightning":
        from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

        return L.Trainer, L.LightningModule, L.Callback, LightningCLI, SaveConfigCallback
    from tasktrain.cli import SaveConfigCallback, TaskCLI

    return tasktrain.Trainer, tasktrain.TaskModule, tasktrain.Callback, TaskCLI, SaveConfigCallback


def _model_class(base):
    class Model(base):
        def __init__(self, width: int = 4):
            super().__init__()
            self.width = width
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            x = torch.randn(8, 4)
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    return Model


# one Model per library, at module level: its class path resolves, and what holds it pickles
LModel, TModel = _model_class(L.LightningModule), _model_class(tasktrain.TaskModule)
for _cls, _name in ((LModel, "LModel"), (TModel, "TModel")):
    _cls.__name__ = _cls.__qualname__ = _name


def model_class(base):
    return LModel if base is L.LightningModule else TModel


QUIET_TRAINER = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                 "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


@pytest.mark.parametrize("lib", LIBS)
def test_builder_functions_for_the_trainer_and_the_model(lib, monkeypatch):
    Trainer, base, _, CLI, _ = classes(lib)
    Model = model_class(base)

    def build_model(width: int) -> Model:
        return Model(width=width * 2)

    def build_trainer(max_steps: int, logger: bool = False, enable_progress_bar: bool = False,
                      enable_model_summary: bool = False, enable_checkpointing: bool = False,
                      callbacks: list = None) -> Trainer:
        return Trainer(max_steps=max_steps, logger=logger, enable_progress_bar=enable_progress_bar,
                       enable_model_summary=enable_model_summary, enable_checkpointing=enable_checkpointing,
                       callbacks=callbacks, accelerator="cpu", devices=1)

    monkeypatch.setattr(sys, "argv", ["train.py"])
    cli = CLI(build_model, trainer_class=build_trainer, save_config_callback=None,
              args=["fit", "--model.width=3", "--trainer.max_steps=1"])
    assert type(cli.model) is Model and cli.model.width == 6
    assert cli.trainer.max_steps == 1 and cli.trainer.global_step == 1


@pytest.mark.parametrize("lib", LIBS)
def test_trainer_defaults_callbacks_are_appended_to_the_command_lines(lib, monkeypatch):
    Trainer, base, Callback, CLI, _ = classes(lib)
    Model = model_class(base)

    class Default(Callback):
        pass

    monkeypatch.setattr(sys, "argv", ["train.py"])
    cli = CLI(Model, run=False, save_config_callback=None, trainer_defaults={**QUIET_TRAINER, "callbacks": Default()},
              args=["--trainer.callbacks+=LearningRateMonitor"])
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    assert "Default" in names and "LearningRateMonitor" in names
    # the config holds the command line's callbacks alone: the defaults' are no default it replaces
    assert [c["class_path"].rpartition(".")[2] for c in cli.config["trainer"]["callbacks"]] == ["LearningRateMonitor"]

    class NoCallbacks(Trainer):
        def __init__(self, max_steps: int = 1):
            super().__init__(max_steps=max_steps, **QUIET_TRAINER)

    with pytest.warns(UserWarning, match="`.*NoCallbacks` class does not expose the `callbacks` argument"):
        cli = CLI(Model, run=False, trainer_class=NoCallbacks, trainer_defaults={"callbacks": Default()}, args=[])
    assert not any(type(c).__name__ in ("Default", "SaveConfigCallback") for c in cli.trainer.callbacks)


@pytest.mark.parametrize("lib", LIBS)
def test_lightnings_words_for_the_override_and_args_warnings(lib, monkeypatch):
    _, base, _, CLI, _ = classes(lib)
    Model = model_class(base)
    name = "LightningCLI" if lib == "lightning" else "TaskCLI"
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.warns(UserWarning, match=f"`{Model.__name__}.configure_optimizers` will be overridden by "
                                         f"`{name}.configure_optimizers`"):
        CLI(Model, run=False, save_config_callback=None, trainer_defaults=QUIET_TRAINER, args=["--optimizer=Adam"])
    monkeypatch.setattr(sys, "argv", ["train.py", "--model.width=5"])
    with pytest.warns(UserWarning, match="LightningCLI's args parameter is intended to run from within Python"):
        cli = CLI(Model, run=False, save_config_callback=None, trainer_defaults=QUIET_TRAINER,
                  args=["--model.width=7"])
    assert cli.model.width == 7  # args win, sys.argv is not read
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no args warning without command-line words
        warnings.filterwarnings("ignore", message=".*srun.*")
        CLI(Model, run=False, save_config_callback=None, trainer_defaults=QUIET_TRAINER, args=["--model.width=7"])


@pytest.mark.parametrize("lib", LIBS)
def test_an_existing_config_file_stops_the_run_with_lightnings_words(lib, tmp_path, monkeypatch):
    _, base, _, CLI, _ = classes(lib)
    Model = model_class(base)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    (tmp_path / "config.yaml").write_text("earlier: run\n")
    with pytest.raises(RuntimeError, match="Aborting to avoid overwriting results of a previous run"):
        CLI(Model, trainer_defaults={**QUIET_TRAINER, "max_steps": 1, "default_root_dir": str(tmp_path)},
            args=["fit"])
    assert (tmp_path / "config.yaml").read_text() == "earlier: run\n"


@pytest.mark.parametrize("lib", LIBS)
def test_the_save_config_callback_pickles_for_ddp_spawn(lib, monkeypatch):
    _, base, _, CLI, SaveConfigCallback = classes(lib)
    Model = model_class(base)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    cli = CLI(Model, run=False, trainer_defaults=QUIET_TRAINER, args=[])
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, SaveConfigCallback))
    again = pickle.loads(pickle.dumps(callback))
    assert type(again) is type(callback) and again.config == callback.config


@pytest.mark.parametrize("lib", LIBS)
def test_any_model_and_any_data_by_the_demos_class_paths(lib, monkeypatch, capsys):
    """`--model=<package>.demos.BoringModel --data=<package>.demos.BoringDataModule` on a CLI given no class: the
    demos package has the Boring classes, as `lightning.pytorch.demos` has, and the printed config names them so."""
    import yaml

    *_, CLI, _ = classes(lib)
    package = "lightning.pytorch" if lib == "lightning" else "tasktrain"
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit):
        CLI(args=["predict", "--seed_everything=1234", f"--model={package}.demos.BoringModel",
                  f"--data={package}.demos.BoringDataModule", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == f"{package}.demos.BoringModel"
    assert printed["data"]["class_path"] == f"{package}.demos.BoringDataModule"
    assert printed["seed_everything"] == 1234 and printed["ckpt_path"] is None
