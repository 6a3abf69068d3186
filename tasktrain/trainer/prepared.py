"""The prepared loader: one class over every kind of training data, for the Accelerator's prepare() (and the
DataLoaderDispatcher built by hand).

    loader = PreparedDataLoader(data, accelerator)   # data: a TrainData kind (tasktrain/trainer/data.py)
    for batch in loader:                             # this rank's batches on the device, counted
        ...
    accelerator.save_state(...)                      # loader.state_dict(): the position, one shape for every kind

The kinds say how an epoch is ordered, skipped and cut over the processes: the Trainer's order of (seed, epoch) and
loaders of the user's own order, a ShardedStream and a StatefulDataLoader (data.py), Accelerate's batch order of a
map-style DataLoader (shard.py), one process reading for all and an IterableDataset cut by global batch
(dispatch.py, whose DataLoaderDispatcher and IterableShardLoader are this class under Accelerate's names). The epoch's
bookkeeping (the position, the resumed pass's skip, the read-ahead that tells the last batch, every resume error)
is the EpochIterator's (epoch.py), which the Trainer's loop reads its data through too.
"""
import torch

from tasktrain.strategies.watchdog import watched_batches
from tasktrain.trainer.data import ResumableSampler, StatefulLoaderData, prepare_train_data, samples_per_step
from tasktrain.trainer.epoch import DataPosition, EpochIterator
from tasktrain.trainer.run_state import check_global_batch
from tasktrain.trainer.shard import ShardData


class PreparedDataLoader:
    """This rank's part of the loader (a TrainData kind), reshuffled every epoch where the kind draws its order from
    (seed, epoch), batches moved to the device, and counted so that save_state/load_state resume mid-epoch. The
    counting, the resumed epoch's skip and the resume checks are the epoch iterator's (tasktrain/trainer/epoch.py),
    the Trainer's too.

    `accelerator` None: built by hand (DataLoaderDispatcher(...)): `world` (a strategy, or torch.distributed's
    default group) moves the batches and tells the processes."""

    def __init__(self, data, accelerator, source=None, world=None):
        self._accelerator = accelerator
        self._world = world if world is not None else accelerator.strategy
        self._source = source  # the user's loader
        self.position = DataPosition()  # the epoch the next iteration runs, and how far into it
        self._use(data)
        self.at_last_batch = False
        self._skip_pending = 0  # skip_first_batches for the next iteration: len() is shorter by it
        self._pass_skip = 0  # ... for the iteration in flight
        self._pass_start = 0  # batch index the iteration in flight started at (its layout's first step)
        self._step_index = -1  # index, in the iteration in flight, of the batch last yielded

    def _use(self, data):
        self._data = data  # TrainData
        self.length = len(data) if data.has_len() else None  # batches of a whole epoch
        # the shards of the data: a sliced kind cuts its global batches for its processes; the others are sharded
        # over the data-parallel ranks (issue 39: tensor-parallel peers read the same batches)
        self._shards = data.num_processes if data.sliced else self._world.data_parallel_size
        self._epochs = EpochIterator(data, self._shards, self.length, self.position)

    @property
    def epoch(self):
        """The epoch the next full iteration runs (counts completed iterations)."""
        return self.position.epoch

    @property
    def batches_seen(self):
        """Batches of the current epoch yielded so far, skipped ones included."""
        return self.position.batch_in_epoch

    @property
    def epoch_length(self):
        """Batches of the epoch being iterated (a resumed one: those done + those left); None without a length."""
        return self._epochs.length

    @property
    def num_processes(self):
        return self._shards

    @property
    def process_index(self):
        return self._world.global_rank

    @property
    def base_dataloader(self):
        return self._data.loader

    @property
    def dataset(self):
        return self._data.loader.dataset

    @property
    def batch_size(self):
        return self._data.loader.batch_size

    @property
    def sampler(self):
        return self.get_sampler()

    def __len__(self):
        """This rank's batches of an epoch; after skip_first_batches(loader, n), n fewer for that iteration."""
        if self.length is None:
            raise TypeError("this prepared loader has no length (its dataset is iterable)")
        return max(0, self.length - (self._skip_pending or self._pass_skip))

    @property
    def batch_sampler(self):
        """Accelerate's BatchSamplerShard surface on a map-style loader (`batch_sampler.batch_sampler` is the
        user's, `batch_sampler.even_batches` ...); else the loader's own batch sampler."""
        if isinstance(self._data, ShardData):
            return self._data.shard_sampler
        return self._data.loader.batch_sampler

    def get_sampler(self):
        """The sampler of the user's batch sampler (the order's source)."""
        if isinstance(self._data, ShardData):
            return self._data.user_sampler
        return self._data.loader.sampler

    def set_sampler(self, sampler):
        """Draw the order from `sampler` from the next iteration on (as Accelerate's set_sampler)."""
        if not isinstance(self._data, ShardData):
            raise TypeError("set_sampler: this prepared loader's order is not drawn from a sampler of a map-style "
                            "DataLoader.")
        data = self._data
        data.user_batch_sampler.sampler = data.user_sampler = sampler
        generator = getattr(sampler, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in data.generators):
            data.generators.append(generator)

    @property
    def iteration(self):
        """The epoch the next iteration runs (Accelerate's DataLoaderShard.iteration)."""
        return self.position.epoch

    @iteration.setter
    def iteration(self, value):
        self.set_epoch(value)

    @property
    def end_of_dataloader(self):
        """True while the last batch of the iteration is being used (and after it, until the next iteration), as
        Accelerate's DataLoaderShard.end_of_dataloader (GradientState reads it)."""
        return self.at_last_batch

    @property
    def total_batch_size(self):
        """Samples of one global batch: all processes' batches together (the batch size under split_batches)."""
        data = self._data
        if isinstance(data, ShardData) or data.sliced:
            return data.total_batch_size
        return samples_per_step(data.loader.batch_size, self._shards)

    @property
    def total_dataset_length(self):
        dataset = self.dataset
        return getattr(dataset, "total_length", None) or len(dataset)

    @property
    def remainder(self):
        """Real samples of the epoch's last global batch (the dataset's length modulo the total batch size), as
        Accelerate's GradientState.remainder: -1 when not applicable (drop_last, no length, no batch size). A sliced
        kind (dispatched, an IterableDataset cut by global batch) tells it as its pass goes."""
        if self._data.sliced:
            return self._data.remainder
        total = self.total_batch_size
        drop_last = self._data.drop_last if isinstance(self._data, ShardData) else self._data.loader.drop_last
        if total is None or drop_last:
            return -1
        try:
            return self.total_dataset_length % total
        except TypeError:
            return -1

    def set_epoch(self, epoch):
        self.position.epoch = int(epoch)

    def skip(self, num_batches):
        """The next iteration starts `num_batches` batches into this rank's shard (skip_first_batches)."""
        self._epochs.skip(num_batches)
        self._skip_pending = max(0, int(num_batches))

    def __iter__(self):
        accelerator, epochs = self._accelerator, self._epochs
        length = epochs.begin(self.position.epoch)
        start = self.position.batch_in_epoch
        self._pass_skip, self._skip_pending, self._pass_start = self._skip_pending, 0, start
        self._step_index = -1
        self.at_last_batch = length is not None and start >= length
        watchdog = None
        if accelerator is not None:
            if accelerator._rng_types and accelerator.use_distributed:
                accelerator._synchronize_rng_states()
            accelerator._active_loaders.append(self)
            # watchdog (issue 19): the loop over this loader is watched; each batch is progress, the first may take
            # long
            watchdog = accelerator._watchdog
            if watchdog is not None:
                watchdog.arm(accelerator.stall_timeout)
        place = accelerator._place_batch if accelerator is not None else self._world.move_batch
        data = self._data if self._data.sliced else None  # a sliced kind knows its last step as it reads it
        try:
            for index, batch, last in watched_batches(watchdog, epochs.batches(ahead=True), "the loop's body", _no_step, start):
                epochs.advance(index)  # counted before the body runs: a save_state inside it resumes after it
                self.at_last_batch = last or (length is not None and index + 1 >= length) or \
                    (data is not None and data.is_last(index - start))
                self._step_index = index - start
                yield place(batch)
            epochs.end_epoch()
            self._pass_skip = 0
        finally:
            if watchdog is not None:
                watchdog.disarm()
            if accelerator is not None and self in accelerator._active_loaders:
                accelerator._active_loaders.remove(self)

    # -- for gather_for_metrics ---------------------------------------------------------------------------------------
    def shard_step(self):
        """(every rank's batch size, real samples) of the step of the batch last yielded, where every rank knows the
        step's layout (Accelerate's order, tasktrain/trainer/shard.py; a sliced kind, dispatch.py); else None."""
        data, index = self._data, self._step_index
        if isinstance(data, ShardData):
            if not 0 <= index < len(data.steps):
                return None
            batches, real = data.steps[index]
            return [0 if batch is None else len(batch) for batch in batches], real
        return data.step_layout(index) if index >= 0 else None

    @property
    def current_batch_size(self):
        """Samples in the batch last yielded, on every rank alike (the shards are padded to equal length)."""
        if self._data.sliced:
            step = self.shard_step()
            return None if step is None else step[0][0]
        counts, batch_size = self._iteration_counts(), self._data.loader.batch_size
        if counts is None or batch_size is None:
            return None
        if self.at_last_batch and self.length is not None and not self._data.loader.drop_last:
            # of this iteration (a resumed one shards what was left of the epoch)
            return counts.iteration_samples - (counts.iteration_samples - 1) // batch_size * batch_size
        return batch_size

    def repeated_in_batch(self):
        """How many samples of the current (gathered) batch repeat others only to even out the shards."""
        if self._data.sliced:
            step = self.shard_step() if self.at_last_batch else None
            return 0 if step is None else sum(step[0]) - step[1]
        counts = self._iteration_counts()
        if not self.at_last_batch or counts is None:
            return 0
        batch_size = self._data.loader.batch_size
        if self._data.loader.drop_last and counts.iteration_samples % batch_size:
            return 0  # the padded sample was in the dropped partial batch
        return counts.iteration_padding

    @property
    def interleaved(self):
        """Rank r's batch holds positions r, r + W, ... of the global batch (the map-style order), else a run of
        consecutive positions (a ShardedStream, a sliced kind: rank 0's run first)."""
        return self._data.interleaved

    def _iteration_counts(self):
        """What holds this iteration's samples and padding (None: a loader whose order is its own)."""
        if self._data.kind == "stream":
            return self._data
        sampler = self._data.sampler
        return sampler if isinstance(sampler, ResumableSampler) else None

    # -- resume ------------------------------------------------------------------------------------------------------
    def _position_batch_size(self):
        """The batch size the position is counted in: the user's loader's (before any cut into slices)."""
        data = self._data
        return data.batch_size if isinstance(data, ShardData) or data.sliced else data.loader.batch_size

    def state_dict(self):
        """The data position, one shape for every kind: the epoch, the batches of it yielded, the samples of the
        epoch's order consumed by all processes together (None where the order is the loader's own: then only the
        same number of processes can continue it), what the batches were counted in (world_size, batch_size,
        split_batches, accumulation) and the kind. Accelerate's order adds the generators that draw it again
        (order_state), a StatefulDataLoader every rank's own state (loader_states)."""
        position, data = self.position, self._data
        epoch, seen = position.epoch, position.batch_in_epoch
        samples = position.samples_in_epoch if data.resumes_on_any_world_size else None
        in_flight = seen > 0
        if in_flight and (self.at_last_batch or (self.epoch_length is not None and seen >= self.epoch_length)):
            epoch, seen, samples = epoch + 1, 0, 0  # saved after the last batch, before the loop ended
            in_flight = False
        accelerator = self._accelerator
        state = {"kind": data.kind, "epoch": epoch, "batches_seen": seen, "samples_seen": samples,
                 "world_size": self._shards, "batch_size": self._position_batch_size(),
                 "split_batches": bool(data.split_batches),
                 "accumulation": accelerator.gradient_accumulation_steps if accelerator is not None else 1}
        if isinstance(data, ShardData):
            # Accelerate's order: the generators at the epoch's start draw it again on a resume (any world size)
            state["order_state"] = data.order_state(started=in_flight)
        if isinstance(data, StatefulLoaderData):  # a StatefulDataLoader's own state: every rank's, in order
            state["loader_states"] = self._world.all_gather_object(data.loader_state(seen))
        return state

    def load_state_dict(self, state):
        accelerator, world = self._accelerator, self._world
        state = _one_shape(state)
        if isinstance(self._data, ShardData) and "order_state" not in state and self._source is not None:
            # Saved before issue 26, when prepared loaders interleaved samples from a (seed, epoch) order: the run
            # continues in that order, so that it reaches the weights it would have reached.
            self._use(prepare_train_data(self._source, world.data_parallel_size, world.data_parallel_rank,
                                         accelerator._data_seed))
        data = self._data
        self.position.epoch = int(state["epoch"])
        self.at_last_batch = False
        seed = accelerator._data_seed if accelerator is not None else None
        if seed is not None:
            data.seed = seed
            if data.sampler is not None and hasattr(data.sampler, "seed"):
                data.sampler.seed = seed
        shards = self._shards
        saved_world = int(state.get("world_size", shards))
        position = {"batch_in_epoch": int(state["batches_seen"]), "kind": state.get("kind")}
        for key in ("batch_size", "split_batches"):
            if key in state:
                position[key] = state[key]
        if state.get("samples_seen") is not None:
            position["samples_in_epoch"] = int(state["samples_seen"])
        accumulate = accelerator.gradient_accumulation_steps if accelerator is not None else 1
        batch, split = self._position_batch_size(), bool(data.split_batches)
        self._epochs.resume(position, saved_world, accumulate, source="This loader's state", epoch_name="an epoch",
                            world=shards, owner="accelerator", now=(batch, split))
        if isinstance(data, ShardData) and state.get("order_state") is not None:
            data.restore(state["order_state"])
            data.resumed_mid_epoch = self.position.batch_in_epoch > 0
        states = state.get("loader_states")
        if isinstance(data, StatefulLoaderData) and states is not None and len(states) == shards:
            data.load_loader_state(states[world.global_rank])  # (another world: refused above)
        saved_accumulate = int(state.get("accumulation", accumulate))  # (not recorded before format 2: the same)
        saved_global = (samples_per_step(state.get("batch_size"), saved_world, state.get("split_batches")) or 0) * \
            saved_accumulate
        global_batch = (data.samples_per_batch(shards) or 0) * accumulate
        if world.global_rank == 0:
            check_global_batch("This loader", saved_global, global_batch, shards, batch, accumulate,
                               self.position.samples_in_epoch)


def _one_shape(state):
    """A loader state written before the position had one shape: a dispatched or sharded-by-global-batch loader's
    counted the reader's batches consumed (`reader_batches`), which is the samples of its order for a dispatched
    one."""
    if "reader_batches" not in state:
        return state
    state = dict(state)
    consumed, batch_size = int(state.pop("reader_batches")), state.get("batch_size")
    if state.get("kind") == "dispatched" and batch_size:
        state["samples_seen"] = consumed * batch_size
    return state


def _no_step():
    """The optimizer step a prepared loader's watchdog reports: not known to the loader."""
    return -1
