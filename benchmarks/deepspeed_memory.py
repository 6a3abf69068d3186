"""Per-rank memory of DeepSpeed ZeRO stages 0-3: a ~10M-parameter MLP, fp32, AdamW, 2 processes on CPU (gloo).

    python benchmarks/deepspeed_memory.py [--width 1600] [--layers 4] [--bucket 3000000] [--out results.json]
    python benchmarks/deepspeed_memory.py --quick      # a 0.5M-parameter model: the same shares, in seconds

Each stage trains 2 optimizer steps of 2 accumulated micro-batches through the Trainer. After the backward of
the first micro-batch of the second step (the optimizer state exists; the gradients of an unfinished window are
held) every rank counts the bytes of the distinct tensor storages it holds (views of one buffer count once),
sorted by what holds them:

    parameters       the module's parameters (stage 3: this rank's partition, p.ds_tensor)
    master weights   the fp32 partitions ZeRO steps, where they are not the parameters themselves
    optimizer state  AdamW's exp_avg / exp_avg_sq
    gradients        every other live tensor: the gradients (p.grad, ZeRO's partitions and reduce buckets) and the
                     batch; the activations are freed by then

RSS is useless at this size (the allocator keeps freed pages, torch's libraries alone are ~500 MB): the counts
come from the tensors themselves. ZeRO's reduce bucket is set to --bucket elements (DeepSpeed's default, 5e8
elements, would add a 1.9 GiB buffer at stage 3 that the CPU never touches beyond what it reduces). The printed
table goes into docs/deepspeed.md.
"""
import argparse
import gc
import json
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tasktrain import Callback, DeepSpeed, TaskModule, Trainer, seed_everything  # noqa: E402

MB = 2 ** 20


class MLP(TaskModule):
    def __init__(self, width, layers):
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def storages(tensors):
    """{storage pointer: bytes} of the tensors' storages (views of one storage count once)."""
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            storage = t.untyped_storage()
            if storage.nbytes():
                out[storage.data_ptr()] = storage.nbytes()
    return out


def live_tensors():
    gc.collect()
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on some lazily created torch objects warns
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor):
                    found.append(obj)
            except ReferenceError:
                pass
    # A .grad made by autograd has no Python object until someone asks for it: gc cannot see it.
    return found + [t.grad for t in found if t.grad is not None]


class Measure(Callback):
    def __init__(self):
        self.bytes = None
        self._batch = -1

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._batch = batch_idx

    def on_after_backward(self, trainer, module):
        if self._batch != 2:  # the first micro-batch of the second step
            return
        engine = trainer.strategy.engine
        basic = engine.basic_optimizer
        params = [getattr(p, "ds_tensor", p) for p in engine.module.parameters()]
        held = storages(params)
        # ZeRO's fp32 partitions: in the optimizer's groups at stages 1-2, swapped in only while stepping at 3
        zero = engine.optimizer
        copies = [p for g in basic.param_groups for p in g["params"]]
        copies += list(getattr(zero, "single_partition_of_fp32_groups", [])) + \
            list(getattr(zero, "fp32_partitioned_groups_flat", []))
        masters = {k: v for k, v in storages(copies).items() if k not in held}
        state = storages([v for s in basic.state.values() for v in s.values()])
        everything = storages(live_tensors())
        counted = {**held, **masters, **state}
        rest = {k: v for k, v in everything.items() if k not in counted}
        self.bytes = {"parameters": sum(held.values()), "master weights": sum(masters.values()),
                      "optimizer state": sum(state.values()), "gradients": sum(rest.values())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--bucket", type=int, default=3_000_000, help="ZeRO reduce/allgather bucket size (elements)")
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="a 2 x Linear(512, 512) model (tests/test_deepspeed.py)")
    args = p.parse_args()
    if args.quick:
        args.width, args.layers = 512, 2

    rows = {}
    for stage in (0, 1, 2, 3):
        seed_everything(0)
        x = torch.randn(64, args.width)
        loader = DataLoader(TensorDataset(x, x.roll(1, dims=1)), batch_size=8)
        measure = Measure()
        config = {"zero_optimization": {"reduce_bucket_size": args.bucket, "allgather_bucket_size": args.bucket}}
        trainer = Trainer(strategy=DeepSpeed(stage=stage, config=config), devices=2, max_steps=2,
                          accumulate_grad_batches=2, logger=False,
                          enable_progress_bar=False, enable_checkpointing=False, callbacks=[measure])
        module = MLP(args.width, args.layers)
        numel = sum(p.numel() for p in module.parameters())
        trainer.fit(module, loader)
        rows[stage] = trainer.strategy.all_gather_object(measure.bytes)
        del module, trainer
        gc.collect()

    if int(os.environ.get("RANK", "0")) != 0:
        return
    kinds = ["parameters", "master weights", "optimizer state", "gradients"]
    print(f"\n{numel / 1e6:.2f}M parameters (fp32 = {numel * 4 / MB:.1f} MiB), AdamW, 2 ranks, accumulation 2, "
          f"bucket {args.bucket:,} elements; MiB per rank (rank 0 / rank 1)\n")
    print(f"| stage | {' | '.join(kinds)} | total |")
    print("|---|" + "---|" * (len(kinds) + 1))
    for stage, per_rank in rows.items():
        cells = [" / ".join(f"{r[k] / MB:.1f}" for r in per_rank) for k in kinds]
        total = " / ".join(f"{sum(r.values()) / MB:.1f}" for r in per_rank)
        print(f"| {stage} | {' | '.join(cells)} | {total} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"parameters": numel, "bytes_per_rank": rows}, f, indent=1)


if __name__ == "__main__":
    main()
