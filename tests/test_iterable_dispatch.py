"""A plain IterableDataset (it splits itself over DataLoader workers, not over processes) under the Trainer and the
Accelerator on real processes (gloo): rank 0 reads it and dispatches each process its slice of every global batch,
so each item is trained once per epoch, with 0 and with 2 workers; a run stopped in the middle of an epoch resumes
on another number of processes with exactly the items left (tasktrain/trainer/dispatch.py).

The runs are tests/stream_scripts/train.py's (data "plain": 48 items, 2 epochs), in three launches:
1 process (the Accelerator saves after step 3 and goes on; the Trainer is SIGKILLed after step 3), 2 processes
(whole runs with 0 and 2 workers; the 1 -> 2 resumes; the Accelerator saves after step 3 with 2 workers; the Trainer
is SIGKILLed after step 3 with 2 workers), 1 process (the 2 -> 1 resumes). Without dispatch every rank read the
whole data set: 192 items trained per epoch of 96 on 2 processes, and no resume on another number of processes.
"""
import json
import os
from collections import Counter

import pytest

from test_stream import N, accelerator_run, by_step, epoch_ids, launch, reads, records, trainer_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("iterable")
    last = lambda name: str(root / name / "last.ckpt")  # noqa: E731  (the checkpoint of the killed step)
    logs = {"one": launch(root, [accelerator_run("a11", "plain", 8, 0), trainer_run("k11", "plain", 8, 0, kill_at=3)],
                          1, expect_ok=False)}
    logs["two"] = launch(root, [trainer_run("t22_0", "plain", 4, 0), trainer_run("t22_2", "plain", 4, 2),
                                trainer_run("r12", "plain", 4, 0, resume=last("k11")),
                                accelerator_run("a22", "plain", 4, 2, gather=True),
                                accelerator_run("ar12", "plain", 4, 0, resume="a11"),
                                trainer_run("k22", "plain", 4, 2, kill_at=3)], 2, expect_ok=False)
    # the same loader as the killed run (4 per batch, 2 workers: each worker batches its own items, so the order
    # of the loader depends on its batch size); the global batch goes from 8 to 4
    logs["back"] = launch(root, [trainer_run("r21", "plain", 4, 2, resume=last("k22")),
                                 accelerator_run("ar21", "plain", 4, 2, resume="a22")], 1)
    return root, logs


def _steps_of(recs, rank):
    return [(e, s) for e, s, r, _ in recs if r == rank]


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_each_item_is_trained_once_per_epoch_on_two_processes(runs):
    root, logs = runs
    for name, epochs in (("t22_0", (0, 1)), ("t22_2", (0, 1)), ("a22", (0, 1)), ("ar12", (1,))):
        recs = records(root, name, 2)
        for epoch in epochs:
            assert epoch_ids(recs, epoch) == list(range(N)), (name, epoch)  # once each, not twice
        assert _steps_of(recs, 0) == _steps_of(recs, 1), name  # the same steps on both ranks
        for step, ids in by_step(recs).items():
            assert len(ids) == len(set(ids)) == 8, (name, step)  # each rank its own slice of the global batch
    # only rank 0 (and its workers) read the data set: each item once per epoch, not once per process
    for name in ("t22_0", "t22_2", "a22"):
        assert Counter(reads(root, name)) == Counter(list(range(N)) * 2), name
    # the loader's own order with 2 workers (worker w reads w, w + 2, ...), the global batch of a step 2 x 4
    first = [ids for e, s, r, ids in records(root, "t22_2", 2) if (e, s) == (0, 1)]
    assert first == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # gather_for_metrics: each step's items once, rank 0's slice then rank 1's (the loader's order)
    with open(os.path.join(root, "a22.ids.rankgathered.txt")) as f:
        gathered = [json.loads(line) for line in f]
    recs = records(root, "a22", 2)
    for row in gathered:
        assert row["ids"] == [i for rank in (0, 1) for e, s, r, ids in recs if (e, s, r) == (row["epoch"],
                                                                                           row["step"], rank)
                              for i in ids]
    assert sorted(i for row in gathered if row["epoch"] == 0 for i in row["ids"]) == list(range(N))


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stopped, stopped_world, resumed, resumed_world", [
    ("k11", 1, "r12", 2), ("k22", 2, "r21", 1), ("a11", 1, "ar12", 2), ("a22", 2, "ar21", 1)])
def test_a_run_stopped_mid_epoch_resumes_on_another_number_of_processes(runs, stopped, stopped_world, resumed,
                                                                        resumed_world):
    root, logs = runs
    before = [r for r in records(root, stopped, stopped_world) if r[1] <= 3]  # (the Accelerator's run went on)
    after = records(root, resumed, resumed_world)
    assert max(r[1] for r in before) == 3 and min(r[1] for r in after) == 4
    # exactly the items left of the stopped epoch, then a whole epoch
    assert sorted(epoch_ids(before, 0) + epoch_ids(after, 0)) == list(range(N))
    assert epoch_ids(after, 1) == list(range(N))
    if stopped in ("k11", "a11"):  # no workers, the global batch kept (1 x 8 -> 2 x 4): the uninterrupted steps
        assert by_step(before + after) == by_step(records(root, "t22_0", 2))
    else:  # the global batch went from 2 x 4 to 1 x 4, said once
        assert logs["back"].count("global batch changes from 8 to 4") == 2  # (the Trainer's, the Accelerator's)


# -- one process: the saved position's shape, old and new, and what cannot continue ---------------------------------------
def test_a_dispatched_loader_loads_the_old_position_and_refuses_what_it_cannot_continue():
    import torch
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    from tasktrain import Accelerator
    from tasktrain.utils import DataLoaderConfiguration

    dispatching = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    loader = dispatching.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=2))
    # the shape written before the position had one (2 processes: 2 steps of 2 batches of the loader read)
    loader.load_state_dict({"kind": "dispatched", "epoch": 1, "batches_seen": 2, "reader_batches": 4,
                            "world_size": 2, "split_batches": False, "batch_size": 2, "samples_seen": None,
                            "accumulation": 1})
    assert [b[0].tolist() for b in loader] == [[8, 9]] and loader.epoch == 2
    state = loader.state_dict()
    assert state == {"kind": "dispatched", "epoch": 2, "batches_seen": 0, "samples_seen": 0, "world_size": 1,
                     "batch_size": 2, "split_batches": False, "accumulation": 1}
    with pytest.raises(ValueError, match="in a prepared loader of another kind"):
        loader.load_state_dict(dict(state, kind="shard", batches_seen=1, samples_seen=2))

    class Items(IterableDataset):
        def __iter__(self):
            return iter(range(12))

    # with workers, each makes whole batches of its own items: the order depends on the batch size
    plain = Accelerator(cpu=True).prepare(DataLoader(Items(), batch_size=2, num_workers=2))
    saved = {"kind": "dispatched", "epoch": 0, "batches_seen": 1, "samples_seen": 4, "world_size": 1,
             "batch_size": 4, "split_batches": False, "accumulation": 1}
    with pytest.raises(ValueError, match="Resume with batch_size 4"):
        plain.load_state_dict(saved)
    plain.load_state_dict(dict(saved, batch_size=2))  # the same batch size: on any number of processes
