"""Resume a fit from a checkpoint directory under its strategy, in one process (tests/test_checkpoint_safety.py):

    python resume_from.py FSDP_DIR DEEPSPEED_DIR

prints "<strategy>: <error type>: <message>" per fit (a fit that succeeds prints "<strategy>: resumed")."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from build_kinds import Adam  # noqa: E402
from helpers import loader, quiet  # noqa: E402

from tasktrain import Trainer  # noqa: E402


def resume(strategy, path):
    try:
        Trainer(strategy=strategy, devices=1, max_steps=4, default_root_dir=os.path.dirname(path),
                **quiet()).fit(Adam(), loader(), ckpt_path=path)
        print(f"{strategy}: resumed", flush=True)
    except Exception as err:
        print(f"{strategy}: {type(err).__name__}: {err}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    resume("fsdp", sys.argv[1])
    resume("deepspeed_stage_2", sys.argv[2])
