"""The GPT of examples/gpt.py trained three ways: a hand-written nanoGPT-style loop, the Trainer, the Accelerator.

    python benchmarks/gpt.py                             # the full run (docs/benchmarks.md), ~30 min on 2 cores
    python benchmarks/gpt.py --quick                     # a smoke run: few steps, one repeat
    python benchmarks/gpt.py --settings fp32 ddp         # only some settings (see SETTINGS below)
    python benchmarks/gpt.py --device cuda --settings bf16 --no_fresh --json out.json   # on a GPU (gpu_check.py)

The same model, data, data order, optimizer (AdamW, decay on matrices only), learning-rate schedule (warm-up then
cosine), gradient clipping (1.0) and gradient accumulation (2 micro-batches per step), trained by:

(a) a hand-written loop in the style of nanoGPT's train.py: the autocast context (a null context in fp32), the
    model optionally `torch.compile`d and wrapped in DDP, the learning rate set by hand each step, manual
    accumulation (`require_backward_grad_sync` off on the micro-batches that do not step), clipping, `loss.item()`
    every 10 steps;
(b) the Trainer: the example's TaskModule (it calls `self.log("train_loss", loss)` every step), `fit(module)` or
    `fit(torch.compile(module))`, with logger, progress bar and checkpointing off, like the loop;
(c) the Accelerator: `prepare(model, optimizer, loader, scheduler)` and the loop of docs/accelerator.md with
    `accumulate`, `backward` and `clip_grad_norm_` (`torch.compile(model)` before prepare when compiled).

Two kinds of runs, interleaved so that a slow stretch of a shared machine hits every variant alike:

- speed, "lockstep": one process (one process group of 2 under DDP) holds the three and runs one optimizer step
  of each in turn, (b), (a), (c), (b), (a), (c), ...: the Trainer's fit drives, and at the start of each of its
  steps a callback runs one step of (a) and one of (c). Each step is timed on its own (wall clock, and this
  process's CPU time, all threads), so the three see the machine's load of the same second. tokens/s is tokens
  per optimizer step (micro-batch x accumulation x block size x processes) over the mean step time after the
  warm-up steps; "ratio" is the median over repeats of (variant / (a) of the same repeat), with the range;
- start and memory, "fresh": each variant alone in a fresh process (or pair), a few steps. "first step" is from
  just before the model is built (after the imports and the data) to the end of the first optimizer step:
  set-up, process group, wrapping, compilation; "peak RSS" is the process's resident-memory high-water mark
  (ru_maxrss; rank 0 under 2 processes) less its RSS just before the model was built. Medians over repeats.

On `--device cuda` the loops run on the GPU (nccl under DDP, autocast on CUDA) and each clock reading first waits
for the GPU (torch.cuda.synchronize), so a step's time is its work, not its launch. "FLOPs/step" is one optimizer
step's FLOPs counted once by torch.utils.flop_counter.FlopCounterMode (forward and backward of the micro-batches of
a step on one process), and "MFU" that over the step time and the device's dense peak
(tasktrain.callbacks.throughput_monitor.PEAK_TFLOPS; none on a CPU). Both go to --json and to a line under the table.

"final loss" is the last micro-batch's loss of the lockstep run, and "= (a)" says whether the variant's final
parameters are bit for bit those of (a) in the same run. Compiled runs start from a warm inductor cache (an
untimed compiled run comes first), so their first step is compilation with cached kernels, not a cold compile.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 1234
LABELS = {"raw": "(a) hand-written loop", "trainer": "(b) Trainer", "accelerator": "(c) Accelerator"}

# name: (processes, precision, compile, strategy of (b) and (c)). (a) is the hand-written loop, under DDP on 2
# processes: every 2-process setting's ratios are against that same hand-written DDP loop.
SETTINGS = {
    "fp32": (1, "32-true", False, None),
    "fp32-compiled": (1, "32-true", True, None),
    "bf16": (1, "bf16-mixed", False, None),
    "ddp": (2, "32-true", False, "ddp"),
    "fsdp": (2, "32-true", False, "fsdp"),
    "deepspeed_stage_2": (2, "32-true", False, "deepspeed_stage_2"),
}
FULL = {"steps": 60, "warmup": 10, "repeats": 5, "fresh_steps": 5}
QUICK = {"steps": 8, "warmup": 3, "repeats": 1, "fresh_steps": 3}


DEVICE = "cpu"  # the worker's, from its cfg (--device)


def clock():
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()  # the GPU's queued work belongs to the step that queued it
    return time.perf_counter(), time.process_time()


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def example():
    """examples/gpt.py, loaded by its path (this file has the same module name)."""
    import importlib.util

    if "gpt_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpt_example", os.path.join(ROOT, "examples", "gpt.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpt_example"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpt_example"]


def build_module(cfg, gpt):
    """The example's TaskModule; the loops (a) and (c) train its bare GPT. Same seed, same initial weights."""
    import torch

    torch.manual_seed(SEED)
    return gpt.GPTAddition(cfg["digits"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"], lr=cfg["lr"],
                           warmup=cfg["lr_warmup"], max_steps=cfg["steps"])


# -- the three loops --------------------------------------------------------------------------------------------------
class RawLoop:
    """(a) nanoGPT's train.py, reduced to what this comparison needs; step() is one optimizer step."""

    def __init__(self, cfg, gpt, train):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler

        self.cfg, self.gpt, self.torch = cfg, gpt, torch
        self.ddp = int(os.environ.get("RANK", -1)) != -1
        self.owns_group = self.ddp and not dist.is_initialized()
        self.device = torch.device(DEVICE, int(os.environ.get("LOCAL_RANK", 0))) if DEVICE == "cuda" else None
        if self.device is not None:
            torch.cuda.set_device(self.device)
        if self.owns_group:
            dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
        self.rank = dist.get_rank() if self.ddp else 0
        model = build_module(cfg, gpt).model.to(self.device or "cpu")
        self.raw_model = model
        self.optimizer = gpt.configure_adamw(model, cfg["lr"], 0.1)
        if cfg["compile"]:
            model = torch.compile(model)
        if self.ddp:
            model = DDP(model, device_ids=[self.device] if self.device is not None else None)
        self.model = model
        self.ctx = nullcontext() if cfg["precision"] == "32-true" else torch.autocast(DEVICE, dtype=torch.bfloat16)
        # (the order the Trainer's training sampler reads under a distributed strategy, as Lightning's: shuffled, seed 0)
        sampler = DistributedSampler(train, shuffle=True, seed=0) if self.ddp else None
        self.batches = iter(DataLoader(train, batch_size=cfg["micro_batch"], shuffle=False, sampler=sampler))
        self.it = 0
        self.last_loss = None
        model.train()

    def step(self):
        cfg, model, optimizer = self.cfg, self.model, self.optimizer
        accumulation = cfg["accumulate"]
        lr = cfg["lr"] * self.gpt.lr_factor(self.it, cfg["lr_warmup"], cfg["steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(accumulation):
            if self.ddp:
                model.require_backward_grad_sync = micro_step == accumulation - 1
            x, y = next(self.batches)
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.ctx:
                _, micro_loss = model(x, y)
                loss = micro_loss / accumulation
            loss.backward()
        self.torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.it % 10 == 0:
            self.logged = loss.item() * accumulation  # what nanoGPT prints every log_interval
        self.last_loss = micro_loss.detach()
        self.it += 1

    def close(self):
        import gc

        import torch.distributed as dist

        self.model = None  # the DDP wrapper goes before the process group (gloo aborts at exit otherwise)
        if self.owns_group:
            gc.collect()
            dist.destroy_process_group()


class AcceleratorLoop:
    """(c) the Accelerator and the loop of docs/accelerator.md; step() is one optimizer step."""

    def __init__(self, cfg, gpt, train):
        import torch
        from torch.utils.data import DataLoader

        from tasktrain import Accelerator, DeepSpeed

        self.cfg = cfg
        strategy = cfg["strategy"]
        if strategy and strategy.startswith("deepspeed"):
            strategy = DeepSpeed(stage=int(strategy[-1]), gradient_clipping=1.0)  # DeepSpeed clips in its step
        self.accelerator = accelerator = Accelerator(mixed_precision=cfg["precision"], strategy=strategy,
                                                     gradient_accumulation_steps=cfg["accumulate"],
                                                     cpu=DEVICE == "cpu")
        model = build_module(cfg, gpt).model
        optimizer = gpt.configure_adamw(model, cfg["lr"], 0.1)
        # A prepared scheduler steps once per process at each optimizer step (Accelerate's rule), so the schedule
        # reads the optimizer step as step // num_processes: the very schedule of (a) and (b).
        processes = accelerator.num_processes
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: gpt.lr_factor(step // processes, cfg["lr_warmup"], cfg["steps"]))
        if cfg["compile"]:
            model = torch.compile(model)
        loader = DataLoader(train, batch_size=cfg["micro_batch"], shuffle=False,
                            sampler=shards_as_batches(len(train), cfg["micro_batch"], accelerator.num_processes))
        self.model, self.optimizer, loader, self.scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
        self.batches = iter(loader)
        self.rank = accelerator.process_index
        self.last_loss = None
        self.model.train()

    def step(self):
        accelerator, model, optimizer = self.accelerator, self.model, self.optimizer
        for _ in range(self.cfg["accumulate"]):
            x, y = next(self.batches)
            with accelerator.accumulate(model):
                _, loss = model(x, y)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                self.scheduler.step()
                optimizer.zero_grad()
        self.last_loss = loss.detach()

    def weights(self):
        return self.accelerator.get_state_dict(self.model)  # on every process (ZeRO-3 would gather)

    def close(self):
        self.accelerator.end_training()


def shards_as_batches(n, batch_size, world):
    """An order of 0..n-1 whose whole batches are DistributedSampler's shards: the Accelerator gives process r whole
    batches r, r + W, ... of its loader (Accelerate's order), the loop (a) and the Trainer read DistributedSampler's
    shards (shuffled, seed 0: the Trainer's training sampler under a distributed strategy, as Lightning's). Listing
    each step's shards one after the other gives every variant the same samples on each process at each step, so
    the same arithmetic."""
    from torch.utils.data import DistributedSampler

    if world == 1:
        return list(range(n))
    shards = [list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0))
              for rank in range(world)]
    order = []
    for start in range(0, len(shards[0]), batch_size):
        for shard in shards:
            order += shard[start:start + batch_size]
    return order


def fit_trainer(cfg, gpt, train, on_step_start):
    """(b) the Trainer; on_step_start(trainer) is called at the start of each optimizer step and at the end of the
    fit. Returns the trainer, the module and the last micro-batch's loss."""
    import torch
    from torch.utils.data import DataLoader

    from tasktrain import Callback, Trainer

    class Steps(Callback):
        def __init__(self):
            self.last_loss = None

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx % cfg["accumulate"] == 0:
                on_step_start(trainer)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            # (Lightning's outputs: {"loss": the micro-batch loss divided by the window, detached})
            self.last_loss = outputs["loss"] * cfg["accumulate"]

        def on_train_end(self, trainer, module):
            on_step_start(trainer)

    module = build_module(cfg, gpt)
    steps = Steps()
    trainer = Trainer(strategy=cfg["strategy"] or "auto", accelerator=DEVICE, precision=cfg["precision"],
                      max_steps=cfg["steps"],
                      accumulate_grad_batches=cfg["accumulate"], gradient_clip_val=1.0, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      callbacks=[steps])
    trainer.fit(torch.compile(module) if cfg["compile"] else module,
                DataLoader(train, batch_size=cfg["micro_batch"], shuffle=False))
    return trainer, module, steps.last_loss.detach()


# -- one process's work -----------------------------------------------------------------------------------------------
def lockstep(cfg, gpt, train):
    """(b) drives; at the start of each of its steps, one step of (a), then one of (c). Every step timed alone."""
    import torch

    raw = RawLoop(cfg, gpt, train)  # with RANK set (2 processes) it starts the process group; (c) and (b) join it
    flops_per_step = step_flops(cfg, gpt, train, raw)
    accelerator = AcceleratorLoop(cfg, gpt, train)
    times = {"raw": [], "trainer": [], "accelerator": []}
    started = []

    def on_step_start(trainer):
        now = clock()
        if started:
            times["trainer"].append([n - s for n, s in zip(now, started[-1])])
        if raw.it < cfg["steps"]:
            for name, loop in (("raw", raw), ("accelerator", accelerator)):
                begin = clock()
                loop.step()
                times[name].append([e - b for e, b in zip(clock(), begin)])
        started.append(clock())

    trainer, module, trainer_loss = fit_trainer(cfg, gpt, train, on_step_start)
    weights = {"raw": raw.raw_model.state_dict(), "trainer": whole(module.model.state_dict()),
               "accelerator": accelerator.weights()}
    raw_weights = {k: v.cpu() for k, v in weights["raw"].items()}
    same = {name: sorted(w) == sorted(raw_weights) and all(torch.equal(w[k].cpu(), raw_weights[k]) for k in w)
            for name, w in weights.items()}
    diffs = {name: max(float((w[k].cpu().float() - raw_weights[k].float()).abs().max()) for k in w)
             for name, w in weights.items()}
    losses = {"raw": float(raw.last_loss), "trainer": float(trainer_loss), "accelerator": float(accelerator.last_loss)}
    accelerator.close()
    raw.close()  # last: it started the process group
    if trainer.global_rank != 0:
        return None
    return {"times": times, "same": same, "losses": losses, "max_diff": diffs, "flops_per_step": flops_per_step}


def step_flops(cfg, gpt, train, raw):
    """One optimizer step's FLOPs on one process, counted once by FlopCounterMode: forward and backward of a
    micro-batch, on a copy of the model (the loops' weights, gradients and random numbers are not touched)."""
    import copy

    import torch

    from tasktrain.callbacks.throughput_monitor import measure_flops

    model = copy.deepcopy(raw.raw_model)
    x, y = (t[:cfg["micro_batch"]] for t in train.tensors)
    if raw.device is not None:
        x, y = x.to(raw.device), y.to(raw.device)

    def forward_backward():
        with raw.ctx:
            _, loss = model(x, y)
        loss.backward()

    with torch.random.fork_rng(devices=[raw.device.index] if raw.device is not None else []):
        flops, _ = measure_flops(forward_backward)
    return flops * cfg["accumulate"]


def whole(state):
    """FSDP's shards (DTensors) gathered into whole tensors (a collective: every rank calls it); others as they are."""
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def fresh(cfg, gpt, train):
    """One variant alone: the time to its first optimizer step, and its peak memory."""
    start_rss, start = rss_mb(), clock()
    first = []

    def mark(*_):
        if not first:
            first.append(clock()[0] - start[0])

    if cfg["variant"] == "trainer":
        trainer, _, _ = fit_trainer(dict(cfg, steps=cfg["fresh_steps"]), gpt, train,
                                    lambda trainer: mark() if trainer.global_step == 1 else None)
        rank = trainer.global_rank
    else:
        loop = (RawLoop if cfg["variant"] == "raw" else AcceleratorLoop)(dict(cfg, steps=cfg["fresh_steps"]), gpt,
                                                                        train)
        for _ in range(cfg["fresh_steps"]):
            loop.step()
            mark()
        rank = loop.rank
        loop.close()
    if rank != 0:
        return None
    return {"first_step": first[0], "peak_rss": peak_rss_mb() - start_rss}


def worker(cfg):
    global DEVICE
    DEVICE = cfg.get("device", "cpu")
    import torch
    import torch.distributed  # noqa: F401  (imported before any clock starts, alike for every variant)
    import torch.nn.parallel  # noqa: F401

    from tasktrain import Accelerator, Trainer  # noqa: F401

    torch.set_num_threads(cfg["threads"])
    gpt = example()
    train, _ = gpt.addition_data(cfg["digits"], cfg["samples"], 10, seed=0)
    return lockstep(cfg, gpt, train) if cfg["variant"] == "lockstep" else fresh(cfg, gpt, train)


# -- the parent: the runs, interleaved; the table ---------------------------------------------------------------------
def child_env(threads):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT") and not k.startswith("TASKTRAIN_")}
    env["OMP_NUM_THREADS"] = str(threads)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's tasktrain, installed or not
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONWARNINGS"] = "ignore"
    return env


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg, processes, tmp):
    """One run in fresh process(es); returns rank 0's result. Several processes are started here, each with the
    variables torchrun gives its workers on one machine (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, TORCHELASTIC_RUN_ID: the Trainer, as Lightning's, reads a torchrun world by it): the same world as under torchrun, without its agent (one more interpreter importing torch per run,
    ~2 s of CPU, which the measures never saw: they start after the imports). If one fails, the others are ended."""
    out = os.path.join(tmp, f"run-{time.monotonic_ns()}.json")
    command = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg), "--out", out]
    env = child_env(cfg["threads"])
    if processes > 1:
        world = dict(WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), GROUP_RANK="0", TORCHELASTIC_RUN_ID="none")
        envs = [dict(env, **world, RANK=str(r), LOCAL_RANK=str(r)) for r in range(processes)]
    else:
        envs = [env]
    logs = [tempfile.TemporaryFile(mode="w+") for _ in envs]
    procs = [subprocess.Popen(command, env=e, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=tmp)
             for e, log in zip(envs, logs)]
    deadline = time.monotonic() + 1800
    while any(p.poll() is None for p in procs):
        if any(p.returncode for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    if any(codes) or not os.path.exists(out):
        output = []
        for rank, log in enumerate(logs):
            log.seek(0)
            output.append(f"[rank {rank}, exit status {codes[rank]}]\n{log.read()[-5000:]}")
        raise RuntimeError(f"run {cfg['variant']} ({cfg['strategy']}) failed:\n" + "\n".join(output))
    for log in logs:
        log.close()
    with open(out) as f:
        return json.load(f)


def steady(times, warmup, which):
    """Mean time per step after `warmup` steps; which 0: wall, 1: CPU."""
    kept = [t[which] for t in times[warmup:]]
    if not kept:
        raise RuntimeError(f"{len(times)} steps timed: need more than the warm-up ({warmup}).")
    return statistics.mean(kept)


def measure(name, args, tmp):
    processes, precision, compiled, strategy = SETTINGS[name]
    cfg = {"digits": 3, "n_layer": args.n_layer, "n_head": 4, "n_embd": args.n_embd, "lr": 3e-3, "lr_warmup": 10,
           "micro_batch": args.micro_batch, "accumulate": 2, "steps": args.steps, "fresh_steps": args.fresh_steps,
           "threads": args.threads, "precision": precision, "compile": compiled, "strategy": strategy,
           "device": args.device}
    cfg["samples"] = cfg["micro_batch"] * cfg["accumulate"] * processes * (args.steps + 1)
    tokens_per_step = cfg["micro_batch"] * cfg["accumulate"] * 12 * processes  # block size 12 at 3 digits
    if compiled:  # fill the inductor cache first: every timed run then compiles alike
        launch(dict(cfg, variant="raw", steps=2, fresh_steps=2), processes, tmp)
    runs, starts = [], {v: [] for v in LABELS}
    for repeat in range(args.repeats):
        runs.append(launch(dict(cfg, variant="lockstep"), processes, tmp))
        for variant in LABELS if not args.no_fresh else ():
            starts[variant].append(launch(dict(cfg, variant=variant), processes, tmp))
        print(f"  {name}: repeat {repeat + 1}/{args.repeats} done (load average {os.getloadavg()[0]:.1f})",
              file=sys.stderr, flush=True)
    table, records = [], []
    from tasktrain.callbacks.throughput_monitor import device_peak_flops

    peak = device_peak_flops(args.device, precision) if args.device == "cuda" else None
    flops = runs[0]["flops_per_step"]
    ref_wall = [steady(r["times"]["raw"], args.warmup, 0) for r in runs]
    ref_cpu = [steady(r["times"]["raw"], args.warmup, 1) for r in runs]
    for variant, label in LABELS.items():
        wall = [steady(r["times"][variant], args.warmup, 0) for r in runs]
        cpu = [steady(r["times"][variant], args.warmup, 1) for r in runs]
        ratios = [ref / w for w, ref in zip(wall, ref_wall)]  # of tokens/s: the inverse of the times' ratio
        cpu_ratios = [ref / c for c, ref in zip(cpu, ref_cpu)]
        same = all(r["same"][variant] for r in runs)
        table.append([name, label + (f", {strategy}" if strategy else ""),
                      f"{tokens_per_step / statistics.median(wall):,.0f}",
                      f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                      f"{1000 * statistics.median(cpu):.1f} ms",
                      f"{statistics.median(cpu_ratios):.3f}x ({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f})",
                      f"{statistics.median(s['first_step'] for s in starts[variant]):.2f} s" if starts[variant] else "-",
                      f"{statistics.median(s['peak_rss'] for s in starts[variant]):.0f} MB" if starts[variant] else "-",
                      f"{runs[0]['losses'][variant]:.4f}", "yes" if same else "no"])
        step = statistics.median(wall)
        records.append({"setting": name, "variant": variant, "label": table[-1][1],
                        "tokens_per_s": tokens_per_step / step, "ratio": statistics.median(ratios), "step_s": step,
                        "flops_per_step": flops, "mfu": flops / step / peak if peak else None, "same_as_raw": same,
                        "max_diff": max(r["max_diff"][variant] for r in runs)})
    if strategy is not None and processes > 1:
        table[0][1] = records[0]["label"] = LABELS["raw"] + ", DDP"
    mfu = ", ".join(f"{r['variant']} {100 * r['mfu']:.1f}%" for r in records) if peak else "n/a (no peak for a CPU)"
    print(f"  {name}: {flops:.3g} FLOPs per optimizer step (FlopCounterMode, once); MFU: {mfu}", flush=True)
    return table, records


HEADER = ["setting", "variant", "tokens/s", "ratio to (a) (range)", "CPU per step", "CPU ratio (range)",
          "first step", "peak RSS", "final loss", "= (a)"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat: a smoke run")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per lockstep run")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the steady state")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--fresh_steps", type=int, default=None, help="steps of the runs for first step and memory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=128, help="per process; 2 micro-batches per step")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the loops run")
    parser.add_argument("--no_fresh", action="store_true", help="only the lockstep runs (no first step, no memory)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, with FLOPs per step and MFU, here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(json.loads(args.worker))
        if result is not None:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import torch

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, Python "
          f"{platform.python_version()}; {args.threads} torch thread(s) per process; GPT {args.n_layer} layers x "
          f"{args.n_embd}, micro-batch {args.micro_batch} x 2 per step, {args.steps} lockstep steps (warm-up "
          f"{args.warmup}), {args.repeats} repeat(s); load average before: {os.getloadavg()[0]:.1f}", flush=True)
    table, records = [], []
    with tempfile.TemporaryDirectory(prefix="tasktrain-gpt-bench-") as tmp:
        for name in args.settings:
            rows, kept = measure(name, args, tmp)
            table += rows
            records += kept
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rows": records}, f)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
