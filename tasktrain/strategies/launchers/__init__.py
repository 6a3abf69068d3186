"""Lightning's `lightning.pytorch.strategies.launchers` names: the classes of what `strategy.launcher` is
(tasktrain/strategies/world.py), so that `isinstance(trainer.strategy.launcher, _SubprocessScriptLauncher)` holds as
under Lightning. tasktrain's launchers take their own arguments: build a Trainer with strategy="ddp" /
"ddp_spawn" rather than a launcher."""
from tasktrain.strategies.launcher import SubprocessLauncher as _SubprocessScriptLauncher
from tasktrain.strategies.spawn import SpawnLauncher as _MultiProcessingLauncher

__all__ = ["_SubprocessScriptLauncher", "_MultiProcessingLauncher"]
