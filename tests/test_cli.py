"""TaskCLI (LightningCLI's way, on jsonargparse): a script run in a subprocess with a YAML config and command-line
overrides, --print_config, the saved config, test with a checkpoint, seeding, run=False, and the missing extra."""
import json
import os
import subprocess
import sys

import pytest
import yaml

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_scripts", "train.py")


def run(*args, cwd):
    proc = subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return results[-1] if results else None, proc.stdout


def test_fit_with_a_config_file_and_overrides_then_test_from_the_checkpoint(tmp_path):
    config = {
        "trainer": {"max_epochs": 5, "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path),
                    "callbacks": [{"class_path": "tasktrain.EarlyStopping",
                                   "init_args": {"monitor": "val_loss", "patience": 50}}]},
        "model": {"lr": 0.05, "hidden": 6},
        "seed_everything": 123,
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    out, _ = run("fit", "--config", "cfg.yaml", "--trainer.max_epochs", "3", "--model.lr", "0.02", cwd=tmp_path)
    # the file's values, the command line's over them
    assert out["max_epochs"] == 3 and out["global_step"] == 12 and out["lr"] == 0.02 and out["hidden"] == 6
    assert "EarlyStopping" in out["callbacks"] and "SaveConfigCallback" in out["callbacks"]
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())  # written where the run logs
    assert saved["trainer"]["max_epochs"] == 3 and saved["model"]["lr"] == 0.02 and saved["seed_everything"] == 123
    assert saved["trainer"]["callbacks"][0]["class_path"].endswith("EarlyStopping")
    again, _ = run("fit", "--config", "cfg.yaml", "--trainer.max_epochs", "3", "--model.lr", "0.02",
                   "--trainer.default_root_dir", str(tmp_path / "again"), cwd=tmp_path)
    assert again["first_random"] == out["first_random"]  # the same seed, the same run
    # an existing config.yaml is never replaced silently
    proc = subprocess.run([sys.executable, SCRIPT, "fit", "--config", "cfg.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "already exists" in proc.stderr
    ckpt = next((tmp_path / "checkpoints").glob("*.ckpt"))
    tested, _ = run("test", "--config", "cfg.yaml", "--ckpt_path", str(ckpt), cwd=tmp_path)
    assert tested["subcommand"] == "test" and "test_loss" in tested["metrics"]


def test_print_config_and_a_drawn_seed_written_into_the_saved_config(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "fit", "--model.hidden", "3", "--print_config"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["model"]["hidden"] == 3 and printed["trainer"]["max_epochs"] is None
    assert printed["seed_everything"] is True and "accumulate_grad_batches" in printed["trainer"]
    out, _ = run("fit", "--trainer.max_epochs", "1", "--trainer.logger", "false", "--trainer.enable_progress_bar",
                 "false", cwd=tmp_path)
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


def test_importing_tasktrain_cli_does_not_import_jsonargparse():
    code = "import sys, tasktrain, tasktrain.cli; assert 'jsonargparse' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


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
    with pytest.warns(UserWarning, match="Regressor.configure_optimizers is replaced by the --optimizer"):
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
    config = {"trainer": {"max_epochs": 2, "logger": False, "enable_progress_bar": False,
                          "enable_checkpointing": False, "enable_model_summary": False},
              "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}},
              "lr_scheduler": {"class_path": "tasktrain.cli.ReduceLROnPlateau",
                               "init_args": {"monitor": "val_loss", "patience": 0, "factor": 0.5}},
              "seed_everything": False}
    with pytest.warns(UserWarning):
        cli = TaskCLI(Regressor, run=False, args=config)
    cli.trainer.fit(cli.model)
    (scheduler,) = cli.trainer.lr_scheduler_configs
    assert scheduler.monitor == "val_loss" and type(cli.trainer.optimizers[0]) is torch.optim.SGD
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
