"""The module's optimization hooks on 2 real processes (gloo): one launch, two fits in the same process group, DDP
then DeepSpeed ZeRO stage 2. The module warms the learning rate up in optimizer_step (Lightning's documented
example), records optimizer_zero_grad and backward (not under DeepSpeed, whose engine runs it), and clips in
configure_gradient_clipping through self.clip_gradients. Each rank writes OUT/<strategy>.rank<R>.json: the weights, the learning rates each step ran with,
and the hook counts. tests/test_lightning_ddp.py runs main() at the end of extras_ddp.py's launch (OUT: its hooks/).

    python optimization_hooks.py OUT
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import regression_data  # noqa: E402

from tasktrain import TaskModule, Trainer  # noqa: E402

WARMUP, LR = 4, 0.1


class WarmUp(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)
        self.lrs, self.counts = [], {"optimizer_zero_grad": 0, "backward": 0, "configure_gradient_clipping": 0}

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        self.lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step(closure=optimizer_closure)
        # Lightning's docs: warm the learning rate up without a scheduler (global_step counts the step just taken)
        if self.trainer.global_step < WARMUP:
            for group in optimizer.param_groups:
                group["lr"] = min(1.0, float(self.trainer.global_step + 1) / WARMUP) * LR

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.counts["optimizer_zero_grad"] += 1
        optimizer.zero_grad()

    def backward(self, loss, *args, **kwargs):
        self.counts["backward"] += 1
        loss.backward(*args, **kwargs)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.counts["configure_gradient_clipping"] += 1
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)


class EngineBackward(WarmUp):
    """DeepSpeed runs its engine's backward: an override of backward is refused there (tests/test_lightning_compat.py)."""

    backward = TaskModule.backward


def fit(name, out, module):
    x, y = regression_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=8)  # 2 ranks x 8: 2 steps per epoch
    trainer = Trainer(strategy=name, accelerator="cpu", devices=2, max_epochs=3, gradient_clip_val=0.5,
                      logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                      default_root_dir=out)
    trainer.fit(module, loader)
    facts = {"weights": [p.detach().flatten().tolist() for p in module.layer.parameters()], "lrs": module.lrs,
             "counts": module.counts, "global_step": trainer.global_step}
    with open(os.path.join(out, f"{name}.rank{trainer.global_rank}.json"), "w") as f:
        json.dump(facts, f)
    return trainer


def main(out):
    fit("ddp", out, WarmUp())
    fit("deepspeed_stage_2", out, EngineBackward())


if __name__ == "__main__":
    main(sys.argv[1])
