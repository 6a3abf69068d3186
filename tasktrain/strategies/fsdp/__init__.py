"""FSDP: torch's fully sharded data parallel (FSDP2, `torch.distributed.fsdp.fully_shard`).

The package, by what a reader looks for:
    strategy.py    the FSDP strategy: the contract of strategies/base.py over fully_shard
    sharding.py    how fully_shard is applied and fed (units, policy, meta modules, optimizers on the shards)
    checkpoint.py  checkpoint directories (DCP shards + our state file) and the converters to and from plain ones
"""
from tasktrain.strategies.fsdp.checkpoint import (STATE_FILE, convert_fsdp_checkpoint, convert_fsdp_state_dir,
                                                  convert_to_fsdp, is_fsdp_checkpoint)
from tasktrain.strategies.fsdp.sharding import _check_resettable  # noqa: F401 (an import path tests use)
from tasktrain.strategies.fsdp.strategy import FSDP, FSDPPrecision

__all__ = ["FSDP", "FSDPPrecision", "STATE_FILE", "convert_fsdp_checkpoint", "convert_fsdp_state_dir", "convert_to_fsdp",
           "is_fsdp_checkpoint"]
