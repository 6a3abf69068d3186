"""The benchmark scripts run (--quick) and print the tables docs/benchmarks.md shows.

No time is asserted here (times belong to the scripts and to docs/benchmarks.md); what is asserted is the shape
of the tables and what must hold on any machine: the Trainer, with its defaults or with everything off, ends
with exactly the raw loop's loss (same weights, same batches, same order), and importing the Trainer pulls in no
heavy optional package.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIME = re.compile(r"^\d+(\.\d+)? (us|ms)$")
RATIO = re.compile(r"^\d+\.\d{3}x( \(\d+\.\d{2}-\d+\.\d{2}\))?$")
SECONDS = re.compile(r"^\d+\.\d{3} s$")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One torch thread for this file's in-process runs: `make test` runs two pytest workers on the 2-core
    machine, and a second torch thread per worker mostly waits for the other worker (measured, the two
    bit-for-bit GPT runs: 13.6 -> 6.6 CPU-s, pytest's start included). Their comparisons are within this
    process: the thread count changes none of them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_quick(script, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT") and not k.startswith("TASKTRAIN_")}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--quick", *args],
                         capture_output=True, text=True, timeout=280, env=env)
    assert out.returncode == 0, f"{script} --quick failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stdout


def markdown_table(stdout):
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in stdout.splitlines() if line.startswith("|")]
    assert len(rows) >= 3, f"no markdown table in:\n{stdout}"
    header, separator, body = rows[0], rows[1], rows[2:]
    assert all(cell == "---" for cell in separator) and len(separator) == len(header)
    assert all(len(row) == len(header) for row in body), body
    return header, body


@pytest.mark.timeout(300)
def test_overhead_quick_table_and_equal_losses():
    # Tinier than --quick (the table's shape and the equal losses need no size): 60 small steps, a 256-wide medium.
    header, body = markdown_table(run_quick("overhead.py", "--small-steps", "60", "--medium-width", "256"))
    assert header == ["workload", "variant", "wall per step", "wall ratio (range)", "CPU per step",
                      "CPU ratio (range)", "fit (wall)", "final loss = raw"]
    ours = ["raw PyTorch loop", "tasktrain, defaults + self.log", "tasktrain, all off"]
    small = [row[1] for row in body if row[0] == "small"]
    medium = [row[1] for row in body if row[0] == "medium"]
    assert small[:4] == ours + ["tasktrain, all off + self.log"]
    assert medium[:3] == ours
    for row in body:
        workload, variant, wall, wall_ratio, cpu, cpu_ratio, fit, same_loss = row
        assert TIME.match(wall) and TIME.match(cpu), row
        assert RATIO.match(wall_ratio) and RATIO.match(cpu_ratio), row
        assert re.match(r"^\d+\.\d{2} s$", fit), row
        # Same seed, same batches in the same order: the Trainer must land on the raw loop's loss, bit for bit.
        assert same_loss == "yes", row
    for row in body:
        if row[1] == "raw PyTorch loop":
            assert row[3].startswith("1.000x") and row[5].startswith("1.000x"), row


@pytest.mark.timeout(300)
def test_startup_quick_table_and_light_import():
    stdout = run_quick("startup.py")
    header, body = markdown_table(stdout)
    assert header == ["measure", "raw PyTorch", "tasktrain", "tasktrain - raw"]
    assert [row[0] for row in body] == [
        "`import torch`, then `import tasktrain`",
        "`import torch`, then `from tasktrain import Trainer, TaskModule`",
        "process start to first optimizer step",
        "process start to exit (fit of one step)",
    ]
    for name, raw, ours, diff in body:
        assert SECONDS.match(raw) and SECONDS.match(ours), (name, raw, ours)
        assert re.match(r"^[+-]\d+\.\d{3} s$", diff), (name, diff)
    pulled = re.search(r"imports beyond torch: (.*)\.$", stdout, re.M)
    assert pulled, stdout
    # The Trainer's import stays light: these load only when a run needs them (first log, first bar, ZeRO).
    for heavy in ("tensorboard", "tqdm", "deepspeed", "lightning", "accelerate"):
        assert heavy not in pulled.group(1).split(", "), pulled.group(1)


# -- benchmarks/gpt.py ----------------------------------------------------------------------------------------------
def gpt_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpt_benchmark", os.path.join(ROOT, "benchmarks", "gpt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
@pytest.mark.parametrize("accumulate", [1, 2])
def test_gpt_trainer_and_accelerator_end_bit_for_bit_on_the_hand_written_loop(accumulate):
    """The benchmark's three loops, in fp32 on one process: same model, data, order, AdamW, schedule, clipping and
    accumulation, so the same final parameters, bit for bit (the learning rate is high enough that clipping
    cuts the gradients: the order in which the norm sums them matters there). Run as the benchmark runs them:
    the Trainer's fit drives, one step of each loop in turn."""
    bench = gpt_benchmark()
    gpt = bench.example()
    cfg = {"digits": 2, "n_layer": 1, "n_head": 4, "n_embd": 32, "lr": 3e-2, "lr_warmup": 2, "micro_batch": 16,
           "accumulate": accumulate, "steps": 6, "fresh_steps": 2, "threads": 1, "precision": "32-true",
           "compile": False, "strategy": None}
    train, _ = gpt.addition_data(2, 16 * accumulate * 7, 10, seed=0)
    result = bench.lockstep(cfg, gpt, train)
    assert {name: len(times) for name, times in result["times"].items()} == {"raw": 6, "trainer": 6, "accelerator": 6}
    assert result["same"] == {"raw": True, "trainer": True, "accelerator": True}
    assert len(set(result["losses"].values())) == 1, result["losses"]


@pytest.mark.world_size(2)
@pytest.mark.timeout(400)
def test_gpt_quick_table():
    # The 2-process setting only (the 1-process loops run in the test above): 4 launched pairs, a tiny GPT.
    stdout = run_quick("gpt.py", "--settings", "ddp", "--n_layer", "1", "--n_embd", "32", "--micro_batch", "16")
    header, body = markdown_table(stdout)
    assert header == ["setting", "variant", "tokens/s", "ratio to (a) (range)", "CPU per step", "CPU ratio (range)",
                      "first step", "peak RSS", "final loss", "= (a)"]
    assert [(row[0], row[1]) for row in body] == [
        ("ddp", "(a) hand-written loop, DDP"), ("ddp", "(b) Trainer, ddp"), ("ddp", "(c) Accelerator, ddp")]
    for row in body:
        assert re.match(r"^[\d,]+$", row[2]) and RATIO.match(row[3]) and RATIO.match(row[5]), row
        assert re.match(r"^\d+\.\d ms$", row[4]) and re.match(r"^\d+\.\d{2} s$", row[6]), row
        assert re.match(r"^\d+ MB$", row[7]), row
        # Same seed, data, order and arithmetic (DDP's all-reduce included): the same parameters, bit for bit.
        assert row[9] == "yes", row
    assert "machine:" in stdout and "load average" in stdout


@pytest.mark.timeout(300)
def test_stream_quick_reports_resume_latency_and_tokens_per_second():
    stdout = run_quick("stream.py")
    assert re.search(r"resume latency, \d+ of \d+ items consumed \(90%\): ShardedStream [\d.]+ ms, skipping by "
                     r"reading [\d.]+ ms", stdout), stdout
    for name in ("map-style, in memory, 0 workers", "stream, files, 0 workers", "map-style, in memory, 2 workers",
                 "stream, files, 2 workers"):
        assert re.search(rf"tokens/s, {name}: [\d.]+M", stdout), stdout


def test_async_checkpoint_quick_table():
    """benchmarks/async_checkpoint.py: the stall, the sync save and the disk's speed, all measured in one run."""
    header, body = markdown_table(run_quick("async_checkpoint.py"))
    assert header == ["measure", "value"]
    values = dict(body)
    assert SECONDS.match(values["sync save (training waits for it)"])
    assert SECONDS.match(values["async save: training stall (staging)"])
    assert SECONDS.match(values["async save: background write until renamed"])
    assert re.match(r"^\d+\.\d{3}x$", values["stall ratio (async stall / sync save)"])
    assert re.match(r"^\d+\.\d{3}x$", values["sync save throughput / disk write speed"])
    assert values["disk sequential write (same bytes, fsync)"].endswith(" MB/s")
