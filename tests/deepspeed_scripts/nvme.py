"""ZeRO-3 with the optimizer state and the parameters offloaded to disk ("nvme": a local folder), 2 processes; every
rank writes what it saw to OUT.rank{R}.pt.

    python nvme.py --root DIR --out OUT --kill-at K
        CPU offload (the reference), then disk offload into DIR/swap checkpointing every step, then disk offload
        again (DIR/killed) with rank 1 SIGKILLed after optimizer step K (this launch ends there, killed)
    tasktrain launch --config_file nvme.yaml nvme.py --root DIR --out OUT --resume
        the killed run resumed from its last checkpoint, the strategy from the launch YAML (offload_*_device: nvme,
        a new swap folder: the old one is scratch, the checkpoint must not need it)

The model is the digits classifier with 8192 hidden units: its first weight is 64 x 8192 fp32 = 2 MiB, 1 MiB per
process, DeepSpeed's smallest swappable partition (smaller ones stay in memory).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import KillRank, fit  # noqa: E402

from tasktrain import DeepSpeed, ModelCheckpoint  # noqa: E402

HIDDEN = 8192


def swap_files(folder, rank):
    """This rank's swap files under `folder`, relative to it (DeepSpeed names a folder per rank)."""
    found = []
    for where, _, files in os.walk(folder):
        if f"rank{rank}" in where.split(os.sep):
            found += [os.path.relpath(os.path.join(where, f), folder) for f in files]
    return sorted(found)


def accelerator_steps(strategy, steps=4):
    """A custom loop: `steps` AdamW steps of the classifier; the strategy from the launch config when None."""
    from digits import Classifier, digits_loaders

    from tasktrain import Accelerator, seed_everything

    seed_everything(0)
    accelerator = Accelerator(strategy=strategy)
    model = Classifier(hidden=HIDDEN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = digits_loaders(batch_size=32)[0]
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    described = accelerator.strategy.describe()
    accelerator.free_memory()  # the engine goes; the process group stays for the next run
    return {"losses": losses, "strategy": described}


def on_disk(folder):
    return DeepSpeed(stage=3, offload_optimizer=True, offload_parameters=True, offload_device="nvme",
                     nvme_path=folder)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    results = {}
    if args.resume:
        # strategy "auto": the launch config's DeepSpeed, both offloads on disk in the YAML's folder
        results["resumed"] = fit("killed", "auto", args.root, hidden=HIDDEN, ckpt_path="last",
                                 callbacks=[ModelCheckpoint(every_n_train_steps=1, save_last=True)])
        results["resumed"]["swap_files"] = swap_files(os.path.join(args.root, "swap2"), rank)
        # The Accelerator: the launch config's disk offload, then CPU offload, a few steps each
        results["accelerator"] = {"nvme": accelerator_steps(None),
                                  "cpu": accelerator_steps(DeepSpeed(stage=3, offload_optimizer=True,
                                                                     offload_parameters=True))}
    else:
        results["cpu"] = fit("cpu", DeepSpeed(stage=3, offload_optimizer=True, offload_parameters=True), args.root,
                             hidden=HIDDEN)
        swap = os.path.join(args.root, "swap")
        os.makedirs(swap, exist_ok=True)
        results["nvme"] = fit("nvme", on_disk(swap), args.root, hidden=HIDDEN,
                              callbacks=[ModelCheckpoint(every_n_train_steps=1, save_last=True)])
        results["nvme"]["swap_files"] = swap_files(swap, rank)
        torch.save(results, f"{args.out}.rank{rank}.pt")
        results = {}
        fit("killed", on_disk(swap), args.root, hidden=HIDDEN,
            callbacks=[KillRank(args.kill_at, rank=1), ModelCheckpoint(every_n_train_steps=1, save_last=True)])
        return
    torch.save(results, f"{args.out}.resumed.rank{rank}.pt")


if __name__ == "__main__":
    main()
