"""The yardstick's conftest.py (scripts/lightning_yardstick.py build installs it as tests_pytorch/conftest.py): the
fixtures Lightning's tests ask for by name, written for a run where the tests use tasktrain and some names stay on
Lightning. Each fixture does for both packages what Lightning's own does for Lightning:

- state a test may leave behind is put back after it: rank_zero_only's rank (tasktrain's, Lightning's, Fabric's,
  lightning_utilities'), environment variables (a leak fails the test, but for the variables Lightning's suite allows),
  signal handlers, the process group, torch's deterministic switch, threads a test started;
- device counts: cuda_count_N patches Lightning's probes and torch.cuda's count (tasktrain reads torch's);
  mps_count_N / xla_available / tpu_available patch Lightning's probes only (tasktrain has no MPS or XLA);
- tasktrain's CPU count follows Fabric's, which tests patch (the worker warnings depend on it);
- caplog sees the records of Lightning's and tasktrain's loggers (both can stop propagating to the root);
- tmpdir_server, single_process_pg, datadir as Lightning's; a test that leaves files in the test tree fails;
- PL_RUN_STANDALONE_TESTS=1 / RUN_ONLY_CUDA_TESTS=1 / PL_RUN_TPU_TESTS=1 keep only the tests marked for them, and
  Lightning's deprecation warnings are errors, as in Lightning's suite.
"""
import logging
import os
import signal
import socket
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest.mock import Mock

import pytest
import torch
import torch.distributed

import lightning.fabric
import lightning.pytorch
from tests_pytorch import _PATH_DATASETS

# Variables a test may leave set: the ones Lightning's suite allows, tasktrain's names for its seed's two
# (seed_everything leaves the seed in PL_GLOBAL_SEED and TASKTRAIN_GLOBAL_SEED: docs/lightning.md), and
# MLFLOW_ALLOW_FILE_STORE, which an MLFlowLogger on a file store sets for MLflow 3 (docs/logging.md).
ALLOWED_LEAKS = {
    "TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS", "MLFLOW_ALLOW_FILE_STORE",
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_DEVICE_ORDER", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "WANDB_MODE", "WANDB_REQUIRE_SERVICE", "WANDB_SERVICE",
    "RANK", "CUDA_MODULE_LOADING", "KMP_INIT_AT_FORK", "KMP_DUPLICATE_LIB_OK", "CRC32C_SW_MODE", "TRITON_CACHE_DIR",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "OMP_NUM_THREADS", "ALLOW_MULTIPLE_LIBTPU_LOAD", "GRPC_VERBOSITY",
    "TF_CPP_MIN_LOG_LEVEL", "TF_GRPC_DEFAULT_OPTIONS", "XLA_FLAGS", "TORCHINDUCTOR_CACHE_DIR", "TF2_BEHAVIOR",
    "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION", "LD_LIBRARY_PATH", "ENABLE_RUNTIME_UPTIME_TELEMETRY",
}


def _rank_zero_only_functions():
    from lightning_utilities.core.rank_zero import rank_zero_only as utilities_fn

    from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_fn
    from lightning.pytorch.utilities.rank_zero import rank_zero_only as lightning_fn
    from tasktrain.utilities.rank_zero import rank_zero_only as tasktrain_fn

    return tasktrain_fn, lightning_fn, fabric_fn, utilities_fn


@pytest.fixture(scope="session")
def datadir():
    return Path(_PATH_DATASETS)


@pytest.fixture(autouse=True)
def preserve_global_rank_variable():
    functions = _rank_zero_only_functions()
    saved = [getattr(fn, "rank", None) for fn in functions]
    yield
    for fn, rank in zip(functions, saved):
        if rank is not None:
            fn.rank = rank


@pytest.fixture(autouse=True)
def restore_env_variables():
    before = os.environ.copy()
    yield
    leaked = set(os.environ) - set(before) - ALLOWED_LEAKS
    os.environ.clear()
    os.environ.update(before)
    assert not leaked, f"test is leaking environment variable(s): {leaked}"


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    signums = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
    handlers = {signum: signal.getsignal(signum) for signum in signums}
    yield
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def teardown_process_group():
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def reset_deterministic_algorithm():
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(autouse=True)
def thread_police():
    """A thread a test started and left running: stopped where it can be, waited for where it ends by itself (tqdm's
    monitor, tensorboardX's queue feeder, torch.compile's workers), let be where it lives as long as the process
    (wandb's asyncio manager, started by the first real wandb run under either package), else the test fails."""
    from concurrent.futures.process import _ExecutorManagerThread

    from tqdm import TMonitor

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        stop = getattr(thread, "stop", None) or getattr(thread, "exit", None)
        if thread.daemon and callable(stop):
            stop()
            assert not thread.is_alive()
        elif isinstance(thread, _ChildProcessObserver):
            thread.join(timeout=10)
        elif thread.name in ("QueueFeederThread", "QueueManagerThread") or "(_read_thread)" in thread.name:
            thread.join(timeout=20)
        elif isinstance(thread, TMonitor):
            thread.exit()
        elif isinstance(thread, _ExecutorManagerThread) or "ThreadPoolExecutor-" in thread.name \
                or thread.name in ("InductorSubproc", "fsspecIO", "wandb-AsyncioManager-main"):
            continue
        else:
            raise AssertionError(f"Test left zombie thread: {thread}")


@pytest.fixture(autouse=True)
def warn_once_per_test():
    """tasktrain's loop says "`training_step` returned `None`" once per process, as Lightning's Closure does; the tests
    that expect it clear Lightning's cache (`Closure.warning_cache.clear()`, a name left on Lightning), so tasktrain's
    is cleared before each test."""
    import tasktrain.trainer.loop

    for key in tasktrain.trainer.loop._warned_once:
        tasktrain.trainer.loop._warned_once[key] = False


@pytest.fixture(autouse=True)
def cpu_count_follows_fabric():
    """tasktrain's CPU count (the DataLoader worker warnings' bound) asks Fabric's at each call, so a test that patches
    "lightning.fabric.utilities.data._num_cpus_available" (tasktrain has no such path) sets both.

    Its own MonkeyPatch, not the `monkeypatch` fixture: pytest sets autouse fixtures up in name order, so asking for
    `monkeypatch` here would set it up before restore_env_variables and undo it after that fixture's check, and a test's
    monkeypatch.setenv (TORCH_HOME in test_trainer.py) would read as a leak."""
    import lightning.fabric.utilities.data as fabric_data

    import tasktrain.trainer.data

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tasktrain.trainer.data, "_num_cpus_available", lambda: fabric_data._num_cpus_available())
        yield


def mock_cuda_count(monkeypatch, n):
    """Lightning's probes, and torch.cuda's own count, which tasktrain reads: a Trainer built in the test sees n GPUs
    under both (a test that then runs on them fails under both)."""
    monkeypatch.setattr(lightning.fabric.accelerators.cuda, "num_cuda_devices", lambda: n)
    monkeypatch.setattr(lightning.pytorch.accelerators.cuda, "num_cuda_devices", lambda: n)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)


@pytest.fixture
def cuda_count_0(monkeypatch):
    mock_cuda_count(monkeypatch, 0)


@pytest.fixture
def cuda_count_1(monkeypatch):
    mock_cuda_count(monkeypatch, 1)


@pytest.fixture
def cuda_count_2(monkeypatch):
    mock_cuda_count(monkeypatch, 2)


@pytest.fixture
def cuda_count_4(monkeypatch):
    mock_cuda_count(monkeypatch, 4)


def mock_mps_count(monkeypatch, n):
    monkeypatch.setattr(lightning.fabric.accelerators.mps, "_get_all_available_mps_gpus", lambda: [0] if n else [])
    monkeypatch.setattr(lightning.fabric.accelerators.mps.MPSAccelerator, "is_available", lambda *_: n > 0)


@pytest.fixture
def mps_count_0(monkeypatch):
    mock_mps_count(monkeypatch, 0)


@pytest.fixture
def mps_count_1(monkeypatch):
    mock_mps_count(monkeypatch, 1)


def mock_xla_available(monkeypatch, value=True):
    import lightning.fabric.accelerators.xla
    import lightning.fabric.plugins.environments.xla
    import lightning.fabric.plugins.io.xla
    import lightning.fabric.strategies.launchers.xla
    import lightning.pytorch.plugins.precision.xla
    import lightning.pytorch.strategies.launchers.xla
    import lightning.pytorch.strategies.single_xla
    import lightning.pytorch.strategies.xla

    for module in (lightning.pytorch.strategies.xla, lightning.pytorch.strategies.single_xla,
                   lightning.pytorch.plugins.precision.xla, lightning.pytorch.strategies.launchers.xla,
                   lightning.fabric.accelerators.xla, lightning.fabric.plugins.environments.xla,
                   lightning.fabric.plugins.io.xla, lightning.fabric.strategies.launchers.xla):
        monkeypatch.setattr(module, "_XLA_AVAILABLE", value)


@pytest.fixture
def xla_available(monkeypatch):
    mock_xla_available(monkeypatch)


def mock_tpu_available(monkeypatch, value=True):
    import lightning.pytorch.accelerators.xla

    mock_xla_available(monkeypatch, value)
    for accelerator in (lightning.pytorch.accelerators.xla.XLAAccelerator, lightning.fabric.accelerators.xla.XLAAccelerator):
        monkeypatch.setattr(accelerator, "is_available", lambda: value)
        monkeypatch.setattr(accelerator, "auto_device_count", lambda *_: 8)
    for name in ("torch_xla", "torch_xla.core.xla_model", "torch_xla.experimental"):
        monkeypatch.setitem(sys.modules, name, Mock())


@pytest.fixture
def tpu_available(monkeypatch):
    mock_tpu_available(monkeypatch)


@pytest.fixture
def caplog(caplog):
    """pytest's caplog, with the root logger and every Lightning / tasktrain logger propagating while the test runs
    (both packages' loggers can stop propagating when the root has no handler)."""
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
                                       if name.startswith(("lightning.pytorch", "tasktrain"))]
    saved = [(logger, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.propagate = True
    yield caplog
    for logger, propagate in saved:
        logger.propagate = propagate


@pytest.fixture
def tmpdir_server(tmp_path):
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with ThreadingHTTPServer(("localhost", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server.server_address
        server.shutdown()


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture
def single_process_pg():
    """A gloo process group of this one process for the test's length."""
    if torch.distributed.is_initialized():
        raise RuntimeError("Can't use `single_process_pg` when the default process group is already initialized.")
    before = os.environ.copy()
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(autouse=True)
def leave_no_artifacts_behind():
    tests_root = Path(__file__).parent.parent

    def files():
        return {p for p in tests_root.rglob("*") if "__pycache__" not in p.parts}

    before = files()
    yield
    left = {str(p.relative_to(tests_root)) for p in files() - before}
    left = {p for p in left if not p.endswith(".coverage")}
    assert not left, f"Test left artifacts behind: {left}"


def pytest_collection_modifyitems(items, config):
    """PL_RUN_STANDALONE_TESTS=1 keeps the tests marked RunIf(standalone=True), RUN_ONLY_CUDA_TESTS=1 those with
    RunIf(min_cuda_gpus=...), PL_RUN_TPU_TESTS=1 those with RunIf(tpu=True), as in Lightning's suite."""
    switches = {"standalone": "PL_RUN_STANDALONE_TESTS", "min_cuda_gpus": "RUN_ONLY_CUDA_TESTS",
                "tpu": "PL_RUN_TPU_TESTS"}
    if os.getenv("PL_RUN_STANDALONE_TESTS") == "1" and os.getenv("RUN_ONLY_CUDA_TESTS") == "1":
        del switches["min_cuda_gpus"]  # no CPU job runs standalone tests: keep them all
    for kwarg, variable in switches.items():
        if os.getenv(variable, "0") != "1":
            continue
        items[:] = [item for item in items
                    if not any(m.name == "skip" for m in item.own_markers)
                    and any(m.name == "skipif" and m.kwargs.get(kwarg) for m in item.own_markers)]
    error = pytest.mark.filterwarnings("error::lightning.fabric.utilities.rank_zero.LightningDeprecationWarning")
    for item in items:
        item.add_marker(error)
