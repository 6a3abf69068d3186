"""clip_grad_norm_ in a custom loop through `tasktrain launch`, under DeepSpeed ZeRO-3 with a launch YAML that
leaves clipping unset (the seed's YAML, as docs/launch.md shows it) and under MULTI_GPU (DDP): the script's max_norm is
what the engine applies, measured on the update, and the norm returned is the step's."""
import os

import pytest
import torch

from test_accelerator import SCRIPTS, launch

# docs/launch.md's DeepSpeed YAML as written (no gradient_clipping key); the test runs it on 2 processes.
SEED_ZERO3_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 3
  offload_optimizer_device: cpu
  offload_param_device: cpu
  gradient_accumulation_steps: 2
  deepspeed_multinode_launcher: standard
mixed_precision: bf16
num_machines: 1
num_processes: 4
downcast_bf16: 'no'
"""
# Accelerate's MULTI_GPU YAML: DDP (on this machine's CPUs, where the Accelerator says MULTI_CPU).
MULTI_GPU_YAML = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("yaml, kind", [(SEED_ZERO3_YAML, "DEEPSPEED"), (MULTI_GPU_YAML, "MULTI_CPU")],
                         ids=["deepspeed-zero3-no-clipping-key", "multi-gpu"])
def test_clip_grad_norm_applies_the_scripts_max_norm(tmp_path, yaml, kind):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "launch.yaml").write_text(yaml)
    launch(["--config_file", str(tmp_path / "launch.yaml"), "--num_processes", "2",
            os.path.join(SCRIPTS, "clip_worker.py"), str(out)], tmp_path, timeout=300)
    for rank in range(2):
        result = torch.load(out / f"rank{rank}.pt", weights_only=True)
        if kind == "MULTI_CPU" and torch.cuda.device_count() >= 2:
            kind = "MULTI_GPU"  # DDP on GPUs where there are some
        assert result["distributed_type"] == kind and "world_size=2" in result["strategy"]
        assert result["finite"]  # the seed's loop ran to the end
        for max_norm in (0.05, 1e6):
            returned, expected = result[f"norm {max_norm}"]
            assert returned == pytest.approx(expected, rel=1e-5)  # the step's total norm, before clipping
            assert result[f"update difference {max_norm}"] < 1e-6  # the update is the hand-clipped one
        # Measured on the update (SGD, lr=1): clipped to 0.05, and not clipped when max_norm is above the norm.
        assert expected > 0.5
        assert result["update norm 0.05"] == pytest.approx(0.05, rel=1e-4)
        assert result["update norm 1000000.0"] == pytest.approx(expected, rel=1e-4)
        if kind == "DEEPSPEED":
            assert "clips by norm only" in result["clip_grad_value_"]
            assert "gradient_clipping=0.5" in result["stated clipping"] and result["stated clipping agrees"]
        else:
            assert result["clip_grad_value_"] == "clamped"
