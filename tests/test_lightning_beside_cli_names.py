"""TaskCLI beside Lightning's LightningCLI (issue 37): the classes' constructor arguments carry Lightning's type
annotations, which jsonargparse reads. Without them a mandatory argument (TensorBoardLogger's save_dir) stops the
parser ("does not specify a type") and the others are parsed untyped (a number given as a string stays a string).
The same command lines and configs go through both CLIs: loggers, callbacks, profilers, strategies and plugins by
short class name with their init_args, and Trainer arguments, and the parsed values are compared with their types.
Lightning's CLI needs jsonargparse[signatures] (requirements-dev.txt); TaskCLI's `cli` extra does not, which the last
test checks. Lightning is a test dependency, imported inside the tests only."""
import copy
import importlib
import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (tasktrain's module, Lightning's module): every class of Lightning's module (its __all__ and the rest of its
# names) that tasktrain's module has under the same name
MODULE_PAIRS = [
    ("tasktrain", "lightning.pytorch"),
    ("tasktrain.callbacks", "lightning.pytorch.callbacks"),
    ("tasktrain.callbacks.progress", "lightning.pytorch.callbacks.progress"),
    ("tasktrain.loggers", "lightning.pytorch.loggers"),
    ("tasktrain.profilers", "lightning.pytorch.profilers"),
    ("tasktrain.plugins", "lightning.pytorch.plugins"),
    ("tasktrain.plugins.io", "lightning.pytorch.plugins.io"),
    ("tasktrain.plugins.precision", "lightning.pytorch.plugins.precision"),
    ("tasktrain.plugins.environments", "lightning.pytorch.plugins.environments"),
    ("tasktrain.strategies", "lightning.pytorch.strategies"),
    ("tasktrain.accelerators", "lightning.pytorch.accelerators"),
    ("tasktrain.tuner", "lightning.pytorch.tuner"),
    ("tasktrain.cli", "lightning.pytorch.cli"),
    ("tasktrain.trainer", "lightning.pytorch.trainer"),
    ("tasktrain.utilities", "lightning.pytorch.utilities"),
    ("tasktrain.utilities.imports", "lightning.pytorch.utilities.imports"),
    ("tasktrain.utilities.model_summary", "lightning.pytorch.utilities.model_summary"),
    ("tasktrain.core.optimizer", "lightning.pytorch.core.optimizer"),
    ("tasktrain.demos.boring_classes", "lightning.pytorch.demos.boring_classes"),
    ("tasktrain.loggers.csv_logs", "lightning.pytorch.loggers.csv_logs"),
]


def unannotated(ours, theirs):
    """The parameters of the function `ours` that have no annotation where Lightning's parameter of that name has
    one."""
    try:
        mine, lightnings = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
    except (TypeError, ValueError):
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [name for name, p in mine.items() if name != "self" and p.kind not in variadic
            and p.annotation is inspect.Parameter.empty and name in lightnings
            and lightnings[name].annotation is not inspect.Parameter.empty]


def test_init_parameters_are_annotated_where_lightnings_are():
    gaps = {}
    for ours_name, theirs_name in MODULE_PAIRS:
        ours, theirs = importlib.import_module(ours_name), importlib.import_module(theirs_name)
        for name in sorted(set(getattr(theirs, "__all__", ())) | set(dir(theirs))):
            theirs_class, ours_class = getattr(theirs, name, None), getattr(ours, name, None)
            if inspect.isclass(theirs_class) and inspect.isclass(ours_class):
                missing = unannotated(ours_class.__init__, theirs_class.__init__)
                if missing:
                    gaps[f"{ours_name}.{name}"] = missing
    import tasktrain

    for method in ("fit", "validate", "test", "predict"):  # TaskCLI's subcommands take their arguments
        missing = unannotated(getattr(tasktrain.Trainer, method), getattr(L.Trainer, method))
        if missing:
            gaps[f"tasktrain.Trainer.{method}"] = missing
    assert not gaps, f"parameters without Lightning's annotation: {gaps}"


# -- the same arguments through both CLIs ---------------------------------------------------------------------------

class _Parsed(Exception):
    pass


def parsed(cli_class, model_class, args):
    """The config the CLI parsed from args (a list of words or a dict), before any class is built."""

    class ParseOnly(cli_class):
        def before_instantiate_classes(self):
            raise _Parsed(self.config)

    with pytest.raises(_Parsed) as stopped:
        ParseOnly(model_class, run=False, args=args)
    return stopped.value.args[0]


def plain(value):
    """A parsed value as plain data with its types kept; a class_path as its class's name (tasktrain's and
    Lightning's modules differ); a class's init_args as the dict of them."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        if "class_path" in value:
            return {"class": value["class_path"].rpartition(".")[2], "init_args": plain(value.get("init_args") or {})}
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def typed(value):
    """A value and the name of its type, all the way down (1 and "1" differ, as 1 and 1.0 do)."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


def same_as_lightning(mine, lightnings):
    """Lightning's keys with Lightning's values and types; tasktrain's classes may take more init_args (kept out)."""
    if isinstance(lightnings, dict) and isinstance(mine, dict):
        missing = set(lightnings) - set(mine)
        assert not missing, f"tasktrain's config lacks {sorted(missing)}"
        return {key: same_as_lightning(mine[key], lightnings[key]) for key in lightnings}
    if isinstance(lightnings, list) and isinstance(mine, list) and len(mine) == len(lightnings):
        return [same_as_lightning(m, t) for m, t in zip(mine, lightnings)]
    return mine


def models():
    from lightning.pytorch.demos.boring_classes import BoringModel as LightningBoringModel

    from tasktrain.demos.boring_classes import BoringModel

    return BoringModel, LightningBoringModel


def both(args, keys, ours_args=None):
    """The trainer's config at `keys` under TaskCLI (given ours_args, where they differ) and under LightningCLI, as
    typed plain data."""
    from lightning.pytorch.cli import LightningCLI

    from tasktrain.cli import TaskCLI

    ours_model, their_model = models()
    # (a copy each: jsonargparse writes the resolved class paths into a config dict it is given)
    mine = parsed(TaskCLI, ours_model, copy.deepcopy(args if ours_args is None else ours_args))
    lightnings = parsed(LightningCLI, their_model, copy.deepcopy(args))
    picked = {key: plain(mine[f"trainer.{key}"]) for key in keys}
    theirs = {key: plain(lightnings[f"trainer.{key}"]) for key in keys}
    return typed(same_as_lightning(picked, theirs)), typed(theirs)


DDP_ARGS = ["--trainer.strategy=DDPStrategy", "--trainer.strategy.process_group_backend=gloo",
            "--trainer.strategy.start_method=spawn", "--trainer.strategy.model_averaging_period=4"]
CASES = {
    "tensorboard": (["--trainer.logger=TensorBoardLogger", "--trainer.logger.save_dir=logs",
                     "--trainer.logger.version=3", "--trainer.logger.name=runs", "--trainer.logger.log_graph=true"],
                    ["logger"]),
    "csv": (["--trainer.logger=CSVLogger", "--trainer.logger.save_dir=logs", "--trainer.logger.version=v1",
             "--trainer.logger.flush_logs_every_n_steps=10"], ["logger"]),
    "two loggers": (["--trainer.logger+=CSVLogger", "--trainer.logger.save_dir=a",
                     "--trainer.logger+=TensorBoardLogger", "--trainer.logger.save_dir=b",
                     "--trainer.logger.sub_dir=sub"], ["logger"]),
    "callbacks": (["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss",
                   "--trainer.callbacks.patience=5", "--trainer.callbacks.min_delta=0.01",
                   "--trainer.callbacks.stopping_threshold=1", "--trainer.callbacks+=ModelCheckpoint",
                   "--trainer.callbacks.monitor=val_loss", "--trainer.callbacks.save_top_k=2",
                   "--trainer.callbacks.every_n_epochs=1", "--trainer.callbacks+=LearningRateMonitor",
                   "--trainer.callbacks.logging_interval=step", "--trainer.callbacks+=Timer",
                   "--trainer.callbacks.duration=00:01:00:00",
                   "--trainer.callbacks.interval=epoch"], ["callbacks"]),
    "simple profiler": (["--trainer.profiler=SimpleProfiler", "--trainer.profiler.dirpath=prof",
                         "--trainer.profiler.filename=p", "--trainer.profiler.extended=false"], ["profiler"]),
    "advanced profiler": (["--trainer.profiler=AdvancedProfiler", "--trainer.profiler.line_count_restriction=0.5"],
                          ["profiler"]),
    "pytorch profiler": (["--trainer.profiler=PyTorchProfiler", "--trainer.profiler.row_limit=5",
                          "--trainer.profiler.export_to_chrome=false"], ["profiler"]),
    "deepspeed": (["--trainer.strategy=DeepSpeedStrategy", "--trainer.strategy.stage=3",
                   "--trainer.strategy.offload_optimizer=true", "--trainer.strategy.logging_batch_size_per_gpu=4",
                   "--trainer.strategy.loss_scale=128"], ["strategy"]),
    "fsdp": (["--trainer.strategy=FSDPStrategy", "--trainer.strategy.sharding_strategy=SHARD_GRAD_OP",
              "--trainer.strategy.state_dict_type=sharded"], ["strategy"]),
    "model parallel": (["--trainer.strategy=ModelParallelStrategy", "--trainer.strategy.data_parallel_size=2",
                        "--trainer.strategy.tensor_parallel_size=auto"], ["strategy"]),
    "plugins": (["--trainer.plugins+=SLURMEnvironment", "--trainer.plugins.auto_requeue=false",
                 "--trainer.plugins+=MixedPrecision", "--trainer.plugins.precision=bf16-mixed",
                 "--trainer.plugins.device=cpu"], ["plugins"]),
    "trainer": (["--trainer.precision=16-mixed", "--trainer.devices=2", "--trainer.num_nodes=1",
                 "--trainer.max_time=00:00:10:00", "--trainer.limit_train_batches=0.5",
                 "--trainer.limit_val_batches=3", "--trainer.val_check_interval=10", "--trainer.gradient_clip_val=1",
                 "--trainer.deterministic=warn", "--trainer.fast_dev_run=2", "--trainer.overfit_batches=0.1",
                 "--trainer.default_root_dir=out", "--trainer.accumulate_grad_batches=4"],
                ["precision", "devices", "num_nodes", "max_time", "limit_train_batches", "limit_val_batches",
                 "val_check_interval", "gradient_clip_val", "deterministic", "fast_dev_run", "overfit_batches",
                 "default_root_dir", "accumulate_grad_batches"]),
    # a YAML config's form: class names with init_args
    "config": ({"trainer": {"logger": {"class_path": "TensorBoardLogger", "init_args": {"save_dir": "logs"}},
                            "callbacks": [{"class_path": "EarlyStopping",
                                           "init_args": {"monitor": "val_loss", "patience": "7"}}],
                            "profiler": {"class_path": "SimpleProfiler", "init_args": {"dirpath": "prof"}},
                            "strategy": {"class_path": "DeepSpeedStrategy", "init_args": {"stage": "1"}}},
                "seed_everything": False}, ["logger", "callbacks", "profiler", "strategy"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_class_names_and_init_args_parse_as_under_lightningcli(case):
    args, keys = CASES[case]
    mine, lightnings = both(args, keys)
    assert mine == lightnings


def test_ddp_and_single_device_strategy_by_their_full_path():
    """DDPStrategy and SingleDeviceStrategy, Lightning's names of tasktrain's DDP and SingleDevice, by their full path,
    and tasktrain's own names DDP / SingleDevice, take the same arguments. (The arguments given are compared.)"""
    from lightning.pytorch.cli import LightningCLI

    from tasktrain.cli import TaskCLI

    ours_model, their_model = models()
    given = ["process_group_backend", "start_method", "model_averaging_period"]
    lightnings = typed(plain(parsed(LightningCLI, their_model, DDP_ARGS)["trainer.strategy"]))
    for ours in ("tasktrain.strategies.DDPStrategy", "DDP"):
        mine = typed(plain(parsed(TaskCLI, ours_model, [f"--trainer.strategy={ours}", *DDP_ARGS[1:]])["trainer.strategy"]))
        assert [mine["init_args"][key] for key in given] == [lightnings["init_args"][key] for key in given] == \
            [("str", "gloo"), ("str", "spawn"), ("int", 4)]
    args = ["--trainer.strategy=SingleDeviceStrategy", "--trainer.strategy.device=cpu"]
    for ours in ("tasktrain.strategies.SingleDeviceStrategy", "SingleDevice"):
        mine, lightnings = both(args, ["strategy"], [f"--trainer.strategy={ours}", *args[1:]])
        assert mine["strategy"]["init_args"] == lightnings["strategy"]["init_args"]


def test_ddp_and_single_device_strategy_by_lightnings_short_names(tmp_path, monkeypatch):
    """`--trainer.strategy=DDPStrategy` / `SingleDeviceStrategy` by short name, as LightningCLI takes them: classes
    of those names (jsonargparse finds a class by the name it was defined under; they were other names of DDP and
    SingleDevice, and the parser stopped). The parsed values are Lightning's, and the strategies built are
    Lightning's names of tasktrain's."""
    from lightning.pytorch.cli import LightningCLI

    from tasktrain import DDP, SingleDevice
    from tasktrain.cli import TaskCLI
    from tasktrain.strategies import DDPStrategy, SingleDeviceStrategy

    mine, lightnings = both(DDP_ARGS, ["strategy"])
    given = ["process_group_backend", "start_method", "model_averaging_period"]
    assert [mine["strategy"]["init_args"][key] for key in given] == \
        [lightnings["strategy"]["init_args"][key] for key in given] == [("str", "gloo"), ("str", "spawn"), ("int", 4)]
    single = ["--trainer.strategy=SingleDeviceStrategy", "--trainer.strategy.device=cpu"]
    mine, lightnings = both(single, ["strategy"])
    assert mine == lightnings
    monkeypatch.chdir(tmp_path)
    rest = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--seed_everything=false"]
    ours_model, their_model = models()
    for args, ours_class, core in ((["--trainer.strategy=DDPStrategy", "--trainer.strategy.find_unused_parameters=true"],
                                    DDPStrategy, DDP), (single, SingleDeviceStrategy, SingleDevice)):
        ours = TaskCLI(ours_model, run=False, args=[*args, *rest]).trainer.strategy
        theirs = LightningCLI(their_model, run=False, args=[*args, *rest]).trainer.strategy
        assert type(ours) is ours_class and isinstance(ours, core) and type(theirs).__name__ == ours_class.__name__


def test_patience_given_as_a_string_is_an_int_and_the_objects_are_built_as_lightnings(tmp_path, monkeypatch):
    """The command line's words become Lightning's types before the classes are built: EarlyStopping's patience an
    int (a string made the first comparison with the wait count a TypeError), TensorBoardLogger's save_dir given."""
    from lightning.pytorch.cli import LightningCLI

    from tasktrain.cli import TaskCLI

    monkeypatch.chdir(tmp_path)
    args = ["--trainer.logger=TensorBoardLogger", "--trainer.logger.save_dir=logs", "--trainer.logger.version=2",
            "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss",
            "--trainer.callbacks.patience=3", "--trainer.profiler=SimpleProfiler",
            "--trainer.enable_progress_bar=false", "--seed_everything=false"]
    ours_model, their_model = models()
    built = [TaskCLI(ours_model, run=False, args=args), LightningCLI(their_model, run=False, args=args)]
    seen = []
    for cli in built:
        (stopper,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "EarlyStopping"]
        logger = cli.trainer.logger
        seen.append((type(logger).__name__, logger.save_dir, logger.version, stopper.patience, type(stopper.patience),
                     type(cli.trainer.profiler).__name__))
    assert seen[0] == seen[1] == ("TensorBoardLogger", "logs", 2, 3, int, "SimpleProfiler")


def test_taskcli_works_without_jsonargparse_signatures_extra(tmp_path):
    """The `cli` extra is jsonargparse alone: without docstring-parser and typeshed-client (jsonargparse[signatures],
    which Lightning's CLI asks for) TaskCLI parses the same class names and builds the trainer. In a fresh
    interpreter that imported nothing but TaskCLI: the classes tasktrain imports on first use (DeepSpeedStrategy,
    FSDPStrategy, ModelParallelStrategy, TQDMProgressBar, RichProgressBar) are found by their short names too."""
    script = textwrap.dedent("""
        import sys

        sys.modules["docstring_parser"] = sys.modules["typeshed_client"] = None  # not found, not importable
        from jsonargparse import _optionals
        assert not _optionals.docstring_parser_support and not _optionals.typeshed_client_support
        from tasktrain.cli import TaskCLI
        from tasktrain.demos.boring_classes import BoringModel

        class Parsed(Exception):
            pass

        class ParseOnly(TaskCLI):
            def before_instantiate_classes(self):
                raise Parsed(self.config)

        for key, name, argument in [("strategy", "DeepSpeedStrategy", "stage=3"),
                                    ("strategy", "FSDPStrategy", "state_dict_type=sharded"),
                                    ("strategy", "ModelParallelStrategy", "data_parallel_size=2"),
                                    ("callbacks+", "TQDMProgressBar", "refresh_rate=5"),
                                    ("callbacks+", "RichProgressBar", "leave=true")]:
            try:
                ParseOnly(BoringModel, run=False, args=[f"--trainer.{key}={name}",
                                                        f"--trainer.{key.rstrip('+')}.{argument}"])
            except Parsed as parsed:
                value = parsed.args[0]["trainer." + key.rstrip("+")]
                value = value[0] if isinstance(value, list) else value
                assert value.class_path.endswith("." + name), value

        cli = TaskCLI(BoringModel, run=False, args=[
            "--trainer.logger=TensorBoardLogger", "--trainer.logger.save_dir=logs", "--trainer.callbacks+=EarlyStopping",
            "--trainer.callbacks.monitor=val_loss", "--trainer.callbacks.patience=3", "--seed_everything=false"])
        (stopper,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "EarlyStopping"]
        assert cli.trainer.logger.save_dir == "logs" and stopper.patience == 3, (cli.trainer.logger.save_dir, stopper)
        print("OK")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_ddp_strategy_from_the_command_line_is_built_with_the_options_given(tmp_path, monkeypatch):
    """jsonargparse gives a strategy class every keyword its **kwargs reach (all of DistributedDataParallel's, at
    torch's defaults, output_device and process_group included): TaskCLI builds the DDP strategy (it refused them)
    and asks DistributedDataParallel for what was given only, as Lightning's DDPStrategy receives it."""
    from lightning.pytorch.cli import LightningCLI

    from tasktrain import DDP
    from tasktrain.cli import TaskCLI

    monkeypatch.chdir(tmp_path)
    args = ["--trainer.strategy.find_unused_parameters=true", "--trainer.devices=1", "--trainer.accelerator=cpu",
            "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--seed_everything=false"]
    ours_model, their_model = models()
    ours = TaskCLI(ours_model, run=False, args=["--trainer.strategy=DDP", *args]).trainer.strategy
    theirs = LightningCLI(their_model, run=False, args=["--trainer.strategy=DDPStrategy", *args]).trainer.strategy
    assert type(ours) is DDP and ours.ddp_kwargs["find_unused_parameters"] is True
    assert theirs._ddp_kwargs["find_unused_parameters"] is True
    defaults = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    assert {key: value for key, value in theirs._ddp_kwargs.items() if key not in ("output_device", "process_group")} \
        == ours.ddp_kwargs
    assert all(value == defaults[key].default for key, value in ours.ddp_kwargs.items()
               if key != "find_unused_parameters")
    # given directly: what the strategy sets itself is left out as None, an error otherwise
    assert DDP(output_device=None, process_group=None, static_graph=True).ddp_kwargs == {"static_graph": True}
    with pytest.raises(TypeError, match=r"DDP got \['output_device'\]: the strategy sets DistributedDataParallel's"):
        DDP(output_device=1)
