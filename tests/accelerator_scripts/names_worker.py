"""Accelerate's names of its own test scripts, on the processes `tasktrain launch` starts (tests/test_accelerate_names.py
runs it on 2): reduce max/min, debug mode's shape checks, copy_tensor_to_devices, synchronize_rng_states,
GradientState over a prepared loader, an assigned distributed_type, trigger_sync_in_backward, destroy_process_group.
Each rank writes what it saw to OUT/rank{i}.json."""
import json
import os
import sys
import warnings

os.environ["ACCELERATE_DEBUG_MODE"] = "1"  # before anything reads it: debug mode comes from the environment

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from tasktrain.accelerator import Accelerator, GradientAccumulationPlugin  # noqa: E402
from tasktrain.state import GradientState, PartialState  # noqa: E402
from tasktrain.utils import DistributedType, copy_tensor_to_devices, synchronize_rng_states  # noqa: E402
from tasktrain.utils.operations import (DistributedOperationException, broadcast, gather,  # noqa: E402
                                        pad_across_processes, reduce)

out = sys.argv[1]
accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
state = PartialState()
rank = state.process_index
result = {"debug_from_env": state.debug, "distributed_type": str(state.distributed_type)}

# -- reduce max / min ---------------------------------------------------------------------------------------------
t = torch.tensor([1.0 + rank, 4.0 - rank])  # rank 0 [1, 4], rank 1 [2, 3]
result["max"], result["min"] = reduce(t, "max").tolist(), reduce(t, "min").tolist()
result["accelerator_max"] = accelerator.reduce(t, "max").tolist()

# -- debug mode: equal shapes pass, different ones raise on every process --------------------------------------------
result["gather_same_shapes"] = gather(t).tolist()
result["pad_same_ndim"] = pad_across_processes(torch.arange(3 + rank)).tolist()  # pads dim 0: allowed
bad = torch.zeros(1, 5) if rank == 0 else torch.zeros(1, 1, 6)  # another number of dimensions
worse = torch.zeros(1, 5) if rank == 0 else torch.zeros(1, 2, 5)
raised = {}
for name, call in [("pad_across_processes", lambda: pad_across_processes({"tensor": bad}, dim=0)),
                   ("reduce", lambda: reduce({"tensor": worse})),
                   ("broadcast", lambda: broadcast({"tensor": worse})),
                   ("gather", lambda: gather(worse)),
                   ("accelerator.gather", lambda: accelerator.gather(worse)),
                   ("accelerator.reduce", lambda: accelerator.reduce(worse))]:
    try:
        call()
        raised[name] = None
    except DistributedOperationException as error:
        raised[name] = str(error)
result["raised"] = raised
state.debug = False
result["debug_off"] = PartialState().debug

# -- copy_tensor_to_devices: only rank 0 holds it -----------------------------------------------------------------
copied = copy_tensor_to_devices(torch.tensor([1, 2, 3], dtype=torch.int) if rank == 0 else None)
result["copied"], result["copied_dtype"] = copied.tolist(), str(copied.dtype)

# -- synchronize_rng_states ---------------------------------------------------------------------------------------
torch.manual_seed(100 + rank)
generator = torch.Generator().manual_seed(7 + rank)
result["rng_before"] = torch.rand(2).tolist()
synchronize_rng_states(["torch", "generator"], generator=generator)
result["rng_after"] = torch.rand(2).tolist()
result["generator_after"] = torch.rand(2, generator=generator).tolist()

# -- GradientState over a prepared loader ---------------------------------------------------------------------------
loader = accelerator.prepare(DataLoader(list(range(10)), batch_size=2))
view = accelerator.gradient_state
result["before_loop"] = [view.active_dataloader is None, view.in_dataloader, view.end_of_dataloader, view.remainder]
steps = []
for batch in loader:
    with accelerator.accumulate():
        steps.append({"active": view.active_dataloader is loader, "in": view.in_dataloader,
                      "end": view.end_of_dataloader, "remainder": view.remainder, "sync": view.sync_gradients,
                      "global_view_end": GradientState().end_of_dataloader, "num_steps": view.num_steps})
result["steps"], result["batches"] = steps, len(loader)
result["after_loop"] = [view.active_dataloader is None, view.in_dataloader, view.end_of_dataloader, view.remainder]

# -- an assigned distributed_type: what join_uneven_inputs decides from ---------------------------------------------
model = accelerator.prepare(torch.nn.Linear(2, 1))
accelerator.state.distributed_type = DistributedType.FSDP
result["assigned"] = [str(accelerator.distributed_type), str(PartialState().distributed_type)]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with accelerator.join_uneven_inputs([model]):
        pass
result["join_warning"] = [str(w.message) for w in caught]
accelerator.state.distributed_type = DistributedType.MULTI_CPU

# -- trigger_sync_in_backward: forwards under no_sync, only the last backward all-reduces -----------------------------
torch.manual_seed(0)
losses = []
for i in range(2):
    with accelerator.no_sync(model):
        losses.append(model(torch.full((3, 2), float(rank + i + 1))).sum())
accelerator.backward(losses[0])
local = [p.grad.clone() for p in model.parameters()]
result["grads_differ_before"] = any(not torch.equal(g[0], g[1]) for g in (gather(x[None]) for x in local))
with accelerator.trigger_sync_in_backward(model):
    accelerator.backward(losses[1])
result["grads_equal_after"] = all(torch.equal(g[0], g[1]) for g in (gather(p.grad[None]) for p in model.parameters()))

# -- save_state into a folder of each process's own (a tempfile per rank): refused on every rank, nothing written --
own = os.path.join(out, f"own_folder_{rank}")
try:
    accelerator.save_state(own)
    result["own_folders"] = None
except ValueError as error:
    result["own_folders"] = [str(error), os.path.exists(own)]

# -- the end -------------------------------------------------------------------------------------------------------
state.destroy_process_group()
result["destroyed"] = not torch.distributed.is_initialized()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
