"""The Accelerator under Accelerate's constructor (`accelerate.accelerator.Accelerator` -> `tasktrain.Accelerator`).

The core Accelerator (tasktrain/trainer/accelerator.py) takes tasktrain's arguments; this class takes Accelerate's
(device_placement ... parallelism_config, in Accelerate's order), maps each onto them or refuses it with what to do
instead, before anything starts (docs/accelerator.md lists them), and adds what only Accelerate's scripts use: the
process state (`state`, `distributed_type`, main_process_first, split_between_processes, the on_*_process
decorators: tasktrain/compat/accelerate/state.py), Accelerate's precision names (`mixed_precision`), `profile` with
ProfileKwargs, `pad_across_processes`, `free_memory`, and save_state's layout="accelerate" (Accelerate's files,
tasktrain/compat/accelerate/layout.py), which load_state also reads when Accelerate itself wrote them.
"""
import contextlib
import os
import warnings

import torch

# the names scripts import from Accelerate's `accelerate.accelerator` module (tasktrain.accelerator is this module)
from tasktrain.compat.accelerate.state import AcceleratorState, GradientState, PartialState  # noqa: F401
from tasktrain.compat.accelerate.utils.dataclasses import (  # noqa: F401
    AutocastKwargs, DataLoaderConfiguration, DeepSpeedPlugin, DistributedDataParallelKwargs, DistributedType,
    FullyShardedDataParallelPlugin, GradientAccumulationPlugin, GradScalerKwargs, InitProcessGroupKwargs,
    KwargsHandler, PrecisionType, ProfileKwargs, ProjectConfiguration, RNGType)
from tasktrain.names import MIXED_PRECISION
from tasktrain.strategies.watchdog import DEFAULT_STALL_TIMEOUT
from tasktrain.trainer import accelerator as core
from tasktrain.trainer.accelerator import STATE_FILE, skip_first_batches  # noqa: F401

_ACCELERATE_NAMES = {name: accelerate for accelerate, name in MIXED_PRECISION.items()}  # "bf16-mixed" -> "bf16"


class Accelerator(core.Accelerator):
    """Prepare a model, optimizer, data loaders and schedulers for the chosen strategy and precision.

    Accelerate's constructor arguments each work as in Accelerate or raise a clear error at construction
    (docs/accelerator.md lists them); `strategy` and `stall_timeout` are ours. Arguments left as None come from
    `tasktrain launch` (its TASKTRAIN_* variables), then from the defaults:
    mixed_precision "no" (also "fp16", "bf16", or our names "16-mixed", "bf16-mixed", "64-true", "bf16-true",
    "16-true"), one gradient accumulation step, and strategy "ddp" when a launcher started several processes, else
    "single_device". `strategy` takes a registry name ("ddp", "deepspeed_stage_2", ...) or a Strategy.

    stall_timeout (seconds, default 300; None or 0: off): on several processes, a rank that makes no progress
    for that long while it iterates a prepared data loader stops every rank with a message naming it (the
    watchdog, docs/distributed.md). Progress is each batch, backward and optimizer.step; wrap longer work in
    `with accelerator.long_event(name):`.
    """

    def __init__(self, device_placement=True, split_batches=None, mixed_precision=None,
                 gradient_accumulation_steps=None, cpu=False, dataloader_config=None, deepspeed_plugin=None,
                 fsdp_plugin=None, torch_tp_plugin=None, megatron_lm_plugin=None, rng_types=None, log_with=None,
                 project_dir=None, project_config=None, gradient_accumulation_plugin=None,
                 step_scheduler_with_optimizer=True, kwargs_handlers=None, dynamo_backend=None, dynamo_plugin=None,
                 deepspeed_plugins=None, parallelism_config=None, strategy=None, stall_timeout=DEFAULT_STALL_TIMEOUT,
                 even_batches=None, dispatch_batches=None):
        # Accelerate's arguments are read here, before anything starts: each maps onto a tasktrain choice or is a
        # clear error (docs/accelerator.md, "Coming from Accelerate").
        options = _accelerate_options(
            device_placement=device_placement, split_batches=split_batches, even_batches=even_batches,
            dispatch_batches=dispatch_batches, dataloader_config=dataloader_config, deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin, torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin,
            rng_types=rng_types, project_dir=project_dir, project_config=project_config,
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin, kwargs_handlers=kwargs_handlers,
            dynamo_backend=dynamo_backend, dynamo_plugin=dynamo_plugin, deepspeed_plugins=deepspeed_plugins,
            parallelism_config=parallelism_config, strategy=strategy)
        self._profile_handler = options.pop("profile")
        self.use_stateful_dataloader = options.pop("use_stateful_dataloader")
        self._dataloader_config = options.pop("dataloader_config")
        super().__init__(mixed_precision=mixed_precision, cpu=cpu, log_with=log_with,
                         step_scheduler_with_optimizer=step_scheduler_with_optimizer, stall_timeout=stall_timeout,
                         **options)
        from tasktrain.compat.accelerate.state import _share

        _share(self)  # PartialState() and AcceleratorState() read this Accelerator's strategy from now on

    def prepare(self, *objects):
        self._check_state()
        return super().prepare(*objects)

    def _check_state(self):
        if getattr(self, "_state_was_reset", False):
            # Accelerate's words (`AcceleratorState` object has no attribute ...): scripts written for it look for them
            raise AttributeError("`AcceleratorState` object has no attribute of this Accelerator any more. This "
                                 "happens if `AcceleratorState._reset_state()` was called after this Accelerator was "
                                 "made: make a new Accelerator() and prepare with it.")

    # -- issue 39: the device mesh of a ParallelismConfig (Accelerate's names) ----------------------------------------
    @property
    def torch_device_mesh(self):
        """The DeviceMesh of Accelerator(parallelism_config=...), dimensions "dp_replicate", "dp_shard", "tp" (and
        the joint "dp", "dp_shard_cp"); None without one."""
        return self.strategy.device_mesh

    @property
    def parallelism_config(self):
        from tasktrain.compat.accelerate.parallelism_config import AccelerateMeshStrategy

        return self.strategy.config if isinstance(self.strategy, AccelerateMeshStrategy) else None

    def _mesh_rank(self, name, what):
        if self.parallelism_config is None:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        return self.torch_device_mesh.get_local_rank(name)

    @property
    def tensor_parallel_rank(self) -> int:
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def data_parallel_rank(self) -> int:
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    @property
    def gradient_state(self):
        """Accelerate's GradientState of this Accelerator (tasktrain.state.GradientState): sync_gradients,
        num_steps, active_dataloader, end_of_dataloader, remainder, read from this Accelerator and its loaders."""
        from tasktrain.compat.accelerate.state import GradientState

        return GradientState._of(self)

    def join_uneven_inputs(self, joinables, even_batches=None):
        """torch's Join over DDP models (MULTI_CPU / MULTI_GPU; one process: nothing to join); under any other
        distributed_type (DEEPSPEED, FSDP, or one assigned to state.distributed_type) a warning says the block runs
        without it, as in Accelerate."""
        from tasktrain.compat.accelerate.utils.dataclasses import DistributedType

        kind = self.distributed_type
        if kind not in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
            warnings.warn(f"join_uneven_inputs is only supported for multi-GPU and multi-CPU DDP training; under "
                          f"{kind} the models cannot join uneven inputs (torch's Join takes DDP models): the block "
                          "runs without it.")
            return contextlib.nullcontext()
        return super().join_uneven_inputs(joinables, even_batches=even_batches)

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model):
        """The backward passes inside all-reduce `model`'s gradients even though its forward ran under no_sync()
        (several forwards first, then the backwards: only the last one syncs). For a DDP-wrapped model; on one
        process it does nothing; DeepSpeed's and FSDP's engines reduce at their own boundary (an error)."""
        if not self.use_distributed:
            yield
            return
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise NotImplementedError(f"trigger_sync_in_backward: {type(model).__name__} is not a DDP-wrapped model "
                                      f"({self.distributed_type}); its engine reduces gradients at its own "
                                      "accumulation boundary. Use accumulate(model) instead.")
        saved = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])  # what DDP's forward would have done outside no_sync
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    def gather(self, tensor):
        from tasktrain.compat.accelerate.utils.operations import _check_across_processes

        _check_across_processes("gather", tensor, self.strategy)  # debug mode only
        return super().gather(tensor)

    def reduce(self, tensor, reduction="sum", scale=1.0):
        from tasktrain.compat.accelerate.utils.operations import _check_across_processes

        if reduction != "none":
            _check_across_processes("reduce", tensor, self.strategy)  # debug mode only
        return super().reduce(tensor, reduction=reduction, scale=scale)

    @property
    def dataloader_config(self):
        """The DataLoaderConfiguration the next prepared loaders follow. Assignable, as in Accelerate: a new one
        applies to the loaders prepared after it, and split_batches to how prepared schedulers step from then on;
        the data seed can change only before the first loader is prepared."""
        return self._dataloader_config

    @dataloader_config.setter
    def dataloader_config(self, config):
        config = _check_dataloader_config(config)
        if config.data_seed != self._dataloader_config.data_seed:
            if self._loaders:
                raise ValueError("accelerator.dataloader_config = DataLoaderConfiguration(data_seed=...) after a "
                                 "loader was prepared: every prepared loader shares one data seed. Set it before "
                                 "the first prepare (or pass it to Accelerator(dataloader_config=...)).")
            self._data_seed = config.data_seed
        self._dataloader_config = config
        self.split_batches, self.even_batches = bool(config.split_batches), bool(config.even_batches)
        self.use_seedable_sampler, self.dispatch_batches = bool(config.use_seedable_sampler), config.dispatch_batches
        self.use_stateful_dataloader = bool(config.use_stateful_dataloader)
        self._scheduler_steps_per_process = not config.split_batches

    def prepare_data_loader(self, loader):
        """Under DataLoaderConfiguration(use_stateful_dataloader=True), as in Accelerate, a plain DataLoader over an
        IterableDataset of the user's is read through torchdata's StatefulDataLoader, so that save_state keeps its
        workers' state (docs/data.md). Over a map-style data set or a ShardedStream the prepared loader's global
        position resumes exactly already; every prepared loader has state_dict()/load_state_dict()."""
        if self.use_stateful_dataloader:
            loader = _stateful(loader)
        return super().prepare_data_loader(loader)

    @property
    def state(self):
        """Accelerate's AcceleratorState of this process (tasktrain.state)."""
        from tasktrain.compat.accelerate.state import AcceleratorState

        return AcceleratorState._of(self.strategy, self)

    @property
    def distributed_type(self):
        """DistributedType.NO, MULTI_CPU (DDP on CPUs), MULTI_GPU (DDP on GPUs) or DEEPSPEED."""
        return self.state.distributed_type

    @property
    def mixed_precision(self) -> str:
        """Accelerate's name of the precision: "no", "fp16", "bf16"; for those Accelerate has not, "fp64" (64-true)
        or our own name ("bf16-true", "16-true": parameters stored in half, which Accelerate has no name for)."""
        name = self.precision_name
        return _ACCELERATE_NAMES.get(name, "fp64" if name == "64-true" else name)

    def _process_state(self):
        from tasktrain.compat.accelerate.state import PartialState

        return PartialState._of(self.strategy)

    def main_process_first(self):
        """The main process runs the block first (e.g. to download or preprocess), then the others."""
        return self._process_state().main_process_first()

    def local_main_process_first(self):
        """Each machine's first process runs the block first, then the others."""
        return self._process_state().local_main_process_first()

    def split_between_processes(self, inputs, apply_padding=False):
        """`with accelerator.split_between_processes(items) as mine:` this process's contiguous part of a list,
        tuple, tensor or dict of them (tasktrain.state.PartialState.split_between_processes)."""
        return self._process_state().split_between_processes(inputs, apply_padding=apply_padding)

    def on_main_process(self, function):
        """Decorator: run on the main process only (elsewhere the call returns None)."""
        return self._process_state().on_main_process(function)

    def on_local_main_process(self, function):
        return self._process_state().on_local_main_process(function)

    def on_last_process(self, function):
        return self._process_state().on_last_process(function)

    def on_process(self, function=None, process_index=None):
        return self._process_state().on_process(function, process_index=process_index)

    def on_local_process(self, function=None, local_process_index=None):
        return self._process_state().on_local_process(function, local_process_index=local_process_index)

    @contextlib.contextmanager
    def profile(self, profile_handler=None):
        """torch.profiler.profile with the ProfileKwargs given here or in kwargs_handlers; with output_trace_dir
        each process writes its Chrome trace there (trace_rank_{process_index}.json) at the end of the block."""
        from tasktrain.compat.accelerate.utils.dataclasses import ProfileKwargs

        handler = profile_handler or self._profile_handler or ProfileKwargs()
        activities = handler.activities
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        else:
            activities = [getattr(torch.profiler.ProfilerActivity, a.upper()) if isinstance(a, str) else a
                          for a in activities]
        schedule = None if handler.schedule_option is None else torch.profiler.schedule(**handler.schedule_option)
        profiler = torch.profiler.profile(activities=activities, schedule=schedule,
                                          on_trace_ready=handler.on_trace_ready, record_shapes=handler.record_shapes,
                                          profile_memory=handler.profile_memory, with_stack=handler.with_stack,
                                          with_flops=handler.with_flops, with_modules=handler.with_modules)
        with profiler:
            yield profiler
        if handler.output_trace_dir:
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(handler.output_trace_dir,
                                                      f"trace_rank_{self.process_index}.json"))

    def pad_across_processes(self, tensor, dim=0, pad_index=0, pad_first=False):
        """Pad `dim` of each tensor to its largest size over processes, so that they can be gathered."""
        from tasktrain.compat.accelerate.utils.operations import pad_across_processes

        return pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def free_memory(self, *objects):
        """Forget every prepared object (and the trackers' references stay), collect garbage; returns Nones for
        `objects` to assign back, as Accelerate's."""
        from tasktrain.compat.accelerate.utils.memory import release_memory

        self._models, self._optimizers, self._schedulers, self._loaders = [], [], [], []
        self._active_loaders.clear()
        self._custom = []
        self.strategy.teardown()
        return release_memory(*objects)

    clear = free_memory

    def __repr__(self):
        return (f"Accelerator({self.strategy.describe()}, mixed_precision={self.mixed_precision!r}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps})")

    # -- Accelerate's save_state files ---------------------------------------------------------------------------------
    def _write_layout(self, output_dir, layout, state, safe_serialization):
        if layout != "accelerate":
            return super()._write_layout(output_dir, layout, state, safe_serialization)
        from tasktrain.compat.accelerate import layout as accelerate_layout

        if any(not weights and any(True for _ in original.parameters())
               for weights, (_, original) in zip(state["models"], self._models)):
            raise ValueError("save_state(layout='accelerate') writes whole weights, and this strategy keeps "
                             "them in its own shards (DeepSpeed): use save_state(dir) (the engine's checkpoint), "
                             "or save_model for the weights.")
        for weights in state["models"]:
            try:
                self.strategy.check_full_state_dict(weights, "save_state(layout='accelerate')")
            except ValueError as error:
                raise ValueError("save_state(layout='accelerate') writes whole weights, and this strategy keeps "
                                 "them in shards on every rank (FSDP): use save_state(dir) (a sharded directory "
                                 "every rank writes), or save_model for the whole weights.") from error
        accelerate_layout.write(output_dir, state["models"], state["optimizers"], state["schedulers"],
                                state["precision"], state["custom"], self.process_index, self.is_main_process,
                                safe_serialization=safe_serialization)
        # Our exact-resume extras (loader positions, data seed, accumulation) ride along in our own file.
        state.update(layout="accelerate", models=[], optimizers=[], schedulers=[], custom=[], rng_states=None,
                     precision={})
        return state

    def _read_state(self, input_dir):
        from tasktrain.compat.accelerate import layout as accelerate_layout

        own = os.path.exists(os.path.join(input_dir, STATE_FILE))
        if not own and accelerate_layout.is_accelerate_folder(input_dir):
            state = {"layout": "accelerate"}  # written by Accelerate itself: its files only
        else:
            state, _ = super()._read_state(input_dir)
        rng_state = None
        if state.get("layout") == "accelerate":
            counts = {"models": len(self._models), "optimizers": len(self._optimizers),
                      "schedulers": len(self._schedulers), "custom": len(self._custom)}
            files = accelerate_layout.read(input_dir, counts, self.process_index)
            rng_state = files.pop("rng_state")
            state = {**state, **files}
            state.setdefault("loaders", [loader.state_dict() for loader in self._loaders])  # Accelerate has none
            state.setdefault("loop", {"micro_step": self._micro_step})
        return state, rng_state


def _stateful(loader):
    """A plain DataLoader over an IterableDataset (not a ShardedStream) rebuilt as a StatefulDataLoader."""
    from torch.utils.data import DataLoader, IterableDataset

    from tasktrain.data import ShardedStream
    from tasktrain.trainer.data import is_stateful_loader, loader_options

    if type(loader) is not DataLoader or not isinstance(loader.dataset, IterableDataset) or \
            isinstance(loader.dataset, ShardedStream) or is_stateful_loader(loader):
        return loader
    from torchdata.stateful_dataloader import StatefulDataLoader

    kwargs = dict(loader_options(loader), batch_size=loader.batch_size, drop_last=loader.drop_last)
    return StatefulDataLoader(loader.dataset, **kwargs)


# -- Accelerate's constructor arguments -------------------------------------------------------------------------------
def _refuse(name, value, why):
    if value is not None:
        raise ValueError(f"Accelerator({name}=...): {why}")


def _check_dataloader_config(config):
    from tasktrain.compat.accelerate.utils.dataclasses import DataLoaderConfiguration

    config = config if config is not None else DataLoaderConfiguration()
    if not isinstance(config, DataLoaderConfiguration):
        raise TypeError(f"dataloader_config must be a tasktrain.utils.DataLoaderConfiguration, got "
                        f"{type(config).__name__}.")
    # split_batches, even_batches and dispatch_batches go to the core (tasktrain/trainer/shard.py: map-style
    # loaders in Accelerate's order; tasktrain/trainer/dispatch.py: rank 0 reads and dispatches)
    if config.use_stateful_dataloader:
        # Accelerate builds its prepared loaders on torchdata's StatefulDataLoader then, and needs it installed
        try:
            import torchdata.stateful_dataloader  # noqa: F401
        except ImportError as error:
            raise ImportError("DataLoaderConfiguration(use_stateful_dataloader=True) needs torchdata's "
                              "StatefulDataLoader: pip install 'tasktrain[torchdata]' (torchdata>=0.11).") from error
    return config


def _accelerate_options(*, device_placement, split_batches, even_batches, dispatch_batches, dataloader_config,
                        deepspeed_plugin, fsdp_plugin, torch_tp_plugin, megatron_lm_plugin, rng_types, project_dir,
                        project_config, gradient_accumulation_steps, gradient_accumulation_plugin, kwargs_handlers,
                        dynamo_backend, dynamo_plugin, deepspeed_plugins, parallelism_config, strategy):
    """Accelerate's arguments checked and turned into tasktrain's choices, before anything starts. Each is used,
    or refused with what to do instead (docs/accelerator.md lists them)."""
    from tasktrain.compat.accelerate.utils.dataclasses import (AutocastKwargs, DataLoaderConfiguration, DeepSpeedPlugin,
                                             DistributedDataParallelKwargs, FullyShardedDataParallelPlugin,
                                             GradientAccumulationPlugin, GradScalerKwargs, InitProcessGroupKwargs,
                                             ProfileKwargs, ProjectConfiguration, TorchDynamoPlugin)

    if not isinstance(device_placement, bool):
        raise TypeError(f"Accelerator(device_placement={device_placement!r}): pass True (prepared models and "
                        "batches go to accelerator.device) or False (they stay where the script put them).")
    for name, value in (("split_batches", split_batches), ("even_batches", even_batches),
                        ("dispatch_batches", dispatch_batches)):
        if value is not None:
            raise TypeError(f"Accelerator({name}=...) is not an argument (Accelerate 1.x moved it): pass "
                            f"dataloader_config=DataLoaderConfiguration({name}=...).")
    _refuse("megatron_lm_plugin", megatron_lm_plugin, "Megatron-LM is not supported.")
    strategy = _mesh_strategy(parallelism_config, torch_tp_plugin, strategy, deepspeed_plugin, fsdp_plugin)
    _refuse("deepspeed_plugins", deepspeed_plugins, "one DeepSpeed plugin per Accelerator: pass deepspeed_plugin=.")
    compile_options = _compile_options(dynamo_backend, dynamo_plugin, TorchDynamoPlugin)

    config = _check_dataloader_config(dataloader_config)

    if project_config is None:
        project_config = ProjectConfiguration(project_dir=None if project_dir is None else os.fspath(project_dir))
    elif not isinstance(project_config, ProjectConfiguration):
        raise TypeError(f"project_config must be a tasktrain.utils.ProjectConfiguration, got "
                        f"{type(project_config).__name__}.")
    elif project_dir is not None and project_config.project_dir is None:
        project_config.set_directories(os.fspath(project_dir))
    if project_config.total_limit is not None and (not isinstance(project_config.total_limit, int)
                                                   or project_config.total_limit < 1):
        raise ValueError(f"ProjectConfiguration(total_limit={project_config.total_limit!r}): use a positive "
                         "integer (checkpoints kept) or None (all).")

    sync_each_batch, sync_with_dataloader = False, True
    if gradient_accumulation_plugin is not None:
        plugin = gradient_accumulation_plugin
        if not isinstance(plugin, GradientAccumulationPlugin):
            raise TypeError("gradient_accumulation_plugin must be a tasktrain.utils.GradientAccumulationPlugin.")
        if gradient_accumulation_steps not in (None, 1):
            raise ValueError("Pass gradient_accumulation_steps or gradient_accumulation_plugin, not both.")
        # adjust_scheduler (True or False) changes nothing, as in Accelerate 1.15: its GradientState keeps a
        # plugin field only when it differs from the default, and reads a missing adjust_scheduler as False.
        gradient_accumulation_steps = plugin.num_steps
        sync_each_batch = bool(plugin.sync_each_batch)
        sync_with_dataloader = bool(plugin.sync_with_dataloader)

    if deepspeed_plugin is not None:
        if not isinstance(deepspeed_plugin, DeepSpeedPlugin):
            raise TypeError("deepspeed_plugin must be a tasktrain.utils.DeepSpeedPlugin (or pass "
                            "strategy=DeepSpeed(...)).")
        if strategy is not None:
            raise ValueError("Pass deepspeed_plugin or strategy, not both.")
        strategy = deepspeed_plugin.strategy()
        if gradient_accumulation_steps is None and deepspeed_plugin.gradient_accumulation_steps is not None:
            gradient_accumulation_steps = deepspeed_plugin.gradient_accumulation_steps
    if fsdp_plugin is not None:
        if not isinstance(fsdp_plugin, FullyShardedDataParallelPlugin):
            raise TypeError("fsdp_plugin must be a tasktrain.utils.FullyShardedDataParallelPlugin (or pass "
                            "strategy=FSDP(...)).")
        if strategy is not None or deepspeed_plugin is not None:
            raise ValueError("Pass one of fsdp_plugin, deepspeed_plugin and strategy.")
        strategy = fsdp_plugin.strategy()
    if rng_types is not None:
        names = [str(getattr(kind, "value", kind)) for kind in rng_types]
        unknown = [n for n in names if n not in ("torch", "cuda", "generator")]
        if unknown:
            raise ValueError(f"rng_types={rng_types!r}: {unknown} not supported; use 'torch', 'cuda', 'generator'.")
        rng_types = names

    process_options, precision_options = {}, {}
    profile = None
    seen = set()
    for handler in kwargs_handlers or ():
        kind = type(handler)
        if kind in seen:
            raise ValueError(f"kwargs_handlers holds two {kind.__name__}: give each kind once.")
        seen.add(kind)
        if isinstance(handler, DistributedDataParallelKwargs):
            ddp = handler.to_kwargs()
            for name in ("comm_hook", "comm_wrapper", "comm_state_option"):
                if name in ddp:
                    raise ValueError(f"DistributedDataParallelKwargs({name}=...): DDP communication hooks are not "
                                     "supported. Register the hook yourself on the prepared model "
                                     "(model.register_comm_hook).")
            process_options["ddp_kwargs"] = ddp
        elif isinstance(handler, InitProcessGroupKwargs):
            init = handler.to_kwargs()
            if init.get("init_method") is not None:
                raise ValueError("InitProcessGroupKwargs(init_method=...): the launcher sets the rendezvous "
                                 "(MASTER_ADDR/MASTER_PORT); drop init_method.")
            if "backend" in init:
                process_options["process_group_backend"] = init["backend"]
            if init.get("timeout") is not None:
                process_options["timeout"] = init["timeout"]
        elif isinstance(handler, GradScalerKwargs):
            precision_options["scaler"] = handler.to_kwargs()
        elif isinstance(handler, AutocastKwargs):
            precision_options["autocast"] = handler.to_kwargs()
        elif isinstance(handler, ProfileKwargs):
            profile = handler
        else:
            raise TypeError(f"kwargs_handlers got {kind.__name__}: tasktrain takes DistributedDataParallelKwargs, "
                            "InitProcessGroupKwargs, GradScalerKwargs, AutocastKwargs and ProfileKwargs.")
    return {"strategy": strategy, "gradient_accumulation_steps": gradient_accumulation_steps,
            "project_config": project_config, "sync_each_batch": sync_each_batch, "rng_types": rng_types or [],
            "data_seed": config.data_seed, "process_options": process_options,
            # prepared map-style loaders in Accelerate's order (tasktrain/trainer/shard.py)
            "split_batches": bool(config.split_batches), "even_batches": bool(config.even_batches),
            "use_seedable_sampler": bool(config.use_seedable_sampler),
            "dispatch_batches": config.dispatch_batches,
            "precision_options": precision_options, "profile": profile,
            "use_stateful_dataloader": bool(config.use_stateful_dataloader), "dataloader_config": config,
            # Accelerate's accumulation and scheduler rules (docs/accelerator.md, "Gradient accumulation"): the loss
            # divided by gradient_accumulation_steps throughout; a scheduler stepped once per process at each
            # optimizer step, unless split_batches makes one batch of every process one batch of the schedule.
            "window_loss": "steps", "scheduler_steps_per_process": not config.split_batches,
            "sync_with_dataloader": sync_with_dataloader, "device_placement": device_placement,
            "compile_options": compile_options}


# -- issue 39: tensor and data parallelism on one device mesh (ParallelismConfig) ----------------------------------------
def _mesh_strategy(parallelism_config, torch_tp_plugin, strategy, deepspeed_plugin, fsdp_plugin):
    """The strategy a ParallelismConfig (or the deprecated torch_tp_plugin, which Accelerate turns into
    ParallelismConfig(tp_size=...)) asks for, or `strategy` unchanged when there is none. Accelerate's checks of the
    sizes are ParallelismConfig's (tasktrain/compat/accelerate/parallelism_config.py); the product against the
    number of processes is checked when the processes are known (the strategy's configure)."""
    from tasktrain.compat.accelerate.parallelism_config import ParallelismConfig

    if torch_tp_plugin is not None:
        if parallelism_config is not None:
            raise ValueError("Pass parallelism_config or torch_tp_plugin (deprecated in Accelerate: "
                             "ParallelismConfig(tp_size=...)), not both.")
        tp_size = getattr(torch_tp_plugin, "tp_size", None)
        if not isinstance(tp_size, int):
            raise TypeError("torch_tp_plugin needs a tp_size; pass parallelism_config=ParallelismConfig(tp_size=N).")
        parallelism_config = ParallelismConfig(tp_size=tp_size)
    if parallelism_config is None and os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() == "true":
        parallelism_config = ParallelismConfig()  # a launch config's parallelism_config (its sizes in the environment)
    if parallelism_config is None:
        return strategy
    if not isinstance(parallelism_config, ParallelismConfig):
        raise TypeError(f"parallelism_config must be a tasktrain.ParallelismConfig (Accelerate's fields: "
                        f"dp_replicate_size, dp_shard_size, tp_size, cp_size), got {type(parallelism_config).__name__}.")
    if strategy is not None or deepspeed_plugin is not None or fsdp_plugin is not None:
        raise ValueError("parallelism_config picks the strategy (tensor parallel and FSDP2 on one device mesh: prepare "
                         "applies fully_shard over the data-parallel dimensions itself); drop strategy=, "
                         "deepspeed_plugin= and fsdp_plugin=.")
    if parallelism_config.total_size == 1:
        return strategy  # nothing to lay out: the default strategy, as in Accelerate (DDP on several processes)
    return parallelism_config.strategy()


def _compile_options(dynamo_backend, dynamo_plugin, plugin_class):
    """torch.compile's options from Accelerate's dynamo_backend / dynamo_plugin; None: no compiling."""
    if dynamo_backend is not None and dynamo_plugin is not None:
        raise ValueError("Pass dynamo_backend or dynamo_plugin, not both.")
    if dynamo_plugin is None:
        if dynamo_backend is None:
            return None
        dynamo_plugin = plugin_class(backend=dynamo_backend)
    if not isinstance(dynamo_plugin, plugin_class):
        raise TypeError(f"dynamo_plugin must be a tasktrain.utils.TorchDynamoPlugin, got {type(dynamo_plugin).__name__}.")
    if dynamo_plugin.use_regional_compilation:
        raise ValueError("TorchDynamoPlugin(use_regional_compilation=True): regional compilation is not supported. "
                         "Compile the repeated blocks yourself (block.compile() on each) before prepare, and leave "
                         "it False.")
    if dynamo_plugin.backend.value == "NO":
        return None
    return dynamo_plugin.to_kwargs()
