"""The data order in one process: an epoch's global order does not depend on the number of processes, so a resume
can drop the consumed prefix and shard the rest over any number of them (tasktrain/trainer/data.py)."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tasktrain.trainer.data import ResumableSampler, prepare_train_data


def dataset(n):
    return TensorDataset(torch.arange(n))


def shards(n, world, shuffle=True, seed=5, epoch=1, start=0):
    out = []
    for rank in range(world):
        sampler = ResumableSampler(dataset(n), world, rank, shuffle, seed)
        sampler.set_epoch(epoch)
        sampler.skip_samples(start)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize("n, world, shuffle", [(40, 1, True), (40, 2, True), (41, 3, True), (7, 4, False),
                                               (2, 3, True)])
def test_without_a_start_it_is_torchs_distributed_sampler(n, world, shuffle):
    for rank, got in enumerate(shards(n, world, shuffle)):
        expected = DistributedSampler(dataset(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=5)
        expected.set_epoch(1)
        assert got == list(expected)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_k_batches_on_any_world_consume_a_prefix_of_one_global_order(world):
    n, batch = 48, 4
    order = ResumableSampler(dataset(n), 1, 0, True, 5)
    order.set_epoch(1)
    order = order.global_order()
    per_rank = shards(n, world)
    for k in range(1, n // (batch * world) + 1):
        seen = sorted(i for rank in per_rank for i in rank[:k * batch])
        assert seen == sorted(order[:k * batch * world])


@pytest.mark.parametrize("saved_world, world", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 4)])
def test_a_resume_on_another_world_trains_every_remaining_sample_once(saved_world, world):
    n, batch, k = 48, 4, 2
    consumed = k * batch * saved_world
    first = sorted(i for rank in shards(n, saved_world) for i in rank[:k * batch])
    rest = [i for rank in shards(n, world, start=consumed) for i in rank]
    padding = -(n - consumed) % world  # 2 -> 3: 32 left over 3 ranks, one repeat (of the epoch's first sample)
    assert len(rest) == len(set(rest)) == n - consumed + padding
    repeats = set(rest) & set(first)
    assert len(repeats) == padding and sorted(first + sorted(set(rest) - repeats)) == list(range(n))


def test_a_resume_on_the_same_world_continues_each_rank_exactly_padding_included():
    n, world, batch, k = 43, 3, 2, 4  # 43 = 3 x 15 - 2: two repeats at the end of the epoch
    full = shards(n, world)
    resumed = shards(n, world, start=k * batch * world)
    for rank in range(world):
        assert resumed[rank] == full[rank][k * batch:]


def test_the_rest_is_padded_with_the_first_samples_of_the_epoch():
    n, start = 10, 3  # 7 left over 2 ranks: one repeat, the epoch's first sample
    sampler = ResumableSampler(dataset(n), 2, 0, True, 5)
    sampler.set_epoch(1)
    order = sampler.global_order()
    got = [i for rank in shards(n, 2, start=start) for i in rank]
    assert sorted(got) == sorted(order[start:] + order[:1])
    sampler.skip_samples(start)
    list(sampler)
    assert (sampler.iteration_start, sampler.iteration_samples, sampler.iteration_padding) == (3, 4, 1)
    assert len(sampler) == 5  # an epoch's shard; the skip is for one iteration only
    assert list(sampler) == shards(n, 2)[0]


@pytest.mark.parametrize("drop_last", [False, True])
def test_train_data_counts_the_batches_of_a_resumed_epoch(drop_last):
    loader = DataLoader(dataset(50), batch_size=4, shuffle=True, drop_last=drop_last)
    data = prepare_train_data(loader, world_size=2, rank=1, seed=3)
    assert data.resumes_on_any_world_size and data.num_samples == 50 and data.samples_per_batch(2) == 8
    data.set_epoch(0)
    data.skip_samples(18)  # 32 left: 16 per rank, 4 batches
    assert data.batches_from(18) == 4 == len(list(data))
    data.skip_samples(20)  # 30 left: 15 per rank: 3 full batches and one of 3 (dropped with drop_last)
    assert data.batches_from(20) == (3 if drop_last else 4) == len(list(data))


def test_a_users_sampler_cannot_skip_by_samples():
    loader = DataLoader(dataset(8), batch_size=2, sampler=DistributedSampler(dataset(8), num_replicas=1, rank=0))
    data = prepare_train_data(loader, world_size=1, rank=0, seed=0)
    assert not data.resumes_on_any_world_size and data.num_samples is None and data.batches_from(2) is None
    with pytest.raises(ValueError, match="order the Trainer builds"):
        data.skip_samples(2)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_batch_sampler_passed_as_batch_sampler_is_sharded_as_batch_size_is(shuffle):
    """DataLoader(batch_sampler=BatchSampler(sampler, 3, drop_last)) holds a default SequentialSampler as
    loader.sampler: the order is the batch sampler's own sampler, and its batch size and drop_last are kept."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    for drop_last in (False, True):
        data = dataset(11)
        inner = RandomSampler(data) if shuffle else SequentialSampler(data)
        given = DataLoader(data, batch_sampler=BatchSampler(inner, 3, drop_last))
        plain = DataLoader(data, batch_size=3, shuffle=shuffle, drop_last=drop_last)
        for rank in range(2):
            ours = prepare_train_data(given, world_size=2, rank=rank, seed=4)
            theirs = prepare_train_data(plain, world_size=2, rank=rank, seed=4)
            assert ours.sampler is not None and ours.loader.batch_size == 3
            assert [b[0].tolist() for b in ours.loader] == [b[0].tolist() for b in theirs.loader], (rank, drop_last)


def test_a_custom_sampler_inside_a_batch_sampler_is_kept_with_the_warning():
    from torch.utils.data import BatchSampler

    data = dataset(8)
    given = DataLoader(data, batch_sampler=BatchSampler(list(reversed(range(8))), 4, False))
    with pytest.warns(UserWarning, match="cannot shard it"):
        kept = prepare_train_data(given, world_size=2, rank=0, seed=0)
    assert kept.loader is given and [b[0].tolist() for b in kept.loader] == [[7, 6, 5, 4], [3, 2, 1, 0]]


def test_the_trainers_rule_for_a_users_order_under_a_distributed_strategy():
    """lightning=True (the Trainer's): a custom batch sampler is built again around DistributedSampler(dataset,
    shuffle=True, seed) (its own sampler discarded, as Lightning's), one it cannot build is Lightning's TypeError, a
    sampler without a length too; a plain BatchSampler(custom sampler) reads DistributedSampler(dataset)'s order in its
    batches (Lightning would lose the batching there: batch_size=None)."""
    from torch.utils.data import BatchSampler

    class Mine(BatchSampler):
        pass

    class NoSize:  # a batch sampler that is not torch's: no batch_size/drop_last to build it again with
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            return iter(self.batches)

        def __len__(self):
            return len(self.batches)

    class Endless(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(range(8))

    data = dataset(8)
    for rank in (0, 1):
        expected = list(DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=5))
        backwards = list(reversed(range(8)))
        for batch_sampler in (Mine(backwards, 2, False), BatchSampler(backwards, 2, False)):
            made = prepare_train_data(DataLoader(data, batch_sampler=batch_sampler), 2, rank, 5, shuffle=True,
                                      keeps_sampler=False, lightning=True)
            assert type(made.loader.batch_sampler) is type(batch_sampler)
            assert [b[0].tolist() for b in made.loader] == [expected[:2], expected[2:]]
    with pytest.raises(TypeError, match="can't inject a \\(distributed\\) sampler into your batch sampler"):
        prepare_train_data(DataLoader(data, batch_sampler=NoSize([[0, 1]])), 2, 0, 5, shuffle=True,
                           keeps_sampler=False, lightning=True)
    with pytest.raises(TypeError, match="does not provide `__len__`"):
        prepare_train_data(DataLoader(data, batch_size=2, sampler=Endless()), 2, 0, 5, shuffle=True,
                           keeps_sampler=False, lightning=True)
    # one process: the loader is the user's, untouched
    given = DataLoader(data, batch_sampler=NoSize([[0, 1]]))
    assert prepare_train_data(given, 1, 0, 5, keeps_sampler=True, lightning=True).loader is given


def test_a_predict_loader_drops_no_last_batch():
    """Lightning builds every predict loader's batch sampler again with drop_last=False (on one process too)."""
    from tasktrain.trainer.data import prepare_eval_loader

    data = dataset(5)
    for world, rank in ((1, 0), (2, 1)):
        made = prepare_eval_loader(DataLoader(data, batch_size=2, drop_last=True), world, rank, "predict")
        assert [i for b in made for i in b[0].tolist()] == list(range(rank, 5, world))


@pytest.mark.parametrize("workers, generator", [(0, False), (2, False), (0, True)])
def test_a_dataloader_subclass_resumed_mid_epoch_continues_its_order(tmp_path, workers, generator):
    """A shuffling DataLoader subclass is kept as it is on one process (Lightning's rule), so its RandomSampler
    draws each epoch's order (from torch's global generator, or the loader's own): a fit resumed inside an epoch drew
    that order again from the restored generator and went on over another permutation. The checkpoint now keeps the
    generators' states the pass drew from, and the resumed pass draws from them: the rest of the interrupted run's
    batches, in both epochs, and the same draws in training_step (the global generator as restored after it)."""
    import warnings

    import tasktrain

    class Loader(DataLoader):
        pass

    def fit(ckpt_path=None):
        tasktrain.seed_everything(4, verbose=False)
        seen = []

        class Module(tasktrain.TaskModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(1, 1)

            def training_step(self, batch, batch_idx):
                seen.append([self.current_epoch, batch_idx, batch[0].tolist(), float(torch.rand(()))])
                return self.layer(batch[0].float()[:, None]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        saver = tasktrain.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1,
                                                    filename="{step}")
        trainer = tasktrain.Trainer(max_epochs=2, logger=False, callbacks=[saver] if ckpt_path is None else [],
                                    enable_checkpointing=ckpt_path is None, enable_progress_bar=False,
                                    enable_model_summary=False)
        own = dict(generator=torch.Generator().manual_seed(9)) if generator else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(), Loader(dataset(16), batch_size=2, shuffle=True, num_workers=workers, **own),
                        ckpt_path=ckpt_path)
        return seen

    whole = fit()
    resumed = fit(str(tmp_path / "step=3.ckpt"))
    assert len(whole) == 16 and sorted(i for _, _, batch, _ in whole[:8] for i in batch) == list(range(16))
    assert resumed == whole[3:]


def test_a_callback_that_iterates_the_training_loader_leaves_a_resumed_epoch_exact(tmp_path):
    """Under a distributed strategy (one process of ddp) trainer.train_dataloader is the loader the loop reads (the
    Trainer's order: a ResumableSampler). A callback that draws a batch from it at on_train_start of a fit resumed
    inside an epoch took the resume's start (the sampler's next iteration), and the loop then read the epoch again
    from its first batch; every iteration during the loop's pass now starts where the pass does."""
    import warnings

    import tasktrain
    from tasktrain.demos import boring_classes

    def fit(seen, stop_at=None, ckpt_path=None, peek=False):
        class Model(boring_classes.BoringModel):
            def training_step(self, batch, batch_idx):
                seen.append(batch[:, 0].tolist())
                return super().training_step(batch, batch_idx)

        class Stop(tasktrain.Callback):
            def on_train_batch_end(self, trainer, *args):
                trainer.should_stop = trainer.should_stop or trainer.global_step == stop_at

        class Peek(tasktrain.Callback):
            def on_train_start(self, trainer, module):
                self.batch = next(iter(trainer.train_dataloader))

        peeking = Peek()
        callbacks = ([Stop(), tasktrain.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0,
                                                                  every_n_train_steps=stop_at)] if stop_at else [])
        tasktrain.seed_everything(3, verbose=False)
        trainer = tasktrain.Trainer(strategy="ddp", devices=1, accelerator="cpu", max_epochs=2, logger=False,
                                    enable_checkpointing=bool(stop_at), enable_progress_bar=False,
                                    enable_model_summary=False, callbacks=callbacks + ([peeking] if peek else []))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Model(), DataLoader(torch.arange(10.).unsqueeze(1).repeat(1, 32), batch_size=2,
                                            shuffle=True), ckpt_path=ckpt_path)
        return getattr(peeking, "batch", None)

    whole, first, rest = [], [], []
    fit(whole)
    fit(first, stop_at=2)
    peeked = fit(rest, ckpt_path=str(tmp_path / "last.ckpt"), peek=True)
    assert first + rest == whole and len(whole) == 10
    assert peeked[:, 0].tolist() == whole[2]  # (the callback's batch: where the resumed pass starts)
