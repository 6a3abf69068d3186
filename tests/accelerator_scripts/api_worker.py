"""A script in Accelerate's style (only the import changed) that uses every Accelerator name of
docs/accelerator.md's compatibility table. tests/test_accelerator_api.py runs it on one process (python) and on two
(`tasktrain launch` with Accelerate's MULTI_GPU and DEEPSPEED YAMLs). It checks what each process can check itself
(assert: a failure ends the run with an error) and writes OUT_DIR/rank{R}.json with what the test compares across
processes."""
import json
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Accelerator, DistributedType, PartialState, ProfileKwargs, ProjectConfiguration
from tasktrain.utils import broadcast, gather, gather_object, pad_across_processes, reduce, set_seed

out_dir = sys.argv[1]
project = os.path.join(out_dir, "project")
set_seed(0)
accelerator = Accelerator(log_with=["tensorboard", "csv"], gradient_accumulation_steps=2,
                          project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True,
                                                              total_limit=2))
n, rank = accelerator.num_processes, accelerator.process_index
out = {"rank": rank, "num_processes": n}
deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
fsdp = accelerator.distributed_type == DistributedType.FSDP
expected_type = (DistributedType.NO if n == 1 else DistributedType.DEEPSPEED if deepspeed else DistributedType.FSDP
                 if fsdp else DistributedType.MULTI_CPU)
out["distributed_type"] = str(accelerator.distributed_type)
assert accelerator.distributed_type == expected_type and accelerator.state.distributed_type == expected_type
assert accelerator.use_distributed == (n > 1) and accelerator.device.type == "cpu"
assert accelerator.is_main_process == (rank == 0) and accelerator.is_local_main_process == (rank == 0)
assert accelerator.local_process_index == rank and accelerator.mixed_precision == "no"
assert accelerator.project_dir == project and accelerator.logging_dir == project
assert PartialState().process_index == rank and PartialState().num_processes == n

# -- processes ------------------------------------------------------------------------------------------------------
order = []
with accelerator.main_process_first():
    order.append("main_first")
with accelerator.local_main_process_first():
    order.append("local_first")
with accelerator.split_between_processes(list(range(5)), apply_padding=True) as mine:
    out["split"] = mine
with accelerator.split_between_processes({"a": torch.arange(5)}) as mine:
    out["split_dict"] = mine["a"].tolist()


@accelerator.on_main_process
def on_main():
    return "main"


@accelerator.on_last_process
def on_last():
    return "last"


@accelerator.on_process(process_index=n - 1)
def on_index():
    return "index"


@accelerator.on_local_main_process
def on_local_main():
    return "local main"


out["decorated"] = [on_main(), on_last(), on_index(), on_local_main()]
if rank == n - 1:
    accelerator.set_trigger()
out["trigger"] = accelerator.check_trigger()
out["trigger_cleared"] = accelerator.check_trigger()
accelerator.print("printed by the main process only")

# -- collectives ----------------------------------------------------------------------------------------------------
out["gather"] = accelerator.gather(torch.tensor([rank, rank])).tolist()
out["utils_gather"] = gather(torch.tensor([rank])).tolist()
out["gather_object"] = gather_object([f"r{rank}"])
out["broadcast"] = broadcast(torch.tensor([rank + 10])).tolist()
out["reduce"] = accelerator.reduce(torch.tensor(float(rank + 1)), "sum").item()
out["utils_reduce_mean"] = reduce(torch.tensor(float(rank + 1))).item()
padded = accelerator.pad_across_processes(torch.ones(rank + 1), pad_index=-1)
out["padded"] = accelerator.gather(padded).tolist()
out["utils_padded_first"] = pad_across_processes(torch.ones(rank + 1), pad_first=True).tolist()

# -- training: accumulate, no_sync, clipping, autocast, schedulers, trackers ------------------------------------------
accelerator.init_trackers("api", config={"lr": 0.1, "batch_size": 4})
dataset = TensorDataset(torch.randn(22, 4), torch.arange(22))  # 22 samples: the last batch repeats some on 2 processes
model = torch.nn.Linear(4, 3)
if deepspeed:  # one engine from the model and its optimizer: prepared together
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, scheduler = accelerator.prepare(
        model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5))
else:
    model = accelerator.prepare_model(model)
    optimizer = accelerator.prepare_optimizer(torch.optim.SGD(accelerator.unwrap_model(model).parameters(), lr=0.1))
    scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer.optimizer, 1, gamma=0.5))
train = accelerator.prepare_data_loader(DataLoader(dataset, batch_size=4, shuffle=True))
steps, syncs = 0, []
for source, index in train:
    with accelerator.accumulate(model):
        with accelerator.autocast():
            loss = model(source).pow(2).mean()
        accelerator.backward(loss)
        syncs.append(accelerator.sync_gradients)
        norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        assert (norm is None) == (not accelerator.sync_gradients)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        steps += accelerator.sync_gradients
    accelerator.log({"loss": loss.item()}, step=steps)
out["syncs"] = syncs
out["lr"] = scheduler.get_last_lr()[0]
if fsdp:  # FSDP keeps a no_sync gradient in its own unsharded buffer (param.grad stays None): no reduce-scatter
    from fsdp_cases import COUNTS

    scatters = COUNTS["reduce_scatter"]
    with accelerator.no_sync(model):
        accelerator.backward(model(torch.full((2, 4), rank + 1.0)).sum())
    out["no_sync_differs"] = COUNTS["reduce_scatter"] == scatters and accelerator.unwrap_model(model).weight.grad is None
    accelerator.backward(model(torch.full((2, 4), rank + 1.0)).sum())  # this one reduces (both backwards' sum)
    out["no_sync_differs"] &= COUNTS["reduce_scatter"] == scatters + 1
    optimizer.zero_grad()
    # zero_grad drops a no_sync gradient too, as under DDP: the next synced backward reduces its own only
    with accelerator.no_sync(model):
        accelerator.backward(model(torch.full((2, 4), rank + 1.0)).sum())
    optimizer.zero_grad()
    accelerator.backward(model(torch.full((2, 4), 3.0)).sum())
    after_no_sync = accelerator.unwrap_model(model).weight.grad.full_tensor().clone()
    optimizer.zero_grad()
    accelerator.backward(model(torch.full((2, 4), 3.0)).sum())
    out["no_sync_differs"] &= torch.equal(after_no_sync, accelerator.unwrap_model(model).weight.grad.full_tensor())
    optimizer.zero_grad()
elif not deepspeed:  # (DeepSpeed's engine holds the gradients in its own partitions)
    with accelerator.no_sync(model):
        accelerator.backward(model(torch.full((2, 4), rank + 1.0)).sum())  # no all-reduce: each keeps its own
    local = accelerator.unwrap_model(model).weight.grad.clone()
    out["no_sync_differs"] = bool((accelerator.gather(local[None]) != local).any()) if n > 1 else True
    optimizer.zero_grad()
else:
    out["no_sync_differs"] = True
tb = accelerator.get_tracker("tensorboard", unwrap=True)
out["tracker"] = type(tb).__name__ if accelerator.is_main_process else type(accelerator.get_tracker("csv")).__name__

# -- evaluation: gather_for_metrics on tensors and on lists of objects, skip_first_batches ---------------------------
evaluation = accelerator.prepare(DataLoader(dataset, batch_size=4))
seen, names = [], []
for source, index in evaluation:
    seen += accelerator.gather_for_metrics(index).tolist()
    names += accelerator.gather_for_metrics([f"s{i}" for i in index.tolist()], use_gather_object=True)
out["gather_for_metrics"] = seen
out["gather_for_metrics_objects"] = names
skipped = accelerator.skip_first_batches(evaluation, 2)
out["skipped_first"] = next(iter(skipped))[1].tolist()
if fsdp:  # torch's Join takes DDP modules: as Accelerate, a warning and the block runs without it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model]):
            pass
    assert any("cannot join uneven inputs" in str(w.message) for w in caught)
elif not deepspeed:  # torch's Join takes DDP modules
    with accelerator.join_uneven_inputs([model]):
        model(torch.randn(1, 4)).sum().backward()

# -- saving: save_state with automatic names and total_limit, register_for_checkpointing, save_model ------------------
class Counter:
    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


counter = Counter()
accelerator.register_for_checkpointing(counter)
for i in range(3):
    counter.count = i
    accelerator.save_state()
accelerator.wait_for_everyone()
out["checkpoints"] = sorted(os.listdir(os.path.join(project, "checkpoints")))
counter.count = -1
accelerator.load_state()
out["counter"] = counter.count
out["save_iteration"] = accelerator.save_iteration
accelerator.save_model(model, os.path.join(out_dir, "model"), safe_serialization=True)
portable = os.path.join(out_dir, "portable")
try:
    accelerator.save_state(portable, layout="accelerate")  # Accelerate's files (tests/test_accelerate_layout.py)
    counter.count = -1
    accelerator.load_state(portable)
    out["portable"] = sorted(os.listdir(portable)) + [counter.count]
except ValueError as error:  # DeepSpeed and FSDP keep the weights in their shards
    out["portable"] = str(error)
if fsdp:
    import fsdp_cases

    fsdp_results = fsdp_cases.two_processes(out_dir)
    torch.save(fsdp_results, os.path.join(out_dir, f"fsdp_rank{rank}.pt"))

# -- profile --------------------------------------------------------------------------------------------------------
with accelerator.profile(ProfileKwargs(output_trace_dir=os.path.join(out_dir, "traces"))):
    model(torch.randn(2, 4))
out["order"] = order
accelerator.end_training()
accelerator.free_memory()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
