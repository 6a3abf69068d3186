"""Launched by tests/test_fsdp_loading.py with `tasktrain launch --config_file tests/data/accelerate_fsdp2.yaml`
(FSDP2, fsdp_cpu_ram_efficient_loading: true, Block wrapped): each rank writes what it saw to OUT.rank{R}.pt.

    python loading.py OUT

- "own": a model built as usual with a seed of each rank's own (so the ranks' initial weights differ), prepared:
  after prepare every rank must hold rank 0's weights, its non-persistent buffer too; then 12 SGD steps train it
  as one unsharded process would.
- "init_module": a model built under `with accelerator.init_module():`: rank 0 builds it in memory, rank 1 on the
  meta device; after prepare both hold rank 0's weights.
"""
import sys

import torch

from tasktrain import Accelerator


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x)) + x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(8, 1)
        self.register_buffer("scale", torch.rand(8), persistent=False)  # in no state dict: broadcast all the same

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x * self.scale)


def whole(tensors):
    return {k: v.detach().clone() for k, v in tensors.items()}


out = sys.argv[1]
accelerator = Accelerator()
rank = accelerator.process_index
record = {"strategy": type(accelerator.strategy).__name__,
          "cpu_ram_efficient_loading": accelerator.strategy.cpu_ram_efficient_loading,
          "wrapped": None}

torch.manual_seed(100 + rank)  # each rank its own initial weights
model = Net()
record["own"] = whole(model.state_dict())
record["own_scale"] = model.scale.clone()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
record["wrapped"] = list(accelerator.strategy.wrapped_names)
record["start"] = whole(accelerator.get_state_dict(model))
record["start_scale"] = accelerator.unwrap_model(model).scale.clone()
g = torch.Generator().manual_seed(7)
x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
mine = slice(rank * 8, rank * 8 + 8)  # each rank its half of one batch
losses = []
for _ in range(12):
    loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(float(accelerator.reduce(loss.detach(), "mean")))
record["losses"] = losses
record["trained"] = whole(accelerator.get_state_dict(model))
# The same 12 steps in this one process, unsharded, from rank 0's weights on the whole batch (the ranks' gradients
# are averaged, and the mean of the two halves' losses is the whole batch's): what FSDP must have trained.
reference = Net()
reference.load_state_dict(record["start"])
reference.scale.copy_(record["start_scale"])
plain = torch.optim.SGD(reference.parameters(), lr=0.05)
for _ in range(12):
    torch.nn.functional.mse_loss(reference(x), y).backward()
    plain.step()
    plain.zero_grad()
record["reference"] = whole(reference.state_dict())

torch.manual_seed(200 + rank)
with accelerator.init_module():
    built = Net()
record["built_on_meta"] = any(p.is_meta for p in built.parameters())
record["built"] = {} if record["built_on_meta"] else whole(built.state_dict())
built = accelerator.prepare(built)
record["built_start"] = whole(accelerator.get_state_dict(built))
record["built_scale"] = accelerator.unwrap_model(built).scale.clone()

torch.save(record, f"{out}.rank{rank}.pt")
accelerator.end_training()
