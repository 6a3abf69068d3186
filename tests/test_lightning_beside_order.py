"""A shuffling loader's order on one process, beside Lightning (issue 37): Lightning keeps the user's RandomSampler
there, which draws each epoch's permutation from a seed it takes from torch's global generator (or from its own
generator, which it advances). The same seed and script give the same batches, weights, generator states and later
draws under the Trainer; a fit resumed in the middle of an epoch continues the same order exactly."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402
from tasktrain.trainer.data import draw_loader_seed, prepare_train_data  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _generator(seed=123):
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def _loaders(classes, case, generator):
    """(train loader, val loader or None) of a case; built inside the hooks, so that a reload builds them again."""
    data = classes.RandomDataset(32, 30)  # 8 batches of 4, the last one short: the sampler is read to its end
    val = None
    if case == "plain":
        train = DataLoader(data, batch_size=4, shuffle=True)
    elif case == "sampler-generator":  # the sampler's own generator; the loader's base seed from the global one
        train = DataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=generator))
    elif case == "drop-last-limited":
        train = DataLoader(data, batch_size=4, shuffle=True, drop_last=True, generator=generator)
    else:  # "generator", "reload"
        train = DataLoader(data, batch_size=4, shuffle=True, generator=generator)
    if case == "val-shuffled":  # Lightning keeps it shuffling (with its warning), its generator moving
        train = DataLoader(data, batch_size=4, shuffle=True)
        val = DataLoader(classes.RandomDataset(32, 16), batch_size=4, shuffle=True, generator=generator)
    return train, val


def _fit(lib, classes, case, tmp_path=None, stop_at=None, ckpt_path=None, views=None):
    """One fit of `case`: (weights, torch.rand(1) after fit, the batches trained on, the user's generator's state).
    `views`: a list that a callback fills with what trainer.train_dataloader is at on_train_start, at each
    on_train_epoch_start (where it also draws a batch from it, as a callback that shows a sample does) and at the
    first on_train_batch_start (the loader given, its sampler's class, its length, its dataset)."""
    lib.seed_everything(7, verbose=False)
    generator, seen, given = _generator(), [], []

    class Recording(classes.BoringModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch.detach().clone())
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            given.append(_loaders(classes, case, generator)[0])
            return given[-1]

        def val_dataloader(self):
            return _loaders(classes, case, generator)[1] or super().val_dataloader()

    class Stop(lib.Callback):
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.should_stop or trainer.global_step == stop_at

    class Peek(lib.Callback):
        def view(self, trainer, where):
            loader = trainer.train_dataloader
            views.append((where, loader is given[-1], type(loader.sampler).__name__, len(loader),
                          loader.dataset is given[-1].dataset))

        def on_train_start(self, trainer, module):
            self.view(trainer, "on_train_start")

        def on_train_epoch_start(self, trainer, module):
            self.view(trainer, "on_train_epoch_start")
            views.append(next(iter(trainer.train_dataloader)).detach().clone())  # (its draws: the loader given's)

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == 0:
                self.view(trainer, "on_train_batch_start")

    args = dict(max_epochs=2, **QUIET)
    if case == "drop-last-limited":
        args["limit_train_batches"] = 5
    if case == "reload":
        args["reload_dataloaders_every_n_epochs"] = 1
    if stop_at:
        save = lib.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=stop_at,
                                             save_top_k=0)
        args.update(enable_checkpointing=True, callbacks=[save, Stop()])
    if views is not None:
        args["callbacks"] = args.get("callbacks", []) + [Peek()]
    model = Recording()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.Trainer(**args).fit(model, ckpt_path=ckpt_path)
    return model.layer.weight.detach().clone(), torch.rand(1), seen, generator.get_state()


CASES = ["plain", "generator", "sampler-generator", "drop-last-limited", "reload", "val-shuffled"]


@pytest.mark.parametrize("case", CASES)
def test_a_shuffling_loader_trains_lightnings_batches_on_one_process(case):
    weights, after, seen, generator = _fit(tasktrain, ours, case)
    their_weights, their_after, their_seen, their_generator = _fit(pl, theirs, case)
    assert len(seen) == len(their_seen)
    for i, (a, b) in enumerate(zip(seen, their_seen)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"batch {i}")
    torch.testing.assert_close(weights, their_weights, rtol=0, atol=0)
    torch.testing.assert_close(after, their_after, rtol=0, atol=0)
    assert torch.equal(generator, their_generator), "the user's generator stands elsewhere than under Lightning"


@pytest.mark.parametrize("case,stop_at", [("plain", 3), ("generator", 13)])
def test_a_fit_resumed_mid_epoch_continues_the_drawn_order(tmp_path, case, stop_at):
    """Stopped inside an epoch (step 3: the first; 13: the second), saved, and resumed in a new Trainer with a new
    generator of the same seed: the rest of the epoch is the drawn permutation's rest, and the fit ends on the
    uninterrupted one's weights, generator state and later draws."""
    weights, after, seen, generator = _fit(tasktrain, ours, case)
    _, _, first, _ = _fit(tasktrain, ours, case, tmp_path, stop_at=stop_at)
    resumed, resumed_after, rest, resumed_generator = _fit(tasktrain, ours, case,
                                                           ckpt_path=str(tmp_path / "last.ckpt"))
    assert len(first) == stop_at and len(first) + len(rest) == len(seen)
    for i, (a, b) in enumerate(zip(first + rest, seen)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"batch {i}")
    torch.testing.assert_close(resumed, weights, rtol=0, atol=0)
    torch.testing.assert_close(resumed_after, after, rtol=0, atol=0)
    assert torch.equal(resumed_generator, generator)


def _same(mine, theirs):
    assert len(mine) == len(theirs)
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"item {i}")
        else:
            assert a == b, i


@pytest.mark.parametrize("case", ["plain", "sampler-generator"])
def test_the_training_loader_a_callback_reads_is_the_one_given_as_under_lightning(case):
    """On one process Lightning trains on the loader given, so trainer.train_dataloader is that object (its
    RandomSampler, its length, its dataset), and a callback that draws a batch from it at each epoch's start moves
    the generators that loader draws from. The Trainer reads a loader it built again on its own order (for an exact
    resume), which trainer.train_dataloader showed before: another object, a ResumableSampler, and a callback's batch
    drawn from the Trainer's generator, not torch's, so the epochs after read other batches than Lightning's."""
    mine_views, their_views = [], []
    weights, after, seen, generator = _fit(tasktrain, ours, case, views=mine_views)
    their_weights, their_after, their_seen, their_generator = _fit(pl, theirs, case, views=their_views)
    _same(mine_views, their_views)
    assert ("on_train_start", True, "RandomSampler", 8, True) in mine_views
    assert len(mine_views) == 7  # (on_train_start, then each epoch's start (a view, a batch) and its first batch)
    _same(seen, their_seen)
    torch.testing.assert_close(weights, their_weights, rtol=0, atol=0)
    torch.testing.assert_close(after, their_after, rtol=0, atol=0)
    assert torch.equal(generator, their_generator)


def test_a_fit_resumed_mid_epoch_beside_a_callback_that_reads_the_loader_given_is_exact(tmp_path):
    """The callback above (it draws a batch from trainer.train_dataloader at each epoch's start) beside a fit stopped
    at step 3 and resumed: the loader it reads is the one given, so its draws do not disturb the Trainer's rebuilt
    loader, whose skip resumes the epoch: the same batches, weights and later draws as the uninterrupted fit."""
    views = []
    weights, after, seen, _ = _fit(tasktrain, ours, "plain", views=views)
    _, _, first, _ = _fit(tasktrain, ours, "plain", tmp_path, stop_at=3, views=[])
    resumed_views = []
    resumed, resumed_after, rest, _ = _fit(tasktrain, ours, "plain", ckpt_path=str(tmp_path / "last.ckpt"),
                                           views=resumed_views)
    assert len(first) == 3 and len(first) + len(rest) == len(seen)
    _same(first + rest, seen)
    torch.testing.assert_close(resumed, weights, rtol=0, atol=0)
    torch.testing.assert_close(resumed_after, after, rtol=0, atol=0)
    # the resumed fit: no on_train_epoch_start for the epoch it goes on with (from its batch 3), then epoch 1's
    assert [v[:2] for v in resumed_views if isinstance(v, tuple)] == [
        ("on_train_start", True), ("on_train_epoch_start", True), ("on_train_batch_start", True)]
    _same(resumed_views[-2:], views[-2:])


@pytest.mark.parametrize("world", [2, 3])
def test_a_drawn_epoch_resumed_on_another_world_size_trains_its_rest_then_follows_that_worlds_order(world):
    """One process draws the epoch's permutation (Lightning's RandomSampler); a checkpoint of it resumed on `world`
    processes shards the rest of that permutation (every remaining sample once, padded as DistributedSampler pads),
    and the next epoch is DistributedSampler's (seed, epoch) order, Lightning's under DDP."""
    dataset = ours.RandomDataset(1, 22)
    loader = DataLoader(dataset, batch_size=2, shuffle=True)
    torch.manual_seed(3)
    one = prepare_train_data(loader, 1, 0, seed=5)
    one.set_epoch(0)
    draw_loader_seed(one)
    order = list(one.sampler)
    saved = one.drawn_order()
    assert sorted(order) == list(range(22)) and saved is not None

    consumed = 6
    ranks = [prepare_train_data(loader, world, rank, seed=5) for rank in range(world)]
    rest = []
    for data in ranks:
        data.load_drawn_order(saved)
        data.set_epoch(0)
        data.skip_samples(consumed)
        rest.append(list(data.sampler))
    left = order[consumed:]
    padded = left + order[:-len(left) % world]
    assert [padded[r::world] for r in range(world)] == rest

    for rank, data in enumerate(ranks):
        data.set_epoch(1)
        reference = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=5)
        reference.set_epoch(1)
        assert list(data.sampler) == list(reference)


@pytest.mark.parametrize("keeps_sampler", [None, False], ids=["accelerator", "distributed-strategy"])
def test_where_nothing_is_drawn_the_order_is_distributed_samplers(keeps_sampler):
    """Nothing is drawn outside the Trainer's loop (the Accelerator's prepared loaders), nor where Lightning shards
    (a distributed strategy on one process: DistributedSampler): the order is (seed, epoch)'s, as
    DistributedSampler's."""
    dataset = ours.RandomDataset(1, 10)
    data = prepare_train_data(DataLoader(dataset, batch_size=2, shuffle=True), 1, 0, seed=4,
                              keeps_sampler=keeps_sampler)
    data.set_epoch(2)
    if keeps_sampler is False:
        draw_loader_seed(data)
    reference = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=4)
    reference.set_epoch(2)
    assert list(data.sampler) == list(reference) and not data.drawn_order()


def test_an_epoch_saved_by_several_processes_continues_its_order_on_one_then_draws():
    """A checkpoint written by 2 processes (no drawn permutation) resumed on one: the rest of the interrupted epoch
    is that epoch's (seed, epoch) order; the next epoch is drawn, as Lightning's RandomSampler draws it."""
    dataset = ours.RandomDataset(1, 12)
    loader = DataLoader(dataset, batch_size=2, shuffle=True)
    two = prepare_train_data(loader, 2, 0, seed=5)
    saved = two.drawn_order()
    assert saved == {}  # (present: the checkpoint is of a version that draws orders)
    one = prepare_train_data(loader, 1, 0, seed=5)
    one.load_drawn_order(saved)
    one.set_epoch(0)
    one.skip_samples(4)  # the loop makes no draw in an epoch resumed in its middle
    assert list(one.sampler) == two.sampler.global_order()[4:]
    torch.manual_seed(0)
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    torch.manual_seed(0)
    one.set_epoch(1)
    draw_loader_seed(one, at_iter=False)
    assert list(one.sampler) == torch.randperm(12, generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_shuffling_evaluation_loader_is_warned_about_as_lightning_warns():
    def messages(lib, classes):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = DataLoader(classes.RandomDataset(32, 8), batch_size=4, shuffle=True)
            lib.Trainer(**QUIET).validate(classes.BoringModel(), loader, verbose=False)
        return [(w.category.__name__, str(w.message)) for w in caught if "shuffling" in str(w.message)]

    mine = messages(tasktrain, ours)
    assert mine == messages(pl, theirs) and len(mine) == 1
