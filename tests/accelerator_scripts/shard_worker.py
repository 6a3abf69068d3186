"""The Accelerator's prepared map-style loaders, on however many processes launched this (tests/
test_accelerator_shard.py). `shard_worker.py OUT cases`: every combination of data size x split_batches x
even_batches x drop_last x shuffle, two epochs each, writing per rank what each batch held, the flags and counts
the loader tells, and what gather_for_metrics gave. `shard_worker.py OUT resume save K` / `... resume load`: epoch 0
whole, then K steps of epoch 1 and save_state (save) / load_state and the rest of epochs 1 and 2 (load), writing the
gathered samples of every step. Several jobs run one after the other in the same process(es), each with an Accelerator
of its own: `shard_worker.py OUT cases then OUT2 resume save 2 then OUT3 resume load` (the test starts three runs
for its six jobs: each start of an interpreter costs ~4 s of CPU in imports, a launch of two ~11 s)."""
import itertools
import json
import os
import sys

import torch
from torch.utils.data import DataLoader

from tasktrain import Accelerator, DataLoaderConfiguration

SEED = 1234


def loader(n, batch_size, shuffle, drop_last):
    generator = torch.Generator().manual_seed(SEED) if shuffle else None
    return DataLoader(list(range(n)), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                      generator=generator)


def write(out_dir, accelerator, name, value):
    with open(os.path.join(out_dir, f"{name}_rank{accelerator.process_index}.json"), "w") as f:
        json.dump(value, f)


def cases(out_dir):
    # the configuration reaches the prepared loaders (the matrix below sets the same attributes case by case)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True, even_batches=False))
    assert accelerator.split_batches is True and accelerator.even_batches is False
    world = accelerator.num_processes
    results = {}
    for n, split, even, drop, shuffle in itertools.product((10, 11), (False, True), (True, False), (False, True),
                                                           (False, True)):
        accelerator.split_batches, accelerator.even_batches = split, even
        data = accelerator.prepare(loader(n, 4, shuffle, drop))
        # ranks may have different numbers of batches (even_batches=False): gather only in steps all ranks have
        common = min(accelerator.gather(torch.tensor([len(data)])).tolist())
        epochs = []
        for _ in range(2):
            batches, ends, gathered = [], [], []
            for step, batch in enumerate(data):
                batches.append(batch.tolist())
                ends.append(data.end_of_dataloader)
                if step < common:
                    gathered += accelerator.gather_for_metrics(batch).tolist()
                    objects = accelerator.gather_for_metrics([f"s{i}" for i in batch.tolist()], use_gather_object=True)
                    assert objects == [f"s{i}" for i in gathered[len(gathered) - len(objects):]], objects
            epochs.append({"batches": batches, "ends": ends, "gathered": gathered, "common": common})
        results[f"{n}-{split}-{even}-{drop}-{shuffle}"] = {
            "epochs": epochs, "len": len(data), "remainder": data.remainder,
            "total_batch_size": data.total_batch_size, "total_dataset_length": data.total_dataset_length,
            "iteration": data.iteration, "inner": type(data.batch_sampler.batch_sampler).__name__,
            "even_batches": data.batch_sampler.even_batches}
    # join_uneven_inputs(even_batches=...) overrides inside the block only
    accelerator.split_batches, accelerator.even_batches = False, True
    data = accelerator.prepare(loader(10, 4, False, False))
    model = accelerator.prepare(torch.nn.Linear(1, 1))  # (DDP on several processes: what torch's Join takes)
    with accelerator.join_uneven_inputs([model], even_batches=False):
        inside = (data.batch_sampler.even_batches, [b.tolist() for b in data])
    results["join"] = {"inside": inside, "after": data.batch_sampler.even_batches}
    # skip_first_batches: that iteration is shorter
    data = accelerator.skip_first_batches(data, 1)
    results["skip"] = {"len": len(data), "batches": [b.tolist() for b in data], "len_after": len(data)}
    write(out_dir, accelerator, "cases", results)
    accelerator.end_training()


def resume(out_dir, action, *args):
    accelerator = Accelerator()
    data = accelerator.prepare(loader(20, 2, True, False))
    steps = []
    if action == "save":
        stop = int(args[0])
        for batch in data:
            steps.append(accelerator.gather_for_metrics(batch).tolist())
        for step, batch in enumerate(data):
            steps.append(accelerator.gather_for_metrics(batch).tolist())
            if step + 1 == stop:
                accelerator.save_state(os.path.join(out_dir, "state"))
                break
    else:
        accelerator.load_state(os.path.join(out_dir, "state"))
        assert data.epoch == 1
        for epoch in (1, 2):
            for batch in data:
                steps.append(accelerator.gather_for_metrics(batch).tolist())
    write(out_dir, accelerator, f"resume_{action}", steps)
    accelerator.end_training()


def main(argv):
    """Each job (OUT MODE ARGS..., jobs separated by "then") in turn, in this process (or launch), each with an
    Accelerator of its own."""
    job = []
    for arg in [*argv, "then"]:
        if arg != "then":
            job.append(arg)
            continue
        out_dir, mode, *args = job
        {"cases": cases, "resume": resume}[mode](out_dir, *args)
        job = []


if __name__ == "__main__":
    main(sys.argv[1:])
