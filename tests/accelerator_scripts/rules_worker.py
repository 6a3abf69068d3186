"""Accelerate's gradient accumulation and scheduler rules, checked against a hand loop (tests/test_accelerate_options.py).

    python rules_worker.py OUT_DIR [tasktrain|accelerate]       (one process, or under a launcher: each rank)

Each case trains a prepared model with accumulate(), backward, optimizer.step, scheduler.step, zero_grad, and beside
it a plain model by hand, on the batches every rank got (gathered), following Accelerate's rules as written in its
docs and source: a window ends every `num_steps` micro-batches, and at the loader's last batch unless
sync_with_dataloader=False (then windows run on across epochs); every loss is divided by num_steps, also in a
short window; at each optimizer step the scheduler steps once per process (a OneCycleLR not past total_steps);
step_scheduler_with_optimizer=False steps it at every call. With the argument `accelerate` the same cases run on
Accelerate itself (the rename rule backwards), so the test can check that the hand loop is Accelerate's.
Writes OUT_DIR/<framework>_rank{r}.json: per case, the learning rates after each micro-batch (prepared and by
hand), the windows' ends, and the largest weight difference from the hand loop.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = sys.argv[2] if len(sys.argv) > 2 else "tasktrain"
if FRAMEWORK == "accelerate":
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import GradientAccumulationPlugin
else:
    from tasktrain import Accelerator, GradientAccumulationPlugin

STEPS = 3  # micro-batches per window
EPOCHS = 2
CASES = {
    "lambda": {},
    "lambda_no_adjust": {"adjust_scheduler": False},
    "onecycle": {"scheduler": "onecycle"},
    "onecycle_no_adjust": {"scheduler": "onecycle", "adjust_scheduler": False},
    "no_sync_with_dataloader": {"sync_with_dataloader": False},
    "scheduler_every_call": {"step_scheduler_with_optimizer": False},
    "compiled": {"dynamo_backend": "eager"},
}


def model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def scheduler_of(optimizer, kind):
    if kind == "onecycle":  # total_steps below what W scheduler steps per optimizer step reach: the cap acts
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=6)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


def step_scheduler_by_hand(scheduler, times):
    for _ in range(times):
        if hasattr(scheduler, "total_steps") and scheduler._step_count > scheduler.total_steps:
            return
        scheduler.step()


def run(name, options):
    kind = options.get("scheduler", "lambda")
    plugin = GradientAccumulationPlugin(num_steps=STEPS, adjust_scheduler=options.get("adjust_scheduler", True),
                                        sync_with_dataloader=options.get("sync_with_dataloader", True))
    accelerator = Accelerator(gradient_accumulation_plugin=plugin, dynamo_backend=options.get("dynamo_backend"),
                              step_scheduler_with_optimizer=options.get("step_scheduler_with_optimizer", True))
    world = accelerator.num_processes
    g = torch.Generator().manual_seed(3)
    # 4 samples a batch on each process: 10 batches on one process (windows 3 3 3 1), 5 on two (3 2)
    dataset = TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g))
    model, optimizer = model_and_optimizer()
    scheduler = scheduler_of(optimizer, kind)
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, DataLoader(dataset, batch_size=4),
                                                            scheduler)
    hand, hand_optimizer = model_and_optimizer()
    hand_scheduler = scheduler_of(hand_optimizer, kind)
    with_optimizer = options.get("step_scheduler_with_optimizer", True)
    sync_with_dataloader = options.get("sync_with_dataloader", True)

    lrs, hand_lrs, syncs, hand_syncs, count = [], [], [], [], 0
    for _ in range(EPOCHS):
        length = len(data)
        for index, (x, y) in enumerate(data):
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            syncs.append(accelerator.sync_gradients)
            lrs.append(optimizer.param_groups[0]["lr"])

            # by hand: every rank's batch of this micro-step (DDP averages their gradients: the mean over all)
            xs, ys = accelerator.gather((x.contiguous(), y.contiguous()))
            count += 1
            if sync_with_dataloader and index == length - 1:
                sync, count = True, 0
            else:
                sync = count % STEPS == 0
            (F.cross_entropy(hand(xs), ys) / STEPS).backward()  # / num_steps, a short window too
            if sync:
                hand_optimizer.step()
                if with_optimizer:
                    step_scheduler_by_hand(hand_scheduler, world)
                hand_optimizer.zero_grad()
            if not with_optimizer:
                hand_scheduler.step()
            hand_syncs.append(sync)
            hand_lrs.append(hand_optimizer.param_groups[0]["lr"])
    mine = accelerator.unwrap_model(model)
    difference = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(mine.parameters(),
                                                                                 hand.parameters()))
    result = {"lrs": lrs, "hand_lrs": hand_lrs, "syncs": syncs, "hand_syncs": hand_syncs, "difference": difference,
              "compiled": hasattr(model, "_orig_mod"), "unwrapped_type": type(mine).__name__,
              "world": world, "rank": accelerator.process_index}
    if FRAMEWORK == "accelerate":  # a fresh Accelerate state for the next case, as its own test scripts do
        AcceleratorState._reset_state()
        GradientState._reset_state()
    return result


def main():
    out_dir = sys.argv[1]
    results = {name: run(name, options) for name, options in CASES.items()}
    rank = results["lambda"]["rank"]
    with open(os.path.join(out_dir, f"{FRAMEWORK}_rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if FRAMEWORK == "accelerate" and torch.distributed.is_initialized():
        # Accelerate leaves its gloo group to the interpreter's exit, where gloo's threads can abort the process
        # ("terminate called without an active exception": FINDINGS, DDP with gloo): references first, then the group
        import gc

        del results
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
