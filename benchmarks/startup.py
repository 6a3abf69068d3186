"""What tasktrain adds to a program's start: import time, and the time to the first optimizer step.

    python benchmarks/startup.py            # 7 repeats (`make bench`)
    python benchmarks/startup.py --quick    # one repeat

Every number comes from a fresh Python process (nothing cached in the interpreter; the OS file cache is warm after
the first repeat, as it is for a user who runs a script twice), repeated and interleaved, median shown.
- import: one process times `import torch`, then `import tasktrain`, then `from tasktrain import Trainer,
  TaskModule`, each after the previous one; tasktrain's cost is what comes after torch.
- first step: the parent notes the wall clock, starts a process that builds a small MLP, a DataLoader and an Adam
  optimizer and trains one step (raw PyTorch, or tasktrain's Trainer with its defaults: TensorBoard logger,
  progress bar, checkpointing), and the child prints the wall clock right after its first optimizer step;
  "to exit" is when that process has finished (the Trainer writes its log and checkpoint after the step).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

IMPORTS = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    before = set(sys.modules)
    import tasktrain
    t2 = time.perf_counter()
    from tasktrain import Trainer, TaskModule
    t3 = time.perf_counter()
    pulled = sorted({m.split(".")[0] for m in set(sys.modules) - before} - {"tasktrain"})
    print(json.dumps({"torch": t1 - t0, "tasktrain": t2 - t1, "trainer": t3 - t1, "pulled": pulled}))
""")

RAW = textwrap.dedent("""
    import time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    loader = DataLoader(TensorDataset(torch.randn(256, 32), torch.randn(256, 1)), batch_size=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"FIRST_STEP {time.time()!r}", flush=True)
        optimizer.zero_grad()
        break
""")

TASKTRAIN = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from tasktrain import TaskModule, Trainer

    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                           torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss, prog_bar=True)
            return loss

        def on_before_zero_grad(self, optimizer):  # right after the optimizer step
            if self.global_step == 0:
                print(f"FIRST_STEP {time.time()!r}", flush=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(256, 32), torch.randn(256, 1)), batch_size=64)
    Trainer(max_steps=1, default_root_dir=sys.argv[1]).fit(Net(), loader)
""")


def child_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT") and not k.startswith("TASKTRAIN_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_imports():
    out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=300,
                         env=child_env(), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_first_step(script, workdir):
    start = time.time()
    out = subprocess.run([sys.executable, script, workdir], capture_output=True, text=True, timeout=300,
                         env=child_env(), cwd=workdir)
    end = time.time()
    if out.returncode != 0:
        raise RuntimeError(f"{script} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    stamps = re.findall(r"FIRST_STEP (\S+)", out.stdout)  # the progress bar's line may come before it
    if len(stamps) != 1:
        raise RuntimeError(f"{script} printed {len(stamps)} FIRST_STEP lines:\n{out.stdout[-3000:]}")
    return float(stamps[0]) - start, end - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat instead of 7")
    parser.add_argument("--repeats", type=int)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 7)

    results = {"torch": [], "tasktrain": [], "trainer": [], "raw_first": [], "raw_exit": [], "tt_first": [],
               "tt_exit": []}
    pulled = []
    with tempfile.TemporaryDirectory(prefix="tasktrain-startup-") as root:
        raw_script, tt_script = os.path.join(root, "raw.py"), os.path.join(root, "tasktrain_fit.py")
        with open(raw_script, "w") as f:
            f.write(RAW)
        with open(tt_script, "w") as f:
            f.write(TASKTRAIN)
        for rep in range(repeats):
            imports = run_imports()
            pulled = imports["pulled"]
            for key in ("torch", "tasktrain", "trainer"):
                results[key].append(imports[key])
            workdir = os.path.join(root, f"run{rep}")
            os.makedirs(workdir)
            first, total = run_first_step(raw_script, workdir)
            results["raw_first"].append(first)
            results["raw_exit"].append(total)
            first, total = run_first_step(tt_script, workdir)
            results["tt_first"].append(first)
            results["tt_exit"].append(total)
            print(f"  startup: repeat {rep + 1}/{repeats} done", file=sys.stderr, flush=True)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"Median of {repeats} fresh processes each; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    print("| measure | raw PyTorch | tasktrain | tasktrain - raw |")
    print("|---|---|---|---|")
    rows = [
        ("`import torch`, then `import tasktrain`", med["torch"], med["torch"] + med["tasktrain"]),
        ("`import torch`, then `from tasktrain import Trainer, TaskModule`", med["torch"], med["torch"] + med["trainer"]),
        ("process start to first optimizer step", med["raw_first"], med["tt_first"]),
        ("process start to exit (fit of one step)", med["raw_exit"], med["tt_exit"]),
    ]
    for name, raw, ours in rows:
        print(f"| {name} | {raw:.3f} s | {ours:.3f} s | {ours - raw:+.3f} s |")
    print(f"Packages that `from tasktrain import Trainer, TaskModule` imports beyond torch: {', '.join(pulled) or 'none'}.")


if __name__ == "__main__":
    main()
