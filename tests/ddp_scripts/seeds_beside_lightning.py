"""Helper for tests/test_lightning_beside_ddp_order.py (run by beside_lightning_ddp.py, or alone under torchrun with 2
processes; the test was in tests/test_lightning_beside_seeds.py): the same fit with a
shuffling DataLoader of 2 workers whose Dataset draws random numbers, under Lightning's DDP, then under tasktrain's
in the same process group (seed_everything(workers=True)); each rank writes OUT/rank{R}.json with
the batches each fit trained on and a draw of the main process in each step.

    torchrun --standalone --nproc_per_node 2 seeds_beside_lightning.py OUT
"""
import gc
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_lightning_beside_seeds import Draws  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def main(out, close=True):
    import lightning.pytorch as L

    import tasktrain

    seen = {}
    for name, lib, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        lib.seed_everything(5, workers=True, verbose=False)
        rows = []

        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                rows.append(batch.tolist() + [torch.rand(1).item()])  # (dropout would draw here)
                return self.layer(batch.float()).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.0)

        trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Module(), DataLoader(Draws(), batch_size=2, shuffle=True, num_workers=2))
        seen[name] = rows
        del trainer
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    if close:  # (beside_lightning_ddp.py runs the scripts in turn, and closes the group after the last)
        # Lightning made the group (tasktrain joined it): nothing that holds gloo work may outlive it, then every rank
        # closes it together (FINDINGS.md: gloo aborts at exit otherwise)
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
