"""Helper for tests/test_accelerate_mpi.py: one of the 2 processes that `tasktrain launch --config_file cfg.yaml` starts
through mpirun (the config's mpirun_config.mpirun_hostfile, as Accelerate's launcher): runs the example of
docs/accelerator.md (the ```python block starting `# train_mpi_accelerator.py`) as written, then writes
rank{PMI_RANK}.json in the folder it was started in: the Accelerator's ranks, the variables the launch set, the
weights after training, and the command line of this process; then, the Accelerator's group ended and the variables
put back as mpirun gave them, a Trainer's fit (BoringModel, devices left to "auto"): its environment, ranks, group
and weights ("trainer").

    tasktrain launch --config_file cfg.yaml accelerator_under_launch_mpirun.py
"""
import json
import os
import re
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH_VARS = ("ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_DEBUG_MODE", "MASTER_ADDR",
               "MASTER_PORT", "KMP_AFFINITY", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "TASKTRAIN_LAUNCH",
               "TASKTRAIN_USE_CPU", "TASKTRAIN_NUM_PROCESSES", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "RANK",
               "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")
GIVEN = {}


def trainer_fit():
    from tasktrain import Trainer
    from tasktrain.demos.boring_classes import BoringModel
    from tasktrain.state import AcceleratorState

    torch.distributed.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(GIVEN)  # (as mpirun started the process: no RANK, ... of the Accelerator's)
    torch.manual_seed(0)
    model = BoringModel()
    trainer = Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(model)
    return dict(environment=type(trainer.strategy.cluster_environment).__name__,
                trainer=[trainer.global_rank, trainer.local_rank, trainer.world_size, trainer.num_devices,
                         trainer.strategy.root_device.type],
                group=[torch.distributed.get_rank(), torch.distributed.get_world_size()],
                weights=[p.detach().flatten().tolist() for p in model.parameters()])


def main():
    GIVEN.update(os.environ)
    given = {name: os.environ.get(name) for name in LAUNCH_VARS}
    with open(os.path.join(ROOT, "docs", "accelerator.md")) as f:
        (code,) = re.findall(r"```python\n(# train_mpi_accelerator\.py.*?)```", f.read(), re.S)
    namespace = {"__name__": "__main__"}
    exec(compile(code, "docs/accelerator.md (train_mpi_accelerator.py)", "exec"), namespace)
    accelerator = namespace["accelerator"]
    seen = dict(
        given=given,
        accelerator=[accelerator.process_index, accelerator.num_processes, accelerator.local_process_index,
                     str(accelerator.distributed_type).split(".")[-1]],
        group=[torch.distributed.get_rank(), torch.distributed.get_world_size(), torch.distributed.get_backend()],
        weights=[p.detach().flatten().tolist() for p in accelerator.unwrap_model(namespace["model"]).parameters()],
        argv=[sys.executable] + sys.argv,
        threads=torch.get_num_threads(),
    )
    accelerator.wait_for_everyone()
    seen["trainer"] = trainer_fit()
    with open(f"rank{os.environ['PMI_RANK']}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
