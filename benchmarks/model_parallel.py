"""Tokens/s on a (data_parallel=2, tensor_parallel=2) mesh of 4 processes: a hand-written parallelize_module +
fully_shard loop, the Trainer (ModelParallelStrategy) and the Accelerator (ParallelismConfig), in the same run; and
per-rank bytes of parameters + optimizer state against FSDP2 alone on the same 4 processes.

    python benchmarks/model_parallel.py [--width 256] [--layers 4] [--batch 8] [--seq 64] [--steps 20] [--warmup 5]
    python benchmarks/model_parallel.py --quick      # a tiny model, a few steps: the script runs (tests, CI)

The model: examples/gpt.py's GPT (`--layers` blocks of `--width`, vocabulary 13), random tokens, AdamW, fp32; each
block's MLP split over the tensor-parallel ranks (ColwiseParallel, RowwiseParallel), then fully_shard on the
data-parallel ranks (each block, then the root). `--batch` sequences per data-parallel rank. The Trainer starts the
4 processes (devices=4); the same processes then run the others in turn, repeated (`--repeats`) so that the load of
the machine falls on all of them alike:

    (a) hand-written   init_device_mesh + parallelize_module + fully_shard, a plain loop (the reference)
    (b) Trainer        Trainer(strategy=ModelParallelStrategy(tensor_parallel_size=2)), configure_model as (a)
    (c) Accelerator    Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2)), the loop of (a)
    (d) FSDP2 alone    (a) without parallelize_module, fully_shard over all 4 ranks: memory only

Time: the median of the per-step wall times after `--warmup` steps, measured on rank 0 between barriers; tokens/s =
tokens of one global step (batch x seq x data-parallel ranks) / that time. Memory: the bytes of each rank's local
shards of the parameters and of the optimizer state (DTensor.to_local()), after two steps; the maximum over ranks.
On 2 CPU cores the 4 processes share the cores: the speeds say what the layers around the loop cost, not how fast
tensor parallelism is.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import gpt  # noqa: E402

from tasktrain import Callback, ModelParallelStrategy, TaskModule, Trainer  # noqa: E402


def make_gpt(args):
    torch.manual_seed(0)
    return gpt.GPT(gpt.VOCAB_SIZE, args.seq, args.layers, 4, args.width)


def tp_plan(model, tp):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model.blocks:
        parallelize_module(block.mlp, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def shard(model, dp):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)


def batches(args, n, rank_in_dp):
    g = torch.Generator().manual_seed(100 + rank_in_dp)
    return [torch.randint(0, gpt.VOCAB_SIZE, (args.batch, args.seq + 1), generator=g) for _ in range(n)]


def loss_of(model, tokens):
    logits, _ = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def local_bytes(model, optimizer):
    from torch.distributed.tensor import DTensor

    def size(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = sum(size(p) for p in model.parameters())
    states = sum(size(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return params + states


def timed_loop(step, n, warmup):
    times = []
    for i in range(n):
        dist.barrier()
        start = time.perf_counter()
        step(i)
        dist.barrier()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def hand_written(args, tensor_parallel=True):
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if tensor_parallel:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        dp = mesh["dp"]
    else:
        dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    model = make_gpt(args)
    if tensor_parallel:
        tp_plan(model, mesh["tp"])
    shard(model, dp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(args, args.steps, dp.get_local_rank())

    def step(i):
        loss_of(model, data[i]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = timed_loop(step, args.steps, args.warmup)
    return seconds, local_bytes(model, optimizer), dp.size()


class Module(TaskModule):
    def __init__(self, args):
        super().__init__()
        self.net = make_gpt(args)
        self.parallelized = False

    def configure_model(self):
        if not self.parallelized:
            self.parallelized = True
            tp_plan(self.net, self.device_mesh["tensor_parallel"])
            shard(self.net, self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        return loss_of(self.net, batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class StepTimes(Callback):
    def __init__(self):
        self.times, self.start = [], None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        dist.barrier()
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        dist.barrier()
        self.times.append(time.perf_counter() - self.start)


def trainer_run(args):
    times = StepTimes()
    trainer = Trainer(strategy=ModelParallelStrategy(tensor_parallel_size=2), devices=4, accelerator="cpu",
                      max_steps=args.steps, callbacks=[times], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    module = Module(args)
    data = [b for r in range(2) for b in batches(args, args.steps, r)]  # rank r of 2 reads its own
    loader = torch.utils.data.DataLoader(torch.cat(data), batch_size=args.batch, shuffle=False)
    trainer.fit(module, loader)
    return statistics.median(times.times[args.warmup:]), local_bytes(module, trainer.optimizers[0]), 2


def accelerator_run(args):
    from tasktrain import Accelerator, ParallelismConfig

    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    model = make_gpt(args)
    tp_plan(model, accelerator.torch_device_mesh["tp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = batches(args, args.steps, accelerator.torch_device_mesh["dp"].get_local_rank())

    def step(i):
        accelerator.backward(loss_of(model, data[i]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = timed_loop(step, args.steps, args.warmup)
    return seconds, local_bytes(model, optimizer), 2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.width, args.layers, args.batch, args.seq, args.steps, args.warmup, args.repeats = 32, 1, 2, 8, 4, 1, 1
    torch.set_num_threads(1)
    rows = {}
    for _ in range(args.repeats):
        for name, run in (("(b) Trainer", trainer_run), ("(a) hand-written", hand_written),
                          ("(c) Accelerator", accelerator_run)):
            seconds, nbytes, dp = run(args)
            rows.setdefault(name, []).append((seconds, nbytes, dp))
    _, fsdp_bytes, _ = hand_written(args, tensor_parallel=False)
    peak = [torch.tensor(float(max(r[1] for r in rows[name]))) for name in sorted(rows)] + [torch.tensor(float(fsdp_bytes))]
    for t in peak:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        tokens = args.batch * args.seq * 2
        base = statistics.median(r[0] for r in rows["(a) hand-written"])
        print(f"| run | tokens/s | vs (a) | parameters + optimizer state per rank |")
        print("| --- | --- | --- | --- |")
        for (name, runs), nbytes in zip(sorted(rows.items()), peak):
            seconds = statistics.median(r[0] for r in runs)
            print(f"| {name} | {tokens / seconds:,.0f} | {base / seconds:.3f}x | {nbytes.item() / 2**20:.2f} MiB |")
        print(f"| (d) FSDP2 alone on {dist.get_world_size()} ranks | - | - | {peak[-1].item() / 2**20:.2f} MiB |")


if __name__ == "__main__":
    main()
