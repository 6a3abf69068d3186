"""tasktrain: a thin, honest PyTorch trainer. Names are imported on first use to keep `import tasktrain` cheap."""
import logging

from tasktrain.version import __version__

# The "tasktrain" logger shows INFO messages (rank_zero_info, seed_everything's "Seed set to N") on stderr where the
# program has not configured logging itself, as Lightning's package logger does; with a root handler it propagates.
_logger = logging.getLogger(__name__)
_logger.setLevel(logging.INFO)
if not logging.getLogger().hasHandlers():
    _logger.addHandler(logging.StreamHandler())
    _logger.propagate = False

_NAMES = {
    "TaskModule": "tasktrain.trainer.module",
    "Trainer": "tasktrain.trainer.trainer",
    "DataModule": "tasktrain.trainer.datamodule",
    "seed_everything": "tasktrain.trainer.seed",
    "Accelerator": "tasktrain.compat.accelerate.accelerator",
    "Callback": "tasktrain.callbacks.base",
    "Logger": "tasktrain.callbacks.base",
    "ModelCheckpoint": "tasktrain.callbacks.checkpoint",
    "EarlyStopping": "tasktrain.callbacks.early_stopping",
    "GradientClipping": "tasktrain.callbacks.clipping",
    "ProgressBar": "tasktrain.callbacks.progress",
    "TQDMProgressBar": "tasktrain.callbacks.progress",
    "RichProgressBar": "tasktrain.callbacks.progress",
    "TensorBoardLogger": "tasktrain.loggers",
    "CSVLogger": "tasktrain.loggers",
    "WandbLogger": "tasktrain.loggers",
    "MLFlowLogger": "tasktrain.loggers",
    "LearningRateMonitor": "tasktrain.callbacks.lr_monitor",
    "Timer": "tasktrain.callbacks.timer",
    "LambdaCallback": "tasktrain.callbacks.lambda_function",
    "OnExceptionCheckpoint": "tasktrain.callbacks.on_exception_checkpoint",
    "GradientAccumulationScheduler": "tasktrain.callbacks.gradient_accumulation_scheduler",
    "BasePredictionWriter": "tasktrain.callbacks.prediction_writer",
    "WeightAveraging": "tasktrain.callbacks.weight_averaging",
    "EMAWeightAveraging": "tasktrain.callbacks.weight_averaging",
    "StochasticWeightAveraging": "tasktrain.callbacks.stochastic_weight_avg",
    "ThroughputMonitor": "tasktrain.callbacks.throughput_monitor",
    "BaseFinetuning": "tasktrain.callbacks.finetuning",
    "BackboneFinetuning": "tasktrain.callbacks.finetuning",
    "ModelSummary": "tasktrain.callbacks.model_summary",
    "DeviceStatsMonitor": "tasktrain.callbacks.device_stats_monitor",
    "SpikeDetection": "tasktrain.callbacks.spike",
    "ModelPruning": "tasktrain.callbacks.pruning",
    "Tuner": "tasktrain.tuner",
    "TaskCLI": "tasktrain.cli.task_cli",
    "cli_lightning_logo": "tasktrain.cli.task_cli",  # Lightning has it at lightning.pytorch.cli_lightning_logo
    "Strategy": "tasktrain.strategies.base",
    "SingleDevice": "tasktrain.strategies.single_device",
    "DDP": "tasktrain.strategies.ddp",
    "DataParallel": "tasktrain.strategies.data_parallel",
    "DeepSpeed": "tasktrain.strategies.deepspeed",
    "FSDP": "tasktrain.strategies.fsdp",
    "ModelParallelStrategy": "tasktrain.strategies.model_parallel",
    "CheckpointError": "tasktrain.checkpoint_io",
    "init_empty_weights": "tasktrain.inference.empty",
    "save_model": "tasktrain.inference.saving",
    # Accelerate's top-level names (`from accelerate import X` -> `from tasktrain import X`); docs/accelerator.md
    "PartialState": "tasktrain.compat.accelerate.state",
    "AcceleratorState": "tasktrain.compat.accelerate.state",
    "skip_first_batches": "tasktrain.trainer.accelerator",
    "DistributedType": "tasktrain.compat.accelerate.utils.dataclasses",
    "DataLoaderConfiguration": "tasktrain.compat.accelerate.utils.dataclasses",
    "ProjectConfiguration": "tasktrain.compat.accelerate.utils.dataclasses",
    "GradientAccumulationPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "DeepSpeedPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "FullyShardedDataParallelPlugin": "tasktrain.compat.accelerate.utils.dataclasses",
    "InitProcessGroupKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "DistributedDataParallelKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "DDPCommunicationHookType": "tasktrain.compat.accelerate.utils.dataclasses",
    "GradScalerKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "AutocastKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "ProfileKwargs": "tasktrain.compat.accelerate.utils.dataclasses",
    "find_executable_batch_size": "tasktrain.compat.accelerate.utils.memory",
    "notebook_launcher": "tasktrain.compat.accelerate.launchers",
    "ParallelismConfig": "tasktrain.compat.accelerate.parallelism_config",  # issue 39
    "disable_possible_user_warnings": "tasktrain.compat.lightning.utilities.warnings",  # lightning.pytorch's too
    # lightning.pytorch's top-level names besides its classes: a banner, and lightning_utilities' module check
    "LIGHTNING_LOGO": "tasktrain.compat.lightning",
    "module_available": "tasktrain.compat.lightning.utilities.imports",
}

__all__ = ["__version__", *_NAMES]


def __getattr__(name):
    if name in _NAMES:
        import importlib

        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:  # `import tasktrain as pl; pl.loggers.CSVLogger(...)`, as Lightning's import allows
        import importlib

        return importlib.import_module(f"tasktrain.{name}")
    raise AttributeError(f"module 'tasktrain' has no attribute {name!r}")


_SUBPACKAGES = ("callbacks", "loggers", "utilities", "strategies", "trainer", "core", "profilers", "tuner", "cli",
                "data", "accelerator", "utils", "inference", "checkpoint_io", "exceptions", "demos", "plugins",
                "accelerators", "loops", "overrides")


def __dir__():
    return sorted(__all__)


# Lightning's switch, read when the package is imported: POSSIBLE_USER_WARNINGS=0 (or off) silences them all
if __import__("os").environ.get("POSSIBLE_USER_WARNINGS", "").lower() in ("0", "off"):
    import warnings as _warnings

    from tasktrain.exceptions import PossibleUserWarning as _PossibleUserWarning

    _warnings.filterwarnings("ignore", category=_PossibleUserWarning)  # (disable_possible_user_warnings(), cheaply)
