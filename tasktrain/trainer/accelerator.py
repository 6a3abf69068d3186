"""Accelerator: the custom-loop API (Accelerate's names) over the Strategy and Precision objects the Trainer uses.

    accelerator = Accelerator()                      # mixed_precision / strategy / accumulation from `tasktrain launch`
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for source, targets in data:                     # this rank's shard, reshuffled every epoch, on the device
        with accelerator.accumulate(model):          # no gradient all-reduce on micro-batches that do not step
            loss = F.cross_entropy(model(source), targets)   # the forward runs under the precision's autocast
            accelerator.backward(loss)               # strategy.backward: scaled under fp16, / window under accumulation
            accelerator.clip_grad_norm_(model.parameters(), 1.0)   # strategy.clip_gradients: unscale, then clip
            optimizer.step()                         # strategy.optimizer_step, only where the window ends
            optimizer.zero_grad()

Nothing here runs a collective, a host sync or an allocation per step that the same step in the Trainer would not.
What is written here is bookkeeping; backward, stepping, clipping, no_sync and the collectives are the strategy's.
"""
import contextlib
import itertools
import os
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from tasktrain import checkpoint_io as ckpt_io
from tasktrain.loggers.trackers import GeneralTracker, check_log_with, make_trackers
from tasktrain.strategies import requeue
from tasktrain.strategies.base import ClipsInsideStep, GradientClip, MultiProcess, Plan, Sharded
from tasktrain.strategies.precision import unpatch_forward
from tasktrain.strategies.watchdog import DEFAULT_STALL_TIMEOUT, watched_action
from tasktrain.trainer.data import prepare_train_data
from tasktrain.trainer.dispatch import prepare_for_accelerator
from tasktrain.trainer.epoch import EpochIterator
from tasktrain.trainer.local_sgd import LocalSGDRecord
from tasktrain.trainer.prepared import PreparedDataLoader  # (its public path is this module too)
from tasktrain.trainer.shard import ShardData, can_shard
from tasktrain.trainer.run_state import (Objects, Optimizers, RandomStates, RunState, Value, Weights, check_counts,
                                         upgrade)
from tasktrain.trainer.runtime import ACCELERATOR_NAMES, broadcast_seed, build_runtime, rng_restore_of_this_rank
from tasktrain.tree import apply_to_leaves

STATE_FILE = "accelerator_state.pt"
@dataclass
class ProjectConfiguration:
    """Where a run writes: project_dir, logging_dir (default: project_dir) for trackers, and save_state's
    automatic naming (project_dir/checkpoints/checkpoint_{iteration}, at most total_limit kept). Accelerate's
    name (tasktrain.utils.ProjectConfiguration is this class)."""

    project_dir: Optional[str] = None
    logging_dir: Optional[str] = None
    automatic_checkpoint_naming: bool = False
    total_limit: Optional[int] = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir=None):
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self):
        self.set_directories(self.project_dir)


class Accelerator:
    """Prepare a model, optimizer, data loaders and schedulers for the chosen strategy and precision: the custom-loop
    API over the core (the strategy, the run state, the epoch iterator), with tasktrain's own arguments.

    `tasktrain.Accelerator` is this class under Accelerate's constructor (tasktrain/compat/accelerate: its plugins,
    kwargs handlers and configuration objects mapped onto these arguments, its process-state helpers and file
    layout). The arguments here: `strategy` (a registry name or a Strategy), `mixed_precision` (our names or
    Accelerate's), `gradient_accumulation_steps`, `cpu`, `log_with`, `project_config` (a ProjectConfiguration),
    `step_scheduler_with_optimizer`, `stall_timeout` (seconds, default 300; None or 0: off: on several processes,
    a rank that makes no progress for that long while it iterates a prepared data loader stops every rank with a
    message naming it), and what the compat layer translates Accelerate's objects into: `rng_types` (names),
    `data_seed`, `sync_each_batch`, `process_options` (DDP and process-group options for the strategy),
    `precision_options` (GradScaler and autocast options), `dispatch_batches` and `split_batches`
    (DataLoaderConfiguration's: rank 0 reads and sends each process its slice, tasktrain/trainer/dispatch.py).
    Arguments left as None come from `tasktrain launch` (its TASKTRAIN_* variables), then from the defaults.

    The accumulation and scheduler rules (tasktrain.Accelerator passes Accelerate's):
    `window_loss` "own": backward divides a loss by the length of its window (a short last window by its own
    length), "steps": always by gradient_accumulation_steps (Accelerate's, and the Trainer's, as Lightning's); `scheduler_steps_per_process` False: a prepared
    scheduler steps once per optimizer step, True: num_processes times (each process's batch counted as one
    schedule step; a scheduler with total_steps, OneCycleLR, stops at its end); `sync_with_dataloader` True: a
    window also ends at a prepared loader's last batch and the next epoch starts a new one, False: windows count
    micro-batches only, across epochs. `device_placement` False: prepared models and batches stay where the
    script put them. `compile_options` (a dict, e.g. {"backend": "inductor"}): each prepared model is compiled with
    torch.compile(model, **compile_options) after the strategy set it up; unwrap_model returns the module given.
    """

    def __init__(self, *, strategy=None, mixed_precision=None, gradient_accumulation_steps=None, cpu=False,
                 log_with=None, project_config=None, step_scheduler_with_optimizer=True,
                 stall_timeout=DEFAULT_STALL_TIMEOUT, rng_types=(), data_seed=None, sync_each_batch=False,
                 process_options=None, precision_options=None, split_batches=False, even_batches=True,
                 use_seedable_sampler=False, dispatch_batches=None, window_loss="own",
                 scheduler_steps_per_process=False, sync_with_dataloader=True, device_placement=True,
                 compile_options=None):
        if window_loss not in ("own", "steps"):
            raise ValueError(f"Accelerator(window_loss={window_loss!r}): use 'own' (a loss is divided by its window's "
                             "length) or 'steps' (always by gradient_accumulation_steps).")
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration()
        self.log_with = check_log_with(log_with, self.logging_dir)  # a bad name or a missing package fails now
        self.trackers = []
        # The launch config, the strategy and its precision, the accumulation: the Trainer's rules too. The
        # Accelerator never starts processes: a launcher (tasktrain launch, torchrun, SLURM) did, or it is one.
        if not cpu and os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "y", "yes", "t", "true", "on"):
            cpu = True  # (Accelerate's AcceleratorState reads it: what `accelerate launch --cpu` sets)
        runtime = build_runtime(accelerator="cpu" if cpu else "auto", strategy=strategy, precision=mixed_precision,
                                accumulate_grad_batches=gradient_accumulation_steps, names=ACCELERATOR_NAMES,
                                stall_timeout=stall_timeout, custom_loop=True)
        self.strategy = runtime.strategy
        if not device_placement and isinstance(self.strategy, Sharded):
            raise ValueError(f"Accelerator(device_placement=False) with {self.strategy.describe()}: a sharding "
                             "strategy places each rank's shard itself. Leave device_placement True, or use a "
                             "single device or DDP.")
        if compile_options is not None and isinstance(self.strategy, ClipsInsideStep):
            raise ValueError(f"Accelerator(compile_options / dynamo_backend) with {self.strategy.describe()}: the "
                             "engine's model is not compiled here. Compile the model yourself (torch.compile) before "
                             "prepare, or use a single device, DDP or FSDP.")
        self.gradient_accumulation_steps = runtime.accumulate_grad_batches
        self.stall_timeout = runtime.stall_timeout  # watchdog (issue 19)
        # The launch config's gradient_clipping: an engine that clips inside its step (DeepSpeed) is set up with it;
        # elsewhere the script's own clip_grad_norm_ calls decide.
        self._launch_clipping = () if runtime.gradient_clip_val is None else (
            GradientClip(runtime.gradient_clip_val, "norm", 2.0, "the launch config's gradient_clipping"),)
        if isinstance(self.strategy, MultiProcess):  # one process has no group and no DDP wrapper to configure
            self.strategy.configure_processes(**(process_options or {}))
        self.strategy.precision.set_options(**(precision_options or {}))
        if self.project_configuration.save_on_each_node and runtime.num_nodes > 1:
            raise ValueError("ProjectConfiguration(save_on_each_node=True): save_state writes from every process "
                             "into one directory, which must be on storage all machines share; set it False.")
        self.strategy.setup_environment()
        self._requeue = requeue.AcceleratorRequeue(self)  # issue 40: SLURM's warning signal
        self._watchdog = self.strategy.watchdog  # None on one process; watches the prepared loaders' loops
        # backward and optimizer.step are progress inside a prepared loader's batch (marked only with a watchdog)
        self._backward = watched_action(self._watchdog, "backward", self.strategy.backward)
        self._optimizer_step = watched_action(self._watchdog, "optimizer.step", self.strategy.optimizer_step)
        self.step_scheduler_with_optimizer = bool(step_scheduler_with_optimizer)
        self._sync_each_batch = bool(sync_each_batch)
        self._rng_types = list(rng_types or ())
        self._window_loss = window_loss
        self._scheduler_steps_per_process = bool(scheduler_steps_per_process)
        self._sync_with_dataloader = bool(sync_with_dataloader)
        self.device_placement = bool(device_placement)
        self._compile_options = None if compile_options is None else dict(compile_options)

        self.sync_gradients = True  # False inside accumulate() on a micro-batch that does not end the window
        self._window = self.gradient_accumulation_steps  # what backward divides the loss by
        self._micro_step = 0  # micro-batches counted by accumulate() when no prepared loader tells the position
        self._window_has_grads = False  # a window in progress holds gradients: zero_grad must keep them
        self._models = []  # (prepared, original)
        self._optimizers = []  # PreparedOptimizer
        self._schedulers = []  # PreparedScheduler
        self._loaders = []  # PreparedDataLoader
        self._active_loaders = []  # loaders being iterated, innermost last
        self._custom = []  # register_for_checkpointing
        self._local_sgd = LocalSGDRecord(self)  # the LocalSGD in use, saved for an exact resume (trainer/local_sgd.py)
        self._data_seed = data_seed
        self._data_seed_drawn = False  # no data seed given: a generator-less loader draws as Accelerate's does        # how prepared map-style loaders shard (tasktrain/trainer/shard.py: Accelerate's order)
        self.split_batches, self.even_batches = bool(split_batches), bool(even_batches)
        self.use_seedable_sampler = bool(use_seedable_sampler)
        # DataLoaderConfiguration(dispatch_batches=...): rank 0 reads and dispatches (tasktrain/trainer/dispatch.py)
        self.dispatch_batches = dispatch_batches
        self._triggered = False  # set_trigger / check_trigger
        self._steps = 0  # optimizer steps of the first prepared optimizer (seeds the random streams of new ranks)
        self._ended = False
        if isinstance(self.strategy, MultiProcess):
            import atexit

            # Scripts rarely call end_training(), and their prepared DDP wrappers live in module globals until
            # interpreter finalisation: release them at exit, before the strategy's own exit hook ends the group.
            atexit.register(self.end_training)

    @property
    def project_dir(self):
        return self.project_configuration.project_dir

    @property
    def logging_dir(self):
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self):
        """The number the next automatically named checkpoint gets (ProjectConfiguration.iteration)."""
        return self.project_configuration.iteration

    # -- who am I ----------------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.strategy.root_device

    @property
    def process_index(self) -> int:
        return self.strategy.global_rank

    @property
    def local_process_index(self) -> int:
        return self.strategy.local_rank

    @property
    def num_processes(self) -> int:
        return self.strategy.world_size

    @property
    def is_main_process(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def is_local_main_process(self) -> bool:
        return self.strategy.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.strategy.global_rank == self.strategy.world_size - 1

    @property
    def use_distributed(self) -> bool:
        return self.strategy.world_size > 1

    @property
    def precision_name(self) -> str:
        """Our name of the precision: "32-true", "16-mixed", "bf16-mixed", "64-true", "bf16-true", "16-true"."""
        return self.strategy.precision.name

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when GradScaler skipped the last step of a prepared optimizer (inf/NaN gradients under fp16)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    def print(self, *args, **kwargs):
        if self.is_main_process:
            print(*args, **kwargs)

    # -- prepare -----------------------------------------------------------------------------------------------------
    def init_module(self, empty_init=False):
        """`with accelerator.init_module(empty_init=True): model = Model()`: build the model the way the strategy
        wants it built (strategy.module_init_context, the same as trainer.init_module). Under FSDP with
        empty_init=True on the meta device: prepare then allocates and initialises (reset_parameters) each rank's
        shard only, so no rank ever holds the whole model (tested under FSDP; see docs/fsdp.md)."""
        if isinstance(self.strategy, Sharded):
            return self.strategy.module_init_context(empty_init=empty_init)
        return contextlib.nullcontext()

    def prepare(self, *objects):
        """Prepare models, optimizers, data loaders and schedulers, given in any order; returns them in that order.

        A model and the optimizers over its parameters are set up together (strategy.setup_module_and_optimizers:
        an engine such as DeepSpeed's builds both at once), with a plan from the other objects of the call."""
        kinds = [_kind(obj) for obj in objects]
        out = list(objects)
        models = [i for i, kind in enumerate(kinds) if kind == "model"]
        # (An optimizer prepared before stays as it is.)
        optimizers = [i for i, kind in enumerate(kinds) if kind == "optimizer"
                      and not isinstance(objects[i], PreparedOptimizer)]
        loaders = [objects[i] for i, kind in enumerate(kinds) if kind == "dataloader"]
        plan = self._plan(loaders, has_schedulers="scheduler" in kinds)
        claimed = set()
        for i in models:
            # One model: every optimizer of the call is its. Several: each takes the optimizers over its parameters.
            mine = [j for j in optimizers if len(models) == 1 or _steps_only(objects[j], objects[i])]
            out[i], prepared = self._prepare_model(objects[i], [objects[j] for j in mine], plan)
            for j, optimizer in zip(mine, prepared):
                out[j] = optimizer
            claimed.update(mine)
        for j, kind in enumerate(kinds):
            if kind == "optimizer" and j not in claimed:
                out[j] = self.prepare_optimizer(objects[j])
        for i, kind in enumerate(kinds):
            if kind == "dataloader":
                out[i] = self.prepare_data_loader(objects[i])
            elif kind == "scheduler":
                out[i] = self.prepare_scheduler(objects[i])
        self._requeue.after_prepare()  # issue 40: a requeued job loads its pre-emption state
        return out[0] if len(out) == 1 else tuple(out)

    def prepare_model(self, model):
        return self._prepare_model(model, [], self._plan([], has_schedulers=False))[0]

    def prepare_optimizer(self, optimizer):
        """An optimizer whose model was prepared before (an engine that builds both together refuses it)."""
        if isinstance(optimizer, PreparedOptimizer):
            return optimizer
        prepared = PreparedOptimizer(self.strategy.setup_optimizer(optimizer), self, original=optimizer)
        self._optimizers.append(prepared)
        return prepared

    def _prepare_model(self, model, optimizers, plan):
        for prepared, _ in self._models:
            if model is prepared:
                return prepared, [self.prepare_optimizer(o) for o in optimizers]
        prepared, set_up = self.strategy.setup_module_and_optimizers(model, optimizers, plan)
        if self._compile_options is not None and not hasattr(prepared, "_orig_mod"):
            # last, around what the strategy set up (its DDP wrapper included), as Accelerate compiles
            prepared = torch.compile(prepared, **self._compile_options)
        self._models.append((prepared, model))
        out = []
        for optimizer, original in zip(set_up, optimizers):
            wrapped = PreparedOptimizer(optimizer, self, original=original)
            self._optimizers.append(wrapped)
            out.append(wrapped)
        return prepared, out

    def _plan(self, loaders, has_schedulers):
        """What this Accelerator's loop does, for the strategy: the script calls the model itself, divides each
        loss by its window in backward(), and clips where it says."""
        batch_size = next((loader.batch_size for loader in loaders if getattr(loader, "batch_size", None)), None)
        return Plan(training=True, calls_steps=False, micro_batch_size=batch_size,
                    accumulate_grad_batches=self.gradient_accumulation_steps, loss_divided_by_window=True,
                    clipping=self._launch_clipping, has_lr_schedulers=has_schedulers,
                    move_module=self.device_placement)

    def prepare_scheduler(self, scheduler):
        if isinstance(scheduler, PreparedScheduler):
            return scheduler
        inner = getattr(scheduler, "optimizer", None)
        owners = [opt for opt in self._optimizers if opt.optimizer is inner or opt is inner]
        prepared = PreparedScheduler(scheduler, owners, self)
        self._schedulers.append(prepared)
        return prepared

    def prepare_data_loader(self, loader):
        if isinstance(loader, PreparedDataLoader):
            return loader
        if self._data_seed is None:
            self._data_seed = broadcast_seed(self.strategy)
            self._data_seed_drawn = True
        prepared = prepare_for_accelerator(loader, self)  # dispatched, or an IterableDataset cut by global batch
        if prepared is not None and self.strategy.data_parallel_size != self.num_processes:  # issue 39
            raise ValueError("A dispatched loader or an IterableDataset is cut into one part per process, but under "
                             "tensor parallelism the processes of a tensor-parallel group must read the same batch: "
                             "prepare a map-style DataLoader (sharded over the data-parallel ranks only).")
        if prepared is not None:
            self._loaders.append(prepared)
            return prepared
        if can_shard(loader):  # a map-style DataLoader: Accelerate's order (whole batches per rank)
            data = ShardData(loader, self.strategy.data_parallel_size, self.strategy.data_parallel_rank, self._data_seed,
                             split_batches=self.split_batches, even_batches=self.even_batches,
                             use_seedable_sampler=self.use_seedable_sampler, broadcast=self.strategy.broadcast,
                             seed_given=not self._data_seed_drawn)
        else:
            data = prepare_train_data(loader, self.strategy.data_parallel_size, self.strategy.data_parallel_rank,
                                      self._data_seed)
        prepared = PreparedDataLoader(data, self, source=loader)
        self._loaders.append(prepared)
        return prepared

    # -- the step ----------------------------------------------------------------------------------------------------
    def backward(self, loss, **kwargs):
        """strategy.backward (GradScaler-scaled under fp16); divided by the micro-batches of the accumulation window
        (window_loss="own") or by gradient_accumulation_steps (window_loss="steps", Accelerate's rule)."""
        loss = EpochIterator.per_window(loss, self._window if self._window_loss == "own" else
                                        self.gradient_accumulation_steps)
        if not self.sync_gradients:
            self._window_has_grads = True
        if isinstance(self.strategy, ClipsInsideStep):
            for optimizer in self._optimizers:
                optimizer.stepped_early = False  # a new window: its step is still to come
        # Whether this micro-batch ends the window, told again here: an engine that reduces in its backward
        # (DeepSpeed) must know it then, even when the script uses no accumulate(). (DDP's no_sync has to cover the
        # forward: accumulate(model) enters it; around the backward alone it changes nothing.)
        with self.strategy.no_backward_sync(not self.sync_gradients):
            self._backward(loss, None, **kwargs)

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """Unscale (fp16), then clip; returns the total norm before clipping. A no-op (None) on micro-batches that do
        not step: clipping a partly accumulated gradient would clip the wrong thing."""
        if not self.sync_gradients:
            return None
        return self._clip(parameters, max_norm=max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters, clip_value):
        """Unscale (fp16), then clamp every gradient to [-clip_value, clip_value]; a no-op on non-stepping
        micro-batches."""
        if self.sync_gradients:
            self._clip(parameters, max_value=clip_value)

    def _clip(self, parameters, max_norm=None, max_value=None, norm_type=2.0):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        wanted = {id(p) for p in params}
        owners = []
        for opt in self._optimizers:
            held = opt.parameter_ids()
            if not held.isdisjoint(wanted):
                owners.append((opt, held))
        if isinstance(self.strategy, ClipsInsideStep):  # one engine, one optimizer
            prepared = owners[0][0] if owners else (self._optimizers[0] if len(self._optimizers) == 1 else None)
            return self._clip_inside_step(prepared, max_norm, max_value, norm_type)
        if len(owners) == 1 and owners[0][1] == wanted:
            # The common case (all of one optimizer's parameters): exactly the Trainer's clipping path.
            return self.strategy.clip_gradients(owners[0][0].optimizer, max_norm, max_value, norm_type)
        for opt, _ in owners:
            self.strategy.unscale_gradients(opt.optimizer)
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(params, max_value)
            return None
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def _place_batch(self, batch):
        """A prepared loader's batch on the device (and in the precision's input dtype); device_placement=False:
        where the loader's collate put it (only the precision's dtype cast, e.g. 64-true's)."""
        if self.device_placement:
            return self.strategy.move_batch(batch)
        precision = self.strategy.precision
        return precision.convert_input(batch) if precision else batch

    def _synchronize_rng_states(self):
        """Accelerator(rng_types=["torch", "cuda"]): every process continues from rank 0's generator at the start of
        each pass over a prepared loader ("generator" needs nothing: the sampler's order is a function of the seed
        and the epoch on every process)."""
        if "torch" in self._rng_types:
            torch.set_rng_state(self.strategy.broadcast(torch.get_rng_state()))
        if "cuda" in self._rng_types and torch.cuda.is_available():
            torch.cuda.set_rng_state(self.strategy.broadcast(torch.cuda.get_rng_state()).cpu())

    def _clip_inside_step(self, prepared, max_norm, max_value, norm_type):
        """An engine that clips inside its step (DeepSpeed): the request configures or checks its clipping, and
        the step is taken here, so that the norm returned is this step's, as Accelerate returns it (whose
        DeepSpeed backward() steps the engine). The script's optimizer.step() that follows does nothing."""
        self.strategy.clip_gradients(None if prepared is None else prepared.optimizer, max_norm, max_value, norm_type)
        if prepared is None:
            return None
        if not prepared.stepped_early:
            prepared.step()
            prepared.stepped_early = True
        return self.strategy.last_grad_norm()

    def unscale_gradients(self, optimizer=None):
        """Unscale the gradients of one (default: every) prepared optimizer under fp16, before reading them."""
        for opt in self._optimizers if optimizer is None else [optimizer]:
            self.strategy.unscale_gradients(opt.optimizer if isinstance(opt, PreparedOptimizer) else opt)

    @contextlib.contextmanager
    def accumulate(self, *models):
        """One micro-batch. Steps (optimizer.step, zero_grad, scheduler.step, clipping) take effect only at the last
        micro-batch of a window of gradient_accumulation_steps (or at the loader's last batch); the others skip
        the gradient all-reduce (no_sync)."""
        self._begin_micro_batch()
        if self.sync_gradients or not models or self._sync_each_batch:  # sync_each_batch: all-reduce every one
            try:
                yield
            finally:
                self._window = self.gradient_accumulation_steps
            return
        with contextlib.ExitStack() as stack:
            for model in models:
                stack.enter_context(self.no_sync(model))
            try:
                yield
            finally:
                self._window = self.gradient_accumulation_steps

    def _begin_micro_batch(self):
        steps = self.gradient_accumulation_steps
        if steps == 1:
            self.sync_gradients, self._window = True, 1
            return
        loader = self._active_loaders[-1] if self._active_loaders else None
        if not self._sync_with_dataloader:
            loader = None  # windows count micro-batches only, across the loader's end
        if loader is not None and loader.epoch_length is not None:
            # The Trainer's rule, from the position in the epoch: windows start at multiples of `steps`, and the
            # last one is cut short by the end of the loader.
            index = loader.batches_seen - 1
            start, self._window = EpochIterator.window(index, steps, loader.epoch_length)
            self.sync_gradients = index + 1 - start == self._window
            return
        self._micro_step += 1
        self._window = steps
        self.sync_gradients = self._micro_step % steps == 0 or (loader is not None and loader.at_last_batch)
        if self.sync_gradients:
            self._micro_step = 0

    @contextlib.contextmanager
    def no_sync(self, model):
        """Skip the gradient all-reduce of `model` for the backward passes inside (strategy.no_backward_sync).
        (DeepSpeed's engine reduces at its own accumulation boundary, which backward() tells it.)"""
        if not self.use_distributed:
            yield
            return
        model = getattr(model, "_orig_mod", model)  # compiled (compile_options): the strategy's wrapper inside
        with self.strategy.no_backward_sync(True, model):
            yield

    @contextlib.contextmanager
    def autocast(self, autocast_handler=None):
        """The precision's autocast context, for computations outside the prepared model's forward;
        autocast_handler=AutocastKwargs(...) changes its options inside this block only."""
        if autocast_handler is None:
            with self.strategy.forward_context():
                yield
            return
        precision = self.strategy.precision
        saved = precision.autocast_options
        precision.set_options(autocast=autocast_handler.to_kwargs())
        try:
            with self.strategy.forward_context():
                yield
        finally:
            precision.autocast_options = saved

    def long_event(self, name, timeout=None):
        """`with accelerator.long_event("evaluate on the full set"):` work inside a loop over a prepared loader
        that may take longer than stall_timeout without a new batch, backward or optimizer step; with `timeout`
        (seconds) it has a deadline of its own. A no-op without a watchdog (one process, stall_timeout=None)."""
        if self._watchdog is None:
            return contextlib.nullcontext()
        return self._watchdog.long_event(name, timeout)

    # -- models out --------------------------------------------------------------------------------------------------
    def unwrap_model(self, model, keep_fp32_wrapper=True):
        """The user's model inside the DDP/DeepSpeed wrapper; keep_fp32_wrapper=False also removes the autocast."""
        for prepared, original in self._models:
            if model is prepared:
                model = original
                break
        model = self.strategy.unwrap_model(model)
        if not keep_fp32_wrapper:
            unpatch_forward(model)
        return model

    def get_state_dict(self, model, unwrap=True):
        """The full state dict (under ZeRO-3 the partitions are gathered: call it on every process)."""
        return self.strategy.full_state_dict(self.unwrap_model(model) if unwrap else model)

    def save(self, obj, f):
        """torch.save on the main process only, atomically (temporary file, fsync, rename)."""
        self.strategy.check_full_state_dict(obj, f)  # not a sharded engine's slices (ZeRO-3 placeholders)
        if self.is_main_process:
            ckpt_io.atomic_save(obj, f)

    def save_model(self, model, save_directory, max_shard_size="10GB", safe_serialization=True):
        """Write the full weights of `model` to save_directory as Accelerate does: model.safetensors, or shards plus
        model.safetensors.index.json (pytorch_model*.bin with safe_serialization=False). Call on every process."""
        from tasktrain.inference.saving import save_model

        state = self.get_state_dict(model)
        self.strategy.check_full_state_dict(state, save_directory)  # not a sharded engine's slices
        if self.is_main_process:
            save_model(state, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization)

    # -- resume ------------------------------------------------------------------------------------------------------
    def register_for_checkpointing(self, *objects):
        """Objects with state_dict()/load_state_dict() to save and restore with save_state/load_state."""
        for obj in objects:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"register_for_checkpointing needs objects with state_dict() and load_state_dict(); "
                                f"{type(obj).__name__} has not both.")
            self._custom.append(obj)

    def save_state(self, output_dir=None, safe_serialization=True, layout="tasktrain", async_save=False):
        """Save everything needed to continue exactly: models, optimizers, schedulers, GradScaler, the position of
        every prepared loader, registered objects and every rank's RNG. Call it on every process.

        Without output_dir, under ProjectConfiguration(automatic_checkpoint_naming=True): project_dir/checkpoints/
        checkpoint_{iteration}, then iteration += 1; with total_limit=N the oldest beyond N are removed once the
        new one is complete. Returns the directory written.

        layout="accelerate" writes Accelerate's files (model.safetensors, optimizer.bin, scheduler.bin,
        random_states_{i}.pkl, custom_checkpoint_{i}.pkl; pytorch_model.bin with safe_serialization=False), which
        Accelerate's load_state reads, plus our accelerator_state.pt with the loaders' positions.

        async_save=True (issue 29, docs/checkpointing.md): returns once the state is copied into CPU memory; the
        directory is written in the background as output_dir.tmp and renamed to output_dir (replacing it) only once
        every rank's files are complete; total_limit's old checkpoints go only then. A save_state while one is in
        flight waits for it first; end_training waits for the last. accelerator.wait_for_checkpoint() waits now."""
        if layout not in ("tasktrain", "accelerate"):
            raise ValueError(f"save_state(layout={layout!r}): use 'tasktrain' or 'accelerate'.")
        if not safe_serialization and layout != "accelerate":
            raise ValueError("save_state(safe_serialization=False) chooses pytorch_model.bin over model.safetensors "
                             "in Accelerate's layout: pass layout='accelerate' too (tasktrain's own layout is one "
                             "torch.save file).")
        config = self.project_configuration
        automatic = output_dir is None
        if automatic:
            if not config.automatic_checkpoint_naming:
                raise ValueError("save_state() without a directory names checkpoints automatically only under "
                                 "Accelerator(project_config=ProjectConfiguration(project_dir=..., "
                                 "automatic_checkpoint_naming=True)); otherwise pass save_state(output_dir).")
            if config.project_dir is None:
                raise ValueError("ProjectConfiguration(automatic_checkpoint_naming=True) needs project_dir: the "
                                 "checkpoints go to project_dir/checkpoints/checkpoint_{i}.")
            output_dir = os.path.join(config.project_dir, "checkpoints", f"checkpoint_{config.iteration}")
            if os.path.exists(output_dir):
                raise ValueError(f"{output_dir} exists already: set accelerator.project_configuration.iteration to "
                                 "the next free number (load_state() without a directory does it).")
        output_dir = os.fspath(output_dir)
        if self.num_processes > 1:  # one folder for all: rank 0 writes the shared parts, each rank its own
            folders = self.strategy.all_gather_object(os.path.abspath(output_dir))
            if len(set(folders)) > 1:
                raise ValueError(f"save_state: the processes passed different folders ({folders}); the state of "
                                 "a run is one folder that every process writes its part into (rank 0 the "
                                 "models and optimizers). Pass the same folder on every process, e.g. one made "
                                 "on the main process and sent with tasktrain.utils.broadcast_object_list.")
        if async_save:  # issue 29
            return self._save_state_async(output_dir, layout, automatic)
        self.strategy.wait_for_checkpoint()  # issue 29: a background save in flight ends first
        with self.long_event("save_state"):  # may take long: not a stall (issue 19)
            self._save_state(output_dir, layout, safe_serialization)
        if automatic:
            config.iteration += 1
            if config.total_limit is not None:
                self.wait_for_everyone()  # every rank has written its part before any old one goes
                if self.is_main_process:
                    for old in _numbered_checkpoints(os.path.dirname(output_dir))[:-config.total_limit]:
                        ckpt_io.remove_path(old)
                self.wait_for_everyone()
        return output_dir

    def _save_state_async(self, output_dir, layout, automatic):  # issue 29
        if layout != "tasktrain":
            raise ValueError("save_state(async_save=True) writes tasktrain's layout only (Accelerate's files are "
                             "written by its own functions, in this thread): drop layout='accelerate', or save "
                             "synchronously.")
        config = self.project_configuration
        limit = config.total_limit if automatic else None
        parent = os.path.dirname(os.path.abspath(output_dir))

        def on_complete():  # rank 0, in the writer's thread, once every rank's files are in place
            if limit is not None:
                for old in _numbered_checkpoints(parent)[:-limit]:
                    ckpt_io.remove_path(old)

        with self.long_event("save_state"):
            self._save_state(output_dir, writer_done=on_complete)
        if automatic:
            config.iteration += 1
        return output_dir

    def wait_for_checkpoint(self):
        """Block until this process's background save_state(async_save=True) is written (issue 29)."""
        self.strategy.wait_for_checkpoint()

    def _save_state(self, output_dir, layout="tasktrain", safe_serialization=True, writer_done=None):
        if self._window_has_grads:
            warnings.warn("save_state inside a gradient accumulation window: the gradients accumulated so far are not "
                          "saved, so a resume from here redoes the window without them. Save after optimizer.step() "
                          "(where accelerator.sync_gradients is True).")
        state = self._run_state().state_dict()
        if layout != "tasktrain":
            state = self._write_layout(output_dir, layout, state, safe_serialization)
        if writer_done is not None:  # issue 29: async_save, written in the background
            self.strategy.save_checkpoint_async(state, output_dir, on_complete=writer_done, filename=STATE_FILE)
            return
        self.strategy.save_checkpoint_into(output_dir, state, STATE_FILE)
        self.wait_for_everyone()

    def _write_layout(self, output_dir, layout, state, safe_serialization):
        """Another framework's files for save_state(layout=...) (Accelerate's: tasktrain/compat/accelerate); returns
        what goes into our own state file beside them."""
        raise ValueError(f"save_state(layout={layout!r}): this Accelerator writes tasktrain's layout only; "
                         "tasktrain.Accelerator also writes Accelerate's (layout='accelerate').")

    def _read_state(self, input_dir):
        """What save_state wrote (a sharded engine loads its shards; a file of format 1 is upgraded), and the
        random state of this process when it comes from another framework's files (else None)."""
        return upgrade(self.strategy.load_checkpoint_from(input_dir, STATE_FILE)), None

    def _run_state(self):
        """This Accelerator's state as stateful parts (tasktrain/trainer/run_state.py), in the order they are saved
        (the weights last: what the strategy does not write itself, a sharded engine keeps them in its shards)."""
        strategy = self.strategy
        return RunState({
            "world_size": Value(self.num_processes),
            "optimizers": Optimizers(strategy, [opt.optimizer for opt in self._optimizers]),
            "schedulers": Objects(self._schedulers),
            "precision": strategy.precision,
            "loop": Value(lambda: {"data_seed": self._data_seed, "micro_step": self._micro_step, "steps": self._steps},
                          self._load_loop),
            "loaders": Objects(self._loaders),
            "custom": Objects(self._custom),
            "local_sgd": self._local_sgd,
            "rng_states": RandomStates(strategy),
            "models": Weights(strategy, [prepared for prepared, _ in self._models]),
        })

    def _load_loop(self, loop):
        if loop.get("data_seed") is not None:
            self._data_seed = int(loop["data_seed"])
        self._micro_step = int(loop.get("micro_step", 0))
        self._steps = int(loop.get("steps", 0))

    def load_state(self, input_dir=None):
        """Restore what save_state wrote into the objects prepared (in the same order) since; the next iteration of
        each prepared loader continues where it stopped (`loader.epoch` tells the epoch to resume). Without
        input_dir, under automatic checkpoint naming: the newest project_dir/checkpoints/checkpoint_{i}, and the
        next save_state() writes checkpoint_{i + 1}."""
        self.strategy.wait_for_checkpoint()  # issue 29: a background save_state in flight ends first
        config = self.project_configuration
        if input_dir is None:
            if not config.automatic_checkpoint_naming or config.project_dir is None:
                raise ValueError("load_state() without a directory needs ProjectConfiguration(project_dir=..., "
                                 "automatic_checkpoint_naming=True); otherwise pass load_state(input_dir).")
            found = _numbered_checkpoints(os.path.join(config.project_dir, "checkpoints"))
            if not found:
                raise FileNotFoundError(f"No checkpoint_{{i}} folder in {config.project_dir}/checkpoints to load.")
            input_dir = found[-1]
            config.iteration = _checkpoint_number(input_dir) + 1
        input_dir = os.fspath(input_dir)
        with self.long_event("load_state"):  # may take long: not a stall (issue 19)
            self._load_state(input_dir)

    def _load_state(self, input_dir):
        state, rng_state = self._read_state(input_dir)
        for name, mine in (("models", self._models), ("optimizers", self._optimizers),
                           ("schedulers", self._schedulers), ("loaders", self._loaders), ("custom", self._custom)):
            check_counts(state, name, len(mine), lambda saved: (
                f"{input_dir} holds {saved} {name} but this Accelerator has {len(mine)} prepared/registered: prepare "
                "(and register_for_checkpointing) the same objects, in the same order, before load_state."))
        run_state = self._run_state()
        # the loop before the loaders: they continue the saved data order's seed
        run_state.load_state_dict(state, only=["models", "optimizers", "schedulers", "precision", "loop", "loaders",
                                               "custom", "local_sgd", "rng_states"])
        if rng_state is not None:  # Accelerate's own files: this process's
            ckpt_io.restore_rng_states(rng_state)
        else:
            restore_rng = rng_restore_of_this_rank(run_state.parts["rng_states"].loaded, self.strategy, input_dir,
                                                   self._data_seed, self._steps)
            if restore_rng is not None:
                restore_rng()

    def skip_first_batches(self, dataloader, num_batches=0):
        """The loader, starting `num_batches` into its next iteration (a prepared loader skips without loading)."""
        return skip_first_batches(dataloader, num_batches)

    # -- processes ---------------------------------------------------------------------------------------------------
    def wait_for_everyone(self):
        self.strategy.barrier("wait_for_everyone")

    def set_trigger(self):
        """Raise this process's flag; check_trigger() on every process then sees it (e.g. stop early on all)."""
        self._triggered = True

    def check_trigger(self):
        """True on every process when any process called set_trigger() since the last check (then cleared).
        A collective: call it on every process."""
        flag = torch.tensor(1.0 if self._triggered else 0.0, device=self.device)
        if self.use_distributed:
            flag = self.strategy.reduce(flag, op="sum")
        if float(flag) > 0:
            self._triggered = False
            return True
        return False

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables, even_batches=None):
        """torch's Join context for DDP-wrapped models whose processes see different numbers of batches.
        even_batches (True/False) overrides the prepared map-style loaders' even_batches inside the block, as
        Accelerate's (a loader over an IterableDataset keeps its own, with a warning); on one process the Join
        does nothing."""
        if even_batches is None:
            yield from self._join(joinables)
            return
        shards = [loader._data for loader in self._loaders
                  if isinstance(loader, PreparedDataLoader) and isinstance(loader._data, ShardData)]
        if len(shards) < len(self._loaders):  # (Accelerate's words: its scripts look for them)
            warnings.warn("join_uneven_inputs(even_batches=...): overriding even_batches is only supported for "
                          "map-style datasets (prepared map-style DataLoaders); the other prepared loaders "
                          "(iterable, dispatched) keep theirs.")
        saved = [data.even_batches for data in shards]
        for data in shards:
            data.even_batches = bool(even_batches)
        try:
            yield from self._join(joinables)
        finally:
            for data, value in zip(shards, saved):
                data.even_batches = value

    def _join(self, joinables):
        if not self.use_distributed:
            yield
            return
        from torch.distributed.algorithms.join import Join, Joinable

        joinables = list(joinables)
        if not all(isinstance(j, Joinable) for j in joinables):
            # As Accelerate: torch's Join takes DDP models (and ZeroRedundancyOptimizer); a sharded model is not
            # one (with even_batches, the default, every process has the same number of batches anyway).
            warnings.warn(f"join_uneven_inputs: {[type(j).__name__ for j in joinables if not isinstance(j, Joinable)]} "
                          "cannot join uneven inputs (torch's Join takes DDP models); the block runs without it.")
            yield
            return
        with Join(joinables):
            yield

    # -- trackers ----------------------------------------------------------------------------------------------------
    def init_trackers(self, project_name, config=None, init_kwargs=None):
        """Start the trackers of log_with (tasktrain.loggers.trackers), on the main process only; `config` is
        stored as the run's hyper-parameters, init_kwargs[name] goes to that tracker's constructor."""
        if self.is_main_process:
            self.trackers = make_trackers(self.log_with, project_name, config, self.logging_dir, init_kwargs)

    def log(self, values, step=None, log_kwargs=None):
        """Log a dict of values at `step` to every tracker (main process only)."""
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def get_tracker(self, name, unwrap=False):
        """The tracker called `name` (unwrap=True: its writer or run); other processes get one that does nothing."""
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if self.trackers:
            raise ValueError(f"{name} is not one of this Accelerator's trackers ({[t.name for t in self.trackers]}).")
        return GeneralTracker(_blank=True)

    def gather(self, tensor):
        """Every process's tensor(s), concatenated along the first dimension (0-d tensors are stacked)."""
        return _map_tensors(tensor, self._gather_one)

    def _gather_one(self, tensor):
        if not self.use_distributed:
            return tensor
        gathered = self.strategy.all_gather(tensor)  # (world, *shape)
        return gathered if tensor.dim() == 0 else gathered.reshape(-1, *tensor.shape[1:])

    def gather_for_metrics(self, data, use_gather_object=False):
        """Gather a batch's per-sample results from every process, in the loader's sample order, without the samples
        repeated to give every process the same number of batches (so a metric counts each sample once).
        A list of objects (or use_gather_object=True) is gathered as objects into one flat list, in the same order."""
        if not self.use_distributed:
            return data
        loader = self._active_loaders[-1] if self._active_loaders else None
        if use_gather_object or not _has_tensor(data):
            return self._gather_objects(data, loader)
        return _map_tensors(data, lambda t: self._gather_batch(t, loader))

    def _gather_objects(self, data, loader):
        items = list(data) if isinstance(data, (list, tuple)) else [data]
        parts = self.strategy.all_gather_object(items)  # one list per process
        step = loader.shard_step() if loader is not None else None
        if step is not None:  # rank order is the global order; the padding is the step's tail
            sizes, real = step
            flat = [item for part in parts for item in part]
            return flat[:real] if [len(part) for part in parts] == sizes else flat
        size = loader.current_batch_size if loader is not None else None
        if size is None or any(len(part) != size for part in parts):
            return [item for part in parts for item in part]
        if loader.interleaved:
            ordered = [part[i] for i in range(size) for part in parts]  # rank r held samples r, r + W, ...
        else:
            ordered = [item for part in parts for item in part]  # rank r held the r-th run of the global batch
        repeated = loader.repeated_in_batch()
        return ordered[: len(ordered) - repeated] if repeated else ordered

    def _gather_batch(self, tensor, loader):
        step = loader.shard_step() if loader is not None and tensor.dim() > 0 else None
        if step is not None and tensor.shape[0] == step[0][self.process_index]:
            return self._gather_step(tensor, *step)
        gathered = self.strategy.all_gather(tensor)  # (world, batch, ...)
        if tensor.dim() == 0:
            return gathered
        if loader is None or tensor.shape[0] != loader.current_batch_size:
            return gathered.reshape(-1, *tensor.shape[1:])
        # Rank r holds samples r, r + W, ... of the padded order (a stream: the r-th run of it): interleaving (or
        # concatenating) restores that order, and the padding (repeats of the first samples) is then the tail of the
        # last batch.
        ordered = gathered.transpose(0, 1) if loader.interleaved else gathered
        ordered = ordered.reshape(-1, *tensor.shape[1:])
        repeated = loader.repeated_in_batch()
        return ordered[: ordered.shape[0] - repeated] if repeated else ordered

    def _gather_step(self, tensor, sizes, real):
        """A step of a loader in Accelerate's order: rank r's batch is the r-th run of the step's samples, so the
        ranks' parts in rank order are the global order; the refill (padding) is its tail. Ranks with shorter (or
        no) batches are padded for the collective, and cut back by the sizes every rank knows."""
        longest = max(sizes)
        if tensor.shape[0] < longest:
            pad = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
            tensor = torch.cat([tensor, pad])
        gathered = self.strategy.all_gather(tensor)  # (world, longest, ...)
        ordered = torch.cat([gathered[rank, :size] for rank, size in enumerate(sizes)])
        return ordered[:real]

    def reduce(self, tensor, reduction="sum", scale=1.0):
        """All-reduce a tensor (or a structure of tensors) over processes: "sum", "mean", "max", "min" (or "none");
        then multiplied by `scale`."""
        if reduction not in ("sum", "mean", "max", "min", "none"):
            raise ValueError(f"reduction={reduction!r}: use 'sum', 'mean', 'max', 'min' or 'none'.")

        def one(t):
            if self.use_distributed and reduction != "none":
                t = self.strategy.reduce(t, op=reduction)
            return t * scale if scale != 1.0 else t

        return _map_tensors(tensor, one)

    def end_training(self):
        """Shut the processes' connection down (gloo/nccl). Prepared models are unusable for distributed work after."""
        if self._ended:
            return
        self._ended = True
        self.strategy.wait_for_checkpoint(release=True)  # issue 29: a background save_state in flight ends first
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        # The script still holds the prepared models: the strategy's teardown releases what ties them to the group.
        self._active_loaders.clear()
        self.strategy.teardown()

    def __repr__(self):
        return (f"Accelerator({self.strategy.describe()}, precision={self.precision_name!r}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps})")


class PreparedOptimizer(torch.optim.Optimizer):
    """The user's optimizer; step() goes through strategy.optimizer_step and waits for the end of the window."""

    def __init__(self, optimizer, accelerator, original=None):
        # Not Optimizer.__init__: param_groups and state are the wrapped optimizer's own.
        self.optimizer = optimizer
        self.original = original if original is not None else optimizer
        self._accelerator = accelerator
        self.step_was_skipped = False
        self.stepped_early = False  # clip_grad_norm_ took this window's step already (an engine clipping inside it)
        self._parameter_ids = None

    def parameter_ids(self):
        if self._parameter_ids is None:
            self._parameter_ids = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        return self._parameter_ids

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def step(self, closure=None):
        accelerator = self._accelerator
        if not accelerator.sync_gradients:
            return None
        if self.stepped_early:
            self.stepped_early = False
            return None
        stepped = accelerator._optimizer_step(self.optimizer, closure)
        self.step_was_skipped = not stepped
        if accelerator._optimizers and accelerator._optimizers[0] is self:
            accelerator._steps += 1
            accelerator._requeue.after_step()  # issue 40
        accelerator._window_has_grads = False
        return None

    def zero_grad(self, set_to_none=True):
        # Inside a window the gradients of its earlier micro-batches must survive, wherever the loop zeroes.
        if self._accelerator._window_has_grads:
            return
        if set_to_none:
            self._accelerator.strategy.zero_grad(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=False)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group):
        self.optimizer.add_param_group(param_group)
        self._parameter_ids = None

    def train(self):
        """Train mode of an optimizer that has one (schedule-free optimizers: the parameters become the point the
        gradients are taken at); others have no mode and nothing changes, as in Accelerate."""
        self._set_mode("train")

    def eval(self):
        """Eval mode of an optimizer that has one (schedule-free optimizers: the parameters become the averaged
        point to evaluate and save); others have no mode and nothing changes, as in Accelerate."""
        self._set_mode("eval")

    def _set_mode(self, mode):
        # an engine's optimizer (DeepSpeed's) wraps the user's one: the first in the chain that has the mode switches
        for optimizer in (self.optimizer, getattr(self.optimizer, "optimizer", None), self.original):
            if callable(getattr(optimizer, mode, None)):
                getattr(optimizer, mode)()
                return

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __getattr__(self, name):
        if name == "optimizer":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)  # hooks, extra attributes: the wrapped optimizer's

    def __repr__(self):
        return f"PreparedOptimizer({self.optimizer!r})"


class PreparedScheduler:
    """The user's scheduler; step() runs only where its optimizer really stepped (window end, no skipped fp16 step),
    num_processes times under scheduler_steps_per_process (Accelerate's rule)."""

    def __init__(self, scheduler, optimizers, accelerator):
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._accelerator = accelerator

    def step(self, *args, **kwargs):
        accelerator = self._accelerator
        if not accelerator.step_scheduler_with_optimizer:
            self.scheduler.step(*args, **kwargs)  # Accelerator(step_scheduler_with_optimizer=False): every call
            return
        if not accelerator.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        if not accelerator._scheduler_steps_per_process:
            self.scheduler.step(*args, **kwargs)
            return
        # Accelerate's rule: each process's batch is one step of the schedule, so a schedule sized in batches of one
        # process ends where it would on one. A schedule with a fixed length (OneCycleLR's total_steps) is not
        # stepped past its end, which it would refuse.
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(accelerator.num_processes):
            if total is not None and self.scheduler._step_count > total:
                return
            self.scheduler.step(*args, **kwargs)

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict):
        self.scheduler.load_state_dict(state_dict)

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def __getattr__(self, name):
        if name == "scheduler":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)


def skip_first_batches(dataloader, num_batches=0):
    """`dataloader` starting `num_batches` into its next iteration: a prepared loader skips them without loading
    them (and counts them for save_state); any other iterable with a length is wrapped."""
    if isinstance(dataloader, PreparedDataLoader):
        dataloader.skip(num_batches)
        return dataloader
    return _Skipped(dataloader, num_batches)


class _Skipped:
    def __init__(self, loader, num_batches):
        self.loader, self.num_batches = loader, num_batches

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.num_batches, None)

    def __len__(self):
        return max(0, len(self.loader) - self.num_batches)



def _checkpoint_number(path):
    name = os.path.basename(os.path.normpath(path))
    return int(name.rsplit("_", 1)[1])


def _numbered_checkpoints(directory):
    """The checkpoint_{i} folders of `directory`, oldest (smallest i) first."""
    if not os.path.isdir(directory):
        return []
    found = [os.path.join(directory, name) for name in os.listdir(directory)
             if name.startswith("checkpoint_") and name[len("checkpoint_"):].isdigit()]
    return sorted(found, key=_checkpoint_number)


# -- helpers ----------------------------------------------------------------------------------------------------------
def _kind(obj):
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, (torch.utils.data.DataLoader, PreparedDataLoader)):
        return "dataloader"
    if isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau,
                        PreparedScheduler)):
        return "scheduler"
    raise TypeError(f"accelerator.prepare got a {type(obj).__name__}: it prepares torch.nn.Module models, "
                    "torch.optim optimizers, torch DataLoaders and learning-rate schedulers.")


def _steps_only(optimizer, model):
    """Whether every parameter `optimizer` steps belongs to `model`."""
    owned = {id(p) for p in model.parameters()}
    return all(id(p) in owned for group in optimizer.param_groups for p in group["params"])


def _map_tensors(data, fn):
    def on_tensor(leaf):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"expected a tensor or a list/tuple/dict of tensors, got {type(leaf).__name__}")
        return fn(leaf)

    return apply_to_leaves(data, on_tensor)


def _has_tensor(data):
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return bool(data) and all(_has_tensor(d) for d in data)
    if isinstance(data, dict):
        return bool(data) and all(_has_tensor(v) for v in data.values())
    return False
