"""Helper for tests/test_lightning_beside_ddp_order.py (run by beside_lightning_ddp.py, or alone under torchrun with 2
processes; the yardstick's Lightning test test_model_checkpoint_no_extraneous_invocations, docs/lightning.md): a fit
with ModelCheckpoint(monitor="val_loss", save_top_k=-1) under Lightning's DDP, then under tasktrain's in the same
process group; each rank counts the torch.save calls during the fit (Lightning: one per checkpoint on rank 0, none on
the others) and writes OUT/rank{R}.json with the count and the checkpoint files.

    torchrun --standalone --nproc_per_node 2 saves_beside_lightning.py OUT
"""
import gc
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_lightning_beside_loggers import loader, module_class  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def main(out, close=True):
    import lightning.pytorch as L

    import tasktrain

    seen = {}
    for name, pkg, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        calls = []
        real_save = torch.save

        class CountSaves(pkg.callbacks.ModelCheckpoint):
            def on_train_start(self, trainer, pl_module):
                def counted(*args, **kwargs):
                    calls.append(1)
                    return real_save(*args, **kwargs)

                torch.save = counted

            def on_train_end(self, trainer, pl_module):
                super().on_train_end(trainer, pl_module)
                torch.save = real_save

        folder = os.path.join(out, name)
        trainer = pkg.Trainer(default_root_dir=folder, logger=False, accelerator="cpu", devices=2, strategy="ddp",
                              max_epochs=3, limit_val_batches=1, num_sanity_val_steps=0, enable_progress_bar=False,
                              enable_model_summary=False,
                              callbacks=[CountSaves(dirpath=os.path.join(folder, "ckpt"), monitor="val_loss",
                                                    save_top_k=-1)])
        try:
            trainer.fit(module_class(base)(), loader(), loader(4))
        finally:
            torch.save = real_save
        trainer.strategy.barrier()
        seen[name] = {"saves": len(calls), "files": sorted(os.listdir(os.path.join(folder, "ckpt")))}
        del trainer
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    if close:  # (as loggers_beside_lightning.py: every rank closes Lightning's group together)
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
