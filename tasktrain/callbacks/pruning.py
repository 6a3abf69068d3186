"""ModelPruning: prune the module's parameters with torch.nn.utils.prune during training, as Lightning's callback does
(its arguments, errors, log lines and checkpoint contents).

When: at each training epoch's end (prune_on_train_epoch_end=False: each validation's end, the sanity check left
out), if `apply_pruning` (a bool, or a function of the epoch) and `amount` (a fraction, a count, or a function of the
epoch) say so. How: `pruning_fn` is one of "l1_unstructured", "random_unstructured", "ln_structured" (needs
pruning_dim and pruning_norm), "random_structured" (needs pruning_dim), or a torch BasePruningMethod subclass;
use_global_unstructured=True prunes the given parameters together (torch's global_unstructured: unstructured methods
only), False each on its own. What: `parameters_to_prune` [(module, "weight"), ...], or every `parameter_names`
("weight", "bias") parameter of every non-container submodule; `filter_parameters_to_prune` may be overridden.

use_lottery_ticket_hypothesis (a bool or a function of the epoch): after pruning, the kept weights go back to their
values at set-up (resample_parameters=True: to a fresh `reset_parameters()` draw instead). make_pruning_permanent
(default True): the masks are applied and torch's re-parametrisation removed at the end of training, and every
checkpoint saved holds plain pruned weights ("weight", not "weight_orig" / "weight_mask") while training keeps its
masks. verbose=1 logs the overall sparsity after each pruning, 2 each parameter's too (INFO on this module's
logger, global rank 0 only, Lightning's lines).
"""
import inspect
import logging
from copy import deepcopy
from functools import partial
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.utils.prune as pytorch_prune
from torch import Tensor, nn

from tasktrain.callbacks.base import Callback
from tasktrain.exceptions import MisconfigurationException
from tasktrain.trainer.module import TaskModule

log = logging.getLogger(__name__)

_PYTORCH_PRUNING_FUNCTIONS = {
    "ln_structured": pytorch_prune.ln_structured,
    "l1_unstructured": pytorch_prune.l1_unstructured,
    "random_structured": pytorch_prune.random_structured,
    "random_unstructured": pytorch_prune.random_unstructured,
}
_PYTORCH_PRUNING_METHOD = {
    "ln_structured": pytorch_prune.LnStructured,
    "l1_unstructured": pytorch_prune.L1Unstructured,
    "random_structured": pytorch_prune.RandomStructured,
    "random_unstructured": pytorch_prune.RandomUnstructured,
}
# containers hold no parameters of their own to prune
_MODULE_CONTAINERS = (TaskModule, nn.Sequential, nn.ModuleList, nn.ModuleDict)


class ModelPruning(Callback):
    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Union[Callable, str],
        parameters_to_prune: Sequence[tuple[nn.Module, str]] = (),
        parameter_names: Optional[list[str]] = None,
        use_global_unstructured: bool = True,
        amount: Union[int, float, Callable[[int], Union[int, float]]] = 0.5,
        apply_pruning: Union[bool, Callable[[int], bool]] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: Union[bool, Callable[[int], bool]] = True,
        resample_parameters: bool = False,
        pruning_dim: Optional[int] = None,
        pruning_norm: Optional[int] = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ):
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._global_kwargs = {}
        self._original_layers = None  # {id(module): {"data": its copy at set-up, "names": [(index, name)]}}
        self._pruning_method_name = None
        self._is_global_zero = True  # set at set-up: only rank 0 logs

        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise MisconfigurationException(
                    f"The provided `parameter_names` name: {name} isn't in {self.PARAMETER_NAMES}")

        if isinstance(pruning_fn, str):
            pruning_kwargs = {}
            pruning_fn = pruning_fn.lower()
            if pruning_fn not in _PYTORCH_PRUNING_FUNCTIONS:
                raise MisconfigurationException(
                    f"The provided `pruning_fn` {pruning_fn} isn't available in PyTorch's"
                    f" built-in functions: {list(_PYTORCH_PRUNING_FUNCTIONS.keys())} ")
            if pruning_fn.endswith("_structured"):
                if pruning_dim is None:
                    raise MisconfigurationException(
                        "When requesting `structured` pruning, the `pruning_dim` should be provided.")
                if pruning_fn == "ln_structured":
                    if pruning_norm is None:
                        raise MisconfigurationException(
                            "When requesting `ln_structured` pruning, the `pruning_norm` should be provided.")
                    pruning_kwargs["n"] = pruning_norm
                pruning_kwargs["dim"] = pruning_dim
            pruning_fn = self._create_pruning_fn(pruning_fn, **pruning_kwargs)
        elif self._is_pruning_method(pruning_fn):
            if not use_global_unstructured:
                raise MisconfigurationException(
                    "PyTorch `BasePruningMethod` is currently only supported with `use_global_unstructured=True`.")
        else:
            raise MisconfigurationException(
                f"`pruning_fn` is expected to be a str in {list(_PYTORCH_PRUNING_FUNCTIONS.keys())}"
                f" or a PyTorch `BasePruningMethod`. Found: {pruning_fn}."
                " HINT: if passing a `BasePruningMethod`, pass the class, not an instance")

        if use_global_unstructured and pruning_fn.PRUNING_TYPE != "unstructured":
            raise MisconfigurationException(
                'Only the "unstructured" PRUNING_TYPE is supported with `use_global_unstructured=True`.'
                f" Found method {pruning_fn} of type {pruning_fn.PRUNING_TYPE}. ")

        self.pruning_fn = pruning_fn
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent

        if not (isinstance(amount, (int, float)) or callable(amount)):
            raise MisconfigurationException(
                "`amount` should be provided and be either an int, a float or Callable function.")
        self.amount = amount

        if verbose not in (0, 1, 2):
            raise MisconfigurationException("`verbose` must be any of (0, 1, 2)")
        self._verbose = verbose

    def filter_parameters_to_prune(self, parameters_to_prune=()):
        """Override to choose which (module, name) pairs are pruned."""
        return parameters_to_prune

    def _create_pruning_fn(self, pruning_fn, **kwargs):
        """The method class for global pruning (its keyword arguments kept for global_unstructured), else torch's
        pruning function with them bound."""
        pruning_meth = (_PYTORCH_PRUNING_METHOD[pruning_fn] if self._use_global_unstructured
                        else _PYTORCH_PRUNING_FUNCTIONS[pruning_fn])
        if self._use_global_unstructured:
            self._global_kwargs = kwargs
        self._pruning_method_name = pruning_meth.__name__  # (a partial has no __name__)
        if self._use_global_unstructured:
            return pruning_meth
        return ModelPruning._wrap_pruning_fn(pruning_meth, **kwargs)

    @staticmethod
    def _wrap_pruning_fn(pruning_fn, **kwargs):
        return partial(pruning_fn, **kwargs)

    def make_pruning_permanent(self, module):
        """Apply the masks and remove torch's pruning re-parametrisation from every pruned submodule of `module`."""
        for _, submodule in module.named_modules():
            for k in list(submodule._forward_pre_hooks):
                hook = submodule._forward_pre_hooks[k]
                if isinstance(hook, pytorch_prune.BasePruningMethod):
                    hook.remove(submodule)
                    del submodule._forward_pre_hooks[k]

    @staticmethod
    def _copy_param(new, old, name):
        # a pruned parameter lives in "<name>_orig"; the mask stays as it is
        dst = getattr(new, name + "_orig") if hasattr(new, name + "_orig") else getattr(new, name)
        src = getattr(old, name)
        if dst is None or src is None or not isinstance(dst, Tensor) or not isinstance(src, Tensor):
            return
        dst.data = src.data.to(dst.device)

    def apply_lottery_ticket_hypothesis(self):
        """The lottery ticket hypothesis (Frankle & Carbin, https://arxiv.org/abs/1803.03635), its step 4: the weights
        kept by the masks go back to their values at set-up (resample_parameters=True: to a new random draw)."""
        for d in self._original_layers.values():
            copy, names = d["data"], d["names"]
            if self._resample_parameters and callable(getattr(copy, "reset_parameters", None)):
                copy = deepcopy(copy)  # the set-up values stay for a later call
                copy.reset_parameters()
            for i, name in names:
                new, _ = self._parameters_to_prune[i]
                self._copy_param(new, copy, name)

    def _apply_local_pruning(self, amount):
        for module, name in self._parameters_to_prune:
            self.pruning_fn(module, name=name, amount=amount)

    def _resolve_global_kwargs(self, amount):
        self._global_kwargs["amount"] = amount
        params = set(inspect.signature(self.pruning_fn).parameters)
        params.discard("self")
        return {k: v for k, v in self._global_kwargs.items() if k in params}

    def _apply_global_pruning(self, amount):
        pytorch_prune.global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn,
                                          **self._resolve_global_kwargs(amount))

    @staticmethod
    def _get_pruned_stats(module, name):
        mask = getattr(module, f"{name}_mask", None)
        if mask is None:
            return 0, 1
        return (mask == 0).sum().item(), mask.numel()

    def apply_pruning(self, amount):
        """Prune `parameters_to_prune` by `amount`."""
        if self._verbose:
            prev_stats = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune]
        if self._use_global_unstructured:
            self._apply_global_pruning(amount)
        else:
            self._apply_local_pruning(amount)
        if self._verbose:
            curr_stats = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune]
            self._log_sparsity_stats(prev_stats, curr_stats, amount=amount)

    def _log_sparsity_stats(self, prev, curr, amount=0):
        if not self._is_global_zero:
            return
        total_params = sum(total for _, total in curr)
        prev_total_zeros = sum(zeros for zeros, _ in prev)
        curr_total_zeros = sum(zeros for zeros, _ in curr)
        log.info(f"Applied `{self._pruning_method_name}`. Pruned:"
                 f" {prev_total_zeros}/{total_params} ({prev_total_zeros / total_params:.2%}) ->"
                 f" {curr_total_zeros}/{total_params} ({curr_total_zeros / total_params:.2%})")
        if self._verbose == 2:
            for i, (module, name) in enumerate(self._parameters_to_prune):
                prev_mask_zeros, prev_mask_size = prev[i]
                curr_mask_zeros, curr_mask_size = curr[i]
                log.info(f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned:"
                         f" {prev_mask_zeros} ({prev_mask_zeros / prev_mask_size:.2%}) ->"
                         f" {curr_mask_zeros} ({curr_mask_zeros / curr_mask_size:.2%})")

    def setup(self, trainer, pl_module, stage):
        self._is_global_zero = trainer.is_global_zero
        parameters_to_prune = self.sanitize_parameters_to_prune(pl_module, self._parameters_to_prune,
                                                                 parameter_names=self._parameter_names)
        self._parameters_to_prune = self.filter_parameters_to_prune(parameters_to_prune)
        if self._use_lottery_ticket_hypothesis:
            # one copy of each module at set-up, with the indices of its parameters in _parameters_to_prune
            self._original_layers = {}
            for i, (module, name) in enumerate(self._parameters_to_prune):
                entry = self._original_layers.setdefault(id(module), {"data": deepcopy(module), "names": []})
                entry["names"].append((i, name))

    def _run_pruning(self, current_epoch):
        prune = self._apply_pruning(current_epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(current_epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(current_epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()

    def on_train_epoch_end(self, trainer, pl_module):
        if self._prune_on_train_epoch_end:
            log.debug("`ModelPruning.on_train_epoch_end`. Applying pruning")
            self._run_pruning(pl_module.current_epoch)

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            log.debug("`ModelPruning.on_validation_epoch_end`. Applying pruning")
            # tasktrain validates inside fit under inference_mode (Lightning: no_grad): masks made there would be
            # inference tensors, which the next training forward cannot use for backward
            with torch.inference_mode(False):
                self._run_pruning(pl_module.current_epoch)

    def on_train_end(self, trainer, pl_module):
        if self._make_pruning_permanent:
            log.debug("`ModelPruning.on_train_end`. Pruning is made permanent for this checkpoint")
            self.make_pruning_permanent(pl_module)

    @staticmethod
    def _permanent_state_dict(state_dict):
        """`state_dict` with each pruned "<name>_orig" / "<name>_mask" pair replaced by "<name>" = mask * original,
        in place of the original (key order kept), on the CPU. The module keeps its masks: training goes on."""
        pruned = {k[:-len("_mask")] for k in state_dict if k.endswith("_mask")}
        permanent = {}
        for key, value in state_dict.items():
            if key.endswith("_orig") and key[:-len("_orig")] in pruned:
                key = key[:-len("_orig")]
                value = state_dict[key + "_mask"].to(dtype=value.dtype) * value
            elif key.endswith("_mask") and key[:-len("_mask")] in pruned:
                continue
            permanent[key] = value.detach().cpu() if isinstance(value, Tensor) else value
        return permanent

    def _make_pruning_permanent_on_state_dict(self, pl_module):
        return self._permanent_state_dict(pl_module.state_dict())

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self._make_pruning_permanent:
            log.debug("`ModelPruning.on_save_checkpoint`. Pruning is made permanent for this checkpoint")
            # the weights the strategy put in the checkpoint (a full copy under FSDP, where the module holds shards)
            # rather than Lightning's pl_module.state_dict(): the same dict on one device and under DDP
            saved = checkpoint.get("state_dict")
            checkpoint["state_dict"] = (self._permanent_state_dict(saved) if isinstance(saved, dict)
                                        else self._make_pruning_permanent_on_state_dict(pl_module))

    @staticmethod
    def sanitize_parameters_to_prune(pl_module, parameters_to_prune=(), parameter_names=()):
        """`parameters_to_prune` checked against the module, or, when empty, every `parameter_names` parameter of
        every non-container submodule."""
        parameters = parameter_names or ModelPruning.PARAMETER_NAMES
        current_modules = [m for m in pl_module.modules() if not isinstance(m, _MODULE_CONTAINERS)]
        if not parameters_to_prune:
            parameters_to_prune = [(m, p) for p in parameters for m in current_modules
                                   if isinstance(getattr(m, p, None), nn.Parameter)]
        elif (isinstance(parameters_to_prune, (list, tuple)) and len(parameters_to_prune) > 0
              and all(len(p) == 2 for p in parameters_to_prune)
              and all(isinstance(a, nn.Module) and isinstance(b, str) for a, b in parameters_to_prune)):
            missing_modules, missing_parameters = [], []
            for module, name in parameters_to_prune:
                if module not in current_modules:
                    missing_modules.append(module)
                    continue
                if not hasattr(module, name):
                    missing_parameters.append(name)
            if missing_modules or missing_parameters:
                raise MisconfigurationException(
                    "Some provided `parameters_to_prune` don't exist in the model."
                    f" Found missing modules: {missing_modules} and missing parameters: {missing_parameters}")
        else:
            raise MisconfigurationException(
                "The provided `parameters_to_prune` should either be list of tuple"
                " with 2 elements: (nn.Module, parameter_name_to_prune) or None")
        return parameters_to_prune

    @staticmethod
    def _is_pruning_method(method):
        return inspect.isclass(method) and issubclass(method, pytorch_prune.BasePruningMethod)
