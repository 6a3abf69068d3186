"""scripts/gpu_check.py on CPU: the checks' CPU twins that fit the test budget, the table, the exit code.

The multi-process twins (FSDP2, DeepSpeed, tasktrain launch, the watchdog, compile, the GPT benchmark) take minutes
on 2 cores: `python scripts/gpu_check.py --cpu` runs them all (docs/benchmarks.md, "The GPU check"); their engines
are tested by their own test files.
"""
import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "scripts", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_says_skipped(gpu_check, capsys):
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.strip() == "no CUDA device: skipped"


@pytest.mark.parametrize("name", ["placement", "fp16", "bf16", "bf16-true", "dp", "accelerator", "dispatch"])
def test_single_process_twins_pass(gpu_check, name):
    status, detail = gpu_check.CHECKS[name][1]("cpu")
    assert status == "pass", detail


@pytest.mark.world_size(2)
@pytest.mark.timeout(300)
def test_the_table_of_a_check_in_its_own_process_with_two_ranks(gpu_check, tmp_path, capsys):
    # main -> a process for the check -> this script as a worker, self-launching its second rank (gloo)
    out = tmp_path / "result.json"
    assert gpu_check.main(["--cpu", "--only", "ddp", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(c["check"], c["status"]) for c in result["checks"]] == [("DDP self-launch + SyncBatchNorm", "pass")]
    assert "gloo, 2 rank(s) on cpu, cpu, equal weights (self-launched)" in result["checks"][0]["detail"]
    table = capsys.readouterr().out
    assert "1 passed, 0 failed, 0 skipped" in table


def test_a_failed_or_timed_out_check_fails_the_run(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "TIMEOUT", 0.001)
    outcome = gpu_check.run_check("placement", "cpu")
    assert outcome["status"] == "fail" and "timed out" in outcome["detail"]
    monkeypatch.setattr(gpu_check, "run_check", lambda name, accelerator: {
        "status": "fail" if name == "bf16" else "pass", "detail": "seen", "headline": []})
    assert gpu_check.main(["--cpu", "--only", "placement", "bf16"]) == 1
    assert "FAILED: ['bf16-mixed']" in capsys.readouterr().out


def test_a_crashing_check_is_a_failed_one(gpu_check, monkeypatch, tmp_path):
    def crash(accelerator):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setitem(gpu_check.CHECKS, "placement", ("batch placement", crash))
    gpu_check.run_one("placement", "cpu", str(tmp_path / "r.json"))
    outcome = json.loads((tmp_path / "r.json").read_text())
    assert outcome["status"] == "fail" and "illegal memory access" in outcome["detail"]
