"""StochasticWeightAveraging (SWA), as Lightning 2.6 defines it: from a chosen epoch on, train at the SWA learning
rate and keep an equal-weight average of the weights; when training ends the module holds the average.

    StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=0.8, annealing_epochs=10, annealing_strategy="cos",
                              avg_fn=None, device=torch.device("cpu"))

- `swa_epoch_start`: an int k >= 1 starts SWA at the k-th epoch (0-based epoch k - 1); a float in [0, 1] at epoch
  int(fraction * max_epochs) counted the same way.
- `swa_lrs`: a positive float, or a list of positive floats (one per param group). From the first SWA epoch the
  optimizer's scheduler is replaced by torch's SWALR, which anneals each group's rate to its SWA rate over
  `annealing_epochs` epochs ("cos" or "linear") and then holds it; it steps at each epoch's end.
- The average (`_average_model`: a deep copy of the module made at the set-up of each run, fit, validate, test or
  predict, as Lightning's, its trainer reference dropped; its parameters averaged there, kept on `device`; None: the module's device) takes the weights
  at the start of each epoch from the first SWA epoch to the last one (Lightning's rule: the first SWA epoch's start
  averages the weights the earlier epochs left, and the last epoch's training is not in the average).
  `avg_fn(averaged, current, n_averaged)` replaces the equal-weight mean.
- The average goes into the module when the fit reaches max_epochs (or with max_epochs=-1, whenever it ends); a
  fit stopped before its last epoch keeps the trained weights, as Lightning's does. Validation during SWA
  evaluates the weights being trained.
- A module with BatchNorm gets its running statistics recomputed for the averaged weights after the transfer,
  with one pass over the training loader in train mode without gradients, calling `module(batch[0])` for a
  list/tuple batch and `module(batch)` otherwise (torch's `update_bn` convention; a module whose forward wants
  something else overrides `update_batch_norm(trainer, module)`). Lightning runs one more training epoch whose
  steps skip the backward instead: the statistics are the same cumulative mean, but its optimizer still steps there
  (with the last gradients in fp32; an error under 16-mixed, Lightning issue #17245), moving the weights off the
  average: here the module ends with the average. On several processes the ranks'
  statistics are merged, so every rank ends with the same module.
- Its checkpoint state is Lightning's: `n_averaged`, `latest_update_epoch`, `scheduler_state` (SWALR's) and
  `average_model_state` (the averaged copy's state_dict: the module's keys); a resume continues the average and the
  schedule. The copy is kept after the fit, as Lightning's.

Wrong settings raise MisconfigurationException (a ValueError) where Lightning does: in the constructor, and at fit
start for several optimizers, several schedulers, or a fractional start with max_epochs=-1; at set-up (of any stage)
under a sharding strategy (FSDP, DeepSpeed), as Lightning.
"""
import logging
from copy import deepcopy
from typing import Callable, Literal, Optional, Union

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import SWALR

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException

_AVG_FN = Callable[[Tensor, Tensor, Tensor], Tensor]


def _rank_zero_info(trainer, message):
    if trainer.is_global_zero:  # Lightning's rank_zero_info: a log record at INFO (the "tasktrain" logger shows it)
        logging.getLogger("tasktrain").info(message)


class StochasticWeightAveraging(Callback):
    def __init__(
        self,
        swa_lrs: Union[float, list[float]],
        swa_epoch_start: Union[int, float] = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: Literal["cos", "linear"] = "cos",
        avg_fn: Optional[_AVG_FN] = None,
        device: Optional[Union[torch.device, str]] = torch.device("cpu"),
    ):
        start_ok = (isinstance(swa_epoch_start, int) and swa_epoch_start >= 1) or \
            (isinstance(swa_epoch_start, float) and 0.0 <= swa_epoch_start <= 1.0)
        if not start_ok:
            raise MisconfigurationException(
                "swa_epoch_start should be a >0 integer or a float between 0 and 1. Got "
                f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}) (an int is the epoch counted from 1, "
                "a float a fraction of max_epochs).")
        lrs_ok = (isinstance(swa_lrs, float) and swa_lrs > 0) or \
            (isinstance(swa_lrs, list) and all(isinstance(lr, float) and lr > 0 for lr in swa_lrs))
        if not lrs_ok:
            raise MisconfigurationException(
                f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}): the swa_lrs should be a positive float, or a list "
                "of positive floats (one per param group); write 1.0, not 1.")
        if avg_fn is not None and not callable(avg_fn):
            raise MisconfigurationException(f"StochasticWeightAveraging(avg_fn={avg_fn!r}): the avg_fn should be "
                                            "callable as avg_fn(averaged, current, n_averaged).")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise MisconfigurationException(f"StochasticWeightAveraging(device={device!r}): device is expected to be "
                                            "a torch.device or a str (or None: the module's device).")
        # torch's SWALR would refuse these only when SWA begins, epochs into the run
        if annealing_strategy not in ("cos", "linear"):
            raise MisconfigurationException(f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}): "
                                            "use 'cos' or 'linear'.")
        if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise MisconfigurationException(f"StochasticWeightAveraging(annealing_epochs={annealing_epochs!r}): use an "
                                            "integer >= 0.")
        self.n_averaged: Optional[Tensor] = None
        self.momenta: dict = {}
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self._model_contains_batch_norm: Optional[bool] = None
        self._average_model: Optional[nn.Module] = None
        self._initialized = False
        self._swa_scheduler = None
        self._scheduler_state: Optional[dict] = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._max_epochs: Optional[int] = None

    # -- Lightning's public helpers ----------------------------------------------------------------------------------
    @property
    def swa_start(self) -> int:
        """The first SWA epoch, 0-based (known once fit has started when swa_epoch_start is a fraction)."""
        if not isinstance(self._swa_epoch_start, int):
            raise RuntimeError("StochasticWeightAveraging.swa_start is known once fit has started: swa_epoch_start "
                               f"={self._swa_epoch_start} is a fraction of max_epochs.")
        return max(self._swa_epoch_start - 1, 0)

    @property
    def swa_end(self) -> int:
        """The last SWA epoch, 0-based (infinite with max_epochs=-1)."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pl_module.modules())

    @staticmethod
    def avg_fn(averaged_model_parameter: Tensor, model_parameter: Tensor, num_averaged: Tensor) -> Tensor:
        """The equal-weight running mean."""
        return averaged_model_parameter + (model_parameter - averaged_model_parameter) / (num_averaged + 1)

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: Tensor, avg_fn: _AVG_FN) -> None:
        """Fold `model`'s parameters into `average_model`'s (the first update copies them); n_averaged += 1."""
        with torch.no_grad():
            for averaged, current in zip(average_model.parameters(), model.parameters()):
                current = current.detach().to(averaged.device)
                averaged.copy_(current if n_averaged == 0 else avg_fn(averaged.detach(), current,
                                                                      n_averaged.to(averaged.device)))
        n_averaged += 1

    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        """Copy the parameters (not the buffers) of `src_pl_module` into `dst_pl_module`."""
        with torch.no_grad():
            for src, dst in zip(src_pl_module.parameters(), dst_pl_module.parameters()):
                dst.copy_(src.to(dst.device))

    def reset_batch_norm_and_save_state(self, pl_module: nn.Module) -> None:
        """BatchNorm statistics back to their initial values and momentum None (a cumulative mean), the momenta
        kept in `self.momenta` for reset_momenta."""
        self.momenta = {}
        for layer in pl_module.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.running_mean is not None:
                layer.reset_running_stats()
                self.momenta[layer] = layer.momentum
                layer.momentum = None

    def reset_momenta(self) -> None:
        for layer, momentum in self.momenta.items():
            layer.momentum = momentum

    # -- events ----------------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        from tasktrain.strategies.base import Sharded

        if isinstance(trainer.strategy, Sharded):  # every stage, as Lightning (FSDP, DeepSpeed)
            raise MisconfigurationException(
                f"SWA does not currently support sharded models: {type(trainer.strategy).__name__} shards the "
                "parameters or the optimizer. Use strategy='ddp' (or a single device), or EMAWeightAveraging.")
        if stage == "fit":
            # a fit starts SWA afresh (a checkpoint's state is loaded after set-up), also with this callback reused
            self._initialized, self._swa_scheduler, self._scheduler_state = False, None, None
            self._resume_pending = False
            self.n_averaged, self._init_n_averaged, self._latest_update_epoch = None, 0, -1
        # Lightning's, at the set-up of every stage (validate / test / predict too, replacing a fit's average with a
        # copy of the module as it is then): a deep copy of the whole module (the TaskModule's pickled state drops its
        # trainer), before the strategy moves it; a sharded strategy never gets here (refused above)
        self._average_model = deepcopy(pl_module)

    def on_fit_start(self, trainer, pl_module):
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException(f"SWA currently works with 1 `optimizer`; configure_optimizers returned "
                                            f"{len(trainer.optimizers)}.")
        if len(trainer.lr_scheduler_configs) > 1:
            raise MisconfigurationException(
                "SWA currently not supported for more than 1 `lr_scheduler` (it replaces the scheduler when SWA "
                f"begins); configure_optimizers returned {len(trainer.lr_scheduler_configs)}.")
        self._resolve_start(trainer)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        if getattr(self, "_resume_pending", False):  # before the trainer loads the schedulers' states
            self._resume_pending = False
            self._initialize(trainer, pl_module)

    def _resolve_start(self, trainer):
        self._max_epochs = trainer.max_epochs
        if isinstance(self._swa_epoch_start, float):
            if trainer.max_epochs == -1:
                raise MisconfigurationException(
                    "SWA with `swa_epoch_start` as a float is not supported when `max_epochs=-1`. Please provide "
                    "`swa_epoch_start` as an integer.")
            self._swa_epoch_start = int(trainer.max_epochs * self._swa_epoch_start)

    def on_train_epoch_start(self, trainer, pl_module):
        epoch = trainer.current_epoch
        in_swa = self.swa_start <= epoch <= self.swa_end
        if in_swa and not self._initialized:
            self._initialize(trainer, pl_module)
        if in_swa and epoch > self._latest_update_epoch:
            self.update_parameters(self._average_model, pl_module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    def _initialize(self, trainer, pl_module):
        from tasktrain.trainer.optim import SchedulerConfig

        self._initialized = True
        self._average_model = self._average_model.to(self._device or pl_module.device)
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        if len(self._swa_lrs) != len(optimizer.param_groups):
            raise MisconfigurationException(f"StochasticWeightAveraging(swa_lrs=...) has {len(self._swa_lrs)} rates "
                                            f"for {len(optimizer.param_groups)} param groups: give one per group.")
        for lr, group in zip(self._swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr  # as Lightning: the optimizer's state then holds it too
        # Lightning's last_epoch (SWALR's rates do not depend on it; its state_dict does)
        last_epoch = {"cos": trainer.max_epochs, "linear": -1}[self._annealing_strategy]
        self._swa_scheduler = SWALR(optimizer, swa_lr=self._swa_lrs, anneal_epochs=self._annealing_epochs,
                                    anneal_strategy=self._annealing_strategy, last_epoch=last_epoch)
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
        elif trainer.current_epoch != self.swa_start:
            import warnings

            warnings.warn("SWA is initializing after swa_start without any checkpoint data: the average starts "
                          f"at epoch {trainer.current_epoch}, not {self.swa_start}, and the SWA schedule from its "
                          "beginning.", UserWarning)
        config = SchedulerConfig(self._swa_scheduler, interval="epoch", frequency=1)
        if trainer.lr_scheduler_configs:
            previous = trainer.lr_scheduler_configs[0]
            if previous.scheduler is self._swa_scheduler:
                pass
            else:
                if previous.interval != "epoch" or previous.frequency != 1:
                    import warnings

                    warnings.warn(f"SWA is currently only supported every epoch. Found {previous}", UserWarning)
                _rank_zero_info(trainer, f"Swapping scheduler `{type(previous.scheduler).__name__}` for "
                                          f"`{type(self._swa_scheduler).__name__}`")
            trainer.lr_scheduler_configs[0] = config
        else:
            trainer.lr_scheduler_configs.append(config)
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=pl_module.device)

    def on_train_epoch_end(self, trainer, *args):
        """Lightning's signature: its SWA clears its loop's skip-backward flag here; tasktrain's loop has none."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        # The checkpoint's scheduler state is SWALR's once SWA had begun: SWALR must be the trainer's scheduler
        # before the trainer loads the schedulers' states (Lightning clears the configs for the same reason).
        state = (checkpoint.get("callbacks") or {}).get(self.state_key) or {}
        if state.get("scheduler_state") is None or self._initialized:
            return
        self.load_state_dict(state)
        self._resume_pending = True  # SWALR is set up at on_fit_start, once the optimizer exists (Lightning's order)

    def on_train_end(self, trainer, pl_module):
        # the trainer counted the last epoch before this event: current_epoch - 1 is the last one trained
        if self._average_model is None or self.n_averaged is None or int(self.n_averaged) == 0:
            return  # SWA never began: the module keeps its weights
        if trainer.current_epoch - 1 != self.swa_end and self._max_epochs != -1:
            return  # stopped before the last epoch: Lightning keeps the trained weights then
        self.transfer_weights(self._average_model, pl_module)
        if self._model_contains_batch_norm:
            self.reset_batch_norm_and_save_state(pl_module)
            try:
                self.update_batch_norm(trainer, pl_module)
            finally:
                self.reset_momenta()

    def update_batch_norm(self, trainer, pl_module):
        """Recompute BatchNorm running statistics for the averaged weights: one pass over the training data in
        train mode without gradients (momentum None: the cumulative mean over the batches)."""
        was_training = pl_module.training
        pl_module.train()
        from tasktrain.trainer.loaders import train_loaders_read

        batches = train_loaders_read(trainer)  # (the loop's loaders: the global generator draws nothing here)
        if isinstance(batches, (dict, list, tuple)):  # several training loaders: their batches as the fit combined them
            from tasktrain.trainer.combined import CombinedLoader

            batches = (combined for combined, _, _ in CombinedLoader(batches, "max_size_cycle"))
        with torch.no_grad():
            for batch in batches:
                batch = trainer.strategy.move_batch(batch)
                pl_module(batch[0] if isinstance(batch, (list, tuple)) else batch)
        pl_module.train(was_training)
        if trainer.world_size > 1:
            _merge_batch_norm_statistics(pl_module, trainer.strategy)

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def state_dict(self):
        return {
            "n_averaged": 0 if self.n_averaged is None else int(self.n_averaged.item()),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if self._average_model is None else self._average_model.state_dict(),
        }

    def load_state_dict(self, state_dict):
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        if self.n_averaged is not None:
            self.n_averaged.fill_(self._init_n_averaged)
        if self._average_model is not None and state_dict.get("average_model_state") is not None:
            self._average_model.load_state_dict(state_dict["average_model_state"])


def _merge_batch_norm_statistics(module, strategy):
    """Each rank saw its own shard of the training data: the statistics of the whole are the mean of the ranks'
    means, and the mean of their variances plus the variance of their means (shards of equal size). Every rank then
    holds the same module."""
    for layer in module.modules():
        if not isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) or layer.running_mean is None:
            continue
        mean = strategy.reduce(layer.running_mean, op="mean")
        mean_of_squares = strategy.reduce(layer.running_mean * layer.running_mean, op="mean")
        var = strategy.reduce(layer.running_var, op="mean") + (mean_of_squares - mean * mean).clamp_min(0)
        layer.running_mean.copy_(mean)
        layer.running_var.copy_(var)
