"""Per-rank CPU memory and step time of ZeRO-3 without offload, with CPU offload and with offload to disk, in one
run: a ~10M-parameter MLP, fp32, AdamW, 2 processes on CPU (gloo).

    python benchmarks/deepspeed_offload.py [--width 1600] [--layers 4] [--steps 12] [--nvme-path DIR] [--out r.json]

Each setting trains --steps optimizer steps through the Trainer. After the backward of the third micro-batch every
rank counts the bytes of the distinct tensor storages it holds (benchmarks/deepspeed_memory.py's count: RSS does not
show differences of this size), and the bytes of its swap files on disk; the step time is the median wall time of
an optimizer step after the first two. Offload to disk ("nvme") swaps into --nvme-path (default: a temporary folder
under the working directory; a local disk, not tmpfs). The printed table goes into docs/deepspeed.md.
"""
import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_memory import MLP, live_tensors, storages  # noqa: E402

from tasktrain import Callback, DeepSpeed, Trainer, seed_everything  # noqa: E402

MB = 2 ** 20


def disk_bytes(folder, rank):
    total = 0
    for where, _, files in os.walk(folder):
        if f"rank{rank}" in where.split(os.sep):
            total += sum(os.path.getsize(os.path.join(where, f)) for f in files)
    return total


class Measure(Callback):
    def __init__(self, folder):
        self.folder = folder
        self.tensor_bytes = None
        self.disk_bytes = 0
        self.step_times = []
        self._batch = -1
        self._started = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._batch = batch_idx
        if self._started is None:
            self._started = time.perf_counter()

    def on_after_backward(self, trainer, module):
        if self._batch == 2:
            self.tensor_bytes = sum(storages(live_tensors()).values())
            if self.folder:
                self.disk_bytes = disk_bytes(self.folder, trainer.global_rank)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx % 2 == 1:  # an optimizer step ended (accumulation 2)
            now = time.perf_counter()
            self.step_times.append(now - self._started)
            self._started = now


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--bucket", type=int, default=3_000_000, help="ZeRO reduce/allgather bucket size (elements)")
    p.add_argument("--nvme-path", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    folder = args.nvme_path or os.path.abspath("deepspeed_offload_swap")
    os.makedirs(folder, exist_ok=True)
    settings = {
        "none": dict(stage=3),
        "cpu": dict(stage=3, offload_optimizer=True, offload_parameters=True),
        "nvme": dict(stage=3, offload_optimizer=True, offload_parameters=True, offload_device="nvme",
                     nvme_path=folder),
    }
    rows = {}
    for name, kwargs in settings.items():
        seed_everything(0)
        x = torch.randn(4 * args.steps * 8, args.width)
        loader = DataLoader(TensorDataset(x, x.roll(1, dims=1)), batch_size=8)
        measure = Measure(folder if name == "nvme" else None)
        config = {"zero_optimization": {"reduce_bucket_size": args.bucket, "allgather_bucket_size": args.bucket}}
        trainer = Trainer(strategy=DeepSpeed(config=config, **kwargs), devices=2, max_steps=args.steps,
                          accumulate_grad_batches=2, logger=False, enable_progress_bar=False,
                          enable_checkpointing=False, callbacks=[measure])
        module = MLP(args.width, args.layers)
        numel = sum(p.numel() for p in module.parameters())
        trainer.fit(module, loader)
        step = statistics.median(measure.step_times[2:])
        rows[name] = trainer.strategy.all_gather_object({"tensor_bytes": measure.tensor_bytes,
                                                         "disk_bytes": measure.disk_bytes, "step_s": step})
        del module, trainer
        gc.collect()

    if int(os.environ.get("RANK", "0")) != 0:
        return
    if args.nvme_path is None:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\nZeRO-3, {numel / 1e6:.2f}M parameters (fp32 = {numel * 4 / MB:.1f} MiB), AdamW, 2 ranks, accumulation "
          f"2, {args.steps} steps; per rank (rank 0 / rank 1)\n")
    print("| offload | CPU memory (tensors) | on disk (swap files) | step time |")
    print("|---|---|---|---|")
    for name, per_rank in rows.items():
        memory = " / ".join(f"{r['tensor_bytes'] / MB:.1f} MiB" for r in per_rank)
        disk = " / ".join(f"{r['disk_bytes'] / MB:.1f} MiB" for r in per_rank)
        step = " / ".join(f"{r['step_s'] * 1e3:.0f} ms" for r in per_rank)
        print(f"| {name} | {memory} | {disk} | {step} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"parameters": numel, "per_rank": rows}, f, indent=1)


if __name__ == "__main__":
    main()
