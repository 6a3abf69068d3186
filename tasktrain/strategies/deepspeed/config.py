"""The DeepSpeed config a run uses: the user's config as given, its "auto" or missing values filled from the run
(micro batch, accumulation, clipping, precision, offload), and the checks of offload to disk (folder, libaio, async_io)."""
import contextlib
import copy
import io
import json
import os
import warnings

import torch

from tasktrain.strategies.deepspeed.engine import import_deepspeed


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
    import_deepspeed()
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
