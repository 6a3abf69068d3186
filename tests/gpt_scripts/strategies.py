"""Under `tasktrain launch --num_processes 2`: examples/gpt.py's short form with the Trainer on each strategy, then
examples/gpt_accelerator.py's on each of its strategies, one after the other in the same two processes and process
group. Each rank writes OUT.rank{R}.json.

    tasktrain launch --num_processes 2 strategies.py OUT ROOT
"""
import functools
import gc
import json
import os
import sys

import torch
from common import SHORT

import gpt
import gpt_accelerator

from tasktrain.strategies.deepspeed.engine import import_deepspeed

# Test time only: DeepSpeed imported up front, then everything imported frozen out of the garbage collector, so that
# the full collection of each engine's teardown walks only what the runs made, not every module (~0.15 s of CPU less
# each).
import_deepspeed()
gc.freeze()

# The cases share their data (the same digits, sizes and seed): made once per process, not once per case (the
# example's pure-Python encoding of 30,500 sums: ~1.5 s of CPU a call, on both processes, seven times). The example's
# own function, called once; the data sets are only read, so every case still trains on exactly the same sums.
gpt.addition_data = gpt_accelerator.addition_data = functools.lru_cache(gpt.addition_data)

# (strategy, precision)
TRAINER_CASES = [("ddp", "32-true"), ("fsdp", "32-true"), ("deepspeed_stage_2", "bf16-mixed"),
                 ("deepspeed_stage_3", "32-true")]
ACCELERATOR_CASES = [("ddp", "32-true"), ("fsdp", "32-true"), ("deepspeed_stage_2", "32-true")]

# 64 sums per process, 260 steps: the global batch (128) of the one-process short form, at two thirds of the compute
# of 128 per process for 200 steps. Measured (all six cases): exact match 0.126 to 0.912 against the test's 0.05.
# (At 200 steps, DDP in fp32 reached only 0.074 on seed 0 (2026-12-06): 260 for the fp32 cases.)
TWO = [*SHORT, "--batch_size", "64", "--max_steps", "260"]
# bf16-mixed, 200 steps of a 1-layer model: this CPU has no bf16 matrix instructions (AVX2 only), so a bf16 matmul
# costs ~20x an fp32 one (a 2-layer step ~7x: 200 steps measured 64.6 s, against 12.5 s for the Accelerator's ZeRO-2
# in fp32), the costliest case by far; one layer cuts it by a third (rank 0's CPU time for this case alone, start-up
# included: 30 -> 20 s). Measured at 200 steps, 1 layer, over seeds 0-3 (2026-12-06, 2 processes, this case's exact
# arguments; the test runs seed 0): exact match 0.738, 0.802, 0.816, 0.540 against the test's 0.05 (2 layers: 0.802,
# 0.81, 0.438, 0.938; a 32-wide 2-layer model, the other halving, only 0.068 to 0.612).
BF16_STEPS = 200
BF16_MODEL = ["--n_layer", "1"]
out, root = sys.argv[1], sys.argv[2]
results = {}
torch_linear = torch.nn.functional.linear
for strategy, precision in TRAINER_CASES:
    bf16 = precision == "bf16-mixed"
    steps, model = (BF16_STEPS, BF16_MODEL) if bf16 else (260, [])
    trainer, metrics, texts = gpt.main([*TWO, *model, "--max_steps", str(steps), "--strategy", strategy, "--precision",
                                        precision, "--devices", "2", "--root", os.path.join(root, strategy)])
    results[f"Trainer {strategy} {precision}"] = {
        "metrics": metrics, "texts": texts, "world_size": trainer.world_size, "strategy": trainer.strategy.name,
        "global_step": trainer.global_step,
        # ZeRO-3 swaps torch.nn.functional.linear for its own: the strategy's teardown must have put torch's back.
        "torch_linear_after": torch.nn.functional.linear is torch_linear}
for strategy, precision in ACCELERATOR_CASES:
    metrics, weights, texts = gpt_accelerator.main([*TWO, "--strategy", strategy, "--precision", precision])
    results[f"Accelerator {strategy} {precision}"] = {"metrics": metrics, "texts": texts,
                                                      "weight_names": sorted(weights)}
# torch.compile(model) prepared under ZeRO-3: the engine gets the module inside the wrapper, its forward compiled.
# The smallest model, a few steps: this checks that it runs and saves plain names, not what it learns. Compiled by
# the aot_eager backend (dynamo and AOTAutograd, the graphs inductor would be given, run without inductor's build):
# ZeRO-3's hooks split the forward into many graphs, recompiled as the engine's state changes (~50 compiles a rank),
# and inductor's lowering and C++ build of them cost the launch ~35 s of CPU of its ~65 (measured 2026-12-07, cold
# cache, each rank 15.8 -> 11.4 s in-process, g++ all of the rest). The example's --compile on inductor itself is
# test_example_compiled_with_inductor's, in the pytest process.
torch.compile = functools.partial(torch.compile, backend="aot_eager")
TINY = ["--digits", "1", "--n_layer", "1", "--n_embd", "16", "--batch_size", "32", "--max_steps", "6", "--warmup", "2",
        "--train_size", "512", "--val_size", "6", "--samples", "2"]
metrics, weights, texts = gpt_accelerator.main([*TINY, "--strategy", "deepspeed_stage_3", "--compile"])
results["Accelerator deepspeed_stage_3 compiled"] = {"metrics": metrics, "texts": texts,
                                                     "weight_names": sorted(weights)}
with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
    json.dump(results, f)
