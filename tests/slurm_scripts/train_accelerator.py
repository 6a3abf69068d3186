"""The Accelerator's training script for the SLURM tests (tests/test_slurm.py), settings as in train.py:
SLURM_TEST_OUT (project_dir and facts-rank<R>.json), SLURM_TEST_STEPS (optimizer steps, default 24),
SLURM_TEST_SLEEP (seconds per step), SLURM_TEST_MARK (rank 0 writes <out>/step-<N>.mark after that step)."""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import regression_data  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from tasktrain import Accelerator, ProjectConfiguration, seed_everything  # noqa: E402

out = os.environ["SLURM_TEST_OUT"]
steps = int(os.environ.get("SLURM_TEST_STEPS", "24"))
sleep = float(os.environ.get("SLURM_TEST_SLEEP", "0"))
mark = int(os.environ.get("SLURM_TEST_MARK", "0"))

seed_everything(0)
accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=out))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(regression_data(64), batch_size=4, shuffle=True)  # 8 steps per epoch on 2 processes
model, optimizer, data = accelerator.prepare(model, optimizer, data)
epochs = -(-steps * accelerator.num_processes * 4 // 64)
done = 0
for epoch in range(data.epoch, epochs):  # data.epoch: where a resumed run continues
    for x, y in data:
        if sleep:
            time.sleep(sleep)
        optimizer.zero_grad()
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        done += 1
        if mark and done == mark and accelerator.is_main_process:
            open(os.path.join(out, f"step-{mark}.mark"), "w").close()
params = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]).tolist()
facts = dict(rank=accelerator.process_index, world=accelerator.num_processes, steps_here=done,
             restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0), params=[float.hex(v) for v in params])
with open(os.path.join(out, f"facts-rank{accelerator.process_index}.json"), "w") as f:
    json.dump(facts, f)
print(f"rank {accelerator.process_index} of {accelerator.num_processes}: done after {done} steps here", flush=True)
