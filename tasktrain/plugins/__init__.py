"""Lightning's Trainer plugins under their names (`from tasktrain.plugins import MixedPrecision`; `lightning.pytorch`
renamed to `tasktrain`, docs/lightning.md): precision plugins, checkpoint I/O, cluster environments and layer
synchronization, for `Trainer(plugins=[...])`. The Trainer sorts them as Lightning does (tasktrain/trainer/
plugin_args.py) and hands each to the strategy (trainer.strategy.precision_plugin, .checkpoint_io)."""
from tasktrain.plugins.environments import ClusterEnvironment
from tasktrain.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO, XLACheckpointIO
from tasktrain.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from tasktrain.plugins.precision import (BitsandbytesPrecision, DeepSpeedPrecision, DoublePrecision, FSDPPrecision,
                                         HalfPrecision, MixedPrecision, Precision, TransformerEnginePrecision,
                                         XLAPrecision)

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO", "XLACheckpointIO", "BitsandbytesPrecision",
           "DeepSpeedPrecision", "DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision",
           "TransformerEnginePrecision", "FSDPPrecision", "XLAPrecision", "LayerSync", "TorchSyncBatchNorm",
           "ClusterEnvironment"]
