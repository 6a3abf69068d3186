"""Accelerate's `accelerate.test_utils.testing` helpers under tasktrain: skip decorators whose conditions probe this
machine (devices through torch, libraries through importlib), the state-resetting test cases, and the subprocess and
assertion helpers Accelerate's test scripts use.

Every `require_*` is a `unittest.skipUnless` decided when this module is imported, as Accelerate's are; they work on
unittest methods and on pytest functions alike.
"""
import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from functools import partial
from pathlib import Path
from typing import Optional

import torch

from tasktrain.compat.accelerate.utils.operations import gather


def _installed(*packages):
    return all(importlib.util.find_spec(name) is not None for name in packages)


def _backend_available(name):
    """torch.<name>.is_available() where torch has that backend (xpu, mlu, npu, ... come with their plugins)."""
    module = getattr(torch, name, None)
    probe = getattr(module, "is_available", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:  # a plugin present without its driver
        return False


def _xla_available():
    return _installed("torch_xla") and os.environ.get("USE_TORCH_XLA", "1").lower() not in ("0", "false", "no")


def _cuda_available():
    return torch.cuda.is_available()


def _mps_available():
    return torch.backends.mps.is_available()


def _torch_at_least(version):
    from packaging.version import Version
    return Version(torch.__version__.split("+")[0]) >= Version(version)


def _hpu_gaudi1():
    if not _backend_available("hpu"):
        return False
    try:
        import habana_frameworks.torch.utils.experimental as habana_experimental
        return habana_experimental._get_device_type() == habana_experimental.synDeviceType.synDeviceGaudi
    except (ImportError, AttributeError):
        return False


def get_backend():
    """(device type, device count, memory-allocated function) of the first accelerator found, else ("cpu", 1, ...).

    The order is Accelerate's: XLA, CUDA, MPS, MLU, SDAA, MUSA, NPU, XPU, HPU, Neuron."""
    if _xla_available():
        return "xla", torch.cuda.device_count(), torch.cuda.memory_allocated
    if _cuda_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if _mps_available():
        allocated = getattr(torch.mps, "current_allocated_memory", lambda: 0)
        return "mps", 1, allocated
    for name in ("mlu", "sdaa", "musa", "npu", "xpu", "hpu", "neuron"):
        if _backend_available(name):
            module = getattr(torch, name)
            return name, module.device_count(), module.memory_allocated
    return "cpu", 1, lambda: 0


torch_device, device_count, memory_allocated_func = get_backend()


def get_launch_command(**kwargs) -> list:
    """["tasktrain", "launch", "--key=value", ...] from keyword arguments (a True flag gives "--key", None omits it);
    Accelerate's returns `accelerate launch ...`, this one the launcher of this library."""
    command = ["tasktrain", "launch"]
    for key, value in kwargs.items():
        if value is True:
            command.append(f"--{key}")
        elif value is not None and value is not False:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count)


def parse_flag_from_env(key, default=False):
    """The environment variable `key` as a bool (yes/no, true/false, on/off, 1/0), `default` when unset."""
    if key not in os.environ:
        return default
    value = os.environ[key].strip().lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return True
    if value in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"If set, {key} must be yes or no (got {os.environ[key]!r}).")


_run_slow_tests = parse_flag_from_env("RUN_SLOW", default=False)


def _skip_unless(condition, reason):
    return unittest.skipUnless(condition, reason)


def skip(test_case):
    "Skip the test unconditionally."
    return unittest.skip("Test was skipped")(test_case)


def slow(test_case):
    "Skip the test unless RUN_SLOW is set to a true value."
    return _skip_unless(_run_slow_tests, "test is slow")(test_case)


# Devices
def require_cpu(test_case):
    return _skip_unless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case):
    return _skip_unless(torch_device != "cpu", "test requires a GPU")(test_case)


def require_cuda(test_case):
    return _skip_unless(_cuda_available() and not _xla_available(), "test requires a GPU")(test_case)


def require_cuda_or_hpu(test_case):
    condition = (_cuda_available() and not _xla_available()) or _backend_available("hpu")
    return _skip_unless(condition, "test requires a GPU or HPU")(test_case)


def require_xpu(test_case):
    return _skip_unless(_backend_available("xpu"), "test requires a XPU")(test_case)


def require_cuda_or_xpu(test_case):
    condition = (_cuda_available() and not _xla_available()) or _backend_available("xpu")
    return _skip_unless(condition, "test requires a CUDA GPU or XPU")(test_case)


def require_non_xpu(test_case):
    return _skip_unless(torch_device != "xpu", "test requires a non-XPU")(test_case)


def require_non_hpu(test_case):
    return _skip_unless(torch_device != "hpu", "test requires a non-HPU")(test_case)


def require_mlu(test_case):
    return _skip_unless(_backend_available("mlu"), "test require a MLU")(test_case)


def require_sdaa(test_case):
    return _skip_unless(_backend_available("sdaa"), "test require a SDAA")(test_case)


def require_musa(test_case):
    return _skip_unless(_backend_available("musa"), "test require a MUSA")(test_case)


def require_npu(test_case):
    return _skip_unless(_backend_available("npu"), "test require a NPU")(test_case)


def require_neuron(test_case):
    return _skip_unless(_backend_available("neuron"), "test require Neuron Cores")(test_case)


def require_mps(test_case):
    return _skip_unless(_mps_available(), "test requires a `mps` backend support in `torch`")(test_case)


def require_tpu(test_case):
    condition = _xla_available() and _installed("torch_xla") and _xla_device_type() == "TPU"
    return _skip_unless(condition, "test requires TPU")(test_case)


def _xla_device_type():
    try:
        import torch_xla.runtime
        return torch_xla.runtime.device_type()
    except (ImportError, RuntimeError):
        return None


def require_non_torch_xla(test_case):
    return _skip_unless(not _xla_available(), "test requires an env without TorchXLA")(test_case)


def require_single_device(test_case):
    return _skip_unless(torch_device != "cpu" and device_count == 1, "test requires a single device accelerator")(test_case)


def require_single_gpu(test_case):
    return _skip_unless(torch.cuda.device_count() == 1, "test requires a GPU")(test_case)


def require_single_xpu(test_case):
    count = torch.xpu.device_count() if _backend_available("xpu") else 0
    return _skip_unless(count == 1, "test requires a XPU")(test_case)


def require_multi_device(test_case):
    return _skip_unless(device_count > 1, "test requires multiple hardware accelerators")(test_case)


def require_multi_gpu(test_case):
    return _skip_unless(torch.cuda.device_count() > 1, "test requires multiple GPUs")(test_case)


def require_multi_xpu(test_case):
    count = torch.xpu.device_count() if _backend_available("xpu") else 0
    return _skip_unless(count > 1, "test requires multiple XPUs")(test_case)


def require_multi_gpu_or_xpu(test_case):
    condition = (_cuda_available() or _backend_available("xpu")) and device_count > 1
    return _skip_unless(condition, "test requires multiple GPUs or XPUs")(test_case)


# Numerics
def require_fp16(test_case):
    # fp16 works everywhere but on Gaudi 1.
    return _skip_unless(not _hpu_gaudi1(), "test requires FP16 support")(test_case)


def _cuda_fp8_capable():
    return torch.cuda.get_device_capability() >= (8, 9)


def require_fp8(test_case):
    # A library that provides fp8 (MS-AMP, Transformer Engine or torchao), and a device that computes it.
    available = _installed("msamp") or _installed("transformer_engine") or _installed("torchao")
    if _cuda_available() and not _cuda_fp8_capable():
        available = False
    if _hpu_gaudi1():
        available = False
    return _skip_unless(available, "test requires FP8 support")(test_case)


def require_fsdp2(test_case):
    return _skip_unless(_torch_at_least("2.5.0"), "test requires FSDP2 (torch >= 2.5.0)")(test_case)


def require_tp(test_case):
    condition = _torch_at_least("2.3.0") and _package_at_least("transformers", "4.52.0")
    return _skip_unless(condition, "test requires torch version >= 2.3.0 and transformers version >= 4.52.0")(test_case)


def _package_at_least(distribution, version):
    import importlib.metadata
    from packaging.version import Version
    try:
        return Version(importlib.metadata.version(distribution)) >= Version(version)
    except importlib.metadata.PackageNotFoundError:
        return False


def require_torch_min_version(test_case=None, version=None):
    """Skip unless torch >= version; usable as @require_torch_min_version(version="2.4")."""
    if test_case is None:
        return partial(require_torch_min_version, version=version)
    return _skip_unless(_torch_at_least(version), f"test requires torch version >= {version}")(test_case)


def require_pippy(test_case):
    # Pipeline parallelism is torch.distributed.pipelining from torch 2.4 on.
    return _skip_unless(_torch_at_least("2.4.0") and not _hpu_gaudi1(), "test requires pippy")(test_case)


def _transformer_engine_mxfp8():
    if not _installed("transformer_engine"):
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support
    return check_mxfp8_support()[0]


def require_transformer_engine(test_case):
    return _skip_unless(_installed("transformer_engine"), "test requires transformers engine")(test_case)


def require_transformer_engine_mxfp8(test_case):
    return _skip_unless(_transformer_engine_mxfp8(),
                        "test requires transformers engine MXFP8 block scaling")(test_case)


# Libraries: (decorator name, import names, reason)
def _library_requirement(packages, reason):
    def decorator(test_case):
        return _skip_unless(_installed(*packages), reason)(test_case)
    return decorator


require_huggingface_suite = _library_requirement(("transformers", "datasets"), "test requires the Hugging Face suite")
require_datasets = _library_requirement(("datasets",), "test requires the datasets library")
require_transformers = _library_requirement(("transformers",), "test requires the transformers library")
require_timm = _library_requirement(("timm",), "test requires the timm library")
require_torchvision = _library_requirement(("torchvision",), "test requires the torchvision library")
require_triton = _library_requirement(("triton",), "test requires the triton library")
require_schedulefree = _library_requirement(("schedulefree",), "test requires the schedulefree library")
require_bnb = _library_requirement(("bitsandbytes",), "test requires the bitsandbytes library")
require_peft = _library_requirement(("peft",), "test requires PEFT")
require_deepspeed = _library_requirement(("deepspeed",), "test requires DeepSpeed")
require_tensorboard = _library_requirement(("tensorboard",), "test requires Tensorboard")
require_wandb = _library_requirement(("wandb",), "test requires wandb")
require_trackio = _library_requirement(("trackio",), "test requires trackio")
require_comet_ml = _library_requirement(("comet_ml",), "test requires comet_ml")
require_aim = _library_requirement(("aim",), "test requires aim")
require_clearml = _library_requirement(("clearml",), "test requires clearml")
require_dvclive = _library_requirement(("dvclive",), "test requires dvclive")
require_swanlab = _library_requirement(("swanlab",), "test requires swanlab")
require_pandas = _library_requirement(("pandas",), "test requires pandas")
require_mlflow = _library_requirement(("mlflow",), "test requires mlflow")
require_torchao = _library_requirement(("torchao",), "test requires torchao")
require_matplotlib = _library_requirement(("matplotlib",), "test requires matplotlib")
require_import_timer = _library_requirement(("tuna",), "test requires tuna interpreter")
require_torchdata_stateful_dataloader = _library_requirement(
    ("torchdata.stateful_dataloader",) if _installed("torchdata") else ("torchdata",),
    "test requires torchdata.stateful_dataloader")

# Accelerate's rule: one of these trackers installed, and comet_ml not (its tracker tests run without Comet)
_TRACKERS = ("wandb", "tensorboard", "trackio", "swanlab")


def require_trackers(test_case):
    return _skip_unless(any(_installed(name) for name in _TRACKERS) and not _installed("comet_ml"),
                        "test requires at least one tracker to be available and for `comet_ml` to not be installed"
                        )(test_case)


def run_first(test_case):
    """Mark the test to run first when pytest-order is installed (pytest.mark.order(1)); otherwise unchanged."""
    if _installed("pytest"):
        import pytest
        return pytest.mark.order(1)(test_case)
    return test_case


class TempDirTestCase(unittest.TestCase):
    """One temporary directory per class (`self.tmpdir`, a Path), emptied before each test (unless clear_on_setup
    is False) and removed after the class."""

    clear_on_setup = True

    @classmethod
    def setUpClass(cls):
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self):
        if not self.clear_on_setup:
            return
        for entry in self.tmpdir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


class AccelerateTestCase(unittest.TestCase):
    """Resets the process-wide AcceleratorState and GradientState after each test, so no test sees another's."""

    def tearDown(self):
        super().tearDown()
        from tasktrain.compat.accelerate.state import AcceleratorState
        AcceleratorState._reset_state(True)
        from tasktrain.compat.accelerate import state as state_module
        gradient_state = getattr(state_module, "GradientState", None)
        if gradient_state is not None:
            gradient_state._reset_state()


class MockingTestCase(unittest.TestCase):
    """Call `self.add_mocks(mock_or_list)` at the end of setUp: each is started and stopped after the test."""

    def add_mocks(self, mocks):
        self.mocks = list(mocks) if isinstance(mocks, (tuple, list)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


def are_the_same_tensors(tensor):
    """True when `tensor` is equal on every process (gathers it from all of them)."""
    # Only this process's device is needed: PartialState gives it with or without an Accelerator.
    from tasktrain.compat.accelerate.state import PartialState
    local = tensor[None].clone().to(PartialState().device)
    everyone = gather(local).cpu()
    mine = local[0].cpu()
    return all(torch.equal(everyone[i], mine) for i in range(everyone.shape[0]))


class _RunOutput:
    def __init__(self, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def _pump(stream, sink, echo_to, label, quiet):
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        sink.append(line)
        if not quiet:
            print(label, line, file=echo_to, flush=True)
    stream.close()


def execute_subprocess_async(cmd: list, env=None, stdin=None, timeout=180, quiet=False, echo=True) -> _RunOutput:
    """Run `cmd`, echoing its output line by line ("stdout:"/"stderr:" prefixes unless quiet); returns an object with
    returncode and the stdout/stderr lines. Raises RuntimeError with the stderr when it exits non-zero, and when it
    runs past `timeout` seconds (it is killed then; Accelerate's version does not enforce the timeout)."""
    cmd = [str(part) if isinstance(part, Path) else part for part in cmd]
    if echo:
        print("\nRunning: ", " ".join(cmd))
    process = subprocess.Popen(cmd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    pumps = [threading.Thread(target=_pump, args=(process.stdout, out, sys.stdout, "stdout:", quiet), daemon=True),
             threading.Thread(target=_pump, args=(process.stderr, err, sys.stderr, "stderr:", quiet), daemon=True)]
    for pump in pumps:
        pump.start()
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        for pump in pumps:
            pump.join()
        raise RuntimeError(f"'{' '.join(cmd)}' ran past its timeout of {timeout} s and was killed.\n\n"
                           "The combined stderr from workers follows:\n" + "\n".join(err))
    for pump in pumps:
        pump.join()
    if returncode > 0:
        raise RuntimeError(f"'{' '.join(cmd)}' failed with returncode {returncode}\n\n"
                           "The combined stderr from workers follows:\n" + "\n".join(err))
    return _RunOutput(returncode, out, err)


def pytest_xdist_worker_id():
    """The number of this pytest-xdist worker (gw3 -> 3), 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(re.sub(r"^gw", "", worker))


def get_torch_dist_unique_port():
    """29500 plus the pytest-xdist worker id: a --master_port that concurrent workers do not share."""
    return 29500 + pytest_xdist_worker_id()


class SubprocessCallException(Exception):
    pass


def run_command(command: list, return_stdout=False, env=None):
    """Run `command` (stderr folded into stdout); returns the output as text when return_stdout; raises
    SubprocessCallException with the output when it fails."""
    command = [str(part) if isinstance(part, Path) else part for part in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT,
                                         env=os.environ.copy() if env is None else env)
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(
            f"Command `{' '.join(command)}` failed with the following error:\n\n{error.output.decode()}") from error
    if return_stdout:
        return output.decode("utf-8")


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed package: under the rename, that package is tasktrain."""
    import tasktrain
    return Path(tasktrain.__file__).parent.joinpath(*components)


@contextlib.contextmanager
def assert_exception(exception_class, msg: Optional[str] = None):
    """Fail unless the block raises `exception_class` (and, if msg is given, a message containing msg)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - checking its type is the point
        assert isinstance(error, exception_class), f"Expected exception of type {exception_class} but got {type(error)}"
        if msg is not None:
            assert msg in str(error), f"Expected message '{msg}' to be in exception but got '{error}'"
        return
    raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func, *args, **kwargs):
    """What func(*args, **kwargs) prints to stdout, as a string."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        func(*args, **kwargs)
    return buffer.getvalue()


__all__ = [name for name in dir() if not name.startswith("_") and name not in (
    "contextlib", "importlib", "io", "os", "re", "shutil", "subprocess", "sys", "tempfile", "threading", "unittest",
    "partial", "Path", "Optional", "torch", "gather")]
