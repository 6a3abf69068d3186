"""What Lightning's tensor_parallel example (examples/pytorch/tensor_parallel: train.py, model.py, parallelism.py,
data.py) and Accelerate's ParallelismConfig script (examples/torch_native_parallelism/nd_parallel.py) do, written
small and after the import rename (lightning -> tasktrain, accelerate -> tasktrain), on 4 CPU processes. Not their
files: the same calls in the same order, with a tiny model. tests/mesh_scripts/train.py runs both in its launch.

Lightning's, as written there: the model under `self.model` with its blocks in a ModuleDict, each block's forward
taking (x, a positional buffer) through PrepareModuleInput with a None layout, the heads per rank set by the
parallelize function (`n_heads //= tp`), the torch import paths that example uses (torch.distributed._composable.fsdp,
torch.distributed._tensor), checkpoint_wrapper on each block put back into the ModuleDict, fully_shard with a bf16
MixedPrecisionPolicy and reshard_after_forward False for the last block, `training_step(self, batch)` with the loss
under loss_parallel(), `backward` overridden to run under loss_parallel() too, `train_dataloader` on the module,
`Trainer(limit_train_batches=, max_epochs=1)`, the model built under `trainer.init_module()`. Differences: CPU, so
no empty_init=True (refused on a CPU mesh, tests/test_model_parallel.py) and no on_train_start init_weights (random
init of DTensors on a CPU mesh; the weights are initialised before parallelizing instead); `trainer.print` is not
called (the Trainer has no print on this branch); num_workers=0.

Accelerate's, as written there: ParallelismConfig(dp_replicate_size, dp_shard_size, tp_size, cp_size) with an
fsdp_plugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=[decoder layer],
state_dict_type="SHARDED_STATE_DICT") beside it, mixed_precision="bf16", the model parallelized on
torch_device_mesh["tp"] before prepare, a batch dict, `maybe_context_parallel(buffers=, buffer_seq_dims=,
no_restore_buffers=)` around forward and backward, the loss averaged over torch_device_mesh["dp_cp"]'s group when
parallelism_config.dp_cp_dim_names, `optimizer.zero_grad(set_to_none=False)`, `save_state` while dp_shard is enabled,
accelerator.print. Differences: no transformers model with tp_plan="auto" (a model of ours with the same forward(**batch)
-> .loss, parallelized by the script as Accelerate's other examples do), no wandb.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, SEQ = 32, 16, 4, 8


# -- Lightning's example ---------------------------------------------------------------------------------------------
class LightningAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.head_dim = HEADS, DIM // HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x, positions):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.n_heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = q + positions[:s, None, :], k + positions[:s, None, :]  # a plain tensor beside the DTensor input
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class LightningFeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = LightningAttention(), LightningFeedForward()

    def forward(self, x, positions):
        h = x + self.attention(self.attention_norm(x), positions)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): TransformerBlock() for i in range(layers)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("positions", torch.randn(SEQ, DIM // HEADS) * 0.1, persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.positions)
        return self.output(self.norm(h))


def lightning_parallelize(model, device_mesh):
    """The example's parallelism.py, with the import paths it uses."""
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    from torch.distributed._composable.fsdp.fully_shard import fully_shard
    from torch.distributed._tensor import Replicate, Shard
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    dp_mesh, tp_mesh = device_mesh["data_parallel"], device_mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        model = parallelize_module(model, tp_mesh, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
            "norm": SequenceParallel(),
            "layers.0": PrepareModuleInput(input_layouts=(Replicate(), None), desired_input_layouts=(Shard(1), None),
                                           use_local_output=True),
        })
        for block in model.layers.values():
            parallelize_module(block, tp_mesh, {
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None),
                                                desired_input_layouts=(Replicate(), None)),
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "attention_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
                "ffn_norm": SequenceParallel(),
            })
            block.attention.n_heads //= tp_mesh.size()  # the heads this rank holds
    if dp_mesh.size() > 1:
        fsdp = {"mesh": dp_mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                   reduce_dtype=torch.float32)}
        for layer_id, block in model.layers.items():
            block = checkpoint_wrapper(block)
            fully_shard(block, **fsdp, reshard_after_forward=int(layer_id) < len(model.layers) - 1)
            model.layers[layer_id] = block
        model = fully_shard(model, **fsdp)
    return model


def lightning_example(out):
    from torch.distributed.tensor.parallel import loss_parallel

    from tasktrain import Callback, TaskModule, Trainer
    from tasktrain.strategies import ModelParallelStrategy

    seen = {"backward": 0, "batches": [], "losses": [], "dtypes": set()}

    class RandomTokenDataset(torch.utils.data.Dataset):
        def __init__(self, vocab_size, seq_length):
            self.tokens = torch.randint(vocab_size, (len(self), seq_length + 1),
                                        generator=torch.Generator().manual_seed(42))

        def __len__(self):
            return 32

        def __getitem__(self, item):
            return self.tokens[item]

    class Llama3(TaskModule):
        def __init__(self):
            super().__init__()
            self.model = Transformer()

        def configure_model(self):
            lightning_parallelize(self.model, device_mesh=self.device_mesh)

        def training_step(self, batch):
            inputs, labels = batch[:, :-1], batch[:, 1:]
            seen["batches"].append(int(batch.sum()))
            output = self.model(inputs)
            seen["dtypes"].add(str(output.dtype))  # the bf16 MixedPrecisionPolicy's compute
            with loss_parallel():
                return F.cross_entropy(output.reshape(-1, output.size(-1)), labels.reshape(-1))

        def backward(self, *args, **kwargs):
            seen["backward"] += 1
            with loss_parallel():
                super().backward(*args, **kwargs)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.model.parameters(), lr=3e-3, foreach=True)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(RandomTokenDataset(vocab_size=VOCAB, seq_length=SEQ), batch_size=4,
                                               num_workers=0)

    class Losses(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            seen["losses"].append(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss))

    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)
    trainer = Trainer(accelerator="cpu", devices=4, strategy=strategy, limit_train_batches=3, max_epochs=1,
                      callbacks=[Losses()], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=out)
    torch.manual_seed(0)
    with trainer.init_module():
        model = Llama3()
    before = sum(p.numel() for p in model.parameters())
    trainer.fit(model)
    blocks = model.model.layers
    return dict(seen, global_step=trainer.global_step, parameters=before,
                wrapped=sorted(type(b).__name__ for b in blocks.values()),
                heads=blocks["0"]._checkpoint_wrapped_module.attention.n_heads,
                local_rows=blocks["0"]._checkpoint_wrapped_module.attention.wq.weight.to_local().shape[0])


# -- Accelerate's script ---------------------------------------------------------------------------------------------
class LlamaDecoderLayer(TransformerBlock):
    def forward(self, x):
        return super().forward(x, torch.zeros(SEQ, DIM // HEADS))


class CausalLM(nn.Module):
    """forward(input_ids=, labels=, shift_labels=, position_ids=) -> an output with .loss, as a transformers model."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"hidden_size": DIM, "num_hidden_layers": 2})()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(LlamaDecoderLayer() for _ in range(2))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids, labels=None, shift_labels=None, position_ids=None):
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.lm_head(h)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), shift_labels.flatten())
        return type("Output", (), {"loss": loss, "logits": logits})()


def accelerate_parallelize(model, tp_mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for layer in model.layers:
        parallelize_module(layer, tp_mesh, {"feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                                            "feed_forward.w2": RowwiseParallel()})


def accelerate_example(out, steps=3):
    from torch.utils.data import DataLoader

    from tasktrain import Accelerator
    from tasktrain.parallelism_config import ParallelismConfig
    from tasktrain.utils import FullyShardedDataParallelPlugin, set_seed

    set_seed(42)
    parallelism_config = ParallelismConfig(dp_replicate_size=1, dp_shard_size=2, tp_size=2, cp_size=1)
    fsdp2_plugin = None
    if parallelism_config.dp_shard_enabled or parallelism_config.cp_enabled:
        fsdp2_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                      transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                                      state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", parallelism_config=parallelism_config,
                              fsdp_plugin=fsdp2_plugin)
    model = CausalLM()
    accelerate_parallelize(model, accelerator.torch_device_mesh["tp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, VOCAB, (16, SEQ + 1), generator=torch.Generator().manual_seed(3))
    dataset = [{"input_ids": t[:-1], "shift_labels": t[1:]} for t in tokens]

    def collate_fn(batch):
        input_ids = torch.stack([item["input_ids"] for item in batch])
        shift_labels = torch.stack([item["shift_labels"] for item in batch])
        return {"input_ids": input_ids, "shift_labels": shift_labels, "labels": shift_labels}

    dataloader = DataLoader(dataset, batch_size=2, collate_fn=collate_fn)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    hidden = model.config.hidden_size  # the prepared model is the script's own module (fully_shard in place)
    losses, seen = [], []
    for step, batch in enumerate(dataloader):
        if step >= steps:
            break
        batch["position_ids"] = torch.arange(0, batch["input_ids"].size(1)).unsqueeze(0)
        seen.append(int(batch["input_ids"].sum()))
        buffers = [batch["input_ids"], batch["shift_labels"], batch["labels"], batch["position_ids"]]
        with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1, 1],
                                                no_restore_buffers=set(buffers)):
            loss_reduce_grp = accelerator.torch_device_mesh["dp_cp"].get_group() \
                if accelerator.parallelism_config.dp_cp_dim_names else None
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            loss = loss.detach()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=loss_reduce_grp)
            losses.append(float(loss))
        if step == 1 and parallelism_config.dp_shard_enabled:
            accelerator.print(f"Saving checkpoint at step {step}...")
            accelerator.save_state(os.path.join(out, f"checkpoint-{step}"))
    accelerator.print("Training completed!")
    units = sorted(type(m).__name__ for m in model.modules() if type(m).__name__.startswith("FSDP"))
    return dict(losses=losses, seen=seen, hidden=hidden, units=units, precision=accelerator.mixed_precision,
                checkpoint=sorted(os.listdir(os.path.join(out, "checkpoint-1"))),
                dp_cp=accelerator.torch_device_mesh["dp_cp"].size())
