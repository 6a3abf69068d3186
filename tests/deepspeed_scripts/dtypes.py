"""Parameter dtypes under ZeRO-3 with the host's float16 probe pinned both ways (issue 13). One process.

    python dtypes.py --out OUT.json

DeepSpeed 0.19.8's zero.Init drops an explicit dtype when its accelerator says float16 is unsupported, so fp32
runs built under zero3_init got bf16 parameters on such CPUs only. Here `is_fp16_supported` is forced to True and
to False whatever this CPU is, and for each precision the parameters created under zero3_init, and the engine's
working copies (with and without zero3_init), are recorded. A last case makes DeepSpeed hand back the wrong dtype
on purpose and records the error the strategy raises.
"""
import argparse
import gc
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers import Linear, loader, quiet  # noqa: E402

from tasktrain import Callback, DeepSpeed, Trainer  # noqa: E402
from tasktrain.strategies.deepspeed.engine import import_deepspeed  # noqa: E402

# Test time only: DeepSpeed imported up front, then everything imported frozen out of the garbage collector, so that
# the full collection of each engine's teardown walks only what the runs made, not every module (~0.15 s of CPU less
# each).
import_deepspeed()
gc.freeze()


def dtypes(params):
    return sorted({str(getattr(p, "ds_tensor", p).dtype) for p in params})


class EngineDtypes(Callback):
    def __init__(self):
        self.seen = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen = dtypes(trainer.strategy.engine.module.parameters())


def run(precision, zero3_init):
    strategy = DeepSpeed(stage=3, zero3_init=zero3_init)
    record = EngineDtypes()
    trainer = Trainer(strategy=strategy, devices=1, precision=precision, max_steps=2, callbacks=[record], **quiet())
    with strategy.module_init_context():
        module = Linear()
    created = dtypes(module.parameters())
    partitioned = all(p.numel() == 0 for p in module.parameters())
    trainer.fit(module, loader(n=16, batch_size=8))
    return {"created": created, "engine": record.seen, "partitioned": partitioned}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    results = {}
    for fp16_supported in (True, False):
        accelerator.is_fp16_supported = lambda flag=fp16_supported: flag
        for precision in ("32-true", "bf16-mixed"):
            for zero3_init in (True, False):
                results[f"fp16={fp16_supported} {precision} zero3_init={zero3_init}"] = run(precision, zero3_init)

    # DeepSpeed handing back another dtype than asked is an error that names precision, version and dtype.
    init_set_dtype = deepspeed.zero.Init._set_dtype

    def always_half(self, ds_config, dtype):
        self.dtype = torch.float16

    deepspeed.zero.Init._set_dtype = always_half
    try:
        run("32-true", True)
        results["wrong dtype"] = "no error"
    except RuntimeError as err:
        results["wrong dtype"] = str(err)
    finally:
        deepspeed.zero.Init._set_dtype = init_set_dtype
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
