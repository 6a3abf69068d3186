"""Run under `tasktrain launch --num_processes 2` (tests/test_accelerator.py): the issue's snippet with DDP, the same
with accumulate(), the Trainer on the same model/data/seed, gather_for_metrics, no_sync and a save_state/load_state
resume. Writes OUT_DIR/rank{R}.pt with what it measured; the test asserts on it."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import MyModel, accelerator_loop, make_dataset, max_difference, trainer_run
from tasktrain import Accelerator, seed_everything

out_dir = sys.argv[1]
result = {}

# The snippet, then the Trainer on the same model, data and seed (the process group is shared, not re-made).
seed_everything(0)
accelerator = Accelerator()
result["strategy"] = accelerator.strategy.name
result["world_size"] = accelerator.num_processes
result["rank"] = accelerator.process_index
plain = accelerator_loop(accelerator)
if accelerator.is_main_process:
    accelerator.save(plain, os.path.join(out_dir, "model.pt"))
result["plain"] = plain
result["plain_vs_trainer"] = max_difference(plain, trainer_run())

seed_everything(0)
accumulating = Accelerator(gradient_accumulation_steps=2)
accumulated = accelerator_loop(accumulating, accumulate=True)
result["accumulate_vs_trainer"] = max_difference(accumulated, trainer_run(accumulate=2))

# no_sync: on a micro-batch that does not step, each rank keeps its own gradient; on the one that steps, DDP averages.
model = MyModel(dropout=0.0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(make_dataset(64), batch_size=8)
model, optimizer, data = accumulating.prepare(model, optimizer, data)
grads_equal = []
for step, (source, targets) in enumerate(data):
    with accumulating.accumulate(model):
        accumulating.backward(F.cross_entropy(model(source), targets))
        grad = accumulating.unwrap_model(model).net[0].weight.grad.flatten()
        both = accumulating.gather(grad).reshape(2, -1)
        grads_equal.append(bool(torch.equal(both[0], both[1])))
        optimizer.step()
        optimizer.zero_grad()
    if step == 3:
        break
result["grads_equal_per_micro_batch"] = grads_equal

# gather_for_metrics: 37 samples on 2 ranks are refilled to 48 (Accelerate's order); the metric must see each sample
# exactly once.
indices = TensorDataset(torch.arange(37))
for shuffle in (False, True):
    loader = accelerator.prepare(DataLoader(indices, batch_size=8, shuffle=shuffle))
    seen, gathered_plain = [], 0
    for (batch,) in loader:
        seen.append(accelerator.gather_for_metrics(batch))
        gathered_plain += accelerator.gather(batch).numel()
    result[f"metrics_shuffle={shuffle}"] = torch.cat(seen).tolist()
    result[f"gather_count_shuffle={shuffle}"] = gathered_plain
result["reduce_sum"] = float(accelerator.reduce(torch.tensor(float(accelerator.process_index + 1)), "sum"))


# save_state / load_state: stop 1 epoch + 1 batch in, save, rebuild everything, load, finish; compare to straight.
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
            optimizer.step()
            scheduler.step()
            done += 1
            if done == stop_after:
                acc.save_state(save_to)
                return
    return {k: v.detach().clone() for k, v in acc.get_state_dict(model).items()}


resume_dir = os.path.join(out_dir, "state")
seed_everything(3)
first = Accelerator()  # a fresh Accelerator per run, as a fresh process would have
straight = train(first, *build(first), epochs=3)
seed_everything(3)
second = Accelerator()
train(second, *build(second), epochs=3, stop_after=5, save_to=resume_dir)
torch.manual_seed(1234)  # a different stream: load_state must put it back
third = Accelerator()
objects = build(third)
third.load_state(resume_dir)
result["resume_epoch"] = objects[2].epoch
resumed = train(third, *objects, epochs=3)
result["resume_difference"] = max_difference(straight, resumed)

torch.save(result, os.path.join(out_dir, f"rank{accelerator.process_index}.pt"))
