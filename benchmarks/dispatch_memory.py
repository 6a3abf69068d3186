"""Peak resident memory of loading a checkpoint: plain torch.load + load_state_dict vs load_checkpoint_and_dispatch.

    python benchmarks/dispatch_memory.py [--layers 24] [--width 2048] [--cpu-budget 40MB]

Each way runs in a fresh process and reports how much its peak RSS (VmHWM in /proc/self/status) rose above its
resting RSS before loading. The model is a stack of bias-free Linear layers (layers * width**2 * 4 bytes); the
dispatched load keeps `--cpu-budget` in CPU memory and offloads the rest to a temporary folder on disk. Linux only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import json, sys, time, torch
from torch import nn

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

mode, folder, layers, width, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
build = lambda: nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
if mode == "write":
    torch.manual_seed(0)
    model = build()
    x = torch.randn(4, width)
    with torch.no_grad():
        y = model(x)
    torch.save({"state_dict": model.state_dict()}, folder + "/ckpt.pt")
    torch.save({"x": x, "y": y}, folder + "/io.pt")
    sys.exit(0)
io = torch.load(folder + "/io.pt")
from tasktrain.inference import load_checkpoint_and_dispatch
before = status("VmRSS:")
start = time.perf_counter()
if mode == "torch_load":
    with torch.device("meta"):
        model = build()
    model.load_state_dict(torch.load(folder + "/ckpt.pt", weights_only=True)["state_dict"], assign=True)
else:
    model = load_checkpoint_and_dispatch(build, folder + "/ckpt.pt", max_memory={"cpu": budget},
                                         offload_dir=folder + "/offload")
loaded = time.perf_counter()
with torch.no_grad():
    y = model(io["x"])
done = time.perf_counter()
print(json.dumps({"peak_increase": status("VmHWM:") - before, "load_s": loaded - start,
                  "forward_s": done - loaded, "equal": torch.equal(y, io["y"])}))
"""


def run(args, *extra):
    result = subprocess.run([sys.executable, "-c", WORKER, *extra], check=True, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    return json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--cpu-budget", default="40MB")
    args = parser.parse_args()
    model_bytes = args.layers * args.width**2 * 4
    with tempfile.TemporaryDirectory() as folder:
        common = [folder, str(args.layers), str(args.width), args.cpu_budget]
        start = time.perf_counter()
        run(args, "write", *common)
        print(f"model: {model_bytes / 2**20:.0f} MiB ({args.layers} x Linear({args.width}, {args.width})), "
              f"checkpoint written in {time.perf_counter() - start:.1f} s")
        for mode, label in (("torch_load", "torch.load + load_state_dict"),
                            ("dispatch", f"load_checkpoint_and_dispatch (cpu {args.cpu_budget}, rest on disk)")):
            r = run(args, mode, *common)
            print(f"{label:60s} peak RSS +{r['peak_increase'] / 2**20:7.0f} MiB "
                  f"({100 * r['peak_increase'] / model_bytes:5.1f}% of the model), load {r['load_s']:.2f} s, "
                  f"forward {r['forward_s']:.3f} s, outputs equal: {r['equal']}")


if __name__ == "__main__":
    main()
