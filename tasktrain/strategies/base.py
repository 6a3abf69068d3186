"""Strategy: the contract between the loop and an engine. A core that every strategy keeps, and a few small
capability interfaces that only some strategies have.

The Trainer, the Accelerator and the callbacks call only what these classes declare, and nothing else: no
attribute probes, no tests of a strategy's name. docs/strategies.md shows a strategy written against them.

- `Strategy`, the core: what every strategy does. Where the loop calls a method on every strategy (backward, the
  step, checkpoints, no_backward_sync, the check_* guards), the core's default is what a strategy without the
  capability does ("nothing to skip", "nothing is sharded"), and each method says so. What has no honest default is
  abstract: the world (ranks and collectives), which a strategy states by inheriting `OneProcess` or by
  implementing it for its processes (DDP).
- The capabilities, each a small abstract class a strategy inherits explicitly; the few callers that need one test
  `isinstance(strategy, Capability)` before they use its methods:
    `MultiProcess`     several processes form one world, which the strategy joins or starts (DDP, DeepSpeed, FSDP);
    `Sharded`          parameters or optimizer state are split over the ranks: it builds modules sharded
                       (module_init_context), gathers them for export, writes sharded checkpoints (DeepSpeed, FSDP);
    `ClipsInsideStep`  the engine owns backward and the optimizer step and clips inside it (DeepSpeed).
  `OneProcess` is the world of one process (SingleDevice, DataParallel): ranks 0, identity collectives.

Per run, in this order (tasktrain/trainer/runtime.py makes the first call for the Trainer and the Accelerator
alike):

    strategy.configure(accelerator, devices, num_nodes, precision)     # the run's choices; builds the precision plugin
    strategy.launch(run, *args)                   # run(*args) on every rank: here, or in processes it starts
        strategy.setup_environment()              # processes, process group, device
        model, optimizers = strategy.setup_module_and_optimizers(module, optimizers, plan)
        for each micro-batch:
            batch = strategy.batch_to_device(batch)          # the module's transfer hooks (move_batch: none)
            with strategy.no_backward_sync(not ends_window):
                out = strategy.training_step(batch, i)       # under strategy.forward_context()
                strategy.backward(loss, optimizer)
            at the window's end:
                strategy.clip_gradients(optimizer, ...)       # when clipping was asked for
                strategy.optimizer_step(optimizer, None)     # (None: no closure, the gradients are there)
                strategy.zero_grad(optimizer)
        strategy.save_checkpoint(checkpoint, path) / strategy.load_checkpoint(path)     # called on every rank
        strategy.teardown()

The strategy owns its precision plugin (`strategy.precision`): the loop never builds or replaces it. Engines
that own backward, stepping, clipping or checkpoints (DeepSpeed) map the contract onto their engine; they do not
fight it. Nothing in tasktrain/strategies/ imports the Trainer or the callbacks.
"""
import abc
import contextlib
import os
from dataclasses import dataclass
from typing import Optional

import inspect
import weakref

import torch

from tasktrain.checkpoint_io import CheckpointWriter, fsync_save, replace_dir, stage_to_cpu  # background saves
from tasktrain.checkpoint_io import (CheckpointError, TorchCheckpointIO, atomic_link, atomic_save,
                                    load_checkpoint_file, load_plain_state_dict, plain_state_dict, remove_path,
                                    upgrade_layout)
from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.names import normalize_precision
from tasktrain.strategies.loop_hooks import LoopHooks  # Lightning's loop-facing methods (docs/lightning.md)
from tasktrain.strategies.precision import HalfPrecision, MixedPrecision, Precision, make_precision, patch_forward
from tasktrain.tree import apply_to_leaves


@dataclass(frozen=True)
class GradientClip:
    """A gradient clipping the loop will ask for at every optimizer step."""

    value: float
    algorithm: str = "norm"  # "norm": scale to a total norm of at most `value`; "value": clamp every element
    norm_type: float = 2.0
    requested_by: str = ""  # who asked, for messages: "Trainer(gradient_clip_val=1.0)", "GradientClipping(...)"


@dataclass(frozen=True)
class Plan:
    """What the loop will do with the module: a plain record handed to setup_module_and_optimizers.

    Engines that must know it up front (DeepSpeed writes it into its config) read it there; a strategy that does
    what it is told step by step may ignore it."""

    training: bool = True  # an optimizer will step; False: evaluation only (validate / test / predict)
    calls_steps: bool = True  # the loop runs the module's steps through training_step / eval_step (the Trainer);
    #                           False: the caller calls the returned model as the module itself (the Accelerator)
    micro_batch_size: Optional[int] = None  # samples per micro-batch and process; None: not known
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step
    accumulation_schedule: tuple = ()  # ((first epoch, micro-batches per step), ...) when the window is set by
    #                                    epoch (GradientAccumulationScheduler; it then decides the window, and
    #                                    accumulate_grad_batches is 1); empty: accumulate_grad_batches always
    automatic_optimization: bool = True  # the loop steps the optimizer; False: the module's own training_step does,
    #                                      once per backward (each backward closes its own window)
    loss_divided_by_window: bool = True  # the loop divides each micro-batch's loss by its window before backward
    clipping: tuple = ()  # GradientClip requests the loop makes at each optimizer step (through clip_gradients)
    has_lr_schedulers: bool = False  # the loop steps learning-rate schedulers of its own
    move_module: bool = True  # False: the module stays where the caller put it (Accelerator(device_placement=False))


# Attributes that said a capability before the capabilities were classes: a subclass that sets one would be
# silently ignored now, so it is refused when the class is defined, saying what replaces it.
_RETIRED = {
    "is_distributed": "inherit tasktrain.strategies.MultiProcess (several processes form one world)",
    "clips_inside_step": "inherit tasktrain.strategies.ClipsInsideStep and implement last_grad_norm()",
    "distributed_type": "leave it out: Accelerate's DistributedType is read from the strategy's capabilities "
                        "(tasktrain.state.distributed_type_of)",
}


class Strategy(LoopHooks, abc.ABC):
    """How the work is spread over processes and devices: the core every strategy keeps. The defaults are one
    device's; the world (ranks and collectives) is abstract: inherit OneProcess, or implement it (DDP)."""

    name = "base"  # shown by describe(); the registry's names are in tasktrain/names.py
    supports_custom_loop = True  # can wrap a model's own forward for the Accelerator (Plan.calls_steps=False)
    # Whether the Trainer applies a LayerSync (sync_batchnorm=True, TorchSyncBatchNorm, one's own) to a fit's module
    # under this strategy when it has several processes, as Lightning's DDP and FSDP do. False: Lightning's DeepSpeed
    # and ModelParallel strategies never apply one; the Trainer says so with a warning and leaves the module as it is.
    applies_layer_sync = True
    # Lightning's strategy.cluster_environment: a tasktrain.plugins.environments one given to a Lightning-named
    # strategy's constructor (checked by the Trainer as a plugin is), else the Trainer's (plugins=, or the detected one)
    cluster_environment = None
    # A user's own cluster environment (Lightning's ClusterEnvironment interface), set by the Trainer: a multi-process
    # strategy's world reads its ranks, world size, address and port from it (strategies/world.py), as Lightning's
    # DDP does, and starts no processes where it says its cluster creates them. None: the launcher's variables.
    environment_plugin = None
    # Lightning's parallel_devices given to a Lightning-named strategy's constructor (a list of torch.device, one a
    # process of a node): the Trainer then runs len() of them of their kind, whatever its devices= said (Lightning's).
    # (ParallelStrategy.parallel_devices is these, else the run's devices.)
    given_parallel_devices = None
    parallel_devices_of = None  # the Lightning class they were given to ("DDPStrategy"), for Lightning's messages

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for attribute, instead in _RETIRED.items():
            if attribute in vars(cls):
                raise TypeError(f"{cls.__name__}.{attribute}: strategies state this by their capabilities now; "
                                f"{instead}. See docs/strategies.md.")

    @classmethod
    def register_strategies(cls, strategy_registry):
        """Lightning's: register this class's names in `strategy_registry` (tasktrain.strategies.StrategyRegistry,
        `strategy_registry.register(name, cls, description=..., **init_params)`), so that Trainer(strategy=name)
        builds it. Default: none (DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy register
        Lightning's names; a strategy of one's own overrides it and calls it with StrategyRegistry)."""

    def __init__(self, accelerator: Optional[Accelerator] = None, precision=None):
        self._accelerator_object = None
        self.accelerator = accelerator  # "cpu" | "cuda" | None (auto): accelerator_name (the property below)
        if precision is not None and not isinstance(precision, Precision):
            normalize_precision(precision)  # an unknown name fails here, where it was written
        self._precision_choice = precision  # a name, a Precision, or None: the run's (configure)
        self.precision = precision if isinstance(precision, Precision) else None  # built by configure()
        self.devices = 1
        self.num_nodes = 1
        self.module = None  # the user's module, unwrapped (the last one set up)
        self.model = None  # what the module's forward goes through (a DDP/DeepSpeed wrapper, or the module)
        self.optimizers = []
        self._root_device = None
        self._module_order = None  # clip_gradients' parameter order: (id of the optimizer, its size, positions)

    @property
    def accelerator(self):
        """Lightning's strategy.accelerator: the Accelerator object of the run's device kind (tasktrain.accelerators:
        CPUAccelerator, CUDAAccelerator) once a Trainer has resolved it; before that, and under the Accelerator
        (Accelerate's API, which has no such object), the name given: "cpu", "cuda" or None (auto). The strategy
        itself reads `accelerator_name`, always the name."""
        return self._accelerator_object if self._accelerator_object is not None else self.accelerator_name

    @accelerator.setter
    def accelerator(self, value):
        if value is None or isinstance(value, str):
            self.accelerator_name, self._accelerator_object = value, None
        else:  # an Accelerator object (the Trainer sets one, as Lightning's connector does): its kind is the name
            self._accelerator_object, self.accelerator_name = value, value.name()

    # -- who am I (abstract: OneProcess is the world of one) --------------------------------------------------------
    @property
    @abc.abstractmethod
    def global_rank(self) -> int:
        """This process's rank in the world, 0 .. world_size - 1."""

    @property
    @abc.abstractmethod
    def local_rank(self) -> int:
        """This process's rank on its machine."""

    @property
    @abc.abstractmethod
    def node_rank(self) -> int:
        """The rank of this process's machine."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """How many processes form the world."""

    @property
    def rank(self):
        return self.global_rank

    # -- data parallelism (issue 39): the Trainer shards its loaders by these ----------------------------------------
    @property
    def device_mesh(self):
        """The named torch DeviceMesh the module is parallelized on (TaskModule.device_mesh), or None. Default None."""
        return None

    @property
    def data_parallel_size(self) -> int:
        """How many different batches the world reads per step. Default world_size (every rank its own); a strategy
        whose ranks share batches (tensor parallel groups) says less."""
        return self.world_size

    @property
    def data_parallel_rank(self) -> int:
        """Which of those data_parallel_size batches this rank reads. Default global_rank."""
        return self.global_rank

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def root_device(self) -> torch.device:
        """This rank's device. Default: cuda:local_rank when CUDA is chosen (or visible and nothing chosen), else cpu."""
        if self._root_device is None:
            self._root_device = self._pick_device()
        return self._root_device

    def _pick_device(self):
        if self.accelerator_name == "cuda" or (self.accelerator_name in (None, "auto") and torch.cuda.is_available()):
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def device_type(self) -> str:
        return self.root_device.type

    @property
    def runs_steps_in_threads(self) -> bool:
        """True when training_step runs in several threads at once (DataParallel over GPUs): self.log then takes
        its values one thread at a time, onto root_device. Default False."""
        return False

    def describe(self) -> str:
        """One line for the start of a run: the strategy, the world, the device."""
        return f"strategy={self.name}, world_size={self.world_size}, device={self.root_device}"

    # -- the run's choices ------------------------------------------------------------------------------------------
    @property
    def requested_precision(self) -> Optional[str]:
        """The precision given to this strategy's constructor (a name), or None: then the run's applies."""
        choice = self._precision_choice
        if choice is None:
            return None
        return choice.name if isinstance(choice, Precision) else normalize_precision(choice)

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        """The run's choices, once, before setup_environment (tasktrain/trainer/runtime.py calls it for the Trainer
        and the Accelerator). Raise here for a choice this strategy cannot run: every rank fails alike, before any
        process starts. `precision` is the run's precision name (None: not chosen). Default: records the choices and
        builds the precision plugin (build_precision), keeping a Precision given to the constructor; a precision
        given both here and to the constructor must be the same."""
        if accelerator not in (None, "auto"):
            self.accelerator = accelerator
            self._root_device = None
        self.devices = devices
        self.num_nodes = num_nodes
        own = self.requested_precision
        if own is not None and precision is not None and own != normalize_precision(precision):
            raise ValueError(
                f"{type(self).__name__}(precision={own!r}) and the run's precision {normalize_precision(precision)!r} "
                f"disagree. Give the precision in one place: the Trainer's precision= (or the Accelerator's "
                f"mixed_precision=), or the strategy's."
            )
        if isinstance(self._precision_choice, Precision):
            self.precision = self._precision_choice
        else:
            self.precision = self.build_precision(own or normalize_precision(precision))

    def build_precision(self, name: str) -> Precision:
        """The precision plugin for `name` under this strategy. Default: autocast/GradScaler plugins
        (tasktrain/strategies/precision.py). Engines with their own precision policy return a plugin that maps
        onto it (DeepSpeed), or raise for a name they cannot run."""
        return make_precision(name, self.root_device.type)

    # -- Lightning's plugin attributes (Trainer(plugins=[...]) sets them after configure) ----------------------------
    @property
    def precision_plugin(self) -> Precision:
        """Lightning's strategy.precision_plugin: the plugin object the user gave (Trainer(plugins=[...]), the
        strategy's precision_plugin=), else `strategy.precision`, the plugin the strategy runs. They differ under an
        engine strategy given its Lightning plugin (DeepSpeedPrecision, FSDPPrecision): the engine runs its own plugin
        of that name, with the user's object's hooks attached to it (tasktrain/plugins/precision/__init__.py)."""
        given = self._lightning_plugin
        return given if given is not None and given._runs is self.precision else self.precision

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision):
        self.precision = self.adopt_precision(plugin)
        self._lightning_plugin = plugin if getattr(plugin, "_runs", None) is self.precision else None

    _lightning_plugin = None  # an engine's Lightning plugin object of the user's, attached to self.precision

    def adopt_precision(self, plugin: Precision) -> Precision:
        """The plugin this strategy runs for a precision plugin object of the user's (Lightning's
        Trainer(plugins=[MixedPrecision("bf16-mixed", "cpu")])), or raise naming what to write instead. Default: the
        plugin itself, on this strategy's device; an engine's plugin (`plugin.engine`: Lightning's DeepSpeedPrecision,
        FSDPPrecision) is refused. Engines with their own precision policy return theirs of the same name."""
        device = self.root_device.type
        if plugin.engine is not None:
            raise ValueError(f"plugins=[{type(plugin).__name__}({plugin.name!r})]: that is the {plugin.engine} "
                             f"strategy's precision plugin, and this run's strategy is {type(self).__name__}. Use "
                             f"MixedPrecision / HalfPrecision / DoublePrecision / Precision, or precision="
                             f"{plugin.name!r}.")
        if isinstance(plugin, MixedPrecision) and plugin.device_type != device:
            raise ValueError(f"plugins=[MixedPrecision({plugin.name!r}, {plugin.device_type!r})]: this run is on "
                             f"{device!r}, so its autocast and GradScaler would do nothing. Write "
                             f"MixedPrecision({plugin.name!r}, {device!r}), or precision={plugin.name!r}.")
        plugin.device_type = device
        return plugin

    _checkpoint_io = None

    @property
    def checkpoint_io(self):
        """Lightning's `strategy.checkpoint_io`: what writes, reads and removes one checkpoint file
        (tasktrain.checkpoint_io.CheckpointIO). Default TorchCheckpointIO, tasktrain's atomic file I/O."""
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io):
        self._checkpoint_io = self.adopt_checkpoint_io(io)

    def adopt_checkpoint_io(self, io):
        """Raise when this strategy cannot write its checkpoints through `io` (a CheckpointIO of the user's);
        return it otherwise. Default: any CheckpointIO (save_checkpoint, load_checkpoint, remove_checkpoint go
        through it)."""
        return io

    @property
    def checkpoint_io_given(self) -> bool:
        """Whether a CheckpointIO was given (to the constructor, or by Trainer(plugins=[...]))."""
        return self._checkpoint_io is not None

    def has_own_checkpoint_io(self) -> bool:
        """Whether a CheckpointIO other than tasktrain's own file I/O writes this strategy's files (a user's: it
        cannot link files or write in the background, it is called instead)."""
        return self._checkpoint_io is not None and type(self._checkpoint_io) is not TorchCheckpointIO

    # -- processes ----------------------------------------------------------------------------------------------------
    def set_world_ranks(self):
        """Tell the user's cluster environment (environment_plugin) this process's rank and the world's size, as
        Lightning's strategies with several processes do when they are built (its set_world_ranks), so that the ranks
        read right after Trainer(...) are the environment's. Default: nothing (one process)."""

    def launch(self, run, *args):
        """Run `run(*args)` on every rank and return what it returns on this one. Default: call it here (this
        process is a rank; a strategy that re-runs the script starts the others in setup_environment).

        A strategy that starts the ranks in new processes itself (DDP's start_method="spawn") pickles `run`
        privately for each (its tensors are copied, not shared), sends `args` through torch.multiprocessing, and
        returns `run.restore(collected)` here, where `collected` is what `run.collect(value)` returned on rank 0."""
        return run(*args)

    def setup_environment(self):
        """Start what the run needs: processes, the process group, the device. Called at the start of every stage
        (fit, validate, ...): a second call must find what the first made. Default: set the CUDA device. Every
        strategy's set-up first tears down what an earlier run kept for a save after it (end_run)."""
        release_kept_runs()
        if self.max_restarts and "TORCHELASTIC_MAX_RESTARTS" not in os.environ:  # issue 29
            raise ValueError(f"Trainer(max_restarts={self.max_restarts}): restarts are torch's elastic agent's, which "
                             "starts the processes of a multi-process strategy; this run is one process. Use "
                             f"`tasktrain launch --num_processes 1 --max_restarts {self.max_restarts} train.py`, "
                             "or strategy='ddp' with devices > 1.")
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        # No accelerator in this process, a CPU device and no input cast: a batch of tensors is already where it
        # belongs, and move_batch hands it on instead of rebuilding it every step.
        self._batches_stay = (self.root_device.type == "cpu" and not _accelerator_visible() and (
            self.precision is None or type(self.precision).convert_input is Precision.convert_input))

    # The watchdog (tasktrain/strategies/watchdog.py). stall_timeout: seconds a rank may go without progress before
    # every rank stops, or None (off); the run's set-up (tasktrain/trainer/runtime.py) sets it before
    # setup_environment. watchdog: the process's Watchdog once a multi-process strategy's setup_environment started
    # one (with a stall_timeout or TASKTRAIN_DEBUG_COLLECTIVES=1); None on one process, which has nobody to wait for.
    # The loops mark progress on it, arm it around their batches and wrap long work in watchdog.long_event(name).
    stall_timeout = None
    watchdog = None
    # max_restarts (issue 29): Trainer(max_restarts=N), set before setup_environment; a multi-process strategy that
    # starts its own processes starts them under torch's elastic agent, which restarts them after a failure.
    max_restarts = 0

    def end_run(self):
        """The end of a Trainer run (fit, validate, test, predict). Default: teardown(). A strategy whose engine holds
        what trainer.save_checkpoint(...) after the run needs (DeepSpeed's shards) keeps it instead, as Lightning's
        strategies keep their model after a run: keep_until_next_run(self), and teardown() follows when the next
        run of this process sets up (any strategy's setup_environment) or at exit, before the process group ends."""
        self.teardown()

    def on_exception(self, exception):
        """Lightning's hook: a run (fit, validate, test, predict) failed with `exception`; called after the callbacks'
        and the DataModule's on_exception. Default: nothing."""

    def teardown(self):
        """End of a stage: drop the wrappers (the process group, if any, may outlive it for the next stage)."""
        self.model = None
        self.optimizers = []
        self._module_order = None
        if self._checkpoint_io is not None:
            self._checkpoint_io.teardown()  # (Lightning's: an AsyncCheckpointIO finishes its writes)

    # -- the module -------------------------------------------------------------------------------------------------
    # (Building a module sharded, module_init_context, is the Sharded capability's: elsewhere the module is built as
    # usual, on the CPU, and moved in setup_module_and_optimizers.)
    def tensor_init_context(self, empty_init=None):
        """Lightning's name for what `trainer.init_module(empty_init)` enters: the Sharded capability's
        module_init_context (built sharded or on meta), elsewhere the root device as the default device; both with
        the precision's default dtype ("64-true": float64, "bf16-true"/"16-true": the half dtype; mixed and 32-bit:
        unchanged), as Lightning's strategies and precision plugins build it."""
        stack = contextlib.ExitStack()
        if isinstance(self, Sharded):
            stack.enter_context(self.module_init_context(empty_init=bool(empty_init)))
        else:
            if empty_init:  # the weights will be loaded: their initialisation is skipped (Lightning's _EmptyInit)
                stack.enter_context(SkipParameterInit())
            stack.enter_context(torch.device(self.root_device))
        if self.precision is not None:
            stack.enter_context(self.precision.tensor_init_context())
        return stack

    def connect(self, model):
        """Lightning's: hold `model` as the strategy's module before a run sets one up (`trainer.lightning_module`
        reads it until a run attaches its own); a run's set-up replaces it."""
        self.module = self.model = model

    @property
    def launcher(self):
        """Lightning's strategy.launcher: what starts this strategy's processes from a plain `python script.py`.
        One process starts nothing: None. (MultiProcess strategies: tasktrain/strategies/world.py.)"""
        return None

    @property
    def _launcher(self):
        """Lightning's private name of `launcher`, read the same."""
        return self.launcher

    @_launcher.setter
    def _launcher(self, value):
        # Lightning's tests swap in a mock launcher (to see its kill() on Ctrl-C): nothing here would call it
        raise AttributeError(
            "strategy._launcher cannot be replaced in tasktrain: the Trainer starts and stops its processes itself "
            "(docs/lightning.md, Lightning internals scripts reach into). Choose how they start with strategy= "
            "(\"ddp\", \"ddp_spawn\") or an outside launcher (torchrun, `tasktrain launch`).")

    def needs_micro_batch_size(self) -> bool:
        """Whether setup_module_and_optimizers reads plan.micro_batch_size (the Trainer then requests the training
        loader before the set-up; otherwise when training starts, as Lightning does). Default: no."""
        return False

    def setup_module_and_optimizers(self, module, optimizers, plan: Plan):
        """Cast, move and wrap `module`, and set up `optimizers` (the ones that step its parameters) for what
        `plan` says the loop will do. Returns (model, optimizers): `model` is what a caller calls as the module
        when plan.calls_steps is False (the Accelerator); the optimizers may be new objects (an engine's).
        Default: the precision's cast, then the move to root_device; the optimizers as given."""
        self.module = module
        module = self.precision.convert_module(module) if self.precision else module
        if plan.move_module:
            module.to(self.root_device)
        if not plan.calls_steps and isinstance(self.precision, MixedPrecision):
            patch_forward(module, self.forward_context)  # the model's own forward runs under autocast
        elif not plan.calls_steps and isinstance(self.precision, HalfPrecision):
            # A custom loop feeds the model tensors of its own too: they are cast to the module's half dtype
            patch_forward(module, self.forward_context, self.precision.convert_input)
        self.model = module
        self.optimizers = list(optimizers)
        return self.model, self.optimizers

    def setup_optimizer(self, optimizer):
        """An optimizer set up after its module (the Accelerator's prepare_optimizer). Default: as it is. Engines
        that must build the module and its optimizer together raise here, saying so."""
        return optimizer

    def unwrap_model(self, model):
        """The user's module inside what setup_module_and_optimizers (or torch.compile) wrapped around it."""
        while True:
            if hasattr(model, "_orig_mod"):  # torch.compile
                model = model._orig_mod
            elif isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel, _StepWrapper)):
                model = model.module
            else:
                return model

    # -- each step ----------------------------------------------------------------------------------------------------
    _batches_stay = False  # decided by setup_environment

    def batch_to_device(self, batch, device=None, dataloader_idx=0):
        """Lightning's: the batch on `device` (default root_device) through the module's transfer_batch_to_device and
        on_after_batch_transfer hooks (the DataModule's where it overrides one), with `dataloader_idx`: the module's
        _apply_batch_transfer_handler, as Lightning's strategies run it. The Trainer moves every batch through this
        call, after the module's on_before_batch_transfer. Without a TaskModule (a plain module, none set up yet) the
        batch is moved as move_batch moves it."""
        handler = getattr(self.module, "_apply_batch_transfer_handler", None)  # (a TaskModule's; not a plain module)
        if handler is None:
            return self.move_batch(batch, device)
        return handler(batch, device=device, dataloader_idx=dataloader_idx)

    def move_batch(self, batch, device=None):
        """Move a batch to `device` (default root_device) and apply the precision's input cast (64-true), running no
        hook: what a transfer_batch_to_device that is not overridden does under the Trainer, and how the Accelerator
        places a prepared loader's batches. Default: tensors in lists, tuples and dicts move; an object with its own
        .to(device) moves itself."""
        if device is None and self._batches_stay and _plain_tensors(batch):
            return batch
        batch = move_to_device(batch, self.root_device if device is None else torch.device(device))
        return self.precision.cast_moved_batch(batch) if self.precision else batch

    def forward_context(self, step=None):
        """The one place a forward enters the precision's autocast: training_step, eval_step and the Accelerator's
        prepared models all go through it. Default: the precision plugin's autocast(); one of the module's steps
        (`step`: "training_step", "validation_step", ...) its step_context(step)."""
        return self.precision.autocast() if step is None else self.precision.step_context(step)

    def training_step(self, *args, **kwargs):
        """The module's training_step(*args, **kwargs) (Lightning's signature: the loop passes (batch, batch_idx), or
        the batch alone to a step that does not take batch_idx, step_arguments), through the wrapper that must see it
        (DDP syncs what went through its forward). Default: directly, under forward_context("training_step")."""
        with self.forward_context("training_step"):
            return self.module.training_step(*args, **kwargs)

    def validation_step(self, *args, **kwargs):
        """Lightning's: the module's validation_step(*args, **kwargs), as eval_step runs it."""
        return self.eval_step(self.module.validation_step, *args, **kwargs)

    def test_step(self, *args, **kwargs):
        """Lightning's: the module's test_step(*args, **kwargs), as eval_step runs it."""
        return self.eval_step(self.module.test_step, *args, **kwargs)

    def predict_step(self, *args, **kwargs):
        """Lightning's: the module's predict_step(*args, **kwargs), as eval_step runs it."""
        return self.eval_step(self.module.predict_step, *args, **kwargs)

    def eval_step(self, step_fn, *args, **kwargs):
        """A validation/test/predict step (`step_fn` is the module's bound method), through the wrapper that must see
        it. Default: under its forward_context(step)."""
        with self.forward_context(step_name(step_fn)):
            return step_fn(*args, **kwargs)

    def no_backward_sync(self, enabled: bool, model=None):
        """Entered around every micro-batch of an accumulation window: enabled=True when the micro-batch does not end
        it. Default: nothing to skip. DDP skips the gradient all-reduce (it must cover the forward, so the Trainer and
        the Accelerator's accumulate() enter it before the forward); DeepSpeed tells its engine where windows end.
        `model`: a model returned by setup_module_and_optimizers (default the last one)."""
        return contextlib.nullcontext()

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        """Backward of `closure_loss` through the precision (GradScaler scales under fp16); returns the loss
        (Lightning's signature: `optimizer` is the one about to step, or None; `args` and `kwargs` go to the tensor's
        backward, as manual_backward's). The loops pass backward_fn= (a module's or a precision plugin's own backward)
        in kwargs. Default: precision.run_backward(closure_loss, *args, **kwargs)."""
        self.precision.run_backward(closure_loss, *args, **kwargs)
        return closure_loss

    def unscale_gradients(self, optimizer):
        """Make `optimizer`'s gradients the true ones before anything reads them (fp16). Idempotent per step."""
        self.precision.unscale(optimizer)

    def clip_gradients(self, optimizer, max_norm=None, max_value=None, norm_type=2.0, unscale=True):
        """Unscale, then clip `optimizer`'s gradients: to a total `norm_type`-norm of max_norm and/or to
        [-max_value, max_value]. Returns the total norm before clipping (None where it is not known here: an engine
        that clips inside its step, see ClipsInsideStep). unscale=False clips the gradients as they are (Lightning's
        module.clip_gradients: in manual optimisation under "16-mixed" they are still scaled there).

        The total norm sums per-tensor norms in the order the parameters come, and another order can change its
        last bit. They come in the module's order, that of a hand-written `clip_grad_norm_(model.parameters(), ...)`,
        not in the optimizer's (whose param groups may regroup them), so that a fit repeats such a loop bit for bit."""
        if unscale:
            self.unscale_gradients(optimizer)
        params = [p for p in self._in_module_order(optimizer) if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type) if params else torch.tensor(0.0)
        if max_norm is not None and params:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        if max_value is not None and params:
            torch.nn.utils.clip_grad_value_(params, max_value)
        return norm

    def _in_module_order(self, optimizer):
        """The optimizer's parameters, in the order of self.module.parameters() (then any the module lacks).
        The order is worked out once per optimizer and param-group layout (clipping runs every step) and kept as
        positions in the optimizer's list: it holds no tensor, and at worst (a new optimizer at a recycled id) it
        orders the sum differently, never clips other tensors."""
        held = [p for group in optimizer.param_groups for p in group["params"]]
        cached = self._module_order
        if cached is None or cached[0] != id(optimizer) or cached[1] != len(held):
            position = {id(p): i for i, p in enumerate(held)}
            order = [position[id(p)] for p in (self.module.parameters() if self.module is not None else ())
                     if id(p) in position]
            taken = set(order)
            order += [i for i in range(len(held)) if i not in taken]
            cached = self._module_order = (id(optimizer), len(held), order)
        return [held[i] for i in cached[2]]

    def optimizer_step(self, optimizer, closure, model=None, **kwargs) -> bool:
        """Step `optimizer` through the precision (Lightning's signature: `closure` computes the loss and gradients,
        or None where they are computed already; `model` the module whose optimizer_step hooks a Lightning precision
        plugin's step sees). Returns whether it really stepped (False: GradScaler or the engine skipped a step with
        inf/NaN gradients); what the optimizer's step returned is `precision.last_step_output`. `kwargs` go to the
        optimizer's step."""
        if model is not None and self.precision.lightning_steps:  # (a tasktrain plugin's step takes no model)
            kwargs["model"] = model
        return self.precision.run_step(optimizer, closure, **kwargs)

    def steps_with_closure(self) -> bool:
        """Whether optimizer_step takes the closure that computes the gradients into the optimizer's step
        (Lightning's 32-bit path; LBFGS needs it). False: the loop runs the closure first, then steps (a
        GradScaler, an engine that steps itself). Default: the precision's say."""
        return self.precision.steps_with_closure

    def zero_grad(self, optimizer):
        """Clear the gradients after a step. Default: set them to None."""
        optimizer.zero_grad(set_to_none=True)

    # -- between ranks (abstract: OneProcess has the identities of a world of one) -------------------------------------
    @abc.abstractmethod
    def reduce(self, tensor, group=None, reduce_op="mean", *, op=None):
        """All-reduce a tensor: "mean", "sum", "max" or "min". Every rank calls it. Lightning's signature
        (tensor, group=None, reduce_op="mean"), plus tasktrain's op= keyword for reduce_op (lightning_reduce_op)."""

    def reduce_boolean_decision(self, decision, all=True) -> bool:
        """One decision for every rank (Lightning's): all=True, every rank's must be True; all=False, any rank's.
        A callback that stops the run on one rank's metric (EarlyStopping) stops it on all of them."""
        votes = self.reduce(torch.tensor(int(decision), device=self.root_device), op="sum")
        return bool(votes == self.world_size) if all else bool(votes)

    @abc.abstractmethod
    def all_gather(self, tensor, group=None, sync_grads=False):
        """Every rank's tensor, stacked along a new first dimension of world_size (Lightning's signature); a strategy
        of one process (OneProcess) returns the tensor itself, as Lightning's SingleDeviceStrategy.
        sync_grads=True: a differentiable gather (torch.distributed.nn.functional.all_gather), whose gradient goes
        back to each rank's tensor; False: the gathered tensors carry no gradient. group= other than None is
        refused (check_gather_group): tasktrain gathers from every rank."""

    @abc.abstractmethod
    def all_gather_object(self, obj):
        """Every rank's picklable object, as a list in rank order."""

    @abc.abstractmethod
    def broadcast(self, obj, src=0):
        """Rank `src`'s picklable object, on every rank."""

    @abc.abstractmethod
    def barrier(self, name=None):
        """Wait until every rank is here."""

    # -- what a Lightning script reads (Lightning's Strategy members) ------------------------------------------------
    @property
    def lightning_module(self):
        """The user's module (a TaskModule), without the DDP/DeepSpeed/compile wrappers around it (Lightning's):
        trainer.lightning_module once the run set it up; None before."""
        return self.module

    def lightning_module_state_dict(self):
        """The module's state dict (Lightning's), with plain names (a compiled submodule's "_orig_mod." left out).
        A sharded strategy gives what the module holds on this rank (FSDP: DTensor shards; DeepSpeed stage 3:
        partitioned parameters are empty), as Lightning's."""
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__}.lightning_module_state_dict(): no module is set up yet. Call "
                               "it during or after trainer.fit/validate/test/predict.")
        return plain_state_dict(self.module.state_dict())

    @contextlib.contextmanager
    def model_sharded_context(self):
        """Build a module inside it to have it created sharded where the strategy can (Lightning's): DeepSpeed
        stage 3 with zero3_init partitions the parameters as they are made; elsewhere nothing changes (FSDP shards
        at set-up: `with trainer.init_module(empty_init=True)` builds on the meta device)."""
        yield

    # -- state --------------------------------------------------------------------------------------------------------
    # State dicts carry plain names: a compiled submodule (`self.model = torch.compile(GPT())`) has keys with
    # torch.compile's "_orig_mod." in them, which checkpoints leave out, so that a file loads into the module compiled
    # or not (tasktrain/checkpoint_io.py).
    def module_state_dict(self, model=None):
        """What a checkpoint holds of the module (`model`: a model set up here, default the module). Default: its
        whole state dict, with plain names. A sharded engine returns what it does not write itself (DeepSpeed:
        nothing, the weights are in its shards next to the checkpoint file)."""
        module = self.unwrap_model(model) if model is not None else self.module
        return plain_state_dict(module.state_dict())

    def load_module_state_dict(self, state_dict, model=None, strict=True):
        """Load what module_state_dict gave (or a plain state dict) into the module (or `model`), compiled
        submodules included."""
        target = self.unwrap_model(model) if model is not None else self.module
        load_plain_state_dict(target, state_dict, strict=strict)

    def optimizer_state(self, optimizer):
        """What a checkpoint holds of an optimizer. Default: its state dict."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer, state):
        optimizer.load_state_dict(state)

    def optimizer_param_names(self, optimizer, model=None):
        """The names of the parameters of each param group of `optimizer`, in order, as the module's state dict
        names them (`model`: a model set up here; default the module): what lets a checkpoint's optimizer state,
        kept by position, be matched to the parameters of another strategy's optimizer (`tasktrain convert`).
        Default: found by identity among the module's named parameters (None for one that is not the module's).
        An engine that replaces the optimizer's parameters by its own (DeepSpeed) records them before it does."""
        module = self.unwrap_model(model) if model is not None else self.module
        names = {id(p): name for name, p in module.named_parameters()} if module is not None else {}
        return [[names.get(id(p)) for p in group["params"]] for group in optimizer.param_groups]

    def full_state_dict(self, model=None):
        """The module's whole state dict, gathered where it is sharded, for export (every rank calls it). `model`: a
        model set up here (or its module); default the module. Default: its state dict, with plain names."""
        module = self.unwrap_model(model) if model is not None else self.module
        return plain_state_dict(module.state_dict())

    def check_full_state_dict(self, obj, where):
        """Raise when `obj`, about to be saved by the main process alone, holds this strategy's shards instead of
        whole tensors (DeepSpeed ZeRO-3 placeholders). Default: nothing is sharded."""

    def full_numel(self, param) -> int:
        """How many elements `param` has in the user's module (a sharding engine's parameter holds only a shard of
        them). Default: param.numel()."""
        return param.numel()

    def device_numel(self, param):
        """How many of `param`'s elements this device holds where the engine partitions parameters over devices
        (ModelSummary's "Params per Device" column, Lightning's for DeepSpeed ZeRO-3); None where it does not.
        Default: None."""
        return None

    def check_full_parameters(self, who: str):
        """Raise when `who` (a callback, in words) needs each rank's module to hold its whole parameters (a copy of
        the weights, a count of them) and this strategy shards them. Default: nothing is sharded."""

    def check_param_groups_can_change(self, who: str):
        """Raise (NotImplementedError) when param groups that `who` adds to an optimizer after set-up would not be
        stepped (an engine that copies the groups into its own optimizer at set-up). Default: the loop steps the
        optimizer as it is."""

    def check_step_can_be_skipped(self, where: str):
        """Raise when a micro-batch may not skip its backward (training_step returning None, `where` says which):
        the other ranks would wait for this one in the backward's gradient all-reduce. Default: allowed on one
        process only."""
        if self.world_size > 1:
            raise RuntimeError(
                f"{where}, which skips the batch; that works on one process only (Lightning's rule), and this run has "
                f"{self.world_size}: every rank must run the backward. Return a loss (multiplied by 0 to skip its "
                "effect), or use manual optimisation.")

    def check_accumulation_can_change(self):
        """Raise when the accumulation window cannot change between epochs (GradientAccumulationScheduler): an engine
        that writes it into its config at set-up. Default: the loop reads it at each epoch."""

    def trainable_parameters_changed(self, who: str):
        """Called on every rank at the same point of training after `who` (a callback, in words) changed which of
        the module's parameters require gradients (a fine-tuning callback unfreezing a part). A strategy that fixed
        that set at set-up rebuilds what depends on it, or raises. Default: backward and the optimizer read
        requires_grad as it is, nothing to do."""

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None):
        """Write a named checkpoint at `filepath` (a file; a directory for strategies whose ranks write shards),
        never leaving a broken one there. Every rank calls it. Default: rank 0 writes the file through checkpoint_io
        (TorchCheckpointIO: atomically); `storage_options` is for a CheckpointIO of the user's (Lightning's
        signature: save_checkpoint(checkpoint, filepath, storage_options=None))."""
        path = filepath
        if storage_options is not None and type(self.checkpoint_io) is TorchCheckpointIO:
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options)  # its TypeError, on every rank
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.barrier("save_checkpoint")

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """Read what save_checkpoint wrote (Lightning's signature). Every rank calls it. Default: through
        checkpoint_io (TorchCheckpointIO: load_checkpoint_file, plain data only); weights_only=False (a file you
        trust, holding other objects) goes to checkpoint_io.load_checkpoint(path, weights_only=False)."""
        path = checkpoint_path
        if not self.has_own_checkpoint_io() and weights_only is not False:
            return load_checkpoint_file(path)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        if not isinstance(checkpoint, dict):
            raise CheckpointError(f"{type(self.checkpoint_io).__name__}.load_checkpoint({path!r}) returned a "
                                  f"{type(checkpoint).__name__}, not the checkpoint dict its save_checkpoint was given.")
        return upgrade_layout(checkpoint)

    def save_checkpoint_into(self, directory: str, checkpoint: dict, filename: str):
        """Write `checkpoint` as directory/filename, into a directory that may hold other files (the Accelerator's
        save_state), plus the shards this strategy writes itself. Every rank calls it. Default: like
        save_checkpoint."""
        self.save_checkpoint(checkpoint, os.path.join(directory, filename))

    def load_checkpoint_from(self, directory: str, filename: str) -> dict:
        """Read what save_checkpoint_into wrote (and load the shards it wrote into the set-up module/optimizer)."""
        path = os.path.join(directory, filename)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist: load_state expects a directory written by "
                                    "accelerator.save_state(dir).")
        return self.load_checkpoint(path)

    def remove_checkpoint(self, filepath):
        """Delete a checkpoint written by save_checkpoint (a file or a directory). Every rank calls it."""
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)

    def link_checkpoint(self, src: str, dst: str):
        """Make `dst` the same checkpoint as `src` without writing it twice (ModelCheckpoint's last.ckpt): hard
        links where possible. Every rank calls it. Default: rank 0 links the file."""
        if self.is_global_zero:
            atomic_link(src, dst)
        self.barrier("link_checkpoint")

    # -- background saves (issue 29) -----------------------------------------------------------------------------------
    _checkpoint_writer = None

    @property
    def checkpoint_writer(self):
        """This process's CheckpointWriter (checkpoint_io): one background write at a time."""
        if self._checkpoint_writer is None:
            self._checkpoint_writer = CheckpointWriter()
        return self._checkpoint_writer

    def check_async_save(self, weights_only=False):
        """Raise, before training, when this strategy cannot write checkpoints in the background (naming what is
        missing and the fix). Every rank calls it. Default: it can, unless a CheckpointIO of the user's writes the
        files (the background writer would bypass it)."""
        if self.has_own_checkpoint_io():
            raise ValueError(f"ModelCheckpoint(async_save=True) writes in tasktrain's background writer, which would "
                             f"bypass plugins=[{type(self.checkpoint_io).__name__}(...)]. For background writes through "
                             "your CheckpointIO, wrap it: plugins=[AsyncCheckpointIO(YourIO())] with async_save=False.")

    def save_checkpoint_async(self, checkpoint: dict, path: str, on_complete=None, filename=None):
        """save_checkpoint with the write in the background: it returns once `checkpoint` is staged (copied into CPU
        memory, checkpoint_io.stage_to_cpu), which is all the training step waits for. The checkpoint appears at
        `path` (written under a temporary name, renamed into place) only once every rank's files of it are complete
        and flushed; then on_complete() runs on rank 0, in the writer's thread (file operations only, no
        collectives). With `filename`, `path` is a directory holding the checkpoint as `filename` (the
        Accelerator's save_state), replaced as a whole. One write at a time: a save that finds one in flight waits
        for it first, so a process holds at most one staged copy of the state. Every rank calls it; returns the
        CheckpointWriter (wait() blocks until this process's part is written). Default: rank 0 writes one file."""
        writer = self.checkpoint_writer
        writer.wait()
        if not self.is_global_zero:
            return writer
        staged = writer.staged["checkpoint"] = stage_to_cpu(checkpoint, writer.staged.get("checkpoint"))
        path = os.path.abspath(os.fspath(path))

        def write():
            if filename is None:
                atomic_save(staged, path)
            else:
                tmp = f"{path}.tmp"
                remove_path(tmp)  # the leftover of an interrupted save
                os.makedirs(tmp)
                fsync_save(staged, os.path.join(tmp, filename))
                replace_dir(tmp, path)
            if on_complete is not None:
                on_complete()

        writer.start(write, path)
        return writer

    def check_can_save(self):
        """Raise, naming what to do instead, where this strategy cannot write a checkpoint now (trainer.save_checkpoint
        after its run released an engine). Default: it always can."""

    def wait_for_checkpoint(self, release=False):
        """Block until this process's background checkpoint write, if one is in flight, is complete; raise its
        error. No collective: every rank waits for its own part (rank 0's part includes making it complete).
        release=True (the end of a run) also frees the staging copy kept for the next save."""
        if self._checkpoint_writer is not None:
            try:
                self._checkpoint_writer.wait()
            finally:
                if release:
                    self._checkpoint_writer.staged.clear()


# -- what a finished run keeps for a save after it (Strategy.end_run) ---------------------------------------------------
_KEPT = []  # strategies whose last run's engine is kept until the next run sets up or the process exits
_KEPT_EXIT_HOOK = []


class SkipParameterInit(torch.overrides.TorchFunctionMode):
    """Modules built inside it skip their parameters' initialisation: torch.nn.init's functions give their tensor back
    untouched (uninitialised memory), for weights a checkpoint will overwrite (`trainer.init_module(empty_init=True)`;
    Lightning's strategies do the same). Any other function runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def keep_until_next_run(strategy):
    """Keep `strategy`'s engine after its run (end_run): release_kept_runs() tears it down when the next run of this
    process sets up, or at exit. The exit hook is registered after the process group's own (atexit runs the last
    registered first), so engines go before the group, as gloo needs (FINDINGS)."""
    if strategy not in _KEPT:
        _KEPT.append(strategy)
    if not _KEPT_EXIT_HOOK:
        import atexit

        atexit.register(release_kept_runs)
        _KEPT_EXIT_HOOK.append(True)


def release_kept_runs():
    """Tear down every strategy that kept its last run's engine: a new run is setting up (one engine per process at a
    time: a new engine, a new group of one, DeepSpeed's patched torch functions undone) or the process exits. Local
    work only (no collective): every rank calls it at the same point of the script anyway."""
    while _KEPT:
        strategy = _KEPT.pop()
        try:
            strategy.teardown()
        except Exception as err:  # the next run (or the exit) goes on: one line, not a second traceback
            print(f"[tasktrain] tearing down the kept {type(strategy).__name__} run failed: {type(err).__name__}: {err}",
                  flush=True)


# -- the world of one process ------------------------------------------------------------------------------------------
class OneProcess:
    """The core's world for a strategy that runs in one process (SingleDevice, DataParallel): rank 0 of a world of
    one, and the collectives are identities. A mixin: `class Mine(OneProcess, Strategy)`."""

    global_rank = 0
    local_rank = 0
    node_rank = 0
    world_size = 1

    def reduce(self, tensor, group=None, reduce_op="mean", *, op=None):
        lightning_reduce_op(group, reduce_op, op)  # (checked: one process reduces to itself)
        return tensor

    def all_gather(self, tensor, group=None, sync_grads=False):
        check_gather_group(group)
        return tensor  # (Lightning's SingleDeviceStrategy: the tensor itself, no new dimension, its gradient kept)

    def all_gather_object(self, obj):
        return [obj]

    def broadcast(self, obj, src=0):
        return obj

    def barrier(self, name=None):
        pass


# -- capabilities: small interfaces a strategy inherits explicitly --------------------------------------------------
class MultiProcess(abc.ABC):
    """Several processes form one world, which the strategy joins (torchrun, SLURM, `tasktrain launch`) or starts
    itself (DDP re-runs the script, or spawns with start_method="spawn" in launch()). The core's world is then
    implemented over a process group. A launcher that started several processes needs such a strategy (the run's
    set-up refuses one without it), and the loops hand it what concerns those processes (the methods below)."""

    @abc.abstractmethod
    def configure_processes(self, process_group_backend=None, timeout=None, ddp_kwargs=None):
        """Accelerate's InitProcessGroupKwargs / DistributedDataParallelKwargs, before setup_environment. (One
        process has no process group and no DDP wrapper: the Accelerator hands them to MultiProcess strategies
        only, as Accelerate ignores them on one process.)"""

    @abc.abstractmethod
    def forward_signal(self, signum):
        """A signal this process received (SIGTERM), for the worker processes it started itself, if any."""

    @abc.abstractmethod
    def mark_failed(self):
        """This rank failed: at exit, do not wait for the others."""


class Sharded(abc.ABC):
    """Parameters, gradients or optimizer state are split over the ranks by an engine (DeepSpeed ZeRO, FSDP2).
    Besides module_init_context below, such a strategy overrides the core's state methods: full_state_dict gathers
    (a collective: every rank calls it), check_full_state_dict refuses shards about to be saved by one process,
    save_checkpoint / save_checkpoint_into write directories of shards (every rank writes its own), and
    link_checkpoint / remove_checkpoint handle them."""

    @contextlib.contextmanager
    def model_sharded_context(self):
        """Lightning's: module_init_context(empty_init=False) (DeepSpeed stage 3 with zero3_init: zero.Init)."""
        with self.module_init_context(empty_init=False):
            yield

    @abc.abstractmethod
    def module_init_context(self, empty_init=False):
        """`with trainer.init_module(empty_init): module = Model()` enters it: create the parameters sharded
        (DeepSpeed zero3_init) or on the meta device (FSDP), so no rank ever holds the whole model. `empty_init=True`
        says the weights will be loaded from a checkpoint, so initialising them is wasted work: an engine that can
        skip it does. (Without this capability the module is built as usual, on the CPU, and moved at set-up.)"""

    def adopt_checkpoint_io(self, io):
        """The engine writes directories of shards itself (Lightning's DeepSpeedStrategy and FSDP's sharded state
        dicts do not call a CheckpointIO's save_checkpoint either): only tasktrain's own file I/O is accepted."""
        if type(io) is not TorchCheckpointIO:
            raise ValueError(f"plugins=[{type(io).__name__}(...)]: {type(self).__name__} writes its checkpoints as "
                             "directories of shards through its engine, not through a CheckpointIO, so the plugin "
                             "would never be called. Leave it out, or use strategy='ddp' (single checkpoint files) "
                             "with it.")
        return io


class ClipsInsideStep(abc.ABC):
    """The engine owns backward and the optimizer step and clips the gradients inside its step, to the value the
    plan carried (DeepSpeed). The core's step methods then map onto the engine: clip_gradients only configures or
    checks a request and returns None; the Accelerator's clip_grad_norm_ takes the step early and returns
    last_grad_norm()."""

    @abc.abstractmethod
    def last_grad_norm(self):
        """The 2-norm of the gradients of the last step, before clipping (a tensor), or None where the engine does
        not compute it."""


_TAKES_BATCH_IDX = weakref.WeakKeyDictionary()


def takes_batch_idx(step_fn) -> bool:
    """Lightning's rule for a step method: it gets batch_idx when it names it, takes *args, or has two or more
    positional parameters (the names are free: `training_step(self, x, batch_nb)`); `training_step(self, batch)`
    gets the batch alone. Read once per function."""
    key = getattr(step_fn, "__func__", step_fn)
    try:
        return _TAKES_BATCH_IDX[key]
    except (KeyError, TypeError):
        pass
    try:
        params = list(inspect.signature(step_fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes = (any(p.name == "batch_idx" for p in params) or any(p.kind == p.VAR_POSITIONAL for p in params)
             or len(positional) >= 2)
    try:
        _TAKES_BATCH_IDX[key] = takes
    except TypeError:  # not weak-referenceable: read again next time
        pass
    return takes


def step_arguments(step_fn, batch, batch_idx, *extra):
    """(batch, batch_idx, *extra), without batch_idx for a step that does not take it (takes_batch_idx)."""
    return (batch, batch_idx, *extra) if takes_batch_idx(step_fn) else (batch, *extra)


class _StepWrapper(torch.nn.Module):
    """The base of the wrappers that route a module's steps through an engine's forward (DDP, DeepSpeed): unwrapped
    by Strategy.unwrap_model like torch's own wrappers."""

    def __init__(self, module):
        super().__init__()
        self.module = module


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


def step_name(step_fn):
    """The name of the module's step a strategy runs ("validation_step", ...), for the precision's step context."""
    return getattr(step_fn, "__name__", None)


def every_rank(group) -> bool:
    """Whether `group` means every rank: None, or torch.distributed's WORLD group (what Lightning's module.all_gather
    passes to the strategy when given none)."""
    if group is None:
        return True
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and group is dist.group.WORLD


def check_gather_group(group):
    """strategy.all_gather(tensor, group=...): tasktrain gathers from every rank; a group of the script's is refused
    (torch.distributed.group.WORLD, every rank, is taken)."""
    if not every_rank(group):
        raise ValueError("strategy.all_gather(..., group=...): tasktrain's strategies gather from every rank. Gather "
                         "over a group of your own with torch.distributed.all_gather(tensors, tensor, group=group), "
                         "or gather from all ranks and keep the rows you need.")


def lightning_reduce_op(group=None, reduce_op="mean", op=None):
    """The reduction of strategy.reduce(tensor, group=None, reduce_op="mean", *, op=None) (Lightning's signature,
    plus tasktrain's op= keyword): "mean" / "avg", "sum", "max", "min" in any case, or torch's ReduceOp. group=
    other than None is refused: tasktrain reduces over every rank."""
    if isinstance(group, str):
        raise ValueError(f"strategy.reduce(tensor, {group!r}): the second parameter is Lightning's group (a process "
                         f"group), not the reduction. Pass reduce_op={group!r} (or op={group!r}).")
    if not every_rank(group):
        raise ValueError("strategy.reduce(..., group=...): tasktrain's strategies reduce over every rank. Reduce over "
                         "a group of your own with torch.distributed.all_reduce(tensor, group=group).")
    if op is not None:
        if not (isinstance(reduce_op, str) and reduce_op == "mean"):
            raise ValueError(f"strategy.reduce(op={op!r}, reduce_op={reduce_op!r}): give the reduction once.")
        reduce_op = op
    if reduce_op is None:  # (Lightning's reduce_op=None is its default, the mean)
        return "mean"
    import torch.distributed as dist

    by_op = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min", dist.ReduceOp.AVG: "mean"}
    if isinstance(reduce_op, str):
        name = {"avg": "mean"}.get(reduce_op.lower(), reduce_op.lower())
        if name in ("mean", "sum", "max", "min"):
            return name
    elif reduce_op in by_op:
        return by_op[reduce_op]
    raise ValueError(f"strategy.reduce(reduce_op={reduce_op!r}): use 'mean' ('avg'), 'sum', 'max', 'min' or one of "
                     "torch.distributed.ReduceOp's SUM, AVG, MAX, MIN.")
