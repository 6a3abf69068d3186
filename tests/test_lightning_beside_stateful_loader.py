"""torchdata's StatefulDataLoader(shuffle=True) as the training loader on one process, beside Lightning (issue 37):
Lightning keeps the loader (its class, and the permutation its torchdata RandomSampler draws each epoch); the Trainer
builds it again as a StatefulDataLoader whose epochs read the same permutations, and a fit resumed mid-epoch reads on
exactly (the global position resumes it)."""
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("torchdata.stateful_dataloader")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402
boring_theirs = theirs

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)


def fit(lib, boring, seen, tmp_path=None, **kwargs):
    class Model(boring.BoringModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch[:, 0].tolist())
            return super().training_step(batch, batch_idx)

    lib.seed_everything(0, verbose=False)
    data = torch.arange(8.).unsqueeze(1).repeat(1, 32)
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = lib.Trainer(max_epochs=2, enable_checkpointing=False, default_root_dir=tmp_path, **QUIET, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Model(), StatefulDataLoader(data, batch_size=2, shuffle=True), ckpt_path=ckpt_path)
    return trainer


def test_a_shuffling_stateful_loader_reads_lightnings_order_and_resumes_exactly(tmp_path):
    got = {}
    for name, lib, boring in (("lightning", pl, theirs), ("tasktrain", tasktrain, ours)):
        seen = []
        trainer = fit(lib, boring, seen)
        got[name] = (type(trainer.train_dataloader).__name__, seen)
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"][0] == "StatefulDataLoader" and len(got["tasktrain"][1]) == 8
    first = []
    trainer = fit(tasktrain, ours, first, max_steps=3)  # (stopped in the middle of the first epoch)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    rest = []
    fit(tasktrain, ours, rest, ckpt_path=str(tmp_path / "mid.ckpt"))
    assert first + rest == got["tasktrain"][1]


def _shuffled_fit(lib, boring, seen, tmp_path=None, stop_at=None, ckpt_path=None, generator=False, strategy="ddp"):
    """A StatefulDataLoader(shuffle=True) under `strategy` on one process ("ddp", a distributed strategy: Lightning
    wraps its torchdata RandomSampler in DistributedSamplerWrapper), 3 epochs of 10 samples in batches of 3 (the
    last one short: the sampler is read to its end); `stop_at`: a checkpoint at that step, and the fit stopped there;
    `generator`: the loader's generator= (its sampler's too, and the source of its base seeds)."""
    class Model(boring.BoringModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch[:, 0].tolist())
            return super().training_step(batch, batch_idx)

    class Stop(lib.Callback):
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.should_stop or trainer.global_step == stop_at

    lib.seed_everything(3, verbose=False)
    data = torch.arange(10.).unsqueeze(1).repeat(1, 32)
    callbacks = [] if stop_at is None else [Stop(), lib.callbacks.ModelCheckpoint(
        dirpath=tmp_path, save_last=True, every_n_train_steps=stop_at, save_top_k=0)]
    trainer = lib.Trainer(max_epochs=3, strategy=strategy, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                          default_root_dir=tmp_path, **QUIET)
    model = Model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, StatefulDataLoader(data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(
            1) if generator else None), ckpt_path=ckpt_path)
    return model.layer.weight.detach().clone(), torch.rand(1)


@pytest.mark.parametrize("strategy,generator", [("ddp", False), ("ddp", True), ("auto", False)])
def test_a_shuffling_stateful_loader_reads_lightnings_order_to_its_last_short_batch(strategy, generator):
    """Under a distributed strategy (one process of ddp here; tests/test_lightning_beside_ddp_order.py has 2) Lightning
    wraps a StatefulDataLoader's torchdata RandomSampler (not torch's RandomSampler) in its DistributedSamplerWrapper:
    each epoch the sampler's permutation read at DistributedSampler's (seed, epoch) positions. The Trainer read
    DistributedSampler(dataset)'s order instead. On one process ("auto") Lightning reads the sampler's permutations;
    the Trainer's took a second one from its generator where the epoch read the sampler to its end (torch's
    RandomSampler does; torchdata's does not), so its second epoch read Lightning's third."""
    theirs, ours_seen = [], []
    try:
        their_weights, their_after = _shuffled_fit(pl, boring_theirs, theirs, generator=generator, strategy=strategy)
    finally:  # Lightning's world of one outlives its run (ours ends at teardown): not left to later tests
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    weights, after = _shuffled_fit(tasktrain, ours, ours_seen, generator=generator, strategy=strategy)
    assert ours_seen == theirs and len(ours_seen) == 12
    torch.testing.assert_close(weights, their_weights, rtol=0, atol=0)
    torch.testing.assert_close(after, their_after, rtol=0, atol=0)


@pytest.mark.parametrize("stop_at,generator,strategy", [(2, False, "ddp"), (6, True, "ddp"), (6, False, "auto")])
def test_a_shuffling_stateful_loader_resumes_mid_epoch_exactly(tmp_path, stop_at, generator, strategy):
    """That order resumed from the middle of epoch 0 (step 2) or epoch 1 (step 6): the checkpoint keeps the state
    the torchdata sampler's generator drew the epoch's permutation from, and where it stood after, so the rest of
    the epoch and the epochs after are the uninterrupted fit's (Lightning's wrapper keeps no state: its resumed
    StatefulDataLoader skips over a permutation drawn anew)."""
    whole = []
    weights, after = _shuffled_fit(tasktrain, ours, whole, generator=generator, strategy=strategy)
    first, rest = [], []
    _shuffled_fit(tasktrain, ours, first, tmp_path, stop_at=stop_at, generator=generator, strategy=strategy)
    resumed, resumed_after = _shuffled_fit(tasktrain, ours, rest, ckpt_path=str(tmp_path / "last.ckpt"),
                                           generator=generator, strategy=strategy)
    assert len(first) == stop_at and first + rest == whole
    torch.testing.assert_close(resumed, weights, rtol=0, atol=0)
    torch.testing.assert_close(resumed_after, after, rtol=0, atol=0)


@pytest.mark.parametrize("world", [1, 3])
def test_a_wrapped_stateful_order_resumes_on_another_number_of_processes(world):
    """Each rank of 2 reads what Lightning's DistributedSamplerWrapper gives it over the same torchdata RandomSampler;
    an epoch saved after 4 samples and resumed on `world` processes reads the rest of that epoch's global order (every
    remaining sample once, padded as DistributedSampler pads), and the next epoch is drawn on from where the
    sampler's generator stood."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from torchdata.stateful_dataloader.sampler import RandomSampler

    from tasktrain.trainer.data import draw_loader_seed, prepare_train_data

    def loader():
        torch.manual_seed(9)  # (its torchdata RandomSampler's generator is seeded from torch's global one)
        return StatefulDataLoader(list(range(11)), batch_size=2, shuffle=True)

    def lightnings(rank, num_replicas, epochs):
        torch.manual_seed(9)
        sampler = RandomSampler(list(range(11)))
        wrapper = DistributedSamplerWrapper(sampler, num_replicas=num_replicas, rank=rank, shuffle=True, seed=5)
        orders = []
        for epoch in range(epochs):
            wrapper.set_epoch(epoch)
            orders.append(list(wrapper))
        return orders

    ranks = [prepare_train_data(loader(), 2, rank, seed=5, shuffle=True, keeps_sampler=False, lightning=True)
             for rank in range(2)]
    for rank, data in enumerate(ranks):
        data.set_epoch(0)
        draw_loader_seed(data)
        assert list(data.sampler) == lightnings(rank, 2, 1)[0]
    saved = ranks[0].drawn_order()
    resumed = [prepare_train_data(loader(), world, rank, seed=5, shuffle=True, keeps_sampler=False, lightning=True)
               for rank in range(world)]
    order = lightnings(0, 1, 1)[0]  # (one replica's: the epoch's global order)
    left = order[4:]
    padded = left + order[:-len(left) % world]
    for rank, data in enumerate(resumed):
        data.load_drawn_order(saved)
        data.set_epoch(0)
        data.skip_samples(4)
        assert list(data.sampler) == padded[rank::world]
    for rank, data in enumerate(resumed):  # epoch 1: drawn from where the generator stood after epoch 0's draw
        data.set_epoch(1)
        draw_loader_seed(data)
        assert list(data.sampler) == lightnings(rank, world, 2)[1]


def test_lightnings_wrapped_order_resumed_mid_epoch_reads_other_samples(tmp_path):
    """The kept difference (docs/lightning.md): Lightning's DistributedSamplerWrapper keeps no state, so its resumed
    StatefulDataLoader skips the batches trained on in another permutation of its sampler (drawn anew as the loader
    loads its state): the rest of the epoch is not the interrupted fit's, where the Trainer's is (the test above)."""
    whole, first, rest = [], [], []
    try:
        _shuffled_fit(pl, boring_theirs, whole)
        _shuffled_fit(pl, boring_theirs, first, tmp_path, stop_at=2)
        _shuffled_fit(pl, boring_theirs, rest, ckpt_path=str(tmp_path / "last.ckpt"))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert first == whole[:2] and len(first + rest) == len(whole)
    epoch = [i for batch in (first + rest)[:4] for i in batch]
    assert first + rest != whole and sorted(epoch) != list(range(10))  # (samples read twice, others not at all)
