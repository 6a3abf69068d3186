"""What the Trainer costs per optimizer step, next to a hand-written PyTorch loop (results: docs/benchmarks.md).

    python benchmarks/overhead.py                 # the full run (`make bench`), about 3 minutes
    python benchmarks/overhead.py --quick         # a smoke run: fewer steps and repeats
    python benchmarks/overhead.py --instructions  # instructions per step under valgrind: slow, load-independent

Every variant trains the same model from the same initial weights on the same batches in the same order
(no shuffle: the Trainer swaps in its own sampler, which at one process and shuffle=False is the identity
order) for the same number of optimizer steps, and the final losses are compared bit for bit with the raw
loop's. Variants run interleaved (raw, tasktrain..., others..., raw, ...) so that a slow stretch of a shared
machine hits them all alike.

Time per step, "steady state": every variant stamps the wall clock (time.perf_counter) and its thread's CPU
time (time.thread_time, less moved by other programs' load) at the same point of each step (the first line of
the loop body in the raw loop, the first line of training_step in the others). A run's time per step is
(stamp[last] - stamp[warm-up]) / (last - warm-up): the mean over every step after the warm-up, so the
costs that come every N steps (logger flushes, progress bar refreshes) are counted, spread over the steps. Set-up
and teardown are left out of it; they are in the "fit" column (wall time of the whole fit / loop, including
building the loader and the trainer and the checkpoint written at the end of the epoch).
The table gives the median over repeats of both, and "ratio", the median over repeats of (variant / raw of
the same repeat).
"""
import argparse
import contextlib
import gc
import io
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import TaskModule, Trainer

SEED = 1234
LR = 1e-3
# name: (layer widths, batch size, optimizer steps, warm-up steps, repeats); --quick shrinks steps and repeats.
WORKLOADS = {
    "small": ((32, 64, 64, 1), 64, 2000, 200, 5),
    # On 2 shared cores one step of this one is ~0.3 s, so 5 interleaved repeats of three variants at 200 steps
    # would take 15 minutes. What is measured is a per-step overhead of microseconds against ~300 ms of
    # compute: 30 steps say the same and keep `make bench` short. --medium-steps 200 runs the long form.
    "medium": ((1024, 4096, 4096, 10), 128, 30, 5, 5),
}
QUICK = {"small": (200, 20, 2), "medium": (3, 1, 1)}


def stamp():
    """Taken at the same point of every step by every variant: (wall clock, this thread's CPU time)."""
    return time.perf_counter(), time.thread_time()


def mlp(dims):
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def loss_fn(out, y):
    return F.mse_loss(out, y) if out.shape[-1] == 1 else F.cross_entropy(out, y)


def make_dataset(dims, batch, steps):
    g = torch.Generator().manual_seed(0)
    n = batch * steps  # one epoch holds exactly `steps` batches
    x = torch.randn(n, dims[0], generator=g)
    y = torch.randn(n, 1, generator=g) if dims[-1] == 1 else torch.randint(0, dims[-1], (n,), generator=g)
    return TensorDataset(x, y)


class _Terminal(io.TextIOWrapper):
    """/dev/null that says it is a terminal, so the progress bar draws (its costlier path)."""

    def isatty(self):
        return True


@contextlib.contextmanager
def quiet():
    sink = _Terminal(open(os.devnull, "wb"), line_buffering=True)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        sink.close()


# -- the variants: each returns (stamps, fit seconds, final loss) --------------------------------------------------
def run_raw(dims, batch, steps, dataset, root):
    torch.manual_seed(SEED)
    model = mlp(dims)
    stamps = []
    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=batch, shuffle=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    for x, y in loader:
        stamps.append(stamp())
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return stamps, time.perf_counter() - start, float(loss.detach())


class Net(TaskModule):
    """The same MLP, the same loss; `log` adds one `self.log("loss", loss, prog_bar=True)` per step."""

    def __init__(self, dims, log):
        super().__init__()
        self.net = mlp(dims)
        self.log_loss = log
        self.stamps = []
        self.last_loss = [None]  # a list, not an attribute set per step: nn.Module.__setattr__ is slow

    def training_step(self, batch, batch_idx):
        self.stamps.append(stamp())
        x, y = batch
        loss = loss_fn(self.net(x), y)
        if self.log_loss:
            self.log("loss", loss, prog_bar=True)
        self.last_loss[0] = loss
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=LR)


def run_tasktrain(dims, batch, steps, dataset, root, defaults, log):
    torch.manual_seed(SEED)
    module = Net(dims, log)
    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=batch, shuffle=False)
    with quiet():
        trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, default_root_dir=root,
                          logger=defaults, enable_progress_bar=defaults, enable_checkpointing=defaults)
        trainer.fit(module, loader)
    return module.stamps, time.perf_counter() - start, float(module.last_loss[0].detach())


def run_lightning(dims, batch, steps, dataset, root, defaults):
    import lightning as L

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp(dims)
            self.stamps = []
            self.last_loss = [None]

        def training_step(self, batch, batch_idx):
            self.stamps.append(stamp())
            x, y = batch
            loss = loss_fn(self.net(x), y)
            if defaults:
                self.log("loss", loss, prog_bar=True)
            self.last_loss[0] = loss
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=LR)

    torch.manual_seed(SEED)
    module = Net()
    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=batch, shuffle=False)
    with quiet():
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, default_root_dir=root,
                            logger=defaults, enable_progress_bar=defaults, enable_checkpointing=defaults,
                            enable_model_summary=defaults)
        trainer.fit(module, loader)
    return module.stamps, time.perf_counter() - start, float(module.last_loss[0].detach())


def run_accelerate(dims, batch, steps, dataset, root):
    from accelerate import Accelerator

    torch.manual_seed(SEED)
    model = mlp(dims)
    stamps = []
    start = time.perf_counter()
    accelerator = Accelerator(cpu=True)
    loader = DataLoader(dataset, batch_size=batch, shuffle=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for x, y in loader:
        stamps.append(stamp())
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return stamps, time.perf_counter() - start, float(loss.detach())


def _installed(name):
    try:
        __import__(name)
        return True
    except Exception:
        return False


def variants(with_log_off):
    out = [
        ("raw PyTorch loop", run_raw),
        ("tasktrain, defaults + self.log", lambda *a: run_tasktrain(*a, defaults=True, log=True)),
        ("tasktrain, all off", lambda *a: run_tasktrain(*a, defaults=False, log=False)),
    ]
    if with_log_off:
        out.append(("tasktrain, all off + self.log", lambda *a: run_tasktrain(*a, defaults=False, log=True)))
    if _installed("lightning"):
        out.append(("Lightning, defaults + self.log", lambda *a: run_lightning(*a, defaults=True)))
        out.append(("Lightning, all off", lambda *a: run_lightning(*a, defaults=False)))
    if _installed("accelerate"):
        out.append(("Accelerate loop", run_accelerate))
    return out


# -- measuring ------------------------------------------------------------------------------------------------------
def per_step(stamps, warmup, clock):
    """Mean time per step after the warm-up; clock 0 is wall time (perf_counter), 1 this thread's CPU time."""
    last = len(stamps) - 1
    if last <= warmup:
        raise RuntimeError(f"only {len(stamps)} steps were stamped; need more than the warm-up of {warmup}.")
    return (stamps[last][clock] - stamps[warmup][clock]) / (last - warmup)


def measure(name, dims, batch, steps, warmup, repeats, with_log_off, warm_round):
    runs = variants(with_log_off)
    results = {label: {"wall": [], "cpu": [], "fit": [], "loss": []} for label, _ in runs}
    with tempfile.TemporaryDirectory(prefix="tasktrain-bench-") as root:
        if warm_round:
            # One short untimed run of each variant first: first-use imports (tqdm, tensorboard), the allocator.
            tiny = make_dataset(dims, batch, 3)
            for label, run in runs:
                run(dims, batch, 3, tiny, os.path.join(root, "warm-up"))
        dataset = make_dataset(dims, batch, steps)
        for rep in range(repeats):
            for label, run in runs:
                gc.collect()
                stamps, fit_s, loss = run(dims, batch, steps, dataset, os.path.join(root, f"{rep}"))
                if len(stamps) != steps:
                    raise RuntimeError(f"{label} ran {len(stamps)} steps, expected {steps}.")
                results[label]["wall"].append(per_step(stamps, warmup, 0))
                results[label]["cpu"].append(per_step(stamps, warmup, 1))
                results[label]["fit"].append(fit_s)
                results[label]["loss"].append(loss)
            print(f"  {name}: repeat {rep + 1}/{repeats} done", file=sys.stderr, flush=True)
    raw = results["raw PyTorch loop"]
    rows = []
    for label, r in results.items():
        same = all(a == b for a, b in zip(r["loss"], raw["loss"]))
        rows.append([
            name, label,
            _fmt_time(statistics.median(r["wall"])), _fmt_ratio(r["wall"], raw["wall"]),
            _fmt_time(statistics.median(r["cpu"])), _fmt_ratio(r["cpu"], raw["cpu"]),
            f"{statistics.median(r['fit']):.2f} s",
            "yes" if same else f"NO ({r['loss'][-1]:.9g} vs {raw['loss'][-1]:.9g})",
        ])
    return rows


def _fmt_ratio(values, raw):
    """Median of the per-repeat ratios (each run against the raw run of its own repeat), with their range."""
    ratios = [v / b for v, b in zip(values, raw)]
    if len(ratios) == 1:
        return f"{ratios[0]:.3f}x"
    return f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _fmt_time(seconds):
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def load():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# -- instruction counts ---------------------------------------------------------------------------------------------
# Time on a shared machine moves with the neighbours' load; the number of instructions a step executes does not.
# --instructions runs each variant of the small workload once under valgrind's callgrind and counts the
# instructions (all threads, the TensorBoard writer's included) from stamp 200 to stamp 300, switched on and off
# from inside the process through callgrind's client requests (a 3-line C helper, built here with the C compiler).
CALLGRIND_HELPER = """
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("window"); }
"""
COUNT_STEPS, COUNT_FROM, COUNT_TO = 400, 200, 300


class _StepClock:
    """The progress bar's clock under valgrind, which runs a step ~50x slower than natively: 250 us per reading
    (one reading per step, about a native small step), so the bar refreshes as often per step as it does natively."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        self.now += 250e-6
        return self.now


def count_child(label, helper):
    """Inside valgrind: run one variant, instrumenting only the steps between two stamps."""
    import ctypes

    import tasktrain.callbacks.progress.rich_progress as rich_progress
    import tasktrain.callbacks.progress.tqdm_progress as progress

    global stamp
    lib = ctypes.CDLL(helper)
    seen = [0]

    def counting_stamp():
        seen[0] += 1
        if seen[0] == COUNT_FROM:
            lib.cg_start()
        elif seen[0] == COUNT_TO:
            lib.cg_stop()
        return 0.0, 0.0

    stamp = counting_stamp
    progress.time = rich_progress.time = _StepClock()  # the default bar is RichProgressBar when rich is installed
    dims, batch = WORKLOADS["small"][:2]
    run = dict(variants(with_log_off=True))[label]
    with tempfile.TemporaryDirectory(prefix="tasktrain-count-") as root:
        run(dims, batch, COUNT_STEPS, make_dataset(dims, batch, COUNT_STEPS), root)


def count_instructions():
    import re
    import shutil
    import subprocess

    if not shutil.which("valgrind") or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        raise SystemExit("--instructions needs valgrind and its headers (apt-get install valgrind) and a C compiler.")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tasktrain-callgrind-") as tmp:
        source, helper = os.path.join(tmp, "cg.c"), os.path.join(tmp, "libcg.so")
        with open(source, "w") as f:
            f.write(CALLGRIND_HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", helper, source], check=True)
        counts = {}
        for label, _ in variants(with_log_off=True):
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={os.path.join(tmp, 'callgrind.%p')}", sys.executable, os.path.abspath(__file__),
                   "--count-child", label, "--helper", helper]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                                 env={**os.environ, "PYTHONHASHSEED": "0"})
            found = re.findall(r"Collected : ([\d,]+)", out.stderr)
            if out.returncode != 0 or not found:
                raise RuntimeError(f"valgrind run of {label!r} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            counts[label] = int(found[-1].replace(",", "")) / (COUNT_TO - COUNT_FROM)
            print(f"  {label}: {counts[label]:,.0f} instructions per step", file=sys.stderr, flush=True)
    raw = counts["raw PyTorch loop"]
    print(f"Instructions per step, small workload (steps {COUNT_FROM}-{COUNT_TO} of {COUNT_STEPS}, valgrind "
          f"--tool=callgrind, one run each: repeat runs differ by about 0.1%).")
    print("| variant | instructions per step | ratio to raw | over raw |")
    print("|---|---|---|---|")
    for label, n in counts.items():
        print(f"| {label} | {n:,.0f} | {n / raw:.3f}x | {n - raw:+,.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps and 2 repeats")
    parser.add_argument("--repeats", type=int, help="override the repeats of every workload")
    parser.add_argument("--medium-steps", type=int, help="optimizer steps of the medium workload")
    parser.add_argument("--small-steps", type=int, help="optimizer steps of the small workload")
    parser.add_argument("--medium-width", type=int, help="hidden width of the medium workload (the tests' smoke run "
                        "shrinks it: what they check is the table, not the times)")
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="run one workload")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared machine more threads make every time "
                             "depend on the neighbours' load)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under valgrind instead of timing (slow: ~1-2 min a variant)")
    parser.add_argument("--count-child", help=argparse.SUPPRESS)
    parser.add_argument("--helper", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.count_child:
        return count_child(args.count_child, args.helper)
    if args.instructions:
        return count_instructions()

    load_before = load()
    all_rows = []
    for name, (dims, batch, steps, warmup, repeats) in WORKLOADS.items():
        if args.only and name != args.only:
            continue
        if args.quick:
            steps, warmup, repeats = QUICK[name]
        if name == "medium" and args.medium_steps:
            steps, warmup = args.medium_steps, min(warmup, args.medium_steps // 4)
        if name == "small" and args.small_steps:
            steps, warmup = args.small_steps, min(warmup, args.small_steps // 4)
        if name == "medium" and args.medium_width:
            dims = (dims[0], args.medium_width, args.medium_width, dims[-1])
        repeats = args.repeats or repeats
        print(f"{name}: MLP {'-'.join(map(str, dims))}, batch {batch}, {steps} steps, warm-up {warmup}, "
              f"{repeats} repeats", file=sys.stderr, flush=True)
        all_rows += measure(name, dims, batch, steps, warmup, repeats, with_log_off=(name == "small"),
                            warm_round=not (args.quick and name == "medium"))

    print(f"Machine: {machine()}, {args.threads} torch thread(s); load average {load_before} before, {load()} after.")
    header = ["workload", "variant", "wall per step", "wall ratio (range)", "CPU per step", "CPU ratio (range)",
              "fit (wall)", "final loss = raw"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in all_rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
