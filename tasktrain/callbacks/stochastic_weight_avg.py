"""StochasticWeightAveraging (SWA): from a chosen epoch on, train at the SWA learning rate and average the
weights of each epoch's end; when training ends the module holds the average.

    StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=0.8, annealing_epochs=10, annealing_strategy="cos")

- `swa_epoch_start`: an int k starts SWA at the k-th epoch (0-based epoch k - 1; 1 and 0 mean the first); a float
  in [0, 1] at that fraction of max_epochs.
- From there the optimizer's scheduler is replaced by torch's SWALR, which anneals each param group's rate to
  `swa_lrs` (a float, or one per group) over `annealing_epochs` epochs ("cos" or "linear"), then holds it.
- The average (torch's AveragedModel; equal weights unless `avg_fn` is given; kept on `device`, the CPU by
  default) takes the weights at the end of each epoch from the start epoch on, the last one included (Lightning
  averages at the start of each epoch, so its last epoch's training is left out of the average).
- Validation during SWA evaluates the average, once it holds one (as WeightAveraging does).
- A module with BatchNorm gets its running statistics recomputed for the averaged weights when training ends,
  with one pass over the training loader in train mode without gradients, calling `module(batch[0])` for a
  list/tuple batch and `module(batch)` otherwise (torch's `update_bn` convention; Lightning runs an extra epoch
  of training_step without backward instead). A module whose forward wants something else overrides
  `update_batch_norm(trainer, module)`. On several processes each rank passes over its own shard, and the ranks'
  statistics are then merged (mean of the means; mean of the variances plus the variance of the means), so every
  rank ends with the same module.
- Checkpoints hold the average as WeightAveraging's do ("state_dict" the average, "current_model_state" the
  weights being trained) and the SWALR state; a resume continues both.

One optimizer and at most one scheduler; refused where parameters are sharded (DeepSpeed ZeRO-3).
"""
import torch
from torch.optim.swa_utils import SWALR

from tasktrain.callbacks.weight_averaging import WeightAveraging


class StochasticWeightAveraging(WeightAveraging):
    def __init__(self, swa_lrs, swa_epoch_start=0.8, annealing_epochs=10, annealing_strategy="cos", avg_fn=None,
                 device=torch.device("cpu")):
        if isinstance(swa_epoch_start, bool) or not isinstance(swa_epoch_start, (int, float)) or \
                (isinstance(swa_epoch_start, int) and swa_epoch_start < 0) or \
                (isinstance(swa_epoch_start, float) and not 0.0 <= swa_epoch_start <= 1.0):
            raise ValueError(f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}): use an epoch (int >= 1, "
                             "counted from 1) or a fraction of max_epochs (float in [0, 1]).")
        lrs = swa_lrs if isinstance(swa_lrs, (list, tuple)) else [swa_lrs]
        if not lrs or any(isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0 for lr in lrs):
            raise ValueError(f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}): use a positive float, or a list of "
                             "them (one per param group).")
        if annealing_strategy not in ("cos", "linear"):
            raise ValueError(f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}): use 'cos' or "
                             "'linear'.")
        kwargs = {} if avg_fn is None else {"avg_fn": avg_fn}
        super().__init__(device=device, use_buffers=False, **kwargs)  # buffers: BatchNorm is recomputed instead
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self.swa_start = None  # the 0-based first SWA epoch, known at fit start
        self._scheduler = None
        self._scheduler_state = None

    def should_update(self, step_idx=None, epoch_idx=None):
        return epoch_idx is not None and epoch_idx >= self.swa_start

    def on_fit_start(self, trainer, module):
        if len(trainer.optimizers) != 1:
            raise ValueError(f"StochasticWeightAveraging works with one optimizer; configure_optimizers returned "
                             f"{len(trainer.optimizers)}.")
        if len(trainer.lr_scheduler_configs) > 1:
            raise ValueError("StochasticWeightAveraging replaces the learning-rate scheduler during SWA, and "
                             f"configure_optimizers returned {len(trainer.lr_scheduler_configs)}: return one at most.")
        start = self._swa_epoch_start
        if isinstance(start, float):
            if trainer.max_epochs == -1:
                raise ValueError("StochasticWeightAveraging(swa_epoch_start=<fraction>) needs max_epochs; give the "
                                 "start as an epoch number instead.")
            start = int(trainer.max_epochs * start)
        self.swa_start = max(start - 1, 0)

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch >= self.swa_start and self._scheduler is None:
            self._install_scheduler(trainer)

    def _install_scheduler(self, trainer):
        from tasktrain.trainer.optim import SchedulerConfig

        optimizer = trainer.optimizers[0]
        lrs = self._swa_lrs if isinstance(self._swa_lrs, (list, tuple)) else [self._swa_lrs] * len(optimizer.param_groups)
        if len(lrs) != len(optimizer.param_groups):
            raise ValueError(f"StochasticWeightAveraging(swa_lrs=...) has {len(lrs)} rates for "
                             f"{len(optimizer.param_groups)} param groups.")
        self._scheduler = SWALR(optimizer, swa_lr=[float(lr) for lr in lrs], anneal_epochs=self._annealing_epochs,
                                anneal_strategy=self._annealing_strategy)
        if self._scheduler_state is not None:
            self._scheduler.load_state_dict(self._scheduler_state)
        config = SchedulerConfig(self._scheduler, interval="epoch", frequency=1)
        if trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs[0] = config  # the user's scheduler stops here
        else:
            trainer.lr_scheduler_configs.append(config)

    def on_load_checkpoint(self, trainer, module, checkpoint):
        super().on_load_checkpoint(trainer, module, checkpoint)
        state = (checkpoint.get("callbacks") or {}).get(self.state_key) or {}
        if state.get("scheduler_state") is not None:
            # the checkpoint's scheduler state is SWALR's: the scheduler must be one before the trainer loads it
            self._scheduler_state = state["scheduler_state"]
            if self.swa_start is None:
                self.on_fit_start(trainer, module)
            self._install_scheduler(trainer)

    def on_train_end(self, trainer, module):
        if self._average_model is None or int(self._average_model.n_averaged) == 0:
            return  # SWA never started: the module keeps its own weights
        super().on_train_end(trainer, module)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            self.update_batch_norm(trainer, module)

    def update_batch_norm(self, trainer, module):
        """Recompute BatchNorm running statistics for the averaged weights: one pass over the training data."""
        from torch.optim.swa_utils import update_bn

        update_bn(_inputs(trainer.train_dataloader, trainer.strategy), module)
        if trainer.world_size > 1:
            _merge_batch_norm_statistics(module, trainer.strategy)

    def state_dict(self):
        return {**super().state_dict(),
                "scheduler_state": None if self._scheduler is None else self._scheduler.state_dict()}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._scheduler_state = state_dict.get("scheduler_state")

    def teardown(self, trainer, module, stage):
        super().teardown(trainer, module, stage)
        if stage == "fit":
            self._scheduler = None
            self._scheduler_state = None


def _merge_batch_norm_statistics(module, strategy):
    """Each rank saw its own shard of the training data: the statistics of the whole are the mean of the ranks'
    means, and the mean of their variances plus the variance of their means (shards of equal size). Every rank then
    holds the same module."""
    for layer in module.modules():
        if not isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) or layer.running_mean is None:
            continue
        mean = strategy.reduce(layer.running_mean, "mean")
        mean_of_squares = strategy.reduce(layer.running_mean * layer.running_mean, "mean")
        var = strategy.reduce(layer.running_var, "mean") + (mean_of_squares - mean * mean).clamp_min(0)
        layer.running_mean.copy_(mean)
        layer.running_var.copy_(var)


def _inputs(loader, strategy):
    for batch in loader:
        yield strategy.batch_to_device(batch)
