"""scripts/gpu_check.py on CPU: every check's CPU twin, the table, the exit code, how it installs on a GPU machine.

Every check in CHECKS is run here by one of three lists (a new check without a twin in them fails the first
test): the single-process twins and the multi-process ones are called in this process (each multi-process twin
starts its own ranks, but those of TOGETHER, whose workers share one launch), `ddp` goes through main(), as on the
GPU machine: a process for the check, its ranks, the table.
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


SINGLE_PROCESS = ["placement", "fp16", "bf16", "bf16-true", "dp", "accelerator", "dispatch", "cp"]
MULTI_PROCESS = ["ddp-launch", "fsdp-bf16", "fsdp-fp16", "zero2", "zero3", "watchdog", "compile", "gpt-bench",
                 pytest.param("tp", marks=pytest.mark.world_size(4))]
THROUGH_MAIN = ["ddp"]
# Twins whose workers run one after the other in one `tasktrain launch` of two processes (gpu_check's
# run_workers_together), not each in its own launch: check name -> its worker. Each check still judges its own
# worker's facts; ~5 s of CPU of imports per process saved, eight processes in all. (On a GPU, main() keeps one
# process per check.)
TOGETHER = {"ddp-launch": "ddp", "fsdp-bf16": "fsdp-bf16-mixed", "fsdp-fp16": "fsdp-16-mixed", "zero2": "deepspeed-2",
            "zero3": "deepspeed-3"}


@pytest.fixture(scope="module")
def twins_together(gpu_check, tmp_path_factory):
    gpu_check.run_workers_together(list(TOGETHER.values()), str(tmp_path_factory.mktemp("twins")), 400)
    yield
    gpu_check.PREPARED.clear()


def test_every_check_has_its_twin_run_here(gpu_check):
    names = [getattr(name, "values", [name])[0] for name in MULTI_PROCESS]
    assert sorted(SINGLE_PROCESS + names + THROUGH_MAIN) == sorted(gpu_check.CHECKS)


@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_single_process_twins_pass(gpu_check, name):
    status, detail = gpu_check.CHECKS[name][1]("cpu")
    assert status == "pass", detail


@pytest.mark.world_size(2)
@pytest.mark.timeout(420)  # (a check's own bound on the GPU machine is TIMEOUT = 360 s)
@pytest.mark.parametrize("name", MULTI_PROCESS)
def test_multi_process_twins_pass(gpu_check, name, monkeypatch, request):
    monkeypatch.setattr(gpu_check, "HEADLINE", [])
    if name in TOGETHER:
        request.getfixturevalue("twins_together")
        assert TOGETHER[name] in gpu_check.PREPARED  # (the check below uses that run's facts, once)
    status, detail = gpu_check.CHECKS[name][1]("cpu")
    assert status == "pass", detail
    if name == "gpt-bench":  # the headline rows main() prints: the three loops, tokens/s, no MFU without a peak
        rows = gpu_check.HEADLINE
        assert [r["variant"] for r in rows] == ["raw", "trainer", "accelerator"]
        assert all(r["tokens_per_s"] > 0 and r["flops_per_step"] > 0 and r["mfu"] is None for r in rows)
    if name == "watchdog":
        assert "rank 1 hung in training_step" in detail


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


def test_the_gpu_machine_gets_no_torch_from_this_checkout(gpu_check, monkeypatch, tmp_path):
    """setup.py pins the CPU machines' torch: the GPU machine keeps its own. --fetch-wheels asks pip for no torch
    and nothing's dependencies; the documented one-call command installs only those wheels, offline, without
    dependencies, and never the checkout itself (`pip install -e .` would bring the pin)."""
    calls = []
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda cmd, **kwargs: calls.append(cmd))
    monkeypatch.setattr(gpu_check, "WHEELS", str(tmp_path))
    gpu_check.fetch_wheels()
    assert len(calls) == 2 and all("--no-deps" in cmd for cmd in calls)
    asked = [arg for cmd in calls for arg in cmd if "==" in arg]
    assert "deepspeed==0.19.8" in asked and not [a for a in asked if a.lower().startswith("torch")]
    text = open(os.path.join(ROOT, "docs", "benchmarks.md")).read()
    start = text.index("```bash", text.index("**The one call.**")) + len("```bash")
    command = text[start:text.index("```", start)].strip()
    assert f"(one line, {len(command)} characters)" in text and len(command) <= 2000  # the run tool's limit
    installs = [part.strip() for part in command.split("&&") if "pip install" in part]
    assert installs == ["python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "
                        "/tmp/site .gpu_wheels/*.whl"]
    assert "PYTHONPATH=$PWD:/tmp/site" in command and "scripts/gpu_check.py" in command
