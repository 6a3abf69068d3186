"""Run under `tasktrain launch --num_processes 2 --use_deepspeed --zero_stage 2 --gradient_clipping 1.0`
(tests/test_accelerator.py): the issue's snippet on DeepSpeed's engine, its accumulate() form against the Trainer on
the same engine, and a save_state/load_state resume. Writes OUT_DIR/rank{R}.pt; the test asserts on it."""
import gc
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common import MyModel, accelerator_loop, make_dataset, max_difference, trainer_run
from tasktrain import Accelerator, DeepSpeed, seed_everything
from tasktrain.strategies.deepspeed.engine import import_deepspeed

# Test time only: DeepSpeed imported up front, then everything imported frozen out of the garbage collector, so that
# the full collection of each engine's teardown walks only what the runs made, not every module (~0.15 s of CPU less
# each, 8 per rank).
import_deepspeed()
gc.freeze()

out_dir = sys.argv[1]
result = {}

seed_everything(0)
accelerator = Accelerator()
result["strategy"] = accelerator.strategy.describe()
result["world_size"] = accelerator.num_processes
# The snippet: prepare returns the engine, and backward / step / clipping go to it.
plain, engine = accelerator_loop(accelerator, return_model=True)
result["plain"] = plain
result["engine"] = f"{type(accelerator.unwrap_model(engine)).__name__} in {type(engine).__name__}"
if accelerator.is_main_process:
    accelerator.save(accelerator.get_state_dict(engine), os.path.join(out_dir, "model.pt"))

# The same engine under the Trainer: the same parameters (the Trainer gets its clipping from the launch config).
result["plain_vs_trainer"] = max_difference(plain, trainer_run())


# accumulate(): 50 samples per rank in batches of 32 make 2 micro-batches, a window of 3 cut short at the loader's
# end: the engine is told where the window ends, as the Trainer tells it. (The core Accelerator with Accelerate's
# rule, which is also the Trainer's, Lightning's: the short window's loss / 3; its default "own" divides by 2.)
from tasktrain.trainer.accelerator import Accelerator as CoreAccelerator  # noqa: E402

seed_everything(0)
accumulated = accelerator_loop(CoreAccelerator(gradient_accumulation_steps=3, window_loss="steps"), accumulate=True)
result["accumulate_vs_trainer"] = max_difference(accumulated, trainer_run(accumulate=3))

# ZeRO-3: the unwrapped model's own state dict holds placeholders; save refuses it, get_state_dict gathers.
zero3 = Accelerator(strategy=DeepSpeed(stage=3, gradient_clipping=1.0))
model = MyModel()
model, _ = zero3.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
try:
    zero3.save(zero3.unwrap_model(model).state_dict(), os.path.join(out_dir, "placeholders.pt"))
    result["placeholder_error"] = None
except ValueError as err:
    result["placeholder_error"] = str(err)
gathered = zero3.get_state_dict(model)  # every rank calls it: the partitions are gathered
result["zero3_shapes"] = {k: list(v.shape) for k, v in gathered.items()}
zero3.save(gathered, os.path.join(out_dir, "zero3.pt"))

# save_state / load_state through the engine's own checkpoint.
def build(acc):
    torch.manual_seed(5)
    model = MyModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    data = DataLoader(make_dataset(), batch_size=16, shuffle=True)
    return acc.prepare(model, optimizer, data, scheduler)


def train(acc, model, optimizer, data, scheduler, epochs, stop_after=None, save_to=None):
    done = 0
    for epoch in range(data.epoch, epochs):
        for source, targets in data:
            optimizer.zero_grad()
            acc.backward(F.cross_entropy(model(source), targets))
            acc.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            done += 1
            if done == stop_after:
                acc.save_state(save_to)
                return
    return acc.get_state_dict(model)


resume_dir = os.path.join(out_dir, "state")
seed_everything(3)
first = Accelerator()
straight = train(first, *build(first), epochs=2)
seed_everything(3)
second = Accelerator()
train(second, *build(second), epochs=2, stop_after=5, save_to=resume_dir)
torch.manual_seed(1234)
third = Accelerator()
objects = build(third)
third.load_state(resume_dir)
result["resume_epoch"] = objects[2].epoch
resumed = train(third, *objects, epochs=2)
result["resume_difference"] = max_difference(straight, resumed)

torch.save(result, os.path.join(out_dir, f"rank{accelerator.process_index}.pt"))
