"""DataLoaderConfiguration(dispatch_batches=...) and IterableDataset loaders in the Accelerator (tasktrain/trainer/
dispatch.py), on 1 and 2 real processes: per rank the batches are Accelerate's, only rank 0 reads a dispatched
loader, gather_for_metrics returns exactly the data, and save_state / load_state resume mid-epoch.

The expected batches come from Accelerate's documented behaviour (its DataLoaderDispatcher: rank 0 joins W batches
of the loader, or takes one with split_batches, and rank r keeps the r-th of W equal slices, an uneven last step
completed with the pass's first samples), and for a stream sharded without dispatch from Accelerate's own pure
IterableDatasetShard with explicit num_processes / process_index. (Running tests/accelerator_scripts/
dispatch_cases.py under Accelerate itself, `torchrun --nproc_per_node 2 dispatch_cases.py accelerate OUT`, gives
the same batches, end_of_dataloader flags, lengths and remainders; its gather_for_metrics keeps a sharded stream's
repeats, which ours drops.)
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from test_accelerator import SCRIPTS, clean_env, launch

CASES = os.path.join(SCRIPTS, "dispatch_cases.py")


# -- what Accelerate does, from its documentation -------------------------------------------------------------------------
def dispatched(n, batch_size, world, rank, split, drop_last=False, has_len=True):
    """Accelerate's DataLoaderDispatcher over 0..n-1: (len, [(batch, end, gathered)], remainder) of `rank`."""
    items = list(range(n))
    loader = [items[i:i + batch_size] for i in range(0, n, batch_size)]
    if drop_last and loader and len(loader[-1]) < batch_size:
        loader.pop()
    per_step = 1 if split else world
    steps = [sum(loader[i:i + per_step], []) for i in range(0, len(loader), per_step)]
    if drop_last and steps and len(loader) % per_step:
        steps.pop()
    first = steps[0][:world] if steps else []
    out = []
    for index, step in enumerate(steps):
        real, size = len(step), len(step) // world
        padded = list(step)
        if world > 1 and real % world and not drop_last:
            size += 1
            while len(padded) < size * world:
                padded += first[:size * world - len(padded)]
        mine = padded[rank * size:(rank + 1) * size] if world > 1 else step
        out.append((mine, index == len(steps) - 1, step))
    return (len(steps) if has_len else None), out, (len(steps[-1]) if steps else -1)


def sharded(n, batch_size, world, rank, split, drop_last=False):
    """Accelerate's DataLoaderShard over IterableDatasetShard (its own class, explicit process index) of 0..n-1;
    on one process the loader as it is (Accelerate does not wrap it)."""
    from accelerate.data_loader import IterableDatasetShard

    items = list(range(n))
    if world == 1:
        mine = items
        per_process = global_size = batch_size
    else:
        mine = list(IterableDatasetShard(items, batch_size=batch_size, drop_last=drop_last, num_processes=world,
                                         process_index=rank, split_batches=split))
        per_process = batch_size // world if split else batch_size
        global_size = batch_size if split else batch_size * world
    batches = [mine[i:i + per_process] for i in range(0, len(mine), per_process)]
    if drop_last and world == 1 and batches and len(batches[-1]) < batch_size:
        batches.pop()
    gathered = [items[i * global_size:(i + 1) * global_size] for i in range(len(batches))]  # the real samples
    return None, [(b, i == len(batches) - 1, g) for i, (b, g) in enumerate(zip(batches, gathered))], -1


def expected(name, world, rank):
    kind, n = name.split("-n")[0], int(name.split("-n")[1].split("-")[0])
    split, drop = name.endswith("split1"), name.endswith("drop")
    if kind == "iter-shard":
        return sharded(n, 4, world, rank, split, drop)
    return dispatched(n, 4, world, rank, split, drop, has_len=kind == "map-dispatch")


def test_the_expectations_are_accelerates_documented_examples():
    # rank 0 [0-3][8], rank 1 [4-7][9] for 10 items; the last step of 11 completed with sample 0 (the docs' example)
    assert [b for b, _, _ in dispatched(10, 4, 2, 0, False)[1]] == [[0, 1, 2, 3], [8]]
    assert [b for b, _, _ in dispatched(11, 4, 2, 1, False)[1]] == [[4, 5, 6, 7], [10, 0]]
    assert [b for b, _, _ in dispatched(11, 4, 2, 1, True)[1]] == [[2, 3], [6, 7], [10, 0]]
    # IterableDatasetShard's docstring: 0..7, batch 4, 2 processes
    assert [b for b, _, _ in sharded(8, 4, 2, 1, False)[1]] == [[4, 5, 6, 7]]
    assert [b for b, _, _ in sharded(8, 4, 2, 0, True)[1]] == [[0, 1], [4, 5]]


# -- the launches: one of 2 processes (its checkpoints then loaded on 1), one of 1 ----------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    two, one = tmp_path_factory.mktemp("two"), tmp_path_factory.mktemp("one")
    launch(["--num_processes", "2", CASES, "tasktrain", str(two)], two, timeout=300)
    for args in (["tasktrain", str(one)], ["tasktrain", str(two), "cross"]):
        run = subprocess.run([sys.executable, CASES, *args], cwd=one, env=clean_env(one), capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    def read(folder, name):
        with open(os.path.join(folder, name)) as f:
            return json.load(f)

    return {2: [read(two, "cases_0.json"), read(two, "cases_1.json")], 1: [read(one, "cases_0.json")],
            "cross": read(two, "cross_0.json")}


@pytest.mark.parametrize("world", [1, 2])
def test_batches_per_rank_are_accelerates(runs, world):
    names = sorted(runs[world][0]["cases"])
    assert len(names) == 20  # map-style dispatched, an IterableDataset by default, dispatched and sharded; n 10, 11
    for rank, result in enumerate(runs[world]):
        assert result["world"] == world
        for name in names:
            got = result["cases"][name]
            length, batches, remainder = expected(name, world, rank)
            assert got["len"] == length, (name, rank)
            assert [(b["batch"], b["end"]) for b in got["batches"]] == [(b, e) for b, e, _ in batches], (name, rank)
            assert got["remainder"] == remainder, (name, rank)
            # gather_for_metrics: exactly the step's real samples, in order, repeats dropped
            assert [b["gathered"] for b in got["batches"]] == [g for _, _, g in batches], (name, rank)


@pytest.mark.parametrize("world", [1, 2])
def test_gather_for_metrics_over_an_epoch_is_the_data_once(runs, world):
    for name, got in runs[world][0]["cases"].items():
        n = int(name.split("-n")[1].split("-")[0])
        everything = sum((b["gathered"] for b in got["batches"]), [])
        if name.endswith("drop"):
            per_step = 4 * world if "shard" in name or world > 1 else 4
            assert everything == list(range(n // per_step * per_step)), name
        else:
            assert everything == list(range(n)), name


@pytest.mark.parametrize("world", [1, 2])
def test_a_dispatcher_built_by_hand_over_a_strategy_or_the_process_group(runs, world):
    for rank, result in enumerate(runs[world]):
        want = [b for b, _, _ in dispatched(11, 4, world, rank, False)[1]]
        assert result["by_hand"] == {"strategy": want, "process_group": want}, rank


@pytest.mark.parametrize("world", [1, 2])
def test_the_standalone_prepare_data_loader_dispatches_and_shards_iterables(runs, world):
    for rank, result in enumerate(runs[world]):
        got = result["standalone"]
        assert got["map-dispatch"] == [b for b, _, _ in dispatched(11, 4, world, rank, False)[1]], rank
        for split in (False, True):
            want = [b for b, _, _ in sharded(11, 4, world, rank, split, False)[1]]
            assert got[f"iter-shard-split{int(split)}"] == want, (rank, split)


def test_the_standalone_prepare_data_loader_refuses_dispatch_off_the_device():
    from tasktrain.data_loader import prepare_data_loader

    with pytest.raises(ValueError, match="put_on_device=True"):
        prepare_data_loader(DataLoader(list(range(4)), batch_size=2), dispatch_batches=True)
    with pytest.raises(ValueError, match="only with dispatch_batches=True"):
        prepare_data_loader(DataLoader(list(range(4)), batch_size=2), slice_fn_for_dispatch=lambda *a, **k: a[0])


def test_only_rank_zero_touches_a_dispatched_data_set(runs):
    rank0, rank1 = (result["reads"] for result in runs[2])
    assert rank1["map-dispatch"] == 0 and rank1["iter-default"] == 0  # not even len() or iter()
    assert rank0["map-dispatch"] > 11 and rank0["iter-default"] == 1
    assert rank0["iter-shard"] == rank1["iter-shard"] == 1  # sharded without dispatch: each reads the stream


@pytest.mark.parametrize("world", [1, 2])
def test_save_state_load_state_resume_mid_epoch(runs, world):
    for rank, result in enumerate(runs[world]):
        for kind in ("dispatch", "shard"):
            resume = result["resume"][kind]
            assert resume["rest"] == resume["epoch1"][2:], (kind, rank)  # stopped after 2 steps of epoch 1
            assert resume["epoch"] == 2
        # the shuffled map-style data really is shuffled, and each epoch holds every sample once
        epoch = sum(result["resume"]["dispatch"]["epoch1"], [])
        assert sorted(epoch) == list(range(23)) and epoch != list(range(23))


def test_a_dispatched_loader_resumes_on_another_number_of_processes(runs):
    two = runs[2][0]["resume"]["dispatch"]["epoch1"]  # steps of 2 x 2 samples
    one = runs["cross"]["dispatch_rest"]  # 1 process continues the 2-process checkpoint taken after 2 steps
    assert sum(one, []) == sum(two[2:], []) and all(len(b) == 2 for b in one[:-1])
    error = runs["cross"]["shard_error"]
    assert error and "on 2 processes" in error and "this run has 1" in error
    assert "dispatch_batches=True" in error and "Resume on 2 processes" in error


# -- one process, no launch -------------------------------------------------------------------------------------------------
class Items(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset_shard_yields_accelerates_items(split, drop_last):
    from accelerate.data_loader import IterableDatasetShard as Theirs

    from tasktrain.trainer.dispatch import IterableDatasetShard

    for n in range(0, 14):
        for batch_size in (1, 2, 4, 6):
            for world in (1, 2, 3):
                if split and batch_size % world:  # (Accelerate's lets batch_size 1 through, then yields nothing)
                    with pytest.raises(ValueError, match="multiple of"):
                        IterableDatasetShard(Items(n), batch_size, drop_last, world, 0, split)
                    continue
                for rank in range(world):
                    args = (batch_size, drop_last, world, rank, split)
                    ours = IterableDatasetShard(list(range(n)), *args)
                    assert list(ours) == list(Theirs(Items(n), *args)), (n, args)
                    assert len(ours) == len(list(ours)), (n, args)  # counts what it yields (also when split)


def test_iterable_dataset_shard_skips_global_batches_and_records_its_padding():
    from tasktrain.trainer.dispatch import IterableDatasetShard

    shard = IterableDatasetShard(list(range(11)), batch_size=2, num_processes=2, process_index=1)
    assert list(shard) == [2, 3, 6, 7, 10, 0] and shard.padding == 1
    shard.skip_batches = 2
    assert list(shard) == [10, 0] and list(shard) == [2, 3, 6, 7, 10, 0]  # a skip applies to one pass
    with pytest.raises(ValueError, match="process_index must be in"):
        IterableDatasetShard(Items(3), num_processes=2, process_index=2)


def test_data_loader_dispatcher_by_hand_takes_accelerates_arguments():
    from tasktrain.trainer.dispatch import DataLoaderDispatcher, slice_batch

    data = TensorDataset(torch.arange(10))
    loader = DataLoaderDispatcher(data, batch_size=4, skip_batches=1, iteration=3)
    assert loader.epoch == 3 and len(loader) == 2 and loader.total_batch_size == 4
    assert [b[0].tolist() for b in loader] == [[4, 5, 6, 7], [8, 9]] and loader.epoch == 4
    assert loader.end_of_dataloader and loader.remainder == 2
    assert [b[0].tolist() for b in loader] == [[4, 5, 6, 7], [8, 9]]  # skip_batches holds for every pass
    calls = []

    def halves(batch, part, process_index=None, num_processes=None):
        calls.append((part, process_index, num_processes))
        return slice_batch(batch, part)

    from tasktrain.trainer.dispatch import _ProcessGroupWorld

    class TwoRanks(_ProcessGroupWorld):  # rank 1 of a world of 2 whose rank 0 sends what a loader over `data` reads
        def __init__(self):
            super().__init__()
            self.global_rank, self.world_size = 1, 2
            self.sent = [([torch.arange(0, 4)], 1, False), ([torch.arange(4, 7)], 1, True)]

        def broadcast(self, obj, src=0):
            assert obj is None  # rank 1 has nothing to send
            return self.sent.pop(0)

    other = DataLoaderDispatcher(data, batch_size=4, split_batches=True, slice_fn=halves, strategy=TwoRanks())
    assert other._reader is None  # rank 1 never builds a reader
    assert [b[0].tolist() for b in other] == [[2, 3], [6, 0]]  # the uneven last step completed with sample 0
    assert calls[1:] == [(slice(2, 4), 1, 2), (slice(2, 4), 1, 2)] and other.repeated_in_batch() == 1
    with pytest.raises(ValueError, match="torch_device_mesh"):
        DataLoaderDispatcher(data, torch_device_mesh=object())
    with pytest.raises(ValueError, match="multiple of 2"):
        DataLoaderDispatcher(data, batch_size=3, split_batches=True, strategy=TwoRanks())


def test_the_compat_accelerator_takes_dispatch_batches_only_from_the_configuration():
    from tasktrain import Accelerator
    from tasktrain.utils import DataLoaderConfiguration

    with pytest.raises(TypeError, match="DataLoaderConfiguration"):
        Accelerator(dispatch_batches=True)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True, split_batches=True))
    assert accelerator.dispatch_batches is True and accelerator.split_batches is True
    prepared = accelerator.prepare(DataLoader(TensorDataset(torch.arange(6)), batch_size=4))
    assert type(prepared).__name__ == "DataLoaderDispatcher" and accelerator.prepare(prepared) is prepared
    assert accelerator.skip_first_batches(prepared, 1) is prepared and [b[0].tolist() for b in prepared] == [[4, 5]]
    plain = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    assert type(plain.prepare(DataLoader(TensorDataset(torch.arange(6)), batch_size=4))).__name__ == \
        "PreparedDataLoader"  # map-style without dispatch: sharded by batch sampler (tasktrain/trainer/shard.py)


def test_accumulation_windows_end_at_a_dispatched_loaders_last_batch():
    from tasktrain import Accelerator
    from tasktrain.utils import DataLoaderConfiguration

    for dataset in (TensorDataset(torch.randn(10, 2)), [torch.randn(2) for _ in range(10)]):
        accelerator = Accelerator(gradient_accumulation_steps=2,
                                  dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
        model = torch.nn.Linear(2, 1)
        model, optimizer, data = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                     DataLoader(dataset, batch_size=2))
        syncs = []
        for batch in data:
            x = batch[0] if isinstance(batch, list) else batch
            with accelerator.accumulate(model):
                accelerator.backward(model(x).sum())
                syncs.append(accelerator.sync_gradients)
        assert syncs == [False, True, False, True, True]


def test_an_iterable_dataset_is_dispatched_by_default_and_a_sharded_stream_keeps_its_path():
    from tasktrain import Accelerator
    from tasktrain.data import ShardedStream
    from tasktrain.trainer.accelerator import PreparedDataLoader
    from tasktrain.utils import DataLoaderConfiguration

    class Numbers:
        def shard_sizes(self):
            return [3, 2]

        def read(self, shard, indices):
            return [100 * shard + i for i in indices]

    accelerator = Accelerator()
    assert type(accelerator.prepare(DataLoader(Items(5), batch_size=2))).__name__ == "DataLoaderDispatcher"
    assert isinstance(accelerator.prepare(DataLoader(TensorDataset(torch.arange(4)), batch_size=2)),
                      PreparedDataLoader)
    stream = accelerator.prepare(DataLoader(ShardedStream(Numbers(), shuffle=False), batch_size=2))
    assert isinstance(stream, PreparedDataLoader) and sum((b.tolist() for b in stream), []) == [0, 1, 2, 100, 101]
    # dispatch_batches=True: rank 0 reads the stream in its global order (1 process of it), resumable by position
    dispatching = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    stream = dispatching.prepare(DataLoader(ShardedStream(Numbers(), shuffle=False), batch_size=2))
    assert type(stream).__name__ == "DataLoaderDispatcher"
    assert sum((b.tolist() for b in stream), []) == [0, 1, 2, 100, 101]
