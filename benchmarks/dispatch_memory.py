"""Peak resident memory of loading a checkpoint: plain torch.load + load_state_dict vs load_checkpoint_and_dispatch.

    python benchmarks/dispatch_memory.py [--layers 24] [--width 2048] [--cpu-budget 40MB] [--shard-size 100MB]

Each way runs in a fresh process and reports how much its peak RSS (VmHWM in /proc/self/status) rose above its
resting RSS before loading. The model is a stack of bias-free Linear layers (layers * width**2 * 4 bytes); the
dispatched loads keep `--cpu-budget` in CPU memory and offload the rest to a temporary folder on disk, from one torch
file, and from safetensors shards of `--shard-size` (Hugging Face's layout, written by save_model) in float32 (the
disk part is read from the shards themselves) and in bfloat16 (converted and copied to the offload folder).
Linux only.
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
    from tasktrain.inference import save_model
    save_model(model, folder + "/shards", max_shard_size=sys.argv[6])
    with torch.no_grad():
        y16 = model.to(torch.bfloat16)(x.to(torch.bfloat16))
    torch.save({"x": x, "y": y, "y16": y16}, folder + "/io.pt")
    sys.exit(0)
io = torch.load(folder + "/io.pt")
from tasktrain.inference import load_checkpoint_and_dispatch
dtype = torch.bfloat16 if mode == "shards_bf16" else None
before = status("VmRSS:")
start = time.perf_counter()
if mode == "torch_load":
    with torch.device("meta"):
        model = build()
    model.load_state_dict(torch.load(folder + "/ckpt.pt", weights_only=True)["state_dict"], assign=True)
else:
    checkpoint = folder + ("/ckpt.pt" if mode == "dispatch" else "/shards")
    model = load_checkpoint_and_dispatch(build, checkpoint, max_memory={"cpu": budget}, dtype=dtype,
                                         offload_folder=folder + "/offload-" + mode)
loaded = time.perf_counter()
with torch.no_grad():
    y = model(io["x"].to(dtype or torch.float32))
done = time.perf_counter()
print(json.dumps({"peak_increase": status("VmHWM:") - before, "load_s": loaded - start,
                  "forward_s": done - loaded, "equal": torch.equal(y, io["y16" if dtype else "y"])}))
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
    parser.add_argument("--shard-size", default="100MB")
    args = parser.parse_args()
    model_bytes = args.layers * args.width**2 * 4
    with tempfile.TemporaryDirectory() as folder:
        common = [folder, str(args.layers), str(args.width), args.cpu_budget, args.shard_size]
        start = time.perf_counter()
        run(args, "write", *common)
        shards = [os.path.join(folder, "shards", n) for n in os.listdir(os.path.join(folder, "shards"))
                  if n.endswith(".safetensors")]
        print(f"model: {model_bytes / 2**20:.0f} MiB ({args.layers} x Linear({args.width}, {args.width})), "
              f"checkpoints written in {time.perf_counter() - start:.1f} s: one torch file, and {len(shards)} "
              f"safetensors shards of at most {max(map(os.path.getsize, shards)) / 2**20:.0f} MiB")
        budget = f"cpu {args.cpu_budget}, rest on disk"
        for mode, label in (("torch_load", "torch.load + load_state_dict"),
                            ("dispatch", f"load_checkpoint_and_dispatch, torch file ({budget})"),
                            ("shards", f"load_checkpoint_and_dispatch, safetensors shards ({budget})"),
                            ("shards_bf16", f"  the same with dtype=bfloat16 ({budget})")):
            r = run(args, mode, *common)
            print(f"{label:75s} peak RSS +{r['peak_increase'] / 2**20:7.0f} MiB "
                  f"({100 * r['peak_increase'] / model_bytes:5.1f}% of the model), load {r['load_s']:.2f} s, "
                  f"forward {r['forward_s']:.3f} s, outputs equal: {r['equal']}")


if __name__ == "__main__":
    main()
