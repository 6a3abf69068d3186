"""Dispatched and iterable-dataset loaders, case by case, written so that the same script runs on Accelerate itself.

    python dispatch_cases.py LIB OUT [cases|cross]

LIB is "accelerate" (the oracle: run under torchrun) or "tasktrain" (under `tasktrain launch`). `cases` writes
OUT/cases_{rank}.json: for map-style data of 10 and 11 items and an IterableDataset of as many, batch 4, every
configuration of DataLoaderConfiguration(dispatch_batches, split_batches) the tests compare, each batch of this
process with its end_of_dataloader and what gather_for_metrics returned. With LIB=tasktrain it adds who read the data
sets (only rank 0 may, when dispatched) and resumes mid-epoch (save_state / load_state in a fresh Accelerator), and
leaves the checkpoints in OUT for `cross`: a run on another number of processes loads them.
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

LIB, OUT = sys.argv[1], sys.argv[2]
MODE = sys.argv[3] if len(sys.argv) > 3 else "cases"
if LIB == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    def make(**config):
        return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
else:
    from tasktrain import Accelerator
    from tasktrain.utils import DataLoaderConfiguration

    def make(**config):
        return Accelerator(dataloader_config=DataLoaderConfiguration(**config))


class Stream(IterableDataset):
    """0 .. n-1 as a stream (no len()); `reads` counts the passes started over it in this process."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __iter__(self):
        self.reads += 1
        return iter([torch.tensor(i) for i in range(self.n)])


class Recorded(torch.utils.data.Dataset):
    """Map-style 0 .. n-1 that counts every access, len() included."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __len__(self):
        self.reads += 1
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.tensor(i)


def values(batch):
    return (batch[0] if isinstance(batch, (list, tuple)) else batch).tolist()


def run(accelerator, loader):
    prepared = accelerator.prepare(loader)
    try:
        length = len(prepared)
    except TypeError:
        length = None
    batches = []
    for batch in prepared:
        gathered = accelerator.gather_for_metrics(batch)
        batches.append({"batch": values(batch), "end": bool(prepared.end_of_dataloader),
                        "gathered": values(gathered)})
    return {"len": length, "batches": batches, "remainder": int(prepared.remainder)}


def cases():
    out = {}
    for n in (10, 11):
        for split in (False, True):
            tag = f"n{n}-split{int(split)}"
            out[f"map-dispatch-{tag}"] = run(make(dispatch_batches=True, split_batches=split),
                                             DataLoader(TensorDataset(torch.arange(n)), batch_size=4))
            out[f"iter-default-{tag}"] = run(make(split_batches=split), DataLoader(Stream(n), batch_size=4))
            out[f"iter-dispatch-{tag}"] = run(make(dispatch_batches=True, split_batches=split),
                                              DataLoader(Stream(n), batch_size=4))
            out[f"iter-shard-{tag}"] = run(make(dispatch_batches=False, split_batches=split),
                                           DataLoader(Stream(n), batch_size=4))
        out[f"map-dispatch-n{n}-drop"] = run(make(dispatch_batches=True),
                                             DataLoader(TensorDataset(torch.arange(n)), batch_size=4, drop_last=True))
        out[f"iter-shard-n{n}-drop"] = run(make(dispatch_batches=False),
                                           DataLoader(Stream(n), batch_size=4, drop_last=True))
    return out


def reads():
    """Who touches the data: only rank 0 when dispatched, every rank when sharded by global batch."""
    out = {}
    for name, dataset, dispatch in (("map-dispatch", Recorded(11), True), ("iter-default", Stream(11), None),
                                    ("iter-shard", Stream(11), False)):
        run(make(dispatch_batches=dispatch), DataLoader(dataset, batch_size=2))
        out[name] = dataset.reads
    return out


def by_hand(strategy):
    """A DataLoaderDispatcher built by hand (Accelerate's arguments), over the strategy given or (None)
    torch.distributed's default group."""
    from tasktrain.trainer.dispatch import DataLoaderDispatcher

    loader = DataLoaderDispatcher(TensorDataset(torch.arange(11)), batch_size=4, strategy=strategy)
    return [values(batch) for batch in loader]


def standalone():
    """tasktrain.data_loader.prepare_data_loader (Accelerate's standalone function): dispatched map-style data, and
    an IterableDataset sharded by IterableDatasetShard (not put on the device: Accelerate then does not dispatch)."""
    from tasktrain.data_loader import DataLoaderDispatcher, prepare_data_loader

    dispatched = prepare_data_loader(DataLoader(TensorDataset(torch.arange(11)), batch_size=4), put_on_device=True,
                                     dispatch_batches=True)
    assert isinstance(dispatched, DataLoaderDispatcher)
    out = {"map-dispatch": [values(b) for b in dispatched]}
    for split in (False, True):
        loader = prepare_data_loader(DataLoader(Stream(11), batch_size=4), split_batches=split)
        out[f"iter-shard-split{int(split)}"] = [values(b) for b in loader]
    return out


def data_for(kind):
    if kind == "dispatch":  # shuffled map-style data: rank 0 reads tasktrain's order of (seed, epoch)
        return dict(dispatch_batches=True, data_seed=7), DataLoader(TensorDataset(torch.arange(23)), batch_size=2,
                                                                    shuffle=True)
    return dict(dispatch_batches=False), DataLoader(Stream(23), batch_size=2)


def resume(kind):
    """Two epochs uninterrupted; then a run stopped after 2 batches of epoch 1 and resumed in a fresh Accelerator:
    the rest of epoch 1 must be the uninterrupted run's."""
    config, loader = data_for(kind)
    accelerator = make(**config)
    whole = accelerator.prepare(loader)
    epochs = [[accelerator.gather_for_metrics(b[0] if isinstance(b, list) else b).tolist() for b in whole]
              for _ in range(2)]
    config, loader = data_for(kind)
    accelerator = make(**config)
    stopped = accelerator.prepare(loader)
    for _ in stopped:
        pass
    for index, _ in enumerate(stopped):
        if index == 1:
            accelerator.save_state(os.path.join(OUT, f"ckpt-{kind}"))
            break
    config, loader = data_for(kind)
    accelerator = make(**dict(config, data_seed=None))  # the order's seed comes back from the checkpoint
    resumed = accelerator.prepare(loader)
    accelerator.load_state(os.path.join(OUT, f"ckpt-{kind}"))
    rest = [accelerator.gather_for_metrics(b[0] if isinstance(b, list) else b).tolist() for b in resumed]
    return {"epoch1": epochs[1], "rest": rest, "epoch": resumed.epoch}


def cross():
    """Load the checkpoints another number of processes wrote: dispatched continues, sharded is refused."""
    out = {}
    config, loader = data_for("dispatch")
    accelerator = make(**dict(config, data_seed=None))
    resumed = accelerator.prepare(loader)
    accelerator.load_state(os.path.join(OUT, "ckpt-dispatch"))
    out["dispatch_rest"] = [accelerator.gather_for_metrics(b[0]).tolist() for b in resumed]
    config, loader = data_for("shard")
    accelerator = make(**config)
    accelerator.prepare(loader)
    try:
        accelerator.load_state(os.path.join(OUT, "ckpt-shard"))
        out["shard_error"] = None
    except ValueError as error:
        out["shard_error"] = str(error)
    return out


probe = make()
rank, world = probe.process_index, probe.num_processes
if MODE == "cross":
    result = {"world": world, **cross()}
else:
    result = {"world": world, "cases": cases()}
    if LIB == "tasktrain":
        result["reads"] = reads()
        result["standalone"] = standalone()
        result["by_hand"] = {"strategy": by_hand(probe.strategy), "process_group": by_hand(None)}
        result["resume"] = {kind: resume(kind) for kind in ("dispatch", "shard")}
with open(os.path.join(OUT, f"{MODE}_{rank}.json"), "w") as f:
    json.dump(result, f)
probe.wait_for_everyone()
