"""A training loader's custom sampler on one process beside Lightning 2.6 (issue 37): Lightning keeps the loader and
calls set_epoch(epoch) on its sampler and on its batch sampler's sampler at each epoch's start (and on the validation
loader's at each validation), so a sampler that draws its order from its epoch reads another order each epoch. The same
fits under both frameworks read the same indices and make the same set_epoch calls. The 2-process cases (the sampler
sharded by Lightning's DistributedSamplerWrapper) run in tests/test_lightning_beside_ddp_order.py's launch."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import EpochSampler, MyBatchSampler

pytest.importorskip("lightning.pytorch")


def data(n):
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(3))
    return TensorDataset(torch.arange(n), x, x.sum(1, keepdim=True))


def fit(lib, base, case):
    torch.manual_seed(0)
    rows, val_rows, calls, val_calls = [], [], [], []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            rows.append([self.current_epoch, batch_idx, batch[0].tolist()])
            return torch.nn.functional.mse_loss(self.layer(batch[1]), batch[2])

        def validation_step(self, batch, batch_idx):
            val_rows.append([self.trainer.sanity_checking, self.current_epoch, batch_idx, batch[0].tolist()])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if case == "sampler":
        train = DataLoader(data(10), batch_size=2, sampler=EpochSampler(10, calls))
    else:  # (set_epoch reaches the batch sampler's sampler)
        train = DataLoader(data(10), batch_sampler=MyBatchSampler(EpochSampler(10, calls), 3, False))
    val = DataLoader(data(6), batch_size=2, sampler=EpochSampler(6, val_calls))
    module = Module()
    trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train, val)
    weights = [v for p in module.layer.parameters() for v in p.detach().flatten().tolist()]
    return {"batches": rows, "val": val_rows, "set_epoch": calls, "val set_epoch": val_calls, "weights": weights}


@pytest.mark.parametrize("case", ["sampler", "batch sampler"])
def test_a_custom_sampler_gets_set_epoch_every_epoch_as_under_lightning(case):
    import lightning.pytorch as L

    import tasktrain

    theirs = fit(L, L.LightningModule, case)
    mine = fit(tasktrain, tasktrain.TaskModule, case)
    for key in theirs:
        assert mine[key] == theirs[key], key
    # set_epoch(epoch) at each epoch's start, so each epoch reads the sampler's permutation of that epoch
    assert mine["set_epoch"] == [0, 1, 2]
    for epoch in range(3):
        read = [i for e, _, batch in mine["batches"] if e == epoch for i in batch]
        assert read == torch.randperm(10, generator=torch.Generator().manual_seed(100 + epoch)).tolist()


class Prebatched(torch.utils.data.Dataset):
    """Items that are batches already (DataLoader(batch_size=None): no automatic batching)."""

    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(5, 4, 3, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.full((4,), i), self.x[i], self.x[i].sum(1, keepdim=True)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_loader_without_automatic_batching_trains_as_under_lightning(shuffle):
    """DataLoader(batch_size=None) (each item is a batch the data set made) crashed in the loader's rebuild
    (AttributeError on its missing batch sampler); Lightning trains on its items as batches, in the same order."""
    import lightning.pytorch as L

    import tasktrain

    def run(lib, base):
        torch.manual_seed(0)
        seen = []

        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                seen.append(int(batch[0][0]))
                return torch.nn.functional.mse_loss(self.layer(batch[1]), batch[2])

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        module = Module()
        trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, DataLoader(Prebatched(), batch_size=None, shuffle=shuffle))
        return seen, [v for p in module.layer.parameters() for v in p.detach().flatten().tolist()]

    ours, theirs = run(tasktrain, tasktrain.TaskModule), run(L, L.LightningModule)
    assert len(ours[0]) == 10 and sorted(ours[0][:5]) == list(range(5))
    assert ours == theirs


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_dataloader_subclass_is_the_loader_that_trains_as_under_lightning(shuffle):
    """A DataLoader subclass of the user's (its own __iter__, _get_iterator, attributes) was rebuilt as a plain
    DataLoader on the Trainer's order: its __iter__ never ran and trainer.train_dataloader was another object.
    Lightning keeps it as it is where it shards nothing; so does the Trainer now: the same object, the same iter()
    calls, the same batches and weights (shuffled too: the user's RandomSampler draws the order)."""
    import lightning.pytorch as L

    import tasktrain

    def run(lib, base):
        lib.seed_everything(4, verbose=False)
        seen, iters = [], []

        class Loader(DataLoader):
            def __iter__(self):
                iters.append(self.tag)
                return super().__iter__()

        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                seen.append(batch[0].tolist())
                return torch.nn.functional.mse_loss(self.layer(batch[1]), batch[2])

            def validation_step(self, batch, batch_idx):
                pass

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        train, val = Loader(data(8), batch_size=2, shuffle=shuffle), Loader(data(4), batch_size=2)
        train.tag, val.tag = "train", "val"
        module = Module()
        trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=3, logger=False,
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, train, val)
        kept = (trainer.train_dataloader is train, trainer.val_dataloaders is val)
        return kept, iters, seen, [v for p in module.layer.parameters() for v in p.detach().flatten().tolist()]

    ours, theirs = run(tasktrain, tasktrain.TaskModule), run(L, L.LightningModule)
    assert ours[0] == (True, True) and ours[1].count("train") == 2 and len(ours[2]) == 6
    assert ours == theirs


class Tagged(DataLoader):
    """A DataLoader subclass with arguments of its own (`n`, `tag`) that it keeps no attribute of."""

    def __init__(self, n, tag, batch_size=2, **kwargs):
        super().__init__(data(n), batch_size=batch_size, **kwargs)
        self.kind = f"tagged {tag}"


@pytest.mark.parametrize("how", ["hooks", "given"])
def test_a_dataloader_subclass_built_again_is_the_users_class_as_under_lightning(how):
    """A DataLoader subclass of the user's that the Trainer must build again (overfit_batches turns its shuffling
    off; every predict loader) was built as a plain DataLoader. Lightning builds the user's class again with the
    arguments it recorded while the hook built it (and what the hook set on it after); so does the Trainer now: the
    same class, kind, attributes, batches and weights. A loader handed to fit directly is read back from its attributes, which lack `n` and `tag`: Lightning's
    MisconfigurationException, word for word."""
    import lightning.pytorch as L

    import tasktrain

    def run(lib, base):
        lib.seed_everything(4, verbose=False)
        seen, predicted, kinds = [], [], []

        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                loader = self.trainer.train_dataloader
                kinds.append([type(loader).__name__, loader.kind, type(loader.sampler).__name__,
                              getattr(loader, "note", None)])
                seen.append(batch[0].tolist())
                return torch.nn.functional.mse_loss(self.layer(batch[1]), batch[2])

            def predict_step(self, batch, batch_idx):
                loader = self.trainer.predict_dataloaders
                kinds.append([type(loader).__name__, loader.kind, loader.batch_size, loader.drop_last])
                predicted.append(batch[0].tolist())

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            if how == "hooks":
                def train_dataloader(self):
                    loader = Tagged(8, "train", shuffle=True)
                    loader.note = "set in the hook"  # (set again on the loader built again)
                    return loader

                def predict_dataloader(self):
                    return Tagged(5, "predict", batch_size=2, drop_last=True)

        module = Module()
        trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, overfit_batches=2, logger=False,
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if how == "hooks":
                    trainer.fit(module)
                    trainer.predict(module, return_predictions=False)
                else:
                    trainer.fit(module, Tagged(8, "train", shuffle=True))
            except Exception as error:  # (the same error under both, before any batch)
                return type(error).__name__, str(error), seen
        return kinds, seen, predicted, [v for p in module.layer.parameters() for v in p.detach().flatten().tolist()]

    ours, theirs = run(tasktrain, tasktrain.TaskModule), run(L, L.LightningModule)
    if how == "hooks":  # overfit_batches: in order; predicting: drop_last=False (a batch of 1 at the end)
        assert ours[0][0] == ["Tagged", "tagged train", "SequentialSampler", "set in the hook"]
        assert ours[1][:2] == [[0, 1], [2, 3]]
        assert ours[0][-1][:2] == ["Tagged", "tagged predict"] and ours[2] == [[0, 1], [2, 3], [4]]
    else:
        assert ours[0] == "MisconfigurationException" and "The missing attributes are ['n', 'tag']" in ours[1]
        assert ours[2] == []
    assert ours == theirs


def test_the_loader_worker_warnings_are_lightnings():
    """Lightning's warnings on a run's loaders (its _worker_check), missing before: few workers where the cores allow
    more (PossibleUserWarning, per loader and run, again at each reload), and persistent pinned workers with
    reload_dataloaders_every_n_epochs. The machine is made to show 8 cores to both (Lightning's bound: 8 // devices
    - 1); the same runs give the same warnings, in the same order."""
    from unittest import mock

    import lightning.pytorch as L

    import tasktrain

    def warned(lib, base):
        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[1]).sum()

            def validation_step(self, batch, batch_idx):
                pass

            test_step = predict_step = validation_step

            def train_dataloader(self):
                return DataLoader(data(8), batch_size=2)

            val_dataloader = train_dataloader

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                     accelerator="cpu", devices=1, limit_train_batches=2, limit_val_batches=1, limit_test_batches=1,
                     limit_predict_batches=1)
        module = Module()
        with warnings.catch_warnings(record=True) as seen, mock.patch("os.sched_getaffinity", lambda pid: set(range(8))):
            warnings.simplefilter("always")
            lib.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, **quiet).fit(module)
            lib.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, **quiet).fit(
                module, DataLoader(data(8), batch_size=2, num_workers=1, persistent_workers=True, pin_memory=True))
            lib.Trainer(**quiet).test(module, DataLoader(data(4)), verbose=False)
            lib.Trainer(**quiet).predict(module, DataLoader(data(4)))
        return [(w.category.__name__, str(w.message)) for w in seen
                if "workers" in str(w.message) and "srun" not in str(w.message)]

    ours, theirs = warned(tasktrain, tasktrain.TaskModule), warned(L, L.LightningModule)
    assert ("PossibleUserWarning", "The 'train_dataloader' does not have many workers which may be a bottleneck. "
            "Consider increasing the value of the `num_workers` argument` to `num_workers=7` in the `DataLoader` to "
            "improve performance.") in ours
    assert any(message.startswith("The combination of `DataLoader(`pin_memory=True`") for _, message in ours)
    assert ours == theirs


def test_persistent_workers_stop_at_the_runs_end_as_under_lightning():
    """Lightning stops a run's loader workers at its end, persistent ones too (its fetchers' teardown); they outlived
    fit and validate here while the Trainer lived. After each run no worker process is left and the loaders hold no
    iterator, under both."""
    import multiprocessing

    import lightning.pytorch as L

    import tasktrain

    def after(lib, base):
        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[1]).sum()

            def validation_step(self, batch, batch_idx):
                pass

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        def loader():
            return DataLoader(data(8), batch_size=2, num_workers=1, persistent_workers=True)

        trainer = lib.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                              logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False)
        module, found = Module(), []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, loader(), loader())
            found.append((len(multiprocessing.active_children()), trainer.train_dataloader._iterator,
                          trainer.val_dataloaders._iterator))
            trainer.validate(module, loader(), verbose=False)
            found.append((len(multiprocessing.active_children()), trainer.val_dataloaders._iterator))
        return found

    ours, theirs = after(tasktrain, tasktrain.TaskModule), after(L, L.LightningModule)
    assert ours == [(0, None, None), (0, None)]
    assert ours == theirs


def test_workers_that_are_not_persistent_stop_at_the_next_iter_as_under_lightning():
    """Lightning's fetchers hold each pass's iterator until the loader's next iter() (or the run's end): workers
    that are not persistent live on after the training pass (during on_train_epoch_end and the validation) and the
    validation's after it; the Trainer stopped them where the pass stopped reading. The worker processes alive at
    each point are the same under both (2 training workers, 1 validation worker), none after the run."""
    import multiprocessing

    import lightning.pytorch as L

    import tasktrain

    def alive(lib, base, limit):
        seen = []

        def note(where):
            seen.append((where, len(multiprocessing.active_children())))

        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                note(f"step {batch_idx}")
                return self.layer(batch[1]).sum()

            def validation_step(self, batch, batch_idx):
                note(f"val {batch_idx}")

            def on_validation_epoch_end(self):
                note("validation end")

            def on_train_epoch_end(self):
                note("train epoch end")

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = lib.Trainer(max_epochs=2, limit_train_batches=limit, limit_val_batches=limit,
                              num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(), DataLoader(data(8), batch_size=2, num_workers=2),
                        DataLoader(data(8), batch_size=2, num_workers=1))
            note("after fit")
        return seen

    for limit in (2, 1.0):  # (the pass stopped at its limit; read to its end: a known length reads no further)
        ours, theirs = alive(tasktrain, tasktrain.TaskModule, limit), alive(L, L.LightningModule, limit)
        assert ("train epoch end", 3) in ours and ours[-1] == ("after fit", 0)
        assert ours == theirs


class _NoLength:
    """An iterable of 3 batches whose __len__ raises NotImplementedError (Lightning's sized_len: no length)."""

    def __iter__(self):
        return iter(DataLoader(data(6), batch_size=2))

    def __len__(self):
        raise NotImplementedError


def test_a_loader_whose_len_raises_not_implemented_has_no_length_as_under_lightning():
    """A loader whose __len__ raises NotImplementedError crashed the run (only TypeError meant "no length"); Lightning
    reads it as a loader without a length: each epoch runs to its end, for training, validation and test alike."""
    import lightning.pytorch as L

    import tasktrain

    def run(lib, base):
        seen = []

        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                seen.append(("train", self.current_epoch, batch_idx))
                return self.layer(batch[1]).sum()

            def validation_step(self, batch, batch_idx):
                seen.append(("val", self.current_epoch, batch_idx))

            def test_step(self, batch, batch_idx):
                seen.append(("test", batch_idx))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = lib.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, num_sanity_val_steps=0)
        module = Module()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, _NoLength(), _NoLength())
            trainer.test(module, _NoLength(), verbose=False)
        return seen, trainer.num_training_batches, trainer.num_val_batches, trainer.num_test_batches

    ours, theirs = run(tasktrain, tasktrain.TaskModule), run(L, L.LightningModule)
    assert ours[0].count(("test", 2)) == 1 and ours[1] == float("inf")
    assert ours == theirs


class _Stream(torch.utils.data.IterableDataset):
    """data(n)'s rows as an IterableDataset."""

    def __init__(self, n):
        self.rows = data(n)

    def __iter__(self):
        return iter(self.rows[i] for i in range(len(self.rows)))


class _StreamLoader(DataLoader):  # a DataLoader class of one's own, built again with its recorded arguments
    def __init__(self, dataset, tag, **kwargs):
        super().__init__(dataset, **kwargs)
        self.tag = tag


@pytest.mark.parametrize("case", ["plain", "shuffle", "no batching", "drop_last", "custom batch sampler", "opaque",
                                  "iterable", "iterable, a class of one's own"])
def test_every_predict_loader_is_built_again_with_lightnings_index_keeping_batch_sampler(case):
    """Lightning builds every predict DataLoader again (its predict loop keeps each batch's indices): the loader a
    user reads back (trainer.predict_dataloaders) is a new one, its batch sampler Lightning's
    `_IndexBatchSamplerWrapper` around the batch sampler built again with drop_last=False (a custom batch sampler
    that cannot be built again is wrapped as it is, with Lightning's warning), whose `seen_batch_indices` are the
    pass's batches; tasktrain kept a plain loader as it was. A loader over an IterableDataset is built again too, with
    no sampler and no index-keeping wrapper (tasktrain kept it as given)."""
    import lightning.pytorch as L

    import tasktrain

    class Opaque:  # a batch sampler without batch_size / drop_last: Lightning cannot build it again
        def __iter__(self):
            return iter([[0, 1, 2], [3, 4]])

        def __len__(self):
            return 2

    def predicted(lib, base):
        class Module(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def predict_step(self, batch, batch_idx):
                return batch[0]

        kwargs = {"plain": dict(batch_size=2), "shuffle": dict(batch_size=2, shuffle=True),
                  "no batching": dict(batch_size=None), "drop_last": dict(batch_size=3, drop_last=True),
                  "custom batch sampler": dict(batch_sampler=MyBatchSampler(torch.utils.data.SequentialSampler(
                      range(7)), 3, True)), "opaque": dict(batch_sampler=Opaque()), "iterable": dict(batch_size=3),
                  "iterable, a class of one's own": dict(batch_size=3)}[case]
        if case == "iterable, a class of one's own":
            loader = _StreamLoader(_Stream(7), "mine", **kwargs)
        else:
            loader = DataLoader(_Stream(7) if case == "iterable" else data(7), **kwargs)
        trainer = lib.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                              enable_model_summary=False)
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            out = trainer.predict(Module(), loader)
        got = trainer.predict_dataloaders
        batches = got.batch_sampler
        return dict(same=got is loader, kind=type(got).__name__, sampler=type(got.sampler).__name__,
                    batch_sampler=type(batches).__name__, inner=type(getattr(batches, "sampler", None)).__name__,
                    size=[getattr(batches, "batch_size", None), getattr(batches, "drop_last", None)],
                    tag=getattr(got, "tag", None),
                    seen=getattr(batches, "seen_batch_indices", None), out=[o.tolist() for o in out],
                    warned=[str(w.message) for w in said if "custom batch sampler" in str(w.message)])

    ours, theirs = predicted(tasktrain, tasktrain.TaskModule), predicted(L, L.LightningModule)
    assert ours == theirs
    assert ours["same"] is False
    if case.startswith("iterable"):
        assert ours["batch_sampler"] == "BatchSampler" and ours["seen"] is None and len(ours["out"]) == 3
    elif case != "no batching":
        assert ours["batch_sampler"] == "_IndexBatchSamplerWrapper"
        assert [i for batch in ours["seen"] for i in batch] == [i for batch in ours["out"] for i in batch]
        # every sample predicted (the opaque one's own 5 indices)
        assert sorted(i for batch in ours["seen"] for i in batch) == list(range(5 if case == "opaque" else 7))
    assert len(ours["warned"]) == (case == "opaque")


def _one_process_ddp(lib, base, strategy="ddp"):
    """A fit (a shuffling training loader, a sequential validation one), then validate, test and predict, under
    `strategy` on one process: for each loader a run read, whether its sampler is a DistributedSampler (the loader's
    or its batch sampler's) and whether trainer.train_dataloader & co. are the loader given; the dataset indices of
    its batches."""
    from torch.utils.data import DistributedSampler

    seen = {}

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def step(self, batch, name):
            seen.setdefault(name, []).append(batch[0].tolist())
            return torch.nn.functional.mse_loss(self.layer(batch[1]), batch[2])

        def training_step(self, batch, batch_idx):
            return self.step(batch, "train")

        def validation_step(self, batch, batch_idx):
            self.step(batch, "val")

        def test_step(self, batch, batch_idx):
            self.step(batch, "test")

        def predict_step(self, batch, batch_idx):
            return self.step(batch, "predict")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def sharded(loader):
        return isinstance(loader.sampler, DistributedSampler) or \
            isinstance(getattr(loader.batch_sampler, "sampler", None), DistributedSampler)

    lib.seed_everything(1, verbose=False)
    trainer = lib.Trainer(strategy=strategy, devices=1, accelerator="cpu", max_epochs=1, num_sanity_val_steps=0,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)
    module = Module()
    given = {"train": DataLoader(data(7), batch_size=3, shuffle=True), "val": DataLoader(data(5), batch_size=2),
             "validate": DataLoader(data(5), batch_size=2), "test": DataLoader(data(5), batch_size=2, shuffle=True),
             "predict": DataLoader(data(5), batch_size=2, shuffle=True)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, given["train"], given["val"])
        read = {"train": trainer.train_dataloader, "val": trainer.val_dataloaders}
        trainer.validate(module, given["validate"], verbose=False)
        read["validate"] = trainer.val_dataloaders
        trainer.test(module, given["test"], verbose=False)
        read["test"] = trainer.test_dataloaders
        trainer.predict(module, given["predict"])
        read["predict"] = trainer.predict_dataloaders
    kinds = {name: sharded(loader) for name, loader in read.items()}
    return kinds, {name: loader is given[name] for name, loader in read.items()}, seen


def test_one_process_of_ddp_shards_every_loader_as_lightning():
    """strategy="ddp" on one process is a distributed strategy: Lightning puts a DistributedSampler of one replica in
    every map-style loader (training, validation, test; predict's UnrepeatedDistributedSamplerWrapper), which reads the
    same order for a sequential loader and its own (seed, epoch) one for a shuffling one. tasktrain's evaluation loaders
    kept the user's sampler there (a shuffling predict loader then read another order)."""
    import lightning.pytorch as L

    import tasktrain

    try:
        theirs = _one_process_ddp(L, L.LightningModule)
    finally:  # Lightning's world of one outlives its run (ours ends at teardown): not left to later tests
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    mine = _one_process_ddp(tasktrain, tasktrain.TaskModule)
    assert mine == theirs
    assert all(mine[0].values()), mine[0]
    assert not any(mine[1].values()), mine[1]  # (every loader built again around its sampler)


def test_one_process_reads_the_loaders_given_as_lightning():
    """On one process (no distributed strategy) Lightning trains, validates and tests on the loaders given, so
    trainer.train_dataloader, val_dataloaders and test_dataloaders are those objects; only the predict loader is built
    again (its index-keeping batch sampler). trainer.train_dataloader was the Trainer's rebuild of the training loader
    (the one it reads, on its own order, for an exact resume)."""
    import lightning.pytorch as L

    import tasktrain

    mine = _one_process_ddp(tasktrain, tasktrain.TaskModule, strategy="auto")
    assert mine == _one_process_ddp(L, L.LightningModule, strategy="auto")
    assert mine[1] == {"train": True, "val": True, "validate": True, "test": True, "predict": False}
    assert not any(mine[0].values())
