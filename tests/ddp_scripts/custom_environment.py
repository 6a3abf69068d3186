"""Helper for tests/test_lightning_beside_plugins.py: one of 2 processes the test starts itself with a cluster's own
variables (MY_RANK, MY_WORLD, MY_ADDR, MY_PORT; none of torchrun's), each running the same fit under tasktrain and
then Lightning with a ClusterEnvironment of the user's (creates_processes_externally=True). Each process writes
OUT/rank{R}.json: per framework the calls the environment got (in order, with their arguments), the strategy's and the
process group's rank and world size, the MASTER_ADDR/PORT the group was formed with, and the weights after (DDP keeps
them equal on both ranks).

    MY_RANK=r MY_WORLD=2 MY_ADDR=127.0.0.1 MY_PORT=p python custom_environment.py OUT
"""
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def environment_class(base):
    class MyCluster(base):
        """The user's cluster: ranks from its own variables; records what the Trainer asks."""

        def __init__(self, port):
            self.calls, self.port, self._rank, self._world = [], port, None, None

        @property
        def creates_processes_externally(self):
            return True

        @property
        def main_address(self):
            return os.environ["MY_ADDR"]

        @property
        def main_port(self):
            return self.port

        @staticmethod
        def detect():
            return True

        def world_size(self):
            return self._world

        def set_world_size(self, size):
            self.calls.append(["set_world_size", size])
            self._world = size

        def global_rank(self):
            return self._rank

        def set_global_rank(self, rank):
            self.calls.append(["set_global_rank", rank])
            self._rank = rank

        def local_rank(self):
            return int(os.environ["MY_RANK"])

        def node_rank(self):
            return 0

        def validate_settings(self, num_devices, num_nodes):
            self.calls.append(["validate_settings", num_devices, num_nodes])

        def teardown(self):
            self.calls.append(["teardown"])

    return MyCluster


def fit(lib, boring, base, port):
    env = environment_class(base)(port)
    trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", plugins=[env], max_steps=2, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    torch.manual_seed(0)
    model = boring.BoringModel()
    trainer.fit(model, DataLoader(boring.RandomDataset(32, 16), batch_size=4))
    # (calls are kept in order but without repeats of the same call: Lightning reads set_* once per stage too)
    seen = dict(calls=env.calls, strategy=[trainer.strategy.global_rank, trainer.strategy.world_size],
                group=[dist.get_rank(), dist.get_world_size()], master=[os.environ["MASTER_ADDR"],
                                                                         os.environ["MASTER_PORT"]],
                weights=[p.detach().flatten().tolist() for p in model.parameters()])
    return seen


def main():
    out = sys.argv[1]
    rank = int(os.environ["MY_RANK"])
    import tasktrain
    from tasktrain.demos import boring_classes as ours
    from tasktrain.plugins.environments import ClusterEnvironment as Ours

    seen = {"tasktrain": fit(tasktrain, ours, Ours, int(os.environ["MY_PORT"]))}
    dist.destroy_process_group()  # Lightning forms its own group from the environment (it reuses an existing one)

    import lightning.pytorch as pl
    from lightning.pytorch.demos import boring_classes as theirs
    from lightning.pytorch.plugins.environments import ClusterEnvironment as Theirs

    seen["lightning"] = fit(pl, theirs, Theirs, int(os.environ["MY_PORT2"]))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
