"""ModelParallelStrategy runs of a tiny Llama-like model; every rank writes what it saw to OUT.rank{R}.pt.

    python train.py --root DIR --out OUT --case mesh    # 4 processes (self-launched), one process group, in order:
        A (dp=2, tp=2): 6 AdamW steps (STEPS), a DCP checkpoint after step 3 (SAVE_AT; and a one-file one), losses
            and final weights
        B (dp=2, tp=2): resumed from A's step-3 checkpoint to step 6
        C (dp=4, tp=1) and D (dp=1, tp=4): resumed from the same checkpoint; weights as loaded, then 3 steps
        G (dp=4 as 2 replicas x 2 shards, tp=1): HSDP, resumed from the same checkpoint
        E: the Accelerator with ParallelismConfig(dp_shard_size=2, tp_size=2): A's 6 steps in a loop of its own
        F: the same loop with ParallelismConfig(dp_replicate_size=2, dp_shard_size=2): HSDP, no tensor parallel
        H: E's save_state after step 3 loaded by ParallelismConfig(dp_shard_size=4) (dp only), steps 4 to 6
        then what Lightning's tensor_parallel example and Accelerate's nd_parallel script do (example_patterns.py)
    python train.py ... --case examples                 # those two only
(tests/test_model_parallel.py calls fit() in its own process for the 1-process runs: the reference on the full
batch without any parallelism, and (dp=1, tp=1) resumed from the step-3 checkpoint.)
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from tasktrain import Callback, CSVLogger, TaskModule, Trainer, seed_everything
from tasktrain.strategies.model_parallel import ModelParallelStrategy

VOCAB, DIM, HEADS, SEQ, LAYERS = 32, 16, 4, 8, 2
SAMPLES, BATCH = 80, 8  # per data-parallel rank: BATCH // dp (the 1-process reference reads BATCH)
# 6 steps, saved after 3: every comparison of tests/test_model_parallel.py reads as well after 3 steps as after 5, and
# each step of a 4-process mesh on 2 cores costs ~0.1 s of CPU per rank (10 and 5 before: ~25 steps more per rank).
STEPS, SAVE_AT = 6, 3
CLIP = 0.5  # the gradient norm is above it in the first steps: the clipped norm is over every shard of every mesh


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS // tp of them (ColwiseParallel splits wq/wk/wv)
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def parallelize(model, tp):
    """torchtitan's plan for Llama: attention and feed-forward split by heads / hidden units, norms sequence-parallel,
    the output sharded over the vocabulary (the loss then runs under loss_parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    parallelize_module(model, tp, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for block in model.layers:
        parallelize_module(block, tp, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


def cross_entropy(logits, targets):
    from torch.distributed.tensor import DTensor

    if isinstance(logits, DTensor):  # sharded over the vocabulary: cross-entropy without gathering it
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Llama(TaskModule):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

    def configure_model(self):
        mesh = self.device_mesh
        if mesh is None or mesh["tensor_parallel"].size() == 1:
            return  # the strategy shards over data parallel by itself (or no strategy of ours: the reference)
        parallelize(self, mesh["tensor_parallel"])
        if mesh["data_parallel"].size() > 1:  # as Lightning's example: the user shards the blocks and the root
            from torch.distributed.fsdp import fully_shard

            for block in self.layers:
                fully_shard(block, mesh=mesh["data_parallel"])
            fully_shard(self, mesh=mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        loss = cross_entropy(self(tokens), targets)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)


def loader(batch_size, shuffled=False):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=g)
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    if shuffled:  # the global order of the ranks' DistributedSampler(shuffle=True, seed=0) (Lightning's)
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
        return torch.utils.data.DataLoader(data, batch_size=batch_size, sampler=sampler)
    return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)


def build():
    seed_everything(0)
    return Llama()


class Record(Callback):
    """Losses per step, the whole weights (gathered) when training starts (after a resume) and ends, and a
    checkpoint after step SAVE_AT when asked."""

    def __init__(self, save=None):
        self.losses, self.start, self.end, self.save = [], None, None, save
        self.summed, self.logged = [], []

    def on_train_start(self, trainer, module):
        self.start = {k: v.detach().clone() for k, v in trainer.strategy.full_state_dict().items()}  # not live

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()))
        self.summed.append(float(trainer.strategy.reduce(torch.tensor(1.0), op="sum")))
        if self.save and trainer.global_step == SAVE_AT:
            for path in self.save:
                trainer.save_checkpoint(path)

    def on_train_end(self, trainer, module):
        self.end = {k: v.detach().clone() for k, v in trainer.strategy.full_state_dict().items()}


def fit(dp, tp, batch, steps, ckpt=None, save=(), csv=None, shuffled=False, **strategy_options):
    """shuffled (single device): read the order the Trainer's DistributedSampler gives the sequential loader under
    ModelParallelStrategy, so that a one-process reference compares with the mesh's runs."""
    record = Record(save)
    strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp, **strategy_options) \
        if dp else "single_device"
    trainer = Trainer(strategy=strategy, devices=(dp * tp) if dp else 1, accelerator="cpu", max_steps=steps,
                      callbacks=[record], logger=CSVLogger(csv, name="", version="") if csv else False,
                      log_every_n_steps=1, gradient_clip_val=CLIP, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(build(), loader(batch, shuffled), ckpt_path=ckpt)
    mesh = trainer.strategy.device_mesh if dp else None
    return dict(losses=record.losses, start=record.start, end=record.end, summed=record.summed,
                data_parallel=trainer.strategy.data_parallel_size,
                mesh=(mesh.mesh_dim_names, tuple(mesh.shape)) if dp else None,
                data_parallel_rank=trainer.strategy.data_parallel_rank if dp else 0)


def accelerate_fit(steps, dp_replicate=1, dp_shard=2, tp=2, save=None, load=None):
    """Accelerate's way: the script parallelizes the model on accelerator.torch_device_mesh["tp"] before prepare;
    prepare shards it over the data-parallel dimension (fully_shard) and the loader over the data-parallel ranks.
    save: save_state there after step SAVE_AT; load: load_state from there first (and skip the batches it read)."""
    from torch.distributed.tensor.parallel import loss_parallel

    from tasktrain import Accelerator, ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=dp_replicate, dp_shard_size=dp_shard, tp_size=tp)
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    mesh = accelerator.torch_device_mesh
    model = build()
    if tp > 1:
        parallelize(model, mesh["tp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model, optimizer, data = accelerator.prepare(model, optimizer, loader(BATCH // (dp_replicate * dp_shard)))
    losses, start, first, saved = [], None, 0, None
    if load:
        accelerator.load_state(load)
        start = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
        first = SAVE_AT
        data = accelerator.skip_first_batches(data, SAVE_AT)
    for step, (tokens, targets) in enumerate(data, start=first):
        loss = cross_entropy(model(tokens), targets)
        if tp > 1:  # the script's own loss_parallel around the Accelerator's (which nests safely)
            with loss_parallel():
                accelerator.backward(loss)
        else:
            accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
        if save and step + 1 == SAVE_AT:
            accelerator.save_state(save)
            saved = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
        if step + 1 == steps:
            break
    end = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
    return dict(losses=losses, end=end, start=start, saved=saved, mesh=(mesh.mesh_dim_names, tuple(mesh.shape)),
                ranks=(accelerator.data_parallel_shard_rank, accelerator.tensor_parallel_rank),
                total_batch_size=data.total_batch_size)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {}
    dcp, one_file = os.path.join(args.root, "saved.ckpt"), os.path.join(args.root, "saved-one-file.ckpt")
    if args.case == "mesh":
        out["A"] = fit(2, 2, BATCH // 2, STEPS, save=[dcp], csv=os.path.join(args.root, "A"))
        out["A_file"] = fit(2, 2, BATCH // 2, SAVE_AT, save=[one_file], save_distributed_checkpoint=False)
        out["B"] = fit(2, 2, BATCH // 2, STEPS, ckpt=dcp)
        out["B_file"] = fit(2, 2, BATCH // 2, STEPS, ckpt=one_file)
        out["C"] = fit(4, 1, BATCH // 4, STEPS, ckpt=dcp)
        out["D"] = fit(1, 4, BATCH, STEPS, ckpt=dcp, csv=os.path.join(args.root, "D"))
        out["G"] = fit(4, 1, BATCH // 4, STEPS, ckpt=dcp, data_parallel_replicate_size=2)  # HSDP: 2 replicas x 2
        state = os.path.join(args.root, "accelerator_state")
        out["E"] = accelerate_fit(STEPS, save=state)
        out["F"] = accelerate_fit(STEPS, dp_replicate=2, dp_shard=2, tp=1)  # HSDP
        out["H"] = accelerate_fit(STEPS, dp_replicate=1, dp_shard=4, tp=1, load=state)  # E's state on dp-only
    if args.case in ("mesh", "examples"):  # Lightning's tensor_parallel example, Accelerate's nd_parallel script
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import example_patterns

        out["lightning_example"] = example_patterns.lightning_example(os.path.join(args.root, "lightning"))
        out["accelerate_example"] = example_patterns.accelerate_example(os.path.join(args.root, "accelerate"))
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.save(out, f"{args.out}.rank{rank}.pt")


if __name__ == "__main__":
    sys.exit(main())
