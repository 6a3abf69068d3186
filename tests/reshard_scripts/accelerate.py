"""The Accelerator's own loop, saved with save_state after step 3 and continued, or resumed with load_state on
another number of processes (`tasktrain launch --num_processes N accelerate.py ...`, or plain python for one).

    python accelerate.py --root DIR --runs '[{"name": "a2", "batch": 4}, {"name": "r1", "batch": 8, "load": "a2"}]'

Each run: the data, model and optimizer of train.py (next to this file); DIR/NAME.ids.rank{R}.txt records the
samples of every step; DIR/NAME.state/ is the save_state of step 3 (when the run does not load one);
DIR/NAME.out.pt (rank 0) the final weights and (but under DeepSpeed or FSDP) optimizer state. `strategy`: a
DeepSpeed name (deepspeed_stage_2), "fsdp" or none.
"""
import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import Net, Numbered  # noqa: E402

from tasktrain import Accelerator, DataLoaderConfiguration, seed_everything  # noqa: E402

SAVE_AT, EPOCHS = 3, 2


class Steps:
    """The loop's step counter, saved and loaded with the rest (register_for_checkpointing)."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def strategy_of(spec):
    name = spec.get("strategy")
    if name and name.startswith("deepspeed"):
        from tasktrain import DeepSpeed

        return DeepSpeed(stage=int(name[-1]), gradient_clipping=0.0)
    return name  # "fsdp"; None: DDP on several processes, one device on one


def run(root, spec):
    seed_everything(7)
    # a data seed: the order is then one function of (seed, epoch) on any number of processes, so a resume on another
    # number continues the very order (without it, the order is Accelerate's, which depends on the number)
    accelerator = Accelerator(cpu=True, strategy=strategy_of(spec),
                              dataloader_config=DataLoaderConfiguration(data_seed=7))
    net = Net()
    optimizer = net.configure_optimizers()
    model, optimizer, loader = accelerator.prepare(net.body, optimizer,
                                                   DataLoader(Numbered(), batch_size=spec["batch"], shuffle=True))
    steps = Steps()
    accelerator.register_for_checkpointing(steps)
    if spec.get("load"):
        accelerator.load_state(os.path.join(root, f"{spec['load']}.state"))
    ids_file = os.path.join(root, f"{spec['name']}.ids.rank{accelerator.process_index}.txt")
    while loader.epoch < EPOCHS:
        epoch = loader.epoch
        for x, y, ids in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps.value += 1
            with open(ids_file, "a") as f:
                f.write(json.dumps({"epoch": epoch, "step": steps.value, "ids": ids.tolist()}) + "\n")
            if steps.value == SAVE_AT and not spec.get("load"):
                accelerator.save_state(os.path.join(root, f"{spec['name']}.state"))
    params = accelerator.get_state_dict(model)  # every process: ZeRO-3 gathers
    if accelerator.is_main_process:
        out = {"params": {f"body.{k}": v.detach().clone() for k, v in params.items()}, "global_step": steps.value}
        if not spec.get("strategy"):  # DeepSpeed's is its engine's (partitioned, flat); FSDP's, shards
            out["optimizer"] = optimizer.state_dict()
        torch.save(out, os.path.join(root, f"{spec['name']}.out.pt"))
    accelerator.end_training()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--runs", required=True)
    args = p.parse_args()
    for spec in json.loads(args.runs):
        run(args.root, spec)


if __name__ == "__main__":
    main()
