"""Helper for tests/test_mpi.py: one of the 4 processes `mpiexec -n 4` starts (MPI's variables only: none of torchrun's,
SLURM's or LSF's), 2 on each of 2 host names. Each runs, in the folder it was started in:

- "docs": the MPI example of docs/distributed.md (the ```python block starting `# train_mpi.py`), as written:
  tasktrain's Trainer(strategy="ddp", devices=2, num_nodes=2, plugins=[MPIEnvironment()]);
- "detected": the same fit without the environment plugin (the Trainer detects MPI), with a CheckpointIO of the
  test's that counts its save_checkpoint calls and a ModelCheckpoint writing into ./ckpt;
- "lightning": Lightning's Trainer on that fit (its connector detects MPI), writing into ./ckpt_lightning;
- "mismatch": Trainer(devices=1, num_nodes=2, plugins=[MPIEnvironment()]).fit(...) (2 processes asked, 4 started):
  the error's type and words;

and records what tasktrain's and Lightning's MPIEnvironment report here (main_address, main_port, world_size,
global_rank, local_rank, node_rank, read in that order on every rank) and their detect(), then writes rank{R}.json.

    mpiexec -n 4 python fit_under_mpiexec.py
"""
import json
import logging
import os
import re
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def getters(environment):
    return [environment.main_address, environment.main_port, environment.world_size(), environment.global_rank(),
            environment.local_rank(), environment.node_rank()]


def seen_after(trainer, model):
    seen = dict(environment=type(trainer.strategy.cluster_environment).__name__,
                trainer=[trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size,
                         trainer.is_global_zero],
                group=[dist.get_rank(), dist.get_world_size()],
                master=[os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]],
                weights=[p.detach().flatten().tolist() for p in model.parameters()])
    dist.destroy_process_group()  # (the next fit forms its own group where its environment says)
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # (set from the environment by the fit: the next one sets its own)
        os.environ.pop(name, None)
    return seen


class DeviceLines(logging.Handler):
    """Counts the "GPU available: ..." notes a library logs at a Trainer's construction (rank 0's, as Lightning's
    rank_zero_info: under mpiexec the rank is MPI's, known once the Trainer's plugins are applied)."""

    def __init__(self, name):
        super().__init__(logging.INFO)
        self.count = 0
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(self)

    def emit(self, record):
        self.count += record.getMessage().startswith("GPU available:")


def docs_example():
    with open(os.path.join(ROOT, "docs", "distributed.md")) as f:
        (code,) = re.findall(r"```python\n(# train_mpi\.py.*?)```", f.read(), re.S)
    namespace = {"__name__": "__main__"}
    exec(compile(code, "docs/distributed.md (train_mpi.py)", "exec"), namespace)
    return seen_after(namespace["trainer"], namespace["model"])


def fit(lib, boring, **kwargs):
    trainer = lib.Trainer(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2, max_steps=3, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, **kwargs)
    torch.manual_seed(0)
    model = boring.BoringModel()
    trainer.fit(model, DataLoader(boring.RandomDataset(32, 16), batch_size=4))
    return trainer, model


def main():
    import lightning.pytorch as pl
    from lightning.pytorch.demos import boring_classes as theirs
    from lightning.pytorch.plugins import TorchCheckpointIO as TheirIO
    from lightning.pytorch.plugins.environments import MPIEnvironment as TheirMPI

    import tasktrain
    from tasktrain.demos import boring_classes as ours
    from tasktrain.plugins import TorchCheckpointIO
    from tasktrain.plugins.environments import MPIEnvironment

    def counting(base):
        class CountingIO(base):
            saves = 0

            def save_checkpoint(self, checkpoint, path, storage_options=None):
                CountingIO.saves += 1
                super().save_checkpoint(checkpoint, path, storage_options)

        return CountingIO()

    seen = {"getters": {"tasktrain": getters(MPIEnvironment()), "lightning": getters(TheirMPI())},
            "detect": [MPIEnvironment.detect(), TheirMPI.detect()]}
    lines = {"tasktrain": DeviceLines("tasktrain"), "lightning": DeviceLines("lightning.pytorch")}
    seen["docs"] = docs_example()  # (the process's first Trainer: no run has told tasktrain its rank yet)
    io = counting(TorchCheckpointIO)
    trainer, model = fit(tasktrain, ours, plugins=[io], callbacks=[tasktrain.callbacks.ModelCheckpoint(dirpath="ckpt")])
    seen["detected"] = dict(seen_after(trainer, model), saves=io.saves)
    io = counting(TheirIO)
    trainer, model = fit(pl, theirs, plugins=[io], callbacks=[pl.callbacks.ModelCheckpoint(dirpath="ckpt_lightning")])
    seen["lightning"] = dict(seen_after(trainer, model), saves=io.saves)
    seen["device_lines"] = [lines["tasktrain"].count, lines["lightning"].count]
    try:
        tasktrain.Trainer(accelerator="cpu", strategy="ddp", devices=1, num_nodes=2, plugins=[MPIEnvironment()],
                          max_steps=1, logger=False, enable_progress_bar=False).fit(
            ours.BoringModel(), DataLoader(ours.RandomDataset(32, 16), batch_size=4))
        seen["mismatch"] = None
    except Exception as err:  # noqa: BLE001 (the type and words are compared)
        seen["mismatch"] = [type(err).__name__, str(err)]
    with open(f"rank{seen['docs']['group'][0]}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
