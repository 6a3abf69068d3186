"""The Accelerator's shard of a map-style DataLoader, in Accelerate's order (issue 26).

The Trainer interleaves single samples over the ranks (tasktrain/trainer/data.py); the Accelerator's prepared
loaders follow Accelerate instead, so that a script moved from Accelerate sees the same batches on every rank and
trains the same weights:

- The order of an epoch is the user's own batch sampler, iterated as the plain DataLoader iterates it, with the
  same generator: on one process a prepared loader yields exactly the plain DataLoader's batches. A shuffling
  sampler without a generator gets one, seeded once from the data seed (rank 0's, or DataLoaderConfiguration's
  data_seed). On several processes every generator of the order is rank 0's at the start of each epoch, so every
  rank draws the same sequence of batches: the *global batches* of the epoch.
- split_batches=False: rank r of W takes global batches r, r + W, r + 2W, ... (one step of the loop covers W of
  them). split_batches=True: every global batch is cut into W slices, rank r takes the r-th.
- The tail (on several processes; one process reads the user's batches as they are): drop_last drops what does not fill a step; even_batches=True completes the last step with the first
  samples of the epoch, so every rank has the same number of full batches; even_batches=False leaves the tail as
  it is (ranks may have fewer batches, or a shorter last one).

Every rank computes the whole layout of the epoch (`steps`: each rank's batch of each step), so each knows the
batch sizes of the others and how many samples of the last step are real: gather_for_metrics drops exactly the
padding, and gathers batches of uneven sizes.

Resume on any number of processes: the generators' states at the start of the epoch are saved with the position
(samples of the epoch's global batches consumed); a resume sets them back, draws the same epoch order, drops the
samples consumed and shards the rest over the processes it has now.
"""
import copy
import math

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from tasktrain.trainer.data import TrainData, loader_options, samples_per_step


class SeedableRandomSampler(RandomSampler):
    """A RandomSampler whose permutation of each epoch is a function of (seed, epoch): its generator is seeded with
    `data_seed + epoch` at the start of each iteration (DataLoaderConfiguration(use_seedable_sampler=True), as
    Accelerate's). Without data_seed the seed is torch's initial seed of this process. `set_epoch` chooses the
    epoch; an iteration that ends moves it to the next one."""

    def __init__(self, *args, data_seed=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial_seed = int(data_seed) if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self):
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int):
        self.epoch = int(epoch)


def check_split(batch_size, num_processes):
    """split_batches cuts every batch into one slice per process: the batch size must divide evenly."""
    if batch_size is None or batch_size % num_processes:
        raise ValueError(f"split_batches=True cuts every batch of the DataLoader into {num_processes} equal slices "
                         f"(one per process), so its batch size ({batch_size}) must be a multiple of the number of "
                         f"processes ({num_processes}): change batch_size, or use split_batches=False (every "
                         "process then reads whole batches).")


def layout(rest, first, num_processes, batch_size, split_batches, even_batches, drop_last, one_as_is=True):
    """The steps of an epoch from its global batches `rest` (what is left of the epoch) and `first` (the epoch's
    first batches, for the refill): a list of (batches, real) where batches[r] is rank r's batch of the step (None:
    rank r has none in it) and real is the number of samples of the step that are not refills.

    `batch_size` None: the batches have sizes of their own (a batch sampler of the user's), and a refill is made of
    whole batches. one_as_is: one process reads the batches as they are (the prepared loaders, as Accelerate's
    prepare_data_loader); False: the refill rules apply to one process too (Accelerate's BatchSamplerShard)."""
    world = num_processes
    if world == 1 and one_as_is:  # one process reads the user's batches as they are (Accelerate leaves such a loader unsharded)
        return [([list(batch)], len(batch)) for batch in rest]
    if split_batches:
        return _layout_split(rest, first, world, batch_size, even_batches, drop_last)
    steps = []
    complete = len(rest) // world
    if complete and batch_size is not None and len(rest[complete * world - 1]) != batch_size:
        complete -= 1  # a step is yielded once its last batch is full (the epoch's short one is in the tail)
    for step in range(complete):
        batches = list(rest[step * world:(step + 1) * world])
        steps.append((batches, sum(len(b) for b in batches)))
    tail = list(rest[complete * world:])
    if not tail or drop_last:
        return steps
    real = sum(len(b) for b in tail)
    if not even_batches:
        steps.append((tail + [None] * (world - len(tail)), real))
        return steps
    if batch_size is None:  # whole batches of the epoch's start, in turn
        pool = [list(b) for b in first[:world]]
        while pool and len(pool) < world:
            pool += pool
        batches = [list(b) for b in tail] + pool[:world - len(tail)]
        steps.append((batches, real))
        return steps
    pool = [i for b in first[:world] for i in b]
    while pool and len(pool) < world * batch_size:
        pool += pool
    batches = [list(b) for b in tail]
    used = 0
    if len(batches[-1]) < batch_size:  # the short last batch, completed with the epoch's first samples
        used = batch_size - len(batches[-1])
        batches[-1] = batches[-1] + pool[:used]
    while len(batches) < world:
        batches.append(pool[used:used + batch_size])
        used += batch_size
    steps.append((batches, real))
    return steps


def _layout_split(rest, first, world, batch_size, even_batches, drop_last):
    piece = batch_size // world
    steps = []
    for batch in rest:
        batch = list(batch)
        if len(batch) == batch_size:
            steps.append(([batch[r * piece:(r + 1) * piece] for r in range(world)], batch_size))
            continue
        # the epoch's short last batch (a batch sampler with drop_last has none)
        if drop_last:
            break
        real = len(batch)
        if even_batches:
            pool = list(first[0]) if first else []
            while pool and len(pool) < batch_size:
                pool += pool
            batch = batch + pool
            steps.append(([batch[r * piece:(r + 1) * piece] for r in range(world)], real))
        else:
            steps.append(([batch[r * piece:(r + 1) * piece] if len(batch) > r * piece else None
                           for r in range(world)], real))
        break
    return steps


class ShardData(TrainData):
    """This rank's part of a map-style DataLoader in Accelerate's order (see the module's docstring), with the
    TrainData surface the epoch iterator drives: set_epoch, skip (this rank's batches) and skip_samples (samples
    of the epoch's global order), and the counts of a resume on any number of processes."""

    kind = "shard"

    def __init__(self, loader, num_processes, rank, seed, *, split_batches=False, even_batches=True,
                 use_seedable_sampler=False, broadcast=None):
        if loader.batch_sampler is None:
            raise ValueError("This DataLoader has no batch sampler (batch_size=None): the Accelerator shards a "
                             "map-style DataLoader by its batches; give it batch_size or batch_sampler.")
        self.num_processes, self.rank = int(num_processes), int(rank)
        self.split_batches, self.even_batches = bool(split_batches), bool(even_batches)
        self._broadcast = broadcast
        # The user's batch sampler and sampler are copied (their own DataLoader keeps working as it was); the
        # generators stay the same objects, so the draws are those of the plain DataLoader.
        self.user_batch_sampler = copy.copy(loader.batch_sampler)
        self.batch_size = getattr(self.user_batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(self.user_batch_sampler, "drop_last", False))
        if self.split_batches:
            check_split(self.batch_size, self.num_processes)
        sampler = getattr(self.user_batch_sampler, "sampler", None)
        if sampler is not None:
            sampler = copy.copy(sampler)
            if use_seedable_sampler and type(sampler) is RandomSampler:
                sampler = SeedableRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                                num_samples=sampler._num_samples, generator=sampler.generator,
                                                data_seed=seed)
            elif getattr(sampler, "generator", False) is None:
                # a shuffling sampler without a generator would draw from the global random state each epoch: one
                # of its own, seeded once, makes the order the same on every rank and reproducible on a resume
                sampler.generator = torch.Generator()
                sampler.generator.manual_seed(int(seed))
            self.user_batch_sampler.sampler = sampler
        self.user_sampler = sampler
        self.generators = []
        for generator in (loader.generator, getattr(sampler, "generator", None)):
            if isinstance(generator, torch.Generator) and all(generator is not g for g in self.generators):
                self.generators.append(generator)
        self.epoch_start_states = None  # the generators at the start of the epoch in flight (None: not started)
        self._restored = None  # states loaded by a resume, applied at the next iteration's start
        self.resumed_mid_epoch = False  # the next iteration continues an epoch that load_state resumed
        self._skip_batches = 0  # global batches of the epoch to skip at the next iteration
        self._skip_samples = None  # or samples of the epoch's global order
        self.steps = []  # the layout of the iteration in flight
        self.epoch = 0
        shard_sampler = _ShardBatchSampler(self)
        super().__init__(DataLoader(loader.dataset, **loader_options(loader), batch_sampler=shard_sampler), None, None,
                         seed)
        self.shard_sampler = shard_sampler

    # -- the order ----------------------------------------------------------------------------------------------------
    @property
    def _plain(self):
        """torch's own BatchSampler: its batches are runs of the sampler's order, so a resume can start anywhere."""
        return type(self.user_batch_sampler) is BatchSampler and self.batch_size is not None

    @property
    def resumes_on_any_world_size(self) -> bool:
        """The epoch's order can be drawn again (a sequential sampler, or one drawing from generators saved at the
        epoch's start) and its batches have a size, so a resume on other processes continues it exactly."""
        if self.batch_size is None:
            return False
        return isinstance(self.user_sampler, (SequentialSampler, SeedableRandomSampler)) or bool(self.generators)

    @property
    def num_samples(self):
        return len(self.loader.dataset) if self.resumes_on_any_world_size else None

    def samples_per_batch(self, world_size):
        """Samples of the global order one step covers on every rank together."""
        return samples_per_step(self.batch_size, world_size, self.split_batches)

    @property
    def total_batch_size(self):
        return self.samples_per_batch(self.num_processes)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
        for owner in (self.user_batch_sampler, self.user_sampler):
            if owner is not None and hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)
                return
        dataset = self.loader.dataset
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)

    def skip(self, num_batches: int):
        """Start the next iteration `num_batches` of this rank's batches in (the same steps on every rank)."""
        steps = max(0, int(num_batches))
        self._skip_batches, self._skip_samples = steps * (1 if self.split_batches else self.num_processes), None

    def skip_samples(self, num_samples: int):
        self._skip_batches, self._skip_samples = 0, max(0, int(num_samples))

    def restore(self, states):
        """The generators' states at the start of the epoch to resume (from state_dict's `order_state`)."""
        self._restored = states

    def order_state(self, started):
        """What regenerates the order of the epoch: the generators at its start (`started`: the epoch is in
        flight, else the next epoch starts from their current state)."""
        if started and self.epoch_start_states is not None:
            return list(self.epoch_start_states)
        return [g.get_state() for g in self.generators]

    def __iter__(self):
        restored, self._restored = self._restored, None
        if restored is not None and len(restored) == len(self.generators):
            for generator, state in zip(self.generators, restored):
                generator.set_state(state)
        elif self.num_processes > 1 and self._broadcast is not None:
            # every rank draws the epoch from rank 0's generators (Accelerate's rng_types "generator")
            for generator in self.generators:
                generator.set_state(self._broadcast(generator.get_state()))
        self.epoch_start_states = [g.get_state() for g in self.generators]
        self.steps = []
        resumed, self.resumed_mid_epoch = self.resumed_mid_epoch, False
        if resumed and self.loader.generator is None:
            # A DataLoader without a generator draws its workers' base seed from the global random state when an
            # iteration starts. The uninterrupted run drew it at the epoch's start, before the state a resume
            # restores (load_state): drawing it again would shift every later draw (dropout ...).
            state = torch.get_rng_state()
            iterator = iter(self.loader)
            torch.set_rng_state(state)
            return iterator
        return iter(self.loader)

    # -- the layout ---------------------------------------------------------------------------------------------------
    def epoch_steps(self):
        """Draw the epoch's global batches (as the plain DataLoader would), skip what a resume consumed, lay out the
        rest: called once per iteration, when its first batch is read."""
        skip_batches, self._skip_batches = self._skip_batches, 0
        skip_samples, self._skip_samples = self._skip_samples, None
        world, size = self.num_processes, self.batch_size
        if self._plain:
            order = list(self.user_batch_sampler.sampler)
            batches = _chunks(order, size, self.drop_last)
            if skip_samples:
                rest = _chunks(order[skip_samples:], size, self.drop_last)
            else:
                rest = batches[skip_batches:]
        else:
            batches = [list(b) for b in self.user_batch_sampler]
            start = skip_batches
            if skip_samples:
                seen = 0
                for start, batch in enumerate(batches):
                    if seen >= skip_samples:
                        break
                    seen += len(batch)
                else:
                    start = len(batches)
            rest = batches[start:]
        first = batches[:1] if self.split_batches else batches[:world]
        self.steps = layout(rest, first, world, size, self.split_batches, self.even_batches, self.drop_last)
        return self.steps

    def _sizes(self, num_samples):
        """Dummy global batches of the epoch's sizes (all of them, those left after `num_samples`), for counts."""
        if self._plain:
            n = len(self.user_batch_sampler.sampler)
            whole = _chunks(range(n), self.batch_size, self.drop_last)
            return whole, _chunks(range(max(0, n - num_samples)), self.batch_size, self.drop_last)
        count, size = len(self.user_batch_sampler), self.batch_size or 1
        whole = [range(size)] * count
        return whole, whole[math.ceil(num_samples / size):]

    def rank_batches(self, num_samples=0, rank=None):
        """Batches of `rank` (default: this one) in an epoch started `num_samples` into its global order."""
        rank = self.rank if rank is None else rank
        whole, rest = self._sizes(num_samples)
        first = whole[:1] if self.split_batches else whole[:self.num_processes]
        steps = layout(rest, first, self.num_processes, self.batch_size, self.split_batches, self.even_batches,
                       self.drop_last)
        return sum(1 for batches, _ in steps if batches[rank] is not None)

    def __len__(self):
        return self.rank_batches(0)

    def batches_from(self, num_samples: int):
        return self.rank_batches(num_samples) if self.resumes_on_any_world_size else None


class _ShardBatchSampler:
    """The rebuilt DataLoader's batch sampler: this rank's batches of the epoch's layout. Its attributes are
    Accelerate's BatchSamplerShard's (`batch_sampler`: the user's, `even_batches`, `split_batches`, ...)."""

    def __init__(self, data):
        self.data = data

    @property
    def batch_sampler(self):
        return self.data.user_batch_sampler

    @property
    def sampler(self):
        return self.data.user_sampler

    @property
    def even_batches(self):
        return self.data.even_batches

    @even_batches.setter
    def even_batches(self, value):  # read when the next iteration lays out its epoch
        self.data.even_batches = bool(value)

    @property
    def split_batches(self):
        return self.data.split_batches

    @property
    def num_processes(self):
        return self.data.num_processes

    @property
    def process_index(self):
        return self.data.rank

    @property
    def drop_last(self):
        return self.data.drop_last

    @property
    def batch_size(self):
        data = self.data
        if data.batch_size is None:
            return None
        return data.batch_size // data.num_processes if data.split_batches else data.batch_size

    def __iter__(self):
        rank = self.data.rank
        for batches, _ in self.data.epoch_steps():
            if batches[rank] is not None:
                yield batches[rank]

    def __len__(self):
        return len(self.data)


def _chunks(order, size, drop_last):
    order = list(order)
    batches = [order[i:i + size] for i in range(0, len(order), size)]
    if drop_last and batches and len(batches[-1]) < size:
        batches.pop()
    return batches


def can_shard(loader) -> bool:
    """A map-style torch DataLoader with a batch sampler: the Accelerator's prepared loader in Accelerate's order."""
    from tasktrain.data import ShardedStream
    from tasktrain.trainer.data import is_stateful_loader

    return (type(loader) is DataLoader and loader.batch_sampler is not None
            and not isinstance(loader.dataset, (torch.utils.data.IterableDataset, ShardedStream))
            and not is_stateful_loader(loader))
