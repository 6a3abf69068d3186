"""The GPT of examples/gpt.py trained three ways: a hand-written nanoGPT-style loop, the Trainer, the Accelerator.

    python benchmarks/gpt.py                      # the full run (docs/benchmarks.md), long on a 2-core machine
    python benchmarks/gpt.py --quick              # a smoke run: fewer steps, one repeat
    python benchmarks/gpt.py --settings fp32 ddp  # only some settings (see SETTINGS below)

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

Every run is a fresh process (so the start, the compilation and the memory are each run's own), and runs are
interleaved (a, b, c, a, b, c, ...) so a slow stretch of a shared machine hits them alike. One run measures:

- tokens/s, steady state: tokens per optimizer step (micro-batch x accumulation x block size x processes) over
  the mean wall time per step after the warm-up steps (each variant stamps the clock at the start of every step;
  rank 0's clock under 2 processes); "ratio" is the median over repeats of (variant / the hand-written loop of
  the same repeat, i.e. the same round of the interleaving), with the range over repeats;
- CPU per step: the same, in this process's CPU time (all its threads), which the load of other programs moves
  less than wall time;
- first step: from just before the model is built (after the imports and the data) to the end of the first
  optimizer step: set-up, process group, wrapping, compilation;
- peak RSS: the process's resident-memory high-water mark (ru_maxrss; rank 0 under 2 processes), less its RSS
  just before the model was built;
- final loss, and "= (a)": whether the final parameters are bit for bit the hand-written loop's.

Compiled runs start from a warm inductor cache (one untimed compiled run comes first), so "first step" there is
compilation with cached kernels, not a cold compile.
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
VARIANTS = {"raw": "(a) hand-written loop", "trainer": "(b) Trainer", "accelerator": "(c) Accelerator"}

# name: (processes, precision, compile, [(variant, strategy)]). The first variant of each is the reference.
# A 2-process strategy (fsdp, ...) is one more (variant, strategy) pair below.
SETTINGS = {
    "fp32": (1, "32-true", False, [("raw", None), ("trainer", None), ("accelerator", None)]),
    "fp32-compiled": (1, "32-true", True, [("raw", None), ("trainer", None), ("accelerator", None)]),
    "bf16": (1, "bf16-mixed", False, [("raw", None), ("trainer", None), ("accelerator", None)]),
    "ddp": (2, "32-true", False, [("raw", "ddp"), ("trainer", "ddp"), ("accelerator", "ddp"),
                                  ("trainer", "deepspeed_stage_2"), ("accelerator", "deepspeed_stage_2")]),
}
FULL = {"steps": 60, "warmup": 10, "repeats": 5}
QUICK = {"steps": 8, "warmup": 3, "repeats": 1}


# -- the worker: one training run in this process --------------------------------------------------------------------
def clock():
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


def worker(cfg):
    """Train cfg["steps"] optimizer steps with one variant; returns what it measured (rank 0 reports)."""
    import torch
    import torch.distributed  # noqa: F401  (imports before the clock starts: the same for every variant)
    import torch.nn.parallel  # noqa: F401

    from tasktrain import Accelerator, Trainer  # noqa: F401

    torch.set_num_threads(cfg["threads"])
    gpt = example()
    train, _ = gpt.addition_data(cfg["digits"], cfg["samples"], 10, seed=0)
    start_rss = rss_mb()
    start = clock()
    run = {"raw": run_raw, "trainer": run_trainer, "accelerator": run_accelerator}[cfg["variant"]]
    stamps, final_loss, model, rank = run(cfg, gpt, train)
    if rank != 0:
        return None
    result = {"stamps": stamps, "start": start, "final_loss": final_loss, "start_rss": start_rss,
              "peak_rss": peak_rss_mb()}
    if cfg.get("params"):
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, cfg["params"])
    return result


def build_model(cfg, gpt):
    import torch

    torch.manual_seed(SEED)
    return gpt.GPTAddition(cfg["digits"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"], lr=cfg["lr"],
                           warmup=cfg["lr_warmup"], max_steps=cfg["steps"])


def run_raw(cfg, gpt, train):
    """(a) nanoGPT's train.py, reduced to what this comparison needs."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    ddp = int(os.environ.get("RANK", -1)) != -1
    rank = 0
    if ddp:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    model = build_model(cfg, gpt).model  # the bare GPT, built from the same seed as the TaskModule's
    optimizer = gpt.configure_adamw(model, cfg["lr"], 0.1)
    if cfg["compile"]:
        model = torch.compile(model)
    if ddp:
        model = DDP(model)
    ctx = nullcontext() if cfg["precision"] == "32-true" else torch.autocast("cpu", dtype=torch.bfloat16)
    sampler = DistributedSampler(train, shuffle=False) if ddp else None
    batches = iter(DataLoader(train, batch_size=cfg["micro_batch"], shuffle=False, sampler=sampler))
    accumulation, stamps, lossf = cfg["accumulate"], [], None
    model.train()
    for it in range(cfg["steps"] + 1):
        stamps.append(clock())
        if it == cfg["steps"]:
            break
        lr = cfg["lr"] * gpt.lr_factor(it, cfg["lr_warmup"], cfg["steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(accumulation):
            if ddp:
                model.require_backward_grad_sync = micro_step == accumulation - 1
            x, y = next(batches)
            with ctx:
                _, micro_loss = model(x, y)
                loss = micro_loss / accumulation
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % 10 == 0:
            lossf = loss.item() * accumulation  # what nanoGPT prints every log_interval  # noqa: F841
    final = float(micro_loss.detach())
    raw_model = model.module if ddp else model
    raw_model = getattr(raw_model, "_orig_mod", raw_model)
    if ddp:
        del model
        dist.destroy_process_group()
    return stamps, final, raw_model, rank


def run_trainer(cfg, gpt, train):
    import torch
    from torch.utils.data import DataLoader

    from tasktrain import Callback, Trainer

    module = build_model(cfg, gpt)

    class Stamp(Callback):
        """The clock at the start of every optimizer step (the first micro-batch of its window) and at the end."""

        def __init__(self):
            self.stamps = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx % cfg["accumulate"] == 0:
                self.stamps.append(clock())

        def on_train_end(self, trainer, module):
            self.stamps.append(clock())

    stamp = Stamp()
    losses = []

    class Last(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            losses[:] = [outputs]

    strategy = cfg["strategy"] or "auto"
    trainer = Trainer(strategy=strategy, precision=cfg["precision"], max_steps=cfg["steps"],
                      accumulate_grad_batches=cfg["accumulate"], gradient_clip_val=1.0, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      callbacks=[stamp, Last()])
    trainer.fit(torch.compile(module) if cfg["compile"] else module,
                DataLoader(train, batch_size=cfg["micro_batch"], shuffle=False))
    return stamp.stamps, float(losses[0].detach()), module.model, trainer.global_rank


def run_accelerator(cfg, gpt, train):
    import torch
    from torch.utils.data import DataLoader

    from tasktrain import Accelerator, DeepSpeed

    strategy = cfg["strategy"]
    if strategy and strategy.startswith("deepspeed"):
        strategy = DeepSpeed(stage=int(strategy[-1]), gradient_clipping=1.0)  # DeepSpeed clips inside its step
    accelerator = Accelerator(mixed_precision=cfg["precision"], gradient_accumulation_steps=cfg["accumulate"],
                              strategy=strategy)
    model = build_model(cfg, gpt).model
    optimizer = gpt.configure_adamw(model, cfg["lr"], 0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: gpt.lr_factor(step, cfg["lr_warmup"], cfg["steps"]))
    if cfg["compile"]:
        model = torch.compile(model)
    loader = DataLoader(train, batch_size=cfg["micro_batch"], shuffle=False)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    stamps, micro, steps = [], 0, 0
    for x, y in loader:
        if micro % cfg["accumulate"] == 0:
            stamps.append(clock())
        micro += 1
        with accelerator.accumulate(model):
            _, loss = model(x, y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if micro % cfg["accumulate"] == 0:
            steps += 1
            if steps == cfg["steps"]:
                break
    stamps.append(clock())
    state = accelerator.get_state_dict(model)
    plain = gpt.GPT(gpt.VOCAB_SIZE, gpt.block_size(cfg["digits"]), cfg["n_layer"], cfg["n_head"], cfg["n_embd"])
    plain.load_state_dict(state)
    rank = accelerator.process_index
    accelerator.end_training()
    return stamps, float(loss.detach()), plain, rank


# -- the parent: interleaved runs, the table ------------------------------------------------------------------------
def child_env(threads):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT") and not k.startswith("TASKTRAIN_")}
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def launch(cfg, processes, tmp):
    """One run in fresh process(es); returns rank 0's measurements."""
    out = os.path.join(tmp, f"run-{time.monotonic_ns()}.json")
    args = ["--worker", json.dumps(cfg), "--out", out]
    if processes == 1:
        command = [sys.executable, os.path.abspath(__file__), *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                   "--nproc_per_node", str(processes), os.path.abspath(__file__), *args]
    proc = subprocess.run(command, env=child_env(cfg["threads"]), capture_output=True, text=True, timeout=1800,
                          cwd=tmp)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"run {cfg['variant']} {cfg['strategy']} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    with open(out) as f:
        return json.load(f)


def steady(stamps, warmup, which):
    """Mean time per step after `warmup` steps; which 0: wall, 1: CPU. stamps[i] is the start of step i, the last
    stamp the end of the last step."""
    last = len(stamps) - 1
    if last <= warmup:
        raise RuntimeError(f"{len(stamps)} stamps: need more steps than the warm-up ({warmup}).")
    return (stamps[last][which] - stamps[warmup][which]) / (last - warmup)


def measure(name, args, tmp):
    processes, precision, compiled, variants = SETTINGS[name]
    base = {"digits": 3, "n_layer": args.n_layer, "n_head": 4, "n_embd": args.n_embd, "lr": 3e-3, "lr_warmup": 10,
            "micro_batch": args.micro_batch, "accumulate": 2, "steps": args.steps, "threads": args.threads,
            "precision": precision, "compile": compiled}
    base["samples"] = base["micro_batch"] * base["accumulate"] * processes * (args.steps + 1)
    tokens_per_step = base["micro_batch"] * base["accumulate"] * 12 * processes  # block size 12 at 3 digits
    if compiled:  # fill the inductor cache first: every timed run then compiles alike
        launch(dict(base, variant="raw", strategy=None, steps=2, samples=base["samples"]), processes, tmp)
    rows = {(v, s): [] for v, s in variants}
    for repeat in range(args.repeats):
        for variant, strategy in variants:
            params = os.path.join(tmp, f"{name}-{variant}-{strategy}-{repeat}.pt")
            result = launch(dict(base, variant=variant, strategy=strategy, params=params), processes, tmp)
            result["params"] = params
            rows[(variant, strategy)].append(result)
        print(f"  {name}: repeat {repeat + 1}/{args.repeats} done (load average {os.getloadavg()[0]:.1f})",
              file=sys.stderr, flush=True)
    return summarize(name, rows, variants, args.warmup, tokens_per_step)


def summarize(name, rows, variants, warmup, tokens_per_step):
    import torch

    reference = rows[variants[0]]
    ref_wall = [steady(r["stamps"], warmup, 0) for r in reference]
    ref_cpu = [steady(r["stamps"], warmup, 1) for r in reference]
    ref_params = torch.load(reference[0]["params"], weights_only=True)
    table = []
    for variant, strategy in variants:
        runs = rows[(variant, strategy)]
        wall = [steady(r["stamps"], warmup, 0) for r in runs]
        cpu = [steady(r["stamps"], warmup, 1) for r in runs]
        ratios = [w_ref / w for w, w_ref in zip(wall, ref_wall)]  # tokens/s ratio = inverse time ratio
        cpu_ratios = [c_ref / c for c, c_ref in zip(cpu, ref_cpu)]
        first = [r["stamps"][1][0] - r["start"][0] for r in runs]
        peak = [r["peak_rss"] - r["start_rss"] for r in runs]
        params = torch.load(runs[0]["params"], weights_only=True)
        same = all(torch.equal(params[k], ref_params[k]) for k in ref_params) and params.keys() == ref_params.keys()
        label = VARIANTS[variant] + (f", {strategy}" if strategy else "")
        table.append([name, label, f"{tokens_per_step / statistics.median(wall):,.0f}",
                      f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                      f"{1000 * statistics.median(cpu):.1f} ms", f"{statistics.median(cpu_ratios):.3f}x",
                      f"{statistics.median(first):.2f} s", f"{statistics.median(peak):.0f} MB",
                      f"{runs[0]['final_loss']:.4f}", "yes" if same else "no"])
    return table


HEADER = ["setting", "variant", "tokens/s", "ratio to (a) (range)", "CPU per step", "CPU ratio", "first step",
          "peak RSS", "final loss", "= (a)"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat: a smoke run")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the steady state")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=128, help="per process; 2 micro-batches per step")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(json.loads(args.worker))
        if result is not None:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"Python {platform.python_version()}; {args.threads} torch thread(s) per process; model {args.n_layer} "
          f"layers x {args.n_embd}, micro-batch {args.micro_batch} x 2, {args.steps} steps (warm-up {args.warmup}), "
          f"{args.repeats} repeat(s); load average before: {os.getloadavg()[0]:.1f}", flush=True)
    table = []
    with tempfile.TemporaryDirectory(prefix="tasktrain-gpt-bench-") as tmp:
        for name in args.settings:
            table += measure(name, args, tmp)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
