"""Where a loader's iterator is made, beside Lightning 2.6 (issue 37): Lightning's loops call iter() on the training
data in its fit loop's setup_data, before on_train_start (each later epoch: after on_train_epoch_start), and on
evaluation data in its loop's reset, before on_validation_start / on_test_start / on_predict_start; a loader without a
length is then read one batch ahead. That is where workers start, where a sampler's and a data set's __iter__ run and
where the iterator's draws are taken. A sampler, a data set and a worker_init_fn that record what runs, interleaved
with every hook, give the same sequence under both frameworks: with and without a length, with 0 and 1 workers, with
and without the sanity check, for fit, validate, test and predict."""
import gc
import multiprocessing
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # (conftest.py: Lightning's level put back after each test)

FRAMEWORKS = {"lightning": L, "tasktrain": tasktrain}
EVENTS = []  # what the main process saw, in order
WORKER_FILE = "workers.txt"  # what the workers saw (a file: they are other processes; relative to the test's folder)


def note(*what):
    if torch.utils.data.get_worker_info() is not None:
        with open(WORKER_FILE, "a") as out:
            out.write(f"{os.getpid()} {what}\n")
    else:
        EVENTS.append(what)


def worker_events():
    """Each worker's lines in its order (the workers of a run may write at the same time), workers sorted."""
    if not os.path.exists(WORKER_FILE):
        return []
    by_worker = {}
    with open(WORKER_FILE) as lines:
        for line in lines:
            pid, what = line.rstrip("\n").split(" ", 1)
            by_worker.setdefault(pid, []).append(what)
    os.remove(WORKER_FILE)
    return sorted(by_worker.values())


class Items(Dataset):
    def __init__(self, n, name):
        self.n, self.name = n, name

    def __getitem__(self, index):
        note(self.name, "get", index)
        return torch.tensor([float(index)])

    def __len__(self):
        return self.n


class Stream(IterableDataset):
    """No length: its __iter__ runs in the iter() of a loader without workers, in the worker's start with them.
    broken=True: that __iter__ raises."""

    def __init__(self, n, name, broken=False):
        self.n, self.name, self.broken = n, name, broken

    def __iter__(self):
        note(self.name, "dataset iter")
        if self.broken:
            raise RuntimeError(f"the {self.name} stream is broken")
        return self._items()

    def _items(self):
        for index in range(self.n):
            note(self.name, "next", index)
            yield torch.tensor([float(index)])


class Order(Sampler):
    """A sampler of the user's (kept by both frameworks on one process): its __iter__ runs at the first batch without
    workers, in iter() with them (the workers' first indices are sent there)."""

    def __init__(self, n, name):
        self.n, self.name = n, name

    def __iter__(self):
        note(self.name, "sampler iter")
        return iter(range(self.n))


class SizedOrder(Order):
    def __len__(self):
        return self.n


def loader(kind, name, workers, n=4, broken=False):
    def start_worker(worker_id):
        note(name, "worker start", worker_id, torch.initial_seed())

    extra = dict(num_workers=workers, worker_init_fn=start_worker if workers else None)
    if kind == "sampler":
        return DataLoader(Items(n, name), batch_size=2, sampler=SizedOrder(n, name), **extra)
    if kind == "persistent":  # (its workers start at the first iter() and stay: each later iter() resets them)
        return DataLoader(Items(n, name), batch_size=2, sampler=SizedOrder(n, name), persistent_workers=True, **extra)
    if kind == "sampler without length":
        return DataLoader(Items(n, name), batch_size=2, sampler=Order(n, name), **extra)
    if kind == "stream":
        return DataLoader(Stream(n, name, broken), batch_size=2, **extra)
    return DataLoader(Items(n, name), batch_size=2, shuffle=True, **extra)  # "shuffle": the Trainer's own order


HOOKS = ["on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
         "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_validation_start", "on_validation_end",
         "on_validation_epoch_start", "on_validation_epoch_end", "on_test_start", "on_test_end", "on_test_epoch_start",
         "on_test_epoch_end", "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end"]
BATCH_HOOKS = ["on_train_batch_start", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end",
               "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end"]


def recorder(lib):
    """A Callback noting each hook with the worker processes alive (they start in iter(), stop at the next one or
    at the run's end)."""
    def hook(name):
        def call(self, trainer, *args):
            note(name, len(multiprocessing.active_children()))
        return call

    def batch_hook(name):
        def call(self, trainer, module, *args):
            batch = args[1] if name.endswith("_end") else args[0]
            note(name, batch.flatten().tolist(), len(multiprocessing.active_children()))
        return call

    methods = {name: hook(name) for name in HOOKS}
    methods.update({name: batch_hook(name) for name in BATCH_HOOKS})
    methods["setup"] = lambda self, trainer, module, stage: note("setup", str(stage))
    methods["teardown"] = lambda self, trainer, module, stage: note("teardown", str(stage),
                                                                   len(multiprocessing.active_children()))
    methods["on_exception"] = lambda self, trainer, module, exception: note(
        "on_exception", type(exception).__name__, str(exception).splitlines()[0],
        len(multiprocessing.active_children()))
    return type("Recorder", (lib.Callback,), methods)()


def module_class(lib):
    Module = lib.LightningModule if lib is L else lib.TaskModule

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.layer(batch)

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.layer(batch)

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net


def run(framework, kind, workers, sanity, entry, broken=None):
    """The main process's events and the workers' of one run of `entry` ("fit": 2 epochs with validation);
    `broken`: the loader ("train", "val") whose data set raises in __iter__ (a "stream")."""
    lib = FRAMEWORKS[framework]
    lib.seed_everything(0, verbose=False)
    EVENTS.clear()
    trainer = lib.Trainer(accelerator="cpu", devices=1, max_epochs=2, num_sanity_val_steps=sanity, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          callbacks=[recorder(lib)])
    module = module_class(lib)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if entry == "fit":
                trainer.fit(module, loader(kind, "train", workers, broken=broken == "train"),
                            loader(kind, "val", workers, broken=broken == "val"))
            elif entry == "validate two":  # (the second loader's iter() when its first batch is read)
                trainer.validate(module, [loader(kind, "first", workers), loader("sampler", "second", workers)],
                                 verbose=False)
            elif entry == "predict":
                trainer.predict(module, loader(kind, entry, workers), return_predictions=False)
            else:
                getattr(trainer, entry)(module, loader(kind, entry, workers), verbose=False)
        except RuntimeError as error:
            note("raised", str(error).splitlines()[0], len(multiprocessing.active_children()))
    note("after", torch.rand(1).item())  # (the iterators' draws moved the global generator alike)
    return list(EVENTS), worker_events()


def beside(*case):
    ours, theirs = run("tasktrain", *case), run("lightning", *case)
    assert ours == theirs
    return ours


# (kind, workers, num_sanity_val_steps): every kind without workers; with a worker, a loader with a length (its sampler
# runs in iter()), the same with persistent workers (started once, reset by each later iter()) and one without a length
# (a stream: its __iter__ runs in the worker, read one batch ahead, the worker stopping where it runs out)
FITS = [("sampler", 0, 2), ("sampler without length", 0, 2), ("stream", 0, 0), ("shuffle", 0, 2),
        ("sampler", 1, 2), ("persistent", 1, 0), ("stream", 1, 0)]


@pytest.mark.parametrize("kind, workers, sanity", FITS)
def test_a_fit_makes_its_iterators_where_lightning_makes_them(kind, workers, sanity):
    """The training loader's iter() before on_train_start (after the sanity check's), again after each later
    on_train_epoch_start; the validation's before each on_validation_start; workers stopped before on_fit_end."""
    events, workers_seen = beside(kind, workers, sanity, "fit")
    assert ("on_fit_end", 0) in events
    assert bool(workers_seen) == bool(workers)


EVALUATIONS = [("sampler without length", 0, "validate"), ("stream", 0, "test"), ("shuffle", 0, "predict"),
               ("sampler", 1, "validate"), ("stream", 1, "predict"), ("sampler without length", 0, "validate two"),
               ("sampler", 1, "validate two")]


@pytest.mark.parametrize("kind, workers, entry", EVALUATIONS)
def test_an_evaluation_makes_its_iterator_where_lightning_makes_it(kind, workers, entry):
    """validate / test / predict: iter() before on_*_start (a loader without a length read one batch ahead there),
    a second loader's when its first batch is read (the first one's workers stopped there), the workers stopped
    before the teardown hooks."""
    events, _ = beside(kind, workers, 0, entry)
    assert events[-2] == ("teardown", str(events[0][1]), 0)


@pytest.mark.parametrize("workers, broken, sanity", [(0, "train", 0), (1, "train", 0), (0, "val", 2)])
def test_a_loader_that_fails_in_its_iter_fails_the_run_as_under_lightning(workers, broken, sanity):
    """A data set whose __iter__ raises (in the worker with workers): before on_train_start now (the sanity check's
    before on_validation_start); on_exception gets the error, no teardown hook runs, as under Lightning. Then the
    run raises that error with its workers stopped; Lightning's own teardown fails there ("Please call
    `iter(combined_loader)` first.", its workers left running: docs/lightning.md)."""
    ours, _ = run("tasktrain", "stream", workers, sanity, "fit", broken)
    theirs, _ = run("lightning", "stream", workers, sanity, "fit", broken)
    for child in multiprocessing.active_children():  # (the worker Lightning's failed teardown left running: stopped
        child.terminate()  # here, or collecting its iterator later waits seconds for it)
        child.join()
    gc.collect()
    end = [event[0] for event in ours].index("raised")
    assert ours[:end] == theirs[:end]
    assert ours[end] == ("raised", f"the {broken} stream is broken" if not workers else
                         "Caught RuntimeError in DataLoader worker process 0.", 0)
    names = [event[0] for event in ours[:end]]
    assert names[-1] == "on_exception" and "teardown" not in names and "on_train_start" not in names
