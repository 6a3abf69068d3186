"""Strategy: how the work is spread over processes and devices.

One implementation serves both the Trainer and the Accelerator. The Trainer calls, per run:

    strategy.setup_environment()                      # processes, process group, device
    model, optimizers = strategy.setup(module, optimizers)
    ... per step: strategy.training_step(batch, idx) / backward(loss) / optimizer_step(opt)
    strategy.teardown()

A Strategy holds a Precision plugin (`strategy.precision`) and delegates casting and scaling to it.
"""
import contextlib
import os

import torch

from tasktrain.checkpoint_io import atomic_save, load_checkpoint_file
from tasktrain.strategies.precision import Precision
from tasktrain.tree import apply_to_leaves


class Strategy:
    name = "base"
    is_distributed = False

    def __init__(self, accelerator=None, precision=None):
        self.accelerator = accelerator  # "cpu" | "cuda" | None (auto)
        self.precision = precision  # a Precision, given by the Trainer/Accelerator when None
        self.devices = 1
        self.num_nodes = 1
        self.module = None  # the user's module, unwrapped
        self.model = None  # what the training forward goes through (a DDP/DeepSpeed wrapper or the module)
        self.optimizers = []
        self._root_device = None

    # -- who am I -----------------------------------------------------------------------------------------
    global_rank = 0
    local_rank = 0
    node_rank = 0
    world_size = 1

    @property
    def rank(self):
        return self.global_rank

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def root_device(self) -> torch.device:
        if self._root_device is None:
            self._root_device = self._pick_device()
        return self._root_device

    def _pick_device(self):
        if self.accelerator == "cuda" or (self.accelerator in (None, "auto") and torch.cuda.is_available()):
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def device_type(self) -> str:
        return self.root_device.type

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        """Called by the Trainer/Accelerator before setup_environment with the user's choices."""
        if accelerator not in (None, "auto"):
            self.accelerator = accelerator
        self.devices = devices
        self.num_nodes = num_nodes
        if precision is not None:
            self.precision = precision

    # -- lifecycle ----------------------------------------------------------------------------------------
    def setup_environment(self):
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        # No accelerator in this process, a CPU device and no input cast: a batch of tensors is already where it
        # belongs, and batch_to_device hands it on instead of rebuilding it every step.
        self._batches_stay = (self.root_device.type == "cpu" and not _accelerator_visible() and (
            self.precision is None or type(self.precision).convert_input is Precision.convert_input))

    # -- the watchdog (issue 19, tasktrain/strategies/watchdog.py) -----------------------------------------------
    # stall_timeout: seconds, or None (off); set by the Trainer / Accelerator before setup_environment.
    # watchdog: the process's Watchdog once a multi-process strategy's setup_environment started one (with a
    # stall_timeout or TASKTRAIN_DEBUG_COLLECTIVES=1); None on one process, which has nobody to wait for. The
    # loops mark progress on it, arm it around their batches and wrap long work in watchdog.long_event(name).
    stall_timeout = None
    watchdog = None

    def setup(self, module, optimizers):
        """Move and wrap the module, return (model, optimizers). `model` is what `training_step` goes through."""
        self.module = module
        module = self.precision.convert_module(module) if self.precision else module
        module.to(self.root_device)
        self.model = module
        self.optimizers = list(optimizers)
        return self.model, self.optimizers

    def wrap_model(self, model):
        """The Accelerator's path: cast and move `model`, and wrap it so that calling it runs the model's own
        forward through the strategy (setup() routes training_step instead). Keeps no reference: call it once
        per model."""
        model = self.precision.convert_module(model) if self.precision else model
        return model.to(self.root_device)

    def teardown(self):
        self.model = None
        self.optimizers = []

    # -- the step -------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        with self.precision.autocast():
            return self.module.training_step(batch, batch_idx)

    def eval_step(self, step_fn, *args):
        with self.precision.autocast():
            return step_fn(*args)

    def backward(self, loss, *args, **kwargs):
        self.precision.backward(loss, *args, **kwargs)

    def optimizer_step(self, optimizer, closure=None) -> bool:
        return self.precision.optimizer_step(optimizer, closure)

    def zero_grad(self, optimizer):
        optimizer.zero_grad(set_to_none=True)

    def unscale_gradients(self, optimizer):
        self.precision.unscale(optimizer)

    def clip_gradients(self, optimizer, max_norm=None, max_value=None, norm_type=2.0):
        """Unscale, then clip the optimizer's gradients. Returns the total gradient norm before clipping."""
        self.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type) if params else torch.tensor(0.0)
        if max_norm is not None and params:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        if max_value is not None and params:
            torch.nn.utils.clip_grad_value_(params, max_value)
        return norm

    def no_backward_sync(self, enabled: bool, model=None):
        """Skip the gradient all-reduce for this micro-batch (gradient accumulation); `model`: a wrap_model()
        result, default the model of setup()."""
        return contextlib.nullcontext()

    _batches_stay = False  # decided by setup_environment

    def batch_to_device(self, batch):
        if self._batches_stay and _plain_tensors(batch):
            return batch
        batch = move_to_device(batch, self.root_device)
        return self.precision.convert_input(batch) if self.precision else batch

    # -- collectives (no-ops on one process) --------------------------------------------------------------
    def reduce(self, tensor, op="mean"):
        return tensor

    def all_gather(self, tensor):
        return tensor.unsqueeze(0) if isinstance(tensor, torch.Tensor) else [tensor]

    def all_gather_object(self, obj):
        return [obj]

    def broadcast(self, obj, src=0):
        return obj

    def barrier(self, name=None):
        pass

    # -- checkpoints ----------------------------------------------------------------------------------------
    def module_state_dict(self):
        return self.module.state_dict()

    def load_module_state_dict(self, state_dict, strict=True):
        self.module.load_state_dict(state_dict, strict=strict)

    def optimizer_state(self, optimizer):
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer, state):
        optimizer.load_state_dict(state)

    def save_checkpoint(self, checkpoint: dict, path: str):
        if self.is_global_zero:
            atomic_save(checkpoint, path)
        self.barrier("save_checkpoint")

    def load_checkpoint(self, path: str) -> dict:
        return load_checkpoint_file(path)

    def remove_checkpoint(self, path: str):
        if self.is_global_zero and os.path.exists(path):
            os.remove(path)

    def describe(self) -> str:
        return f"strategy={self.name}, world_size={self.world_size}, device={self.root_device}"


def _accelerator_visible():
    xpu = getattr(torch, "xpu", None)
    return (torch.cuda.is_available() or torch.backends.mps.is_available()
            or (xpu is not None and xpu.is_available()))


def _plain_tensors(batch):
    """A tensor, or a list, tuple or dict of tensors (what default_collate makes of tensors)."""
    if type(batch) is torch.Tensor:
        return True
    if type(batch) is dict:
        batch = batch.values()
    elif type(batch) is not list and type(batch) is not tuple:
        return False
    for item in batch:
        if type(item) is not torch.Tensor:
            return False
    return True


def move_to_device(data, device):
    def move(leaf):
        if isinstance(leaf, torch.Tensor):
            return leaf.to(device, non_blocking=True) if leaf.device != device else leaf
        to = getattr(leaf, "to", None)  # a batch object of the user's own (a BatchEncoding, ...) moves itself
        return to(device) if callable(to) else leaf

    return apply_to_leaves(data, move)
