"""The model, data and loops the Accelerator tests share (imported by tests/test_accelerator.py and the workers).

`accelerator_loop` is the issue's snippet, unchanged but for the data and the hyper-parameters; with
`accumulate=True` it is the same loop inside `accelerator.accumulate(model)`. `trainer_run` trains the same model on
the same batches (in the Accelerator's order) with the Trainer, so the two can be compared parameter for parameter.
"""
import os

import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, TensorDataset

from tasktrain import TaskModule, Trainer, seed_everything


class MyModel(torch.nn.Module):
    def __init__(self, dropout=0.1):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def make_dataset(n=100):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


def accelerator_loop(accelerator, epochs=3, accumulate=False, n=100, batch_size=32, lr=0.01, return_model=False,
                     seed=0):
    """Returns the final parameters (unwrapped state dict) after `epochs` epochs of the snippet (and the prepared
    model with return_model=True). The loader's sampler draws from a generator seeded with `seed`, as
    accelerate_order's (a shuffling loader without one draws from the global generator, as under Accelerate, which
    the Trainer's run does not share)."""
    device = accelerator.device
    model = MyModel().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    dataset = make_dataset(n)
    sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    data = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    model.train()
    for epoch in range(epochs):
        for source, targets in data:
            source, targets = source.to(device), targets.to(device)
            if accumulate:
                with accelerator.accumulate(model):
                    loss = F.cross_entropy(model(source), targets)
                    accelerator.backward(loss)
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad()
            else:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(source), targets)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
    accelerator.wait_for_everyone()
    state = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
    return (state, model) if return_model else state


class Wrapped(TaskModule):
    def __init__(self, model, lr, rebuild_seed=None):
        super().__init__()
        self.model, self.lr, self.rebuild_seed = model, lr, rebuild_seed

    def on_train_start(self):
        # Under a distributed strategy the Trainer seeds again as it sets up its processes (Lightning's reset_seed),
        # after this module was built; the snippet's dropout draws follow its model's initialisation: those draws
        # are made again here, so that both loops train on the same random stream.
        from tasktrain.strategies.base import MultiProcess

        if self.rebuild_seed is not None and isinstance(self.trainer.strategy, MultiProcess):
            seed_everything(self.rebuild_seed, verbose=False)
            MyModel()
            # and the base-seed draw of the training loader's iter(), which the snippet's loop makes after its model
            # and the Trainer before on_train_start (Lightning's point)
            torch.empty((), dtype=torch.int64).random_()

    def training_step(self, batch, batch_idx):
        source, targets = batch
        return F.cross_entropy(self.model(source), targets)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class _OwnBatches(BatchSampler):
    """A BatchSampler that the Trainer reads as it is (it replaces torch's own by its order)."""


def accelerate_order(dataset, batch_size, seed):
    """This process's loader in the order the Accelerator's prepared loader reads (Accelerate's): the batches of a
    shuffling DataLoader whose sampler draws from a generator seeded with `seed` (accelerator_loop's), process r of
    W taking whole batches r, r + W, ... (Accelerate's own BatchSamplerShard: the oracle), the last step refilled
    from the epoch's start. The Trainer trains on exactly these batches."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    batches = _OwnBatches(sampler, batch_size, drop_last=False)
    if world > 1:
        from accelerate.data_loader import BatchSamplerShard

        batches = BatchSamplerShard(batches, num_processes=world, process_index=rank)
    return DataLoader(dataset, batch_sampler=batches)


def trainer_run(epochs=3, accumulate=1, n=100, batch_size=32, lr=0.01, seed=0, **trainer_kwargs):
    """The Trainer on the batches the Accelerator's loop reads (`accelerate_order`: the Trainer's own order
    interleaves samples over the processes, the Accelerator's is Accelerate's)."""
    seed_everything(seed)
    module = Wrapped(MyModel(), lr, rebuild_seed=seed)
    # the loader is this process's shard already (Accelerate's BatchSamplerShard): use_distributed_sampler=False, as a
    # Lightning user who shards the data themselves writes (Lightning would rebuild the batch sampler around its own
    # DistributedSampler, and BatchSamplerShard takes no batch_size: TypeError)
    trainer = Trainer(max_epochs=epochs, accumulate_grad_batches=accumulate, gradient_clip_val=1.0, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      use_distributed_sampler=False, **trainer_kwargs)
    trainer.fit(module, accelerate_order(make_dataset(n), batch_size, seed))
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def max_difference(a, b):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
