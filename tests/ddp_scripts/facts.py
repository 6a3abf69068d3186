"""Helper for tests/test_ddp.py: one multi-process run that records many facts to OUT/rank{R}.json.

    python facts.py OUT                       # self-launched: Trainer(strategy="ddp", devices=2)
    torchrun --nproc_per_node 2 facts.py OUT --devices auto --check-mismatch
    torchrun --nnodes 2 ... facts.py OUT --devices auto --num-nodes 2 --quick

Several stages run in one script on purpose: the process group must outlive a stage (fit, then fit, validate,
predict), and each run of 2 processes costs seconds.
"""
import argparse
import json
import os

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import common
from tasktrain import Callback, TaskModule, Trainer, seed_everything
from tasktrain.callbacks import progress

progress.rich_available = lambda: False  # tests/test_ddp.py reads tqdm's bar on stdout: the default without rich

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", default="2")
parser.add_argument("--num-nodes", type=int, default=1)
parser.add_argument("--check-mismatch", action="store_true")
parser.add_argument("--quick", action="store_true")
args = parser.parse_args()
devices = args.devices if args.devices == "auto" else int(args.devices)
quiet = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)


def regression_data():
    return TensorDataset(*common.regression_data())


class Regression(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CountAllReduce(Callback):
    """Counts the gradient all-reduces DDP launches (one per bucket; this model has one bucket)."""

    def __init__(self):
        self.calls = 0

    def on_fit_start(self, trainer, module):
        def hook(state, bucket):
            self.calls += 1
            return default_hooks.allreduce_hook(None, bucket)

        trainer.strategy.model.register_comm_hook(None, hook)


class Collectives(Callback):
    def on_train_end(self, trainer, module):
        rank, strategy = trainer.global_rank, trainer.strategy
        facts["reduce_sum"] = float(strategy.reduce(torch.tensor(rank + 1.0), op="sum"))
        facts["reduce_mean"] = float(strategy.reduce(torch.tensor(rank + 1.0), op="mean"))
        facts["reduce_max"] = float(strategy.reduce(torch.tensor(rank + 1.0), op="max"))
        facts["all_gather"] = strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist()
        facts["module_all_gather"] = {k: v.tolist() for k, v in module.all_gather({"r": torch.tensor(rank)}).items()}
        facts["broadcast"] = strategy.broadcast({"from": rank})
        strategy.barrier()
        # Lightning's signatures, called as a Lightning script does (issue 37): reduce(tensor, group, reduce_op) by
        # position, a differentiable all_gather(sync_grads=True) whose gradient comes back to each rank's tensor.
        facts["lightning_reduce_sum"] = float(strategy.reduce(torch.tensor(rank + 1.0), None, "sum"))
        facts["lightning_reduce_max"] = float(strategy.reduce(torch.tensor(rank + 1.0), reduce_op="max"))
        mine = torch.tensor([rank + 1.0, 2.0 * (rank + 1)], requires_grad=True)
        gathered = strategy.all_gather(mine, sync_grads=True)
        weights = torch.tensor([[1.0, 1.0], [10.0, 10.0]])  # the same loss on every rank: sum(w * gathered)
        (weights * gathered).sum().backward()
        facts["sync_grads_gathered"] = gathered.tolist()
        facts["sync_grads_grad"] = mine.grad.tolist()
        facts["plain_gather_requires_grad"] = strategy.all_gather(mine).requires_grad
        facts["module_sync_grads"] = module.all_gather(mine, sync_grads=True).requires_grad
        strategy.barrier(name="lightning_barrier")
        facts["lightning_members"] = dict(
            is_distributed=strategy.is_distributed, module_is_lightning_module=strategy.lightning_module is module,
            state_dict_keys=sorted(strategy.lightning_module_state_dict()))
        facts["ranks"] = dict(global_rank=trainer.global_rank, local_rank=trainer.local_rank,
                              world_size=trainer.world_size, node_rank=trainer.node_rank, num_nodes=trainer.num_nodes,
                              module_global_rank=module.global_rank, module_local_rank=module.local_rank)


facts = {"pid": os.getpid(), "master_port": os.environ.get("MASTER_PORT")}

if args.check_mismatch:
    # Under torchrun with 2 processes, asking for 3 must fail on every rank before anything starts.
    try:
        Trainer(strategy="ddp", devices=3, accelerator="cpu", max_steps=1, **quiet).fit(
            Regression(), DataLoader(regression_data(), batch_size=4))
        facts["mismatch_error"] = None
    except RuntimeError as err:
        facts["mismatch_error"] = str(err)

# 1. plain DDP: 2 ranks x batch 4 must equal one process on the batch of 8 (the test computes that reference).
# With default logger, progress bar and checkpointing: only rank 0 may write.
model = Regression()
trainer = Trainer(strategy="ddp", devices=devices, num_nodes=args.num_nodes, accelerator="cpu", max_epochs=1,
                  log_every_n_steps=1, default_root_dir=os.path.join(args.out, "run1"),
                  callbacks=[Collectives()])
trainer.fit(model, DataLoader(regression_data(), batch_size=4))
facts["plain_params"] = [p.detach().flatten().tolist() for p in model.parameters()]
facts["plain_steps"] = trainer.global_step
facts["plain_train_loss"] = float(trainer.callback_metrics["train_loss"])

if not args.quick:
    # 2. accumulation: 2 micro-batches of 2 per step; the first one skips the all-reduce (no_sync).
    model = Regression()
    counter = CountAllReduce()
    trainer = Trainer(strategy="ddp", devices=devices, accelerator="cpu", max_epochs=1, accumulate_grad_batches=2,
                      callbacks=[counter], **quiet)
    trainer.fit(model, DataLoader(regression_data(), batch_size=2))
    facts["accum_params"] = [p.detach().flatten().tolist() for p in model.parameters()]
    facts["accum_steps"] = trainer.global_step
    facts["accum_allreduce_calls"] = counter.calls

    # 3. shards: each rank records the sample indices it trained on, per epoch (shuffle kept, seeded order).
    seen = {}

    class Indices(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            seen.setdefault(self.current_epoch, []).extend(int(v) for v in x[:, 0])
            return self.layer(x).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            self.log("val_mean_x", x[:, 0].mean(), sync_dist=True)
            self.log("val_count", float(x.shape[0]), reduce_fx="sum", sync_dist=True)

        def predict_step(self, batch, batch_idx):
            return batch[0][:, 0] * 10

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    seed_everything(123)
    indices = TensorDataset(torch.arange(40, dtype=torch.float32).unsqueeze(1))
    trainer = Trainer(strategy="ddp", devices=devices, accelerator="cpu", max_epochs=2, **quiet)
    trainer.fit(Indices(), DataLoader(indices, batch_size=4, shuffle=True))
    facts["shard_indices"] = {str(k): list(v) for k, v in seen.items()}
    facts["data_seed"] = trainer.state.data_seed

    # 4. the user's own DistributedSampler is left alone (and set_epoch is called on it).
    seen.clear()
    sampler = DistributedSampler(indices, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=True,
                                 seed=7)
    trainer = Trainer(strategy="ddp", devices=devices, accelerator="cpu", max_epochs=2, **quiet)
    trainer.fit(Indices(), DataLoader(indices, batch_size=4, sampler=sampler))
    facts["user_sampler_indices"] = {str(k): list(v) for k, v in seen.items()}

    # 5. a stop asked by rank 0 only, at step 3, is agreed at the next log_every_n_steps boundary: step 4.
    class StopOnRankZero(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_rank == 0 and trainer.global_step == 3:
                trainer.should_stop = True

    trainer = Trainer(strategy="ddp", devices=devices, accelerator="cpu", max_epochs=3, log_every_n_steps=2,
                      callbacks=[StopOnRankZero()], **quiet)
    trainer.fit(Indices(), DataLoader(indices, batch_size=2))
    facts["stopped_at_step"] = trainer.global_step

    # 6. exact validation over 11 samples (not divisible by 2): mean of 0..10 is 5, the count 11.
    eleven = TensorDataset(torch.arange(11, dtype=torch.float32).unsqueeze(1))
    facts["validate"] = trainer.validate(Indices(), DataLoader(eleven, batch_size=3))
    # 6b. one sample for two ranks: rank 1 sees no batch at all, yet takes part in the sync (no hang, exact).
    one = TensorDataset(torch.tensor([[7.0]]))
    facts["validate_one"] = trainer.validate(Indices(), DataLoader(one, batch_size=3))
    # 7. predictions of every rank, in dataset order.
    facts["predict_gathered"] = trainer.predict(Indices(), DataLoader(eleven, batch_size=3), gather=True).tolist()
    facts["predict_local"] = torch.cat(trainer.predict(Indices(), DataLoader(eleven, batch_size=3))).tolist()
    frozen = Indices().requires_grad_(False)  # torch's DDP refuses a module with nothing to train
    facts["predict_frozen"] = trainer.predict(frozen, DataLoader(eleven, batch_size=3), gather=True).tolist()

rank = trainer.global_rank
facts["master_port"] = os.environ["MASTER_PORT"]
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(facts, f)
