"""Two-process DeepSpeed runs on the digits classifier; every rank writes what it saw to OUT.rank{R}.pt.

    python train.py --root DIR --out OUT --case compare            # DDP, then ZeRO 1, 2, 3 (fp32, accumulation 2,
                                                                   # clipping; ZeRO 2 through Lightning's
                                                                   # DeepSpeedStrategy and its default config:
                                                                   # overlap_comm, buckets, ...); stage 3 builds the
                                                                   # module under zero3_init and checkpoints every
                                                                   # step
    python train.py --root DIR --out OUT --case resume --kill-at K # stage 3 as above, rank 1 SIGKILLed after step K
    python train.py --root DIR --out OUT --case resume --resume    # ... continued from ckpt_path="last"
    python train.py --root DIR --out OUT --case offload            # ZeRO 2 + optimizer offload (CPUAdam), with an
                                                                   # in-process resume; ZeRO 3 + offload, bf16,
                                                                   # save_16bit_model
    python train.py --root DIR --out OUT --case compare offload    # both in one launch (the processes and their
                                                                   # imports start once); OUT is written after each
    python train.py ... --case compare offload --kill-at K         # ... then the "resume" case's stage 3 fit under
                                                                   # DIR/killed, rank 1 SIGKILLed after step K: the
                                                                   # launch ends there (OUT written before it)

The Trainer self-launches rank 1 (devices=2); both ranks run every fit in order and share one process group.
"""
import argparse
import contextlib
import gc
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import Classifier, digits_loaders  # noqa: E402

from tasktrain import Callback, DeepSpeed, ModelCheckpoint, Trainer, seed_everything  # noqa: E402
from tasktrain.strategies import DeepSpeedStrategy  # noqa: E402
from tasktrain.strategies.deepspeed.engine import import_deepspeed  # noqa: E402

# Test time only: DeepSpeed imported up front, then everything imported frozen out of the garbage collector, so that
# the full collection of each engine's teardown walks only what the runs made, not every module (~0.15 s of CPU less
# each).
import_deepspeed()
gc.freeze()

EPOCHS = 2  # 22 batches of 32 per rank and epoch, accumulation 2: 11 optimizer steps per epoch


class Record(Callback):
    """Per-batch losses of this rank, and the whole trained weights at the end (gathered under stage 3)."""

    def __init__(self):
        self.losses = []
        self.weights = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer, module):
        full = getattr(trainer.strategy, "full_state_dict", None)
        state = full() if full is not None else module.state_dict()
        self.weights = {k: v.detach().float().clone() for k, v in state.items()}


class StopAtStart(Callback):
    """The whole weights and the step a resumed fit starts training from; then it stops (no batch is trained)."""

    def on_train_start(self, trainer, module):
        self.weights = {k: v.detach().float().clone() for k, v in trainer.strategy.full_state_dict().items()}
        self.global_step = trainer.global_step
        trainer.should_stop = True


class KillRank(Callback):
    def __init__(self, step, rank):
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


def fit(name, strategy, root, precision=None, callbacks=(), ckpt_path=None, epochs=EPOCHS, hidden=64, save_after=False,
        **kwargs):
    seed_everything(0)
    train, val = digits_loaders(batch_size=32)
    record = Record()
    trainer = Trainer(strategy=strategy, devices=2, max_epochs=epochs, precision=precision,
                      accumulate_grad_batches=2, gradient_clip_val=0.5, logger=False, enable_progress_bar=False,
                      enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                      num_sanity_val_steps=0, default_root_dir=os.path.join(root, name),
                      callbacks=[record, *callbacks], **kwargs)
    # zero3_init: the parameters are created partitioned (module_init_context is a no-op otherwise)
    with strategy.module_init_context() if isinstance(strategy, DeepSpeed) else contextlib.nullcontext():
        module = Classifier(hidden=hidden)
    created_partitioned = all(p.numel() == 0 for p in module.parameters())
    start = time.perf_counter()
    trainer.fit(module, train, val, ckpt_path=ckpt_path)
    seconds = time.perf_counter() - start
    val_acc = float(trainer.callback_metrics["val_acc"])
    after = {}
    if save_after:  # Lightning's: the engine outlives fit, and trainer.save_checkpoint(...) writes its shards
        trainer.save_checkpoint(os.path.join(root, name, "after_fit"))
        after["weights_after_fit"] = {k: v.float().clone() for k, v in trainer.strategy.full_state_dict().items()}
    # the trained module itself (under stage 3 still partitioned) evaluated again, through a new engine
    validate_after_fit = trainer.validate(module, val)[0]["val_acc"]
    if save_after:  # ... and after validate (its engine's weights, no optimizer), read back by a fresh Trainer
        trainer.save_checkpoint(os.path.join(root, name, "after_validate"))
        fresh = Trainer(strategy=type(strategy)(stage=strategy.zero_stage()), devices=2, logger=False,
                        enable_progress_bar=False)
        after["validate_saved_after_validate"] = fresh.validate(Classifier(hidden=hidden), val, ckpt_path=os.path.join(
            root, name, "after_validate"))[0]["val_acc"]
        # a new Trainer resumes from the directory saved after fit: its weights and step where training would go on
        seed_everything(0)
        start = StopAtStart()
        Trainer(strategy=type(strategy)(stage=strategy.zero_stage()), devices=2, max_epochs=epochs + 1,
                accumulate_grad_batches=2, gradient_clip_val=0.5, logger=False, enable_progress_bar=False,
                enable_checkpointing=False, num_sanity_val_steps=0, callbacks=[start]).fit(
            Classifier(hidden=hidden), train, val, ckpt_path=os.path.join(root, name, "after_fit"))
        after.update(resumed_weights=start.weights, resumed_step=start.global_step)
    return {"created_partitioned": created_partitioned, "losses": record.losses, "weights": record.weights,
            "val_acc": val_acc, "validate_after_fit": validate_after_fit, "global_step": trainer.global_step,
            "seconds": seconds, **after,
            "last": trainer.checkpoint_callback.last_model_path if trainer.checkpoint_callback else None,
            "best_k": sorted(trainer.checkpoint_callback.best_k_models) if trainer.checkpoint_callback else None}


def stage3_checkpointed(root, callbacks=(), ckpt_path=None):
    checkpoint = ModelCheckpoint(every_n_train_steps=1, every_n_epochs=None, save_top_k=2, save_last=True,
                                 monitor="step", mode="max")
    result = fit("stage3", DeepSpeed(stage=3, zero3_init=True), root, callbacks=[*callbacks, checkpoint],
                 ckpt_path=ckpt_path)
    # A fresh Trainer and module evaluate the last checkpoint directory (its shards consolidated on load).
    trainer = Trainer(strategy="deepspeed_stage_3", devices=2, logger=False, enable_progress_bar=False)
    metrics = trainer.validate(Classifier(hidden=64), digits_loaders(batch_size=32)[1], ckpt_path=result["last"])
    result["validate_last"] = metrics[0]["val_acc"]
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--case", choices=("compare", "resume", "offload"), nargs="+", required=True)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    results = {}
    if "compare" in args.case:
        results["ddp"] = fit("ddp", "ddp", args.root)
        weights = ModelCheckpoint(dirpath=os.path.join(args.root, "weights"), filename="final", every_n_epochs=EPOCHS,
                                  save_weights_only=True)
        results["stage1"] = fit("stage1", "deepspeed_stage_1", args.root, callbacks=[weights])
        # Lightning's name and defaults (its config: overlap_comm, contiguous_gradients, 2e8 buckets, aio,
        # activation_checkpointing) on the same engine
        # (and trainer.save_checkpoint after fit and after validate, resumed and read back: Lightning's engine
        # outlives the run)
        results["stage2"] = fit("stage2", DeepSpeedStrategy(stage=2), args.root, save_after=True)
        results["stage3"] = stage3_checkpointed(args.root)
        torch.save(results, f"{args.out}.rank{rank}.pt")  # what is done is kept, should a later case fail
    if "resume" in args.case:
        kill = [KillRank(args.kill_at, rank=1)] if args.kill_at is not None else []
        results["stage3"] = stage3_checkpointed(args.root, kill, ckpt_path="last" if args.resume else None)
    if "offload" in args.case:
        offload = DeepSpeed(stage=2, offload_optimizer=True)
        results["stage2_offload"] = fit("s2off", offload, args.root)
        checkpoint = ModelCheckpoint(every_n_epochs=1, save_last=True)
        fit("s2off_resumed", DeepSpeed(stage=2, offload_optimizer=True), args.root, callbacks=[checkpoint], epochs=1)
        results["stage2_offload_resumed"] = fit("s2off_resumed", DeepSpeed(stage=2, offload_optimizer=True),
                                                args.root, callbacks=[ModelCheckpoint(save_last=True)],
                                                ckpt_path="last")
        results["stage3_offload_bf16"] = fit("s3off", DeepSpeed(stage=3, offload_optimizer=True,
                                                                offload_parameters=True, save_16bit_model=True),
                                             args.root, precision="bf16-mixed",
                                             callbacks=[ModelCheckpoint(every_n_epochs=EPOCHS, save_last=True)])
    if args.kill_at is not None and "resume" not in args.case:
        # The kill-and-resume test's killed fit, last in this launch (its process start-up and DeepSpeed's imports
        # paid once, not again in a launch of its own): what is above is written first, as the kill ends the launch.
        torch.save(results, f"{args.out}.rank{rank}.pt")
        if rank == 0:  # (flushed: rank 0's output of the runs above is all before this line)
            print("-- the killed fit starts --", flush=True)
        stage3_checkpointed(os.path.join(args.root, "killed"), [KillRank(args.kill_at, rank=1)])
        results["killed_fit_ended"] = True  # (never: rank 1 is killed and the launch ends)
    torch.save(results, f"{args.out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
