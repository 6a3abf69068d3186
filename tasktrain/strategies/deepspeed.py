"""DeepSpeed: ZeRO stages 0-3, optimizer and parameter offload, through DeepSpeed's own engine.

DeepSpeed does the work (initialize, backward, step, clipping, the sharded checkpoint); this strategy
translates between it and the loop. The processes and the process group are the DDP strategy's (self-launch,
torchrun, SLURM, `tasktrain launch`), on CPU through DeepSpeed's CPU accelerator over gloo.

The config is the user's DeepSpeed config as given (a dict or a JSON file), with its "auto" or missing values
filled from the plan the loop hands to setup_module_and_optimizers: micro batch size from the training loader,
gradient accumulation from `accumulate_grad_batches`, clipping from the clipping the loop will ask for
(`gradient_clip_val`, a GradientClipping callback), fp16/bf16 from the precision, train_batch_size = micro x
accumulation x world. A value that disagrees with the run is an error, never a silent winner.
`gradient_clipping` is always written (0 = off): DeepSpeed's own default is 1.0.

How the contract (tasktrain/strategies/base.py) maps onto the engine, per micro-batch:

    with strategy.no_backward_sync(not ends_window):  # engine.set_gradient_accumulation_boundary(ends_window)
        loss = strategy.training_step(batch, i)    # engine(batch, i): stage 3 gathers parameters there
        strategy.backward(loss / window)           # engine.backward(loss, scale_wrt_gas=False): the loop divided
                                                   # already (plan.loss_divided_by_window); inside a window,
                                                   # engine.step() counts the micro-step
    if ends_window:
        strategy.clip_gradients(...)               # ClipsInsideStep: checks the request (or sets an unset clipping)
        strategy.optimizer_step(optimizer)         # engine.step(): clip, step, zero the gradients
        strategy.zero_grad(optimizer)              # nothing: the engine zeroed them

Without the Trainer or the Accelerator, the same calls, in this order:

    strategy = DeepSpeed(stage=2, gradient_clipping=1.0)
    strategy.configure("cpu", devices=N, num_nodes=1, precision="bf16-mixed")
    strategy.setup_environment()                              # processes, process group, checks the config
    engine, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer], Plan(
        calls_steps=False, micro_batch_size=loader.batch_size, accumulate_grad_batches=4,
        loss_divided_by_window=False))                        # False: the engine divides by the accumulation
    for i, batch in enumerate(loader):
        batch = strategy.batch_to_device(batch)               # bf16/fp16 inputs where the weights are
        with strategy.no_backward_sync(not boundary):         # required for windows cut short
            loss = loss_fn(engine(batch))
            strategy.backward(loss)
        if boundary:
            strategy.optimizer_step(optimizer)
    strategy.save_checkpoint_into(dir, state, "state.pt") / strategy.load_checkpoint_from(dir, "state.pt")
    strategy.full_state_dict()                                # consolidated weights (every rank calls it)
    strategy.teardown()

The optimizer handed back is the user's own: DeepSpeed steps it (or, with optimizer offload, DeepSpeedCPUAdam
over the very same param-group dicts), so a scheduler built on it keeps working.
"""
import contextlib
import copy
import gc
import io
import json
import logging
import os
import shutil
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from tasktrain.checkpoint_io import (CheckpointError, atomic_link, atomic_save, format_header, link_tree,
                                     load_checkpoint_file, load_plain_state_dict, load_resumable_file, plain_name,
                                     replace_dir)
from tasktrain.compiled import compile_forward_as, unwrap_compiled
from tasktrain.strategies.base import ClipsInsideStep, Sharded, _StepWrapper, step_arguments
from tasktrain.strategies.ddp import _PROCESS, DDP
from tasktrain.strategies.precision import Precision, warn_fp16_on_cpu
from tasktrain.tree import apply_to_leaves


def import_deepspeed():
    """`import deepspeed`, without the mlflow that DeepSpeed's autotuner imports with the package when mlflow is
    installed: ~2 s of CPU in every process that imports DeepSpeed (mlflow pulls pandas, fastapi, ...), for the
    autotuner alone (`deepspeed --autotuning`, which tasktrain never runs; it reads an absent mlflow as "do not
    log"). mlflow is hidden only while deepspeed loads, and only when nothing imported it before: an `import
    mlflow` afterwards (MLFlowLogger, the user) gets the real package. Every first import of deepspeed in
    tasktrain goes through here."""
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        import deepspeed

        return deepspeed
    sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, which the autotuner catches
    try:
        import deepspeed
    finally:
        if sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]
    return deepspeed

DEFAULT_STAGE = 2
# Offload to disk: DeepSpeed's own defaults except where they fail or waste on a small model. buffer_size "auto" is
# the largest parameter partition of the model (DeepSpeed's 1e8 elements x 5 buffers is 2 GB of fp32 buffers);
# max_in_cpu 0 sends every partition big enough for aio (~1 MiB) to disk instead of keeping 1e9 elements in memory.
NVME_DEFAULTS = {
    "offload_param": {"buffer_count": 5, "buffer_size": "auto", "max_in_cpu": 0},
    "offload_optimizer": {"buffer_count": 4},
}
# DeepSpeed's aio defaults (deepspeed/runtime/swap_tensor/constants.py), written out so that the config shows them.
AIO_DEFAULTS = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                "overlap_events": True, "use_gds": False}
STATE_FILE = "tasktrain_state.pt"  # our part of a checkpoint directory: loop state, callbacks, RNG, ...
ENGINE_TAG = "zero"  # engine.save_checkpoint(tag=...): one fixed tag per checkpoint directory
SIXTEEN_BIT_FILE = "model_16bit.pt"  # save_16bit_model=True: consolidated 16-bit weights for inference
_WRAPPER_PREFIX = "module."  # parameter names under our _EngineForward wrapper
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

    def convert_input(self, batch):
        return batch if self.input_dtype is None else _cast_floats(batch, self.input_dtype)

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


class DeepSpeed(ClipsInsideStep, Sharded, DDP):
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
        if not isinstance(self.precision, DeepSpeedPrecision):  # a plugin given to the constructor: the engine's
            self.precision = self.precision_plugin(self.precision.name)  # policy of the same name

    def precision_plugin(self, name):
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
        scheduled = {factor for _, factor in plan.accumulation_schedule}
        if len(scheduled) > 1:
            raise ValueError("DeepSpeed writes the accumulation into its config (gradient_accumulation_steps) once, at "
                             "set-up, and this run changes it by epoch (GradientAccumulationScheduler: "
                             f"{dict(plan.accumulation_schedule)}). Use one accumulate_grad_batches for the run, or "
                             "strategy='ddp'.")
        # prepare(torch.compile(model), ...): the engine must hold the module itself (ZeRO-3's forward hooks mark
        # the module's own parameters, and fail on the wrapper), so the module goes in with its forward compiled in
        # place, with the wrapper's settings; the module stays compiled, as the script asked.
        module, compiled = unwrap_compiled(module)
        compile_forward_as(module, compiled)
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
        micro = self.micro_batch_size or plan.micro_batch_size
        if micro is None:
            warnings.warn("DeepSpeed: the micro-batch size is not known (the training loader has no batch_size: a "
                          "custom batch sampler?), so the config's train_micro_batch_size_per_gpu is 1. DeepSpeed "
                          "uses it only for its throughput figures; pass DeepSpeed(micro_batch_size=N) to set it.")
            micro = 1
        # Manual optimisation steps where the user says: each backward closes its own window.
        # A schedule with one factor for every epoch ({0: 4}) is that window for the whole run.
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
        with _honour_init_dtype(_nvme_folders(config).get("offload_param") is not None):
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
        env = self.env
        if env is not None and env.launcher is None and _PROCESS["owns_group"] and dist.is_initialized():
            # A world of one is ended now (DDP does the same); DeepSpeed's destroy also forgets its copies of the
            # group, so that a later run in this process can start a new one.
            import deepspeed.comm

            if deepspeed.comm.is_initialized():
                deepspeed.comm.destroy_process_group()
                _PROCESS["owns_group"] = False
        if self._set_local_rank:
            os.environ.pop("LOCAL_RANK", None)
            self._set_local_rank = False
        super().teardown()

    # -- the step ------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        step = self.module.training_step
        return self.engine(*step_arguments(step, batch, batch_idx), _tasktrain_step=step)

    def eval_step(self, step_fn, *args):
        if self.config["zero_optimization"]["stage"] != 3:
            return self.engine(*args, _tasktrain_step=step_fn)
        # ZeRO-3 gathers the partitioned parameters in the forward: gathered under inference_mode they become
        # inference tensors that a later training forward cannot save for backward (seen with a parameter over
        # the persistence threshold, validated inside fit). Evaluation steps run under no_grad instead.
        with torch.inference_mode(False), torch.no_grad():
            return self.engine(*args, _tasktrain_step=step_fn)

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

    def backward(self, loss, *args, **kwargs):
        self.precision.backward(loss, scale_wrt_gas=self._scale_wrt_gas, **kwargs)
        if not self.engine.is_gradient_accumulation_boundary():
            self.engine.step()  # DeepSpeed counts every micro-batch; inside a window its step changes nothing

    def optimizer_step(self, optimizer=None, closure=None) -> bool:
        if closure is not None:
            raise ValueError("DeepSpeed steps without a closure: optimizers that need one (LBFGS) are not supported "
                             "under DeepSpeed; use DDP for them.")
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

    def clip_gradients(self, optimizer=None, max_norm=None, max_value=None, norm_type=2.0):
        """DeepSpeed clips inside engine.step() with the config's gradient_clipping. Where the run stated a value
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

    def load_optimizer_state(self, optimizer, state):
        if isinstance(state, dict) and "deepspeed" in state and self._loaded_engine_state:
            return  # engine.load_checkpoint restored it
        raise ValueError(
            "This checkpoint holds a plain optimizer state, not DeepSpeed's sharded one: a DeepSpeed fit resumes "
            "from a checkpoint directory written under DeepSpeed. Convert the file into one (its optimizer state "
            "included): `tasktrain convert FILE DIR --to deepspeed`, then resume from DIR on any ZeRO stage and "
            "number of processes. (To start from its weights only, load them into the module before fit: "
            "module.load_state_dict(torch.load(path, weights_only=True)['state_dict']).)"
        )

    def save_checkpoint(self, checkpoint: dict, path: str):
        """A directory: the engine's shards (one file per rank) plus our state file; written under a temporary
        name and renamed into place, so a crash never leaves a half directory under the real name.

        A weights-only checkpoint is a single file with the consolidated fp32 weights instead."""
        path = os.path.abspath(os.fspath(path))
        if checkpoint.get("weights_only"):
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
            self.save_16bit_weights(os.path.join(directory, SIXTEEN_BIT_FILE), hyper_parameters=state.get(
                "hyper_parameters", {}))
        if self.is_global_zero:
            state = dict(state, deepspeed={"tag": ENGINE_TAG, "stage": self.config["zero_optimization"]["stage"],
                                           "world_size": self.world_size,
                                           "key_prefix": _WRAPPER_PREFIX if self._wrapped else ""})
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
        self.check_async_save(checkpoint.get("weights_only", False))
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
            staged["deepspeed"] = {"tag": ENGINE_TAG, "stage": self.config["zero_optimization"]["stage"],
                                   "world_size": world_size, "key_prefix": _WRAPPER_PREFIX if self._wrapped else ""}

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

    def save_16bit_weights(self, path, hyper_parameters=None):
        """Write the consolidated 16-bit weights (our checkpoint format, weights only) to `path`. Every rank calls
        it (stage 3 gathers the partitions)."""
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
            atomic_save({**format_header(), "state_dict": weights, "hyper_parameters": hyper_parameters or {},
                         "weights_only": True}, path)
            os.remove(os.path.join(directory, raw))
        self.barrier("save_16bit")

    def load_checkpoint(self, path: str) -> dict:
        """A DeepSpeed checkpoint directory: the engine loads its shards (weights, optimizer) and our state file is
        returned. Without an optimizer (validate/test/predict) the weights are consolidated instead."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            return load_checkpoint_file(path)  # a plain checkpoint: weights yes, optimizer state no (see above)
        return self._load_directory(path, STATE_FILE)

    def _load_directory(self, path, state_name):
        state_file = os.path.join(path, state_name)
        if not os.path.isfile(state_file):
            raise CheckpointError(f"{path!r} is a directory without {state_name}: not a checkpoint written by the "
                                  "tasktrain DeepSpeed strategy (or an interrupted save).")
        ckpt = load_checkpoint_file(state_file)
        meta = ckpt.get("deepspeed", {})
        if self._client_optimizer is None or ckpt.get("weights_only"):
            ckpt["state_dict"] = convert_zero_checkpoint(path)["state_dict"]
            return ckpt
        stage = self.config["zero_optimization"]["stage"]
        saved_world = meta.get("world_size", ckpt.get("world_size"))
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
        loaded, _ = self.engine.load_checkpoint(path, tag=tag, load_module_strict=True,
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
        (deepspeed_universal.py)."""
        from tasktrain.strategies import deepspeed_universal as universal

        meta = ckpt.get("deepspeed", {})
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
        raise ValueError(f"{who} adds param groups to the optimizer during training, and DeepSpeed copies the groups "
                         "into its engine at set-up: the new ones would never be stepped. Use strategy='ddp', or "
                         "train every parameter from the start.")

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
        stage = self.config["zero_optimization"]["stage"] if self.config else self.zero_stage()
        extras = [f"ZeRO stage {stage}"]
        for key, what in (("offload_optimizer", "optimizer offload"), ("offload_param", "parameter offload")):
            if self.config and _offloads(self.config, key):
                disk = self.config["zero_optimization"][key]["device"] == "nvme"
                extras.append(f"{what} to disk ({self.config['zero_optimization'][key]['nvme_path']})" if disk
                              else what)
        backend = dist.get_backend() if dist.is_initialized() else "?"
        return (f"strategy={self.name} ({', '.join(extras)}), world_size={self.world_size}, backend={backend}, "
                f"device={self.root_device}")


# -- the config -----------------------------------------------------------------------------------------------
def build_config(user_config=None, *, stage=None, offload_optimizer=None, offload_parameters=None,
                 save_16bit_model=False, offload_device="cpu", nvme_path=None, aio=None, precision="32-true",
                 device_type="cpu", micro_batch_size=None, accumulate_grad_batches=None, gradient_clipping=None,
                 world_size=1):
    """The DeepSpeed config to run: `user_config` as given, its "auto" or missing values filled from the run.

    A value given on both sides that disagrees is a ValueError naming both and the fix. `precision=None` or
    `micro_batch_size=None` skip those parts (checks made before the run is known)."""
    config = copy.deepcopy(user_config) if user_config else {}
    if "optimizer" in config:
        raise ValueError("The DeepSpeed config has an \"optimizer\" section, but the optimizer is the one "
                         "configure_optimizers returns (handed to DeepSpeed as is). Remove the config's \"optimizer\" "
                         "section and build that optimizer in configure_optimizers.")
    zero = dict(config.get("zero_optimization") or {})
    given = zero.get("stage", "auto")
    if given == "auto":
        zero["stage"] = DEFAULT_STAGE if stage is None else stage
    elif stage is not None and int(given) != stage:
        raise ValueError(f"The DeepSpeed config says zero_optimization.stage={given}, but the strategy asks for "
                         f"stage {stage}. Make them agree: DeepSpeed(stage={given}, config=...), or remove the "
                         "stage from the config.")
    stage = int(zero["stage"])
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage={stage}: ZeRO stages are 0, 1, 2 and 3.")
    _offload_section(zero, "offload_optimizer", offload_optimizer, offload_device, device_type)
    _offload_section(zero, "offload_param", offload_parameters, offload_device, device_type)
    if _offloads({"zero_optimization": zero}, "offload_param") and stage != 3:
        raise ValueError(f"Parameter offload needs ZeRO stage 3 (this config runs stage {stage}, where DeepSpeed "
                         "would ignore it): use stage=3 (\"deepspeed_stage_3_offload\") or offload only the optimizer.")
    _nvme_sections(config, zero, stage, nvme_path, aio)
    if _offloads({"zero_optimization": zero}, "offload_optimizer") and stage == 0:
        raise ValueError("Optimizer offload needs a ZeRO stage of 1 or more (the optimizer state must be "
                         "partitioned): use stage=2 (\"deepspeed_stage_2_offload\").")
    if save_16bit_model and stage == 3:
        key = "stage3_gather_16bit_weights_on_model_save"
        if zero.get(key) is False:
            raise ValueError(f"save_16bit_model=True needs {key}=true at stage 3 (the config sets it false): "
                             "remove it from the config, or drop save_16bit_model.")
        zero[key] = True
    config["zero_optimization"] = zero
    if precision is not None:
        _precision_sections(config, precision, device_type)
    if micro_batch_size is not None:
        micro = _fill(config, "train_micro_batch_size_per_gpu", int(micro_batch_size),
                      "the training loader's batch_size",
                      "DataLoader(batch_size=...) or DeepSpeed(micro_batch_size=...)")
        accumulation = _fill(config, "gradient_accumulation_steps", int(accumulate_grad_batches or 1),
                             "accumulate_grad_batches", "Trainer(accumulate_grad_batches=...)")
        _fill(config, "train_batch_size", micro * accumulation * int(world_size),
              f"micro batch {micro} x accumulation {accumulation} x {world_size} processes",
              "the micro batch size, the accumulation or the number of processes")
    given = config.get("gradient_clipping", "auto")
    if given == "auto":
        # Always explicit: left out, DeepSpeed would clip to 1.0 without anyone asking.
        config["gradient_clipping"] = float(gradient_clipping or 0.0)
    elif gradient_clipping is not None and float(given) != float(gradient_clipping):
        raise ValueError(f"The DeepSpeed config says gradient_clipping={given}, but the run clips to "
                         f"{gradient_clipping} (gradient_clip_val / GradientClipping). Make them agree, or write "
                         "\"auto\" in the config to take the run's value.")
    config.setdefault("zero_allow_untested_optimizer", True)  # the client optimizer from configure_optimizers
    return config


def _fill(config, key, value, what, fix):
    given = config.get(key, "auto")
    if given == "auto":
        config[key] = value
        return value
    if int(given) != value:
        raise ValueError(f"The DeepSpeed config says {key}={given}, but {what} gives {value}. Make them agree: set "
                         f"{fix} to {given}, or write \"auto\" in the config to take the run's value.")
    return value


def _offload_section(zero, key, wanted, device, device_type):
    """offload_...=True adds the section for `device`, offload_...="cpu"/"nvme" for that device; a config's own
    offload section is used as given (False adds nothing: `tasktrain launch` passes False for "not asked")."""
    section = zero.get(key)
    configured = isinstance(section, dict) and section.get("device", "none") not in (None, "none")
    if not wanted or configured:
        if wanted and isinstance(wanted, str) and section.get("device") != wanted:
            raise ValueError(f"The DeepSpeed config's zero_optimization.{key} offloads to {section.get('device')!r} "
                             f"and the strategy asks for {wanted!r}: make them agree (or leave one out).")
        return
    section = dict(section or {})
    section["device"] = wanted if isinstance(wanted, str) else device
    section.setdefault("pin_memory", device_type == "cuda")  # pinned memory helps copies to a GPU only
    zero[key] = section


def _nvme_sections(config, zero, stage, nvme_path, aio):
    """Offload to disk ("nvme": any local folder, through DeepSpeed's async_io op): the folder, and buffer and aio
    settings that work for small models as for big ones, each overridable by the config's own values."""
    disk = [key for key in ("offload_optimizer", "offload_param")
            if isinstance(zero.get(key), dict) and zero[key].get("device") == "nvme"]
    if not disk:
        if aio:
            raise ValueError("DeepSpeed(aio=...) configures offload to disk, and nothing is offloaded to 'nvme': "
                             "drop aio, or offload to disk (offload_device='nvme', nvme_path=...).")
        return
    if stage != 3:
        # ZeRO 1-2 in DeepSpeed 0.19.8 have no swapper: an "nvme" optimizer offload would silently stay in CPU memory.
        raise ValueError(f"Offload to disk (nvme) needs ZeRO stage 3: DeepSpeed's stage {stage} keeps an 'nvme' "
                         "optimizer offload in CPU memory. Use stage=3 (the optimizer state and, optionally, the "
                         "parameters go to disk), or offload_device='cpu' at this stage.")
    for key in disk:
        section = zero[key]
        given = section.get("nvme_path")
        if nvme_path is not None and given not in (None, "auto") and os.path.abspath(os.fspath(given)) != \
                os.path.abspath(os.fspath(nvme_path)):
            raise ValueError(f"The DeepSpeed config's zero_optimization.{key}.nvme_path is {given!r} and the strategy "
                             f"has nvme_path={os.fspath(nvme_path)!r}: give the folder in one place.")
        path = nvme_path if given in (None, "auto") else given
        if path is None:
            raise ValueError(f"Offload to disk (zero_optimization.{key} on 'nvme') needs a folder for the swap files: "
                             "DeepSpeed(..., nvme_path='/local_nvme/swap'), or offload_optimizer_nvme_path / "
                             "offload_param_nvme_path in the launch config. A local file system (NVMe, SSD) is best.")
        section["nvme_path"] = os.path.abspath(os.path.expanduser(os.fspath(path)))
        for name, value in NVME_DEFAULTS[key].items():
            section.setdefault(name, value)
    if "offload_param" in disk:
        # DeepSpeed 0.19.8's prefetch of swapped parameters fails on a model of several swapped layers ("param N
        # already assigned swap buffer id M", at the second forward): off unless the config sets it.
        zero.setdefault("stage3_prefetch_bucket_size", 0)
    merged = dict(AIO_DEFAULTS)
    for name, value in (config.get("aio") or {}).items():
        merged[name] = value
    for name, value in (aio or {}).items():
        if name not in AIO_DEFAULTS:
            raise ValueError(f"DeepSpeed(aio={{{name!r}: ...}}): not an aio setting; DeepSpeed's are "
                             f"{', '.join(AIO_DEFAULTS)}.")
        if name in (config.get("aio") or {}) and config["aio"][name] != value:
            raise ValueError(f"DeepSpeed(aio={{{name!r}: {value!r}}}) and the config's aio.{name}="
                             f"{config['aio'][name]!r} disagree: give it in one place.")
        merged[name] = value
    config["aio"] = merged


def _nvme_folders(config):
    """The swap folders of a resolved config's offloads to disk, by section."""
    zero = config.get("zero_optimization", {})
    return {key: zero[key]["nvme_path"] for key in ("offload_optimizer", "offload_param")
            if isinstance(zero.get(key), dict) and zero[key].get("device") == "nvme" and zero[key].get("nvme_path")}


def _nvme_buffer_auto(config):
    section = config.get("zero_optimization", {}).get("offload_param")
    return isinstance(section, dict) and section.get("device") == "nvme" and section.get("buffer_size") == "auto"


def _fill_nvme_buffer_size(config, module, world_size):
    """buffer_size "auto": the largest parameter partition of this model (each swap buffer holds one), rounded up to
    whole kilo-elements, the alignment DeepSpeed's aio reads use."""
    if not _nvme_buffer_auto(config):
        return
    largest = max((-(-getattr(p, "ds_numel", p.numel()) // world_size) for p in module.parameters()), default=1)
    config["zero_optimization"]["offload_param"]["buffer_size"] = max(1024, -(-largest // 1024) * 1024)


LIBAIO_FIX = ("Offload to disk uses DeepSpeed's async_io op, which builds against libaio: install its headers "
              "(Debian/Ubuntu package libaio-dev: `apt-get install -y libaio-dev` as root; Fedora/RHEL: libaio-devel), "
              "then run again (the op compiles once into $TORCH_EXTENSIONS_DIR, several minutes).")


def _async_io_available():
    """Whether DeepSpeed's async_io op can be built here (libaio's headers and library found)."""
    import_deepspeed()
    import deepspeed.ops.op_builder as builders

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builders.AsyncIOBuilder().is_compatible(verbose=False)


def _probe_async_io(folder, aio):
    """Write and read back 1 MiB in `folder` through DeepSpeed's async_io op, with the run's aio settings: the I/O the
    swap files get (O_DIRECT, which some file systems refuse). Returns None, or what went wrong."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    op = AsyncIOBuilder().load(verbose=False)
    handle = op.aio_handle(aio["block_size"], aio["queue_depth"], aio["single_submit"], aio["overlap_events"],
                           aio["intra_op_parallelism"])
    count = max(1 << 20, int(aio["block_size"]))
    example = torch.empty(0, dtype=torch.uint8)
    written, read = handle.new_cpu_locked_tensor(count, example), handle.new_cpu_locked_tensor(count, example)
    path = os.path.join(folder, f".tasktrain-aio-probe-{os.getpid()}")
    try:
        written.copy_(torch.arange(count, dtype=torch.int64).remainder(251).to(torch.uint8))
        read.zero_()
        if handle.async_pwrite(written, path, 0) != 0 or handle.wait() != 1:
            return "the write failed"
        if handle.async_pread(read, path, 0) != 0 or handle.wait() != 1:
            return "the read failed"
        if not torch.equal(read, written):
            return "what was read back differs from what was written"
        return None
    except Exception as err:  # the op raises on some failures and returns error counts on others
        return f"{type(err).__name__}: {err}"
    finally:
        handle.free_cpu_locked_tensor(written)
        handle.free_cpu_locked_tensor(read)
        with contextlib.suppress(OSError):
            os.remove(path)


def check_nvme_offload(config):
    """Before training, on every rank: each folder of an offload to disk exists and is writable, libaio is there for
    DeepSpeed's async_io op, and a small aio write and read in the folder works. A ValueError/RuntimeError names the
    problem and the fix."""
    folders = _nvme_folders(config)
    for key, folder in folders.items():
        if not os.path.isdir(folder):
            raise ValueError(f"Offload to disk ({key}): the folder nvme_path={folder!r} does not exist. Create it "
                             f"(`mkdir -p {folder}`) on a local disk, or give another one.")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"Offload to disk ({key}): the folder nvme_path={folder!r} is not writable by this "
                             "process: give a folder it can write, or fix its permissions.")
    if not folders:
        return
    if not _async_io_available():
        raise RuntimeError(LIBAIO_FIX)
    for folder in sorted(set(folders.values())):
        problem = _probe_async_io(folder, config["aio"])
        if problem is not None:
            raise RuntimeError(f"Offload to disk: async I/O (DeepSpeed's async_io op, O_DIRECT) does not work in "
                               f"nvme_path={folder!r}: {problem}. Its file system may not take direct I/O (tmpfs, "
                               "some network or overlay file systems): give a folder on a local disk.")


def _offloads(config, key):
    section = config.get("zero_optimization", {}).get(key)
    return isinstance(section, dict) and section.get("device", "none") not in (None, "none")


def _enabled(section):
    return section.get("enabled") if isinstance(section, dict) else None


def _input_dtype_of(config):
    if _enabled(config.get("bf16", config.get("bfloat16"))) is True:
        return torch.bfloat16
    if _enabled(config.get("fp16")) is True:
        return torch.float16
    return None


def _param_dtype_of(config):
    """The dtype DeepSpeed keeps the module's (working) parameters in under this config."""
    return _input_dtype_of(config) or torch.float32


def _check_param_dtypes(params, expected, precision, where):
    """Parameters (or their ZeRO-3 partitions) must be in the dtype the precision asks for: DeepSpeed has dropped
    the dtype it was given before (0.19.8 on CPUs without float16), and a mismatch only shows later as a matmul
    error deep in its linear layer."""
    seen = set()
    for param in params:
        tensor = getattr(param, "ds_tensor", None)
        dtype = (tensor if tensor is not None else param).dtype
        if tensor is not None and getattr(tensor, "final_location", None) == "nvme":
            # Offloaded to disk: while swapped out, the partition is DeepSpeed's fp16 placeholder; its real dtype is
            # the swapper's (the dtype of the swap files).
            dtype = getattr(getattr(param, "nvme_swapper", None), "dtype", expected)
        if dtype.is_floating_point and dtype != expected:
            seen.add(dtype)
    if seen:
        import deepspeed

        raise RuntimeError(
            f"DeepSpeed {deepspeed.__version__} made the parameters {where} "
            f"{', '.join(sorted(str(d) for d in seen))}, but precision={precision!r} keeps them in {expected}. "
            "This DeepSpeed release does not honour the dtype it is given on this machine: install a DeepSpeed "
            "version in the range setup.py states, or report it with this message.")


def _precision_sections(config, precision, device_type):
    if precision in ("bf16-true", "16-true"):
        raise ValueError(f"precision={precision!r} is not available under DeepSpeed (its half modes keep fp32 master "
                         f"weights): use precision={precision.replace('true', 'mixed')!r}.")
    if precision == "64-true":
        raise ValueError("precision='64-true' is not available under DeepSpeed (it trains in fp32, bf16 or fp16): "
                         "use precision='32-true' or another strategy.")
    if precision == "16-mixed" and device_type == "cpu":
        raise ValueError("precision='16-mixed' (fp16) is not supported by the DeepSpeed strategy on CPU: use "
                         "precision='bf16-mixed', the fast mixed precision on CPU (or '32-true').")
    bf16_key = "bfloat16" if "bfloat16" in config and "bf16" not in config else "bf16"
    fp16, bf16 = _enabled(config.get("fp16")), _enabled(config.get(bf16_key))
    autocast = config.get("torch_autocast") if _enabled(config.get("torch_autocast")) is True else None
    if fp16 is True and bf16 is True:
        raise ValueError("The DeepSpeed config enables both fp16 and bf16: enable one (or write \"auto\").")
    says = "16-mixed" if fp16 is True else "bf16-mixed" if bf16 is True else None
    if says is None and autocast is not None:
        dtype = str(autocast.get("dtype", "bfloat16"))
        says = "bf16-mixed" if "bf" in dtype else "16-mixed"
    if says is not None and says != precision:
        section = "torch_autocast" if autocast is not None else "fp16" if says == "16-mixed" else "bf16"
        raise ValueError(f"The DeepSpeed config enables {section} (precision {says!r}), but the run's precision is "
                         f"{precision!r}. Make them agree: precision={says!r}, or write \"enabled\": \"auto\" in "
                         "the config to take the run's.")
    if autocast is not None:
        return  # torch autocast in the engine's forward: the weights stay fp32, the config is complete
    for key, on in ((bf16_key, precision == "bf16-mixed"), ("fp16", precision == "16-mixed")):
        if on or key in config:
            config[key] = dict(config.get(key) or {}, enabled=on)


def _agree(name, explicit, from_run):
    """A value given to DeepSpeed(...) and by the run (the Trainer, the Accelerator, the launch config) must be the
    same."""
    if explicit is None or from_run is None:
        return from_run if explicit is None else explicit
    if float(explicit) != float(from_run):
        raise ValueError(f"DeepSpeed({name}={explicit}) disagrees with the run's {from_run}. Give it in one place.")
    return explicit


def _clip_norm_of(requests):
    """The max norm of the run's clipping requests (a GradientClip tuple), for the config; None when it clips not."""
    if not requests:
        return None
    for request in requests:
        who = f" ({request.requested_by})" if request.requested_by else ""
        if request.algorithm != "norm":
            raise ValueError(f"DeepSpeed clips by norm only{who}: use gradient_clip_val with gradient_clip_algorithm="
                             "'norm' (GradientClipping(max_norm=...)), not clipping by value.")
        if float(request.norm_type) != 2.0:
            raise ValueError(f"DeepSpeed clips the 2-norm; norm_type={request.norm_type}{who} asks for another. Use "
                             "norm_type=2.")
    if len(requests) > 1:
        who = ", ".join(r.requested_by or f"max_norm={r.value}" for r in requests)
        raise ValueError(f"{len(requests)} gradient clippings ({who}): DeepSpeed clips once, to one max norm. Keep "
                         "one.")
    return requests[0].value


def _read_config(config):
    if config is None:
        return None
    if isinstance(config, dict):
        return copy.deepcopy(config)
    path = os.fspath(config)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"DeepSpeed(config={path!r}): no such file. Pass a dict or the path of a DeepSpeed "
                                "JSON config.")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"DeepSpeed(config={path!r}) is not valid JSON: {err}.") from None


def _positive_or_none(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"DeepSpeed({name}={value!r}): use a positive integer.")
    return int(value)


def _cast_floats(data, dtype):
    return apply_to_leaves(data, lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)


def _say_once(key, is_global_zero, message):
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        if is_global_zero:
            print(f"[tasktrain] {message}", flush=True)


def _quiet_untested_optimizer(record):
    # ZeRO warns about every optimizer it did not pick itself; here it always runs the user's, on purpose.
    return "untested optimizer" not in str(record.msg)


def _restore_functional_linear():
    """A ZeRO-3 engine replaces torch.nn.functional.linear, for every later model of the process, by its own
    (zero_optimization.memory_efficient_linear, on by default; DeepSpeed leaves it so "unless manually reset").
    A later DDP or single-device run in the same process would then compute through DeepSpeed's function:
    put torch's back when the engine is gone."""
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as patcher

    original = getattr(patcher, "linear_bk", None)
    if original is not None and torch.nn.functional.linear is zero3_linear_wrap:
        torch.nn.functional.linear = original


def _strip(key, prefix):
    """The plain name of an engine's key: without our wrapper's prefix, nor the "_orig_mod." of compiled submodules."""
    return plain_name(key[len(prefix):] if prefix and key.startswith(prefix) else key)


def convert_zero_checkpoint(checkpoint_dir, output_path=None, optimizer=False):
    """Consolidate a DeepSpeed checkpoint directory into one checkpoint dict in our format.

    By default the fp32 weights only ({"state_dict": ..., "hyper_parameters": ..., "weights_only": True, ...}):
    `TaskModule.load_from_checkpoint(output_path)` and `torch.load(output_path, weights_only=True)` read it.
    With `optimizer=True`, a whole resumable checkpoint instead: the optimizer's state (each parameter's moments
    and step count, the groups' hyper-parameters, as torch's optimizer.state_dict() lays them out, through
    DeepSpeed's universal checkpoint), the loop's state, schedulers, callbacks and random states, so that a fit
    on another strategy (one process or DDP) continues the run. With `output_path`, it is also written there.
    Runs in one process; needs as much memory as the whole model (and, with the optimizer, its state) in fp32.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"{checkpoint_dir!r} is not a directory: convert takes a DeepSpeed checkpoint directory "
                              "(what ModelCheckpoint writes under the DeepSpeed strategy).")
    state_file = os.path.join(checkpoint_dir, STATE_FILE)
    ckpt = load_checkpoint_file(state_file) if os.path.isfile(state_file) else {}
    meta = ckpt.get("deepspeed", {})
    tag = meta.get("tag")
    if tag is None and not os.path.isfile(os.path.join(checkpoint_dir, "latest")):
        raise CheckpointError(f"{checkpoint_dir!r} has neither {STATE_FILE} nor DeepSpeed's 'latest' file: not a "
                              "DeepSpeed checkpoint directory.")
    if meta.get("stage") == 0:
        raise CheckpointError(f"{checkpoint_dir!r} was written at ZeRO stage 0, which has no shards to consolidate: "
                              "its engine file holds the whole module already.")
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else DeepSpeed warns that it fell back to the CPU
    prefix = meta.get("key_prefix", "")
    if optimizer:
        return _convert_with_optimizer(checkpoint_dir, ckpt, tag, prefix, output_path)
    if meta.get("universal"):  # written by `tasktrain convert --to deepspeed`: no shards, the universal layout
        from tasktrain.strategies.deepspeed_universal import read_universal

        weights = read_universal(checkpoint_dir, tag)[0]
    else:
        import_deepspeed()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        # It prints a progress report per shard (and its errors are raised, not printed).
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            weights = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=tag)
    state_dict = {_strip(k, prefix): v.contiguous() for k, v in weights.items()}
    out = {
        **format_header(),
        "state_dict": state_dict,
        "hyper_parameters": ckpt.get("hyper_parameters", {}),
        "weights_only": True,
        "train_state": ckpt.get("train_state", {}),
        "world_size": ckpt.get("world_size", meta.get("world_size")),
    }
    if output_path is not None:
        atomic_save(out, os.fspath(output_path))
    return out


def _convert_with_optimizer(checkpoint_dir, ckpt, tag, prefix, output_path):
    from tasktrain.strategies import deepspeed_universal as universal

    names = ckpt.get("optimizer_param_names")
    if ckpt.get("weights_only") or not ckpt.get("train_state") or not names:
        raise CheckpointError(
            f"{checkpoint_dir!r} does not say which parameter each part of its optimizer state belongs to (it was "
            "written with weights only, by an older tasktrain, or not by the Trainer): only its weights can be "
            "converted. Leave out --to ckpt.")
    if len(names) != 1:
        raise CheckpointError(f"{checkpoint_dir!r} has {len(names)} optimizers; a DeepSpeed checkpoint has one.")
    utag = tag if ckpt.get("deepspeed", {}).get("universal") else universal.to_universal(checkpoint_dir, tag)
    weights, param_state, universal_groups = universal.read_universal(checkpoint_dir, utag)
    saved = (ckpt.get("optimizer_states") or [{}])[0]
    hyper = saved.get("param_groups") or universal_groups
    state, groups, index = {}, [], 0
    for group_names, group in zip(names[0], hyper):
        ids = []
        for name in group_names:
            entry = param_state.get(prefix + name)
            if entry is not None:
                shape = weights[prefix + name].shape
                state[index] = {key: (torch.tensor(float(value)) if key == "step" else value.reshape(shape))
                                for key, value in entry.items()}
            ids.append(index)
            index += 1
        groups.append(dict(group, params=ids))
    out = {key: value for key, value in ckpt.items() if key not in ("deepspeed", "optimizer_states")}
    out.update({
        **format_header(),
        "state_dict": {_strip(k, prefix): v.contiguous() for k, v in weights.items()},
        "weights_only": False,
        "optimizer_states": [{"state": state, "param_groups": groups}],
        "optimizer_param_names": names,
    })
    if output_path is not None:
        atomic_save(out, os.fspath(output_path))
    return out


def convert_to_deepspeed(checkpoint_path, output_dir):
    """Write a plain checkpoint (a Trainer checkpoint of one process or DDP, one file) as a DeepSpeed
    checkpoint directory that any ZeRO stage resumes on any number of processes, optimizer state included: the
    weights and each parameter's Adam moments and step count in DeepSpeed's universal layout, and the rest of the
    checkpoint (loop state, schedulers, callbacks, random states) in our state file. Returns `output_dir`; a
    directory already there is replaced only once the new one is complete."""
    from tasktrain.strategies import deepspeed_universal as universal

    ckpt = load_resumable_file(checkpoint_path, "a DeepSpeed fit")
    names = ckpt["optimizer_param_names"]
    if len(ckpt["optimizer_states"]) != 1:
        raise CheckpointError(f"{checkpoint_path!r} has {len(ckpt['optimizer_states'])} optimizers; DeepSpeed drives "
                              "one per engine.")
    optimizer, group_names = ckpt["optimizer_states"][0], names[0]
    if len(optimizer["param_groups"]) != len(group_names):
        raise CheckpointError(f"{checkpoint_path!r}: its optimizer state and its parameter names disagree.")
    prefix = _WRAPPER_PREFIX  # the Trainer's engine names; a load by the Accelerator renames (rekeyed)
    param_state = {}
    for group, names_of_group in zip(optimizer["param_groups"], group_names):
        for index, name in zip(group["params"], names_of_group):
            if name is None:
                raise CheckpointError(f"{checkpoint_path!r}: a parameter of its optimizer is not one of the module's.")
            if index in optimizer["state"]:
                param_state[prefix + name] = optimizer["state"][index]
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer["param_groups"]]
    output_dir = os.path.abspath(os.fspath(output_dir))
    tmp = f"{output_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tag = universal.universal_tag(ENGINE_TAG)
        universal.write_universal(tmp, tag, {prefix + k: v for k, v in ckpt["state_dict"].items()}, param_state,
                                  hyper, global_steps=ckpt.get("train_state", {}).get("global_step", 0))
        state = {key: value for key, value in ckpt.items() if key != "optimizer_states"}
        state.update(state_dict={}, optimizer_states=[{"deepspeed": "in the universal checkpoint of this directory",
                                                       "param_groups": hyper}],
                     deepspeed={"tag": tag, "universal": True, "stage": None, "world_size": ckpt.get("world_size"),
                                "key_prefix": prefix})
        atomic_save(state, os.path.join(tmp, STATE_FILE))
        replace_dir(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


@contextlib.contextmanager
def _honour_init_dtype(enabled):
    """Parameter offload to disk: DeepSpeed 0.19.8's engine partitions the module through zero.Init(dtype=<the
    module's dtype>), and Init._set_dtype drops that explicit dtype on accelerators without float16 support
    (`dtype or float16 if fp16 else bfloat16`, deepspeedai/DeepSpeed#8428): the parameter swapper, whose dtype is
    Init's, would then keep an fp32 run's partitions in bf16 swap files. For initialize only, an explicit dtype is
    used as given (the upstream fix); without one, DeepSpeed's own choice."""
    if not enabled:
        yield
        return
    from deepspeed.runtime.zero.partition_parameters import Init

    original = Init._set_dtype

    def set_dtype(self, ds_config, dtype):
        if dtype is None:
            return original(self, ds_config, dtype)
        self.dtype = dtype

    Init._set_dtype = set_dtype
    try:
        yield
    finally:
        Init._set_dtype = original


def _swaps_optimizer(optimizer):
    return bool(getattr(optimizer, "swap_optimizer", False))


def _sub_group_state_index(optimizer):
    """ZeRO-3's optimizer.state_dict() numbers its fp32 sub-group partitions by param group, then sub-group
    (stage3._set_fp32_optimizer_param_groups): sub-group -> its index in the base optimizer's state dict."""
    order = []
    for group_id in range(len(optimizer.optimizer.param_groups)):
        order += [i for i in range(len(optimizer.fp16_groups)) if optimizer.sub_group_to_group_id[i] == group_id]
    return {sub_group: n for n, sub_group in enumerate(order)}


@contextlib.contextmanager
def _complete_swapped_state(optimizer):
    """engine.save_checkpoint under offload to disk: DeepSpeed 0.19.8 writes the sub-groups it swaps out as empty
    tensors (master weights and moments alike; their data is only in the swap folder). While this is open, the
    ZeRO optimizer's state_dict() swaps each of them in and returns copies, so the ZeRO file is a complete
    checkpoint: read by our resume, `tasktrain convert`, and DeepSpeed's own tools, with no swap folder."""
    if not _swaps_optimizer(optimizer):
        yield
        return
    original = optimizer.state_dict

    def complete_state_dict():
        state_dict = original()
        base_state = state_dict["optimizer_state_dict"]["state"]
        flats = list(state_dict["fp32_flat_groups"])
        index = _sub_group_state_index(optimizer)
        for sub_group, flat in enumerate(optimizer.fp32_partitioned_groups_flat):
            if not optimizer._swappable_optimizer_subgroup(sub_group):
                continue
            optimizer.optimizer_swapper.swap_in_optimizer_state(parameter=flat)
            flats[sub_group] = flat.detach().clone()
            if index[sub_group] in base_state:  # a new dict: the old one is the optimizer's own
                base_state[index[sub_group]] = {k: v.detach().clone() if torch.is_tensor(v) else v
                                                for k, v in optimizer.optimizer.state[flat].items()}
            optimizer._release_swap_buffers(sub_group)
        state_dict["fp32_flat_groups"] = flats
        return state_dict

    optimizer.state_dict = complete_state_dict
    try:
        yield
    finally:
        del optimizer.state_dict


def _check_no_zero3_placeholders(obj, where):
    if not isinstance(obj, dict):
        return
    empty = [k for k, v in obj.items() if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == 0]
    if empty:
        raise ValueError(
            f"Refusing to save {where}: the state dict holds ZeRO-3 placeholders (shape (0,) tensors, e.g. "
            f"{empty[0]!r}) instead of weights, because under DeepSpeed stage 3 each process holds only a slice of "
            "every parameter. Build it with accelerator.get_state_dict(model), called on every process, which "
            "gathers the slices."
        )


def _staging_checkpoint_engine(inner, previous):
    """A DeepSpeed CheckpointEngine that keeps, instead of writing, a CPU copy of each file's state (save), for a
    background thread to write; loads go to `inner`, the engine's own. `previous`: the copies of the previous save
    by file name, copied into (and replaced) where they fit."""
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    from tasktrain.checkpoint_io import stage_to_cpu

    class StagingCheckpointEngine(CheckpointEngine):
        def __init__(self):
            super().__init__()
            self.name, self.inner, self.files = "tasktrain-staging", inner, []

        def create(self, info):
            pass

        def save(self, state_dict, path):
            name = os.path.basename(path)
            previous[name] = staged = stage_to_cpu(state_dict, previous.get(name))
            self.files.append((path, staged))

        def load(self, path, map_location=None):
            return self.inner.load(path, map_location=map_location)

        def commit(self, info):
            return True  # the files are not written yet: the writer thread commits (renames) when they are

        def is_data_parallel_writer(self, dp_rank):
            return self.inner.is_data_parallel_writer(dp_rank)

        def preserves_storage_sharing(self):
            return False  # DeepSpeed then skips its own clone before save: stage_to_cpu's copy is the only one

    return StagingCheckpointEngine()
