"""The training script the SLURM tests run (tests/test_slurm.py): a tiny regression with the Trainer, ddp on CPU.

Settings come from the environment (sbatch passes it to the job), so that docs/slurm.md's sbatch scripts run it
as they stand (`srun python train.py`):
    SLURM_TEST_OUT      folder for facts-rank<R>.json and the run's default_root_dir
    SLURM_TEST_DEVICES  Trainer(devices=...) ("auto" unless set); SLURM_TEST_NODES  Trainer(num_nodes=...)
    SLURM_TEST_STEPS    max_steps (default 12); SLURM_TEST_SLEEP  seconds per step (time to send a signal)
    SLURM_TEST_MARK     after this step rank 0 writes <out>/step-<N>.mark, which the test waits for
"""
import json
import os
import socket
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import Linear, regression_data  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from tasktrain import Trainer, seed_everything  # noqa: E402

out = os.environ["SLURM_TEST_OUT"]
sleep = float(os.environ.get("SLURM_TEST_SLEEP", "0"))
mark = int(os.environ.get("SLURM_TEST_MARK", "0"))


class Slow(Linear):
    def training_step(self, batch, batch_idx):
        if sleep:
            time.sleep(sleep)
        if mark and self.trainer.global_step == mark and self.trainer.is_global_zero:
            open(os.path.join(out, f"step-{mark}.mark"), "w").close()
        return super().training_step(batch, batch_idx)


class Statuses:
    """A logger of Lightning's interface (no base class) that keeps what finalize heard, per rank and job start:
    <out>/finalize-rank<R>.txt, one status per line."""
    save_dir = None

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_graph(self, model, input_array=None):
        pass

    def save(self):
        pass

    def finalize(self, status):
        rank = os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))
        with open(os.path.join(out, f"finalize-rank{rank}.txt"), "a") as f:
            f.write(status + "\n")


devices = os.environ.get("SLURM_TEST_DEVICES", "auto")
nodes = os.environ.get("SLURM_TEST_NODES")
trainer = Trainer(strategy="ddp", accelerator="cpu", devices=int(devices) if devices.isdigit() else devices,
                  num_nodes=int(nodes) if nodes else None, max_steps=int(os.environ.get("SLURM_TEST_STEPS", "12")),
                  log_every_n_steps=1, logger=Statuses(), enable_progress_bar=False, enable_checkpointing=False,
                  num_sanity_val_steps=0, default_root_dir=out)
seed_everything(0)
module = Slow()
# 64 samples, 4 per process and step: 8 steps per epoch on 2 processes, so 12 steps cross an epoch boundary.
trainer.fit(module, DataLoader(regression_data(64), batch_size=4, shuffle=True))
params = torch.cat([p.detach().flatten() for p in module.parameters()]).tolist()
facts = dict(rank=trainer.global_rank, world=trainer.world_size, local_rank=trainer.local_rank,
             node_rank=trainer.node_rank, num_nodes=trainer.num_nodes, launcher=trainer.strategy.env.launcher,
             host=os.environ.get("SLURMD_NODENAME", socket.gethostname()), step=trainer.global_step,
             restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0), params=[float.hex(v) for v in params])
with open(os.path.join(out, f"facts-rank{trainer.global_rank}.json"), "w") as f:
    json.dump(facts, f)
print(f"rank {trainer.global_rank} of {trainer.world_size}: done at step {trainer.global_step}", flush=True)
