"""DeepSpeed: ZeRO stages 0-3, optimizer and parameter offload, through DeepSpeed's own engine.

DeepSpeed does the work (initialize, backward, step, clipping, the sharded checkpoint); this strategy
translates between it and the loop. The processes and the process group are the ProcessWorld's (world.py:
self-launch, torchrun, SLURM, `tasktrain launch`), on CPU through DeepSpeed's CPU accelerator over gloo.

The config is the user's DeepSpeed config as given (a dict or a JSON file), with its "auto" or missing values
filled from the plan the loop hands to setup_module_and_optimizers: micro batch size from the training loader,
gradient accumulation from `accumulate_grad_batches`, clipping from the clipping the loop will ask for
(`gradient_clip_val`, a GradientClipping callback), fp16/bf16 from the precision, train_batch_size = micro x
accumulation x world. A value that disagrees with the run is an error, never a silent winner.
`gradient_clipping` is always written (0 = off): DeepSpeed's own default is 1.0.

How the contract (tasktrain/strategies/base.py) maps onto the engine, per micro-batch:

    with strategy.no_backward_sync(not ends_window):  # engine.set_gradient_accumulation_boundary(ends_window)
        loss = strategy.training_step(batch, i)    # engine(batch, i): stage 3 gathers parameters there
        strategy.backward(loss / window, None)     # engine.backward(loss, scale_wrt_gas=False): the loop divided
                                                   # already (plan.loss_divided_by_window); inside a window,
                                                   # engine.step() counts the micro-step
    if ends_window:
        strategy.clip_gradients(...)               # ClipsInsideStep: checks the request (or sets an unset clipping)
        strategy.optimizer_step(optimizer, None)   # engine.step(): clip, step, zero the gradients
        strategy.zero_grad(optimizer)              # nothing: the engine zeroed them

Without the Trainer or the Accelerator, the same calls, in this order:

    strategy = DeepSpeed(stage=2, gradient_clipping=1.0)
    strategy.configure("cpu", devices=N, num_nodes=1, precision="bf16-mixed")
    strategy.setup_environment()                              # processes, process group, checks the config
    engine, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer], Plan(
        calls_steps=False, micro_batch_size=loader.batch_size, accumulate_grad_batches=4,
        loss_divided_by_window=False))                        # False: the engine divides by the accumulation
    for i, batch in enumerate(loader):
        batch = strategy.move_batch(batch)                    # bf16/fp16 inputs where the weights are
        with strategy.no_backward_sync(not boundary):         # required for windows cut short
            loss = loss_fn(engine(batch))
            strategy.backward(loss, None)
        if boundary:
            strategy.optimizer_step(optimizer, None)
    strategy.save_checkpoint_into(dir, state, "state.pt") / strategy.load_checkpoint_from(dir, "state.pt")
    strategy.full_state_dict()                                # consolidated weights (every rank calls it)
    strategy.teardown()

The optimizer handed back is the user's own: DeepSpeed steps it (or, with optimizer offload, DeepSpeedCPUAdam
over the very same param-group dicts), so a scheduler built on it keeps working.
"""
import contextlib
import gc
import logging
import os
import shutil
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from tasktrain.checkpoint_io import (CheckpointError, atomic_link, atomic_save, link_tree, load_checkpoint_file,
                                     load_plain_state_dict, own_state, replace_dir, weights_file, with_own)
from tasktrain.compiled import compile_forward_as, unwrap_compiled
from tasktrain.strategies.base import (ClipsInsideStep, Sharded, _StepWrapper, keep_until_next_run, release_kept_runs,
                                      step_name)
from tasktrain.strategies.ddp import DDPStrategy
from tasktrain.strategies.deepspeed.checkpoint import (ENGINE_TAG, SIXTEEN_BIT_FILE, STATE_FILE, _WRAPPER_PREFIX,
                                                       _check_no_zero3_placeholders, _strip, check_deepspeed_folder,
                                                       convert_zero_checkpoint)
from tasktrain.strategies.deepspeed.config import (_agree, _check_param_dtypes, _clip_norm_of, _enabled,
                                                   _fill_nvme_buffer_size, _nvme_buffer_auto, _nvme_folders,
                                                   _offloads, _param_dtype_of, _positive_or_none, _read_config,
                                                   build_config, check_nvme_offload)
from tasktrain.strategies.deepspeed.engine import (_complete_swapped_state, _forget_destroyed_groups, _honour_init_dtype,
                                                   _no_forced_collections, _quiet_untested_optimizer,
                                                   _restore_functional_linear,
                                                   _staging_checkpoint_engine, _sub_group_state_index,
                                                   _swaps_optimizer, import_deepspeed)
from tasktrain.strategies.precision import Precision, warn_fp16_on_cpu
from tasktrain.strategies.parallel import ParallelStrategy
from tasktrain.strategies.world import ProcessWorld
from tasktrain.tree import apply_to_leaves

_ANNOUNCED = set()


class _EngineForward(_StepWrapper):
    """What the engine wraps. DeepSpeed runs hooks around its forward (stage 3 gathers parameters there), so the
    module's steps go through it: engine(batch, i, _tasktrain_step=module.training_step). Without a step it is the
    module's own forward: engine(x) == module(x)."""

    def forward(self, *args, _tasktrain_step=None, **kwargs):
        if _tasktrain_step is None:
            return self.module(*args, **kwargs)
        return _tasktrain_step(*args, **kwargs)


class DeepSpeedPrecision(Precision):
    """Precision under DeepSpeed: the engine owns it (bf16/fp16 weights or torch_autocast as its config says, fp16
    loss scaling, skipping steps that overflow). This plugin forwards to the engine; it builds no GradScaler.

    The strategy attaches the engine after deepspeed.initialize and detaches it at teardown; the count of skipped
    steps stays."""

    def __init__(self, name, device_type="cpu"):
        super().__init__(device_type)
        self.name = name
        self.engine = None
        self.input_dtype = None  # bf16/fp16 when the engine holds the module in it: floating inputs must match
        if name == "16-mixed":
            warn_fp16_on_cpu(device_type)

    def attach(self, engine, input_dtype):
        self.engine, self.input_dtype = engine, input_dtype

    def set_options(self, scaler=None, autocast=None):
        if scaler:
            raise ValueError("GradScalerKwargs under DeepSpeed: the engine scales fp16 losses itself; set the "
                             "config's fp16 section (initial_scale_power, loss_scale_window, ...) instead.")
        if autocast:
            raise ValueError("AutocastKwargs under DeepSpeed: the engine holds the weights in bf16/fp16 and runs no "
                             "autocast; drop the handler.")

    def detach(self):
        self.engine = None

    def convert_input(self, data):
        return data if self.input_dtype is None else _cast_floats(data, self.input_dtype)

    def backward(self, loss, scale_wrt_gas=False, **kwargs):
        self.engine.backward(loss, scale_wrt_gas=scale_wrt_gas, **kwargs)

    def optimizer_step(self, optimizer=None, closure=None):
        self.engine.step()  # DeepSpeed unscales, clips, steps and zeroes the gradients here
        stepped = self.engine.was_step_applied()
        if not stepped:
            self.skipped_steps += 1  # fp16 overflow: DeepSpeed lowered its loss scale and skipped the step
        return stepped

    # unscale: nothing (DeepSpeed unscales inside its step); state_dict: nothing (the loss scaler is in the
    # engine's own checkpoint).


class DeepSpeed(ClipsInsideStep, Sharded, ParallelStrategy):
    """DeepSpeed ZeRO through DeepSpeed's engine.

    Args:
        stage: ZeRO stage 0-3 (default: the config's, else 2). 1 shards optimizer state, 2 also gradients,
            3 also parameters.
        offload_optimizer: keep optimizer state and step on the CPU (ZeRO-Offload); Adam/AdamW are replaced by
            DeepSpeedCPUAdam with the same param groups and hyper-parameters. True offloads to `offload_device`;
            "cpu" or "nvme" names the device. (A config's own offload sections are used as given; False adds
            nothing.)
        offload_parameters: stage 3 only: keep parameters on the CPU (or, "nvme", on disk) between uses.
        offload_device: where True offloads: "cpu" (memory) or "nvme" (disk: swap files in `nvme_path`, through
            DeepSpeed's async_io op; ZeRO stage 3 only). Only partitions of at least ~1 MiB per process go to disk.
        nvme_path: the folder for the swap files of offload to disk (any local folder; scratch: a checkpoint is
            complete without it). Checked before training: it must exist, be writable, and take async_io.
        aio: DeepSpeed's aio settings for offload to disk (block_size, queue_depth, intra_op_parallelism,
            single_submit, overlap_events, use_gds); DeepSpeed's defaults otherwise. Buffer counts and sizes are the
            config's zero_optimization.offload_param / offload_optimizer values (defaults: NVME_DEFAULTS).
        config: a DeepSpeed config dict or the path of a JSON file, honoured as given; "auto" values are filled.
        zero3_init: stage 3: `with strategy.module_init_context(): module = Model()` creates the parameters
            already partitioned (a model that does not fit one process's memory whole).
        save_16bit_model: every checkpoint directory also gets model_16bit.pt, the consolidated 16-bit weights
            (bf16 under bf16-mixed, else fp16) in our checkpoint format, for inference.
        micro_batch_size, accumulate_grad_batches, gradient_clipping: fill the config's "auto" values (the run's
            own values, from the plan, must agree with them).
        logging_level: DeepSpeed's logger level (its INFO output is long).
    """

    name = "deepspeed"
    strategy_name = "deepspeed"  # (Lightning's registry name)
    applies_layer_sync = False  # (Lightning's DeepSpeedStrategy.setup never calls its LayerSync)
    # Lightning's DeepSpeedStrategy(load_full_weights=True) (tasktrain.strategies.lightning sets it): a fit resumed
    # from a single-file checkpoint takes its weights and drops its optimizer state with Lightning's warning, where
    # tasktrain's own strategy refuses that state (load_optimizer_state).
    load_full_weights = False

    barrier = ProcessWorld.lightning_barrier  # (Lightning's DeepSpeedStrategy.barrier(*args, **kwargs))

    def __init__(self, stage=None, offload_optimizer=None, offload_parameters=None, config=None, zero3_init=False,
                 save_16bit_model=False, micro_batch_size=None, accumulate_grad_batches=None, gradient_clipping=None,
                 offload_device="cpu", nvme_path=None, aio=None, logging_level=logging.WARNING, accelerator=None,
                 precision=None, process_group_backend=None, timeout=timedelta(minutes=30), start_method="popen"):
        super().__init__(accelerator=accelerator, precision=precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method)
        if stage is not None and stage not in (0, 1, 2, 3):
            raise ValueError(f"DeepSpeed(stage={stage!r}): ZeRO stages are 0, 1, 2 and 3.")
        if offload_device not in ("cpu", "nvme"):
            raise ValueError(f"DeepSpeed(offload_device={offload_device!r}): use 'cpu' (memory) or 'nvme' (disk, with "
                             "nvme_path=...).")
        for name, value in (("offload_optimizer", offload_optimizer), ("offload_parameters", offload_parameters)):
            if value not in (None, True, False, "cpu", "nvme"):
                raise ValueError(f"DeepSpeed({name}={value!r}): use True/False, or the device: 'cpu' or 'nvme'.")
        if nvme_path is not None and not os.fspath(nvme_path):
            raise ValueError("DeepSpeed(nvme_path=''): give the folder for the swap files of offload to disk.")
        self.stage = stage
        self.offload_optimizer = offload_optimizer
        self.offload_parameters = offload_parameters
        self.offload_device = offload_device
        self.nvme_path = None if nvme_path is None else os.path.abspath(os.path.expanduser(os.fspath(nvme_path)))
        self.aio = dict(aio) if aio else None
        self.user_config = _read_config(config)
        self.zero3_init = bool(zero3_init)
        self.save_16bit = bool(save_16bit_model)
        self.micro_batch_size = _positive_or_none("micro_batch_size", micro_batch_size)
        self.accumulate_grad_batches = _positive_or_none("accumulate_grad_batches", accumulate_grad_batches)
        if gradient_clipping is not None and float(gradient_clipping) < 0:
            raise ValueError(f"DeepSpeed(gradient_clipping={gradient_clipping}): use a max norm > 0, or 0 for off.")
        self.gradient_clipping = None if gradient_clipping is None else float(gradient_clipping)
        self.logging_level = logging_level
        self._scale_wrt_gas = False  # the engine divides the loss by the accumulation (plan.loss_divided_by_window)
        self.engine = None
        self.config = None  # the resolved config the engine runs with
        self._client_optimizer = None
        self._wrapped = True  # the engine holds _EngineForward(module): its parameter names start with "module."
        self._loaded_engine_state = False
        self._clipping_stated = True  # until an engine is built: see setup_module_and_optimizers
        self._set_local_rank = False
        # A config that cannot work fails at construction, before any process starts.
        checked = build_config(self.user_config, stage=stage, offload_optimizer=offload_optimizer,
                               offload_parameters=offload_parameters, save_16bit_model=self.save_16bit,
                               offload_device=offload_device, nvme_path=self.nvme_path, aio=self.aio, precision=None)
        if nvme_path is not None and not _nvme_folders(checked):
            raise ValueError(f"DeepSpeed(nvme_path={nvme_path!r}) is the folder of offload to disk, and nothing is "
                             "offloaded to disk: add offload_device='nvme' (with offload_optimizer=True and/or "
                             "offload_parameters=True), or drop nvme_path.")
        if self.zero3_init and _nvme_buffer_auto(checked):
            raise ValueError("DeepSpeed(zero3_init=True) with parameter offload to disk creates the swap buffers "
                             "before the model exists, so their size cannot come from it: set "
                             "config={'zero_optimization': {'offload_param': {'buffer_size': N}}} with N at least the "
                             "largest parameter's numel / number of processes, or drop zero3_init.")
        if self.zero3_init and self.zero_stage() != 3:
            raise ValueError(f"DeepSpeed(zero3_init=True) partitions parameters at creation, which is ZeRO stage 3; "
                             f"this config runs stage {self.zero_stage()}. Use stage=3 or drop zero3_init.")

    def configure_processes(self, process_group_backend=None, timeout=None, ddp_kwargs=None):
        if ddp_kwargs:
            # Accelerate passes them to nothing under DeepSpeed either; said aloud rather than dropped.
            warnings.warn(f"DistributedDataParallelKwargs {sorted(ddp_kwargs)} are not used under DeepSpeed: the "
                          "engine reduces gradients itself (set its options in the DeepSpeed config).")
        super().configure_processes(process_group_backend, timeout)

    def zero_stage(self):
        return build_config(self.user_config, stage=self.stage, precision=None)["zero_optimization"]["stage"]

    # -- the config --------------------------------------------------------------------------------------------
    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        if getattr(self._precision_choice, "engine", None) == "DeepSpeed":
            self.precision_plugin = self._precision_choice  # Lightning's DeepSpeedPrecision: its hooks attached
        elif not isinstance(self.precision, DeepSpeedPrecision):  # a plugin given to the constructor: the engine's
            self.precision = self.build_precision(self.precision.name)  # policy of the same name

    def adopt_precision(self, plugin):
        """A precision plugin object (Trainer(plugins=[...])): the engine's own plugin of that name (the engine
        casts, scales and steps; Lightning's DeepSpeedStrategy reads only the plugin's precision name too)."""
        if plugin.engine not in (None, "DeepSpeed"):
            return super().adopt_precision(plugin)  # (its error)
        own = self.build_precision(plugin.name)
        return own if plugin.engine is None else plugin.attach_hooks(own, self)  # (a subclass's hooks: called here)

    def build_precision(self, name):
        """The engine owns precision: a plugin that forwards to it (the config's bf16/fp16 sections come from the
        name; an impossible one fails in setup_environment, before any process starts)."""
        if name in ("bf16-true", "16-true"):
            # DeepSpeed's bf16/fp16 modes hold the module in half but keep fp32 master weights in the optimizer
            # (and its bf16_master_weights_and_grads option is ZeRO-only and not tested here): that is the mixed
            # mode, so a "true" half name would promise memory it does not save.
            mixed = name.replace("true", "mixed")
            raise ValueError(f"precision={name!r} (parameters stored in half, no fp32 master copy) is not available "
                             f"under DeepSpeed: its bf16/fp16 modes keep fp32 master weights. Use "
                             f"precision={mixed!r} (DeepSpeed holds the module in half and steps fp32 master "
                             "weights), or the 'fsdp'/'ddp' strategies for true half precision.")
        return DeepSpeedPrecision(name, self.root_device.type)

    def _config_without_batch(self):
        """The config for an engine that does not train (evaluation, zero.Init): its batch values are moot."""
        user = {k: v for k, v in (self.user_config or {}).items()
                if k not in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")}
        saved, self.user_config = self.user_config, user
        try:
            config = self.resolved_config(1, 1, world_size=self.world_size)
        finally:
            self.user_config = saved
        if config["zero_optimization"]["stage"] < 3:
            # Below stage 3 the weights are whole on every rank and there is no optimizer state to shard:
            # DeepSpeed's stages 1-2 also refuse to start without an optimizer.
            config["zero_optimization"] = {"stage": 0}
        zero = config["zero_optimization"]
        if isinstance(zero.get("offload_param"), dict) and zero["offload_param"].get("device") == "nvme" and \
                self.module is not None and self._partitioned():
            # The module of a finished disk-offload fit keeps its partitions in that engine's swap files; a new
            # engine with its own parameter swapper would empty the folder first (DeepSpeed's swapper does at
            # start). The partitions read themselves back through their own swapper: this engine adds none.
            zero["offload_param"] = {"device": "cpu", "pin_memory": zero["offload_param"].get("pin_memory", False)}
        return config

    def resolved_config(self, micro_batch_size=None, accumulate_grad_batches=None, gradient_clipping=None,
                        precision=None, world_size=None):
        """The config the engine would run with, for these values (this strategy's own where one is None)."""
        precision = precision or (self.precision.name if self.precision is not None else "32-true")
        return build_config(
            self.user_config, stage=self.stage, offload_optimizer=self.offload_optimizer,
            offload_parameters=self.offload_parameters, save_16bit_model=self.save_16bit,
            offload_device=self.offload_device, nvme_path=self.nvme_path, aio=self.aio, precision=precision,
            device_type=self.root_device.type,
            micro_batch_size=micro_batch_size or self.micro_batch_size or 1,
            accumulate_grad_batches=accumulate_grad_batches or self.accumulate_grad_batches or 1,
            gradient_clipping=self.gradient_clipping if gradient_clipping is None else gradient_clipping,
            world_size=world_size or self.world_size,
        )

    # -- lifecycle -----------------------------------------------------------------------------------------
    def setup_environment(self):
        # Precision and offload are checked before any worker starts: every rank would fail the same way.
        config = build_config(self.user_config, stage=self.stage, offload_optimizer=self.offload_optimizer,
                              offload_parameters=self.offload_parameters, save_16bit_model=self.save_16bit,
                              offload_device=self.offload_device, nvme_path=self.nvme_path, aio=self.aio,
                              precision=self.precision.name if self.precision else None,
                              device_type=self.root_device.type)
        if self.root_device.type == "cpu":
            # Before deepspeed is imported: a GPU machine training on CPU must still get DeepSpeed's CPU accelerator.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # Offload to disk: the folder and the async_io op are checked here, on every rank alike (a launched worker
        # runs this too), rather than failing inside DeepSpeed at the first swap.
        check_nvme_offload(config)
        super().setup_environment()
        if "LOCAL_RANK" not in os.environ:  # DeepSpeed reads it even in a world of one; removed at teardown
            os.environ["LOCAL_RANK"] = str(self.local_rank)
            self._set_local_rank = True
        deepspeed = import_deepspeed()

        deepspeed.utils.logger.setLevel(self.logging_level)
        if _quiet_untested_optimizer not in deepspeed.utils.logger.filters:
            deepspeed.utils.logger.addFilter(_quiet_untested_optimizer)
        # DeepSpeed calls collectives torch 2.13 has renamed; the warning is DeepSpeed's business, not the user's.
        for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            warnings.filterwarnings("ignore", message=f".*{name}` is deprecated", category=FutureWarning)
        if self.root_device.type == "cpu":
            # Its shared-memory op serves inference all-reduce only and costs a ~50 s compile on first use.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False, verbose=False)

    def setup_module_and_optimizers(self, module, optimizers, plan):
        """deepspeed.initialize over the module and its one optimizer, with the config's "auto" values from the plan.
        The Trainer's module steps go through the engine's forward; for the Accelerator the engine is the model.
        Without an optimizer (validate / test / predict) the engine is built without one."""
        if len(optimizers) > 1:
            raise ValueError(f"configure_optimizers returned {len(optimizers)} optimizers; DeepSpeed drives one "
                             "optimizer per engine. Return one (parameter groups can hold different settings).")
        if self.engine is not None:
            raise ValueError("DeepSpeed trains one model with one optimizer per Accelerator: prepare a single model "
                             "and its optimizer together (use a separate Accelerator per model).")
        # (a GradientAccumulationScheduler is refused at train start, Lightning's point: check_accumulation_can_change;
        # until then the engine is built with its first window)
        scheduled = {factor for _, factor in plan.accumulation_schedule[:1]}
        # prepare(torch.compile(model), ...): the engine must hold the module itself (ZeRO-3's forward hooks mark
        # the module's own parameters, and fail on the wrapper), so the module goes in with its forward compiled in
        # place, with the wrapper's settings; the module stays compiled, as the script asked.
        module, compiled = unwrap_compiled(module)
        compile_forward_as(module, compiled)
        # the precision's cast first, as Lightning's DeepSpeedStrategy.setup (the engine's own plugin casts nothing:
        # DeepSpeed holds the module in bf16/fp16 itself; a Lightning plugin's convert_module of one's own runs here)
        if self.precision.convert_module(module) is not module:
            raise ValueError(f"{type(self.precision_plugin).__name__}.convert_module(module) returned another module: "
                             "DeepSpeed's engine trains the module the run set up. Convert it in place (module.to(...) "
                             "returns the module itself).")
        self.module = module
        self.optimizers = list(optimizers)
        self._client_optimizer = self.optimizers[0] if self.optimizers else None
        # by identity, now: the engine replaces the optimizer's parameters by its flat partitions
        self._param_names = super().optimizer_param_names(self._client_optimizer) if self.optimizers else None
        self._wrapped = plan.calls_steps
        self._scale_wrt_gas = not plan.loss_divided_by_window
        if self._client_optimizer is None:
            self._initialize(micro_batch_size=None, accumulate_grad_batches=None, gradient_clipping=None)
            return self.engine, self.optimizers
        micro = self.micro_batch_size or plan.micro_batch_size or self._configured_micro_batch_size()
        if micro is None:
            warnings.warn("DeepSpeed: the micro-batch size is not known (the training loader has no batch_size: a "
                          "custom batch sampler?), so the config's train_micro_batch_size_per_gpu is 1. DeepSpeed "
                          "uses it only for its throughput figures; pass DeepSpeed(micro_batch_size=N) to set it.")
            micro = 1
        # Manual optimisation steps where the user says: each backward closes its own window.
        # A schedule (refused at train start) is built with its first window.
        planned = scheduled.pop() if scheduled else plan.accumulate_grad_batches
        accumulate = _agree("accumulate_grad_batches", self.accumulate_grad_batches,
                            planned if plan.automatic_optimization else 1)
        clipping = _agree("gradient_clipping", self.gradient_clipping, _clip_norm_of(plan.clipping))
        # Whether anyone stated the clipping (the config, DeepSpeed(gradient_clipping=), the plan): if not, a custom
        # loop's clip_grad_norm_ sets it (clip_gradients), as the script's max_norm is then the only word on it.
        self._clipping_stated = clipping is not None or (self.user_config or {}).get("gradient_clipping",
                                                                                     "auto") != "auto"
        if plan.has_lr_schedulers and "scheduler" in (self.user_config or {}):
            raise ValueError("The DeepSpeed config has a \"scheduler\" section and the run steps a scheduler of its "
                             "own (configure_optimizers returned one, or one was prepared): two schedulers would set "
                             "the same learning rate. Keep one of them.")
        self._initialize(micro_batch_size=micro, accumulate_grad_batches=accumulate, gradient_clipping=clipping)
        return self.engine, self.optimizers

    def setup_optimizer(self, optimizer):
        raise ValueError("Under DeepSpeed the model and its optimizer are prepared together: pass both to one "
                         "accelerator.prepare(model, optimizer, ...) call.")

    @property
    def handles_gradient_accumulation(self) -> bool:
        """Lightning's DeepSpeedStrategy: True, the engine accumulates (it is told the window: the plan)."""
        return True

    def needs_micro_batch_size(self):
        """The config's train_micro_batch_size_per_gpu comes from the training loader unless it is given (the
        config, DeepSpeed(micro_batch_size=)), as in Lightning's DeepSpeed."""
        return self.micro_batch_size is None and self._configured_micro_batch_size() is None

    def _configured_micro_batch_size(self):
        given = (self.user_config or {}).get("train_micro_batch_size_per_gpu", "auto")
        return None if given == "auto" else int(given)

    def _initialize(self, micro_batch_size, accumulate_grad_batches, gradient_clipping):
        """deepspeed.initialize. micro_batch_size=None: an engine that does not train (no batch values needed)."""
        import deepspeed

        if micro_batch_size is None:
            config = self._config_without_batch()
        else:
            config = self.resolved_config(micro_batch_size, accumulate_grad_batches, gradient_clipping)
        _fill_nvme_buffer_size(config, self.module, self.world_size)
        if _enabled(config.get("fp16")) is True:
            from deepspeed.accelerator import get_accelerator

            if not get_accelerator().is_fp16_supported():
                raise ValueError(f"precision='16-mixed' (fp16): DeepSpeed's {get_accelerator().device_name()} "
                                 "accelerator does not support fp16 on this machine. Use precision='bf16-mixed'.")
        optimizer = self._client_optimizer
        if optimizer is not None and _offloads(config, "offload_optimizer"):
            optimizer = self._offload_optimizer(optimizer, config)
        model = _EngineForward(self.module) if self._wrapped else self.module
        kwargs = {"optimizer": optimizer} if optimizer is not None else {}
        _forget_destroyed_groups()
        with _honour_init_dtype(_nvme_folders(config).get("offload_param") is not None), _no_forced_collections():
            self.engine, _, _, _ = deepspeed.initialize(model=model, config=config, dist_init_required=False,
                                                        **kwargs)
        self.config = config
        # Trainable ones: a user may keep a frozen part in another dtype on purpose.
        _check_param_dtypes([p for p in self.engine.module.parameters() if p.requires_grad], _param_dtype_of(config),
                            self.precision.name if self.precision is not None else "32-true", "of the DeepSpeed engine")
        self.model = self.engine
        bf16, fp16 = _enabled(config.get("bf16", config.get("bfloat16"))), _enabled(config.get("fp16"))
        self.precision.attach(self.engine, torch.bfloat16 if bf16 is True else torch.float16 if fp16 is True else None)
        self._loaded_engine_state = False

    def _offload_optimizer(self, optimizer, config):
        """ZeRO-Offload steps on the CPU: Adam/AdamW become DeepSpeedCPUAdam, anything else stays (slowly)."""
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        name = type(optimizer).__name__
        groups = optimizer.param_groups
        plain_adam = type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and not any(
            g.get("amsgrad") or g.get("maximize") or isinstance(g["lr"], torch.Tensor) for g in groups)
        if not plain_adam:
            config["zero_force_ds_cpu_optimizer"] = False
            _say_once(f"offload-{name}", self.is_global_zero,
                      f"DeepSpeed offload: keeping {name} (DeepSpeedCPUAdam replaces only plain Adam/AdamW); "
                      "it steps on the CPU in Python, which is slower than DeepSpeed's CPU Adam.")
            return optimizer
        defaults = optimizer.defaults
        cpu_adam = DeepSpeedCPUAdam([{"params": g["params"]} for g in groups], lr=defaults["lr"],
                                    betas=defaults["betas"], eps=defaults["eps"],
                                    weight_decay=defaults["weight_decay"],
                                    adamw_mode=type(optimizer) is torch.optim.AdamW)
        # The very same group dicts: the user's scheduler (built on the user's optimizer) sets the lr that
        # CPUAdam reads, and the user's optimizer shows what is being stepped.
        for group in groups:
            for key, value in cpu_adam.defaults.items():
                group.setdefault(key, value)
        cpu_adam.param_groups = groups
        # torch schedulers warn unless the optimizer they hold has stepped: CPUAdam steps in its place.
        optimizer._opt_called = True
        _say_once("offload-adam", self.is_global_zero,
                  f"DeepSpeed offload: {name} is replaced by DeepSpeedCPUAdam (same param groups and "
                  "hyper-parameters), DeepSpeed's vectorised CPU Adam.")
        return cpu_adam

    @contextlib.contextmanager
    def module_init_context(self, empty_init=False):
        """`with strategy.module_init_context(): module = Model()`: with zero3_init (stage 3) the parameters are
        created partitioned over the ranks, so no process ever holds the whole model. Starts the processes and
        the process group if the Trainer has not yet (every rank runs this line). The parameters are initialised
        either way (zero.Init partitions them after their module's __init__): empty_init changes nothing here."""
        if not self.zero3_init:
            yield
            return
        if self.precision is None:
            raise RuntimeError("module_init_context needs the precision: build the Trainer (or set "
                               "strategy.precision) first, then create the module inside the context.")
        deepspeed = import_deepspeed()

        # A run's kept engine (end_run) goes first: with a world of one, its group with it, so that the parameters are
        # partitioned over the group the next run trains on.
        release_kept_runs()
        if self.env is None or not dist.is_initialized():
            self.setup_environment()
        config = self._config_without_batch()
        created = []
        hook = torch.nn.modules.module.register_module_parameter_registration_hook(
            lambda module, name, param: created.append(param))
        try:
            # dtype=None: the config decides (bf16 / fp16 / fp32). An explicit dtype is dropped by DeepSpeed 0.19.8 on
            # CPUs without float16 support (zero.Init._set_dtype, deepspeedai/DeepSpeed#8428): fp32 runs got bf16.
            with deepspeed.zero.Init(config_dict_or_path=config, dtype=None):
                yield
        finally:
            hook.remove()
        _check_param_dtypes(created, _param_dtype_of(config), self.precision.name, "created under zero3_init")

    def end_run(self):
        """A Trainer run's end: the engine stays (Lightning's DeepSpeedStrategy keeps it after fit), so that
        trainer.save_checkpoint(...) after the run writes its shards, and strategy.full_state_dict() gathers them; it
        is torn down when the next run of this process sets up (this Trainer's or another's, any strategy), or at
        exit before the process group. With a world of one the group stays until then too: the engine's save runs
        collectives over it."""
        if self.engine is None:
            return self.teardown()
        if self._set_local_rank:  # (read by DeepSpeed at initialize only: the environment is left as it was found)
            os.environ.pop("LOCAL_RANK", None)
            self._set_local_rank = False
        keep_until_next_run(self)

    def teardown(self):
        engine, self.engine = self.engine, None
        self.model = None
        self.optimizers = []
        self._client_optimizer = None
        if self.precision is not None:
            self.precision.detach()  # nothing may keep the engine alive past the group (gloo at exit)
        if engine is not None:
            engine.destroy()  # removes DeepSpeed's hooks from the module
            _restore_functional_linear()
        del engine
        gc.collect()
        if self.owns_world_of_one():
            # A world of one is ended now (ProcessWorld.teardown would); DeepSpeed's destroy also forgets its copies of
            # the group, so that a later run in this process can start a new one.
            import deepspeed.comm

            if deepspeed.comm.is_initialized():
                deepspeed.comm.destroy_process_group()
                self.disown_group()
        if self._set_local_rank:
            os.environ.pop("LOCAL_RANK", None)
            self._set_local_rank = False
        super().teardown()

    # -- the step ------------------------------------------------------------------------------------------
    # Each step runs through the engine's forward inside the precision's step context, as Lightning's DeepSpeed
    # strategy does (the engine's own plugin has none: the engine casts; a DeepSpeedPrecision subclass's hook runs)
    def training_step(self, *args, **kwargs):
        with self.forward_context("training_step"):
            return self.engine(*args, _tasktrain_step=self.module.training_step, **kwargs)

    def eval_step(self, step_fn, *args, **kwargs):
        if self.config["zero_optimization"]["stage"] != 3:
            with self.forward_context(step_name(step_fn)):
                return self.engine(*args, _tasktrain_step=step_fn, **kwargs)
        # ZeRO-3 gathers the partitioned parameters in the forward: gathered under inference_mode they become
        # inference tensors that a later training forward cannot save for backward (seen with a parameter over
        # the persistence threshold, validated inside fit). Evaluation steps run under no_grad instead.
        with torch.inference_mode(False), torch.no_grad(), self.forward_context(step_name(step_fn)):
            return self.engine(*args, _tasktrain_step=step_fn, **kwargs)

    def no_backward_sync(self, enabled: bool, model=None):
        """Tell the engine whether this micro-batch closes the accumulation window (DeepSpeed holds back the
        reduction and the step until it does)."""
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(not enabled)
        return contextlib.nullcontext()

    def unwrap_model(self, model):
        if self.engine is not None and model is self.engine:
            model = model.module
        return super().unwrap_model(model)

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        loss, backward_fn = closure_loss, kwargs.pop("backward_fn", None)
        if backward_fn is not None:
            # the Trainer's step through a Lightning plugin's step hooks (a DeepSpeedPrecision subclass overriding
            # one): backward_fn is its backward (by default engine_backward); the module's own backward never comes
            # here (refused before training)
            self.precision.run_backward(loss, *args, backward_fn=backward_fn, **kwargs)
        else:
            self.engine_backward(loss, *args, **kwargs)
        if not self.engine.is_gradient_accumulation_boundary():
            self.engine.step()  # DeepSpeed counts every micro-batch; inside a window its step changes nothing
        return closure_loss

    def steps_with_closure(self) -> bool:
        return False  # the engine's step takes no closure: the loop runs it first

    def engine_backward(self, loss, *args, **kwargs):
        """The engine's backward of `loss` (DeepSpeedPrecision.backward's default, Lightning's
        deepspeed_engine.backward(tensor, **kwargs)); the loss is divided by the window where the loop did not."""
        if args:
            raise TypeError(f"DeepSpeed's engine.backward(loss, **kwargs) takes keyword arguments only; got {args!r}.")
        self.precision.backward(loss, scale_wrt_gas=self._scale_wrt_gas, **kwargs)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs) -> bool:
        if model is not None and self.precision.lightning_steps:
            # the Trainer's step through a Lightning plugin's step hooks: its optimizer_step runs the closure, then
            # (by default) engine_step
            return self.precision.run_step(optimizer, closure, model=model, **kwargs)
        if closure is not None:
            raise ValueError("DeepSpeed steps without a closure: optimizers that need one (LBFGS) are not supported "
                             "under DeepSpeed; use DDP for them.")
        return self.engine_step(optimizer, **kwargs)

    def engine_step(self, optimizer=None, **kwargs) -> bool:
        """The engine's step at the window's end (DeepSpeedPrecision.optimizer_step's default, Lightning's
        deepspeed_engine.step()): it clips, steps and zeroes the gradients; returns whether it stepped (False: an
        fp16 overflow skipped it)."""
        if kwargs:
            raise ValueError(f"DeepSpeed's engine steps without arguments: optimizer.step(**{sorted(kwargs)}) "
                             "cannot reach it. Drop them, or use DDP.")
        engine = self.engine
        if not engine.is_gradient_accumulation_boundary():
            raise RuntimeError(
                "DeepSpeed was asked to step in the middle of its accumulation window (a window cut short by a "
                "loop of your own). DeepSpeed reduces gradients only at a window's last micro-batch, so it cannot "
                "close the window now: tell the strategy where windows end, around each micro-batch "
                "(strategy.no_backward_sync(not last_micro_batch); the Accelerator's accumulate() does)."
            )
        return self.precision.optimizer_step(optimizer)

    def zero_grad(self, optimizer=None):
        pass  # engine.step() zeroes the gradients at the window's end

    def clip_gradients(self, optimizer=None, max_norm=None, max_value=None, norm_type=2.0, unscale=True):
        """DeepSpeed clips inside engine.step() with the config's gradient_clipping (the engine's own loss scale is
        taken off there first, whatever `unscale` says: no scaled gradient is ever seen outside it). Where the run stated a value
        (the config, DeepSpeed(gradient_clipping=), the Trainer's gradient_clip_val) the request must agree with it;
        where nobody did, the request sets the engine's clipping for the next step (a custom loop's
        clip_grad_norm_(params, max_norm)). Returns None (the norm of a step: last_grad_norm() after it)."""
        configured = float(self.config.get("gradient_clipping", 0.0)) if self.config else 0.0
        if max_value is not None:
            raise ValueError("DeepSpeed clips by norm only (inside its step): use clip_grad_norm_ / gradient_clip_val "
                             "with gradient_clip_algorithm='norm', not clipping by value (clip_grad_value_).")
        if max_norm is None or abs(float(max_norm) - configured) <= 1e-12:
            return None
        if float(norm_type) != 2.0:
            raise ValueError(f"DeepSpeed clips the 2-norm inside its step; this asks for norm_type={norm_type}.")
        if self._clipping_stated or self.engine is None:
            raise ValueError(
                f"DeepSpeed clips the 2-norm inside its step, to the config's gradient_clipping={configured}; this "
                f"asks for max_norm={max_norm} (norm_type={norm_type}). Set the same value in the config "
                f"(DeepSpeed(gradient_clipping={max_norm}), or `tasktrain launch --gradient_clipping {max_norm}`).")
        self._set_engine_clipping(float(max_norm))
        return None

    def _set_engine_clipping(self, max_norm):
        """DeepSpeed 0.19 reads the clipping at each step from the engine's config (ZeRO stage 0 in fp32) or from
        its optimizer's clip_grad (the ZeRO, bf16 and fp16 optimizers): both are set, and the resolved config says
        the value in use."""
        if max_norm <= 0:
            raise ValueError(f"clip_grad_norm_(max_norm={max_norm}): use a max norm > 0.")
        self.engine._config.gradient_clipping = max_norm
        optimizer = self.engine.optimizer
        if optimizer is not None and hasattr(optimizer, "clip_grad"):
            optimizer.clip_grad = max_norm
        self.config["gradient_clipping"] = max_norm

    def last_grad_norm(self):
        """The 2-norm of the gradients of the engine's last step, before clipping (None where DeepSpeed does not
        compute it: ZeRO stage 0 in fp32)."""
        norm = None if self.engine is None else self.engine.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(float(norm))

    # -- checkpoints ----------------------------------------------------------------------------------------
    def module_state_dict(self, model=None):
        return {}  # the weights are in the engine's shards, next to the state file in the checkpoint directory

    def optimizer_state(self, optimizer):
        # The moments and step counts are in the engine's shards; the groups' hyper-parameters are kept here too,
        # for a load on another number of processes (DeepSpeed's universal load at stage 3 loses them).
        return {"deepspeed": "in the engine's shards of this checkpoint directory",
                "param_groups": [{k: v for k, v in group.items() if k != "params"}
                                 for group in optimizer.param_groups]}

    def optimizer_param_names(self, optimizer, model=None):
        if optimizer is self._client_optimizer and self._param_names is not None:
            return self._param_names
        return super().optimizer_param_names(optimizer, model)

    def load_module_state_dict(self, state_dict, model=None, strict=True):
        if not state_dict and self._loaded_engine_state:
            return  # engine.load_checkpoint restored the weights already
        state_dict = {(_WRAPPER_PREFIX if self._wrapped else "") + k: v for k, v in state_dict.items()}
        target = self.engine.module if self.engine is not None else self.module
        with self._gathered(modifier_rank=0):
            if not self._partitioned() or self.is_global_zero:
                load_plain_state_dict(target, state_dict, strict=strict)
        optimizer = self.engine.optimizer if self.engine is not None else None
        if hasattr(optimizer, "refresh_fp32_params"):  # DeepSpeed's wrappers (ZeRO, bf16, fp16); not a torch optimizer
            if _swaps_optimizer(optimizer):
                raise CheckpointError(
                    "Loading whole weights into a DeepSpeed engine that offloads its optimizer to disk is not "
                    "supported (its fp32 master weights live in swap files): resume from a DeepSpeed checkpoint "
                    "directory (`tasktrain convert FILE DIR --to deepspeed`), or offload to 'cpu'.")
            # The engine's optimizer steps its own fp32 copy of the weights and writes it back into the module after
            # each step: the copy must be the loaded weights, or the first step would bring the old ones back.
            optimizer.refresh_fp32_params()

    def load_optimizer_state(self, optimizer, state):
        if isinstance(state, dict) and "deepspeed" in state and self._loaded_engine_state:
            return  # engine.load_checkpoint restored it
        if self.load_full_weights and not self._loaded_engine_state:
            # Lightning's DeepSpeedStrategy.lightning_restore_optimizer: the weights of a single file load, its
            # optimizer state is not restored (the schedulers, precision and counters are), with its warning
            if self.is_global_zero:
                warnings.warn(
                    "A single checkpoint file has been given. This means optimizer states cannot be restored. If "
                    "you'd like to restore these states, you must provide a path to the originally saved DeepSpeed "
                    "checkpoint. When using ZeRO 3, the original path should be a directory.", UserWarning)
            return
        raise ValueError(
            "This checkpoint holds a plain optimizer state, not DeepSpeed's sharded one: a DeepSpeed fit resumes "
            "from a checkpoint directory written under DeepSpeed. Convert the file into one (its optimizer state "
            "included): `tasktrain convert FILE DIR --to deepspeed`, then resume from DIR on any ZeRO stage and "
            "number of processes. (To start from its weights only, load them into the module before fit: "
            "module.load_state_dict(torch.load(path, weights_only=True)['state_dict']).)"
        )

    def check_can_save(self):
        if self.engine is None:
            raise RuntimeError(
                "trainer.save_checkpoint(...): this DeepSpeed strategy holds no engine, so there are no shards to save. "
                "A run's engine is kept after the run for such a save until the next run of this process sets up "
                "(any Trainer's or Accelerator's), and a run that failed releases it at once. Save before starting "
                "the next run, or inside the run: ModelCheckpoint(save_last=True), or trainer.save_checkpoint(...) in "
                "a callback's on_train_end / on_fit_end (every rank calls it).")

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None):
        """A directory: the engine's shards (one file per rank) plus our state file; written under a temporary
        name and renamed into place, so a crash never leaves a half directory under the real name.

        A weights-only checkpoint is a single file with the consolidated fp32 weights instead. storage_options
        (Lightning's) is refused: the engine writes its own shards."""
        if storage_options is not None:
            raise TypeError("DeepSpeedStrategy.save_checkpoint(storage_options=...): the DeepSpeed engine writes its "
                            "shards itself, with no CheckpointIO to pass them to (Lightning's refuses them too). "
                            "Leave storage_options out.")
        path = os.path.abspath(os.fspath(filepath))
        if own_state(checkpoint).get("weights_only"):
            tmp = f"{path}.zero-tmp"
            self._save_engine(tmp, {}, sixteen_bit=False)
            if self.is_global_zero:
                checkpoint = dict(checkpoint, state_dict=convert_zero_checkpoint(tmp)["state_dict"])
                atomic_save(checkpoint, path)
                shutil.rmtree(tmp, ignore_errors=True)
            self.barrier("save_checkpoint")
            return
        tmp = f"{path}.tmp"
        self._save_engine(tmp, checkpoint)
        if self.is_global_zero:
            replace_dir(tmp, path)
        self.barrier("save_checkpoint")

    def save_checkpoint_into(self, directory, checkpoint, filename):
        """The engine's shards and `checkpoint` (as `filename`) into `directory`; other files there stay."""
        self._save_engine(os.path.abspath(os.fspath(directory)), checkpoint, filename)
        self.barrier("save_state")

    def load_checkpoint_from(self, directory, filename):
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"{directory} does not exist: load_state expects a directory written by "
                                    "accelerator.save_state(dir).")
        return self._load_directory(directory, filename)

    def _save_engine(self, directory, state, state_file=STATE_FILE, sixteen_bit=True):
        if self.is_global_zero and os.path.isdir(directory) and directory.endswith((".tmp", ".zero-tmp")):
            shutil.rmtree(directory)  # the leftover of an interrupted save
        self.barrier("save_engine")
        with _complete_swapped_state(self.engine.optimizer):
            self.engine.save_checkpoint(directory, tag=ENGINE_TAG, client_state={}, save_latest=True)
        if self.save_16bit and sixteen_bit:
            self.save_16bit_weights(os.path.join(directory, SIXTEEN_BIT_FILE), checkpoint=state)
        if self.is_global_zero:
            state = with_own(state, deepspeed={"tag": ENGINE_TAG, "stage": self.config["zero_optimization"]["stage"],
                                               "world_size": self.world_size,
                                               "key_prefix": _WRAPPER_PREFIX if self._wrapped else "",
                                               # False: an evaluation run's engine (no optimizer), saved after it
                                               "trained": self._client_optimizer is not None})
            atomic_save(state, os.path.join(directory, state_file))

    # -- background saves (issue 29) -------------------------------------------------------------------------------
    # DeepSpeed 0.19.8 writes every file of its checkpoint through the engine's checkpoint engine (create / save /
    # commit). Its own background engine, DecoupledCheckpointEngine, writes through FastCheckpointEngine, which
    # needs the async_io op (libaio; not buildable on every machine) and a writer process per node. Here the
    # engine's checkpoint engine is swapped, for the length of one engine.save_checkpoint, for one that stages each
    # file's state into CPU memory instead of writing it (_StagingCheckpointEngine); a thread of each rank then
    # writes its files, fsyncs them and marks its part done, and rank 0 renames the directory into place once every
    # rank has.
    def check_async_save(self, weights_only=False):
        if weights_only:
            raise ValueError("async_save under DeepSpeed writes resumable checkpoints only: a weights-only one is "
                             "consolidated from the engine's shards by rank 0 while saving. Use save_weights_only="
                             "False, or async_save=False for the weights-only checkpoints.")
        if self.save_16bit:
            raise ValueError("async_save under DeepSpeed does not write the 16-bit model of save_16bit_model=True "
                             "(DeepSpeed gathers it with collectives while saving). Use save_16bit_model=False with "
                             "async_save, or async_save=False.")

    def save_checkpoint_async(self, checkpoint: dict, path: str, on_complete=None, filename=None):
        self.check_async_save(own_state(checkpoint).get("weights_only", False))
        from tasktrain.checkpoint_io import fsync_save, mark_done, stage_to_cpu, wait_for_marks

        writer = self.checkpoint_writer
        writer.wait()
        path = os.path.abspath(os.fspath(path))
        tmp = f"{path}.tmp"
        if self.is_global_zero and os.path.isdir(tmp):
            shutil.rmtree(tmp)  # the leftover of an interrupted save
        self.barrier("save_engine")
        engine = self.engine
        staging = _staging_checkpoint_engine(engine.checkpoint_engine, writer.staged)
        engine.checkpoint_engine = staging
        try:
            engine.save_checkpoint(tmp, tag=ENGINE_TAG, client_state={}, save_latest=True)
        finally:
            engine.checkpoint_engine = staging.inner
        files, rank, world_size = staging.files, self.global_rank, self.world_size
        staged = None
        if self.is_global_zero:
            staged = writer.staged["state"] = stage_to_cpu(checkpoint, writer.staged.get("state"))
            staged = with_own(staged, deepspeed={"tag": ENGINE_TAG, "stage": self.config["zero_optimization"]["stage"],
                                                 "world_size": world_size,
                                                 "key_prefix": _WRAPPER_PREFIX if self._wrapped else "",
                                                 "trained": self._client_optimizer is not None})

        def write():
            for file_path, state in files:
                os.makedirs(os.path.dirname(file_path), exist_ok=True)
                fsync_save(state, file_path)
            mark_done(os.path.join(tmp, ENGINE_TAG), rank)
            if rank == 0:
                wait_for_marks(os.path.join(tmp, ENGINE_TAG), world_size)
                fsync_save(staged, os.path.join(tmp, filename or STATE_FILE))
                replace_dir(tmp, path)
                if on_complete is not None:
                    on_complete()

        writer.start(write, path)
        return writer

    def save_16bit_weights(self, path, hyper_parameters=None, checkpoint=None):
        """Write the consolidated 16-bit weights (our checkpoint format, weights only; the counters and train state
        of `checkpoint`, the Trainer's, where given) to `path`. Every rank calls it (stage 3 gathers the
        partitions)."""
        directory, name = os.path.split(os.path.abspath(path))
        raw = f".{name}.deepspeed"
        if not self.engine.save_16bit_model(directory, raw):
            raise RuntimeError("DeepSpeed did not write the 16-bit model (stage 3 needs "
                               "stage3_gather_16bit_weights_on_model_save, which save_16bit_model=True sets).")
        if self.is_global_zero:
            dtype = torch.bfloat16 if self.precision.input_dtype == torch.bfloat16 else torch.float16
            weights = torch.load(os.path.join(directory, raw), map_location="cpu", weights_only=True)
            weights = {_strip(k, _WRAPPER_PREFIX if self._wrapped else ""): v.to(dtype) if v.is_floating_point() else v
                       for k, v in weights.items()}
            ckpt = dict(checkpoint or {})
            if hyper_parameters:
                ckpt["hyper_parameters"] = hyper_parameters
            atomic_save(weights_file(ckpt, weights, world_size=self.world_size), path)
            os.remove(os.path.join(directory, raw))
        self.barrier("save_16bit")

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """A DeepSpeed checkpoint directory: the engine loads its shards (weights, optimizer) and our state file is
        returned. Without an optimizer (validate/test/predict) the weights are consolidated instead. (Lightning's
        signature; the state file is read with weights_only=True whatever weights_only says.)"""
        path = os.fspath(checkpoint_path)
        if not os.path.isdir(path):
            return load_checkpoint_file(path)  # a plain checkpoint: weights yes, optimizer state no (see above)
        return self._load_directory(path, STATE_FILE)

    def _load_directory(self, path, state_name):
        check_deepspeed_folder(path)  # issue 38: before DeepSpeed's own loaders unpickle any of it
        state_file = os.path.join(path, state_name)
        if not os.path.isfile(state_file):
            raise CheckpointError(f"{path!r} is a directory without {state_name}: not a checkpoint written by the "
                                  "tasktrain DeepSpeed strategy (or an interrupted save).")
        ckpt = load_checkpoint_file(state_file)
        meta = own_state(ckpt).get("deepspeed", {})
        if self._client_optimizer is None or own_state(ckpt).get("weights_only"):
            ckpt["state_dict"] = convert_zero_checkpoint(path)["state_dict"]
            return ckpt
        if meta.get("trained") is False:
            raise CheckpointError(
                f"{path!r} was saved after validate/test/predict (trainer.save_checkpoint after an evaluation run): "
                "that run's engine had no optimizer, so the directory holds the weights only, and a fit resumes from "
                "the optimizer's shards too. Resume from a checkpoint saved in or after a fit; to start a new fit from "
                "these weights, convert them (`tasktrain convert DIR model.ckpt`) and load them into the module before "
                "fit.")
        stage = self.config["zero_optimization"]["stage"]
        saved_world = meta.get("world_size", own_state(ckpt).get("world_size"))
        saved_stage = meta.get("stage")
        tag = meta.get("tag", ENGINE_TAG)
        same = saved_world in (None, self.world_size) and saved_stage in (None, stage)
        swapping = _swaps_optimizer(self.engine.optimizer)
        if swapping and (meta.get("universal") or not same):
            raise CheckpointError(
                f"{path!r} was written by {saved_world} processes at ZeRO stage {saved_stage}; this run offloads the "
                f"optimizer to disk with {self.world_size} at stage {stage}, and DeepSpeed 0.19.8 loads into such an "
                "engine only checkpoints of its own layout. Resume once on the saved number of processes and stage "
                "(or with offload_device='cpu', which loads any), save, and continue from that checkpoint.")
        if meta.get("universal") or (not same and 0 not in (stage, saved_stage)):
            # Another number of processes or another ZeRO stage: through DeepSpeed's universal checkpoint.
            self._load_universal(path, ckpt, tag, saved_world, saved_stage)
            return ckpt
        if not same and (stage, saved_stage) != (0, 0):
            raise CheckpointError(
                f"{path!r} was written at ZeRO stage {saved_stage} and this run uses stage {stage}: a ZeRO stage 0 "
                "checkpoint has no partitions for DeepSpeed's universal format to take apart, nor can one be loaded "
                f"at stage 0. Resume at stage {saved_stage}, or convert it into a plain checkpoint (`tasktrain "
                "convert DIR out.ckpt --to ckpt`) and that into a DeepSpeed one (`--to deepspeed`).")
        # (stage 0 keeps the whole optimizer state in every rank's file: any number of processes loads it)
        if swapping:
            # DeepSpeed copies the checkpoint's copy of the swap folder back, and fails where there is none (one
            # written without offload to disk); what it copies is put right from the ZeRO file after the load.
            os.makedirs(os.path.join(path, tag, "offloaded_tensors", f"rank{self.global_rank:0>2d}"), exist_ok=True)
        loaded, _ = self.engine.load_checkpoint(path, tag=tag, load_module_strict=_strict_loading(self.module),
                                                load_optimizer_states=True, load_lr_scheduler_states=True)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load the checkpoint in {path!r} (see its log above).")
        if swapping:
            self._restore_swapped_state(path, tag)
        self._loaded_engine_state = True
        return ckpt

    def _restore_swapped_state(self, path, tag):
        """Offload to disk: DeepSpeed 0.19.8's load_checkpoint skips its ZeRO file there (it copies the swap files
        back instead), and so loses the optimizer's state: the moments are never attached again and Adam restarts
        from zero (its first update is lr x sign(grad)), and the hyper-parameters, the step counts and the master
        weights of partitions kept in memory are not read. This puts back, from this rank's ZeRO file (complete:
        _complete_swapped_state), every sub-group's fp32 master partition and optimizer state, writes the swapped
        ones to their swap files, and the working parameters from the master weights, as a step does."""
        engine = self.engine
        optimizer = engine.optimizer
        saved = engine.checkpoint_engine.load(engine._get_zero_ckpt_name(path, tag), map_location="cpu")
        saved = saved["optimizer_state_dict"]
        base_state = saved["optimizer_state_dict"]
        index = _sub_group_state_index(optimizer)
        for group, saved_group in zip(optimizer.optimizer.param_groups, base_state["param_groups"]):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
        optimizer.loss_scaler = saved["loss_scaler"]
        optimizer.dynamic_loss_scale = saved["dynamic_loss_scale"]
        optimizer.overflow = saved["overflow"]
        swapper = optimizer.optimizer_swapper
        optimizer._partition_all_parameters()
        for sub_group, flat in enumerate(optimizer.fp32_partitioned_groups_flat):
            swapped = optimizer._swappable_optimizer_subgroup(sub_group)
            if swapped:
                swapper.swap_in_optimizer_state(parameter=flat)
            flat.data.copy_(saved["fp32_flat_groups"][sub_group].to(flat.dtype))
            state = optimizer.optimizer.state[flat]
            for key, value in base_state["state"].get(index[sub_group], {}).items():
                current = state.get(key)
                if torch.is_tensor(value) and torch.is_tensor(current) and current.numel() == value.numel() > 0:
                    current.data.copy_(value.reshape(current.shape))
                else:  # a fresh engine has no state yet (the swapper attaches new tensors at the swap-out)
                    state[key] = value.clone() if torch.is_tensor(value) else value
            optimizer._reassign_or_swap_out_partitioned_parameters(sub_group)
            if swapped:
                swapper.swap_out_optimizer_state(parameter=flat)
                flat.grad = None
        optimizer._post_step(set())  # gathers the persistent (small, unpartitioned) parameters again

    def _load_universal(self, path, ckpt, tag, saved_world, saved_stage):
        """Load a checkpoint written on another number of processes or at another ZeRO stage: rank 0 converts the
        shards with DeepSpeed's own converter into its universal format (once; kept in the directory), then every
        rank's engine loads its part of that, and what DeepSpeed 0.19.8 gets wrong there is put right
        (universal.py)."""
        from tasktrain.strategies.deepspeed import universal

        meta = own_state(ckpt).get("deepspeed", {})
        stage = self.config["zero_optimization"]["stage"]
        error, utag = None, tag
        if self.is_global_zero:
            try:
                if not meta.get("universal"):
                    print(f"[tasktrain] {path} was written by {saved_world} processes at ZeRO stage {saved_stage}; "
                          f"this run has {self.world_size} at stage {stage}: converting it to DeepSpeed's universal "
                          f"checkpoint (kept in {os.path.join(path, universal.universal_tag(tag))}).", flush=True)
                    utag = universal.to_universal(path, tag)
                saved_prefix, prefix = meta.get("key_prefix", ""), _WRAPPER_PREFIX if self._wrapped else ""
                if saved_prefix != prefix:  # written by the Trainer, read by the Accelerator, or the other way
                    utag = universal.rekeyed(path, utag, saved_prefix, prefix)
            except Exception as err:  # every rank raises it, not only rank 0
                error = f"{type(err).__name__}: {err}"
        error, utag = self.broadcast((error, utag))
        if error is not None:
            raise CheckpointError(f"Converting {path!r} to DeepSpeed's universal checkpoint failed: {error}")
        engine = self.engine
        # The flag is read by load_checkpoint only (DeepSpeed sets up for universal loads at initialize anyway):
        # set for this load, so that the same engine still loads its own checkpoints the usual way.
        engine._config.load_universal_checkpoint = True
        try:
            loaded, _ = engine.load_checkpoint(path, tag=utag, load_module_strict=True, load_optimizer_states=True,
                                               load_lr_scheduler_states=True)
        finally:
            engine._config.load_universal_checkpoint = False
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load the universal checkpoint {os.path.join(path, utag)!r} "
                                  "(see its log above).")
        saved_groups = None
        states = ckpt.get("optimizer_states") or []
        if states and isinstance(states[0], dict):
            saved_groups = states[0].get("param_groups")
        universal.repair_universal_load(engine.optimizer.optimizer, saved_groups)
        universal.restore_module_extras(engine.module, path, utag, partitioned=stage == 3)
        self._loaded_engine_state = True

    def full_numel(self, param) -> int:
        return getattr(param, "ds_numel", param.numel())  # ZeRO-3: the parameter holds a shard, ds_numel the whole

    def device_numel(self, param):
        return param.partition_numel() if self.zero_stage() == 3 else None  # ZeRO-3: this rank's partition

    def check_full_parameters(self, who: str):
        if self.zero_stage() == 3:
            raise ValueError(f"{who} needs the whole parameters on every rank, and DeepSpeed ZeRO stage 3 shards them. "
                             "Use stage 1 or 2 (they shard the optimizer state only), or remove it.")

    def check_param_groups_can_change(self, who: str):
        raise NotImplementedError(f"{who} does not support running with the DeepSpeed strategy. Choose a different "
                                  "strategy or disable the callback. (It adds param groups to the optimizer during "
                                  "training, and DeepSpeed copies the groups into its engine at set-up: the new ones "
                                  "would never be stepped; strategy='ddp' runs it.)")

    def check_step_can_be_skipped(self, where: str):
        raise RuntimeError(f"{where}, which skips the batch; DeepSpeed's engine steps only after its own backward, so "
                           "a batch cannot skip it (Lightning documents it as unsupported under DeepSpeed). Return a "
                           "loss (multiplied by 0 to skip its effect), or use strategy='ddp'.")

    def check_accumulation_can_change(self):
        raise RuntimeError(f"The `{type(self).__name__}` does not support `accumulate_grad_batches` changing between "
                           "epochs. (DeepSpeed writes it into its config once, at set-up: use "
                           "Trainer(accumulate_grad_batches=N) for the whole run, or strategy='ddp'.)")

    def trainable_parameters_changed(self, who: str):
        raise ValueError(f"{who} changed which parameters require gradients during training, and DeepSpeed built its "
                         "engine's optimizer and gradient partitions from those that required them at set-up. Set "
                         "requires_grad before training, or use strategy='ddp'.")

    def link_checkpoint(self, src, dst):
        """ModelCheckpoint's last.ckpt: a directory of hard links to `src`'s files (a copy where links fail)."""
        if self.is_global_zero:
            link_tree(src, dst) if os.path.isdir(src) else atomic_link(src, dst)
        self.barrier("link_checkpoint")

    def full_state_dict(self, model=None):
        """The module's whole state dict on every rank (stage 3 gathers the partitions: call it on every rank).
        `model`: the engine, the module, or (the Trainer's) its wrapper; another model's own state dict otherwise."""
        if model is not None and model is not self.engine and self.unwrap_model(model) is not self.module:
            return super().full_state_dict(model)
        module = self.engine.module if self.engine is not None else self.module
        prefix = _WRAPPER_PREFIX if self.engine is not None and self._wrapped else ""
        with self._gathered(modifier_rank=None):
            return {_strip(k, prefix): v.detach().clone() for k, v in module.state_dict().items()}

    def check_full_state_dict(self, obj, where):
        if self.zero_stage() == 3:
            _check_no_zero3_placeholders(obj, where)

    def _partitioned(self):
        module = self.engine.module if self.engine is not None else self.module
        return any(hasattr(p, "ds_id") for p in module.parameters())

    @contextlib.contextmanager
    def _gathered(self, modifier_rank):
        """Stage 3: the whole parameters inside (modifier_rank's changes are partitioned again on exit)."""
        module = self.engine.module if self.engine is not None else self.module
        params = [p for p in module.parameters() if hasattr(p, "ds_id")]
        if not params:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
            yield

    def describe(self):
        # (before the engine, self.config may be a config of the user's: DeepSpeedStrategy's, Lightning's)
        stage = self.config["zero_optimization"]["stage"] if self.engine is not None else self.zero_stage()
        extras = [f"ZeRO stage {stage}"]
        for key, what in (("offload_optimizer", "optimizer offload"), ("offload_param", "parameter offload")):
            if self.config and _offloads(self.config, key):
                disk = self.config["zero_optimization"][key]["device"] == "nvme"
                extras.append(f"{what} to disk ({self.config['zero_optimization'][key]['nvme_path']})" if disk
                              else what)
        backend = dist.get_backend() if dist.is_initialized() else "?"
        return (f"strategy={self.name} ({', '.join(extras)}), world_size={self.world_size}, backend={backend}, "
                f"device={self.root_device}")


# Lightning's DeepSpeedStrategy derives from its DDPStrategy: isinstance(strategy, DDPStrategy) holds for DeepSpeed
# (Trainer(strategy="deepspeed") and DeepSpeedStrategy(...)) as under Lightning. A registration only: DeepSpeed runs
# none of DDP's code, and is no DDP (DDP.__subclasshook__).
DDPStrategy.register(DeepSpeed)


def _cast_floats(data, dtype):
    return apply_to_leaves(data, lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)


def _say_once(key, is_global_zero, message):
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        if is_global_zero:
            print(f"[tasktrain] {message}", flush=True)



def _strict_loading(module):
    """Lightning's module.strict_loading (a TaskModule's; True for any other module): whether the engine's weights
    must match the checkpoint's keys exactly."""
    return getattr(module, "strict_loading", True)
