"""The Accelerator's prepared map-style loaders give each process exactly Accelerate 1.15's batches (issue 26), with
split_batches, even_batches, drop_last and a shuffling loader's own generator, on one and on two real processes
(gloo); gather_for_metrics gives each sample of the epoch once; a resume on another number of processes continues
the same global order. Accelerate's own prepare_data_loader / BatchSamplerShard (with explicit num_processes and
process_index: no process group needed) is the oracle; tasktrain.data_loader is checked against it too."""
import itertools
import json
import os
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from test_accelerator import SCRIPTS, clean_env, launch

SEED = 1234  # the worker's generator seed
CASES = list(itertools.product((10, 11), (False, True), (True, False), (False, True), (False, True)))
IDS = [f"n{n}-split{int(s)}-even{int(e)}-drop{int(d)}-shuffle{int(sh)}" for n, s, e, d, sh in CASES]


def loader(n, batch_size, shuffle, drop_last):
    generator = torch.Generator().manual_seed(SEED) if shuffle else None
    return DataLoader(list(range(n)), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                      generator=generator)


def accelerate_batches(n, split, even, drop, shuffle, world, rank, epochs=2):
    """Accelerate's batches of process `rank` of `world`, epoch by epoch, and its prepared loader."""
    from accelerate.data_loader import prepare_data_loader

    prepared = prepare_data_loader(loader(n, 4, shuffle, drop), num_processes=world, process_index=rank,
                                   split_batches=split, even_batches=even)
    return [[batch.tolist() for batch in prepared] for _ in range(epochs)], prepared


def epoch_orders(n, shuffle, drop, epochs=2):
    """The plain loader's samples, epoch by epoch: the global order."""
    plain = loader(n, 4, shuffle, drop)
    return [[i for batch in plain for i in batch.tolist()] for _ in range(epochs)]


def run_worker(tmp_path, processes, *jobs, timeout=300):
    """The worker's jobs ((OUT, MODE, ARGS...) each) one after the other in one process, or in one launch of
    `processes`."""
    import subprocess

    script = os.path.join(SCRIPTS, "shard_worker.py")
    args = [str(arg) for job in jobs for arg in ("then", *job)][1:]
    if processes == 1:
        run = subprocess.run([sys.executable, script, *args], cwd=tmp_path, env=clean_env(tmp_path),
                             capture_output=True, text=True, timeout=timeout)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    else:
        launch(["--num_processes", str(processes), script, *args], tmp_path, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of the worker, in three starts instead of six: one process runs the one-process cases and saves the
    1-to-2 resume's state; one launch of two runs the two-process cases, saves the 2-to-1 resume's state and loads
    the 1-to-2 one's; one process loads the 2-to-1 one's. {name: its folder}."""
    root = tmp_path_factory.mktemp("shard")
    folders = {name: root / name for name in ("cases1", "cases2", "2-to-1", "1-to-2")}
    for folder in folders.values():
        folder.mkdir()
    run_worker(root, 1, (folders["cases1"], "cases"), (folders["1-to-2"], "resume", "save", 3))
    run_worker(root, 2, (folders["cases2"], "cases"), (folders["2-to-1"], "resume", "save", 2),
               (folders["1-to-2"], "resume", "load"), timeout=450)
    run_worker(root, 1, (folders["2-to-1"], "resume", "load"))
    return folders


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-processes"])
def cases(request, runs):
    """Every case, from one run on `world` processes: {rank: results}."""
    world = request.param
    out = runs[f"cases{world}"]
    return world, [json.loads((out / f"cases_rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batches_are_accelerates(cases, case):
    world, ranks = cases
    n, split, even, drop, shuffle = case
    key = f"{n}-{split}-{even}-{drop}-{shuffle}"
    for rank, results in enumerate(ranks):
        mine = results[key]
        expected, prepared = accelerate_batches(n, split, even, drop, shuffle, world, rank)
        assert [epoch["batches"] for epoch in mine["epochs"]] == expected, (rank, key)
        for epoch in mine["epochs"]:
            count = len(epoch["batches"])
            assert epoch["ends"] == [False] * (count - 1) + [True]  # end_of_dataloader during the last batch only
            assert mine["len"] == count
        # Accelerate's counts (its len() counts a slice that a process does not get: ours is what it yields)
        if not (split and not even and world > 1):
            assert mine["len"] == len(prepared)
        assert mine["remainder"] == prepared.remainder == (-1 if drop else n % prepared.total_batch_size)
        assert mine["total_batch_size"] == prepared.total_batch_size
        assert mine["total_dataset_length"] == prepared.total_dataset_length == n
        assert mine["iteration"] == 2 and mine["inner"] == "BatchSampler" and mine["even_batches"] == even


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gather_for_metrics_gives_each_sample_once(cases, case):
    world, ranks = cases
    n, split, even, drop, shuffle = case
    key = f"{n}-{split}-{even}-{drop}-{shuffle}"
    orders = epoch_orders(n, shuffle, drop)
    per_rank = [accelerate_batches(n, split, even, drop, shuffle, world, r)[0] for r in range(world)]
    for rank, results in enumerate(ranks):
        for epoch, mine in enumerate(results[key]["epochs"]):
            gathered, common = mine["gathered"], mine["common"]
            assert gathered == [results[key]["epochs"][epoch]["gathered"] for results in ranks][0]  # every rank alike
            if even and not drop or world == 1:
                expected = orders[epoch]  # the whole epoch, each sample once, in its order
            else:
                # no refill: the samples of the steps every process has (all of them for even_batches=False)
                real = sum(len(per_rank[r][epoch][step]) for r in range(world) for step in range(common)
                           if step < len(per_rank[r][epoch]))
                expected = orders[epoch][:real]
                if drop:  # the full steps
                    total = 4 if split else 4 * world
                    assert real == (n // total) * total
            assert gathered == expected, (rank, epoch)


@pytest.mark.timeout(120)
def test_join_overrides_even_batches_and_skip_shortens_len(cases):
    world, ranks = cases
    for rank, results in enumerate(ranks):
        inside_even, inside_batches = results["join"]["inside"]
        assert inside_even is False and results["join"]["after"] is True
        assert inside_batches == accelerate_batches(10, False, False, False, False, world, rank, epochs=1)[0][0]
        full = accelerate_batches(10, False, True, False, False, world, rank, epochs=1)[0][0]
        assert results["skip"] == {"len": len(full) - 1, "batches": full[1:], "len_after": len(full)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("saved, loaded, stop", [(2, 1, 2), (1, 2, 3)], ids=["2-to-1", "1-to-2"])
def test_resume_on_another_world_size_continues_the_global_order(runs, saved, loaded, stop):
    folder = runs[f"{saved}-to-{loaded}"]  # saved after `stop` steps of epoch 1 (the fixture's runs)
    before = json.loads((folder / "resume_save_rank0.json").read_text())
    after = json.loads((folder / "resume_load_rank0.json").read_text())
    plain = DataLoader(list(range(20)), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    orders = [[i for batch in plain for i in batch.tolist()] for _ in range(3)]
    flat = lambda steps: [i for step in steps for i in step]  # noqa: E731
    consumed = flat(before)
    assert consumed == orders[0] + orders[1][:len(consumed) - 20]  # the plain loader's order, on `saved` processes
    assert len(consumed) == 20 + stop * 2 * saved
    # the rest of the epoch, each sample once, then the next epoch as an uninterrupted run draws it
    assert flat(after) == orders[1][len(consumed) - 20:] + orders[2]
    assert sorted(consumed[20:] + flat(after)[:20 - (len(consumed) - 20)]) == list(range(20))


# -- the standalone module (Accelerate's accelerate.data_loader names) ---------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3])
def test_data_loader_module_matches_accelerate(world):
    import accelerate.data_loader as theirs

    import tasktrain.data_loader as ours

    for n, split, even, drop, shuffle in CASES:
        if split and 4 % world:
            continue
        for rank in range(world):
            got = []
            for module in (theirs, ours):
                base = loader(n, 4, shuffle, drop)
                shard = module.BatchSamplerShard(base.batch_sampler, world, rank, split_batches=split,
                                                 even_batches=even)
                prepared = module.prepare_data_loader(loader(n, 4, shuffle, drop), num_processes=world,
                                                      process_index=rank, split_batches=split, even_batches=even)
                epochs = [[b.tolist() for b in prepared] for _ in range(2)]
                result = [[list(b) for b in shard], len(shard), epochs, len(prepared), prepared.remainder,
                          prepared.total_batch_size]
                if len(prepared):  # (Accelerate's SkipBatchSampler has a negative length on an empty shard)
                    skipped = module.skip_first_batches(prepared, 1)
                    result += [len(skipped), [b.tolist() for b in skipped]]
                got.append(result)
            assert got[0] == got[1], (n, split, even, drop, shuffle, world, rank)


def test_data_loader_module_errors():
    import tasktrain.data_loader as ours

    with pytest.raises(ValueError, match="multiple of the number of processes"):
        ours.prepare_data_loader(DataLoader(list(range(10)), batch_size=3), num_processes=2, process_index=0,
                                 split_batches=True)
    for option in ({"dispatch_batches": True}, {"use_stateful_dataloader": True}, {"torch_device_mesh": object()}):
        with pytest.raises(ValueError):
            ours.prepare_data_loader(DataLoader(list(range(10)), batch_size=2), num_processes=2, process_index=0,
                                     **option)
    sampler = ours.SeedableRandomSampler(list(range(10)), data_seed=3)
    first = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first and sorted(first) == list(range(10))
    assert list(sampler) != first  # the iteration moved it to epoch 1 ... then 2


def test_split_batches_with_an_indivisible_batch_size_is_a_clear_error():
    from tasktrain.trainer.shard import ShardData

    with pytest.raises(ValueError, match=r"batch size \(3\) must be a multiple of the number of processes \(2\)"):
        ShardData(DataLoader(list(range(10)), batch_size=3), 2, 0, 0, split_batches=True)
