"""Two-process FSDP runs on the digits classifier; every rank writes what it saw to OUT.rank{R}.pt.

    python train.py --root DIR --out OUT --case compare            # DDP, then FSDP (default wrap, checkpoints every
                                                                   # step), FSDP wrap={Linear} without resharding,
                                                                   # fsdp_cpu_offload, activation checkpointing,
                                                                   # bf16-mixed, 16-mixed (an inf
                                                                   # on one rank), bf16-true; fp32, accumulation
                                                                   # 2, clipping 0.5; reduce-scatters counted;
                                                                   # state_dict_type="full" files, resumed;
                                                                   # a 64 MiB model built on the meta device
    python train.py --root DIR --out OUT --case meta               # the meta-device model alone (and its full
                                                                   # checkpoint file loaded into a sharded one)
    python train.py --root DIR --out OUT --case compare --kill-at K   # ... then, once OUT is written, the "resume"
                                                                   # case's fit under DIR/killed, rank 1 SIGKILLed
                                                                   # after step K (the launch ends there)
    python train.py --root DIR --out OUT --case resume --kill-at K # FSDP as above, rank 1 SIGKILLed after step K
    python train.py --root DIR --out OUT --case resume --resume    # ... continued from ckpt_path="last"
    python train.py --root DIR --out OUT --case load --ckpt PATH --devices N --epochs E
                                               # a checkpoint on N ranks: validated, then trained on to epoch E
        ... --resume-root KILLED --resume-out OUT2   # then (2 ranks) the "resume --resume" case's fit of the run
                                               # killed under KILLED, its results in OUT2 (one launch for both)

The Trainer self-launches rank 1 (devices=2); both ranks run every fit in order and share one process group.
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import Classifier, digits_loaders  # noqa: E402

from tasktrain import FSDP, Callback, ModelCheckpoint, TaskModule, Trainer, seed_everything  # noqa: E402
from tasktrain.strategies import FSDPStrategy  # noqa: E402

EPOCHS = 2  # 22 batches of 32 per rank and epoch, accumulation 2: 11 optimizer steps per epoch
COUNTS = {"reduce_scatter": 0}
_reduce_scatter = dist.reduce_scatter_single


def _counted(*args, **kwargs):
    COUNTS["reduce_scatter"] += 1
    return _reduce_scatter(*args, **kwargs)


dist.reduce_scatter_single = _counted  # FSDP2 reduces gradients through it (torch/distributed/fsdp/_fully_shard)


class Record(Callback):
    """Per-batch losses and gradient norms of this rank, the reduce-scatters per optimizer step, and the whole
    trained weights at the end (gathered: every rank calls full_state_dict)."""

    def __init__(self):
        self.losses, self.norms, self.scatters = [], [], []
        self.weights = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.scatters.append(COUNTS["reduce_scatter"])

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.norms.append(float(trainer.strategy.clip_gradients(optimizer)))  # the norm after clipping to 0.5

    def on_train_end(self, trainer, module):
        state = trainer.strategy.full_state_dict()
        self.weights = {k: v.detach().float().clone() for k, v in state.items()}


class KillRank(Callback):
    def __init__(self, step, rank):
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


class InfOnOneRank(Callback):
    """16-mixed: at optimizer step `step`, after the backward, an inf goes into rank 1's own gradient shard only.
    Records
    the scaler's skipped-step count after every step and the whole weights before and after the poisoned step."""

    def __init__(self, step):
        self.step = step
        self.skipped, self.scales = [], []
        self.before = self.after = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batch_idx = batch_idx

    def on_after_backward(self, trainer, module):
        if trainer.global_step != self.step or self.batch_idx % 2 == 0:
            return  # not the poisoned step's last micro-batch (accumulation 2: it reduce-scatters the shards)
        if trainer.global_rank == 1:
            next(iter(module.parameters())).grad.to_local().view(-1)[0] = float("inf")
        self.before = trainer.strategy.full_state_dict()  # every rank gathers (a collective)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if (batch_idx + 1) % 2:
            return  # accumulation 2: the window's first micro-batch did not step
        self.skipped.append(trainer.strategy.precision.skipped_steps)
        self.scales.append(trainer.strategy.precision.scaler.get_scale())
        if trainer.global_step == self.step + 1:
            self.after = trainer.strategy.full_state_dict()


def fit(name, strategy, root, precision=None, callbacks=(), ckpt_path=None, epochs=EPOCHS, devices=2, example=False):
    seed_everything(0)
    train, val = digits_loaders(batch_size=32)
    record = Record()
    trainer = Trainer(strategy=strategy, devices=devices, max_epochs=epochs, precision=precision,
                      accumulate_grad_batches=2, gradient_clip_val=0.5, logger=False, enable_progress_bar=False,
                      enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                      num_sanity_val_steps=0, default_root_dir=os.path.join(root, name),
                      callbacks=[record, *callbacks])
    module = Classifier(hidden=64)
    if example:  # ModelSummary's In/Out sizes: the example forward runs on every rank (issue 37)
        module.example_input_array = torch.zeros(3, 64)
    COUNTS["reduce_scatter"] = 0
    start = time.perf_counter()
    trainer.fit(module, train, val, ckpt_path=ckpt_path)
    seconds = time.perf_counter() - start
    val_acc = float(trainer.callback_metrics["val_acc"])
    validate_after_fit = trainer.validate(module, val)[0]["val_acc"]
    return {"losses": record.losses, "norms": record.norms, "scatters": record.scatters, "weights": record.weights,
            "val_acc": val_acc, "validate_after_fit": validate_after_fit, "global_step": trainer.global_step,
            "seconds": seconds, "describe": trainer.strategy.describe(),
            "param_dtype": next(module.parameters()).dtype,  # a DTensor's dtype is its shards'
            "last": trainer.checkpoint_callback.last_model_path if trainer.checkpoint_callback else None}


def checkpointed(root, callbacks=(), ckpt_path=None):
    checkpoint = ModelCheckpoint(every_n_train_steps=1, every_n_epochs=None, save_top_k=2, save_last=True,
                                 monitor="step", mode="max")
    result = fit("fsdp", "fsdp", root, callbacks=[*callbacks, checkpoint], ckpt_path=ckpt_path)
    # A fresh Trainer and module evaluate the last checkpoint directory (DCP loads the shards into the new ones).
    trainer = Trainer(strategy="fsdp", devices=2, logger=False, enable_progress_bar=False)
    metrics = trainer.validate(Classifier(hidden=64), digits_loaders(batch_size=32)[1], ckpt_path=result["last"])
    result["validate_last"] = metrics[0]["val_acc"]
    return result


def full_files(root):
    """state_dict_type="full": one file gathered on rank 0 at the end of epoch 0; a new fit resumes from it."""
    first = fit("full", FSDP(state_dict_type="full"), root, callbacks=[ModelCheckpoint(save_last=True)], epochs=1)
    saved = torch.load(first["last"], weights_only=True) if os.path.isfile(first["last"]) else None
    resumed = fit("full", FSDP(state_dict_type="full"), root, callbacks=[ModelCheckpoint(save_last=True)],
                  ckpt_path="last")
    return {"full_first": first, "full_resumed": resumed,
            "full_file": None if saved is None else {"keys": sorted(saved["state_dict"]),
                                                      "optimizer_keys": sorted(saved["optimizer_states"][0]["state"])}}


class Wide(TaskModule):
    """16 layers of 1024 x 1024: 64 MiB of fp32 parameters, 32 MiB per rank once sharded."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(16))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        for block in self.blocks:
            x = torch.relu(block(x))
        return x.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class MeasuredFSDP(FSDP):
    """Records this process's resident memory around the set-up (where the shards are allocated and initialised)."""

    def setup_module_and_optimizers(self, module, optimizers, plan):
        import torch.distributed.checkpoint  # noqa: F401  (imports made by the set-up itself are not the model's)
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401

        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak (VmHWM) starts again from here: earlier fits of this process do not count
        self.rss_before = _rss()
        out = super().setup_module_and_optimizers(module, optimizers, plan)
        self.peak_growth = _peak() - self.rss_before
        return out


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


class MeasuredLoad(FSDP):
    """Records this process's peak resident memory while a whole-weights checkpoint file goes into the sharded
    module: from opening the file to the end of the module's and the optimizer's load."""

    def load_checkpoint(self, path):
        import ctypes
        import gc

        # Earlier fits of this process left freed memory in the allocator, which a new read would reuse without
        # growing the process: hand it back first, so that reading the file whole shows.
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.load_before = _rss()
        return super().load_checkpoint(path)

    def load_module_state_dict(self, state_dict, model=None, strict=True):
        super().load_module_state_dict(state_dict, model, strict)
        self.module_load_growth = _peak() - self.load_before  # the weights alone

    def load_optimizer_state(self, optimizer, state):
        super().load_optimizer_state(optimizer, state)
        self.load_growth = _peak() - self.load_before


def full_load(path, saved):
    """The whole-weights file `path` (written by rank 0) into a 64 MiB model built on the meta device and sharded
    over 2 ranks: rank 0 reads it and streams each rank its shard; the others must not read it whole."""
    strategy = MeasuredLoad(wrap={torch.nn.Linear})
    trainer = Trainer(strategy=strategy, devices=2, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, default_root_dir=os.path.dirname(path))
    with trainer.init_module(empty_init=True):
        module = Wide()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 1024)), batch_size=4)
    trainer.fit(module, data, ckpt_path=path)  # saved at step 2 of 2: loads, trains nothing more
    loaded = trainer.strategy.full_state_dict(module)
    return {"load_growth": strategy.load_growth, "module_load_growth": strategy.module_load_growth,
            "global_step": trainer.global_step,
            "same": sorted(loaded) == sorted(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)}


def meta_init(root):
    """trainer.init_module(empty_init=True): built on the meta device, each rank allocates and fills its shard."""
    strategy = MeasuredFSDP(wrap={torch.nn.Linear}, state_dict_type="full")  # (its checkpoint: one file)
    trainer = Trainer(strategy=strategy, devices=2, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, default_root_dir=os.path.join(root, "meta"))
    with trainer.init_module(empty_init=True):
        module = Wide()
    built_on_meta = all(p.is_meta for p in module.parameters())
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 1024)), batch_size=4)
    trainer.fit(module, data)
    full = trainer.strategy.full_state_dict(module)
    weight = full["blocks.0.weight"]
    # the trained model as one ordinary checkpoint file (gathered and written by rank 0), loaded by a new sharded fit
    path = os.path.join(root, "wide-full.ckpt")
    trainer.save_checkpoint(path)
    loaded = full_load(path, full)
    return {"built_on_meta": built_on_meta, "peak_growth": strategy.peak_growth, "full_load": loaded,
            "full_bytes": sum(p.numel() * 4 for p in module.parameters()),
            "local_bytes": sum(p.to_local().numel() * 4 for p in module.parameters()),
            "weight_std": float(weight.std()), "halves_differ": not torch.equal(weight[:512], weight[512:]),
            "global_step": trainer.global_step}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--case", choices=("compare", "resume", "load", "meta"), required=True)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--ckpt", default=None)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=EPOCHS + 1)
    p.add_argument("--resume-root", default=None)
    p.add_argument("--resume-out", default=None)
    args = p.parse_args()

    results = {}
    if args.case == "compare":
        results["ddp"] = fit("ddp", "ddp", args.root)
        results["fsdp"] = checkpointed(args.root)
        results["fsdp_linear"] = fit("fsdp_linear", FSDP(wrap={torch.nn.Linear}, reshard_after_forward=False),
                                     args.root, epochs=1, example=True)
        results["fsdp_offload"] = fit("fsdp_offload", "fsdp_cpu_offload", args.root, epochs=1)
        # The whole net (dropout inside) recomputed in the backward: the losses stay DDP's
        # (through Lightning's FSDPStrategy: its policies pick the unit and the recomputed block)
        results["fsdp_ac"] = fit("fsdp_ac", FSDPStrategy(auto_wrap_policy={torch.nn.Sequential},
                                                         activation_checkpointing_policy={torch.nn.Sequential}),
                                 args.root, epochs=1)
        results["fsdp_bf16"] = fit("fsdp_bf16", "fsdp", args.root, precision="bf16-mixed", epochs=1)
        poison = InfOnOneRank(step=6)
        results["fsdp_fp16"] = fit("fsdp_fp16", "fsdp", args.root, precision="16-mixed", epochs=1, callbacks=[poison])
        results["fsdp_fp16"].update(skipped=poison.skipped, scales=poison.scales, before=poison.before,
                                    after=poison.after)
        results["fsdp_bf16_true"] = fit("fsdp_bf16_true", "fsdp", args.root, precision="bf16-true", epochs=1)
        results.update(full_files(args.root))
        results["meta"] = meta_init(args.root)
        if args.kill_at is not None:
            # The kill-and-resume test's killed fit, last in this launch (its process start-up and imports paid
            # once, not again in a launch of its own): what is above is written first, as the kill ends the launch.
            rank = int(os.environ.get("RANK", "0"))
            torch.save(results, f"{args.out}.rank{rank}.pt")
            if rank == 0:  # (flushed: rank 0's output of the runs above is all before this line)
                print("-- the killed fit starts --", flush=True)
            checkpointed(os.path.join(args.root, "killed"), [KillRank(args.kill_at, rank=1)])
            results["killed_fit_ended"] = True  # (never: rank 1 is killed and the launch ends)
    elif args.case == "meta":
        results["meta"] = meta_init(args.root)  # alone: what the compare case measures last
    elif args.case == "resume":
        kill = [KillRank(args.kill_at, rank=1)] if args.kill_at is not None else []
        results["fsdp"] = checkpointed(args.root, kill, ckpt_path="last" if args.resume else None)
    else:
        # The checkpoint of a 2-rank fit, on args.devices ranks: evaluated, then trained on for one more epoch.
        trainer = Trainer(strategy="fsdp", devices=args.devices, logger=False, enable_progress_bar=False)
        train, val = digits_loaders(batch_size=32)
        module = Classifier(hidden=64)
        results["validate"] = trainer.validate(module, val, ckpt_path=args.ckpt)[0]["val_acc"]
        results["loaded"] = {k: v.float().clone() for k, v in trainer.strategy.full_state_dict(module).items()}
        results["more"] = fit("more", "fsdp", args.root, ckpt_path=args.ckpt, epochs=args.epochs, devices=args.devices,
                              callbacks=[ModelCheckpoint(every_n_epochs=1, save_last=True)])
    rank = int(os.environ.get("RANK", "0"))
    torch.save(results, f"{args.out}.rank{rank}.pt")
    if args.resume_root is not None:
        # The kill-and-resume test's resume, in this 2-process launch (its processes and imports started once): the
        # fit killed under resume_root continued from ckpt_path="last", as the "resume --resume" case runs it.
        assert args.case == "load" and args.devices == 2, "--resume-root goes with --case load --devices 2"
        if rank == 0:  # (flushed: rank 0's output of the load case is all before this line)
            print("-- the resume starts --", flush=True)
        resumed = {"fsdp": checkpointed(args.resume_root, ckpt_path="last")}
        torch.save(resumed, f"{args.resume_out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
