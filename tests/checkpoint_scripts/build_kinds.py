"""Build one tiny checkpoint of every kind tasktrain writes, in one process (tests/test_checkpoint_fuzz.py):

    python build_kinds.py OUT_DIR

    OUT_DIR/trainer.ckpt          a Trainer checkpoint (one file)
    OUT_DIR/accelerator/          Accelerator.save_state (tasktrain's layout)
    OUT_DIR/accelerate/           Accelerator.save_state(layout="accelerate") (Accelerate's file names)
    OUT_DIR/deepspeed.ckpt/       a ZeRO-2 checkpoint directory (Adam: moments in the ZeRO files)
    OUT_DIR/fsdp.ckpt/            an FSDP checkpoint directory (DCP shards + our state file)
    OUT_DIR/model.safetensors     one safetensors file
    OUT_DIR/sharded/              Hugging Face shards + model.safetensors.index.json
    OUT_DIR/bin/                  pytorch_model.bin (safe_serialization=False)

Each is written by the strategy that owns it, in a world of one; the runs are 2 steps of a 4-1 linear model.
"""
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers import Linear, loader, quiet  # noqa: E402

from tasktrain import Accelerator, Callback, Trainer  # noqa: E402
from tasktrain.inference.saving import save_model  # noqa: E402
from tasktrain.strategies.deepspeed.engine import import_deepspeed  # noqa: E402

# Test time only: DeepSpeed imported up front, then everything imported frozen out of the garbage collector, so that
# the full collection of each engine's teardown walks only what the runs made, not every module (~0.15 s of CPU less
# each).
import_deepspeed()
gc.freeze()


class Adam(Linear):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class SaveAtEnd(Callback):
    def __init__(self, path):
        self.path = path

    def on_train_end(self, trainer, module):  # a world of one ends its process group when fit returns
        trainer.save_checkpoint(self.path)


def fit_and_save(strategy, path):
    root = os.path.join(os.path.dirname(path), "runs")  # the "last" pointer goes there
    Trainer(strategy=strategy, devices=1, max_steps=2, callbacks=[SaveAtEnd(path)], default_root_dir=root,
            **quiet()).fit(Adam(), loader())


def main(out):
    os.makedirs(out, exist_ok=True)
    fit_and_save("single_device", os.path.join(out, "trainer.ckpt"))
    model = torch.nn.Linear(4, 2)
    for layout in ("tasktrain", "accelerate"):
        accelerator = Accelerator()
        prepared, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=0.01))
        prepared(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        accelerator.save_state(os.path.join(out, "accelerator" if layout == "tasktrain" else "accelerate"),
                               layout=layout)
        accelerator.end_training()
    weights = {"a.weight": torch.randn(8, 4), "a.bias": torch.randn(8), "b.weight": torch.randn(2, 8)}
    save_model(weights, out)
    save_model(weights, os.path.join(out, "sharded"), max_shard_size="100B")
    save_model(weights, os.path.join(out, "bin"), safe_serialization=False)
    fit_and_save("fsdp", os.path.join(out, "fsdp.ckpt"))
    fit_and_save("deepspeed_stage_2", os.path.join(out, "deepspeed.ckpt"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
