"""A worker for tests/test_launch.py: trains a tiny TaskModule with Trainer(strategy="auto", precision=None)
under `tasktrain launch`, so every choice comes from the launcher's variables. Writes OUT_DIR/rank{R}.json."""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain.trainer.module import TaskModule
from tasktrain.trainer.trainer import Trainer

out_dir = sys.argv[1]


class Tiny(TaskModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model = Tiny()
trainer = Trainer(strategy="auto", precision=None, max_epochs=1, logger=False, enable_progress_bar=False,
                  enable_checkpointing=False, default_root_dir=out_dir)
trainer.fit(model, DataLoader(data, batch_size=4))

seen = {
    "world_size": trainer.world_size,
    "global_rank": trainer.global_rank,
    "precision": trainer.precision,
    "global_step": trainer.global_step,
    "expected_steps": 32 // 4 // trainer.world_size,  # each rank sees its half of the data
    "weights": [round(v, 6) for v in model.layer.weight.detach().flatten().tolist()],
}
with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump(seen, f)
