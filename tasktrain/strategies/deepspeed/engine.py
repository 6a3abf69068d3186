"""What tasktrain changes around DeepSpeed 0.19.8's engine, each for a named reason: the import without mlflow, the
functional linear ZeRO-3 leaves behind, zero.Init's dtype, complete ZeRO files under offload to disk, the
staging checkpoint engine of background saves, the forced collections of the bf16 optimizer's memory report, and
the torch.compile set-up that DeepSpeed's Muon module runs at its import, py-cpuinfo's interpreter per question. Imported only where deepspeed is."""
import contextlib
import copy
import functools
import os
import sys

import torch

from tasktrain.strategies.deepspeed.ops import clear_stale_op_locks

def import_deepspeed():
    """`import deepspeed`, without the mlflow that DeepSpeed's autotuner imports with the package when mlflow is
    installed: ~2 s of CPU in every process that imports DeepSpeed (mlflow pulls pandas, fastapi, ...), for the
    autotuner alone (`deepspeed --autotuning`, which tasktrain never runs; it reads an absent mlflow as "do not
    log"). mlflow is hidden only while deepspeed loads, and only when nothing imported it before: an `import
    mlflow` afterwards (MLFlowLogger, the user) gets the real package. Every first import of deepspeed in
    tasktrain goes through here, before any of DeepSpeed's ops is loaded: a stale op lock is cleared first (ops.py),
    else that load would wait forever."""
    clear_stale_op_locks()
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        import deepspeed
    else:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, which the autotuner catches
        try:
            import deepspeed
        finally:
            if sys.modules.get("mlflow", 0) is None:
                del sys.modules["mlflow"]
    _import_muon_compiling_at_first_call()
    _cpu_info_once_for_deepspeed()
    return deepspeed


def _compile_at_first_call(function):
    """torch.compile(function), made when the function is first called instead of where it is defined."""
    compiled = []

    @functools.wraps(function)
    def call(*args, **kwargs):
        if not compiled:
            compiled.append(torch.compile(function))
        return compiled[0](*args, **kwargs)

    return call


def _import_muon_compiling_at_first_call():
    """DeepSpeed 0.19.8 imports its Muon optimizer's module in every ZeRO engine (the optimizer check of
    deepspeed.initialize, ZeRO-3's and the bf16 optimizer's constructors, ZeRO-1/2's gradient reduction), whatever the
    optimizer, and that module applies @torch.compile to three functions as it loads: torch.compile(function) loads
    torch's inductor compiler to read its settings (~1.5 s of CPU in a process that already loaded torch._dynamo,
    several times that in wall time on a loaded machine), in every process that builds an engine, for functions only
    a Muon optimizer calls. Imported here with each of them compiled by torch.compile at its first call, as
    torch.compile compiles anyway: a Muon optimizer gets the same compiled functions, the others never load inductor
    for them."""
    if "deepspeed.runtime.zero.muon.original_muon" in sys.modules:
        return
    from deepspeed.runtime import compiler

    original = compiler.compile
    compiler.compile = lambda: _compile_at_first_call
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401  (imports original_muon)
    finally:
        compiler.compile = original


def _cpu_info_once_for_deepspeed():
    """DeepSpeed asks py-cpuinfo's get_cpu_info() for the CPU's architecture, flags and vendor each time it loads a
    C++ op (twice per load: -march and the SIMD width) and in each DeepSpeedCPUAdam it builds, and get_cpu_info starts
    a new Python interpreter per call (~0.6 s of CPU, ~2 s of wall on a loaded machine): 3 calls in each process of a
    CPU-offload run, 7 or more under offload to disk. What DeepSpeed reads there does not change while a process
    runs, so DeepSpeed's calls (and only those: the caller is checked) get the first answer, each a copy of it;
    anyone else calling get_cpu_info still gets a fresh one."""
    try:
        import cpuinfo
    except ImportError:  # DeepSpeed falls back to lscpu then; nothing to share
        return
    if getattr(cpuinfo.get_cpu_info, "tasktrain_once", False):
        return
    fresh, answers = cpuinfo.get_cpu_info, []

    @functools.wraps(fresh)
    def get_cpu_info():
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("deepspeed."):
            return fresh()
        if not answers:
            answers.append(fresh())
        return copy.deepcopy(answers[0])

    get_cpu_info.tasktrain_once = True
    cpuinfo.get_cpu_info = get_cpu_info


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


class _NoCollection:
    """The gc module as deepspeed.runtime.utils sees it inside _no_forced_collections: collect() does nothing."""

    @staticmethod
    def collect(generation=2):
        return 0


def _forget_destroyed_groups():
    """DeepSpeed keeps its own copies of the process group it ran on (deepspeed.utils.groups), forgotten only when the
    group is destroyed through deepspeed.comm. A group destroyed since with torch's own call (another strategy's world
    of one ending, a script's destroy_process_group) stays there, and the next engine of this process would look its
    ranks up in it ("Group ... is not registered"): those copies are dropped, so that DeepSpeed takes the current one."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    cached = getattr(groups, "_WORLD_GROUP", None)
    release = getattr(groups, "_release_process_group_references", None)
    if cached is None or release is None:
        return
    try:
        dist.get_global_rank(cached, 0)
    except (ValueError, RuntimeError):
        release()


@contextlib.contextmanager
def _no_forced_collections():
    """DeepSpeed 0.19.8's BF16_Optimizer (a bf16 engine's at ZeRO stage 1 without offload, and every bf16 engine that
    does not train: validate, test, predict) reports memory while it is built (at its start and end, and twice per
    parameter group) with see_memory_usage(force=True), which runs a full gc.collect() on rank 0 before printing its
    figures: ~0.15 s of CPU each in a process that imported torch and DeepSpeed (~320,000 objects; several times that
    in wall time on a loaded machine), for a printout, nothing the engine needs. For initialize only, the report is
    printed as DeepSpeed prints it, without that collection first (gc is used nowhere else in
    deepspeed.runtime.utils; the teardown's own collection still frees the engines that went)."""
    from deepspeed.runtime import utils

    original = utils.gc
    utils.gc = _NoCollection
    try:
        yield
    finally:
        utils.gc = original


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
