"""The 2-process beside-Lightning runs of tests/test_lightning_beside_ddp_order.py in one torchrun launch: the
scripts' main functions one after the other in the same two processes and process group (each run alone was a launch
of its own: its torchrun agent and two interpreters importing torch, Lightning and tasktrain, ~7 s of CPU each), each
writing OUT/NAME/rank{R}.json as it does alone:

    seeds    seeds_beside_lightning.py: DataLoader workers' draws under Lightning's DDP fit and tasktrain's
    loggers  loggers_beside_lightning.py: a user's logger's calls on every rank
    saves    saves_beside_lightning.py: torch.save calls on each rank during a fit with a monitored ModelCheckpoint
    order    order_beside_lightning.py: the training order, samplers, resumes, and last its fits SIGTERMed

The seed variables a script's seed_everything leaves are cleared before the next script, so that each starts as it
would alone (order_beside_lightning.py clears them before each of its fits too).

    torchrun --standalone --nproc_per_node 2 beside_lightning_ddp.py OUT
"""
import os
import sys

import loggers_beside_lightning
import order_beside_lightning
import saves_beside_lightning
import seeds_beside_lightning

SEED_VARS = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS")
SCRIPTS = (("seeds", seeds_beside_lightning), ("loggers", loggers_beside_lightning), ("saves", saves_beside_lightning),
           ("order", order_beside_lightning))


def main(out):
    for position, (name, script) in enumerate(SCRIPTS):
        for var in SEED_VARS:
            os.environ.pop(var, None)
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        script.main(folder, close=position == len(SCRIPTS) - 1)  # the last one closes the group


if __name__ == "__main__":
    main(sys.argv[1])
