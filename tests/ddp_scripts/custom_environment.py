"""Helper for tests/test_lightning_beside_plugins.py: one of 2 processes the test starts itself with a cluster's own
variables (MY_RANK, MY_WORLD, MY_ADDR, MY_PORT; none of torchrun's), each running the same fit under tasktrain and
then Lightning with a ClusterEnvironment of the user's (creates_processes_externally=True). Each process writes
OUT/rank{R}.json: per framework the calls the environment got (in order, with their arguments), the strategy's and the
process group's rank and world size, the MASTER_ADDR/PORT the group was formed with, and the weights after (DDP keeps
them equal on both ranks).

Then the same fit under tasktrain with Lightning's built-in cluster environments (the weights are to be the Lightning
fit's above: the same world of 2; Lightning's own reading of these environments is compared in the test without a
launch), from the variables the test gave the process as each cluster's launcher would (none of torchrun's), in two
phases:

- Kubeflow: MASTER_ADDR, WORLD_SIZE, RANK (one process a "pod": devices=1, num_nodes=2),
  plugins=[KubeflowEnvironment()], MASTER_PORT=MY_KUBEFLOW_PORT (the test's free port).
- LSF: LSB_DJOB_RANKFILE, JSM_NAMESPACE_SIZE / _RANK / _LOCAL_RANK (devices=2 on one host) and LSB_JOBID=MY_JOBID
  (the port is LSB_JOBID % 1000 + 10000); no plugin: LSF is detected.

recorded under "kubeflow" and "lsf": the environment the strategy used, the strategy's and the
group's rank and world size, the MASTER_ADDR/PORT the group was formed with, and the weights after.

    MY_RANK=r MY_WORLD=2 MY_ADDR=127.0.0.1 MY_PORT=p MY_PORT2=q RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MY_KUBEFLOW_PORT=p LSB_DJOB_RANKFILE=f JSM_NAMESPACE_...=... MY_JOBID=j python custom_environment.py OUT
"""
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers
from helpers import recording_environment  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def fit(lib, boring, base, port):
    # the user's cluster: ranks from its own variables; records what the Trainer asks (tests/helpers.py)
    env = recording_environment(base, local_rank=int(os.environ["MY_RANK"]), main_address=os.environ["MY_ADDR"],
                                main_port=port, rank=None, world=None, record_checks=True)
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


KUBEFLOW = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def fit_in_cluster(lib, boring, **kwargs):
    trainer = lib.Trainer(accelerator="cpu", strategy="ddp", max_steps=2, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, **kwargs)
    torch.manual_seed(0)
    model = boring.BoringModel()
    trainer.fit(model, DataLoader(boring.RandomDataset(32, 16), batch_size=4))
    seen = dict(environment=type(trainer.strategy.cluster_environment).__name__,
                strategy=[trainer.strategy.global_rank, trainer.strategy.world_size],
                group=[dist.get_rank(), dist.get_world_size()],
                master=[os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]],
                weights=[p.detach().flatten().tolist() for p in model.parameters()])
    dist.destroy_process_group()  # (the next fit forms its own group where its environment says)
    return seen


def built_in_environments(seen):
    import tasktrain
    from tasktrain.demos import boring_classes as ours
    from tasktrain.plugins.environments import KubeflowEnvironment

    os.environ["MASTER_PORT"] = os.environ["MY_KUBEFLOW_PORT"]
    seen["kubeflow"] = fit_in_cluster(tasktrain, ours, devices=1, num_nodes=2, plugins=[KubeflowEnvironment()])
    for name in KUBEFLOW:  # the LSF phase: only LSF's variables (its environment sets MASTER_ADDR / _PORT itself)
        os.environ.pop(name, None)
    os.environ["LSB_JOBID"] = os.environ["MY_JOBID"]
    seen["lsf"] = fit_in_cluster(tasktrain, ours, devices=2)


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
    dist.destroy_process_group()
    built_in_environments(seen)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
