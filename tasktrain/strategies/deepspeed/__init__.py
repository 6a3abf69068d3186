"""DeepSpeed ZeRO through DeepSpeed's own engine (`strategy="deepspeed"`, "deepspeed_stage_2", ...).

The package, by what a reader looks for:
    strategy.py    the DeepSpeed strategy: the contract of strategies/base.py mapped onto the engine
    config.py      the config the engine runs with ("auto" values filled from the run; offload to disk checked)
    checkpoint.py  checkpoint directories: file names, and the converters to and from plain checkpoints
    universal.py   DeepSpeed's universal checkpoint: other numbers of processes and ZeRO stages
    engine.py      what is changed around DeepSpeed 0.19.8's engine, each for a named reason

Importing it never imports deepspeed: that happens when a run sets up (engine.import_deepspeed).
"""
from tasktrain.strategies.deepspeed.checkpoint import (ENGINE_TAG, SIXTEEN_BIT_FILE, STATE_FILE, convert_to_deepspeed,
                                                       convert_zero_checkpoint)
from tasktrain.strategies.deepspeed.config import (AIO_DEFAULTS, DEFAULT_STAGE, NVME_DEFAULTS,  # noqa: F401
                                                   _clip_norm_of, build_config, check_nvme_offload)
from tasktrain.strategies.deepspeed.engine import import_deepspeed
from tasktrain.strategies.deepspeed.strategy import DeepSpeed, DeepSpeedPrecision

__all__ = ["AIO_DEFAULTS", "DEFAULT_STAGE", "ENGINE_TAG", "NVME_DEFAULTS", "SIXTEEN_BIT_FILE", "STATE_FILE", "DeepSpeed",
           "DeepSpeedPrecision", "build_config", "check_nvme_offload", "convert_to_deepspeed",
           "convert_zero_checkpoint", "import_deepspeed"]
