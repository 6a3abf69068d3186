"""Weight averaging: keep an average of the weights along training (EMA or SWA) and evaluate with it.

WeightAveraging keeps a `torch.optim.swa_utils.AveragedModel` of the module, updated after every optimizer step
(or whatever `should_update(step_idx=..., epoch_idx=...)` says). During validation the averaged weights are
swapped in (`_swap_models`; before the first update the average is the copy made at set-up, as in Lightning); when
training ends they are copied into the module for good (`_copy_average_to_current`). The AveragedModel stays on the
callback after fit (`_average_model`, as Lightning's). Keyword arguments go to AveragedModel
(`avg_fn`, `multi_avg_fn`); without one it is the equal-weight average (SWA). `use_buffers=True` (the default,
unlike AveragedModel's) averages the buffers too (BatchNorm statistics). A module that overrides `configure_model`
gets Lightning's warning and the hook is called before the copy is made.

Checkpoints hold the averaged weights under "state_dict" (what load_from_checkpoint and inference get), the
weights being trained under "current_model_state", and the average's own counters under "averaging_state"; a
resume puts each back. A checkpoint made without WeightAveraging loads into both the module and the average (with
Lightning's warning); a checkpoint saved or loaded outside fit gets Lightning's note or warning.

EMAWeightAveraging is WeightAveraging with `decay` (W_avg <- decay * W_avg + (1 - decay) * W, first update a copy),
`update_every_n_steps`, `update_starting_at_step` and `update_starting_at_epoch`.

The average is a full copy of the module on each rank: a strategy that shards parameters (DeepSpeed ZeRO-3, FSDP)
cannot give it full weights, and is refused at set-up.
"""
import itertools
import logging
import warnings
from copy import deepcopy
from typing import Optional, Union

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from tasktrain.callbacks.base import Callback

log = logging.getLogger(__name__)


def _warn(trainer, message):
    if trainer.is_global_zero:  # Lightning's rank_zero_warn
        warnings.warn(message, UserWarning, stacklevel=3)


def _info(trainer, message):
    if trainer.is_global_zero:
        log.info(message)


class WeightAveraging(Callback):
    def __init__(self, device: Optional[Union[torch.device, str, int]] = None, use_buffers: bool = True, **kwargs):
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model = None
        # global_step at the last update: the first should_update call comes after the first optimizer step
        self._latest_update_step = 0
        self._latest_update_epoch = -1

    def should_update(self, step_idx=None, epoch_idx=None):
        """Called after each optimizer step (step_idx: its 0-based index) and each training epoch (epoch_idx).
        Default: update after every step."""
        return step_idx is not None

    @property
    def average_model(self):
        """The torch AveragedModel (its `.module` holds the averaged weights), or None before the first fit."""
        return self._average_model

    # -- events ------------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        trainer.strategy.check_full_parameters(f"{type(self).__name__} (it keeps a full copy of the weights)")
        from tasktrain.trainer.module import TaskModule, is_overridden

        if is_overridden("configure_model", pl_module, TaskModule):
            _warn(trainer, "You're using the WeightAveraging callback with a model that overrides the "
                           "configure_model callback. WeightAveraging doesn't support sharding model layers, so you "
                           "may run out of memory.")
            pl_module.configure_model()
        self._average_model = AveragedModel(pl_module, device=self._device or pl_module.device,
                                            use_buffers=self._use_buffers, **self._kwargs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer, pl_module):
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._average_model.update_parameters(pl_module)
            self._latest_update_epoch = epoch

    def on_validation_epoch_start(self, trainer, pl_module):
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_end(self, trainer, pl_module):
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_train_end(self, trainer, pl_module):
        if self._average_model is not None:
            self._copy_average_to_current(pl_module)

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def state_dict(self):
        # Lightning's one key. The epoch of the last update needs no saving: a resumed fit's epochs come after it (an
        # older checkpoint's "latest_update_epoch" is ignored, as Lightning would)
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict):
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self._average_model is None:
            _info(trainer, "You're using the WeightAveraging callback, but saving a checkpoint outside the 'fit' "
                           "stage. The state of the WeightAveraging callback won't be saved in the checkpoint. If "
                           "training has finished, the average model parameters will be saved to the state_dict in "
                           "the checkpoint.")
            return
        average = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k[len("module."):]: v.to(checkpoint["current_model_state"][k[len("module."):]].device)
                                    for k, v in average.items() if k.startswith("module.")}
        checkpoint["averaging_state"] = {k: v for k, v in average.items() if not k.startswith("module.")}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        if self._average_model is None:
            _warn(trainer, "You're using the WeightAveraging callback, but loading a checkpoint outside the 'fit' "
                           "stage. The WeightAveraging state cannot be restored. If you're using the checkpoint for "
                           "prediction or testing, you can ignore this warning. To disable the warning, remove the "
                           "WeightAveraging callback.")
            return
        if "current_model_state" not in checkpoint or "averaging_state" not in checkpoint:
            _warn(trainer, "The checkpoint was not created with WeightAveraging. Both the current and the average "
                           "model will be initialized with state_dict.")
            self._average_model.module.load_state_dict(deepcopy(checkpoint["state_dict"]), strict=False)
            return
        _info(trainer, "Found current_model_state in the checkpoint. This will be used to initialize the model.")
        average = {"module." + k: v for k, v in checkpoint["state_dict"].items()}
        average.update(checkpoint["averaging_state"])
        self._average_model.load_state_dict(average)
        # the module got checkpoint["state_dict"] (the average) already (Lightning's order): it trains the current ones
        trainer.strategy.load_module_state_dict(checkpoint["current_model_state"], pl_module)

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _pairs(self, module):
        average = self._average_model.module
        return zip(itertools.chain(average.parameters(), average.buffers()),
                   itertools.chain(module.parameters(), module.buffers()))

    def _copy_average_to_current(self, module):
        with torch.no_grad():
            for average, current in self._pairs(module):
                current.copy_(average.to(current.device))

    def _swap_models(self, module):
        with torch.no_grad():
            for average, current in self._pairs(module):
                kept = current.detach().clone()
                current.copy_(average.to(current.device))
                average.copy_(kept.to(average.device))


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights, updated every `update_every_n_steps` optimizer steps from
    `update_starting_at_step` (0-based; None: from the first), and at epoch ends from `update_starting_at_epoch`
    (None: never at epoch ends)."""

    def __init__(
        self,
        device: Optional[Union[torch.device, str, int]] = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: Optional[int] = None,
        update_starting_at_epoch: Optional[int] = None,
        **kwargs,
    ):
        super().__init__(device=device, use_buffers=use_buffers, avg_fn=get_ema_avg_fn(decay=decay), **kwargs)
        self.decay = decay
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx=None, epoch_idx=None):
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        if epoch_idx is not None:
            return self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch
        return False
