"""The Accelerator under FSDP, beyond api_worker.py's names: run by api_worker.py when it is launched with Accelerate's
FSDP YAML (tests/test_accelerator_api.py), in the same 2 processes, and on its own on 1 process (`python
fsdp_cases.py OUT_DIR`: the 2-process save_state loaded on 1, then one_process_more's checks).

- the same loop (accumulation 2, clipping to 0.2, Adam, a scheduler) under DDP and under FSDP: per-batch losses,
  norms and final weights; the reduce-scatters counted per micro-batch; prepare's arguments in reverse order
- FullyShardedDataParallelPlugin (reshard_after_forward=False, wrap by class name) in the same loop
- save_state in the middle of an epoch, a fresh Accelerator load_state, the rest of the run: as the straight one
- an optimizer prepared before its model; one over a model never prepared (refused at its step)
- init_module(empty_init=True): built on the meta device, each rank allocates its shard only
"""
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Accelerator, FullyShardedDataParallelPlugin

COUNTS = {"reduce_scatter": 0}
_reduce_scatter = dist.reduce_scatter_single


def _counted(*args, **kwargs):
    COUNTS["reduce_scatter"] += 1
    return _reduce_scatter(*args, **kwargs)


dist.reduce_scatter_single = _counted  # FSDP2 reduces gradients through it


def net():
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 3))


def build(seed=0):
    torch.manual_seed(seed)
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)),
                      batch_size=8, shuffle=True)
    return model, optimizer, data, scheduler


def loop(acc, model, optimizer, data, scheduler, epochs=2, stop_after=None, save_to=None):
    """Per micro-batch: loss, reduce-scatters so far; per step: the norm before clipping. Returns the whole weights
    at the end (every rank calls get_state_dict), or None after save_state at micro-batch `stop_after`."""
    losses, scatters, norms, done = [], [], [], 0
    for _ in range(data.epoch, epochs):
        for x, y in data:
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                norm = acc.clip_grad_norm_(model.parameters(), 0.2)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            scatters.append(COUNTS["reduce_scatter"])
            if norm is not None:
                norms.append(float(norm))
            done += 1
            if done == stop_after:
                acc.save_state(save_to)
                return {"losses": losses, "norms": norms, "weights": None}
    weights = {k: v.detach().clone() for k, v in acc.get_state_dict(model).items()}
    return {"losses": losses, "scatters": scatters, "norms": norms, "weights": weights}


def two_processes(out_dir):
    out = {}
    ddp = Accelerator(strategy="ddp", gradient_accumulation_steps=2)
    out["ddp"] = loop(ddp, *ddp.prepare(*build()))
    # The launch config's FSDP; the objects given to prepare in reverse order (the model last).
    fsdp = Accelerator(gradient_accumulation_steps=2)
    out["strategy"] = fsdp.strategy.describe()
    scheduler, data, optimizer, model = fsdp.prepare(*reversed(build()))
    COUNTS["reduce_scatter"] = 0
    out["fsdp"] = loop(fsdp, model, optimizer, data, scheduler)
    out["unwrapped_is_model"] = fsdp.unwrap_model(model) is model  # fully_shard keeps the module object
    out["local_numel"] = sum(p.to_local().numel() for p in model.parameters())
    out["full_numel"] = sum(p.numel() for p in model.parameters())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plugin = FullyShardedDataParallelPlugin(reshard_after_forward=False, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                transformer_cls_names_to_wrap=["Linear"], use_orig_params=True)
        with_plugin = Accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=2)
    out["plugin_warnings"] = [str(w.message) for w in caught if "FullyShardedDataParallelPlugin" in str(w.message)]
    out["plugin"] = loop(with_plugin, *with_plugin.prepare(*build()))
    out["plugin_wrapped"] = with_plugin.strategy.wrapped_names

    # save_state after 8 micro-batches (4 steps: a third into the second epoch), a fresh Accelerator loads it and
    # finishes the run.
    state_dir = os.path.join(out_dir, "fsdp_state")
    first = Accelerator(gradient_accumulation_steps=2)
    objects = first.prepare(*build())
    out["before_save"] = loop(first, *objects, stop_after=8, save_to=state_dir)
    saved = {k: v.detach().clone() for k, v in first.get_state_dict(objects[0]).items()}
    if first.is_main_process:
        torch.save({"weights": saved, "lr": objects[1].param_groups[0]["lr"]}, os.path.join(out_dir, "saved.pt"))
    torch.manual_seed(1234)  # another random stream: load_state puts the saved one back
    second = Accelerator(gradient_accumulation_steps=2)
    objects = second.prepare(*build(seed=5))  # other initial weights: load_state replaces them
    second.load_state(state_dir)
    out["resumed"] = loop(second, *objects)
    out["state_files"] = sorted(os.listdir(state_dir))

    # An optimizer prepared before its model is pointed at the shards when the model comes.
    torch.manual_seed(0)
    model = net()
    optimizer = fsdp.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model = fsdp.prepare_model(model)
    before = model[0].weight.to_local().clone()
    fsdp.backward(model(torch.randn(4, 8)).sum())
    optimizer.step()
    out["early_optimizer_stepped"] = not torch.equal(before, model[0].weight.to_local())
    orphan = fsdp.prepare_optimizer(torch.optim.SGD(net().parameters(), lr=0.1))
    try:
        orphan.step()
        out["orphan"] = "stepped"
    except ValueError as error:
        out["orphan"] = str(error)

    # Built on the meta device: each rank allocates and initialises its own shard.
    with fsdp.init_module(empty_init=True):
        big = net()
    out["built_on_meta"] = all(p.is_meta for p in big.parameters())
    big, big_optimizer = fsdp.prepare(big, torch.optim.SGD(big.parameters(), lr=0.1))
    fsdp.backward(big(torch.randn(4, 8)).pow(2).mean())
    big_optimizer.step()
    weight = fsdp.get_state_dict(big)["0.weight"]
    out["meta_local_rows"] = big[0].weight.to_local().shape[0]
    out["meta_weight_std"] = float(weight.std())
    out["meta_halves_differ"] = not torch.equal(weight[:16], weight[16:])
    return out


def one_process(out_dir):
    """The state 2 processes saved, loaded on 1 (DCP reshards): the weights and learning rate at the save, and the
    epoch continues from where it stopped."""
    acc = Accelerator(strategy="fsdp", gradient_accumulation_steps=2)
    objects = acc.prepare(*build(seed=5))
    acc.load_state(os.path.join(out_dir, "fsdp_state"))
    saved = torch.load(os.path.join(out_dir, "saved.pt"), weights_only=True)
    loaded = acc.get_state_dict(objects[0])
    difference = max(float((loaded[k] - saved["weights"][k]).abs().max()) for k in saved["weights"])
    lr = objects[1].param_groups[0]["lr"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the global batch changes from 16 to 8: said, and expected here
        rest = loop(acc, *objects)
    return {"difference": difference, "lr": lr, "saved_lr": saved["lr"],
            "steps_after": len(rest["norms"]), "micro_batches_after": len(rest["losses"])}


def one_process_more(out_dir):
    """Also on one process: Accelerator(fsdp_plugin=...) under bf16-mixed (the model's own forward under autocast,
    outputs in fp32); an optimizer without per-parameter state (SGD) saved and loaded; an optimizer over the
    original parameters prepared after its model; prepare(torch.compile(model)); a model built under
    init_empty_weights. Checked here (an assert ends the run with an error)."""
    from tasktrain import init_empty_weights

    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(reshard_after_forward=False), mixed_precision="bf16")
    assert acc.distributed_type == "FSDP" and acc.strategy.reshard_after_forward is False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out = model(torch.randn(3, 4))
    assert out.dtype == torch.float32, out.dtype
    acc.backward(out.pow(2).mean())
    assert float(acc.clip_grad_norm_(model.parameters(), 1.0)) > 0
    optimizer.step()
    saved = acc.get_state_dict(model)
    state_dir = os.path.join(out_dir, "sgd_state")
    acc.save_state(state_dir)
    optimizer.param_groups[0]["lr"] = 5.0
    with torch.no_grad():
        model[0].weight.mul_(0)
    acc.load_state(state_dir)
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert all(torch.equal(v, saved[k]) for k, v in acc.get_state_dict(model).items())

    late = torch.nn.Linear(4, 4)
    late_optimizer = torch.optim.SGD(late.parameters(), lr=0.1)  # over the original parameters
    late = acc.prepare(late)
    late_optimizer = acc.prepare(late_optimizer)  # after its model: pointed at the shards
    held = [p for g in late_optimizer.param_groups for p in g["params"]]
    assert all(type(p).__name__ == "DTensor" for p in held)
    assert sorted(map(id, late.parameters())) == sorted(map(id, held))

    compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)), backend="eager")
    inner = acc.prepare(compiled)  # the module inside is sharded, its forward compiled in place
    assert type(inner).__name__ == "FSDPSequential" and acc.unwrap_model(inner) is compiled._orig_mod
    assert inner(torch.randn(2, 4)).shape == (2, 1) and sorted(acc.get_state_dict(inner))[0] == "0.bias"

    with init_empty_weights():
        empty = torch.nn.Linear(4, 4)  # parameters on the meta device
    empty = acc.prepare(empty)  # each rank's shard allocated and initialised (reset_parameters)
    assert 0 < float(acc.get_state_dict(empty)["weight"].abs().max()) < 1
    return True


if __name__ == "__main__":
    result = one_process(sys.argv[1])
    result["more"] = one_process_more(sys.argv[1])
    torch.save(result, os.path.join(sys.argv[1], "one_process.pt"))
