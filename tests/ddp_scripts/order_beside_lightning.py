"""Helper for tests/test_lightning_beside_ddp_order.py, started by torchrun with 2 processes: the same fits over a
sequential DataLoader (shuffle=False) under Lightning's DDP, then under tasktrain's in the same process group, with
and without seed_everything and with overfit_batches, and over two training loaders in a dict (issue 37: each sharded), then tasktrain's fits
resumed from the middle of an epoch; each rank writes
OUT/rank{R}.json with, per fit, the sample indices of every batch it trained on ((epoch, batch_idx) order) and the
weights after.

    torchrun --standalone --nproc_per_node 2 order_beside_lightning.py OUT
"""
import gc
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
SEED_VARS = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS")
CASES = {"no seed": dict(seed=None), "seed 7": dict(seed=7), "overfit": dict(seed=None, overfit_batches=2),
         "combined": dict(seed=None, combined=True)}


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(22, 3, generator=g)
    return TensorDataset(torch.arange(22), x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))


def small():
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(4))
    return TensorDataset(torch.arange(100, 107), x, x @ torch.tensor([[0.5], [1.0], [-1.0]]))


def fit(lib, base, seed, overfit_batches=0, callbacks=(), ckpt_path=None, combined=False):
    for var in SEED_VARS:
        os.environ.pop(var, None)
    if seed is None:
        torch.manual_seed(0)  # the weights' draw; the sampler's seed is then Lightning's default, 0
    else:
        lib.seed_everything(seed, verbose=False)
    rows = []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            if combined:  # {"a": batch, "b": batch} of two loaders (max_size_cycle), each sharded by the strategy
                rows.append([self.current_epoch, batch_idx, {k: v[0].tolist() for k, v in batch.items()}])
                return sum(torch.nn.functional.mse_loss(self.layer(x), y) for _, x, y in batch.values())
            index, x, y = batch
            rows.append([self.current_epoch, batch_idx, index.tolist()])
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                          overfit_batches=overfit_batches, callbacks=list(callbacks),
                          enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(data(), batch_size=2, shuffle=False)
    if combined:
        loader = {"a": loader, "b": DataLoader(small(), batch_size=1, shuffle=True)}
    trainer.fit(module, loader, ckpt_path=ckpt_path)
    weights = [v for p in module.layer.parameters() for v in p.detach().flatten().tolist()]
    result = {"batches": rows, "weights": weights}
    if combined:  # trainer.train_dataloader: the loaders as given, each with a DistributedSampler
        result["samplers"] = {k: isinstance(v.sampler, DistributedSampler) for k, v in trainer.train_dataloader.items()}
    del trainer
    return result


def main(out):
    import lightning.pytorch as L

    import tasktrain

    seen = {}
    for name, lib, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        seen[name] = {case: fit(lib, base, **kwargs) for case, kwargs in CASES.items()}
    # tasktrain's exact resume of that shuffled order: a fit resumed from the middle of its first epoch (step 3 of 6)
    saves = os.path.join(out, "checkpoints")
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    seen["resume"] = {"whole": fit(tasktrain, tasktrain.TaskModule, None, callbacks=[saver]),
                      "resumed": fit(tasktrain, tasktrain.TaskModule, None,
                                     ckpt_path=os.path.join(saves, "step=3.ckpt"))}
    # the same over two combined loaders: a resume at step 5 (the middle of epoch 0, loader b cycled once) goes on
    # with the batch an uninterrupted run takes next
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves + "-combined", every_n_train_steps=5, save_top_k=-1,
                                                filename="{step}")
    seen["resume combined"] = {
        "whole": fit(tasktrain, tasktrain.TaskModule, None, callbacks=[saver], combined=True),
        "resumed": fit(tasktrain, tasktrain.TaskModule, None, combined=True,
                       ckpt_path=os.path.join(saves + "-combined", "step=5.ckpt"))}
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    # Lightning made the group (tasktrain joined it): nothing that holds gloo work may outlive it, then every rank
    # closes it together (FINDINGS.md: gloo aborts at exit otherwise)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
