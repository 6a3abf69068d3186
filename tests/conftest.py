import gc
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
# DeepSpeed's op builds use the ninja on PATH: the venv's, as `make` sets it (a system ninja records its builds in
# another log format, and each then rebuilds what the other built, minutes per op), also for a bare `pytest` run.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
# Tests must never inherit a launcher's world from the shell that runs them.
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
              "MASTER_PORT", "TASKTRAIN_LAUNCH", "TASKTRAIN_STRATEGY", "TASKTRAIN_PRECISION")
for var in WORLD_VARS + ("TASKTRAIN_GLOBAL_SEED", "PL_GLOBAL_SEED"):
    os.environ.pop(var, None)
sys.path.insert(0, os.path.join(ROOT, "tests"))
# Bytecode caches on, for this process and the ones it starts, where the shell turned them off
# (PYTHONDONTWRITEBYTECODE=1, as on the agents' machines): without them each pytest worker of `make test`, which
# collects every test file, compiled and assertion-rewrote all of them again (collection of tests/: 13.7 -> 7.1
# CPU-s per worker once written, 15.2 the run that writes them; a launched process's own compiling was within the
# noise). The caches go to __pycache__ folders beside the sources (.gitignore); no test depends on them.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False
# A test process killed while loading a DeepSpeed op leaves its lock, and every later load of the op would wait for
# it forever: cleared before any test loads one (tasktrain/strategies/deepspeed/ops.py says when a lock is stale).
from tasktrain.strategies.deepspeed.ops import clear_stale_op_locks  # noqa: E402

clear_stale_op_locks()

# `make test` runs two pytest workers on the machine's cores (-n 2): a test's in-process training then gets one torch
# thread per worker, as a launcher gives each rank its share (torch's default, every core per worker, left most of
# the CPU spinning in threads that wait on each other). Where that share is one core (this machine), the processes a
# test launches get one thread too (OMP_NUM_THREADS=1, unless set): launchers give their ranks at least that already
# (torchrun, tasktrain's cpus // ranks), but a single launched process took every core, beside the other worker's
# test: 14.8-16.9 -> 10.9 CPU-s for one such test (test_accelerate_options' one-process run, same-time pairs).
# (With more cores a worker's share is several threads: then left unset, so that launchers share it out by rank.)
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    WORKER_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    torch.set_num_threads(WORKER_THREADS)
    if WORKER_THREADS == 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def quiet_lightning():
    """Lightning's package logger ("lightning.pytorch") at ERROR for one test (its INFO notes would fill the output of
    tests that run it beside tasktrain), and its level put back after: a later test that reads Lightning's log lines
    (the model registry's tip, the finders' lines) sees them without raising the level again."""
    import logging

    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


RANK_ZERO_MODULES = ("lightning_utilities.core.rank_zero", "tasktrain.compat.lightning.utilities.rank_zero")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test runs in its own directory with no seed left over from another test, and no DeepSpeed engine kept
    after its last run (Strategy.end_run: with a world of one, its process group too) left to the next test."""
    monkeypatch.chdir(tmp_path)
    for var in ("TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.delenv(var, raising=False)  # (seed_everything sets Lightning's names too)
    world = {var: os.environ.get(var) for var in WORLD_VARS}
    ranks = {name: sys.modules[name].rank_zero_only.rank for name in RANK_ZERO_MODULES if name in sys.modules}
    yield
    # Lightning's Trainer built under a launcher's variables (RANK=1) sets its rank_zero_only.rank for the process:
    # later tests in the same worker would see none of Lightning's rank-zero warnings (as its own conftest, put back)
    for name in RANK_ZERO_MODULES:
        if name in sys.modules:
            sys.modules[name].rank_zero_only.rank = ranks.get(name, 0)
    # Lightning's DDP of one process sets LOCAL_RANK, NODE_RANK, MASTER_ADDR and MASTER_PORT and never unsets them (a
    # test running it beside tasktrain left LOCAL_RANK to a later DeepSpeed test in the same worker): put back
    for var, value in world.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    # MLFlowLogger makes its store MLflow's process-wide one (mlflow.set_tracking_uri, as Lightning's): a later test's
    # MLflow tracker in the same worker would write its runs there
    mlflow_uri = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if mlflow_uri is not None:
        mlflow_uri._tracking_uri = None
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    base = sys.modules.get("tasktrain.strategies.base")
    if base is not None:
        base.release_kept_runs()
    if "lightning.fabric.utilities.data" in sys.modules:
        _undo_lightnings_loader_recording()


def _undo_lightnings_loader_recording():
    """Lightning's recording of loader arguments (fabric/utilities/data.py, _replace_dunder_methods) wraps the
    __init__ / __setattr__ / __delattr__ of DataLoader, BatchSampler and every subclass, and puts them back after its
    `yield` with no try/finally: a loader hook that raises under a Lightning run leaves every later loader of the
    process recording its arguments, so Lightning can rebuild a loader it would refuse (a beside test after such a
    test failed in a full run: tests/test_lightning_beside_samplers.py). Put back what it left (its `__old<name>`)."""
    from torch.utils.data import BatchSampler, DataLoader

    classes = [DataLoader, BatchSampler]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        for name in ("__init__", "__setattr__", "__delattr__"):
            if f"__old{name}" in cls.__dict__:
                setattr(cls, name, cls.__dict__[f"__old{name}"])
                delattr(cls, f"__old{name}")


@pytest.fixture(autouse=True, scope="session")
def _two_cores():
    """The cores a test process may use read as 2 (this suite's machine) on any host: Lightning's worker warning
    ("does not have many workers", trainer/data.py) depends on them, so a test that asserts no warning would fail on
    a bigger machine. A test of that warning pins its own count (tests/test_lightning_beside_samplers.py: 8)."""
    if not hasattr(os, "sched_getaffinity"):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
        yield


@pytest.fixture(autouse=True, scope="session")
def _offline_trackers(tmp_path_factory):
    """Weights & Biases stays offline and silent, and neither it nor MLflow writes outside the test folders."""
    home = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            mp.setenv(var, str(home / var.lower()))
        for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS"):
            mp.delenv(var, raising=False)
        yield



# The slowest files of `make test` (seconds from its --durations on 2026-12-05, a loaded machine: what matters is
# their order). A file missing here counts as light; add one when it becomes one of the slowest. test_restart and
# test_benchmarks scaled on 2026-12-06 by their measured cuts (one reference launch instead of three: 170 -> 143 s
# alone; overhead.py's smaller smoke run: 54 -> 25 s, the same load); test_model_parallel from the last full run
# (22:23, 2026-12-06: 62 s of fixture alone). test_reshard and test_gpt_example scaled on 2026-12-06 by the CPU time
# (user+sys) of their cuts, each file alone before and after on the same (loaded) machine: test_reshard 138 -> 106 s
# (5 launches/interpreters fewer), test_gpt_example 241 -> 210 s (the 2-process cases' data made once per process;
# the bf16 case 200 steps, not 260). test_deepspeed, test_gpt_example and test_accelerator scaled on 2026-12-06 by the
# CPU time of testtime5's cuts, the same way: 252 -> 223 s, 258 -> 235 s, 43 -> 37 s (imports frozen out of the
# garbage collector in the DeepSpeed scripts; the bf16 GPT case on one layer). test_restart and test_gpt_example
# lowered on 2026-12-06 by the CPU time of testtime6's cuts (the same tests alone before and after, on the same loaded
# machine): test_restart's ZeRO-2 reference and kill test 112 -> 83 s (DeepSpeed's Muon module without inductor in its
# ten engine-building processes), test_gpt_example's 2-process test 244 -> 222 s (AdamW's foreach path), test_reshard
# 140 -> 126 s (the Muon module). On 2026-12-07 (ttime), by the CPU time of its cuts (same-time pairs, each file alone):
# test_model_parallel 62 -> 51 (6 mesh steps, not 10), test_lightning_ddp 71 -> 48 (the optimization hooks in the
# extras launch); test_lightning_beside_ddp_order (37 s alone, loaded) holds the one launch of three beside-Lightning
# scripts that were a launch each in three files. On 2026-12-07 (ttime3): test_restart 325 -> 266 by the CPU time of
# its cut (225 -> 184 s alone: the references and the three killed runs in one launch). On 2026-12-07 (ttime, second
# pass), by the CPU time of its cuts (each file alone, user+sys with children): test_gpt_example 232 -> 195 (its ZeRO-3
# compiled case on aot_eager: ~35 of ~216 CPU-s), test_reshard 200 -> 177 (59.0 -> 52.1), test_stream 114 -> 98 (43.1 ->
# 37.1: its killed 2-process runs forked inside one launch), test_lightning_compat 32 -> 10 (its launch moved into
# test_lightning_ddp's, 48 -> 60; the two files 32.5 -> 23.8 CPU-s). On 2026-12-07 (ttime2), by the CPU time of its
# cut (OMP_NUM_THREADS=1 for launched processes; each file alone as a make-test worker, same-time pairs):
# test_accelerate_options 98 -> 83 (42.5 -> 35.9 CPU-s), test_accelerate_numbers 43 -> 36 (21.0 -> 17.7).
# On 2026-12-07 (testtime), each file alone as a make-test worker, user+sys CPU-s with children (not the seconds
# below, which are loaded wall time and kept for the order): test_deepspeed 105, test_restart 103, test_ddp 71,
# test_gpu_check 68, test_accelerator_api 53, test_fsdp 47, test_resume 44 (test_lightning_beside_plugins, not
# listed: 26). These seven hold ~490 of a full run's ~1820-3060 CPU-s (two runs on this machine kind, 2026-12-07/08):
# the rest is spread over the other files.
HEAVY_FILES = {
    "test_restart.py": 266, "test_deepspeed.py": 274, "test_gpt_example.py": 195,
    "test_fsdp.py": 244, "test_resume.py": 238, "test_reshard.py": 177, "test_ddp.py": 170,
    "test_gpu_check.py": 168, "test_ddp_failures.py": 146, "test_benchmarks.py": 140,
    "test_watchdog.py": 138, "test_accelerator_api.py": 123,
    "test_slurm.py": 116, "test_stream.py": 98, "test_accelerate_options.py": 83, "test_loggers.py": 88,
    "test_accelerator_clipping.py": 74, "test_lightning_ddp.py": 60, "test_accelerator.py": 61,
    "test_accelerate_suite.py": 60, "test_launch.py": 51, "test_demo.py": 49, "test_accelerate_numbers.py": 36,
    "test_model_parallel.py": 51, "test_lightning_compat.py": 10, "test_iterable_dispatch.py": 30,
    "test_lightning_beside_ddp_order.py": 37,
    "test_lightning_beside_loggers.py": 56,  # (2026-12-07, wbpickle: its W&B ddp_spawn test, 4 spawns, loaded machine)
}


def pytest_configure(config):
    # `make test` runs -n 2 --dist loadfile: a file stays on one worker from its first test to its last. xdist hands
    # out files by their number of tests, which put the slowest ones (a few long launches each) last, where one
    # worker could run them alone while the other had nothing left; it follows the collection order below instead.
    # (xdist 3.8: LoadScopeScheduling.schedule sorts files by test count unless loadscopereorder is off, then pops
    # them in order; a worker takes its next file when 2 tests of its current one are left. Checked with a plugin
    # logging _assign_work_unit: heaviest files first, the rest in collection order. No reordering plugin is
    # installed (pip list: pytest, pytest-timeout, pytest-xdist): one such as pytest-randomly would change this order.)
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_collection_finish(session):
    # Test time only: what collection imported (torch, tasktrain, Lightning, DeepSpeed: ~300,000 objects) is frozen
    # out of the garbage collector, so that each full collection a test triggers (a DeepSpeed teardown's, Accelerate's
    # free_memory, the interpreter's own) walks only what the tests made since, not every module (~0.1 s of CPU less
    # each). Nothing that exists now becomes garbage in a test; whatever a test makes is collected as before.
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """Under xdist, the heaviest files first (a stable sort: a file's own tests keep their order)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: -HEAVY_FILES.get(item.path.name, 0))
