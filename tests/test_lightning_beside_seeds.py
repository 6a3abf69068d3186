"""DataLoader workers' random numbers beside Lightning 2.6 (issue 37): with num_workers > 0 a worker draws, in a
Dataset's __getitem__, what the same worker draws under Lightning (torch, numpy and python), after
seed_everything(workers=True) (Lightning's pl_worker_init_function on the loaders it is given), after
seed_everything(workers=False) and without it (torch's own worker seeding, from the base seed each iter() draws); a
resumed fit starts its workers as the uninterrupted one did."""
import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pl = pytest.importorskip("lightning.pytorch")
from lightning.fabric.utilities.seed import pl_worker_init_function  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.trainer.seed import worker_init_function  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
SEED_VARS = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS")


class Draws(Dataset):
    """Each item: its index, then one torch, one numpy and one python draw of the worker that loads it."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor([float(index), torch.rand(()).item(), float(np.random.rand()), random.random()],
                            dtype=torch.float64)


def _module(lib, seen):
    base = pl.LightningModule if lib is pl else tasktrain.TaskModule

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            seen.append((self.current_epoch, batch_idx, batch))
            return self.layer(batch.float()).sum()

        def on_train_epoch_start(self):
            torch.rand(1)  # a draw of the main process between two epochs' iter()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return Module()


def _seed(lib, mode, monkeypatch):
    for var in SEED_VARS:
        monkeypatch.delenv(var, raising=False)
    if mode == "none":
        torch.manual_seed(11), np.random.seed(11), random.seed(11)
    else:
        lib.seed_everything(5, workers=mode == "workers", verbose=False)


def _fit(lib, loader, ckpt_path=None, callbacks=(), max_epochs=2):
    seen = []
    trainer = lib.Trainer(max_epochs=max_epochs, enable_checkpointing=bool(callbacks), callbacks=list(callbacks),
                          **QUIET)
    trainer.fit(_module(lib, seen), loader, ckpt_path=ckpt_path)
    return {(epoch, index): batch for epoch, index, batch in seen}, torch.rand(1)


@pytest.mark.parametrize("mode", ["workers", "plain", "none"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_dataloader_workers_draw_lightnings_numbers(mode, shuffle, monkeypatch):
    drawn = {}
    for name, lib in (("tasktrain", tasktrain), ("lightning", pl)):
        _seed(lib, mode, monkeypatch)
        drawn[name] = _fit(lib, DataLoader(Draws(), batch_size=2, shuffle=shuffle, num_workers=2))
    (mine, mine_after), (theirs, theirs_after) = drawn["tasktrain"], drawn["lightning"]
    assert mine.keys() == theirs.keys() and len(mine) == 8
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), (key, mine[key], theirs[key])
    # workers of different epochs (base seeds) and of each epoch (worker ids) draw apart
    assert len({float(batch[0, 1]) for batch in mine.values()}) == 8
    assert torch.equal(mine_after, theirs_after)  # the main process's generator moved as Lightning's


def test_the_worker_init_function_is_lightnings(monkeypatch):
    for base, worker, rank in ((0, 0, 0), (5, 1, 0), (2**40 + 3, 3, 1), (2**63 - 9, 7, 5)):
        numbers = []
        for init in (worker_init_function, pl_worker_init_function):
            torch.manual_seed(base + worker)  # what torch gives a worker before its worker_init_fn
            init(worker, rank=rank)
            numbers.append((torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()))
        assert numbers[0] == numbers[1], (base, worker, rank)
    monkeypatch.setenv("RANK", "3")  # no rank given: the process's global rank, Lightning's rank_zero_only.rank
    torch.manual_seed(9)
    worker_init_function(0)
    mine = torch.rand(1)
    torch.manual_seed(9)
    pl_worker_init_function(0, rank=3)
    assert torch.equal(mine, torch.rand(1))


def test_the_trainer_gives_every_loader_without_one_lightnings_worker_init(monkeypatch):
    """seed_everything(workers=True): the training and validation loaders the Trainer is given get the function
    for this global rank (a loader's own one is kept); workers=False leaves them alone."""
    for workers in (False, True):
        tasktrain.seed_everything(1, workers=workers, verbose=False)
        mine = lambda worker_id: None  # noqa: E731
        loaders = [DataLoader(Draws(), batch_size=4), DataLoader(Draws(), batch_size=4),
                   DataLoader(Draws(), batch_size=4, worker_init_fn=mine)]

        class Module(tasktrain.TaskModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch.float()).sum()

            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                pass

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.0)

        tasktrain.Trainer(max_epochs=1, limit_val_batches=1, num_sanity_val_steps=0, enable_checkpointing=False,
                          **QUIET).fit(Module(), loaders[0], [loaders[1], loaders[2]])
        assert loaders[2].worker_init_fn is mine
        for loader in loaders[:2]:
            if workers:
                assert loader.worker_init_fn.func is worker_init_function
                assert loader.worker_init_fn.keywords == {"rank": 0}
            else:
                assert loader.worker_init_fn is None


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resumed_fit_starts_its_workers_as_the_uninterrupted_one(shuffle, tmp_path, monkeypatch):
    """The base seed of each iter() comes from the global generator, which a checkpoint restores: the epochs after
    a resumed one draw as in the uninterrupted fit, and the resumed pass starts its workers from the base seed of the
    pass it continues (the checkpoint keeps it), so its first worker draws what that pass's first worker drew."""
    def fit(ckpt_path=None, callbacks=()):
        _seed(tasktrain, "workers", monkeypatch)
        loader = DataLoader(Draws(), batch_size=2, shuffle=shuffle, num_workers=2)
        return _fit(tasktrain, loader, ckpt_path, callbacks, max_epochs=3)[0]

    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1,
                                                filename="{epoch}-{step}")
    whole = fit(callbacks=[saver])
    for name, first in (("epoch=1-step=6", (1, 2)), ("epoch=0-step=4", (1, 0))):
        resumed = fit(str(tmp_path / f"{name}.ckpt"))
        assert min(resumed) == first
        later = [key for key in resumed if key[0] > first[0]]
        assert len(later) == 4 and all(torch.equal(resumed[key], whole[key]) for key in later)
        # worker 0 loads the resumed pass's first batch: its draws are those of its first batch in the whole fit
        assert torch.equal(resumed[first][:, 1:], whole[(first[0], 0)][:, 1:])


# The 2-process test (DDP, seed_everything(workers=True), ddp_scripts/seeds_beside_lightning.py) is in
# tests/test_lightning_beside_ddp_order.py: it reads that file's one launch, shared with two other scripts.


def test_seed_everything_leaves_lightnings_variables_as_lightning(monkeypatch):
    """A script (or a library beside it) reads PL_GLOBAL_SEED / PL_SEED_WORKERS back after seed_everything."""
    seen = {}
    for key, lib in (("lightning", pl), ("tasktrain", tasktrain)):
        for var in SEED_VARS:
            monkeypatch.delenv(var, raising=False)
        lib.seed_everything(123, workers=True, verbose=False)
        seen[key] = (os.environ.get("PL_GLOBAL_SEED"), os.environ.get("PL_SEED_WORKERS"))
    assert seen["tasktrain"] == seen["lightning"] == ("123", "1")
