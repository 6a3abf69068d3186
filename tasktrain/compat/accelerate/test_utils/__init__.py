"""Accelerate's `accelerate.test_utils` under tasktrain (path `tasktrain.test_utils`): the fixtures and helpers its test
scripts import, written for tasktrain from Accelerate's documented behaviour. training.py: RegressionDataset and
RegressionModel (the same numbers as Accelerate's for a seed); testing.py: the require_* skips, the state-resetting
test cases, are_the_same_tensors, assert_exception, execute_subprocess_async and the path and port helpers.

Accelerate's package also imports its own test scripts here (test_script, test_sync, test_ops); tasktrain does not ship
those scripts: scripts/accelerate_suite.py runs Accelerate's."""
from tasktrain.compat.accelerate.test_utils.testing import (  # noqa: F401
    DEFAULT_LAUNCH_COMMAND,
    AccelerateTestCase,
    MockingTestCase,
    TempDirTestCase,
    are_the_same_tensors,
    assert_exception,
    capture_call_output,
    device_count,
    execute_subprocess_async,
    get_launch_command,
    get_torch_dist_unique_port,
    memory_allocated_func,
    path_in_accelerate_package,
    pytest_xdist_worker_id,
    require_bnb,
    require_cpu,
    require_cuda,
    require_cuda_or_hpu,
    require_cuda_or_xpu,
    require_fp8,
    require_fp16,
    require_huggingface_suite,
    require_mlu,
    require_mps,
    require_multi_device,
    require_multi_gpu,
    require_multi_gpu_or_xpu,
    require_multi_xpu,
    require_musa,
    require_non_cpu,
    require_non_hpu,
    require_non_torch_xla,
    require_non_xpu,
    require_npu,
    require_pippy,
    require_sdaa,
    require_single_device,
    require_single_gpu,
    require_single_xpu,
    require_torch_min_version,
    require_torchao,
    require_torchvision,
    require_tpu,
    require_transformer_engine,
    require_transformer_engine_mxfp8,
    require_xpu,
    run_first,
    skip,
    slow,
    torch_device,
)
from tasktrain.compat.accelerate.test_utils.training import RegressionDataset, RegressionModel  # noqa: F401

__all__ = [name for name in dir() if not name.startswith("_") and name not in ("testing", "training")]
