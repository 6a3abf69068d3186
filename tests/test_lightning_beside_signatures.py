"""Lightning 2.6's public signatures beside tasktrain's (the rename rule of docs/lightning.md): for each public class
and function Lightning's public modules export, and each public method Lightning's classes define, the parameters'
names, order, kinds and defaults are compared with tasktrain's of the same (renamed) name. A difference fails the test
unless ALLOWED below names it, with the difference as it is and why it is kept; an entry whose difference went away
fails too, so the list stays true."""
import enum
import os
import warnings
import importlib
import inspect

import pytest
import torch

pytest.importorskip("lightning")

RENAMED = {"LightningModule": "TaskModule", "LightningDataModule": "DataModule", "LightningCLI": "TaskCLI"}
MODULES = ["", ".callbacks", ".callbacks.progress", ".loggers", ".profilers", ".strategies", ".plugins",
           ".plugins.precision", ".plugins.environments", ".plugins.io", ".plugins.layer_sync", ".tuner",
           ".accelerators", ".core", ".loops", ".cli", ".utilities", ".utilities.combined_loader",
           ".utilities.model_summary", ".utilities.rank_zero", ".utilities.seed", ".utilities.memory",
           ".utilities.parsing", ".utilities.grads", ".utilities.data", ".utilities.compile",
           ".utilities.model_helpers", ".utilities.parameter_tying", ".utilities.migration",
           ".utilities.signature_utils"]


def _default(value):
    """A default as compared: Lightning's and tasktrain's functions and classes by name (their objects differ), a
    string enum by its value (Lightning's `Interval.step` is the string "step")."""
    if value is inspect.Parameter.empty:
        return "-"
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if inspect.isclass(value) or inspect.isfunction(value):
        return f"<{RENAMED.get(value.__name__, value.__name__)}>"
    if isinstance(value, tuple) and value and all(inspect.isclass(v) for v in value):
        return "(" + ", ".join(_default(v) for v in value) + ")"
    return repr(value)


def _params(function):
    """(name, kind, default) of each parameter. *args and **kwargs by kind alone (their names are nobody's
    business); the `cls` of Lightning's load_from_checkpoint (a descriptor of its own, not a classmethod) left out."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    params = []
    for p in signature.parameters.values():
        name = {p.VAR_POSITIONAL: "*args", p.VAR_KEYWORD: "**kwargs"}.get(p.kind, p.name)
        params.append((name, p.kind.name.lower(), _default(p.default)))
    if params and params[0][0] == "cls":
        params = params[1:]
    return params


def _difference(theirs, ours):
    """A short description of how `ours` differs from `theirs` ("" where they match)."""
    theirs, ours = _params(theirs), _params(ours)
    if theirs is None or ours is None or theirs == ours:
        return ""
    their_names, our_names = [p[0] for p in theirs], [p[0] for p in ours]
    parts = []
    missing = [n for n in their_names if n not in our_names]
    extra = [n for n in our_names if n not in their_names]
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"extra {extra}")
    their_by, our_by = {p[0]: p for p in theirs}, {p[0]: p for p in ours}
    positional = [n for n in their_names if their_by[n][1].startswith("positional")]  # (keyword-only: no order)
    if [n for n in positional if n in our_names] != [n for n in our_names if n in positional]:
        parts.append("order")
    # a call by position binds Lightning's n-th parameter to ours: the same name at each of Lightning's positions
    # (an extra of ours before one of Lightning's moves it)
    our_positional = [p[0] for p in ours if p[1].startswith("positional")]
    moved = [n for i, n in enumerate(positional) if n in our_by and our_positional[i:i + 1] != [n]]
    if moved and "order" not in parts:
        parts.append(f"positions of {moved}")
    for name in their_names:
        if name in our_by and their_by[name][1] != our_by[name][1]:
            parts.append(f"{name} kind {their_by[name][1]} -> {our_by[name][1]}")
        if name in our_by and their_by[name][2] != our_by[name][2]:
            parts.append(f"{name} default {their_by[name][2]} -> {our_by[name][2]}")
    if not parts:  # the same names in the same order and kinds: a position differs
        parts.append(f"positions {their_names} -> {our_names}")
    return "; ".join(parts)


def _takes_nothing(self):
    pass


def _lightning_public_names():
    """(module suffix, Lightning's name, Lightning's class or function, tasktrain's of the renamed name or None) for
    each public class and function Lightning's MODULES export, each once."""
    seen = set()
    for suffix in MODULES:
        theirs_module = importlib.import_module("lightning.pytorch" + suffix)
        ours_module = importlib.import_module("tasktrain" + suffix)
        # (not identifiers: classes jsonargparse's class_from_function set on the module that called it, e.g.
        # "test_x__<locals>__build_model_class" after a LightningCLI given a builder function in the same process)
        names = getattr(theirs_module, "__all__", None) or [n for n in dir(theirs_module)
                                                             if not n.startswith("_") and n.isidentifier()]
        for name in names:
            theirs = getattr(theirs_module, name, None)
            if not (inspect.isclass(theirs) or inspect.isfunction(theirs)) or id(theirs) in seen:
                continue
            origin = getattr(theirs, "__module__", None) or ""
            if not origin.startswith("lightning.") or (not hasattr(theirs_module, "__all__") and not origin.startswith(
                    theirs_module.__name__)):
                continue  # torch's, Python's, and names a module without __all__ imported from elsewhere
            seen.add(id(theirs))
            yield suffix, name, theirs, getattr(ours_module, RENAMED.get(name, name), None)


def differences():
    """{qualified tasktrain name: difference}, over Lightning's public names."""
    found = {}
    for suffix, name, theirs, ours in _lightning_public_names():
        our_name = f"tasktrain{suffix}.{RENAMED.get(name, name)}"
        if ours is None:
            found[our_name] = "absent"
            continue
        if inspect.isfunction(theirs) or not inspect.isclass(ours):
            found[our_name] = _difference(theirs, ours)
            continue
        # (a class without an __init__ of its own in Lightning takes no arguments: object's (self, /, *args,
        # **kwargs) is not a signature to copy)
        their_init = theirs.__init__ if theirs.__init__ is not object.__init__ else _takes_nothing
        our_init = ours.__init__ if ours.__init__ is not object.__init__ else _takes_nothing
        found[our_name + ".__init__"] = _difference(their_init, our_init)
        for attribute in dir(theirs):
            if attribute.startswith("_"):
                continue
            owner = next(c for c in theirs.__mro__ if attribute in vars(c))
            if not (owner.__module__ or "").startswith("lightning"):
                continue  # torch's nn.Module methods, Python's
            if not callable(getattr(theirs, attribute)) or isinstance(vars(owner)[attribute], property):
                continue
            our_method = getattr(ours, attribute, None)
            if our_method is None or not callable(our_method):
                continue  # (absent ones: test_lightnings_public_methods_and_class_attributes_are_there_or_allowed)
            found[f"{our_name}.{attribute}"] = _difference(getattr(theirs, attribute), our_method)
    return {name: difference for name, difference in found.items() if difference}




# Kinds of kept difference, each shared by many names below
REDUCE_KEYWORDS = ("Lightning's reduce(tensor, group=None, reduce_op='mean') by position and keyword (a group other "
                   "than None refused, naming torch.distributed.all_reduce), plus tasktrain's op= keyword-only after "
                   "them (its Trainer's calls); SingleDeviceStrategy's takes those where Lightning's has "
                   "(tensor, *args, **kwargs)")
REFUSED_PLUGIN = ("tasktrain does not run bitsandbytes, Transformer Engine or XLA: building the plugin raises a "
                  "ValueError naming the alternative, whatever the arguments (docs/lightning.md, Plugins)")
PROFILER_SETUP = ("tasktrain's is_global_zero and module, keyword parameters with defaults after Lightning's (the "
                  "Trainer passes them): a call as Lightning's is the same")

ALLOWED = {
    'tasktrain.Trainer.__init__':
        ("extra ['stall_timeout', 'max_restarts']; num_nodes default 1 -> None",
         "tasktrain's stall_timeout (the watchdog) and max_restarts (elastic restarts) are keyword-only with defaults; num_nodes None is what the launcher formed (torchrun's nodes), else 1: Lightning's 1 without a launcher (docs/trainer.md)"),
    'tasktrain.Trainer.predict':
        ("extra ['gather']",
         "tasktrain's gather=True (every rank's predictions, in dataset order), keyword-only after Lightning's parameters"),
    'tasktrain.DataModule.__init__':
        ("missing ['*args', '**kwargs']",
         "Lightning's takes *args, **kwargs and uses none; a subclass's __init__ is its own"),
    'tasktrain.TaskModule.__init__':
        ("missing ['*args', '**kwargs']",
         "Lightning's forwards *args, **kwargs to torch.nn.Module.__init__, which refuses any: the same calls work"),
    'tasktrain.TaskModule.forward':
        ("missing ['**kwargs']",
         "torch.nn.Module's forward (it raises, as Lightning's super().forward does); a module's own forward replaces it"),
    'tasktrain.TaskModule.log':
        ("extra ['reduce']",
         "reduce=, tasktrain's older spelling of reduce_fx, keyword with a default after Lightning's parameters"),
    'tasktrain.TaskModule.log_dict':
        ("missing ['prog_bar', 'logger', 'on_step', 'on_epoch', 'reduce_fx', 'enable_graph', 'sync_dist', 'sync_dist_group', 'add_dataloader_idx', 'batch_size', 'rank_zero_only']; extra ['**kwargs']",
         "each keyword goes to self.log, which has Lightning's parameters and defaults (a wrong name is log's TypeError)"),
    'tasktrain.TaskModule.to_tensorrt':
        ("missing ['file_path', 'input_sample', 'ir', 'output_format', 'retrace', 'default_device']; extra ['*args']",
         'refused whatever the arguments: NotImplementedError naming to_onnx (tasktrain ships no TensorRT export)'),
    'tasktrain.TaskModule.training_step':
        ("missing ['*args', '**kwargs']; extra ['batch', 'batch_idx']",
         "a module's own step replaces it; both Trainers call it by position (batch, batch_idx)"),
    'tasktrain.callbacks.ModelCheckpoint.__init__':
        ("extra ['async_save']",
         "tasktrain's async_save, keyword with a default after Lightning's parameters"),
    'tasktrain.callbacks.ThroughputMonitor.__init__':
        ("missing ['**kwargs']; extra ['window_size', 'separator', 'peak_flops', 'measure_flops', 'step_split']",
         "Lightning's **kwargs are its Throughput's (window_size, separator, ...): named here, with its defaults"),
    'tasktrain.loggers.LitLogger.__init__':
        ("missing ['root_dir', 'name', 'teamspace', 'metadata', 'store_step', 'log_model', 'save_logs', 'checkpoint_name']; extra ['*args', '**kwargs']",
         'refused when created, whatever the arguments (tasktrain/loggers/absent.py says what to use)'),
    'tasktrain.loggers.LitLogger.finalize':
        ("status default None -> -",
         "LitLogger cannot be created (above); its finalize is tasktrain's Logger's (both Trainers pass the status)"),
    'tasktrain.loggers.LitLogger.log_hyperparams':
        ("missing ['metrics']; extra ['*args', '**kwargs']",
         'LitLogger cannot be created (above)'),
    'tasktrain.loggers.MLFlowLogger.__init__':
        ("extra ['checkpoint_path_prefix']",
         "tasktrain's checkpoint_path_prefix, keyword with a default after Lightning's parameters"),
    'tasktrain.loggers.TensorBoardLogger.log_metrics':
        ("extra ['**kwargs']",
         "**kwargs (walltime, ...) go to SummaryWriter's add_scalar; Lightning's calls are the same"),
    'tasktrain.profilers.Profiler.setup':
        ("extra ['is_global_zero', 'module']",
         PROFILER_SETUP),
    'tasktrain.profilers.AdvancedProfiler.setup':
        ("extra ['is_global_zero', 'module']",
         PROFILER_SETUP),
    'tasktrain.profilers.PassThroughProfiler.setup':
        ("extra ['is_global_zero', 'module']",
         PROFILER_SETUP),
    'tasktrain.profilers.PyTorchProfiler.setup':
        ("extra ['is_global_zero', 'module']",
         PROFILER_SETUP),
    'tasktrain.profilers.SimpleProfiler.setup':
        ("extra ['is_global_zero', 'module']",
         PROFILER_SETUP),
    'tasktrain.profilers.XLAProfiler':
        ('absent',
         'XLA / TPU: tasktrain runs on CPUs and CUDA GPUs (docs/lightning.md)'),
    'tasktrain.strategies.DDPStrategy.__init__':
        ("extra ['precision', 'sync_batchnorm']",
         "tasktrain's precision= (a name) and sync_batchnorm=, keyword-only after Lightning's parameters"),
    'tasktrain.strategies.DDPStrategy.reduce':
        ("extra ['op']",
         REDUCE_KEYWORDS),
    'tasktrain.strategies.DeepSpeedStrategy.reduce':
        ("extra ['op']",
         REDUCE_KEYWORDS),
    'tasktrain.strategies.FSDPStrategy.reduce':
        ("extra ['op']",
         REDUCE_KEYWORDS),
    'tasktrain.strategies.ModelParallelStrategy.__init__':
        ("extra ['accelerator', 'precision', 'data_parallel_replicate_size', 'wrap', 'reshard_after_forward', 'cpu_offload', 'mixed_precision', 'activation_checkpointing']",
         "tasktrain's options (docs/model_parallel.md) after Lightning's parameters, which keep their positions"),
    'tasktrain.strategies.ModelParallelStrategy.reduce':
        ("extra ['op']",
         REDUCE_KEYWORDS),
    'tasktrain.strategies.ParallelStrategy.__init__':
        ("missing ['parallel_devices', 'cluster_environment', 'checkpoint_io', 'precision_plugin']; extra ['precision', 'process_group_backend', 'timeout', 'start_method']",
         "an abstract base (ProcessWorld + Strategy, the engines' contract: DESIGN.md): its concrete strategies take Lightning's arguments; ParallelStrategy.parallel_devices can be set, as Lightning's"),
    'tasktrain.strategies.ParallelStrategy.reduce':
        ("extra ['op']",
         REDUCE_KEYWORDS),
    'tasktrain.strategies.SingleDeviceStrategy.__init__':
        ("extra ['precision']; device default 'cpu' -> None",
         "device None is the Trainer's accelerator's device (Lightning's 'cpu' would not follow accelerator='gpu'); precision= keyword-only"),
    'tasktrain.strategies.SingleDeviceStrategy.reduce':
        ("missing ['*args', '**kwargs']; extra ['group', 'reduce_op', 'op']",
         REDUCE_KEYWORDS),
    'tasktrain.strategies.Strategy.__init__':
        ("missing ['checkpoint_io', 'precision_plugin']; extra ['precision']",
         "tasktrain's Strategy base is its engines' contract (DESIGN.md); its concrete strategies take Lightning's checkpoint_io / precision_plugin"),
    'tasktrain.strategies.Strategy.reduce':
        ("extra ['op']",
         REDUCE_KEYWORDS),
    'tasktrain.plugins.AsyncCheckpointIO.load_checkpoint':
        ("missing ['*args', '**kwargs']; extra ['path', 'map_location', 'weights_only']",
         "Lightning's forwards *args, **kwargs to the CheckpointIO it wraps: named here, that interface's"),
    'tasktrain.plugins.AsyncCheckpointIO.remove_checkpoint':
        ("missing ['*args', '**kwargs']; extra ['path']",
         'as load_checkpoint'),
    'tasktrain.plugins.AsyncCheckpointIO.save_checkpoint':
        ("missing ['*args', '**kwargs']; extra ['checkpoint', 'path', 'storage_options']",
         'as load_checkpoint'),
    'tasktrain.plugins.TorchCheckpointIO.load_checkpoint':
        ('map_location default <<lambda>> -> None',
         "None reads onto the CPU, as Lightning's default function (lambda storage, loc: storage) does"),
    'tasktrain.plugins.XLACheckpointIO.load_checkpoint':
        ('map_location default <<lambda>> -> None',
         'XLACheckpointIO cannot be created (XLA / TPU, docs/lightning.md)'),
    'tasktrain.plugins.BitsandbytesPrecision.__init__':
        ("missing ['mode', 'dtype', 'ignore_modules']; extra ['*args', '**kwargs']",
         REFUSED_PLUGIN),
    'tasktrain.plugins.TransformerEnginePrecision.__init__':
        ("missing ['weights_dtype', 'recipe', 'replace_layers', 'fallback_compute_dtype']; extra ['*args', '**kwargs']",
         REFUSED_PLUGIN),
    'tasktrain.plugins.FSDPPrecision.clip_grad_by_norm':
        ("missing ['*args', '**kwargs']; extra ['optimizer', 'clip_val']",
         "Lightning's refuses norm clipping there; tasktrain's FSDP2 clips by norm through the strategy (docs/fsdp.md)"),
    'tasktrain.plugins.XLAPrecision.__init__':
        ("missing ['precision']; extra ['*args', '**kwargs']",
         REFUSED_PLUGIN),
    'tasktrain.accelerators.MPSAccelerator':
        ('absent',
         'Apple MPS: tasktrain runs on CPUs and CUDA GPUs'),
    'tasktrain.accelerators.XLAAccelerator':
        ('absent',
         'XLA / TPU: tasktrain runs on CPUs and CUDA GPUs'),
    'tasktrain.accelerators.find_usable_cuda_devices':
        ('absent',
         'not provided (left out: docs/lightning.md, Utilities)'),
    'tasktrain.cli.LightningArgumentParser.__init__':
        ("description default 'Lightning Trainer command line tool' -> 'Train and evaluate with tasktrain; each subcommand has --help.'",
         "the --help text's words, tasktrain's"),
    'tasktrain.cli.TaskCLI.__init__':
        ("trainer_class default <Trainer> -> None; parser_class default <LightningArgumentParser> -> None",
         "trainer_class None is tasktrain.Trainer, imported on use; parser_class None is tasktrain.cli.LightningArgumentParser, made on first use (jsonargparse is the `cli` extra)"),
    'tasktrain.cli.ReduceLROnPlateau.__init__':
        ("missing ['*args', '**kwargs']; extra ['mode', 'factor', 'patience', 'threshold', 'threshold_mode', 'cooldown', 'min_lr', 'eps']",
         "Lightning's forwards *args, **kwargs to torch's ReduceLROnPlateau: named here, torch's"),
    'tasktrain.utilities.model_summary.ModelSummary.__init__':
        ("extra ['input_array']",
         "tasktrain's input_array (the input to measure sizes with), keyword with a default after Lightning's"),
    'tasktrain.utilities.model_helpers.get_torchvision_model':
        ('absent',
         'not provided (torchvision is not a dependency)'),
}


def test_signatures_are_lightnings_or_allowed():
    found = differences()
    unexpected = {name: difference for name, difference in found.items()
                  if name not in ALLOWED or ALLOWED[name][0] != difference}
    gone = sorted(name for name in ALLOWED if name not in found)
    assert not unexpected, f"signatures that differ from Lightning's (fix them, or add to ALLOWED with why): {unexpected}"
    assert not gone, f"ALLOWED names that match Lightning's now (remove them): {gone}"
    assert all(reason for _, reason in ALLOWED.values())


# -- public methods and class attributes of Lightning's classes that tasktrain's lack -------------------------------

def _assigned_attributes(cls):
    """The names `self.<name> = ...` assigns in the code of tasktrain's classes in cls's MRO (instance attributes:
    where Lightning has a property, tasktrain may keep a plain attribute)."""
    import ast
    import textwrap

    names = set()
    for klass in cls.__mro__:
        if not (klass.__module__ or "").startswith("tasktrain"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                        names.add(leaf.attr)
    return names


def absent_attributes():
    """{Lightning's attribute as "<module>.<class>.<name>" of the class that defines it, "lightning." left out:
    [tasktrain's classes that lack it]}: every public method, property and class attribute of each of Lightning's
    public classes (the MODULES walk of differences()) that tasktrain's class of the renamed name neither has nor
    assigns in its code. Keyed by where Lightning defines the attribute, so an entry covers every subclass (a
    strategy's by its name alone: "pytorch.strategies.*.<name>")."""
    found = {}
    for suffix, name, theirs, ours in _lightning_public_names():
        if not inspect.isclass(theirs) or not inspect.isclass(ours):
            continue  # (absent classes: test_signatures_are_lightnings_or_allowed)
        assigned = None
        for attribute in dir(theirs):
            if attribute.startswith("_"):
                continue
            owner = next(c for c in theirs.__mro__ if attribute in vars(c))
            if not (owner.__module__ or "").startswith("lightning") or hasattr(ours, attribute):
                continue
            assigned = _assigned_attributes(ours) if assigned is None else assigned
            if attribute not in assigned:
                key = f"{owner.__module__.removeprefix('lightning.')}.{owner.__qualname__}.{attribute}"
                if key.startswith("pytorch.strategies."):  # (one entry for every strategy class: which of
                    key = f"pytorch.strategies.*.{attribute}"  # Lightning's defines it does not matter here)
                found.setdefault(key, []).append(f"tasktrain{suffix}.{RENAMED.get(name, name)}")
    return found


# Kinds of leaving out, each shared by several entries below
ACCELERATOR_REGISTRY = ("Lightning's AcceleratorRegistry, filled by classmethods: tasktrain's accelerator names are "
                        "'cpu', 'cuda' / 'gpu' and 'auto'")
REFUSED_LOGGER = ("LitLogger needs a lightning.ai account: importable, and refused when built (tasktrain/loggers/"
                  "absent.py), so there is no object to call it on")
TRAINER_ATTRIBUTE = ("a plain instance attribute, set from the Trainer's argument in Trainer.__init__'s "
                     "self.__dict__.update(...) (arguments.py): read as Lightning's property")

ALLOWED_ABSENT = {
    "fabric.accelerators.accelerator.Accelerator.register_accelerators": ACCELERATOR_REGISTRY,
    "pytorch.accelerators.cpu.CPUAccelerator.register_accelerators": ACCELERATOR_REGISTRY,
    "pytorch.accelerators.cuda.CUDAAccelerator.register_accelerators": ACCELERATOR_REGISTRY,
    "pytorch.accelerators.cuda.CUDAAccelerator.set_nvidia_flags":
        "Lightning's Trainer logs CUDA_VISIBLE_DEVICES with it at set-up; tasktrain's prints the resolved devices once "
        "on rank 0 (DESIGN.md, Launch)",
    "pytorch.plugins.precision.fsdp.FSDPPrecision.mixed_precision_config":
        "FSDP1's torch.distributed.fsdp.MixedPrecision for FSDP1's wrapper: tasktrain's FSDP is fully_shard (FSDP2), "
        "whose policy is a MixedPrecisionPolicy; an override is refused (ENGINE_REFUSED_HOOKS)",
    "pytorch.core.hooks.ModelHooks.configure_sharded_model":
        "deprecated in Lightning (configure_model replaces it): a module that defines it is refused before the run "
        "with a NotImplementedError naming configure_model (trainer.py, _check_module)",
    "pytorch.loggers.litlogger.LitLogger.LOGGER_JOIN_CHAR": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.get_file": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.log_file": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.log_metadata": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.log_model": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.log_model_artifact": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.sub_dir": REFUSED_LOGGER,
    "pytorch.loggers.litlogger.LitLogger.url": REFUSED_LOGGER,
    "pytorch.trainer.trainer.Trainer.default_root_dir": TRAINER_ATTRIBUTE,
    "pytorch.trainer.trainer.Trainer.max_epochs": TRAINER_ATTRIBUTE,
    "pytorch.trainer.trainer.Trainer.max_steps": TRAINER_ATTRIBUTE,
    "pytorch.trainer.trainer.Trainer.min_epochs": TRAINER_ATTRIBUTE,
    "pytorch.trainer.trainer.Trainer.min_steps": TRAINER_ATTRIBUTE,
    "pytorch.strategies.*.mixed_precision_config":
        "FSDP1's MixedPrecision: tasktrain's FSDP is fully_shard (FSDP2), whose policy is a MixedPrecisionPolicy",
}


def test_lightnings_public_methods_and_class_attributes_are_there_or_allowed():
    """A Lightning user calls or overrides these by name: an attribute tasktrain lacks is missing unless
    ALLOWED_ABSENT says why it is left out; an entry tasktrain now has fails too."""
    found = absent_attributes()
    unexpected = {key: classes for key, classes in found.items() if key not in ALLOWED_ABSENT}
    gone = sorted(key for key in ALLOWED_ABSENT if key not in found)
    assert not unexpected, ("public methods / class attributes of Lightning's classes that tasktrain's lack (add "
                            f"them, or to ALLOWED_ABSENT with why): {unexpected}")
    assert not gone, f"ALLOWED_ABSENT names that tasktrain has now (remove them): {gone}"
    assert all(ALLOWED_ABSENT.values())


def test_isinstance_relations_are_lightnings():
    import lightning.pytorch.plugins as their_plugins

    import tasktrain.plugins as our_plugins
    from tasktrain.strategies import DDP, DDPStrategy, SingleDevice, SingleDeviceStrategy

    # Lightning's names of tasktrain's strategies (the strategy tree beside Lightning's:
    # tests/test_lightning_beside_strategy_tree.py)
    assert issubclass(DDPStrategy, DDP) and issubclass(SingleDeviceStrategy, SingleDevice)
    for plugins in (their_plugins, our_plugins):  # every precision plugin Lightning's Trainer takes is a Precision
        for plugin in (plugins.MixedPrecision("bf16-mixed", "cpu"), plugins.HalfPrecision("bf16-true"),
                       plugins.DoublePrecision(), plugins.Precision(), plugins.DeepSpeedPrecision("bf16-mixed"),
                       plugins.FSDPPrecision("bf16-true")):
            assert isinstance(plugin, plugins.Precision), type(plugin)
        for refused in ("BitsandbytesPrecision", "TransformerEnginePrecision", "XLAPrecision"):
            assert issubclass(getattr(plugins, refused), plugins.Precision)
    import lightning.pytorch as pl

    import tasktrain
    from tasktrain.callbacks import Checkpoint, ProgressBar

    for lib, checkpoint, bar in ((pl, pl.callbacks.Checkpoint, pl.callbacks.ProgressBar),
                                 (tasktrain, Checkpoint, ProgressBar)):
        assert issubclass(lib.callbacks.ModelCheckpoint, checkpoint)
        assert issubclass(lib.callbacks.OnExceptionCheckpoint, checkpoint)
        assert issubclass(lib.callbacks.TQDMProgressBar, bar) and issubclass(lib.callbacks.RichProgressBar, bar)
        assert issubclass(lib.loggers.CSVLogger, lib.loggers.Logger)
        assert issubclass(lib.loggers.TensorBoardLogger, lib.loggers.Logger)


def test_ddp_strategy_takes_lightnings_arguments_by_position():
    from lightning.pytorch.plugins import TorchCheckpointIO as TheirIO
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP
    from lightning.pytorch.strategies import SingleDeviceStrategy as TheirSingle

    from tasktrain.plugins import TorchCheckpointIO
    from tasktrain.strategies import DDPStrategy, SingleDeviceStrategy

    theirs_io, our_io = TheirIO(), TorchCheckpointIO()
    assert TheirDDP(None, None, None, theirs_io).checkpoint_io is theirs_io
    assert DDPStrategy(None, None, None, our_io).checkpoint_io is our_io
    assert TheirSingle("cpu", None, theirs_io).checkpoint_io is theirs_io
    assert SingleDeviceStrategy("cpu", None, our_io).checkpoint_io is our_io
    with pytest.raises(TypeError):  # tasktrain's own precision= by keyword only
        DDPStrategy(None, None, None, None, None, None, None, None, None, None, None, "popen", "bf16-mixed")


class _Pickled:
    """An object a checkpoint holds pickled: a weights_only load refuses it."""


def _run_test_from(lib, module_cls, path, weights_only):
    trainer = lib.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=False, accelerator="cpu", devices=1)
    return trainer.test(module_cls(), ckpt_path=path, weights_only=weights_only, verbose=False)


def test_validate_test_predict_take_weights_only(tmp_path):
    """Lightning's trainer.test(model, ckpt_path=..., weights_only=False) reads a checkpoint holding a pickled
    object; weights_only=True refuses it; likewise validate and predict here."""
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel as TheirBoring

    import tasktrain
    from tasktrain.demos.boring_classes import BoringModel as OurBoring

    paths = {}
    for lib, module_cls in ((pl, TheirBoring), (tasktrain, OurBoring)):
        class Saving(module_cls):
            def on_save_checkpoint(self, checkpoint):
                checkpoint["extra"] = _Pickled()

        trainer = lib.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                              enable_checkpointing=False, accelerator="cpu", devices=1, limit_val_batches=0)
        trainer.fit(Saving())
        paths[lib] = str(tmp_path / f"{lib.__name__}.ckpt")
        trainer.save_checkpoint(paths[lib])
        assert _run_test_from(lib, module_cls, paths[lib], weights_only=False)
        with pytest.raises(Exception, match="(?i)weights_only|unpickl|pickle"):
            _run_test_from(lib, module_cls, paths[lib], weights_only=True)
    trainer = tasktrain.Trainer(logger=False, enable_progress_bar=False, accelerator="cpu", devices=1)
    assert trainer.validate(OurBoring(), ckpt_path=paths[tasktrain], weights_only=False, verbose=False)
    assert trainer.predict(OurBoring(), ckpt_path=paths[tasktrain], weights_only=False)
    with pytest.raises(ValueError, match="weights_only"):
        trainer.predict(OurBoring(), ckpt_path=paths[tasktrain], weights_only="yes")
    # Lightning's parameter name: model=
    assert trainer.validate(model=OurBoring(), verbose=False)


def test_load_from_checkpoint_takes_hparams_file_and_weights_only(tmp_path):
    import lightning.pytorch as pl
    import yaml

    import tasktrain

    (tmp_path / "hparams.yaml").write_text(yaml.safe_dump({"hidden": 7}))
    results = {}
    for lib in (pl, tasktrain):
        base = pl.LightningModule if lib is pl else tasktrain.TaskModule

        class Net(base):
            def __init__(self, hidden=3):
                super().__init__()
                self.save_hyperparameters()
                self.layer = torch.nn.Linear(2, 2)

        path = tmp_path / f"{lib.__name__}.ckpt"
        module = Net()
        torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "extra": _Pickled(),
                    "pytorch-lightning_version": pl.__version__}, path)
        with pytest.raises(Exception, match="(?i)weights_only|unpickl|pickle"):
            Net.load_from_checkpoint(path, weights_only=True)
        loaded = Net.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.yaml", weights_only=False)
        results[lib] = (loaded.hparams.hidden, Net.load_from_checkpoint(path, weights_only=False).hparams.hidden)
        with pytest.raises(ValueError, match=r"\.csv, \.yml or \.yaml is required for `hparams_file`"):
            Net.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.json", weights_only=False)
    assert results[pl] == results[tasktrain] == (7, 3)


def test_rank_zero_functions_point_where_lightnings_do():
    import logging

    from lightning.pytorch.utilities import rank_zero as theirs

    from tasktrain.utilities import rank_zero as ours

    def where(module):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.rank_zero_warn("w")  # (this line)
            module.rank_zero_deprecation("d")
        return [(w.lineno, w.category.__name__.endswith("DeprecationWarning")) for w in caught]

    assert where(theirs) == where(ours)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    for name in ("lightning.pytorch.utilities.rank_zero", "tasktrain"):
        logging.getLogger(name).addHandler(handler)
    old_levels = {}
    try:
        for name in ("lightning.pytorch.utilities.rank_zero", "tasktrain"):
            old_levels[name] = logging.getLogger(name).level
            logging.getLogger(name).setLevel(logging.INFO)
        theirs.rank_zero_info("i")
        ours.rank_zero_info("i")
        theirs.rank_zero_info("i", stacklevel=5)  # (the caller's caller: pytest's)
        ours.rank_zero_info("i", stacklevel=5)
    finally:
        for name, level in old_levels.items():
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).setLevel(level)
    lines = [(r.funcName, r.filename, r.lineno) for r in records if r.getMessage() == "i"]
    assert len(lines) == 4 and lines[0][:2] == lines[1][:2] == ("test_rank_zero_functions_point_where_lightnings_do",
                                                                os.path.basename(__file__)) and lines[2] == lines[3]


@pytest.mark.parametrize("deterministic", [None, True, False, "warn"])
def test_deterministic_flags_are_lightnings(deterministic):
    import lightning.pytorch as pl

    import tasktrain

    def flags():
        return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.benchmark)

    before = flags()
    seen = []
    try:
        for lib in (pl, tasktrain):
            torch.use_deterministic_algorithms(True, warn_only=True)  # a setting of the script's own
            torch.backends.cudnn.benchmark = True
            lib.Trainer(deterministic=deterministic, logger=False, enable_progress_bar=False, accelerator="cpu",
                        devices=1)
            seen.append(flags())
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
    assert seen[0] == seen[1]


def test_save_config_callback_takes_save_to_log_dir():
    from lightning.pytorch.cli import SaveConfigCallback as Theirs

    from tasktrain.cli import SaveConfigCallback as Ours

    for cls in (Theirs, Ours):
        with pytest.raises(ValueError, match="`save_to_log_dir=False` only makes sense when subclassing"):
            cls(None, None, save_to_log_dir=False)

        class Elsewhere(cls):
            def save_config(self, trainer, pl_module, stage):
                pass

        assert Elsewhere(None, None, save_to_log_dir=False).save_to_log_dir is False


def test_strategy_reduce_takes_lightnings_keywords():
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP
    from lightning.pytorch.strategies import SingleDeviceStrategy as TheirSingle

    from tasktrain.strategies import DDPStrategy, SingleDeviceStrategy

    for reduce_op in ("sum", "avg", "MEAN", "max", torch.distributed.ReduceOp.SUM):  # one process: itself
        for theirs, ours in ((TheirDDP(), DDPStrategy()), (TheirSingle("cpu"), SingleDeviceStrategy("cpu"))):
            assert theirs.reduce(torch.tensor(2.0), reduce_op=reduce_op) == 2.0
            assert ours.reduce(torch.tensor(2.0), reduce_op=reduce_op) == 2.0
    for strategy in (DDPStrategy(), SingleDeviceStrategy("cpu")):
        with pytest.raises(ValueError, match="torch.distributed.all_reduce"):
            strategy.reduce(torch.tensor(1.0), group=object())
        with pytest.raises(ValueError, match="reduce_op="):
            strategy.reduce(torch.tensor(1.0), reduce_op="product")


def _keyword_calling(base, theirs, hooks, calls):
    """A user's subclass of `base` whose every hook in `hooks` calls super()'s by keyword, with the names Lightning's
    class `theirs` gives that hook's parameters (`super().setup(trainer=trainer, pl_module=pl_module, stage=stage)`);
    what Lightning's signature takes in *args / **kwargs is left out, as such a call must."""
    class KeywordCalling(base):
        pass

    def override(hook, names):
        def call(self, *args, **kwargs):
            kwargs.update(zip(names, args))
            calls.append(hook)
            return getattr(super(KeywordCalling, self), hook)(**{k: v for k, v in kwargs.items() if k in names})
        return call

    for hook in hooks:
        parameters = list(inspect.signature(getattr(theirs, hook)).parameters.values())[1:]  # (self)
        setattr(KeywordCalling, hook, override(hook, [p.name for p in parameters
                                                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]))
    return KeywordCalling


# each shipped callback as a user's subclass builds it: (name, arguments, the hooks besides the events it defines)
KEYWORD_CALLBACKS = [
    ("BackboneFinetuning", lambda tmp: {"unfreeze_backbone_at_epoch": 1},
     ["finetune_function", "freeze_before_training"]),
    ("BasePredictionWriter", lambda tmp: {"write_interval": "batch_and_epoch"}, []),
    ("GradientAccumulationScheduler", lambda tmp: {"scheduling": {0: 1, 1: 2}}, []),
    ("LearningRateMonitor", lambda tmp: {}, []),
    ("OnExceptionCheckpoint", lambda tmp: {"dirpath": str(tmp)}, []),
    ("StochasticWeightAveraging", lambda tmp: {"swa_lrs": 0.05, "swa_epoch_start": 1}, []),
    ("ThroughputMonitor", lambda tmp: {"batch_size_fn": lambda batch: batch.size(0)}, []),
    ("Timer", lambda tmp: {"duration": {"minutes": 5}}, []),
    ("WeightAveraging", lambda tmp: {}, []),
    ("EMAWeightAveraging", lambda tmp: {}, []),
]


@pytest.mark.parametrize("name, arguments, extra_hooks", KEYWORD_CALLBACKS, ids=[c[0] for c in KEYWORD_CALLBACKS])
def test_shipped_callbacks_take_lightnings_keywords(tmp_path, name, arguments, extra_hooks):
    """A callback subclass written for Lightning, whose hooks call super()'s by Lightning's parameter names, runs on
    tasktrain's shipped callbacks as on Lightning's (fit, test, predict, and a failing fit), and the same hooks run."""
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel as TheirBoring

    import tasktrain
    from tasktrain.callbacks.base import EVENTS
    from tasktrain.demos.boring_classes import BoringModel as OurBoring

    their_cls = getattr(pl.callbacks, name)
    own = {hook for cls in their_cls.__mro__[:their_cls.__mro__.index(pl.Callback)] for hook in vars(cls)}
    hooks = [hook for hook in EVENTS if hook in own] + extra_hooks
    assert hooks
    seen = {}
    for lib, boring in ((pl, TheirBoring), (tasktrain, OurBoring)):
        class Net(boring):
            def __init__(self, fail=False):
                super().__init__()
                self.backbone = torch.nn.Linear(32, 32)
                self.fail = fail

            def forward(self, x):
                return self.layer(self.backbone(x))

            def training_step(self, batch, batch_idx):
                if self.fail and self.global_step == 1:
                    raise RuntimeError("a failing step")
                return super().training_step(batch, batch_idx)

            def configure_optimizers(self):
                return torch.optim.SGD(self.layer.parameters(), lr=0.1)

        calls = seen[lib] = []
        base = getattr(lib.callbacks, name)
        if name == "BasePredictionWriter":
            class Writer(base):
                def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                                       dataloader_idx):
                    calls.append("write_on_batch_end")

                def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
                    calls.append("write_on_epoch_end")

            base = Writer
        callback_cls = _keyword_calling(base, their_cls, hooks, calls)
        folder = tmp_path / lib.__name__

        def trainer():
            return lib.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, limit_test_batches=1,
                               limit_predict_batches=1, callbacks=[callback_cls(**arguments(folder))],
                               logger=lib.loggers.CSVLogger(folder), enable_progress_bar=False,
                               enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=folder,
                               enable_checkpointing=name == "OnExceptionCheckpoint")  # (a Checkpoint: no other)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = trainer()
            fitted.fit(Net())
            fitted.test(Net(), verbose=False)
            fitted.predict(Net())
            if name == "OnExceptionCheckpoint":
                with pytest.raises(RuntimeError, match="a failing step"):
                    trainer().fit(Net(fail=True))
                assert (folder / "on_exception.ckpt").is_file()
    assert seen[tasktrain] and set(seen[tasktrain]) == set(seen[pl]), (seen[pl], seen[tasktrain])


def test_state_input_and_status_by_lightnings_keywords():
    """load_state_dict(state_dict=...), a precision plugin's convert_input(data=...) and a logger's finalize(status=...)
    by keyword, as Lightning's; finalize without a status is a TypeError in both."""
    import lightning.pytorch as pl

    import tasktrain

    for lib in (pl, tasktrain):
        for callback in (lib.callbacks.ModelCheckpoint(), lib.callbacks.Timer(duration="00:00:01:00")):
            callback.load_state_dict(state_dict=callback.state_dict())
        for plugin in (lib.plugins.Precision(), lib.plugins.DoublePrecision(), lib.plugins.HalfPrecision("bf16-true"),
                       lib.plugins.MixedPrecision("bf16-mixed", "cpu")):
            assert plugin.convert_input(data=torch.ones(1)).dtype in (torch.float32, torch.float64, torch.bfloat16)
            plugin.load_state_dict(state_dict=plugin.state_dict())
        assert lib.plugins.DoublePrecision().convert_input(data=torch.ones(1)).dtype == torch.float64
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for lib in (pl, tasktrain):
            for logger in (lib.loggers.CSVLogger(folder), lib.loggers.TensorBoardLogger(folder)):
                logger.finalize(status="success")
                with pytest.raises(TypeError):
                    logger.finalize()


def test_hook_annotations_are_lightnings():
    """The base Callback's and TaskModule's hooks carry Lightning's type annotations (resolved, Lightning's classes
    named by tasktrain's names), for type checkers and tools that read them."""
    import typing

    import lightning.pytorch as pl
    import lightning.pytorch.callbacks.callback as their_callback
    import lightning.pytorch.core.module as their_module

    import tasktrain.callbacks.base as our_callback
    import tasktrain.trainer.module as our_module
    from tasktrain.trainer.optim import LightningOptimizer
    from tasktrain.trainer.trainer import Trainer

    renamed = {"lightning.pytorch.trainer.trainer.": "", "lightning.pytorch.core.module.LightningModule": "TaskModule",
               "lightning.pytorch.core.optimizer.": "", "lightning.pytorch.callbacks.callback.": "",
               "tasktrain.trainer.trainer.": "", "tasktrain.trainer.module.": "", "tasktrain.trainer.optim.": "",
               "tasktrain.callbacks.base.": ""}

    def hints(function, namespace):
        found = {}
        for name, hint in typing.get_type_hints(function, globalns=namespace).items():
            text = str(hint)
            for old, new in renamed.items():
                text = text.replace(old, new)
            found[name] = text
        return found

    # (their annotations name classes imported only for type checkers: the namespace resolves them)
    ours = {**vars(our_module), **vars(our_callback), "Trainer": Trainer, "TaskModule": our_module.TaskModule,
            "Callback": our_callback.Callback, "LightningOptimizer": LightningOptimizer}
    hooks = our_callback.EVENTS + ("state_dict", "load_state_dict")
    for hook in hooks:
        theirs = hints(getattr(pl.Callback, hook), vars(their_callback))
        assert theirs == hints(getattr(our_callback.Callback, hook), ours), hook
    module_hooks = [hook for hook in hooks if hasattr(our_module.TaskModule, hook)] + [
        "prepare_data", "configure_model", "configure_callbacks", "on_validation_model_eval",
        "on_validation_model_train", "on_validation_model_zero_grad", "on_test_model_eval", "on_test_model_train",
        "on_predict_model_eval", "on_before_batch_transfer", "on_after_batch_transfer", "transfer_batch_to_device",
        "lr_scheduler_step", "backward", "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping",
        "train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"]
    for hook in module_hooks:
        if hook in ("state_dict", "load_state_dict"):
            continue  # (torch's nn.Module methods)
        theirs = hints(getattr(pl.LightningModule, hook), vars(their_module))
        assert theirs and theirs == hints(getattr(our_module.TaskModule, hook), ours), hook
