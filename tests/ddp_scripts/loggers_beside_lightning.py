"""Helper for tests/test_lightning_beside_ddp_order.py (run by beside_lightning_ddp.py, or alone under torchrun with 2
processes; the test was in tests/test_lightning_beside_loggers.py): the same logger class of
the user's (no base class) under Lightning's DDP fit, then under tasktrain's in the same process group (tasktrain
joins a group that exists); each rank writes OUT/rank{R}.json with the calls each logger got.

    torchrun --standalone --nproc_per_node 2 loggers_beside_lightning.py OUT
"""
import gc
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_lightning_beside_loggers import CallLog, loader, module_class  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def main(out, close=True):
    import lightning.pytorch as L

    import tasktrain

    seen = {}
    for name, pkg, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        logger = CallLog(os.path.join(out, name))
        trainer = pkg.Trainer(default_root_dir=os.path.join(out, name), logger=logger, accelerator="cpu", devices=2,
                              strategy="ddp", max_epochs=1, limit_val_batches=1, log_every_n_steps=1,
                              num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module_class(base)(), loader(), loader(4))
        seen[name] = logger.calls
        del trainer
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    if close:  # (beside_lightning_ddp.py runs the scripts in turn, and closes the group after the last)
        # Lightning made the group (tasktrain joined it, so it leaves it alone): nothing that holds gloo work may
        # outlive it, then every rank closes it together (FINDINGS.md: gloo aborts at exit otherwise)
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
