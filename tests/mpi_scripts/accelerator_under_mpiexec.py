"""Helper for tests/test_accelerate_mpi.py: one of the 2 processes `mpiexec -n 2` starts on one host (MPI's variables
only: no torchrun's, SLURM's, MASTER_ADDR; MASTER_PORT the test's first free port). Each, in the folder it was started
in, in this order:

- "refused": tasktrain's Accelerator() (no cpu=True): the error's type and words; Accelerate's Accelerator() there:
  its distributed_type and num_processes (a world of one in each process);
- "tasktrain": the example of docs/accelerator.md (the ```python block starting `# train_mpi_accelerator.py`), as
  written: the state of its Accelerator and of PartialState(), the variables it set, the weights after training;
  then the group ends and the environment is put back as mpiexec gave it;
- "accelerate": the same block with Accelerate's Accelerator (MASTER_ADDR 127.0.0.1 and the test's second port, as
  `accelerate launch` would set them);

then writes rank{PMI_RANK}.json.

    mpiexec -n 2 python accelerator_under_mpiexec.py
"""
import json
import os
import re
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def docs_example():
    with open(os.path.join(ROOT, "docs", "accelerator.md")) as f:
        (code,) = re.findall(r"```python\n(# train_mpi_accelerator\.py.*?)```", f.read(), re.S)
    return code


def run(code, where):
    namespace = {"__name__": "__main__"}
    exec(compile(code, where, "exec"), namespace)
    accelerator = namespace["accelerator"]
    state = accelerator.state
    return dict(state=[state.process_index, state.num_processes, state.local_process_index,
                       str(state.distributed_type).split(".")[-1]],
                accelerator=[accelerator.process_index, accelerator.num_processes, accelerator.local_process_index,
                             str(accelerator.distributed_type).split(".")[-1], str(accelerator.device)],
                env={name: os.environ.get(name) for name in WORLD_VARS},
                weights=[p.detach().flatten().tolist() for p in accelerator.unwrap_model(namespace["model"]).parameters()],
                group=[torch.distributed.get_rank(), torch.distributed.get_world_size(),
                       torch.distributed.get_backend()])


def main():
    import accelerate
    from accelerate.state import AcceleratorState as TheirState

    import tasktrain
    from tasktrain.state import AcceleratorState, PartialState

    given = dict(os.environ)
    seen = {}
    try:
        tasktrain.Accelerator()
        seen["refused"] = None
    except Exception as err:  # noqa: BLE001 (the type and words are compared)
        seen["refused"] = [type(err).__name__, str(err)]
    theirs = accelerate.Accelerator()
    seen["accelerate_without_cpu"] = [str(theirs.distributed_type).split(".")[-1], theirs.num_processes]
    del theirs
    TheirState._reset_state(reset_partial_state=True)

    code = docs_example()
    seen["tasktrain"] = run(code, "docs/accelerator.md (train_mpi_accelerator.py)")
    partial = PartialState()
    seen["tasktrain"]["partial"] = [partial.process_index, partial.num_processes, partial.local_process_index,
                                    str(partial.distributed_type).split(".")[-1]]
    partial.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(given)  # (as mpiexec started the process: Accelerate reads MPI's variables afresh)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["SECOND_PORT"])
    code = code.replace("from tasktrain import Accelerator", "from accelerate import Accelerator")
    assert "from accelerate import Accelerator" in code
    seen["accelerate"] = run(code, "train_mpi_accelerator.py under Accelerate")
    seen["accelerate"]["backend"] = accelerate.PartialState().backend
    accelerate.PartialState().destroy_process_group()
    with open(f"rank{os.environ['PMI_RANK']}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
