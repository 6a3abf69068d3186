"""What the watchdog (issue 19) costs per step.

    python benchmarks/watchdog.py                  # about 2 minutes
    python benchmarks/watchdog.py --quick          # a smoke run

1. The hot path alone: nanoseconds per call of Watchdog.mark (what the loops call a few times per batch),
   Watchdog.sub_event, and the no_mark function that stands in for it on one process, next to an empty function
   call, by timeit in this process. And what one heartbeat costs the watchdog's thread (building this rank's
   state, publishing it, reading the verdict key and rank 0's heartbeat) against a TCPStore in this process.
2. Two ranks of DDP (the Trainer self-launches them; gloo, one torch thread each) on the small MLP of
   benchmarks/overhead.py (32-64-64-1, batch 64 per rank, Adam), N optimizer steps with stall_timeout=None (no
   watchdog at all), 300 (the default: a heartbeat every 5 s) and 2 (a heartbeat every 0.2 s, the busiest any
   test uses). Each run is its own pair of processes, the variants interleaved over the repeats. Rank 0 stamps
   the first line of every training_step; time per step is the mean from the warm-up stamp to the last, as wall
   time, as the main thread's CPU time (the training loop: what the marks cost) and as this process's CPU time
   (all its threads: the watchdog's, gloo's). "ratio" is the median over repeats of variant / off of the same
   repeat. On a shared machine the wall and process columns move by 10-30% between repeats; the main thread's
   CPU time moves least.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

VARIANTS = {"off (stall_timeout=None)": None, "default (300 s, heartbeat 5 s)": 300, "2 s (heartbeat 0.2 s)": 2}


def hot_path(number):
    from tasktrain.strategies.watchdog import Watchdog, no_mark

    dog = Watchdog(store=None, rank=0, world_size=2, prefix="b/")  # not started: no thread, no store call

    def empty(event, step=-1, batch=-1, long=False):
        pass

    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    beating = Watchdog(store=server, rank=1, world_size=2, prefix="b/")
    beating.arm(300)
    beating._publish()
    Watchdog(store=server, rank=0, world_size=2, prefix="b/")._publish()
    heartbeat = min(timeit.repeat(beating._tick, number=200, repeat=5)) / 200

    rows = []
    for label, fn in (("empty function call (reference)", lambda: empty("training_step", 3, 3)),
                      ("no_mark (one process)", lambda: no_mark("training_step", 3, 3)),
                      ("Watchdog.mark", lambda: dog.mark("training_step", 3, 3)),
                      ("Watchdog.mark(long=True)", lambda: dog.mark("training_step", 3, 3, True)),
                      ("Watchdog.sub_event", lambda: dog.sub_event("backward"))):
        best = min(timeit.repeat(fn, number=number, repeat=5)) / number
        rows.append((label, best))
    return rows, heartbeat


def child(stall_timeout, out, steps, warmup):
    """One self-launched two-rank fit (both ranks run this function); rank 0 writes its per-step times."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tasktrain import TaskModule, Trainer

    torch.set_num_threads(1)

    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                           torch.nn.ReLU(), torch.nn.Linear(64, 1))
            self.stamps = []

        def training_step(self, batch, batch_idx):
            self.stamps.append((time.perf_counter(), time.thread_time(), time.process_time()))
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64 * 2 * steps, 32, generator=g), torch.randn(64 * 2 * steps, 1, generator=g))
    module = Net()
    trainer = Trainer(strategy="ddp", devices=2, accelerator="cpu", max_steps=steps, stall_timeout=stall_timeout,
                      logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(module, DataLoader(data, batch_size=64))
    if trainer.is_global_zero:
        s = module.stamps
        n = len(s) - 1 - warmup
        with open(out, "w") as f:
            json.dump({"wall": (s[-1][0] - s[warmup][0]) / n, "thread": (s[-1][1] - s[warmup][1]) / n,
                       "process": (s[-1][2] - s[warmup][2]) / n, "watchdog": trainer.strategy.watchdog is not None}, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("STALL_TIMEOUT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.repeats = 200, 20, 1
    if args.child:
        stall = None if args.child[0] == "None" else float(args.child[0])
        child(stall, args.child[1], args.steps, args.warmup)
        return

    print("## The hot path (one call, best of 5 x timeit)\n")
    print("| call | ns |\n| --- | --- |")
    rows, heartbeat = hot_path(20_000 if args.quick else 1_000_000)
    for label, seconds in rows:
        print(f"| {label} | {seconds * 1e9:.0f} |")
    print(f"\nOne heartbeat of the watchdog's thread (not on the training thread): {heartbeat * 1e6:.0f} us; at the "
          f"default of one per 5 s that is {heartbeat / 5 * 100:.4f}% of a core, at one per 0.2 s "
          f"{heartbeat / 0.2 * 100:.3f}%.")

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT") and not k.startswith("TASKTRAIN_")}
    env["OMP_NUM_THREADS"] = "1"
    results = {label: [] for label in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="tasktrain-watchdog-bench-") as tmp:
        for rep in range(args.repeats):
            for label, stall in VARIANTS.items():
                out = os.path.join(tmp, f"{rep}-{stall}.json")
                cmd = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps), "--warmup",
                       str(args.warmup), "--child", str(stall), out]
                subprocess.run(cmd, check=True, env=env, cwd=tmp, timeout=900)
                result = json.load(open(out))
                assert result["watchdog"] == (stall is not None), result
                results[label].append(result)
            print(f"  repeat {rep + 1}/{args.repeats} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr)

    off = results["off (stall_timeout=None)"]
    print(f"\n## Two DDP ranks, small MLP, {args.steps} steps (warm-up {args.warmup}), {args.repeats} repeats\n")
    print("| stall_timeout | per step (wall) | ratio | main thread CPU | ratio | process CPU | ratio |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for label, runs in results.items():
        row = [label]
        for clock in ("wall", "thread", "process"):
            values = [r[clock] for r in runs]
            ratios = [v / o[clock] for v, o in zip(values, off)]
            row += [f"{statistics.median(values) * 1e6:.0f} us",
                    f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
