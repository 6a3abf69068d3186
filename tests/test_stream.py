"""Streaming data (issue 28, tasktrain/data.py): sharded over ranks and DataLoader workers, resumed exactly on
another number of processes and workers without reading what was trained on.

The runs (tests/stream_scripts/train.py): 48 numbered items, 2 epochs, batches of 8 over all processes (1 x 8 or
2 x 4), an optimizer step per batch; "killed" runs are SIGKILLed once step 3 is done and saved. Two data sets: a
ShardedSource of our own (4 shards of 12 generated items) and ShardFiles (6 files of 8). processes x workers:
2x2 -> 1x3 and 1x1 -> 2x2, for the Trainer and for the Accelerator; and torchdata's StatefulDataLoader over a data set
that shards itself, 2x2 -> 2x2 (its state is one rank's). In one process: Hugging Face `datasets` streams (built
from numbers, nothing downloaded) and the StatefulDataLoader's resume from its own state, Trainer and Accelerator.
"""
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info

from ddp_scripts.common import free_port
from tasktrain import TaskModule
from tasktrain.data import ShardedStream, ShardFiles
from tasktrain.trainer.data import prepare_train_data

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "stream_scripts", "train.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
N = 48


# -- one process: the order, the parts, the end of an epoch -------------------------------------------------------
class Numbers:
    """Shard s holds items 100 s + i; every read is noted."""

    def __init__(self, sizes):
        self.sizes, self.reads = list(sizes), []

    def shard_sizes(self):
        return self.sizes

    def read(self, shard, indices):
        items = [100 * shard + i for i in indices]
        self.reads += items
        return items


def rank_batches(world, batch, sizes=(12, 12, 12, 12), start=0, drop_last=False, workers=0, seed=3):
    """{rank: [batch as a list]} of one epoch (0), each rank's loader prepared as the Trainer prepares it."""
    out, reads = {}, []
    for rank in range(world):
        source = Numbers(sizes)
        loader = DataLoader(ShardedStream(source), batch_size=batch, drop_last=drop_last, num_workers=workers)
        data = prepare_train_data(loader, world, rank, seed=seed)
        data.set_epoch(0)
        data.skip_samples(start)
        out[rank] = [b.tolist() for b in data]
        reads += source.reads
    return out, reads


def global_batches(parts):
    """The k-th batch of every rank together, in rank order."""
    return [sum((parts[r][k] for r in sorted(parts)), []) for k in range(len(parts[0]))]


def test_the_order_is_one_sequence_whatever_the_processes_and_each_reads_its_own_part():
    one, reads_one = rank_batches(1, 8)
    two, reads_two = rank_batches(2, 4)
    four, _ = rank_batches(4, 2)
    assert sorted(sum(one[0], [])) == sorted(100 * s + i for s in range(4) for i in range(12))
    assert global_batches(two) == global_batches(four) == one[0]  # the same global batches on 1, 2 and 4
    # each rank read only its own items: together, each item once
    assert sorted(reads_two) == sorted(reads_one) == sorted(sum(one[0], []))
    # another seed, another epoch: another order
    assert rank_batches(1, 8, seed=4)[0][0] != one[0]


def test_workers_produce_the_ranks_batches_in_turn():
    """Two DataLoader workers on each of 2 ranks (real worker processes): the same batches as without workers."""
    with_workers, _ = rank_batches(2, 4, workers=2)
    assert with_workers == rank_batches(2, 4)[0]


def test_a_resume_starts_at_the_global_count_and_reads_nothing_before_it():
    one, _ = rank_batches(1, 8)
    flat = sum(one[0], [])
    resumed, reads = rank_batches(3, 4, start=24)  # another world and batch: 24 items consumed by the others
    assert sorted(sum(global_batches(resumed), [])) == sorted(flat[24:])
    assert sum(global_batches(resumed), []) == flat[24:]  # the rest in the epoch's order
    assert sorted(reads) == sorted(flat[24:])  # the consumed ones were not read


def test_uneven_end_pads_to_even_ranks_or_drops():
    # 13 items on 2 ranks x 5: 10 in the first global batch, then 3 left, padded to 4 with the epoch's first item
    parts, _ = rank_batches(2, 5, sizes=(7, 6))
    order = sum(rank_batches(1, 13, sizes=(7, 6))[0][0], [])
    assert [len(b) for b in parts[0]] == [len(b) for b in parts[1]] == [5, 2]  # the same steps on every rank
    assert sum(global_batches(parts), []) == order + order[:1]
    dropped, _ = rank_batches(2, 5, sizes=(7, 6), drop_last=True)
    assert [len(b) for b in dropped[0]] == [len(b) for b in dropped[1]] == [5]
    assert sum(global_batches(dropped), []) == order[:10]
    # the loader's length is the rank's batches, padded or dropped
    loader = DataLoader(ShardedStream(Numbers((7, 6))), batch_size=5)
    data = prepare_train_data(loader, 2, 1, seed=3)
    assert len(data) == 2
    # what the Accelerator's gather_for_metrics drops: this iteration's items per rank and repeats over all
    list(data)
    assert (data.iteration_samples, data.iteration_padding) == (7, 1)
    data.skip_samples(10)
    list(data)
    assert (data.iteration_samples, data.iteration_padding) == (2, 1)
    # resumed at 12 on 3 ranks: 1 left, padded to 3 (each rank a batch of 1)
    parts, _ = rank_batches(3, 2, sizes=(7, 6), start=12)
    assert [len(parts[r]) for r in range(3)] == [1, 1, 1] and sum(global_batches(parts), []) == [order[12]] + order[:2]


def test_shard_files_opens_only_the_files_it_reads(tmp_path):
    paths = []
    for k in range(3):
        paths.append(str(tmp_path / f"part-{k}.pt"))
        torch.save([f"f{k}-{i}" for i in range(4)], paths[-1])
    opened = []

    def load(path):
        opened.append(os.path.basename(path))
        return torch.load(path, weights_only=True)

    stream = ShardedStream(ShardFiles(paths, load=load, sizes=[4, 4, 4]), shuffle=False)
    data = prepare_train_data(DataLoader(stream, batch_size=2, collate_fn=list), 1, 0, seed=0)
    data.skip_samples(6)
    assert [x for b in data for x in b] == ["f1-2", "f1-3", "f2-0", "f2-1", "f2-2", "f2-3"]
    assert opened == ["part-1.pt", "part-2.pt"]  # the first file, all consumed, is never opened


def test_loaders_that_cannot_follow_the_order_are_refused():
    stream = ShardedStream(Numbers((4,)))
    with pytest.raises(ValueError, match="needs batch_size"):
        prepare_train_data(DataLoader(stream, batch_size=None), 2, 0, seed=0)
    with pytest.raises(ValueError, match="persistent_workers=False"):
        prepare_train_data(DataLoader(stream, batch_size=2, num_workers=1, persistent_workers=True), 2, 0, seed=0)
    with pytest.raises(ValueError, match="in_order=True"):
        prepare_train_data(DataLoader(stream, batch_size=2, num_workers=1, in_order=False), 2, 0, seed=0)
    with pytest.raises(TypeError, match="ShardedSource"):
        ShardedStream([1, 2, 3])


# -- Hugging Face datasets: its shards are ours ------------------------------------------------------------------
def hugging_face(n=40, shards=4):
    import datasets  # tests only (requirements-dev.txt): built here from numbers, nothing downloaded

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return datasets.Dataset.from_dict({"id": list(range(n))}).to_iterable_dataset(num_shards=shards)


class CountedShards:
    """HuggingFaceShards noting every example streamed out of the data set (in this process)."""

    def __new__(cls, dataset, streamed):
        from tasktrain.data import HuggingFaceShards

        class Counted(HuggingFaceShards):
            def _examples(self, part):
                for example in super()._examples(part):
                    streamed.append(example["id"])
                    yield example

        return Counted(dataset, sizes=[10] * dataset.n_shards)


def hf_batches(world, batch, workers=0, start=0, shuffle=True, streamed=None):
    from tasktrain.data import HuggingFaceShards

    source = HuggingFaceShards(hugging_face()) if streamed is None else CountedShards(hugging_face(), streamed)
    parts = {}
    for rank in range(world):
        loader = DataLoader(ShardedStream(source, shuffle=shuffle), batch_size=batch, num_workers=workers,
                            collate_fn=lambda examples: [e["id"] for e in examples])
        data = prepare_train_data(loader, world, rank, seed=1)
        data.set_epoch(0)
        data.skip_samples(start)
        parts[rank] = list(data)
    return parts


def test_hugging_face_iterable_dataset_is_sharded_over_ranks_and_workers():
    from tasktrain.data import HuggingFaceShards

    assert HuggingFaceShards(hugging_face()).shard_sizes() == [10, 10, 10, 10]  # counted: sizes=None
    one = global_batches(hf_batches(1, 8))
    flat = sum(one, [])
    assert sorted(flat) == list(range(40)) and flat != list(range(40))  # every example once, shuffled
    # 2 ranks x 2 real DataLoader workers: the same global batches (each worker reads its own part of a shard)
    assert global_batches(hf_batches(2, 4, workers=2)) == one
    with pytest.raises(ValueError, match="one per shard"):
        HuggingFaceShards(hugging_face(), sizes=[10, 10])


def test_hugging_face_resume_reads_nothing_consumed():
    """Stopped after 20 of the 40 examples (shuffle=False: as stored), resumed on 2 ranks: the 20 left, and the
    data set streamed out only those (its first two shards are never opened)."""
    streamed = []
    resumed = hf_batches(2, 5, start=20, shuffle=False, streamed=streamed)
    assert sum(global_batches(resumed), []) == list(range(20, 40))
    assert set(streamed) == set(range(20, 40))  # (a rank streams past the other's run in a shard it shares)
    # a start inside a shard streams past its first examples (a stream cannot seek), none of the shards before
    streamed.clear()
    assert sum(global_batches(hf_batches(1, 5, start=25, shuffle=False, streamed=streamed)), []) == list(range(25, 40))
    assert sorted(streamed) == list(range(20, 40))


# -- torchdata's StatefulDataLoader ----------------------------------------------------------------------------------
def test_stateful_dataloader_over_ordered_data_follows_the_global_order():
    """A StatefulDataLoader over a map-style data set or a ShardedStream is read through the global order (its
    own state is not needed: the position resumes on any world size)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    for make, shuffle in ((lambda: list(range(24)), True), (lambda: ShardedStream(Numbers((12, 12))), None)):
        for rank in (0, 1):
            plain = prepare_train_data(DataLoader(make(), batch_size=4, shuffle=shuffle), 2, rank, seed=5)
            stateful = prepare_train_data(StatefulDataLoader(make(), batch_size=4, shuffle=shuffle), 2, rank, seed=5)
            assert stateful.resumes_on_any_world_size
            for data in (plain, stateful):
                data.set_epoch(1)
                data.skip_samples(8)
            assert [b.tolist() for b in stateful] == [b.tolist() for b in plain]


class Counting(torch.utils.data.IterableDataset):
    """An IterableDataset of its own order: worker w of n yields items w, w + n, ... of 0..23, noting each read in
    a file; its state (state_dict/load_state_dict) is the next item, so a restored worker goes on from there."""

    def __init__(self, folder):
        self.folder, self.next = str(folder), None

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        start, self.next = (worker if self.next is None else self.next), None
        for i in range(start, 24, workers):
            self.next = i + workers
            with open(os.path.join(self.folder, f"reads.{os.getpid()}.txt"), "a") as f:
                f.write(f"{i}\n")
            yield torch.tensor([float(i)])

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


def read_ids(folder):
    out = []
    for name in os.listdir(folder):
        if name.startswith("reads."):
            with open(os.path.join(folder, name)) as f:
                out += [int(line) for line in f]
            os.remove(os.path.join(folder, name))
    return out


class Noted(TaskModule):
    def __init__(self):
        super().__init__()
        self.layer, self.seen = torch.nn.Linear(1, 1), []

    def training_step(self, batch, batch_idx):
        self.seen += [int(v) for v in batch.flatten().tolist()]
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(root, max_steps, ckpt_path=None, save_at=None):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tasktrain import Callback, Trainer

    class SaveAt(Callback):  # a checkpoint in the middle of the epoch, as ModelCheckpoint writes one
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == save_at:
                trainer.save_checkpoint(os.path.join(root, "stopped.ckpt"))

    model = Noted()
    trainer = Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False, default_root_dir=str(root),
                      callbacks=[SaveAt()])
    loader = StatefulDataLoader(Counting(root), batch_size=2, num_workers=2)  # no length: a batch read ahead
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return trainer, model


def test_stateful_dataloader_over_its_own_iterable_resumes_from_its_state(tmp_path):
    """The Trainer saves the StatefulDataLoader's state (its 2 workers') after the batches trained on, and a resume
    loads it: the rest of the epoch, nothing trained on read again, each item once."""
    _, first = fit(tmp_path, 3, save_at=3)
    read_ids(tmp_path)
    _, resumed = fit(tmp_path, 12, ckpt_path=str(tmp_path / "stopped.ckpt"))
    assert len(first.seen) == 6 and sorted(first.seen + resumed.seen) == list(range(24))
    assert not set(read_ids(tmp_path)) & set(first.seen)  # the consumed items were not read again
    # the state is one rank's: another number of processes is refused before training
    checkpoint = torch.load(str(tmp_path / "stopped.ckpt"), weights_only=False)
    assert len(checkpoint["loops"]["train_state"]["loader_states"]) == 1
    checkpoint["loops"]["world_size"] = 2
    checkpoint["loops"]["train_state"]["loader_states"] *= 2
    torch.save(checkpoint, str(tmp_path / "other_world.ckpt"))
    with pytest.raises(ValueError, match="on 2 processes, and this run has 1"):
        fit(tmp_path, 12, ckpt_path=str(tmp_path / "other_world.ckpt"))


def test_accelerator_use_stateful_dataloader_saves_the_workers_state(tmp_path, monkeypatch):
    """DataLoaderConfiguration(use_stateful_dataloader=True): a plain DataLoader over an IterableDataset of its own
    is read through a StatefulDataLoader; save_state/load_state resume it without reading the consumed items."""
    from tasktrain import Accelerator, DataLoaderConfiguration

    def run(steps, load=None):
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        loader = accelerator.prepare(DataLoader(Counting(tmp_path), batch_size=2, num_workers=2))
        assert callable(loader.state_dict) and callable(loader.load_state_dict)  # as Accelerate's
        if load is not None:
            accelerator.load_state(load)
        seen = []
        for batch in loader:
            seen += [int(v) for v in batch.flatten().tolist()]
            if steps is not None and len(seen) == 2 * steps:
                accelerator.save_state(str(tmp_path / "state"))
                break
        return seen

    first = run(3)
    read_ids(tmp_path)
    rest = run(None, load=str(tmp_path / "state"))
    assert sorted(first + rest) == list(range(24))
    assert not set(read_ids(tmp_path)) & set(first)
    # one process's state: the same save, as if written by 2 processes, is refused before the loop
    from tasktrain.trainer.accelerator import STATE_FILE

    state = torch.load(str(tmp_path / "state" / STATE_FILE), weights_only=False)
    saved = state["loaders"][0]
    saved["world_size"], saved["loader_states"] = 2, saved["loader_states"] * 2
    os.makedirs(tmp_path / "other_world")
    torch.save(state, str(tmp_path / "other_world" / STATE_FILE))
    with pytest.raises(ValueError, match="on 2 processes, and this run has 1"):
        run(None, load=str(tmp_path / "other_world"))
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)  # not installed
    with pytest.raises(ImportError, match="tasktrain\\[torchdata\\]"):
        Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))


# -- real processes: SIGKILL and resume, 2x2 -> 1x3 and 1x1 -> 2x2 --------------------------------------------------
def launch(root, runs, processes, expect_ok=True, timeout=420):
    """The runs one after the other in `processes` processes: under `tasktrain launch` where an Accelerator runs;
    Trainer runs alone are a plain `python train.py` whose Trainer starts the other processes (devices=N), as a
    user's script does, without the launcher's agent process."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    env.update(OMP_NUM_THREADS="1", TASKTRAIN_CONFIG_DIR=str(root / "no-config"))
    if processes > 1 and all(run["api"] == "trainer" for run in runs):
        runs = [dict(run, devices=processes) for run in runs]
    command = [SCRIPT, "--root", str(root), "--runs", json.dumps(runs)]
    if processes > 1 and any(run["api"] == "accelerator" for run in runs):
        command = ["-m", "tasktrain.cli.main", "launch", "--num_processes", str(processes), *command]
    proc = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == expect_ok, output[-6000:]
    return output


def records(root, name, world):
    """[(epoch, step, rank, ids)] of a run."""
    out = []
    for rank in range(world):
        with open(os.path.join(root, f"{name}.ids.rank{rank}.txt")) as f:
            out += [(r["epoch"], r["step"], rank, r["ids"]) for r in map(json.loads, f)]
    return out


def by_step(recs):
    """{step: sorted ids of the global batch of that optimizer step}."""
    steps = {}
    for _, step, _, ids in recs:
        steps.setdefault(step, []).extend(ids)
    return {s: sorted(ids) for s, ids in steps.items()}


def epoch_ids(recs, epoch):
    return sorted(i for e, _, _, ids in recs for i in ids if e == epoch)


def reads(root, name):
    with open(os.path.join(root, f"{name}.reads.txt")) as f:
        return [i for r in map(json.loads, f) for i in r["ids"]]


def trainer_run(name, data, batch, workers, **extra):
    return {"name": name, "api": "trainer", "data": data, "batch": batch, "workers": workers, **extra}


def accelerator_run(name, data, batch, workers, **extra):
    return {"name": name, "api": "accelerator", "data": data, "batch": batch, "workers": workers, **extra}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    last = lambda name: str(root / name / "last.ckpt")  # noqa: E731  (the checkpoint of the killed step)
    logs = {}
    # one process x 1 worker, killed after step 3: the Trainer on both data sets, the Accelerator on files (each in a
    # process of its own, forked from the launch's before it trains: the kill ends that process, not the launch);
    # then the uninterrupted references
    logs["ref"] = launch(root, [trainer_run("k11_own", "own", 8, 1, kill_at=3, fork=True),
                                trainer_run("k11_files", "files", 8, 1, kill_at=3, fork=True),
                                accelerator_run("ak11_files", "files", 8, 1, kill_at=3, fork=True),
                                trainer_run("ref_own", "own", 8, 1), trainer_run("ref_files", "files", 8, 1)], 1)
    # One launch of 2 processes. First the killed runs of 2 processes x 2 workers, killed after step 3 (rank 1): the
    # Trainer on both data sets, and a StatefulDataLoader over a data set sharding itself (resumed below in the same
    # launch: "rs22"), each in a child forked from each of the launch's processes, a world of its own on its own port
    # (the kill ends the children, not the launch: they were three launches of their own, six more interpreters).
    # Then 45 items over 2 x 4: an uneven end; 1x1 -> 2x2 (Trainer, both; Accelerator, files); the StatefulDataLoader
    # resumed on 2 x 2; the Accelerator on 2x2 saved and killed after step 3 (the launch ends there).
    logs["k22_own"] = logs["k22_files"] = logs["ks22"] = logs["r22"] = launch(root, [
        trainer_run("k22_own", "own", 4, 2, kill_at=3, fork=True, port=free_port()),
        trainer_run("k22_files", "files", 4, 2, kill_at=3, fork=True, port=free_port()),
        trainer_run("ks22_stateful", "stateful", 4, 2, kill_at=3, fork=True, port=free_port()),
        trainer_run("uneven", "own45", 4, 1),
        trainer_run("r22_own", "own", 4, 2, resume=last("k11_own")),
        trainer_run("r22_files", "files", 4, 2, resume=last("k11_files")),
        accelerator_run("ar22_files", "files", 4, 2, resume="ak11_files"),
        accelerator_run("a_uneven", "own45", 4, 1, gather=True),
        trainer_run("rs22_stateful", "stateful", 4, 2, resume=last("ks22_stateful")),
        accelerator_run("ak22_own", "own", 4, 2, kill_at=3)], 2, expect_ok=False, timeout=600)
    # 2x2 -> 1x3 (Trainer, both data sets; Accelerator, own)
    logs["r13"] = logs["ar13"] = launch(root, [trainer_run("r13_own", "own", 8, 3, resume=last("k22_own")),
                                               trainer_run("r13_files", "files", 8, 3, resume=last("k22_files")),
                                               accelerator_run("ar13_own", "own", 8, 3, resume="ak22_own")], 1)
    return root, logs


CASES = [  # (killed run, its world, resumed run, its world, the uninterrupted reference)
    ("k22_own", 2, "r13_own", 1, "ref_own"), ("k22_files", 2, "r13_files", 1, "ref_files"),
    ("k11_own", 1, "r22_own", 2, "ref_own"), ("k11_files", 1, "r22_files", 2, "ref_files"),
    ("ak22_own", 2, "ar13_own", 1, "ref_own"), ("ak11_files", 1, "ar22_files", 2, "ref_files"),
]


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("killed, killed_world, resumed, resumed_world, reference", CASES)
def test_killed_and_resumed_on_other_processes_and_workers(runs, killed, killed_world, resumed, resumed_world,
                                                           reference):
    root, logs = runs
    before = records(root, killed, killed_world)
    after = records(root, resumed, resumed_world)
    assert max(r[1] for r in before) == 3 and min(r[1] for r in after) == 4
    ref = records(root, reference, 1)
    # every item of the interrupted epoch once, and of the next one
    assert epoch_ids(before + after, 0) == list(range(N)) and epoch_ids(after, 1) == list(range(N))
    assert epoch_ids(ref, 0) == list(range(N))
    # the same items make up each optimizer step as in the uninterrupted run (the global batch is kept: 8)
    assert by_step(before + after) == by_step(ref)
    # each rank trained its own part of every step: no item twice in a step
    assert all(len(set(ids)) == len(ids) for ids in by_step(after).values())
    # the resumed run read exactly what was left of epoch 0, then epoch 1: nothing consumed was read again
    assert Counter(reads(root, resumed)) == Counter(
        [i for i in range(N) if i not in epoch_ids(before, 0)] + list(range(N)))


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_a_stateful_dataloader_resumes_each_rank_from_its_saved_state(runs):
    """2 processes x 2 workers, each rank's StatefulDataLoader state in the checkpoint, killed after step 3 and
    resumed on 2 x 2: each item of the epoch once, nothing trained on read again."""
    root, logs = runs
    before, after = records(root, "ks22_stateful", 2), records(root, "rs22_stateful", 2)
    assert max(r[1] for r in before) == 3 and min(r[1] for r in after) == 4
    assert epoch_ids(before + after, 0) == list(range(N)) and epoch_ids(after, 1) == list(range(N))
    assert Counter(reads(root, "rs22_stateful")) == Counter(
        [i for i in range(N) if i not in epoch_ids(before, 0)] + list(range(N)))


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_an_uneven_end_takes_the_same_steps_on_every_rank(runs):
    root, logs = runs
    recs = records(root, "uneven", 2)  # 45 items, 2 processes x 4: 5 full global batches, then 5 items padded to 6
    for epoch in (0, 1):
        steps = [[r[1] for r in recs if r[2] == rank and r[0] == epoch] for rank in (0, 1)]
        assert steps[0] == steps[1] and len(steps[0]) == 6
        last = [r[3] for r in recs if r[0] == epoch and r[1] == steps[0][-1]]
        assert [len(ids) for ids in last] == [3, 3]
        ids = epoch_ids(recs, epoch)
        assert sorted(set(ids)) == list(range(45)) and len(ids) == 46  # one repeated: the epoch's first item
        first = [r[3] for r in recs if r[0] == epoch and r[1] == steps[0][0] and r[2] == 0][0][0]
        assert Counter(ids)[first] == 2


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_gather_for_metrics_drops_the_repeats_of_an_uneven_stream(runs):
    """The Accelerator over the 45 items on 2 processes: the same steps as the Trainer's, and gather_for_metrics
    returns each step's items in the epoch's order, the last step without the repeated one."""
    root, logs = runs
    assert by_step(records(root, "a_uneven", 2)) == by_step(records(root, "uneven", 2))
    with open(os.path.join(root, "a_uneven.ids.rankgathered.txt")) as f:
        gathered = [json.loads(line) for line in f]
    for epoch in (0, 1):
        ids = [i for r in gathered if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(45))
        steps = sorted((r for r in records(root, "a_uneven", 2) if r[0] == epoch), key=lambda r: (r[1], r[2]))
        assert ids == [i for r in steps for i in r[3]][:45]  # rank 0's run, then rank 1's, step by step
