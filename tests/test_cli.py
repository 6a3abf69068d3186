"""TaskCLI (LightningCLI's way, on jsonargparse): a script run in a subprocess (its runs one after the other in one
interpreter) with a YAML config and command-line overrides, --print_config, the saved config, test with a
checkpoint, seeding, run=False, and the missing extra."""
import json
import os
import subprocess
import sys

import pytest
import yaml

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_scripts", "train.py")

# The script's runs in one fresh interpreter, one after the other, each as `python train.py ARGS` in its folder would
# run it (runpy: the script runs as __main__ again, a new module each time; sys.argv and the working folder are the
# run's): its exit status, stdout and stderr. torch and tasktrain are imported once, not once per run (~3.5 s of CPU
# each).
_RUNS = """import contextlib, io, json, os, runpy, sys, traceback
script, runs, results_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
results = []
for cwd, args in runs:
    os.chdir(cwd)
    sys.argv = [script, *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:  # as the interpreter ends on it: a message is printed, with status 1
            code = e.code if isinstance(e.code, int) or e.code is None else 1
            if not (isinstance(e.code, int) or e.code is None):
                print(e.code, file=sys.stderr)
        except BaseException:  # an uncaught error: its traceback and status 1
            traceback.print_exc()
            code = 1
    results.append([code or 0, out.getvalue(), err.getvalue()])
with open(results_path, "w") as f:
    json.dump(results, f)
"""


def run_script(runs, results):
    """runs: [(folder, [args])]; returns [(status, stdout, stderr)] in order. The interpreter itself must end well."""
    proc = subprocess.run([sys.executable, "-c", _RUNS, SCRIPT, json.dumps([[str(c), list(a)] for c, a in runs]),
                           str(results)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(results) as f:
        return [tuple(r) for r in json.load(f)]


def result(run):
    """The RESULT line a run printed (after fit or test), and its stdout; the run must have ended with status 0."""
    code, stdout, stderr = run
    assert code == 0, stderr[-3000:]
    results = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return results[-1] if results else None, stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script's runs of the two tests below, in one interpreter: in `fit_dir`, a fit with a config file and
    overrides, the same again into another folder, the same once more (config.yaml exists), then test from the
    fit's checkpoint; in `print_dir`, --print_config, then a fit whose seed is drawn."""
    fit_dir, print_dir = tmp_path_factory.mktemp("cli_fit"), tmp_path_factory.mktemp("cli_print")
    config = {
        "trainer": {"max_epochs": 5, "logger": False, "enable_progress_bar": False, "default_root_dir": str(fit_dir),
                    "callbacks": [{"class_path": "tasktrain.EarlyStopping",
                                   "init_args": {"monitor": "val_loss", "patience": 50}}]},
        "model": {"lr": 0.05, "hidden": 6},
        "seed_everything": 123,
    }
    (fit_dir / "cfg.yaml").write_text(yaml.safe_dump(config))
    fit = ["fit", "--config", "cfg.yaml", "--trainer.max_epochs", "3", "--model.lr", "0.02"]
    # (the fit's one checkpoint: ModelCheckpoint's default name after 3 epochs of 4 steps; checked by the test)
    ckpt = fit_dir / "checkpoints" / "epoch=2-step=12.ckpt"
    done = run_script([(fit_dir, fit), (fit_dir, [*fit, "--trainer.default_root_dir", str(fit_dir / "again")]),
                       (fit_dir, ["fit", "--config", "cfg.yaml"]),
                       (fit_dir, ["test", "--config", "cfg.yaml", "--ckpt_path", str(ckpt),
                                  "--trainer.default_root_dir", str(fit_dir / "tested")]),
                       (print_dir, ["fit", "--model.hidden", "3", "--print_config"]),
                       (print_dir, ["fit", "--trainer.max_epochs", "1", "--trainer.logger", "false",
                                    "--trainer.enable_progress_bar", "false"]),
                       # Lightning's: every subcommand saves its config (a test into the fit's folder finds the
                       # fit's config.yaml there: an error), none under fast_dev_run
                       (fit_dir, ["test", "--config", "cfg.yaml", "--ckpt_path", str(ckpt)]),
                       (print_dir, ["fit", "--trainer.fast_dev_run", "true", "--trainer.logger", "false",
                                    "--trainer.default_root_dir", str(print_dir / "fast")])],
                      tmp_path_factory.mktemp("cli_results") / "results.json")
    return fit_dir, print_dir, ckpt, done


def test_fit_with_a_config_file_and_overrides_then_test_from_the_checkpoint(runs):
    tmp_path, _, ckpt, done = runs
    out, _ = result(done[0])
    # the file's values, the command line's over them
    assert out["max_epochs"] == 3 and out["global_step"] == 12 and out["lr"] == 0.02 and out["hidden"] == 6
    assert "EarlyStopping" in out["callbacks"] and "SaveConfigCallback" in out["callbacks"]
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())  # written where the run logs
    assert saved["trainer"]["max_epochs"] == 3 and saved["model"]["lr"] == 0.02 and saved["seed_everything"] == 123
    assert saved["trainer"]["callbacks"][0]["class_path"].endswith("EarlyStopping")
    again, _ = result(done[1])
    assert again["first_random"] == out["first_random"]  # the same seed, the same run
    # an existing config.yaml is never replaced silently
    code, _, stderr = done[2]
    assert code != 0 and "Aborting to avoid overwriting" in stderr
    assert list((tmp_path / "checkpoints").glob("*.ckpt")) == [ckpt]  # the fit's checkpoint, the one tested
    tested, _ = result(done[3])
    assert tested["subcommand"] == "test" and "test_loss" in tested["metrics"]
    # every subcommand writes the config it ran with where it logs, as Lightning's SaveConfigCallback
    saved = yaml.safe_load((tmp_path / "tested" / "config.yaml").read_text())
    assert saved["ckpt_path"] == str(ckpt) and saved["trainer"]["default_root_dir"] == str(tmp_path / "tested")
    code, _, stderr = done[6]  # test into the fit's folder: the fit's config.yaml is not replaced
    assert code != 0 and "Aborting to avoid overwriting" in stderr
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["max_epochs"] == 3
    fast, _ = result(done[7])  # fast_dev_run: no config saved, as Lightning's
    assert "SaveConfigCallback" not in fast["callbacks"] and not (runs[1] / "fast" / "config.yaml").exists()


def test_print_config_and_a_drawn_seed_written_into_the_saved_config(runs):
    _, tmp_path, _, done = runs
    code, stdout, stderr = done[4]
    assert code == 0, stderr
    printed = yaml.safe_load(stdout)
    assert printed["model"]["hidden"] == 3 and printed["trainer"]["max_epochs"] is None
    assert printed["seed_everything"] is True and "accumulate_grad_batches" in printed["trainer"]
    out, _ = result(done[5])
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert isinstance(saved["seed_everything"], int) and saved["seed_everything"] == out["seed"]


def test_run_false_builds_the_objects_and_bad_arguments_fail(tmp_path, capsys):
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        from train import Regressor
    finally:
        sys.path.pop(0)
    from tasktrain.cli import TaskCLI

    cli = TaskCLI(Regressor, run=False, args=["--model.hidden", "2", "--trainer.max_steps", "5",
                                              "--trainer.enable_checkpointing", "false", "--trainer.logger", "false",
                                              "--seed_everything", "false"])
    assert cli.model.hparams.hidden == 2 and cli.trainer.max_steps == 5 and cli.subcommand is None
    cli.trainer.fit(cli.model)
    assert cli.trainer.global_step == 5
    as_dict = TaskCLI(Regressor, run=False, args={"model": {"hidden": 5}, "seed_everything": False,
                                                    "trainer": {"logger": False}})
    assert as_dict.model.hparams.hidden == 5 and as_dict.trainer.loggers == []
    with pytest.raises(SystemExit):
        TaskCLI(Regressor, run=False, args=["--model.hiden", "2"])
    assert "hiden" in capsys.readouterr().err


def test_a_clear_error_without_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jsonargparse", None)
    from tasktrain.cli import TaskCLI

    with pytest.raises(ImportError, match=r"tasktrain\[cli\]"):
        TaskCLI(run=False, args=[])


def _regressor():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        from train import Regressor
    finally:
        sys.path.pop(0)
    return Regressor


def test_optimizer_and_lr_scheduler_groups_replace_configure_optimizers(tmp_path, monkeypatch):
    import torch

    from tasktrain.cli import TaskCLI

    monkeypatch.chdir(tmp_path)
    Regressor = _regressor()
    quiet = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--seed_everything", "1",
             "--trainer.enable_model_summary", "false"]
    with pytest.warns(UserWarning, match="`Regressor.configure_optimizers` will be overridden by `TaskCLI.configure_optimizers`"):
        cli = TaskCLI(Regressor, args=["fit", "--trainer.max_epochs", "2", "--optimizer", "Adam", "--optimizer.lr",
                                       "0.01", "--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "1",
                                       "--lr_scheduler.gamma", "0.5", *quiet])
    (optimizer,) = cli.trainer.optimizers
    assert type(optimizer) is torch.optim.Adam and cli.trainer.global_step == 8
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5 ** 2)  # StepLR stepped at both epoch ends
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())  # the saved config repeats them
    assert saved["optimizer"]["class_path"] == "torch.optim.Adam" and saved["optimizer"]["init_args"]["lr"] == 0.01
    assert saved["lr_scheduler"]["class_path"] == "torch.optim.lr_scheduler.StepLR"

    # ReduceLROnPlateau watches the metric its config names
    # (its own folder: run=False saves the config at the fit too, as Lightning's, and the first one's is here)
    config = {"trainer": {"max_epochs": 2, "logger": False, "enable_progress_bar": False,
                          "enable_checkpointing": False, "enable_model_summary": False,
                          "default_root_dir": str(tmp_path / "plateau")},
              "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}},
              "lr_scheduler": {"class_path": "tasktrain.cli.ReduceLROnPlateau",
                               "init_args": {"monitor": "val_loss", "patience": 0, "factor": 0.5}},
              "seed_everything": False}
    with pytest.warns(UserWarning):
        cli = TaskCLI(Regressor, run=False, args=config)
    cli.trainer.fit(cli.model)
    (scheduler,) = cli.trainer.lr_scheduler_configs
    assert scheduler.monitor == "val_loss" and type(cli.trainer.optimizers[0]) is torch.optim.SGD
    saved = yaml.safe_load((tmp_path / "plateau" / "config.yaml").read_text())  # the whole config (no subcommand)
    assert saved["lr_scheduler"]["init_args"]["monitor"] == "val_loss"
    # without --optimizer the module's own configure_optimizers builds it
    cli = TaskCLI(Regressor, run=False, args={"trainer": {"logger": False}, "seed_everything": False})
    assert cli.model.configure_optimizers.__func__ is Regressor.configure_optimizers
    # a scheduler with no optimizer to build it on is an error, not a scheduler left out
    with pytest.raises(ValueError, match="--lr_scheduler was given without --optimizer"):
        TaskCLI(Regressor, run=False, args=["--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "1"])


def test_lightning_parser_methods_class_args_callbacks_optimizer_groups_links_and_logo(tmp_path, monkeypatch, capsys):
    """LightningCLI scripts' parser calls (issue 25): add_lightning_class_args (a callback class is built and added
    to the trainer's callbacks), add_optimizer_args / add_lr_scheduler_args of one class (AUTOMATIC: they become
    configure_optimizers) or linked to the model's arguments, link_arguments, and cli_lightning_logo."""
    import torch

    from tasktrain import EarlyStopping
    from tasktrain.cli import TaskCLI, cli_lightning_logo

    monkeypatch.chdir(tmp_path)
    Regressor = _regressor()
    quiet = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--seed_everything", "1",
             "--trainer.enable_model_summary", "false", "--trainer.max_epochs", "2"]

    class CLI(TaskCLI):
        def add_arguments_to_parser(self, parser):
            parser.add_lightning_class_args(EarlyStopping, "early_stopping")
            parser.set_defaults({"early_stopping.monitor": "val_loss", "early_stopping.patience": 5})
            parser.add_optimizer_args(torch.optim.Adam)
            parser.add_lr_scheduler_args(torch.optim.lr_scheduler.StepLR)
            parser.link_arguments("model.hidden", "model.batch_size")

    cli = CLI(Regressor, args=["fit", "--optimizer.lr", "0.02", "--lr_scheduler.step_size", "1",
                               "--model.hidden", "4", *quiet])
    stoppers = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert len(stoppers) == 1 and stoppers[0].monitor == "val_loss" and stoppers[0].patience == 5
    (optimizer,) = cli.trainer.optimizers
    assert type(optimizer) is torch.optim.Adam and optimizer.param_groups[0]["initial_lr"] == 0.02
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02 * 0.1 ** 2)  # StepLR(step_size=1, gamma=0.1)
    assert cli.model.hparams.batch_size == 4  # linked from model.hidden

    class BuildsItsOwn(Regressor):
        def __init__(self, optimizer_init: dict = None, hidden: int = 4):
            super().__init__(hidden=hidden)
            self.optimizer_init = optimizer_init

    class Linked(TaskCLI):  # link_to another key: the module gets the {class_path, init_args} to build itself
        def add_arguments_to_parser(self, parser):
            parser.add_optimizer_args(torch.optim.SGD, link_to="model.optimizer_init")

    cli = Linked(BuildsItsOwn, run=False, args={"trainer": {"logger": False}, "seed_everything": False,
                                                "optimizer": {"lr": 0.3}})
    assert cli.model.optimizer_init["class_path"].endswith("SGD") and cli.model.optimizer_init["init_args"]["lr"] == 0.3
    assert cli.model.configure_optimizers.__func__ is Regressor.configure_optimizers  # nothing AUTOMATIC

    class TwoAutomatic(TaskCLI):
        def add_arguments_to_parser(self, parser):
            parser.add_optimizer_args(torch.optim.Adam, nested_key="gen")
            parser.add_optimizer_args(torch.optim.Adam, nested_key="disc")

    with pytest.raises(ValueError, match="at most one optimizer"):
        TwoAutomatic(Regressor, run=False, args={"trainer": {"logger": False}, "seed_everything": False})
    cli_lightning_logo()
    assert "| |_ __ _ ___| | _| |_" in capsys.readouterr().out
