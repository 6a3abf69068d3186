"""Per-rank memory and steps/s of DDP, FSDP and DeepSpeed ZeRO-3 on the same ~10M-parameter model, 2 processes.

    python benchmarks/fsdp_memory.py [--width 1600] [--layers 4] [--batch 16] [--steps 12] [--warmup 3]
                                     [--repeats 2] [--strategies ddp fsdp fsdp_cpu_offload deepspeed_stage_3]
    python benchmarks/fsdp_memory.py --quick --check   # a 2 x Linear(256, 256) model; checks the shares, exits 1
                                                       # when FSDP's or ZeRO-3's bytes are not DDP's halves

The model: `--layers` x Linear(width, width) (4 x 1600: 10.25M parameters, 39 MiB in fp32), MSE loss, AdamW,
fp32, per-process batch `--batch`, no accumulation, no clipping, through the Trainer on 2 processes (gloo, one
torch thread each). Each strategy runs in its own pair of fresh processes (so that one's freed memory is not
another's), the strategies in turn, `--repeats` times over:

    ddp                 Trainer(strategy="ddp"); the module built whole on every rank
    fsdp                FSDP(wrap={Linear}): each Linear is a unit (gathered for its own forward and backward only);
                        the module built under trainer.init_module(empty_init=True): on the meta device, each rank
                        allocating and initialising its shards only
    fsdp_cpu_offload    the same with cpu_offload=True (on a CPU-only machine: the same memory, another code path)
    deepspeed_stage_3   DeepSpeed(stage=3, zero3_init=True): built partitioned under trainer.init_module(); reduce
                        and all-gather buckets of --bucket elements (DeepSpeed's default of 5e8 would add a 1.9 GiB
                        buffer that the CPU never fills)

What each number is, per rank, counted after the backward of the second optimizer step (the gradients are reduced
and the optimizer state exists), as the bytes of the distinct storages of local tensors (views of one buffer once):

    parameters       the module's parameters: DDP the whole tensors; FSDP each DTensor's local shard
                     (p.to_local()), which is also what the optimizer steps; ZeRO-3 each parameter's partition
                     (p.ds_tensor)
    master weights   ZeRO-3's fp32 partitions that its optimizer steps (fp32_partitioned_groups_flat), a second
                     copy of the partition even in fp32; none under DDP and FSDP (the optimizer steps the parameters)
    gradients        DDP p.grad (whole); FSDP p.grad.to_local() (the reduce-scattered shard); ZeRO-3 every other
                     live tensor the garbage collector sees but the data set (its gradient partitions and buckets,
                     and the batch)
    optimizer state  AdamW's exp_avg / exp_avg_sq / step (FSDP: their local shards; ZeRO-3: of its partitions)
    peak RSS growth  the process's resident-memory high-water mark (VmHWM, reset through /proc/self/clear_refs)
                     (with --fixed-mmap-threshold, under glibc's MALLOC_MMAP_THRESHOLD_=131072: see launch())
                     at the end of the fit, less its RSS just before the module is built: what building, setting
                     up and training the model cost this process, buffers of the engines and of the allocator
                     included (DDP's reducer keeps its own gradient-sized all-reduce buckets, invisible to the
                     tensor counts; FSDP gathers a unit's whole parameters for its forward and backward)
    steps/s          optimizer steps per second of rank 0 after --warmup steps (wall time; the machine's load moves
                     it), and its ratio to DDP's in the same repeat (median over repeats)
    steps/CPU s      the same per second of rank 0's CPU time (all its threads, gloo's included): the work per
                     step, which other programs' load moves less (time spent waiting for the other rank is not in it)

The printed table goes into docs/fsdp.md.
"""
import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tasktrain import FSDP, Callback, DeepSpeed, TaskModule, Trainer, seed_everything  # noqa: E402
from deepspeed_memory import live_tensors  # noqa: E402  (this folder: the same gc walk over live tensors)

MB = 2 ** 20
STRATEGIES = ("ddp", "fsdp", "fsdp_cpu_offload", "deepspeed_stage_3")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


class MLP(TaskModule):
    def __init__(self, width, layers):
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


# -- counting ----------------------------------------------------------------------------------------------------
def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def storages(tensors):
    """{storage pointer: bytes} of the tensors' local storages (views of one storage count once)."""
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = _local(t)
            if t.device.type == "cpu" and not t.is_meta:
                storage = t.untyped_storage()
                if storage.nbytes():
                    out[storage.data_ptr()] = storage.nbytes()
    return out


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM starts again from the current RSS


class Measure(Callback):
    """Tensor bytes after the backward of the second step; the step clock from the end of the warm-up."""

    def __init__(self, warmup, data):
        self.warmup, self.bytes, self.start, self.steps = warmup, None, None, 0
        self.data = storages(data)  # the whole data set, the same under every strategy: not counted

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.start = (time.perf_counter(), time.process_time())

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx >= self.warmup:
            self.steps += 1
            self.seconds = time.perf_counter() - self.start[0]
            self.cpu_seconds = time.process_time() - self.start[1]

    def on_after_backward(self, trainer, module):
        if trainer.global_step != 1 or self.bytes is not None:
            return
        strategy = trainer.strategy
        if isinstance(strategy, DeepSpeed):
            self.bytes = _zero3_bytes(strategy.engine, self.data)
            return
        optimizer = trainer.optimizers[0]
        params = list(module.parameters())
        self.bytes = {"parameters": sum(storages(params).values()), "master weights": 0,
                      "gradients": sum(storages([p.grad for p in params if p.grad is not None]).values()),
                      "optimizer state": sum(storages([v for s in optimizer.state.values()
                                                       for v in s.values()]).values())}


def _zero3_bytes(engine, data):
    basic = engine.basic_optimizer
    held = storages([getattr(p, "ds_tensor", p) for p in engine.module.parameters()])
    zero = engine.optimizer
    copies = [p for g in basic.param_groups for p in g["params"]]
    copies += list(getattr(zero, "fp32_partitioned_groups_flat", []))
    masters = {k: v for k, v in storages(copies).items() if k not in held}
    state = storages([v for s in basic.state.values() for v in s.values()])
    counted = {**held, **masters, **state, **data}
    rest = {k: v for k, v in storages(live_tensors()).items() if k not in counted}
    return {"parameters": sum(held.values()), "master weights": sum(masters.values()),
            "gradients": sum(rest.values()), "optimizer state": sum(state.values())}


# -- one strategy, in its own pair of processes -----------------------------------------------------------------------
def strategy_of(name, bucket):
    if name == "ddp":
        return "ddp"
    if name in ("fsdp", "fsdp_cpu_offload"):
        return FSDP(wrap={torch.nn.Linear}, cpu_offload=name == "fsdp_cpu_offload")
    if name == "deepspeed_stage_3":
        config = {"zero_optimization": {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                                        "stage3_prefetch_bucket_size": bucket,
                                        "stage3_param_persistence_threshold": 0}}
        return DeepSpeed(stage=3, zero3_init=True, gradient_clipping=0.0, config=config)
    raise ValueError(f"unknown strategy {name!r}: use one of {STRATEGIES}")


def run_one(args):
    torch.set_num_threads(1)
    seed_everything(0)
    steps = args.warmup + args.steps
    x = torch.randn(args.batch * 2 * steps, args.width)
    data = TensorDataset(x, x.roll(1, dims=1))
    loader = DataLoader(data, batch_size=args.batch)
    measure = Measure(args.warmup, data.tensors)
    trainer = Trainer(strategy=strategy_of(args.one, args.bucket), devices=2, accelerator="cpu", max_steps=steps,
                      logger=False, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, num_sanity_val_steps=0, callbacks=[measure])
    # The processes, the process group and the engines' imports come first: they are not the model's memory.
    trainer.strategy.setup_environment()
    engines = ["deepspeed"] if args.one.startswith("deepspeed") else ["torch.distributed.fsdp",
                                                                      "torch.distributed.checkpoint"]
    for name in engines:
        importlib.import_module(name)
    gc.collect()
    _reset_peak()
    before = _rss()
    with trainer.init_module(empty_init=True):
        module = MLP(args.width, args.layers)
    trainer.fit(module, loader)
    peak_growth = _peak() - before
    numel = args.layers * (args.width * args.width + args.width)
    mine = {**measure.bytes, "peak RSS growth": peak_growth, "steps/s": measure.steps / measure.seconds,
            "steps/CPU s": measure.steps / measure.cpu_seconds,
            "numel": numel}
    ranks = trainer.strategy.all_gather_object(mine)
    if trainer.is_global_zero:
        with open(args.result, "w") as f:
            json.dump(ranks, f)


# -- the driver -----------------------------------------------------------------------------------------------------
def launch(args, name, result):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    env["OMP_NUM_THREADS"] = "1"
    if args.fixed_mmap_threshold:
        # glibc raises its mmap threshold after each large free (up to 32 MiB), so later buffers come from the heap,
        # where freed pieces of other sizes stay resident: a fixed threshold maps every buffer of 128 KiB or more and
        # returns it at once, showing what the strategy itself holds at its peak.
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    command = [sys.executable, os.path.abspath(__file__), "--one", name, "--result", result,
               "--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--bucket", str(args.bucket)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    with open(result) as f:
        return json.load(f)


def check(rows):
    """The shares any machine must show: FSDP and ZeRO-3 hold half of DDP's parameters, gradients and optimizer
    state per rank (to within the padding of a shard and a few small buffers)."""
    problems = []
    ddp = rows["ddp"][0][0]
    for name, runs in rows.items():
        if name == "ddp":
            continue
        for rank, measured in enumerate(runs[0]):
            # ZeRO-3's gradient count holds its buckets too (see the docstring): only its shares that are exact
            kinds = ("parameters", "optimizer state") if name.startswith("deepspeed") else \
                ("parameters", "gradients", "optimizer state")
            for kind in kinds:
                share = measured[kind] / ddp[kind]
                if not 0.45 < share < 0.56:
                    problems.append(f"{name} rank {rank}: {kind} {measured[kind]} bytes, {share:.3f} of DDP's")
    return problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="samples per process and step")
    p.add_argument("--steps", type=int, default=12, help="timed optimizer steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--bucket", type=int, default=3_000_000, help="ZeRO-3 reduce/all-gather bucket (elements)")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--quick", action="store_true", help="2 x Linear(256, 256), 1 repeat of 3 steps")
    p.add_argument("--check", action="store_true", help="exit 1 unless the sharded strategies hold DDP's halves")
    p.add_argument("--fixed-mmap-threshold", action="store_true",
                   help="run the workers with MALLOC_MMAP_THRESHOLD_=131072 (glibc): the peak RSS without the heap's "
                        "retained pieces")
    p.add_argument("--out", default=None, help="write the measurements as JSON here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a worker pair: one strategy
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return run_one(args)
    if args.quick:
        args.width, args.layers, args.steps, args.warmup, args.repeats = 256, 2, 3, 2, 1
    if "ddp" not in args.strategies:
        args.strategies.insert(0, "ddp")  # the reference of the ratios

    rows = {name: [] for name in args.strategies}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in args.strategies:
                rows[name].append(launch(args, name, os.path.join(tmp, f"{name}-{repeat}.json")))
    numel = rows["ddp"][0][0]["numel"]
    print(f"\n{numel / 1e6:.2f}M parameters ({args.layers} x Linear({args.width}, {args.width}), fp32 = "
          f"{numel * 4 / MB:.1f} MiB), AdamW, 2 processes x batch {args.batch}; MiB per rank (rank 0 / rank 1); "
          f"steps/s: median of {args.repeats} repeat(s) of {args.steps} steps"
          f"{'; MALLOC_MMAP_THRESHOLD_=131072' if args.fixed_mmap_threshold else ''}\n")
    kinds = ["parameters", "master weights", "gradients", "optimizer state"]
    print(f"| strategy | {' | '.join(kinds)} | total | peak RSS growth | steps/s | ratio to DDP | steps/CPU s | "
          "ratio to DDP |")
    print("|---|" + "---|" * (len(kinds) + 6))
    for name, runs in rows.items():
        first = runs[0]  # the tensor counts are the same in every repeat
        cells = [" / ".join(f"{r[k] / MB:.1f}" for r in first) for k in kinds]
        total = " / ".join(f"{sum(r[k] for k in kinds) / MB:.1f}" for r in first)
        peak = " / ".join(f"{statistics.median(run[rank]['peak RSS growth'] for run in runs) / MB:.0f}"
                          for rank in range(len(first)))
        speeds = []
        for key in ("steps/s", "steps/CPU s"):
            speed = statistics.median(run[0][key] for run in runs)
            ratio = statistics.median(run[0][key] / ddp[0][key] for run, ddp in zip(runs, rows["ddp"]))
            speeds += [f"{speed:.2f}", f"{ratio:.2f}x"]
        print(f"| {name} | {' | '.join(cells)} | {total} | {peak} | {' | '.join(speeds)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    if args.check:
        problems = check(rows)
        print("check: " + ("; ".join(problems) if problems else "FSDP and ZeRO-3 hold half of DDP's bytes per rank"))
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
