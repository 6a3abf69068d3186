"""Run under `tasktrain launch` with a MULTI_CPU/MULTI_GPU or a DEEPSPEED launch YAML that leaves clipping unset
(tests/test_accelerator_clipping.py). The seed's loop as written (clip_grad_norm_(model.parameters(), 1.0) every
step), then one measured step per max_norm: the update the engine applied and the norm returned, against a
hand computation on the whole batch in one process. Writes OUT_DIR/rank{R}.pt."""
import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common import accelerator_loop, make_dataset
from tasktrain import Accelerator, seed_everything

out_dir = sys.argv[1]
result = {}

seed_everything(0)
accelerator = Accelerator()  # everything from the launch YAML
result["strategy"] = accelerator.strategy.describe()
result["distributed_type"] = str(accelerator.distributed_type)
state = accelerator_loop(accelerator)  # the seed's loop: clip_grad_norm_(model.parameters(), 1.0) at every step
result["finite"] = all(bool(torch.isfinite(v.float()).all()) for v in state.values())

for max_norm in (0.05, 1e6):  # clipping active / inactive
    acc = Accelerator(mixed_precision="no")  # fp32, for an exact comparison
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    reference = copy.deepcopy(model)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    data = DataLoader(make_dataset(8), batch_size=4)  # 2 processes x one batch of 4
    model, optimizer, data = acc.prepare(model, optimizer, data)
    norms = []
    for source, targets in data:
        acc.backward(F.cross_entropy(model(source), targets) * acc.gradient_accumulation_steps)
        norms.append(acc.clip_grad_norm_(model.parameters(), max_norm))
        optimizer.step()
    after = {k: v.float() for k, v in acc.get_state_dict(model).items()}
    # By hand, in one process: the whole batch's mean loss (what the processes' averaged gradients are).
    source, targets = make_dataset(8).tensors
    F.cross_entropy(reference(source), targets).backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    result[f"norm {max_norm}"] = (None if norms[0] is None else float(norms[0]), float(expected_norm))
    result[f"update norm {max_norm}"] = float(torch.cat([(after[k] - v).flatten() for k, v in before.items()]).norm())
    result[f"update difference {max_norm}"] = max(float((after[k] - v).abs().max())
                                                 for k, v in reference.state_dict().items())

# clip_grad_value_: clamps under DDP; a clear error under DeepSpeed (it clips by norm only).
acc = Accelerator(mixed_precision="no")
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
model, optimizer = acc.prepare(model, optimizer)
acc.backward(model(torch.randn(4, 8, dtype=next(acc.unwrap_model(model).parameters()).dtype)).sum())
try:
    acc.clip_grad_value_(model.parameters(), 0.01)
    result["clip_grad_value_"] = "clamped"
except ValueError as error:
    result["clip_grad_value_"] = str(error)

# A clipping the run states (here DeepSpeed(gradient_clipping=0.5)) is the engine's: another max_norm is an error.
if accelerator.distributed_type == "DEEPSPEED":
    from tasktrain import DeepSpeed

    acc = Accelerator(mixed_precision="no", strategy=DeepSpeed(stage=2, gradient_clipping=0.5))
    model = torch.nn.Linear(8, 3)
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    acc.backward(model(torch.randn(4, 8)).sum())
    try:
        acc.clip_grad_norm_(model.parameters(), 1.0)
        result["stated clipping"] = None
    except ValueError as error:
        result["stated clipping"] = str(error)
    result["stated clipping agrees"] = float(acc.clip_grad_norm_(model.parameters(), 0.5)) > 0
acc.end_training()
torch.save(result, os.path.join(out_dir, f"rank{accelerator.process_index}.pt"))
