"""Data: each rank gets its own shard, the order is a function of (seed, epoch), and a resume skips ahead.

The Trainer rebuilds a plain DataLoader whose sampler is a RandomSampler or SequentialSampler around our
ResumableSampler, so a resumed epoch skips the samples already seen without loading them (a DataLoader subclass of
the user's is rebuilt as its class, with the user's constructor arguments: loader_init.py). A loader of the user's own
order (a sampler or batch sampler of theirs, a RandomSampler with replacement or num_samples) is taken as Lightning's
Trainer takes it (issue 37, `_lightning_train_data`, `prepare_eval_loader`): set_epoch(epoch) reaches its sampler and
its batch sampler's sampler at each epoch's start (`loader_samplers`); on one process (or use_distributed_sampler=
False) it is otherwise left alone; under a distributed strategy its `sampler`, unless a DistributedSampler, is
replaced: a Random/Sequential one by DistributedSampler(dataset, shuffle=True, seed) (a ResumableSampler), any other by
DistributedSamplerWrapper (the positions of what the user's sampler yields, shuffled by (seed, epoch) and sharded),
a custom batch sampler built again around the replacement; evaluation loaders alike (shuffle where the sampler is a
RandomSampler), predict loaders unpadded (PredictShardSampler) and without drop_last. Such a loader resumes mid-epoch
by reading and dropping the batches trained on (its order repeats: the wrapper's is a function of (seed, epoch) and
the user's set_epoch), except over a ResumableSampler with a batch size, which skips ahead. The Accelerator's loaders
keep Accelerate's rules (no set_epoch of a user's sampler, nothing wrapped).

A torchdata StatefulDataLoader is rebuilt the same way over a map-style dataset or a
ShardedStream (the global position resumes it); over data of its own order its state is what resumes
(StatefulLoaderData: saved per rank, continued on the same number of processes). Under a distributed strategy a
shuffling one's torchdata RandomSampler (not torch's RandomSampler, so Lightning wraps it in its
DistributedSamplerWrapper rather than replacing it) gives the global order through WrappedRandomOrder: its draws at
DistributedSampler's (seed, epoch) positions, each draw kept for a checkpoint.

Where Lightning's Trainer reads the user's loader as it is (one process, use_distributed_sampler=False) and the Trainer
reads a rebuild of it, trainer.train_dataloader shows the user's (TrainData.given / shown): what a script reads there,
and the draws a callback makes from it, are Lightning's, while the loop reads the rebuild.

The order of an epoch is defined over the whole dataset, independently of the number of processes: a permutation
of the dataset drawn from (seed, epoch) (or 0..n-1 without shuffling), the *global order*. Rank r of W takes
positions r, r + W, r + 2W, ... of it (torch's DistributedSampler does the same), so the loop's k-th batch of B
samples per rank covers positions k*B*W .. (k+1)*B*W - 1 on every rank together, and after k batches exactly the
first k*B*W positions are consumed, whatever W is. A resume records that count (`samples_in_epoch`), drops that
prefix of the recomputed global order, and shards what is left over the processes it has now: every sample of the
epoch is trained once, on any number of processes. When the rest does not divide evenly, it is padded, as
DistributedSampler pads, with the first samples of the epoch's order (the same padding as an uninterrupted run
when the resume starts at a multiple of W).

One exception, Lightning's rule (issue 37): where the Trainer does not shard a shuffling loader (one process, or
use_distributed_sampler=False) Lightning keeps the user's RandomSampler, whose permutation of each epoch comes from
a seed it draws from torch's global generator at the epoch's first batch (or, with a generator of its own, from that
generator, which it advances). The Trainer's loop makes that draw at Lightning's point (`draw_loader_seed`) and the
epoch's global order is then the permutation of what was drawn (`ResumableSampler.draw_order`), recorded so that a
checkpoint holds it (`drawn_order`): a resume on any number of processes continues that epoch exactly, and the
epochs after it follow the rule of the world they run on. Where nothing is drawn (the Accelerator's loaders, an
epoch resumed in its middle from a checkpoint without a record) the order is the (seed, epoch) one.
"""
import collections
import collections.abc
import copy
import math
import os
import warnings

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, Sampler, SequentialSampler

from tasktrain.data import ShardedStream
from tasktrain.exceptions import PossibleUserWarning
from tasktrain.trainer.loader_init import _IndexBatchSamplerWrapper, build_again
from tasktrain.trainer.seed import add_worker_init_fn


class ResumableSampler(DistributedSampler):
    """This rank's part of an epoch's global order, starting anywhere in it (see the module's docstring).

    Without a start it yields exactly what DistributedSampler(shuffle, seed, drop_last=False) yields. `len()` is the
    length of a whole epoch's shard; the iteration in flight is described by `iteration_start` (global position it
    started at), `iteration_samples` (samples of this rank) and `iteration_padding` (repeats added at its end, over
    all ranks).
    """

    def __init__(self, dataset, num_replicas, rank, shuffle, seed):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.start = 0
        # where the pass in flight started (begin_pass: the loop's TrainData.__iter__): any iteration of this sampler
        # during that pass starts there too, so that another one (a callback that iterates trainer.train_dataloader
        # in a resumed epoch, before the loop's first batch) reads what the loop reads instead of taking its skip
        self.pass_start = 0
        self.iteration_start = 0
        self.iteration_samples = self.num_samples
        self.iteration_padding = self.total_size - len(self.dataset)
        # Lightning's one-process rule (module docstring): the user's RandomSampler's generator (None: a seed from
        # torch's global generator), and what the epoch's permutation was drawn from: {"epoch", "seed"} or
        # {"epoch", "state"} (that generator's state), None where the order is (seed, epoch)'s
        self.draws = False
        self.order_generator = None
        self.epoch_order = None
        self.exhausted = False  # the epoch's pass read the order to its end (a RandomSampler then draws once more)
        # torch's RandomSampler takes a second, empty, permutation from its generator when read to its end; torchdata's
        # (a StatefulDataLoader's) draws nothing there
        self.draws_at_exhaustion = True
        self.drawn_orders = True  # False: a fit resumed from a checkpoint older than drawn orders keeps (seed, epoch)

    def global_order(self):
        """The epoch's order of the whole dataset: a function of (seed, epoch), or of what was drawn for it."""
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator()
        drawn = self.epoch_order if self.epoch_order is not None and self.epoch_order["epoch"] == self.epoch else None
        if drawn is None:
            generator.manual_seed(self.seed + self.epoch)  # DistributedSampler's generator: the same permutation
        elif "seed" in drawn:
            generator.manual_seed(int(drawn["seed"]))  # RandomSampler's: a generator seeded with the drawn seed
        else:
            generator.set_state(drawn["state"])
        return torch.randperm(n, generator=generator).tolist()

    def draw_order(self):
        """The draw the user's RandomSampler makes at an epoch's first batch (Lightning keeps it on one process):
        the epoch's permutation is then taken from what it drew."""
        if not (self.draws and self.shuffle):
            return
        if self.order_generator is None:
            self.epoch_order = {"epoch": self.epoch, "seed": int(torch.empty((), dtype=torch.int64).random_().item())}
        else:
            self.epoch_order = {"epoch": self.epoch, "state": self.order_generator.get_state()}
            torch.randperm(len(self.dataset), generator=self.order_generator)  # the generator moves as RandomSampler's
        self.exhausted = False
        if not self.drawn_orders:
            self.epoch_order = None  # (drawn all the same: the generators move as they did in the version that saved)

    def _generator_follows(self):
        return self.draws and self.draws_at_exhaustion and self.order_generator is not None and \
            self.epoch_order is not None and self.epoch_order["epoch"] == self.epoch

    def skip_samples(self, num_samples: int):
        """Start the next iteration `num_samples` into the epoch's global order (applies once)."""
        self.start = max(0, int(num_samples))

    def skip(self, num_samples: int):
        """Start the next iteration `num_samples` into this rank's shard (the old per-rank offset): the same as
        `skip_samples(num_samples * num_replicas)`."""
        self.skip_samples(int(num_samples) * self.num_replicas)

    def begin_pass(self):
        """A pass of the loop starts (TrainData.__iter__): it takes the pending start, which every iteration during
        the pass then starts from (until the epoch ends: TrainData.end_pass)."""
        self.pass_start, self.start = self.start, 0

    def __iter__(self):
        # (lazy, as a RandomSampler's: the order is taken at the first index asked for, not at iter(); a loader
        # without automatic batching calls iter() on its sampler inside its own iter(), where Lightning's loop makes
        # it, before the first batch's draw)
        yield from self._shard()

    def _shard(self):
        start, self.start = self.start or self.pass_start, 0
        order = self.global_order()
        rest = order[start:]
        padding = -len(rest) % self.num_replicas
        if padding and order:
            rest += (order * math.ceil(padding / len(order)))[:padding]
        self.iteration_start = start
        self.iteration_samples = len(rest) // self.num_replicas
        self.iteration_padding = padding
        shard = rest[self.rank::self.num_replicas]
        if self._generator_follows():
            return self._then_exhausted(shard)
        return iter(shard)

    def _then_exhausted(self, shard):
        yield from shard
        if not self.exhausted:  # (a resumed pass of an epoch read to its end before the checkpoint: drawn already)
            # RandomSampler(generator=g) takes a second, empty, permutation from g when it is read to its end
            torch.randperm(len(self.dataset), generator=self.order_generator)
            self.exhausted = True

    def samples_left(self, start: int) -> int:
        """Samples of this rank in an iteration that starts at global position `start`."""
        return math.ceil(max(0, len(self.dataset) - start) / self.num_replicas)


class WrappedRandomOrder(ResumableSampler):
    """Lightning's DistributedSamplerWrapper around torchdata's RandomSampler (a StatefulDataLoader(shuffle=True)'s,
    which is not torch's RandomSampler, so Lightning wraps it under a distributed strategy rather than replacing it by
    DistributedSampler(dataset)), as a global order that the position resumes on any number of processes.

    Each epoch the wrapper reads the inner sampler's permutation (drawn as torchdata draws it: randperm(n) from its
    generator), at the positions DistributedSampler(shuffle=True, seed) gives that epoch; rank r takes positions
    r, r + W, ... of the result, padded as DistributedSampler pads. That result is the epoch's global order. The draw
    is the loop's (ResumableSampler.draw_order, `draws`): the generator's state before it is kept in `epoch_order`,
    so a checkpoint holds it (with the generator's state after: TrainData.drawn_order) and a resumed epoch reads the
    same permutation; Lightning's wrapper keeps no state, and its resumed StatefulDataLoader skips over a permutation
    drawn anew. Where nothing was drawn for the epoch (a checkpoint written before this class) the order is the
    (seed, epoch) one of DistributedSampler(dataset), as the Trainer read it then."""

    def __init__(self, sampler, num_replicas, rank, seed):
        super().__init__(sampler.data_source, num_replicas, rank, shuffle=True, seed=seed)
        self.sampler = sampler
        self.draws_at_exhaustion = False  # (torchdata's sampler draws nothing when it is read to its end)

    def global_order(self):
        n = len(self.dataset)
        positions = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        drawn = self.epoch_order if self.epoch_order is not None and self.epoch_order["epoch"] == self.epoch else None
        if drawn is None:
            return positions
        generator = torch.Generator()
        generator.set_state(drawn["state"])
        inner = torch.randperm(n, generator=generator).tolist()
        return [inner[p] for p in positions]


class EvalShardSampler(Sampler):
    """Rank r takes samples r, r + W, r + 2W, ...: no padding, so every sample is counted exactly once."""

    shuffle = False  # (read as a DistributedSampler's, which Lightning gives an unshuffled evaluation loader)

    def __init__(self, dataset, num_replicas, rank):
        self.length = len(dataset)
        self.num_replicas, self.rank = num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self):
        return len(range(self.rank, self.length, self.num_replicas))


class UnrepeatedDistributedSampler(DistributedSampler):
    """Lightning's `overrides.distributed.UnrepeatedDistributedSampler` (tasktrain.overrides.distributed exports this
    class): a DistributedSampler (same arguments) that neither pads nor drops: rank r takes positions r, r + N, ... of
    the dataset's order (shuffled by torch.randperm seeded with the epoch alone, Lightning's rule), so ranks may differ
    by one sample and every sample is read once. Not for training: DDP needs every rank to run the same steps. It
    lives here, in the core, because the Trainer's own predict sampler (below) is one, as Lightning's is."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.dataset, collections.abc.Sized):
            raise TypeError("The given dataset must implement the `__len__` method.")
        self.total_size = len(self.dataset)
        self.num_samples = len(range(self.rank, self.total_size, self.num_replicas))
        if self.num_samples < 1 and self.total_size:  # Lightning's AssertionError (DDP's first step would hang)
            raise AssertionError(f"UnrepeatedDistributedSampler: {self.total_size} samples leave rank {self.rank} of "
                                 f"{self.num_replicas} none; every rank needs at least one (use fewer processes).")

    def __iter__(self):
        count = len(self.dataset)
        order = torch.randperm(count, generator=torch.Generator().manual_seed(self.epoch)).tolist() \
            if self.shuffle else list(range(count))
        return iter(order[self.rank::self.num_replicas])


class PredictShardSampler(UnrepeatedDistributedSampler):
    """A predict loader's sampler on several processes, as Lightning's UnrepeatedDistributedSamplerWrapper: the
    loader's own sampler drawn anew at each iteration, its positions (shuffle: a shuffling sampler's) permuted by
    torch.randperm seeded with the epoch alone (Lightning's rule), then rank r takes every num_replicas-th from r: no
    padding, each sample predicted once. (Its set_epoch is its own: Lightning's does not reach the user's sampler.)
    An UnrepeatedDistributedSampler (so a DistributedSampler), as Lightning's wrapper is, for code that checks the
    predict loaders' sampler with isinstance; it reads the sampler, not a dataset, so the parent's __init__ (which
    takes a dataset) is not run: its attributes are set here."""

    def __init__(self, sampler, num_replicas, rank, shuffle=True):
        _check_wrappable(sampler)
        self.sampler, self.num_replicas, self.rank, self.shuffle = sampler, num_replicas, rank, shuffle
        self.epoch, self.seed, self.drop_last = 0, 0, False
        self.total_size = len(sampler)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = list(self.sampler)
        positions = range(len(order)) if not self.shuffle else \
            torch.randperm(len(order), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        return iter([order[p] for p in positions[self.rank::self.num_replicas]])

    def __len__(self):
        return len(range(self.rank, len(self.sampler), self.num_replicas))


def _check_wrappable(sampler):
    """A sampler of the user's is sharded by its positions, so it needs a finite length (Lightning's checks and
    words)."""
    try:
        length = len(sampler)
    except TypeError:
        raise TypeError("You seem to have configured a sampler in your DataLoader which does not provide `__len__` "
                        "method. The sampler was about to be replaced by `DistributedSamplerWrapper` since "
                        "`use_distributed_sampler` is True and you are using distributed training. Either provide "
                        "`__len__` method in your sampler, remove it from DataLoader or set "
                        "`use_distributed_sampler=False` if you want to handle distributed sampling yourself."
                        ) from None
    if length == float("inf"):
        raise TypeError("You seem to have configured a sampler in your DataLoader which does not provide finite "
                        "`__len__` method. The sampler was about to be replaced by `DistributedSamplerWrapper` since "
                        "`use_distributed_sampler` is True and you are using distributed training. Either provide "
                        "`__len__` method in your sampler which returns a finite number, remove it from DataLoader "
                        "or set `use_distributed_sampler=False` if you want to handle distributed sampling yourself.")


class _Positions:
    """What a DistributedSampler over a user's sampler is built on: as many items as the sampler yields."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __len__(self):
        return len(self.sampler)


class DistributedSamplerWrapper(DistributedSampler):
    """A sampler of the user's sharded over the ranks, as Lightning's DistributedSamplerWrapper (the Trainer's rule
    under a distributed strategy with use_distributed_sampler): torch's DistributedSampler(shuffle, seed, drop_last)
    over the *positions* of what the user's sampler yields, which is drawn anew at each iteration; rank r gets the
    sampler's items at its positions (padded as DistributedSampler pads). set_epoch reaches the user's sampler too."""

    def __init__(self, sampler, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        _check_wrappable(sampler)
        super().__init__(_Positions(sampler), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.sampler = sampler

    def __iter__(self):
        drawn = list(self.sampler)
        return (drawn[position] for position in super().__iter__())

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)


_UNREAD = object()


def read_ahead(iterator, first=_UNREAD):
    """(item, whether it is the last) for each item: one read ahead, so that the last is known while it is used.
    `first`: the first item, read already (_END: there was none)."""
    item = next(iterator, _END) if first is _UNREAD else first
    while item is not _END:
        upcoming = next(iterator, _END)
        yield item, upcoming is _END
        item = upcoming


_END = object()


def samples_per_step(batch_size, world_size, split_batches=False):
    """Samples of the global order one step takes over all processes: each process's batch (split_batches: the
    loader's batch is cut into one part per process). None: batches have no fixed size."""
    if batch_size is None:
        return None
    return batch_size if split_batches else batch_size * world_size


class TrainData:
    """A training loader plus what the loop needs to drive it: set_epoch and skip-ahead.

    The kinds (this class: the Trainer's order of (seed, epoch) or a loader of the user's own order; StreamData,
    StatefulLoaderData here; ShardData in shard.py: Accelerate's batch order; DispatchData and IterableShardData in
    dispatch.py: one process reads for all, or every process cuts an IterableDataset by global batch) all have
    this surface, which the EpochIterator (epoch.py) and the PreparedDataLoader (prepared.py) drive. `kind` names
    the kind in a saved data position; `interleaved`: rank r's batch holds positions r, r + W, ... of the step
    (else a run of consecutive ones); `sliced`: every process's batch is a slice of a global batch whose layout
    `step_layout` tells; `batched_order`: the epoch's order depends on the batch size."""

    kind = "sampler"
    interleaved = True
    sliced = False
    split_batches = False
    batched_order = False  # the order of an epoch depends on the loader's batch size
    # Draws from torch's global generator that the user's loader made at each iter() and the loader rebuilt on our
    # order no longer makes (its base seed: ours has a generator; a RandomSampler's seed: our order is drawn from
    # (seed, epoch)): the Trainer's loop makes them (draw_loader_seed), so the generator moves as under Lightning.
    # (the base seed is drawn from the user's loader's generator where it has one: `base_generator`)
    draws_base_seed = False
    base_generator = None
    # The state that base seed was drawn from: the rebuilt loader's next iter() draws its workers' base seed from it,
    # so that its workers are seeded as the user's loader's would be (`pending_base`), and the pass in flight's
    # (`pass_base`), which a checkpoint keeps so that a pass resumed in its middle starts its workers alike. Where
    # nothing was drawn (the Accelerator's loaders, a checkpoint older than this) the base seed comes from the
    # generator set_epoch seeds from (seed, epoch).
    pending_base = None
    pass_base = None
    # The Trainer's rule (Lightning's fit loop): set_epoch(epoch) reaches the loader's sampler and its batch sampler's
    # sampler at each epoch's start, a user's own too (the Accelerator leaves those to the user, as Accelerate does)
    sets_loader_epoch = False
    # The Trainer's (Lightning's fetchers): the pass's iterator is kept until the next iter(), so workers that are
    # not persistent live on after the pass (held_until_next_iter); the Accelerator's end with the pass, as Accelerate's
    holds_iterator = False
    # A loader of the user's order that the Trainer does not shard (one process, use_distributed_sampler=False; a
    # DataLoader subclass kept as it is): the states of the generators a pass's iter() and first batch draw its
    # order from (torch's global one, the loader's, its samplers'), taken before its iter(); a checkpoint keeps the
    # pass's (`pass_draws`), so that a fit resumed inside that epoch reads the same order (`resume_draws`) before it
    # drops the batches trained on, then goes on from the restored global state: the interrupted run's batches
    replays_draws = False
    pass_draws = None
    resume_draws = None
    _order_drawn_at_iter = False
    # The loader the user gave, where Lightning's Trainer uses it as it is (one process, or use_distributed_sampler=
    # False: nothing sharded) and the Trainer reads a rebuild of it on its own order (for an exact resume): what
    # trainer.train_dataloader shows (`shown`), so that what a script reads there (the object, its sampler, dataset,
    # length, a batch drawn from it) is Lightning's. None: the loader read is the one shown.
    given = None

    def __init__(self, loader, sampler=None, generator=None, seed=0):
        self.loader, self.sampler, self.generator, self.seed = loader, sampler, generator, seed
        self._skip_batches = 0

    @property
    def shown(self):
        """What trainer.train_dataloader shows of this data: the loader given where Lightning's Trainer keeps it
        (`given`), else the loader read."""
        return self.given if self.given is not None else self.loader

    def _starts_workers(self):
        """Whether the loader's next iter() starts its workers (so draws their base seed): not where persistent
        workers run already."""
        loader = self.loader
        return not (getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None) is not None)

    def draw_at_iter(self, epoch=None):
        """The draws of the user's loader's iter(): its workers' base seed, from its generator or the global one,
        which the rebuilt loader's next iter() draws again; and with workers, a RandomSampler's seed, which the
        workers' first indices draw inside iter() (`epoch`: the epoch the iterator is for). Lightning's
        DistributedSamplerWrapper (WrappedRandomOrder) reads its sampler's permutation in its own iter(), which the
        loader's iter() calls before it draws the base seed."""
        wrapped = isinstance(self.sampler, WrappedRandomOrder)
        if wrapped:
            self._draw_order_at_iter(epoch)
        if self.draws_base_seed and self._starts_workers():
            source = self.base_generator
            state = source.get_state() if source is not None else torch.get_rng_state()
            torch.empty((), dtype=torch.int64).random_(generator=source)
            self.pending_base = state
        if not wrapped and isinstance(self.sampler, ResumableSampler) and getattr(self.loader, "num_workers", 0) > 0:
            self._draw_order_at_iter(epoch)

    def _draw_order_at_iter(self, epoch):
        if epoch is not None:
            self.sampler.set_epoch(epoch)
        self.sampler.draw_order()
        self._order_drawn_at_iter = True

    def draw_at_first_batch(self):
        """The draw of the user's RandomSampler at the epoch's first batch, where Lightning keeps it (made at iter()
        already where the loader has workers)."""
        if self._order_drawn_at_iter:
            self._order_drawn_at_iter = False
        elif isinstance(self.sampler, ResumableSampler):
            self.sampler.draw_order()

    def drawn_order(self):
        """What a checkpoint keeps of the drawn order: the epoch's permutation source and the user's generators'
        states now (None when the order is (seed, epoch)'s and no generator of the user's moves)."""
        sampler = self.sampler
        state = {}
        if isinstance(sampler, ResumableSampler) and sampler.epoch_order is not None and \
                sampler.epoch_order["epoch"] == sampler.epoch:
            state.update(sampler.epoch_order, exhausted=sampler.exhausted)
        generators = self._users_generators()
        if generators:
            state["generators"] = [g.get_state() for g in generators]
        if self.pass_base is not None:  # (bytes, not a tensor: train states compare with ==)
            state["base_seed_state"] = self.pass_base.numpy().tobytes()
        if self.pass_draws is not None:
            state["pass_draws"] = self.pass_draws
        # (on the Trainer's own order, saved even when empty: its presence says the order of later epochs is drawn)
        return state if state or isinstance(sampler, ResumableSampler) else None

    def load_drawn_order(self, state):
        """A checkpoint's `drawn_order`: the saved epoch continues on its permutation, the user's generators where
        they stood. None (a checkpoint from before drawn orders): this fit keeps the (seed, epoch) order its version
        trained, so that it reaches the weights that version would have."""
        sampler = self.sampler
        if state is None and isinstance(sampler, ResumableSampler):
            sampler.drawn_orders = False
        if not state:
            return
        if self.replays_draws:
            self.resume_draws = state.get("pass_draws")
        if state.get("base_seed_state") is not None:  # (a resume at an epoch's start draws anew at the fit's start)
            self.pending_base = torch.frombuffer(bytearray(state["base_seed_state"]), dtype=torch.uint8)
        if isinstance(sampler, ResumableSampler) and "epoch" in state:
            sampler.epoch_order = {k: state[k] for k in ("epoch", "seed", "state") if k in state}
            sampler.exhausted = bool(state.get("exhausted", False))
        generators, saved = self._users_generators(), state.get("generators") or []
        if len(generators) == len(saved):  # (another loader than the one saved: its generators start as given)
            for generator, one in zip(generators, saved):
                generator.set_state(one)

    def draws_own_order(self):
        """The epoch's order is drawn as the user's RandomSampler draws it (each rank from its own generator where the
        Trainer does not shard: use_distributed_sampler=False)."""
        return getattr(self.sampler, "draws", False) or self.replays_draws

    def _users_generators(self):
        found = [self.base_generator] if self.draws_base_seed and self.base_generator is not None else []
        mine = getattr(self.sampler, "order_generator", None) if getattr(self.sampler, "draws", False) else None
        if mine is not None and all(mine is not g for g in found):
            found.append(mine)
        return found

    def __len__(self):
        return len(self.loader)

    def has_len(self):
        try:
            len(self.loader)
            return True
        except (TypeError, NotImplementedError):  # (Lightning's sized_len: a __len__ that raises either has none)
            return False

    @property
    def resumes_on_any_world_size(self) -> bool:
        """The order is ours (a function of the seed and the epoch over the whole dataset), so a resume on another
        number of processes, or with another batch size, can continue it exactly."""
        return isinstance(self.sampler, ResumableSampler) and self.loader.batch_size is not None

    @property
    def num_samples(self):
        """Samples in an epoch's global order (the dataset's length), or None when the loader is not ours."""
        return len(self.sampler.dataset) if self.resumes_on_any_world_size else None

    def samples_per_batch(self, world_size):
        """Positions of the global order one loop batch covers on all ranks together (None: not known)."""
        return samples_per_step(getattr(self.loader, "batch_size", None), world_size)

    def step_layout(self, index):
        """(every rank's batch size, real samples) of step `index` of the pass in flight, where every rank knows it
        (None: not known here)."""
        return None

    def batches_from(self, num_samples: int):
        """Batches of this rank in an epoch resumed `num_samples` into the global order (None without a length)."""
        if not self.resumes_on_any_world_size:
            return None
        left, batch_size = self.sampler.samples_left(num_samples), self.loader.batch_size
        return left // batch_size if self.loader.drop_last else math.ceil(left / batch_size)

    def set_epoch(self, epoch):
        samplers = {id(self.sampler): self.sampler} if self.sampler is not None else {}
        if self.sets_loader_epoch:  # the Trainer's (Lightning's) rule: the loader's samplers, whoever built them
            samplers.update((id(one), one) for one in loader_samplers(self.loader))
            if self.given is not None:  # (the loader Lightning keeps, read here through a rebuild: its samplers too)
                samplers.update((id(one), one) for one in loader_samplers(self.given))
        for sampler in samplers.values():
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
        if self.generator is not None:
            # Worker seeds come from this generator where the loop drew none (pending_base): (seed, epoch)'s.
            self.generator.manual_seed(self.seed * 100_003 + epoch)

    def skip(self, num_batches: int):
        """Start the next iteration `num_batches` batches into this rank's shard."""
        if num_batches <= 0:
            return
        if self.resumes_on_any_world_size:
            self.sampler.skip(num_batches * self.loader.batch_size)
        else:
            self._skip_batches = num_batches

    def end_pass(self):
        """The epoch the loop's pass read has ended: an iteration after it (StochasticWeightAveraging's BatchNorm
        pass, a script's after the fit) reads a whole epoch again, not the rest a resumed pass read."""
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.pass_start = 0

    def skip_samples(self, num_samples: int):
        """Start the next iteration `num_samples` into the epoch's global order (only for our own sampler)."""
        if not self.resumes_on_any_world_size:
            raise ValueError("skip_samples needs the order the Trainer builds (a plain DataLoader with shuffle=True "
                             "or False, no sampler of its own).")
        self.sampler.skip_samples(num_samples)

    def __iter__(self):
        if self.generator is not None and self._starts_workers():
            if self.pending_base is not None:
                self.generator.set_state(self.pending_base)
            self.pass_base, self.pending_base = self.pending_base, None
        skip, self._skip_batches = self._skip_batches, 0
        replay, self.resume_draws = (self.resume_draws if skip else None), None
        restored = torch.get_rng_state() if replay is not None else None
        if replay is not None:
            _set_draw_states(self.loader, replay)  # (the interrupted pass's, for its iter() and first batch)
        if self.replays_draws:
            self.pass_draws = replay if replay is not None else _draw_states(self.loader)
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.begin_pass()
        iterator = iter(self.loader)
        if self.holds_iterator:
            held_until_next_iter(self.loader, iterator)
        if skip:  # (Lightning's category and first words: its loop warns there too, and reads the epoch again)
            warnings.warn("You're resuming from a checkpoint that ended before the epoch ended and your dataloader is "
                          f"not resumable: the Trainer loads and drops the {skip} batches trained on, as this loader's "
                          "order is its own (a sampler of yours, an IterableDataset, an iterable without "
                          "`state_dict` / `load_state_dict`), so it cannot skip ahead without loading them.",
                          PossibleUserWarning)
            for _ in range(skip):
                next(iterator, None)
        if restored is not None:
            torch.set_rng_state(restored)  # (the checkpoint's: the rest of the run draws as the interrupted one)
        return iterator


def _draw_generators(loader):
    """The generators of the user's that a loader's iter() and first batch draw from (torch's global one aside)."""
    found = {}
    for one in (getattr(loader, "generator", None), *[getattr(s, "generator", None) for s in loader_samplers(loader)]):
        if isinstance(one, torch.Generator):
            found[id(one)] = one
    return list(found.values())


def _draw_states(loader):
    """(torch's global generator's state, the loader's generators' states) now, as bytes (train states compare with
    ==)."""
    return {"torch": torch.get_rng_state().numpy().tobytes(),
            "generators": [g.get_state().numpy().tobytes() for g in _draw_generators(loader)]}


def _set_draw_states(loader, states):
    torch.set_rng_state(_state_tensor(states["torch"]))
    generators = _draw_generators(loader)
    if len(generators) == len(states["generators"]):  # (another loader than the one saved: its own stay as they are)
        for generator, saved in zip(generators, states["generators"]):
            generator.set_state(_state_tensor(saved))


def _state_tensor(saved):
    return torch.frombuffer(bytearray(saved), dtype=torch.uint8)


def held_until_next_iter(loader, iterator):
    """`iterator`, kept on its DataLoader until the loader's next iter() (or the run's end: shutdown_loader_workers):
    workers that are not persistent then stop there, as under Lightning, whose fetchers hold each pass's iterator
    (its workers alive during on_train_epoch_end, the validation, ...), not where the pass stops reading. (The
    DataLoader's own slot for the iterator of persistent workers, which its iter() reads for those only.)"""
    if isinstance(loader, DataLoader) and loader.num_workers > 0 and not loader.persistent_workers:
        if loader._iterator is not iterator:
            stop_workers(loader)  # (the previous pass's, stopped here after the new one started)
        loader._iterator = iterator
    return iterator


def stop_workers(loader):
    """Stop the workers of the iterator `loader` holds and let it go, now: dropping it would stop them only once
    nothing refers to it (a reference cycle keeps them alive until the garbage collector runs)."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    if isinstance(loader._iterator, _MultiProcessingDataLoaderIter):
        loader._iterator._shutdown_workers()
    loader._iterator = None


def draw_loader_seed(data, epoch=None, at_iter=True, at_first_batch=True):
    """The draws the user's DataLoader makes at an iter() (its workers' base seed, from its generator or torch's
    global one) and at an epoch's first batch (a RandomSampler's seed, or its permutation from its own generator),
    made where the Trainer replaced that loader by one of its own order, at Lightning's points: the generators then
    stand where they stand under Lightning, and on one process the epoch's order is the permutation drawn there.
    `epoch`: the epoch the iterator is for (None: the sampler's)."""
    if data is None:
        return
    if at_iter:
        data.draw_at_iter(epoch)
    if at_first_batch:
        data.draw_at_first_batch()


def _order_sampler(loader):
    """The sampler that decides the order: the loader's, or that of the BatchSampler the user passed as
    batch_sampler= (the loader's own `sampler` is then an unused default SequentialSampler)."""
    if loader.batch_size is None and loader.batch_sampler is not None:
        return getattr(loader.batch_sampler, "sampler", None)
    return loader.sampler


def loader_options(loader) -> dict:
    """A DataLoader's keyword arguments other than those of its order (dataset, sampler, batch_sampler,
    batch_size, drop_last, shuffle): what a loader rebuilt around another sampler keeps of the user's."""
    kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                  timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
                  persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


def _rebuild(loader: DataLoader, sampler, generator, kind=DataLoader) -> DataLoader:
    if _users_class(loader):  # (its class built again around the sampler, with the user's arguments)
        rebuilt = build_again(loader, sampler)
        if generator is not loader.generator:
            rebuilt.generator = generator  # (the Trainer's: its workers' base seeds, drawn as the user's loader draws)
        return rebuilt
    # batch_sampler=BatchSampler(...) keeps its batch size there; batch_size=None without one (no automatic
    # batching: each item is a batch, as the user made it) stays so, as in Lightning's rebuilt loader
    batches = loader.batch_sampler if loader.batch_size is None and loader.batch_sampler is not None else loader
    kwargs = dict(loader_options(loader), batch_size=batches.batch_size, sampler=sampler,
                  drop_last=batches.drop_last, generator=generator)
    if kind is not DataLoader:  # (a StatefulDataLoader keeps how often it snapshots its workers' state)
        kwargs["snapshot_every_n_steps"] = loader.snapshot_every_n_steps
    return kind(loader.dataset, **kwargs)


def is_stateful_loader(loader) -> bool:
    """A DataLoader that saves its own position (torchdata's StatefulDataLoader: state_dict/load_state_dict)."""
    return isinstance(loader, DataLoader) and callable(getattr(loader, "state_dict", None)) and \
        callable(getattr(loader, "load_state_dict", None))


def _torchdata_sampler(sampler, name) -> bool:
    """torchdata's StatefulDataLoader swaps torch's default RandomSampler/BatchSampler for stateful twins."""
    kind = type(sampler)
    return kind.__name__ == name and kind.__module__.startswith("torchdata.stateful_dataloader")


def _users_class(loader) -> bool:
    """A DataLoader subclass of the user's: built again as that class (torchdata's StatefulDataLoader has its own
    rules)."""
    kind = type(loader)
    return isinstance(loader, DataLoader) and kind is not DataLoader and not kind.__module__.startswith("torchdata.")


def _loader_subclass(loader) -> bool:
    """A map-style loader of a DataLoader subclass of the user's (torchdata's StatefulDataLoader has its own rules)."""
    kind = type(loader)
    return isinstance(loader, DataLoader) and kind is not DataLoader and \
        not kind.__module__.startswith("torchdata.") and \
        not isinstance(loader.dataset, torch.utils.data.IterableDataset)


def _replaceable(loader) -> bool:
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return False
    if type(loader.batch_sampler) is not BatchSampler and loader.batch_sampler is not None and \
            not _torchdata_sampler(loader.batch_sampler, "BatchSampler"):
        return False
    sampler = _order_sampler(loader)
    if type(sampler) is SequentialSampler:
        return True
    random = type(sampler) is RandomSampler or _torchdata_sampler(sampler, "RandomSampler")
    return random and not sampler.replacement and sampler._num_samples is None


class StatefulLoaderData(TrainData):
    """A StatefulDataLoader (torchdata) over a data set whose order is its own (an IterableDataset, a sampler of the
    user's): its state_dict, which holds each worker's state, is this rank's position. `loader_state()` is the state
    after the batches the loop has trained on (a batch read ahead is not counted); a resume loads it back instead
    of reading and dropping the consumed batches. It is one rank's state, so only the same number of processes can
    continue it (the epoch iterator refuses another one mid-epoch)."""

    kind = "stateful"

    def __init__(self, loader, sampler, seed):
        super().__init__(loader, sampler, None, seed)
        self._restored = None  # a loaded state, for the resumed pass
        self._start = self._pass_start = 0  # batches of the epoch before the next / the current pass
        self._states = collections.deque(maxlen=3)  # (batches yielded, state after them) of the pass in flight
        self._pass_state = None  # the state the pass in flight started from (None: the epoch's start)

    def loader_state(self, batch_in_epoch):
        """The loader's state once the loop has trained on `batch_in_epoch` batches of the epoch (None: at the
        epoch's start; a batch the loop read ahead is not in it)."""
        done = batch_in_epoch - self._pass_start
        if batch_in_epoch <= 0 or done <= 0:
            return self._pass_state if batch_in_epoch > 0 else None
        for count, state in self._states:
            if count == done:
                return state
        raise RuntimeError(f"The StatefulDataLoader's state after batch {batch_in_epoch} is no longer held: save "
                           "the checkpoint between two batches of the loop.")

    def load_loader_state(self, state):
        """This rank's saved state: the resumed pass (a resume in the middle of an epoch) starts from it."""
        self._restored = state

    def skip(self, num_batches: int):
        self._start = max(0, int(num_batches))
        if self._start and self._restored is None:
            super().skip(num_batches)  # no saved state (a checkpoint written without one): read and drop

    def __iter__(self):
        start, self._start = self._start, 0
        restored, self._restored = (self._restored if start else None), None
        self._pass_start, self._pass_state = start, restored
        self._states.clear()
        if restored is not None:
            self.loader.load_state_dict(restored)  # where the saved run stopped: nothing consumed is read again
        return self._counted(super().__iter__())

    def _counted(self, iterator):
        for count, batch in enumerate(iterator, 1):
            self._states.append((count, self.loader.state_dict()))
            yield batch


class StreamData(TrainData):
    """A DataLoader over a ShardedStream (tasktrain/data.py), set up for this rank: the order is the stream's global
    order from (seed, epoch), so a resume on any number of processes and workers continues it exactly, starting
    at the count of items consumed without reading them."""

    kind = "stream"
    interleaved = False  # rank r reads the r-th run of each global batch of the stream

    def __init__(self, loader, stream, seed):
        self.stream = stream
        super().__init__(loader, None, None, seed)
        self.iteration_start, self.iteration_samples, self.iteration_padding = 0, len(stream), stream.padding(0)

    @property
    def seed(self):
        return self.stream.seed

    @seed.setter
    def seed(self, value):
        self.stream.seed = int(value)

    @property
    def resumes_on_any_world_size(self) -> bool:
        return True

    @property
    def num_samples(self):
        return self.stream.num_items

    def batches_from(self, num_samples: int):
        return self.stream.rank_counts(num_samples)[0]

    def set_epoch(self, epoch):
        self.stream.set_epoch(epoch)

    def skip(self, num_batches: int):
        self.skip_samples(num_batches * self.loader.batch_size * self.stream.world_size)

    def skip_samples(self, num_samples: int):
        self.stream.start = max(0, int(num_samples))

    def __iter__(self):
        stream = self.stream
        # what this iteration holds (the workers read a copy of the stream taken when the iterator starts them)
        self.iteration_start = stream.start
        self.iteration_samples = stream.rank_counts(stream.start)[1]
        self.iteration_padding = stream.padding(stream.start)
        iterator = iter(self.loader)
        if self.holds_iterator:
            held_until_next_iter(self.loader, iterator)
        stream.start = 0  # a skip applies once
        return iterator


def _prepare_stream(loader, world_size, rank, seed, shuffle) -> StreamData:
    if loader.batch_size is None:
        raise ValueError("A DataLoader over a ShardedStream needs batch_size (each process takes its part of every "
                         "global batch of the stream's order): give DataLoader(stream, batch_size=N).")
    if loader.num_workers > 0 and loader.persistent_workers:
        raise ValueError("persistent_workers=True keeps each DataLoader worker's copy of a ShardedStream from the "
                         "first epoch, so the next epochs' order and a resume's start would not reach it: use "
                         "persistent_workers=False (the workers are started again each epoch).")
    if getattr(loader, "in_order", True) is False:
        raise ValueError("in_order=False lets the DataLoader hand out its workers' batches as they come, so the "
                         "batches of a ShardedStream would not follow the epoch's order (and a resume could not "
                         "know which were trained on): use in_order=True.")
    stream = copy.copy(loader.dataset).configure(rank=rank, world_size=world_size, batch_size=loader.batch_size,
                                                 drop_last=loader.drop_last, seed=seed)
    if shuffle is False:
        stream.shuffle = False  # overfit_batches: the same batches every epoch
    kwargs = dict(
        batch_size=loader.batch_size, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, drop_last=loader.drop_last, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, pin_memory_device=loader.pin_memory_device)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return StreamData(DataLoader(stream, **kwargs), stream, seed)


def dispatches(loader) -> bool:
    """A DataLoader over an IterableDataset of the user's (not a ShardedStream, which shards itself, nor under a
    StatefulDataLoader, whose own state resumes it) with a batch size: nothing tells which items are whose, so one
    process reads it and sends every process its slice of each global batch (tasktrain/trainer/dispatch.py)."""
    return isinstance(loader, DataLoader) and isinstance(loader.dataset, torch.utils.data.IterableDataset) and \
        not isinstance(loader.dataset, ShardedStream) and not is_stateful_loader(loader) and \
        loader.batch_size is not None


def prepare_train_data(loader, world_size, rank, seed, shuffle=None, broadcast=None, reads=True,
                       keeps_sampler=None, lightning=False) -> TrainData:
    """This rank's TrainData of a training loader, sharded `world_size` ways (this rank's shard: `rank`; both the
    data-parallel ones where processes share batches). shuffle=False reads a shuffling loader in order
    (overfit_batches); True shuffles a sequential one too (the Trainer's DistributedSampler, Lightning's rule under a
    distributed strategy); None keeps the loader's choice. With `broadcast` (the strategy's: rank 0's object on every
    rank) an IterableDataset of the user's is read by the process that `reads` (global rank 0) and dispatched
    (`dispatches`), the Trainer's rule; without it, it is read as it is on every process. `keeps_sampler`: where
    Lightning keeps the user's RandomSampler (a strategy that is not distributed, or use_distributed_sampler=False;
    None: where `world_size` is 1), the epoch's order is the permutation that sampler draws, when the loop draws it
    (ResumableSampler.draw_order). `lightning` (the Trainer's): a map-style loader of the user's own order follows
    Lightning's rules too (`_lightning_train_data`: sharded under a distributed strategy, set_epoch every epoch)."""
    if broadcast is not None and dispatches(loader):
        from tasktrain.trainer.dispatch import dispatch_data  # (dispatch.py builds on this module)

        return dispatch_data(loader, world_size, rank, seed, broadcast, reads, shuffle=shuffle)
    if isinstance(loader, DataLoader) and isinstance(loader.dataset, ShardedStream):
        return _prepare_stream(loader, world_size, rank, seed, shuffle)
    if lightning and isinstance(loader, DataLoader) and shuffle is False and \
            not isinstance(loader.sampler, SequentialSampler) and rank == 0:
        warnings.warn("You requested to overfit but enabled train dataloader shuffling. We are turning off the train "
                      "dataloader shuffling for you.")  # (Lightning's words; the order is then sequential)
    if lightning and world_size == 1 and keeps_sampler is not False and _loader_subclass(loader):
        # Lightning keeps a DataLoader subclass of the user's as it is where it shards nothing: its own __iter__,
        # _get_iterator, attributes run (a loader rebuilt on our order would be a plain DataLoader)
        return _lightning_train_data(loader, world_size, rank, seed, shuffle, distributed=False)
    if lightning and shuffle is False and world_size == 1 and keeps_sampler is not False and \
            isinstance(loader, DataLoader) and not isinstance(loader.dataset, torch.utils.data.IterableDataset):
        # overfit_batches where Lightning shards nothing: its loader as given where its sampler is sequential, else
        # built again with a SequentialSampler (_resolve_overfit_batches); a mid-epoch resume reads the same order
        # again and drops what was trained on (a few batches: overfit_batches limits the epoch)
        return _lightning_train_data(loader, world_size, rank, seed, shuffle, distributed=False)
    if _replaceable(loader):
        order = _order_sampler(loader)
        random = isinstance(order, RandomSampler) or _torchdata_sampler(order, "RandomSampler")
        shuffle = random if shuffle is None else shuffle
        # Lightning under a distributed strategy: a `sampler` that is not torch's Random/SequentialSampler (torchdata's
        # RandomSampler, a StatefulDataLoader(shuffle=True)'s) is wrapped in its DistributedSamplerWrapper
        wrapped = lightning and keeps_sampler is False and shuffle and order is loader.sampler and \
            _torchdata_sampler(order, "RandomSampler")
        sampler = WrappedRandomOrder(order, world_size, rank, seed) if wrapped else \
            ResumableSampler(loader.dataset, world_size, rank, shuffle, seed)
        generator = torch.Generator()
        # the Trainer builds a StatefulDataLoader again as one (Lightning keeps the loader's class); the global
        # position, not its own state, resumes it (the Accelerator's rules are Accelerate's: unchanged)
        kind = type(loader) if lightning and is_stateful_loader(loader) else DataLoader
        data = TrainData(_rebuild(loader, sampler, generator, kind), sampler, generator, seed)
        # each iter() of the user's loader draws its base seed (Lightning's loader too, sharded or not)
        data.draws_base_seed, data.base_generator = True, loader.generator
        # Lightning keeps a RandomSampler where it does not shard (one process, use_distributed_sampler=False): the
        # epoch's permutation is drawn as that sampler draws it (a DistributedSampler's is (seed, epoch)'s)
        keeps = world_size == 1 and (keeps_sampler is None or keeps_sampler)
        # (and the Trainer's torchdata RandomSampler, which draws as torch's does with a generator: randperm(n,
        # generator) each epoch)
        sampler.draws = shuffle and (keeps or wrapped) and (type(order) is RandomSampler or (lightning and random))
        sampler.order_generator = order.generator if sampler.draws else None
        sampler.draws_at_exhaustion = isinstance(order, RandomSampler)  # (torch's; torchdata's draws nothing there)
        data.sets_loader_epoch = lightning
        if lightning and keeps:  # (Lightning's Trainer reads the loader given: trainer.train_dataloader shows it)
            data.given = loader
        return data
    if lightning and isinstance(loader, DataLoader) and not isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return _lightning_train_data(loader, world_size, rank, seed, shuffle, distributed=keeps_sampler is False)
    sampler = _order_sampler(loader) if isinstance(loader, DataLoader) else getattr(loader, "sampler", None)
    # an iterable of the user's (not a DataLoader) with state_dict/load_state_dict: Lightning saves its state in
    # checkpoints and loads it back on a resume; so does the Trainer on one process (its state after each batch)
    own_state = lightning and world_size == 1 and not isinstance(loader, DataLoader) and \
        callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
    if is_stateful_loader(loader) or own_state:
        if world_size > 1 and not isinstance(sampler, DistributedSampler) and \
                isinstance(loader.dataset, torch.utils.data.IterableDataset):
            warnings.warn("The training loader is a StatefulDataLoader over an IterableDataset of your own: the "
                          "Trainer cannot shard it, so make sure each rank reads its own part (e.g. through "
                          "get_worker_info and the rank), or every rank trains on the same samples. Its state is "
                          "saved per rank and resumes on the same number of processes only.")
        data = StatefulLoaderData(loader, sampler if isinstance(sampler, DistributedSampler) else None, seed)
        data.sets_loader_epoch = lightning
        return data
    if world_size > 1 and not isinstance(sampler, DistributedSampler):
        warnings.warn(
            "The training loader has a custom sampler or an IterableDataset without a batch_size, so the Trainer "
            "cannot shard it: make sure each rank reads its own part of the data (e.g. a DistributedSampler), or "
            "every rank trains on the same samples. An IterableDataset with a batch_size is read by rank 0 and "
            "dispatched; a streaming data set made of shards is sharded and resumed exactly as a "
            "tasktrain.data.ShardedStream (docs/data.md)."
        )
    return TrainData(loader, sampler if isinstance(sampler, DistributedSampler) else None, None, seed)


def _lightning_train_data(loader, world_size, rank, seed, shuffle, distributed):
    """A map-style training loader of the user's own order (a sampler or batch sampler of the user's, a RandomSampler
    with replacement or num_samples), as Lightning's Trainer takes it. Where it does not shard (one process,
    use_distributed_sampler=False) the loader is kept, its samplers getting set_epoch(epoch) each epoch; under a
    distributed strategy a loader whose `sampler` is not a DistributedSampler has it replaced: a Random/Sequential
    one (the default one beside a batch_sampler= too) by DistributedSampler(dataset, shuffle=True, seed) (our
    ResumableSampler, which yields the same), any other by DistributedSamplerWrapper(sampler, shuffle=True, seed);
    a custom batch sampler is built again around it. overfit_batches (shuffle=False) reads the dataset in order.

    A resume of such a fit mid-epoch reads and drops the batches already trained on (Lightning's order, our read of
    it; a loader kept as it is draws its order again from the generators' states its pass drew from: `pass_draws`),
    except over a DistributedSampler of ours with a batch size: that one skips ahead on any number of processes; and
    a StatefulDataLoader (rebuilt as one): its own state, saved per rank, resumes it."""
    sampler = loader.sampler
    if shuffle is False and not isinstance(sampler, SequentialSampler):
        sampler = SequentialSampler(loader.dataset)  # (overfit_batches: Lightning's replacement, warned above)
    if distributed and not isinstance(sampler, DistributedSampler):
        shuffle = True if shuffle is None else shuffle
        if isinstance(sampler, (RandomSampler, SequentialSampler)):
            sampler = ResumableSampler(loader.dataset, world_size, rank, shuffle, seed)
        else:
            sampler = DistributedSamplerWrapper(sampler, world_size, rank, shuffle=shuffle, seed=seed)
    if sampler is not loader.sampler:
        loader = _with_sampler(loader, sampler)
    # a StatefulDataLoader (rebuilt as one around the rank's sampler) resumes from its own state, per rank
    sharding = sampler if isinstance(sampler, DistributedSampler) else None
    if is_stateful_loader(loader):
        data = StatefulLoaderData(loader, sharding, seed)
    else:
        data = TrainData(loader, sharding, None, seed)
        # a loader whose order is drawn as the user built it (not sharded by us): a mid-epoch resume draws it again
        data.replays_draws = sharding is None
    data.sets_loader_epoch = True
    return data


def _with_sampler(loader, sampler, predicting=False):
    """The loader built again with `sampler` in place of its `sampler` (a custom batch sampler built around it).
    `predicting`: every sample is predicted (Lightning's predict loaders drop no last batch)."""
    if _users_class(loader):  # (Lightning's _update_dataloader: the user's class, with the user's arguments)
        return build_again(loader, sampler, predicting=predicting)
    batch_sampler = loader.batch_sampler
    # a StatefulDataLoader is built again as one (Lightning's _update_dataloader keeps the loader's class): its own
    # state still resumes it
    kind = type(loader) if is_stateful_loader(loader) else DataLoader
    options = dict(loader_options(loader), **({} if kind is DataLoader else
                                              {"snapshot_every_n_steps": loader.snapshot_every_n_steps}))
    if batch_sampler is None:  # (batch_size=None: items one by one)
        return kind(loader.dataset, batch_size=None, sampler=sampler, **options)
    plain = type(batch_sampler) is BatchSampler or _torchdata_sampler(batch_sampler, "BatchSampler")
    if plain and not predicting:
        return _rebuild(loader, sampler, loader.generator, kind)
    if plain:  # (Lightning's predict loader: every sample predicted, each batch's indices kept)
        batches = type(batch_sampler)(sampler, batch_size=batch_sampler.batch_size, drop_last=False)
    else:
        batches = _batch_sampler_around(batch_sampler, sampler, predicting)
    return kind(loader.dataset, batch_sampler=_IndexBatchSamplerWrapper(batches) if predicting else batches, **options)


def _iterable_predict_loader(loader):
    """A predict loader over an IterableDataset, built again as Lightning's Trainer builds every predict DataLoader
    (its class with the user's arguments, its errors where the class cannot be): no sampler and no index-keeping
    wrapper (an iterable dataset's batches have no indices), nothing sharded."""
    if _users_class(loader):
        return build_again(loader, None, predicting=True)
    kind = type(loader) if is_stateful_loader(loader) else DataLoader
    options = dict(loader_options(loader), **({} if kind is DataLoader else
                                              {"snapshot_every_n_steps": loader.snapshot_every_n_steps}))
    return kind(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, **options)


def _predict_loader(loader, world_size, rank, distributed=None):
    """A map-style predict loader, as Lightning's Trainer takes it (it builds every predict loader again): under a
    distributed strategy (`distributed`; default: several processes), a world of one included, its sampler replaced
    by PredictShardSampler (UnrepeatedDistributedSamplerWrapper: unpadded), shuffling
    where Lightning's test says; its batch sampler built again around it with drop_last=False (a custom one that cannot
    be is kept, with Lightning's warning), inside Lightning's index-keeping wrapper (_IndexBatchSamplerWrapper): the
    loader is built again in every case, as Lightning's."""
    batch_sampler = loader.batch_sampler
    custom = batch_sampler is not None and type(batch_sampler) is not BatchSampler and \
        not _torchdata_sampler(batch_sampler, "BatchSampler")
    if custom and not (hasattr(batch_sampler, "batch_size") and hasattr(batch_sampler, "drop_last")):
        if rank == 0:
            warnings.warn(f"You are using a custom batch sampler `{type(batch_sampler).__qualname__}` for prediction."
                          " Lightning would normally set `drop_last=False` to ensure all samples are returned, but for"
                          " custom samplers it can't guarantee this. Make sure your sampler is configured correctly to"
                          " return all indices.", PossibleUserWarning)
        # (Lightning builds the loader again all the same, around the same batch sampler, its indices kept)
        if _users_class(loader):
            return build_again(loader, None, predicting=True, batch_sampler=batch_sampler)
        kind = type(loader) if is_stateful_loader(loader) else DataLoader
        return kind(loader.dataset, batch_sampler=_IndexBatchSamplerWrapper(batch_sampler), **loader_options(loader))
    sampler = loader.sampler
    distributed = world_size > 1 if distributed is None else distributed
    if distributed and not isinstance(sampler, DistributedSampler):
        sampler = PredictShardSampler(sampler, world_size, rank, shuffle=_is_shuffled(loader))
    # (Lightning builds every predict loader again: a loader of the user's class is, with the user's arguments)
    return _with_sampler(loader, sampler, predicting=True)


def _is_shuffled(loader):
    """Lightning's test of whether an evaluation loader shuffles: the batch sampler's sampler (or the batch sampler
    itself, without one), else the loader's, is a RandomSampler."""
    batch_sampler = loader.batch_sampler
    sampler = loader.sampler if batch_sampler is None else getattr(batch_sampler, "sampler", batch_sampler)
    return isinstance(sampler, RandomSampler) and not isinstance(sampler, SequentialSampler)


_CANNOT_INJECT = (" Lightning can't inject a (distributed) sampler into your batch sampler, because it doesn't "
                  "subclass PyTorch's `BatchSampler`. To mitigate this, either follow the API of `BatchSampler` or set "
                  "`Trainer(use_distributed_sampler=False)`. If you choose the latter, you will be responsible for "
                  "handling the distributed sampling within your batch sampler.")  # (Lightning's words: its users'
# searches find them; "Lightning" is the Trainer here)


def _batch_sampler_around(batch_sampler, sampler, predicting=False):
    """The user's batch sampler built again around `sampler`, as Lightning builds it: its class called with
    (sampler, batch_size=, drop_last= (False when predicting)); one without those attributes, or whose class takes
    them otherwise, is refused (Lightning's error)."""
    if not (hasattr(batch_sampler, "batch_size") and hasattr(batch_sampler, "drop_last")):
        raise TypeError(_CANNOT_INJECT)
    try:
        return type(batch_sampler)(sampler, batch_size=batch_sampler.batch_size,
                                   drop_last=False if predicting else batch_sampler.drop_last)
    except TypeError as error:
        if "__init__() got multiple values" not in str(error):
            raise  # (Lightning lets any other TypeError through as it is)
        raise TypeError(_CANNOT_INJECT) from error


def suggested_max_num_workers(local_world_size):
    """An upper bound for a DataLoader's num_workers: the CPU cores this process may use, shared by the
    `local_world_size` processes of this machine, one left for each main process; at least 1."""
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    return max(1, _num_cpus_available() // local_world_size - 1)


def _num_cpus_available():
    """The CPU cores this process may run on (its affinity where the system says, else all of them); Lightning's
    name for it."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_workers(loader, name, num_devices, reload_every):
    """Lightning's warnings (its data connector's _worker_check) on a loader a run sets up, said by global rank 0:
    workers started by "spawn" each epoch (not persistent), few workers where the machine's cores would allow more
    (the bound utilities.suggested_max_num_workers gives, for `num_devices` processes per machine), and persistent
    pinned workers with loaders reloaded every `reload_every` epochs. `name`: "train_dataloader", "val_dataloader", ..."""
    if not isinstance(loader, DataLoader):
        return
    warn_workers(loader, name, suggested_max_num_workers(num_devices), reload_every)


def warn_workers(loader, name, upper_bound, reload_every):
    """check_workers' warnings, for a DataLoader on a machine that allows `upper_bound` workers
    (tasktrain.trainer.connectors.data_connector._worker_check reaches them by Lightning's signature)."""
    import multiprocessing.context

    # (the loader's own multiprocessing context, else the process's default one: Lightning's test of "spawn")
    spawns = isinstance(loader.multiprocessing_context or multiprocessing.get_context(),
                        multiprocessing.context.SpawnContext)
    if loader.num_workers > 0 and spawns and not loader.persistent_workers:
        warnings.warn(f"Consider setting `persistent_workers=True` in '{name}' to speed up the dataloader worker "
                      "initialization.")
    elif loader.num_workers < 2 and upper_bound > 1:
        warnings.warn(f"The '{name}' does not have many workers which may be a bottleneck. Consider increasing the "
                      f"value of the `num_workers` argument` to `num_workers={upper_bound}` in the `DataLoader` to "
                      "improve performance.", PossibleUserWarning)  # (Lightning's words, its stray backtick too)
    if loader.persistent_workers and loader.pin_memory and reload_every > 0:
        warnings.warn("The combination of `DataLoader(`pin_memory=True`, `persistent_workers=True`) and `Trainer("
                      "reload_dataloaders_every_n_epochs > 0)` can lead to instability due to limitations in PyTorch "
                      "(https://github.com/pytorch/pytorch/issues/91252). We recommend setting `pin_memory=False` in "
                      "this case.", PossibleUserWarning)


def prepare_eval_loader(loader, world_size, rank, prefix=None, shuffle_seed=None, global_rank=None):
    """Shard an evaluation loader without padding (exact metrics); on one process, leave it as it is (a shuffling
    one keeps shuffling, as under Lightning, which warns: `prefix` names the loader, "val", "test" or "predict").
    `shuffle_seed` (given under a distributed strategy, a world of one included): a shuffling validation/test loader
    reads Lightning's DistributedSampler(shuffle=True, seed=shuffle_seed) instead, padded as Lightning's, its epoch set
    by the evaluation run (set_sampler_epoch); a predict loader, PredictShardSampler. Under a distributed strategy a
    world of one is sharded too, as Lightning's (its samplers are DistributedSamplers of one replica: the same order).
    `global_rank` (default `rank`): the rank seed_everything(workers=True)'s worker seeds are mixed with."""
    distributed = world_size > 1 or shuffle_seed is not None
    if prefix is not None and rank == 0 and isinstance(loader, DataLoader) and \
            not isinstance(loader.dataset, torch.utils.data.IterableDataset) and \
            isinstance(_order_sampler(loader), RandomSampler):
        warnings.warn(f"Your `{prefix}_dataloader`'s sampler has shuffling enabled, it is strongly recommended that "
                      "you turn shuffling off for val/test dataloaders.", PossibleUserWarning)
    add_worker_init_fn(loader, rank if global_rank is None else global_rank)  # seed_everything(workers=True)
    if shuffle_seed is not None and prefix in ("val", "test") and _replaceable(loader) and \
            type(loader.sampler) is RandomSampler:  # (batch_size=None too: items one by one, as Lightning's)
        sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=shuffle_seed)
        return _rebuild(loader, sampler, loader.generator)
    if prefix == "predict":
        if not isinstance(loader, DataLoader):
            return loader
        if isinstance(loader.dataset, torch.utils.data.IterableDataset):
            return _iterable_predict_loader(loader)
        if distributed and _replaceable(loader) and type(_order_sampler(loader)) is SequentialSampler and \
                not loader.drop_last:
            # (Lightning's predict sampler whatever the order: an UnrepeatedDistributedSampler, here over the
            # sequential order, the positions EvalShardSampler would take)
            return _with_sampler(loader, PredictShardSampler(loader.sampler, world_size, rank, shuffle=False),
                                 predicting=True)
        return _predict_loader(loader, world_size, rank, distributed)
    if shuffle_seed is not None and isinstance(loader, DataLoader) and \
            not _replaceable(loader) and not isinstance(loader.dataset, torch.utils.data.IterableDataset) and \
            not isinstance(loader.sampler, DistributedSampler):
        # A loader of the user's own order under a distributed strategy (use_distributed_sampler), as Lightning's
        # Trainer takes it: its sampler replaced by one of the rank's part, shuffling where Lightning's test says
        # (_is_shuffled); a custom batch sampler built again around it
        shuffle = _is_shuffled(loader)
        if isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                         seed=shuffle_seed)
        else:
            sampler = DistributedSamplerWrapper(loader.sampler, world_size, rank, shuffle=shuffle, seed=shuffle_seed)
        return _with_sampler(loader, sampler)
    if not distributed or not _replaceable(loader) or type(_order_sampler(loader)) is not SequentialSampler:
        return loader
    if world_size == 1:  # (Lightning's DistributedSampler of one replica: nothing to pad, the loader's order)
        return _rebuild(loader, DistributedSampler(loader.dataset, num_replicas=1, rank=0, shuffle=False),
                        loader.generator)
    return _rebuild(loader, EvalShardSampler(loader.dataset, world_size, rank), loader.generator)


def loader_samplers(loader):
    """The samplers Lightning's set_epoch reaches on a loader: its sampler and its batch sampler's sampler (each
    once; a batch sampler's own set_epoch is not called)."""
    found = {}
    for sampler in (getattr(loader, "sampler", None),
                    getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if sampler is not None:
            found[id(sampler)] = sampler
    return list(found.values())


def set_sampler_epoch(loader, epoch):
    """Lightning's rule at each evaluation run: the loader's samplers that have set_epoch (loader_samplers) get the
    epochs the fit has run (a shuffling DistributedSampler then draws another order each epoch)."""
    for sampler in loader_samplers(loader):
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)


class _RecordingBatchSampler:
    """A batch sampler that keeps the indices of every batch it has given out (in order), for prediction writers."""

    def __init__(self, batch_sampler, seen):
        self.batch_sampler, self.seen = batch_sampler, seen

    def __iter__(self):
        for batch in self.batch_sampler:
            self.seen.append(list(batch))
            yield batch

    def __len__(self):
        return len(self.batch_sampler)


def record_batch_indices(loader):
    """(loader, seen): the same loader, rebuilt so that `seen[i]` holds the dataset indices of its i-th batch.
    A loader without a batch sampler (an IterableDataset, batch_size=None, not a DataLoader) has no indices: it is
    returned as it is, and `seen[i]` is None for each batch."""
    if not isinstance(loader, DataLoader) or loader.batch_sampler is None or \
            isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return loader, _NoIndices()
    if isinstance(loader.batch_sampler, _IndexBatchSamplerWrapper):  # (every predict loader the Trainer prepared)
        return loader, loader.batch_sampler.seen_batch_indices
    seen = []
    recording = _RecordingBatchSampler(loader.batch_sampler, seen)
    if _users_class(loader):  # (the user's class kept, as Lightning's index-tracking batch sampler keeps it)
        return build_again(loader, None, predicting=True, batch_sampler=recording, warn=False), seen
    return DataLoader(loader.dataset, **dict(loader_options(loader), batch_sampler=recording)), seen


class _NoIndices(list):
    def __getitem__(self, i):
        return None


def resume_point(train_state: dict, saved_world_size: int, data: TrainData, world_size: int, accumulate: int):
    """Where a resumed epoch continues on this run: (batch index, samples of the global order to skip, or None
    to skip `batch index` batches of this rank's shard instead).

    `train_state` is the checkpoint's. On an order every process draws alike the position is the number of samples
    consumed; the batch index is the checkpoint's when this run's batches cover the global order in the same steps
    (the same global batch), else it is counted in this run's batches, at the start of an accumulation window. A
    checkpoint written before the sample count existed held per-rank batches of the same size: its count is rebuilt
    from them."""
    batches = int(train_state.get("batch_in_epoch", 0))
    # (an epoch whose data began again at this index, TrainState.data_from_batch: only the batches since were read)
    data_from = int(train_state.get("data_from_batch", 0))
    if not data.resumes_on_any_world_size:
        return batches, None
    per_batch = data.samples_per_batch(world_size)
    samples = train_state.get("samples_in_epoch")
    if samples is None:
        samples = (batches - data_from) * data.loader.batch_size * saved_world_size
    cap = data.num_samples if data.num_samples is not None else float("inf")  # (a stream of unknown length)
    samples = int(min(int(samples), cap))
    if samples == min((batches - data_from) * per_batch, cap):
        return batches, samples
    return data_from + (samples // (per_batch * accumulate)) * accumulate, samples
