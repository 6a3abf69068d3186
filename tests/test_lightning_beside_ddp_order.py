"""The training data order under DDP beside Lightning 2.6 (issue 37): with use_distributed_sampler (the default) a
distributed strategy's training sampler shuffles even a sequential loader (Lightning's DistributedSampler(shuffle=
True, seed=PL_GLOBAL_SEED or 0)), except with overfit_batches; one torchrun launch of 2 processes runs the same fits
under both and compares each rank's batches over 2 epochs and the weights after; a fit resumed mid-epoch continues
that order exactly. The same launch runs loaders of the user's own order (a custom sampler with set_epoch, a custom
batch sampler, RandomSampler(replacement=True, num_samples)) for training, validation and prediction: each rank's
indices, the weights and the set_epoch calls the user's samplers got are Lightning's (DistributedSamplerWrapper,
DistributedSampler over the dataset, UnrepeatedDistributedSamplerWrapper); tests/test_lightning_beside_samplers.py
has the one-process cases. Last, SIGTERM to both ranks at the same batch (issue 37): the same hooks and the same
SIGTERMException after that batch under both, and ModelCheckpoint(save_on_exception=True)'s file. Two training
loaders in a dict are each sharded and combined as Lightning's, and resume mid-epoch exactly; validate over a
CombinedLoader(mode="max_size_cycle") reads Lightning's batches, synced metric and results, with its
`DistributedSampler` warning on rank 0; a StatefulDataLoader with a custom sampler is sharded as a DataLoader (its
class kept) and resumes mid-epoch exactly, a StatefulDataLoader(shuffle=True) reads Lightning's wrapped order (its
torchdata RandomSampler in DistributedSamplerWrapper) and resumes exactly in its second epoch, as does a DataLoader
subclass of the user's built in the hooks with an
argument of its own (built again as its class around the sampler, as Lightning builds it)."""
import json
import os

import pytest
import torch
from torch.utils.data import DistributedSampler

pytest.importorskip("lightning.pytorch")

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One torchrun launch of 2 processes (ddp_scripts/beside_lightning_ddp.py) runs the 2-process scripts of three
    beside-Lightning tests in turn in one process group: seeds_beside_lightning.py, loggers_beside_lightning.py, then
    order_beside_lightning.py (each was a launch of its own: 2 launches and 4 interpreters fewer). Returns
    {script name: [rank 0's record, rank 1's]}. The tests of the first two were in test_lightning_beside_seeds.py and
    test_lightning_beside_loggers.py, with the one-process tests of theirs; they are here to read this launch."""
    from ddp_scripts.common import run, torchrun

    out = tmp_path_factory.mktemp("beside_ddp")
    code, stdout, stderr, _ = run(torchrun("--standalone", "--nproc_per_node", "2",
                                           os.path.join(HERE, "ddp_scripts", "beside_lightning_ddp.py"),
                                           str(out)), 400, str(out), env={"PYTHONPATH": os.pathsep.join(
                                               [os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])})
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    return {name: [json.load(open(out / name / f"rank{r}.json")) for r in (0, 1)]
            for name in ("seeds", "loggers", "saves", "order")}


@pytest.mark.world_size(2)
@pytest.mark.timeout(500)
def test_dataloader_workers_on_two_processes_draw_lightnings_numbers(launched):
    """(tests/test_lightning_beside_seeds.py's, on 2 processes) DDP on 2 processes, seed_everything(workers=True): each
    rank's workers draw what they draw under Lightning, whose distributed strategies seed again (reset_seed) as they
    set up the processes; so does the main process in each step."""
    ranks = launched["seeds"]
    for seen in ranks:
        assert len(seen["tasktrain"]) == 4 and seen["tasktrain"] == seen["lightning"]
    # the two ranks' workers (their worker_init_function mixes in the rank) draw apart
    assert ranks[0]["tasktrain"][0][0][1:] != ranks[1]["tasktrain"][0][0][1:]


@pytest.mark.world_size(2)
@pytest.mark.timeout(500)
def test_loggers_are_called_on_every_rank_as_in_lightning(launched):
    """(tests/test_lightning_beside_loggers.py's, on 2 processes) Lightning's fit, then tasktrain's in the same group;
    each rank records the calls its logger got."""
    ranks = launched["loggers"]
    for seen in ranks:
        assert seen["tasktrain"] == seen["lightning"]
    # every method on both ranks, after_save_checkpoint on rank 0 only (ModelCheckpoint's rule in both)
    names = [{c[0] for c in seen["tasktrain"]} for seen in ranks]
    assert names[0] == {"log_hyperparams", "log_graph", "save", "log_metrics", "after_save_checkpoint", "finalize"}
    assert names[1] == names[0] - {"after_save_checkpoint"}


@pytest.mark.world_size(2)
@pytest.mark.timeout(500)
def test_model_checkpoint_calls_torch_save_once_per_checkpoint_as_lightning(launched):
    """(found by the yardstick: Lightning's test_model_checkpoint_no_extraneous_invocations) a monitored
    ModelCheckpoint on 2 processes: rank 0 calls torch.save once per checkpoint and rank 1 never, as under Lightning;
    rank 0's score went to the other ranks as a tensor in the broadcast's pickle, one more torch.save per save."""
    ranks = launched["saves"]
    for seen in ranks:
        assert seen["tasktrain"] == seen["lightning"]
    assert ranks[0]["tasktrain"]["saves"] == len(ranks[0]["tasktrain"]["files"]) == 3
    assert ranks[1]["tasktrain"]["saves"] == 0


@pytest.mark.world_size(2)
@pytest.mark.timeout(500)
def test_a_sequential_loader_under_ddp_reads_lightnings_order(launched):
    ranks = launched["order"]
    for rank, seen in enumerate(ranks):
        # a validation step value logged with sync_dist is reduced across the ranks at each batch, as Lightning's:
        # rank 0 sums 0+2 then 4+6, rank 1 1+3 then 5+7; each rank's logger writes their mean
        assert seen["tasktrain validate steps"] == seen["lightning validate steps"] == [[0, 3.0], [1, 11.0]]
        # 9 samples: tasktrain's unpadded shard gives rank 0 a third batch ([8]) that rank 1 has not (Lightning
        # pads rank 1's with sample 0, #5060), so the ranks do not meet at each batch: each writes its own values
        assert seen["tasktrain validate steps uneven"] == [[[0, 2.0], [1, 10.0], [2, 8.0]], [[0, 4.0], [1, 12.0]]][rank]
    for seen in ranks:  # SIGTERM to both ranks at batch 2: both raise after that batch (no on_train_end) and save
        assert seen["sigterm"]["tasktrain"] == seen["sigterm"]["lightning"] == [
            ["on_train_batch_end", 0, False], ["on_train_batch_end", 1, False], ["on_train_batch_end", 2, False],
            ["on_exception", "SIGTERMException", 3, True], "SIGTERMException",
            ["after", True, True, ["epoch=0-step=3.ckpt"]]]
    for seen in ranks:
        # a fit resumed from its step-3 checkpoint (the middle of epoch 0) continues the shuffled order exactly
        whole, resumed = seen["resume"]["whole"], seen["resume"]["resumed"]
        assert whole["batches"] == seen["tasktrain"]["no seed"]["batches"]
        assert resumed["batches"] == whole["batches"][3:] and resumed["weights"] == whole["weights"]
        assert seen["tasktrain"].keys() == seen["lightning"].keys() == {
            "no seed", "seed 7", "overfit", "custom sampler", "custom batch sampler", "replacement", "combined",
            "stateful custom sampler", "subclass", "stateful shuffle"}
        whole, resumed = seen["resume combined"]["whole"], seen["resume combined"]["resumed"]
        assert whole["batches"] == seen["tasktrain"]["combined"]["batches"]
        assert resumed["batches"] == whole["batches"][5:] and resumed["weights"] == whole["weights"]
        for case, mine in seen["tasktrain"].items():
            theirs = seen["lightning"][case]
            assert mine.keys() == theirs.keys(), case
            for key in mine:  # batches, weights; val, predict, set_epoch for the loaders of the user's order
                assert mine[key] == theirs[key], (case, key)
        # the custom sampler's fit resumed from step 3 reads and drops 3 batches: the rest of the epoch exactly
        whole, resumed = seen["resume custom"]["whole"], seen["resume custom"]["resumed"]
        assert whole["batches"] == seen["tasktrain"]["custom sampler"]["batches"]
        assert resumed["batches"] == whole["batches"][3:] and resumed["weights"] == whole["weights"]
        assert resumed["set_epoch"]["train"] == [0, 1]
        # a StatefulDataLoader with a custom sampler: rebuilt as one, its batches drawn from a DistributedSamplerWrapper
        # (sharded as the plain DataLoader), and resumed from its state exactly
        assert seen["tasktrain"]["stateful custom sampler"]["loader"] == ["StatefulDataLoader",
                                                                         "DistributedSamplerWrapper"]
        assert seen["tasktrain"]["stateful custom sampler"]["batches"] == seen["tasktrain"]["custom sampler"]["batches"]
        # a DataLoader subclass built in the hooks, with an argument it keeps no attribute of: built again as its
        # class around the DistributedSampler (Lightning's too: compared above), and resumed exactly
        assert seen["tasktrain"]["subclass"]["loader"] == ["TaggedLoader", "tagged train", True]
        assert len(seen["tasktrain"]["subclass"]["predict"]) == 4  # (11 of the 22 samples a rank, in 3s)
        whole, resumed = seen["resume subclass"]["whole"], seen["resume subclass"]["resumed"]
        assert whole["batches"] == seen["tasktrain"]["subclass"]["batches"]
        assert resumed["batches"] == whole["batches"][3:] and resumed["weights"] == whole["weights"]
        whole, resumed = seen["resume stateful"]["whole"], seen["resume stateful"]["resumed"]
        assert whole["batches"] == seen["tasktrain"]["stateful custom sampler"]["batches"]
        assert resumed["batches"] == whole["batches"][3:] and resumed["weights"] == whole["weights"]
        # a StatefulDataLoader(shuffle=True): Lightning's order (compared above: its DistributedSamplerWrapper around
        # the torchdata RandomSampler), resumed in epoch 1 exactly (the sampler's draws kept in the checkpoint)
        whole, resumed = seen["resume stateful shuffle"]["whole"], seen["resume stateful shuffle"]["resumed"]
        assert whole["batches"] == seen["tasktrain"]["stateful shuffle"]["batches"]
        assert resumed["batches"] == whole["batches"][9:] and resumed["weights"] == whole["weights"]
    # what Lightning reads is torch's DistributedSampler(shuffle=True, seed): the seed's permutation per epoch,
    # sharded rank::2, in batches of 2 (22 samples: 11 a rank, 6 batches); overfit_batches: in order, 2 batches
    for rank, seen in enumerate(ranks):
        for case, seed in (("no seed", 0), ("seed 7", 7)):
            sampler = DistributedSampler(range(22), num_replicas=2, rank=rank, shuffle=True, seed=seed)
            expected = []
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                order = list(sampler)
                expected += [[epoch, b, order[2 * b:2 * b + 2]] for b in range(6)]
            assert seen["tasktrain"][case]["batches"] == expected, case
        assert seen["tasktrain"]["overfit"]["batches"] == [[e, b, [4 * b + rank, 4 * b + 2 + rank]]
                                                          for e in (0, 1) for b in (0, 1)]
    # the user's orders are sharded: the ranks read disjoint parts of each epoch, together all of it (22 samples of
    # the sampler's permutation; the custom batch sampler's DistributedSampler; the replacing sampler's dataset),
    # and the user's sampler got set_epoch(epoch) once an epoch (the batch sampler's was replaced: never)
    for case in ("custom sampler", "custom batch sampler", "replacement", "stateful custom sampler",
                 "stateful shuffle"):
        for epoch in (0, 1):
            parts = [[i for e, _, batch in seen["tasktrain"][case]["batches"] if e == epoch for i in batch]
                     for seen in ranks]
            assert not set(parts[0]) & set(parts[1]) and sorted(parts[0] + parts[1]) == list(range(22)), case
    assert ranks[0]["tasktrain"]["custom sampler"]["set_epoch"]["train"] == [0, 1]
    assert ranks[0]["tasktrain"]["custom batch sampler"]["set_epoch"]["train"] == []
    # prediction: each of the sampler's 7 samples once over the ranks, unpadded (4 and 3)
    predicted = [[i for _, batch in seen["tasktrain"]["custom sampler"]["predict"] for i in batch] for seen in ranks]
    assert sorted(predicted[0] + predicted[1]) == sorted(set(predicted[0] + predicted[1])) and len(predicted[0]) == 4
    assert len(predicted[0] + predicted[1]) == 7
    # two loaders in a dict (max_size_cycle): each sharded with its own DistributedSampler, the 7 samples of b
    # padded to 8 (4 a rank, 1 a batch) and cycled over a's 6 batches
    for rank, seen in enumerate(ranks):
        assert seen["tasktrain"]["combined"]["samplers"] == seen["lightning"]["combined"]["samplers"] == \
            {"a": True, "b": True}
        batches = seen["tasktrain"]["combined"]["batches"]
        assert len(batches) == 12 and [len(b[2]["b"]) for b in batches] == [1] * 12
        sampler = DistributedSampler(range(7), num_replicas=2, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(0)
        assert [b[2]["b"][0] - 100 for b in batches[:6]] == (list(sampler) * 2)[:6]
    assert ranks[0]["tasktrain"]["combined"]["batches"] != ranks[1]["tasktrain"]["combined"]["batches"]
    # validate over a CombinedLoader(mode="max_size_cycle"): each loader sharded, read together (y's 2 batches
    # cycled over x's 6), no dataloader_idx, the metric synced over the ranks: Lightning's, and its warning on rank 0
    # for each loader it shards
    for rank, seen in enumerate(ranks):
        mine, theirs = seen["tasktrain validate combined"], seen["lightning validate combined"]
        assert mine == theirs
        assert [row[:2] for row in mine["rows"]] == [[b, 0] for b in range(6)]
        shard = list(range(rank, 22, 2))
        assert [row[2]["x"] for row in mine["rows"]] == [shard[2 * b:2 * b + 2] for b in range(6)]
        assert [row[2]["y"] for row in mine["rows"]][2:4] == [row[2]["y"] for row in mine["rows"]][:2]
        assert len(mine["warnings"]) == (2 if rank == 0 else 0)
    total = sum(i for seen in ranks for row in seen["tasktrain validate combined"]["rows"] for v in row[2].values()
                for i in v)
    assert ranks[0]["tasktrain validate combined"]["results"] == [{"seen": float(total)}]
    # the two seeds read different orders; both ranks end on the same weights
    assert ranks[0]["tasktrain"]["no seed"]["batches"] != ranks[0]["tasktrain"]["seed 7"]["batches"]
    for case in ("no seed", "seed 7", "overfit", "combined"):
        assert ranks[0]["tasktrain"][case]["weights"] == ranks[1]["tasktrain"][case]["weights"]
    assert torch.tensor(ranks[0]["tasktrain"]["no seed"]["weights"]).abs().sum() > 0
