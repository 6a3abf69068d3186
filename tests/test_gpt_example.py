"""examples/gpt.py and examples/gpt_accelerator.py: a real transformer, trained by the Trainer and by the Accelerator.

The short form (tests/gpt_scripts/common.py: 2 layers, 64 wide, 2-digit sums, 200 steps of 128 sums per process)
learns addition in a sudden transition whose step varies with the seed and the numerics: measured on one process
over 8 seeds and batch sizes 128 and 256, held-out exact match after 200 steps was 0.12 to 0.99 (median ~0.7), and
the validation loss 0.07 to 0.68, from ln(13) = 2.56 for a model that knows nothing. Every strategy must reach at
least 0.05 exact match and at most 1.0 validation loss. An untrained model gets ~0.001 of the sums right (three
digits out of ten, each) and one that learned only the answer's format (leading digit 0 or 1, the full stop)
~0.01: 0.05 needs addition learned, and leaves room for a strategy's different numerics (bf16, two processes
doubling the global batch and so changing which sums make a batch).

The 2-process runs are one launched pair running every strategy in turn, so the processes and the process group
start once; each process takes 64 sums a step (the one-process global batch of 128) for 260 steps (tests/gpt_scripts/
strategies.py: measured 0.126 to 0.912 exact match over its six cases), 200 for the bf16-mixed case, on a 1-layer model
(bf16 is emulated on this CPU, ~7x the cost of a 2-layer step; measured over seeds 0-3 at 200 steps, 1 layer: 0.540 to
0.816).
"""
import functools
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = os.path.join(HERE, "gpt_scripts")
sys.path.insert(0, SCRIPTS)
from common import SHORT  # noqa: E402  (also puts examples/ on sys.path)

import gpt  # noqa: E402
import gpt_accelerator  # noqa: E402

MIN_EXACT_MATCH = 0.05
MAX_VAL_LOSS = 1.0
SUM = re.compile(r"^\d\d\+\d\d=")


def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TASKTRAIN_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK"))}
    env["TASKTRAIN_CONFIG_DIR"] = str(tmp_path / "config_dir")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # two processes on two cores: one thread each
    return env


def run(command, tmp_path, timeout):
    """Run in its own session; killed with its children if it overruns."""
    proc = subprocess.Popen(command, cwd=tmp_path, env=clean_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
        pytest.fail(f"{command} did not finish within {timeout} s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-6000:]
    return output


def check_trained(name, metrics, texts, samples=4):
    assert metrics["val_exact_match"] >= MIN_EXACT_MATCH, (name, metrics)
    assert metrics["val_loss"] <= MAX_VAL_LOSS, (name, metrics)
    # Generation at the end: every prompt continued by the answer's three tokens and a full stop.
    assert len(texts) == samples and all(SUM.match(t) and len(t) == 10 for t in texts), (name, texts)


# -- one process ----------------------------------------------------------------------------------------------------
def plain_loop(argv):
    """examples/gpt_accelerator.py's loop in plain PyTorch on one process, reading the batches the Accelerator's
    prepared loader reads (Accelerate's order on one process: the shuffling DataLoader's own, its sampler drawing
    from torch's global generator at each epoch, as Accelerate's prepared loader does); returns the weights."""
    import argparse

    from torch.utils.data import DataLoader

    from tasktrain import seed_everything

    args = gpt.add_arguments(argparse.ArgumentParser()).parse_args(argv)
    seed_everything(args.seed)
    train, val = gpt.addition_data(args.digits, args.train_size, args.val_size, seed=args.seed)
    model = gpt.GPT(gpt.VOCAB_SIZE, gpt.block_size(args.digits), args.n_layer, args.n_head, args.n_embd)
    optimizer = gpt.configure_adamw(model, args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: gpt.lr_factor(step, args.warmup, args.max_steps))
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)  # draws from the global generator
    val_loader = DataLoader(val, batch_size=500)
    step = 0
    model.train()
    while step < args.max_steps:
        for x, y in train_loader:
            _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step == args.max_steps:
                break
        else:
            for _ in val_loader:  # the example evaluates here: its loader draws a base seed, as this one does
                pass
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.mark.timeout(300)
def test_one_process_trainer_and_accelerator_train_and_the_accelerator_is_a_plain_loop_bit_for_bit(tmp_path,
                                                                                                   monkeypatch):
    torch.set_num_threads(1)
    # The three runs read the same sums: made once, not three times (the example's pure-Python encoding: ~1.5 s of CPU
    # a call); the data sets are only read, so each run still trains on exactly the sums it would make itself.
    cached = functools.lru_cache(gpt.addition_data)
    monkeypatch.setattr(gpt, "addition_data", cached)
    monkeypatch.setattr(gpt_accelerator, "addition_data", cached)
    trainer, metrics, texts = gpt.main([*SHORT, "--root", str(tmp_path / "trainer")])
    assert (trainer.strategy.name, trainer.world_size, trainer.global_step) == ("single_device", 1, 200)
    check_trained("auto", metrics, texts)
    # The Accelerator version reads Accelerate's order (the Trainer's interleaves over processes): the same weights
    # as the same loop in plain PyTorch over the plain DataLoader's batches, bit for bit.
    accelerator_metrics, weights, accelerator_texts = gpt_accelerator.main(SHORT)
    check_trained("Accelerator", accelerator_metrics, accelerator_texts)
    plain = plain_loop(SHORT)
    assert sorted(weights) == sorted(plain) == sorted(trainer.module.model.state_dict())
    assert all(torch.equal(weights[name], plain[name]) for name in plain)


@pytest.mark.timeout(400)
def test_example_compiled_with_inductor(tmp_path):
    """--compile with torch.compile's default backend (inductor), on the smallest model for a few steps (the
    Trainer's and the Accelerator's compile paths are tested in detail, and faster, in tests/test_compile.py)."""
    import torch._dynamo

    torch.set_num_threads(1)
    tiny = ["--digits", "1", "--n_layer", "1", "--n_embd", "16", "--batch_size", "32", "--max_steps", "8",
            "--warmup", "2", "--train_size", "256", "--val_size", "6", "--samples", "2", "--compile"]
    torch._dynamo.reset()
    trainer, metrics, texts = gpt.main([*tiny, "--root", str(tmp_path)])
    assert torch._dynamo.utils.counters["frames"]["ok"] >= 1  # dynamo compiled the module's forward
    assert trainer.module._compiled_call_impl is None  # and the module is as it was given, after the run
    assert trainer.global_step == 8 and metrics["val_loss"] < 2.56
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path,
                            weights_only=True)
    assert sorted(checkpoint["state_dict"]) == sorted(trainer.module.state_dict())
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])


# -- two processes --------------------------------------------------------------------------------------------------
@pytest.mark.world_size(2)
@pytest.mark.timeout(600)
def test_every_strategy_on_two_processes(tmp_path):
    out = tmp_path / "out"
    run([sys.executable, "-m", "tasktrain.cli.main", "launch", "--num_processes", "2",
         os.path.join(SCRIPTS, "strategies.py"), str(out), str(tmp_path / "runs")], tmp_path, timeout=540)
    ranks = [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in (0, 1)]
    assert list(ranks[0]) == [
        "Trainer ddp 32-true", "Trainer fsdp 32-true", "Trainer deepspeed_stage_2 bf16-mixed", "Trainer deepspeed_stage_3 32-true",
        "Accelerator ddp 32-true", "Accelerator fsdp 32-true", "Accelerator deepspeed_stage_2 32-true",
        "Accelerator deepspeed_stage_3 compiled"]
    compiled = ranks[0].pop("Accelerator deepspeed_stage_3 compiled")
    assert compiled["weight_names"] == sorted(gpt.GPT(block_size=gpt.block_size(1), n_layer=1, n_embd=16).state_dict())
    assert compiled["metrics"]["val_loss"] < 2.56 and len(compiled["texts"]) == 2
    names = sorted(gpt.GPT().state_dict())
    for case, result in ranks[0].items():
        print(case, result["metrics"])
        api, strategy, _ = case.split()
        check_trained(case, result["metrics"], result["texts"])
        # Both ranks report the same held-out metrics (each sum counted once over the two shards).
        assert ranks[1][case]["metrics"] == result["metrics"], case
        if api == "Trainer":
            steps = 200 if case.endswith("bf16-mixed") else 260  # (strategies.py: bf16's cases run 200 steps)
            assert (result["world_size"], result["global_step"]) == (2, steps), (case, result)
            assert result["strategy"] == strategy.split("_stage")[0], (case, result["strategy"])
            assert result["torch_linear_after"], case
        else:
            assert result["weight_names"] == names, case  # the whole model, gathered, with plain names
    # (The Accelerator reads Accelerate's order, whole batches per process, and the Trainer its own interleaved one,
    # so their numbers differ here; on one process the Accelerator's loop is a plain loop bit for bit, above.)
