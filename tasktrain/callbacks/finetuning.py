"""Fine-tuning: freeze part of a model before training and unfreeze it at a chosen epoch.

BaseFinetuning is the frame: `freeze_before_training(pl_module)` runs at set-up of every stage (as Lightning), before
configure_optimizers (so
`filter(lambda p: p.requires_grad, self.parameters())` there leaves the frozen part out), and
`finetune_function(pl_module, epoch, optimizer)` runs at each epoch start to unfreeze and add param groups. Its
static helpers (freeze, make_trainable, unfreeze_and_add_param_group, ...) work on a module or a list of them.
BackboneFinetuning unfreezes `module.backbone` at one epoch, at a fraction of the rest's learning rate, then
raises that rate each epoch; `verbose` prints Lightning's "Current lr: ..., Backbone lr: ..." line (rank 0). A
module without a `backbone` is an AttributeError at set-up, one whose `backbone` is no nn.Module a
MisconfigurationException at fit start (both as Lightning).

The param groups it added are saved in checkpoints (by parameter name) and added back on resume before the
optimizer's own state is loaded, so a resumed run has the same groups, rates and moments.

When parameters start requiring gradients, the strategy is told (`trainable_parameters_changed`): DDP builds its
wrapper again, since torch's DDP syncs only the gradients of parameters that required them when it was built
(without that, an unfrozen backbone would train apart on each rank). DeepSpeed refuses the callback at set-up, in every
stage, with Lightning's NotImplementedError.
"""
from typing import Callable, Optional

from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException


def _trainable(module):
    return [p.requires_grad for p in module.parameters()]


def multiplicative(epoch):
    """BackboneFinetuning's default lambda_func: the backbone's learning rate doubles each epoch."""
    return 2.0


class BaseFinetuning(Callback):
    def __init__(self):
        self._internal_optimizer_metadata = {}  # optimizer index -> its param groups, parameters by name

    # -- what a subclass writes ---------------------------------------------------------------------------------
    def freeze_before_training(self, pl_module):
        raise NotImplementedError(f"{type(self).__name__} must define freeze_before_training(self, pl_module).")

    def finetune_function(self, pl_module, epoch, optimizer):
        raise NotImplementedError(f"{type(self).__name__} must define finetune_function(self, pl_module, "
                                  "epoch, optimizer).")

    # -- helpers ---------------------------------------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules):
        """The leaf modules (and parents holding parameters of their own) of a module or a nest of them."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Module):
            candidates = list(modules.modules())
        else:
            candidates = [m for item in modules for m in BaseFinetuning.flatten_modules(item)]
        return [m for m in candidates if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules, train_bn=True, requires_grad=True):
        """The parameters of `modules` whose requires_grad is `requires_grad` (BatchNorm's left out unless train_bn)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):  # recurse=False: a parent's are not yielded twice
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules):
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module):
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules, train_bn=True):
        """Freeze every parameter of `modules`; with train_bn, BatchNorm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer, params):
        """The parameters of `params` that are in none of the optimizer's groups (a parameter is in one group)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in present]
        if len(kept) != len(params):
            import warnings

            # Lightning's warning; the test is by identity (Lightning's torch.equal also skips a different parameter
            # that happens to hold equal values, e.g. two zero biases: docs/lightning.md)
            warnings.warn("The provided params to be frozen already exist within another group of this optimizer. "
                          "Those parameters will be skipped.\nHINT: Did you init your optimizer in "
                          "`configure_optimizer` as such:\n "
                          f"{type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) ",
                          UserWarning)
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(modules, optimizer, lr: Optional[float] = None, initial_denom_lr: float = 10.0,
                                     train_bn: bool = True) -> None:
        """Unfreeze `modules` and add their parameters to `optimizer` as a new group, at `lr`, or else at the first
        group's rate divided by `initial_denom_lr`."""
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True))
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # -- events ------------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        # every stage, as Lightning: trainer.validate/test see the model frozen as training would start it, and a
        # strategy that cannot take new param groups refuses in every stage (DeepSpeed: Lightning's NotImplementedError)
        self._fit_started, self._pending_groups = False, None
        self.freeze_before_training(pl_module)
        trainer.strategy.check_param_groups_can_change("The Finetuning callback")

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        # The groups added in the interrupted run must exist before the optimizer's state is loaded: at on_fit_start
        # (Lightning's), or here where the checkpoint is read after it (DeepSpeed/FSDP, restore after set-up).
        state = (checkpoint.get("callbacks") or {}).get(self.state_key)
        if not state:
            return
        self._pending_groups = state
        if getattr(self, "_fit_started", False):
            self._restore_groups(trainer, pl_module)

    def on_fit_start(self, trainer, pl_module):
        self._fit_started = True
        if getattr(self, "_pending_groups", None) is not None:
            self._restore_groups(trainer, pl_module)

    def _restore_groups(self, trainer, module):
        state, self._pending_groups = self._pending_groups, None
        self._internal_optimizer_metadata = {int(k): v for k, v in state["internal_optimizer_metadata"].items()}
        by_name = dict(module.named_parameters())
        before = _trainable(module)
        for index, optimizer in enumerate(trainer.optimizers):
            saved = self._internal_optimizer_metadata.get(index)
            if not saved:
                continue
            for group in saved[len(optimizer.param_groups):]:  # the groups this callback added
                params = [by_name[name] for name in group["params"]]
                for param in params:
                    param.requires_grad = True
                optimizer.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": params})
        self._trainable_changed(trainer, module, before)

    def on_train_epoch_start(self, trainer, pl_module):
        before = _trainable(pl_module)
        for index, optimizer in enumerate(trainer.optimizers):
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._store(pl_module, index, optimizer)
        self._trainable_changed(trainer, pl_module, before)

    def _trainable_changed(self, trainer, module, before):
        # every rank unfreezes at the same epoch: the strategy rebuilds what synchronises gradients (DDP's wrapper)
        if _trainable(module) != before:
            trainer.strategy.trainable_parameters_changed(type(self).__name__)

    def _store(self, module, index, optimizer):
        names = {id(p): n for n, p in module.named_parameters()}
        self._internal_optimizer_metadata[index] = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
            for group in optimizer.param_groups
        ]

    def state_dict(self):
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict):
        self._internal_optimizer_metadata = {int(k): v for k, v in state_dict["internal_optimizer_metadata"].items()}


class BackboneFinetuning(BaseFinetuning):
    """Train the head first; at `unfreeze_backbone_at_epoch`, add `module.backbone` to the optimizer at
    `backbone_initial_lr` (default: the current rate times `backbone_initial_ratio_lr`), then multiply its rate by
    `lambda_func(epoch + 1)` each epoch, capped at the rest's rate when `should_align`."""

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2, backbone_initial_lr: Optional[float] = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr = None

    def on_fit_start(self, trainer, pl_module):
        if not isinstance(getattr(pl_module, "backbone", None), Module):
            raise MisconfigurationException(f"The LightningModule should have a nn.Module `backbone` attribute; "
                                            f"{type(pl_module).__name__}.backbone is "
                                            f"{type(getattr(pl_module, 'backbone', None)).__name__}.")
        super().on_fit_start(trainer, pl_module)

    def freeze_before_training(self, pl_module):
        if not hasattr(pl_module, "backbone"):
            # AttributeError, as Lightning's freeze(pl_module.backbone) raises, with the fix
            raise AttributeError(f"BackboneFinetuning needs the module to have a `backbone` attribute that is an "
                                 f"nn.Module; {type(pl_module).__name__} has none. Name the part to fine-tune "
                                 "`self.backbone`, or write a BaseFinetuning subclass.")
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module, epoch, optimizer):
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            lr = self.backbone_initial_lr if self.backbone_initial_lr is not None else \
                current_lr * self.backbone_initial_ratio_lr
            self.previous_backbone_lr = lr
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and lr > current_lr:
                lr = current_lr
            optimizer.param_groups[-1]["lr"] = lr
            self.previous_backbone_lr = lr
        else:
            return
        if self.verbose and pl_module.global_rank == 0:  # Lightning's line
            print(f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: "
                  f"{round(self.previous_backbone_lr, self.rounding)}", flush=True)

    def state_dict(self):
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.previous_backbone_lr = state_dict.get("previous_backbone_lr")
