"""Issue 37: Lightning's public methods that a user calls or overrides, which tasktrain lacked (the list is
test_lightning_beside_signatures.py's test_lightnings_public_methods_and_class_attributes_are_there_or_allowed), run
under Lightning 2.6 itself (a test dependency, imported here only) and under tasktrain, side by side: a LightningCLI
subclass overriding every one of LightningCLI's methods, run as a TaskCLI subclass; ModelCheckpoint's
check_monitor_top_k and file_exists, called and overridden; Profiler.local_rank and PyTorchProfiler's
AVAILABLE_SORT_KEYS; MixedPrecision.autocast_context_manager overridden; the model summary's named_modules and
flop_counts."""
import os

import pytest
import torch

import tasktrain

L = pytest.importorskip("lightning")


# -- TaskCLI: LightningCLI's methods, overridden, called at Lightning's points with Lightning's arguments -----------

def recording_cli(base, log):
    """A subclass of `base` (LightningCLI or TaskCLI) overriding each of its methods to note the call (and its
    arguments) in `log`, then doing what Lightning's documentation shows such an override doing."""

    class Recording(base):
        def init_parser(self, **kwargs):
            log.append(("init_parser", sorted(kwargs)))
            return super().init_parser(**kwargs)

        def setup_parser(self, add_subcommands, main_kwargs, subparser_kwargs):
            log.append(("setup_parser", add_subcommands, main_kwargs, subparser_kwargs))
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)

        def add_default_arguments_to_parser(self, parser):
            log.append("add_default_arguments_to_parser")
            super().add_default_arguments_to_parser(parser)

        def add_core_arguments_to_parser(self, parser):
            log.append("add_core_arguments_to_parser")
            super().add_core_arguments_to_parser(parser)

        def add_arguments_to_parser(self, parser):
            log.append("add_arguments_to_parser")
            parser.add_argument("--notes", type=int, default=1)

        @staticmethod
        def link_optimizers_and_lr_schedulers(parser):
            log.append(("link_optimizers_and_lr_schedulers", sorted(parser._optimizers)))
            base.link_optimizers_and_lr_schedulers(parser)

        @staticmethod
        def subcommands():
            log.append("subcommands")
            return {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
                    "validate": {"model", "dataloaders", "datamodule"}}

        def parse_arguments(self, parser, args):
            log.append(("parse_arguments", parser is self.parser, args if isinstance(args, list) else type(args)))
            super().parse_arguments(parser, args)

        def before_instantiate_classes(self):
            config = self.config[self.config["subcommand"]] if "subcommand" in self.config else self.config
            log.append(("before_instantiate_classes", config["notes"]))

        def instantiate_classes(self):
            log.append("instantiate_classes")
            super().instantiate_classes()

        def instantiate_trainer(self, **kwargs):
            log.append(("instantiate_trainer", kwargs))
            return super().instantiate_trainer(max_steps=3, **kwargs)  # over the config's trainer arguments

        def after_instantiate_classes(self):
            log.append(("after_instantiate_classes", self.trainer.max_steps, type(self.model).__name__))

        @staticmethod
        def configure_optimizers(lightning_module, optimizer, lr_scheduler=None):
            log.append(("configure_optimizers", type(optimizer).__name__, optimizer.param_groups[0]["lr"],
                        type(lr_scheduler).__name__))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "interval": "step"}}

        def before_fit(self):
            log.append("before_fit")

        def fit(self, model, **kwargs):
            log.append(("fit", type(model).__name__, sorted(kwargs)))
            self.trainer.fit(model, **kwargs)

        def after_fit(self):
            log.append(("after_fit", self.trainer.global_step))

    return Recording


QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--trainer.enable_checkpointing=false", "--trainer.accelerator=cpu", "--trainer.devices=1",
         "--trainer.limit_val_batches=0", "--seed_everything=1"]


def models():
    from lightning.pytorch.demos.boring_classes import BoringModel as LightningBoringModel

    from tasktrain.demos.boring_classes import BoringModel

    return {"lightning": LightningBoringModel, "tasktrain": BoringModel}


def clis():
    from lightning.pytorch.cli import LightningCLI

    from tasktrain.cli import TaskCLI

    return {"lightning": LightningCLI, "tasktrain": TaskCLI}


def test_a_lightningcli_subclass_runs_as_a_taskcli_subclass(tmp_path, monkeypatch):
    logs = {}
    for name, cli in clis().items():
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)  # (the same arguments for both, each CLI in its own folder)
        log = logs[name] = []
        args = ["fit", *QUIET, "--trainer.default_root_dir=run", "--notes=7", "--optimizer=SGD",
                "--optimizer.lr=0.5", "--lr_scheduler=StepLR", "--lr_scheduler.step_size=1"]
        with pytest.warns(UserWarning, match="configure_optimizers"):  # (the module's own is replaced: both say so)
            ran = recording_cli(cli, log)(models()[name], args=args)
        assert ran.trainer.global_step == 3 and ran.trainer.max_steps == 3
        # the CLI's configure_optimizers gave the scheduler, stepped each step (interval="step")
        assert ran.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.5 * 0.1 ** 3)
        assert (tmp_path / name / "run" / "config.yaml").is_file()
    parser_calls = ["add_default_arguments_to_parser", "add_core_arguments_to_parser", "add_arguments_to_parser",
                    ("link_optimizers_and_lr_schedulers", ["optimizer"])]
    assert logs["tasktrain"] == logs["lightning"]
    assert logs["tasktrain"] == [
        "subcommands",
        ("setup_parser", True, {}, {}),
        ("init_parser", []),
        "subcommands",
        ("init_parser", ["description"]), *parser_calls, "subcommands",
        ("init_parser", ["description"]), *parser_calls, "subcommands",
        ("parse_arguments", True, args),
        ("before_instantiate_classes", 7),
        "instantiate_classes",
        ("instantiate_trainer", {}),
        ("after_instantiate_classes", 3, "BoringModel"),
        "before_fit",
        ("fit", "BoringModel", ["ckpt_path", "weights_only"]),
        ("configure_optimizers", "SGD", 0.5, "StepLR"),
        ("after_fit", 3),
    ]


def test_the_subcommands_are_those_subcommands_names_and_run_false_parses_on_the_main_parser(tmp_path, monkeypatch,
                                                                                             capsys):
    monkeypatch.chdir(tmp_path)
    for name, cli in clis().items():
        with pytest.raises(SystemExit):  # "test" is not among the subclass's subcommands()
            recording_cli(cli, [])(models()[name], args=["test", *QUIET])
        assert "invalid choice" in capsys.readouterr().err
        log = []
        args = [*QUIET, "--notes=2", f"--trainer.default_root_dir={tmp_path / name}"]
        ran = recording_cli(cli, log)(models()[name], args=args, run=False)
        assert ran.subcommand is None and ran.trainer.max_steps == 3
        assert log[:4] == ["subcommands", ("setup_parser", False, {}, {}), ("init_parser", []),
                           "add_default_arguments_to_parser"]
        assert ("parse_arguments", True, args) in log and ("before_instantiate_classes", 2) in log


def test_parse_arguments_takes_a_namespace_and_instantiate_trainer_kwargs_win(tmp_path, monkeypatch):
    from jsonargparse import Namespace

    monkeypatch.chdir(tmp_path)
    for name, cli in clis().items():
        config = Namespace(trainer=Namespace(logger=False, max_steps=10), seed_everything=False)
        log = []
        ran = recording_cli(cli, log)(models()[name], args=config, run=False)
        assert ("parse_arguments", True, Namespace) in log
        assert ran.trainer.max_steps == 3  # instantiate_trainer(max_steps=3) over the config's 10


def test_parser_class_and_environment_variables_are_lightnings(tmp_path, monkeypatch):
    """parser_class= takes a subclass of LightningArgumentParser (tasktrain.cli's, made on first use), which each
    parser is; parser_kwargs={"default_env": True} reads the arguments from PL_-prefixed variables, as Lightning's."""
    import jsonargparse
    from lightning.pytorch.cli import LightningArgumentParser as TheirParser

    from tasktrain.cli import LightningArgumentParser as OurParser
    from tasktrain.cli import TaskCLI

    monkeypatch.setenv("PL_TRAINER__MAX_STEPS", "4")
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_STEPS", "2")
    seen = {}
    for (name, cli), parser in zip(clis().items(), (TheirParser, OurParser)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        made = []

        class MyParser(parser):
            def __init__(self, *args, **kwargs):
                made.append(kwargs.get("default_env", False))
                super().__init__(*args, **kwargs)

        quiet = ["--trainer.logger=false", "--seed_everything=false"]
        ran = cli(models()[name], parser_class=MyParser, parser_kwargs={"default_env": True}, run=False, args=quiet)
        assert type(ran.parser) is MyParser and made == [True]
        from_env = ran.trainer.max_steps
        not_read = cli(models()[name], parser_class=MyParser, run=False, args=quiet).trainer.max_steps
        fit = cli(models()[name], parser_kwargs={"default_env": True},
                  args=["fit", *quiet, "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
                        "--trainer.limit_val_batches=0", "--trainer.accelerator=cpu", "--trainer.max_epochs=1",
                        "--trainer.limit_train_batches=3"])
        seen[name] = (from_env, not_read, fit.trainer.max_steps, fit.trainer.global_step)
    assert seen["tasktrain"] == seen["lightning"] == (4, -1, 2, 2)
    with pytest.raises(TypeError, match="a subclass of tasktrain.cli.LightningArgumentParser"):
        TaskCLI(models()["tasktrain"], parser_class=jsonargparse.ArgumentParser, run=False, args=[])


# -- ModelCheckpoint.check_monitor_top_k and file_exists ------------------------------------------------------------

def run_fit(name, root, callback, epochs=3):
    common = dict(max_epochs=epochs, callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, default_root_dir=root, logger=False)
    if name == "lightning":
        from lightning.pytorch.demos.boring_classes import BoringModel
        trainer = L.Trainer(accelerator="cpu", devices=1, limit_train_batches=2, limit_val_batches=2, **common)
    else:
        from tasktrain.demos.boring_classes import BoringModel
        trainer = tasktrain.Trainer(limit_train_batches=2, limit_val_batches=2, **common)

    class Logged(BoringModel):
        def validation_step(self, batch, batch_idx):
            # a score that gets worse, then better: epoch 0 -> 3, 1 -> 5, 2 -> 1
            self.log("score", float([3, 5, 1][self.current_epoch]))
            return super().validation_step(batch, batch_idx)

    trainer.fit(Logged())
    return trainer


def checkpoint_classes():
    return {"lightning": L.pytorch.callbacks.ModelCheckpoint, "tasktrain": tasktrain.ModelCheckpoint}


def test_check_monitor_top_k_decides_and_an_override_is_honoured(tmp_path):
    seen = {}
    for name, base in checkpoint_classes().items():
        calls = []

        class Refuses(base):
            def check_monitor_top_k(self, trainer, current=None):
                calls.append(float(current))
                decision = super().check_monitor_top_k(trainer, current)
                return decision and current < 2  # only scores below 2 are kept

        callback = Refuses(tmp_path / name, filename="{epoch}", monitor="score", save_top_k=2)
        trainer = run_fit(name, tmp_path / name, callback)
        seen[name] = (calls, sorted(os.listdir(tmp_path / name)), os.path.basename(callback.best_model_path))
        # the default, called directly: None never, fewer than k always
        plain = base(monitor="score", save_top_k=1)
        assert plain.check_monitor_top_k(trainer, None) is False
        assert plain.check_monitor_top_k(trainer, torch.tensor(9.0)) is True
    assert seen["tasktrain"] == seen["lightning"] == ([3.0, 5.0, 1.0], ["epoch=2.ckpt"], "epoch=2.ckpt")


def test_check_monitor_top_k_against_the_kth_best(tmp_path):
    for name, base in checkpoint_classes().items():
        callback = base(tmp_path / name, filename="{epoch}", monitor="score", save_top_k=2)
        trainer = run_fit(name, tmp_path / name, callback)
        # kept: 3 (epoch 0) and 1 (epoch 2); the k-th best is 3
        assert sorted(os.listdir(tmp_path / name)) == ["epoch=0.ckpt", "epoch=2.ckpt"]
        assert callback.check_monitor_top_k(trainer, torch.tensor(2.0)) is True
        assert callback.check_monitor_top_k(trainer, torch.tensor(4.0)) is False
        callback.save_top_k = -1
        assert callback.check_monitor_top_k(trainer, torch.tensor(4.0)) is True


def test_file_exists_names_the_versions_and_an_override_is_honoured(tmp_path):
    seen = {}
    for name, base in checkpoint_classes().items():
        asked = []

        class NeverThere(base):
            def file_exists(self, filepath, trainer):
                asked.append(os.path.basename(filepath))
                super().file_exists(filepath, trainer)
                return False  # a name taken is written over instead of getting "-v1"

        keep_all = dict(filename="fixed", monitor="score", save_top_k=-1)
        directory = tmp_path / name / "never"
        run_fit(name, tmp_path / name, NeverThere(directory, **keep_all))
        plain_directory = tmp_path / name / "plain"
        callback = base(plain_directory, **keep_all)
        trainer = run_fit(name, tmp_path / name, callback)
        assert callback.file_exists(str(plain_directory / "fixed.ckpt"), trainer) is True
        assert callback.file_exists(str(plain_directory / "other.ckpt"), trainer) is False
        seen[name] = (sorted(os.listdir(directory)), sorted(os.listdir(plain_directory)), asked)
    assert seen["tasktrain"] == seen["lightning"] == (
        ["fixed.ckpt"], ["fixed-v1.ckpt", "fixed-v2.ckpt", "fixed.ckpt"], ["fixed.ckpt"] * 3)


# -- profilers ------------------------------------------------------------------------------------------------------

def test_profiler_local_rank_and_pytorch_profilers_sort_keys():
    from lightning.pytorch import profilers as theirs

    from tasktrain import profilers as ours
    from tasktrain.exceptions import MisconfigurationException

    for lib in (theirs, ours):
        for profiler in (lib.SimpleProfiler(), lib.AdvancedProfiler(), lib.PassThroughProfiler(),
                         lib.PyTorchProfiler()):
            assert profiler.local_rank == 0
            profiler.setup(stage="fit", local_rank=3)
            assert profiler.local_rank == 3
    assert ours.PyTorchProfiler.AVAILABLE_SORT_KEYS == theirs.PyTorchProfiler.AVAILABLE_SORT_KEYS
    for key in sorted(ours.PyTorchProfiler.AVAILABLE_SORT_KEYS):
        ours.PyTorchProfiler(sort_by_key=key)
    with pytest.raises(MisconfigurationException, match="Found sort_by_key: cpu_tme. Should be within"):
        ours.PyTorchProfiler(sort_by_key="cpu_tme")
    with pytest.raises(Exception, match="Found sort_by_key: cpu_tme. Should be within"):
        theirs.PyTorchProfiler(sort_by_key="cpu_tme")


# -- MixedPrecision.autocast_context_manager ------------------------------------------------------------------------

def test_an_override_of_autocast_context_manager_is_the_steps_autocast(tmp_path):
    seen = {}
    for name in ("lightning", "tasktrain"):
        if name == "lightning":
            from lightning.pytorch.demos.boring_classes import BoringModel
            from lightning.pytorch.plugins import MixedPrecision
        else:
            from tasktrain.demos.boring_classes import BoringModel
            from tasktrain.plugins import MixedPrecision
        dtypes = []

        class Disabled(MixedPrecision):
            def autocast_context_manager(self):
                dtypes.append("asked")
                return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.test_enabled)

        class Notes(BoringModel):
            def training_step(self, batch, batch_idx):
                dtypes.append(self.layer(batch).dtype)
                return super().training_step(batch, batch_idx)

        for enabled in (False, True):
            plugin = Disabled("bf16-mixed", "cpu")
            plugin.test_enabled = enabled
            lib = L if name == "lightning" else tasktrain
            kwargs = {"accelerator": "cpu", "devices": 1} if name == "lightning" else {}
            trainer = lib.Trainer(max_steps=1, plugins=[plugin], logger=False, enable_progress_bar=False,
                                  enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                                  default_root_dir=tmp_path, **kwargs)
            trainer.fit(Notes())
        seen[name] = dtypes
    assert seen["tasktrain"] == seen["lightning"] == ["asked", torch.float32, "asked", torch.bfloat16]


# -- the model summary's named_modules and flop_counts ------------------------------------------------------------

def test_summary_named_modules_and_flop_counts_are_lightnings():
    from lightning.pytorch.utilities.model_summary import ModelSummary as Theirs

    from tasktrain.utilities.model_summary import ModelSummary as Ours

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
            self.head = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.head(self.body(x))

    def module(base):
        class Module(base):
            def __init__(self):
                super().__init__()
                self.net = Net()
                self.example_input_array = torch.zeros(3, 4)

            def forward(self, x):
                return self.net(x)

        return Module()

    for depth in (1, 2, -1):
        theirs, ours = Theirs(module(L.LightningModule), max_depth=depth), Ours(module(tasktrain.TaskModule), depth)
        assert [n for n, _ in ours.named_modules] == [n for n, _ in theirs.named_modules]
        assert [type(m) for _, m in ours.named_modules] == [type(m) for _, m in theirs.named_modules]
        assert ours.flop_counts == theirs.flop_counts and any(ours.flop_counts.values())
