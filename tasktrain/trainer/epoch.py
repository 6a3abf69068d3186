"""The epoch iterator: one pass over a training loader, counted and resumable, for the Trainer and the Accelerator.

The Trainer's loop (`loop.train_epoch`) and the Accelerator's prepared loaders (`PreparedDataLoader`, prepared.py,
whatever the kind of data: sharded by sampler, a stream, dispatched from rank 0, an IterableDataset cut by global
batch) all read their training data through an `EpochIterator`, so the bookkeeping of an epoch exists once:

    it = EpochIterator(train_data, shard_world_size, length, position)
    num_batches = it.begin(epoch)          # set_epoch, the resumed epoch's skip, this pass's length
    it.start_pass()                        # (the Trainer's) iter() now, where Lightning's loop calls it
    for index, batch, last in it.batches():    # read one ahead when the loader has no length
        ...                                # train on it
        it.advance(index)                  # batches and samples of the epoch's global order consumed
    it.end_epoch()                         # the next epoch starts at its first batch

`position` is any object with `epoch`, `batch_in_epoch` and `samples_in_epoch` (the Trainer's TrainState, or the
prepared loader's own `DataPosition`): the iterator writes the counts there, its owner saves them. A resume
(`resume`) turns a saved position into this run's: on the Trainer's own order (tasktrain.trainer.data) the
samples consumed are skipped without loading them, on any number of processes; on a loader with an order of its
own, this rank's batches are skipped, which only the same number of processes can do (else an error, before
training). Every error of a resume in the middle of an epoch is here (`check_resume`). Accumulation windows (`window`)
are counted from the position in the epoch, the same for both.
"""
import itertools
import warnings
from dataclasses import asdict, dataclass

from tasktrain.profilers import profiled_iter
from tasktrain.trainer.data import _END, TrainData, read_ahead, resume_point


def _profiled_next(iterator, profiler, name):
    with profiler.profile(name):
        return next(iterator, _END)


@dataclass
class DataPosition:
    """Where an epoch of a loader is: the epoch, the batches of it trained on, and the positions of its global order
    consumed by all ranks together (what a resume on another number of processes skips)."""

    epoch: int = 0
    batch_in_epoch: int = 0
    samples_in_epoch: int = 0

    def state_dict(self) -> dict:
        return asdict(self)


class EpochIterator:
    """One epoch of `data` (a TrainData: this rank's shard of the loader) at a time; see the module's docstring.

    `world_size` is the number of shards of the global order (1 when each rank reads the loader as given);
    `length` the batches of a whole epoch (limit applied), None when the loader has none."""

    def __init__(self, data: TrainData, world_size: int, length, position):
        self.data, self.world_size, self.full_length, self.position = data, world_size, length, position
        self.length = length  # batches of the pass in flight (a resumed epoch: those done + those left)
        self._resume = None  # (batch index, samples of the global order or None): where the next pass starts
        self._per_batch = data.samples_per_batch(world_size) or 0
        self._samples_base = 0
        self._samples_cap = data.num_samples or float("inf")
        self._begun = None  # the epoch begin() set the position of, before its pass was started (start_pass)
        self._begun_resume = None  # the resume that early begin() applied
        self._started = None  # a pass whose iterator was made ahead of its batches (start_pass)

    # -- one pass ---------------------------------------------------------------------------------------------------
    def begin(self, epoch):
        """Start a pass over `epoch` at the position (a resumed one: where it stopped); returns its batch count."""
        if self._begun == epoch:  # (begun already, before its pass was started: the resumed position stands)
            self._begun = None
            return self.length
        data, position = self.data, self.position
        position.epoch = epoch
        data.set_epoch(epoch)
        start, skip_samples = self._resume if self._resume is not None else (0, None)
        self._resume = None
        length = self.full_length
        left = data.batches_from(skip_samples) if skip_samples is not None and length is not None else None
        if left is not None:  # (None: a loader without a length, limited by limit_train_batches: the limit stands)
            length = min(length, start + left)  # what is left, in this run's batches
        # an epoch whose data began again from the loader's first batch at this index (TrainState.data_from_batch:
        # Lightning's restart inside an epoch): the batches read since then are skipped, the indices go on
        data_from = getattr(position, "data_from_batch", 0)
        if length is None or start < length:  # (a skip applies to the next iteration: only if there is one)
            if skip_samples is not None:
                data.skip_samples(skip_samples)
            elif start > data_from:
                data.skip(start - data_from)
        position.batch_in_epoch = start
        # samples consumed after batch i = base + (i + 1) x per batch
        consumed = skip_samples if skip_samples is not None else (start - data_from) * self._per_batch
        self._samples_base = consumed - start * self._per_batch
        position.samples_in_epoch = min(self._samples_cap, consumed)
        self.length = length
        return length

    def skip(self, num_batches):
        """The next pass starts `num_batches` batches into this rank's shard (a pending resume at that batch keeps its
        samples; one elsewhere, e.g. at 0 after loading a folder without positions, gives way to the skip)."""
        pending = self._resume
        samples = pending[1] if pending is not None and pending[0] == int(num_batches) else None
        self._resume = (int(num_batches), samples)
        self.position.batch_in_epoch = int(num_batches)

    def keep_resume_of(self, other):
        """The resume pending on `other` (the iterator of the loader this one replaces) applies to this one (also one
        that `other` began already, ahead of its pass: begin_before_start)."""
        self._resume = other._resume if other._begun is None else other._begun_resume

    def begin_before_start(self, epoch):
        """begin(epoch) now, ahead of the pass's start (a resumed fit: its epoch and position are set before the
        iterator is made, so that workers read the resumed epoch from the resumed position); the loop's own
        begin(epoch) then keeps them."""
        self._begun_resume = self._resume
        length = self.begin(epoch)
        self._begun = epoch
        return length

    def start_pass(self, profiler=None, profile_first=True):
        """Make the pass's iterator now (iter(): the loader's workers start, its sampler's or data set's __iter__
        runs) and, without a length, read its first batch ahead, where Lightning's loop calls iter() on its fetcher
        (the fit's start, before on_train_start; each later epoch after on_train_epoch_start): `batches()` then
        goes on from there. A pass started before replaces this one (its workers stop when its iterator goes, as
        Lightning's). profile_first=False: that read-ahead is not profiled (Lightning's fetcher at the fit's start
        has no profiler yet)."""
        self._started = None  # (the previous pass's iterator goes first)
        self._started = self._make_pass(profiler, eager=True, profile_first=profile_first)

    def batches(self, profiler=None, ahead=False):
        """(index, batch, whether it is the epoch's last) from the position on: the pass start_pass made, else one
        made now. With a known length the flag stays False (the windows end at the last index already; zip runs in C,
        no Python frame per batch); without one a batch is read ahead, so that the last one is known while it is
        trained on. ahead=True reads the next batch before each one is used in any case, as Accelerate's prepared
        loaders do: a data set that draws from the global random generator then interleaves its draws with the
        model's as under Accelerate (issue 41)."""
        started, self._started = self._started, None
        if started is not None:
            return started
        return self._make_pass(profiler, ahead=ahead)

    def _make_pass(self, profiler=None, ahead=False, eager=False, profile_first=True):
        start, length = self.position.batch_in_epoch, self.length
        if length is not None and start >= length:
            return ()  # resumed after the last batch: only the epoch's end is left to run
        name = "[_TrainingEpochLoop].train_dataloader_next"
        if not eager:  # (iter() at the first batch: the Accelerator's prepared loaders, a pass not started before)
            data = self.data if profiler is None else profiled_iter(self.data, profiler, name)
            if length is not None:
                if ahead:
                    data = (batch for batch, _ in read_ahead(iter(data)))
                return zip(range(start, length), data, itertools.repeat(False))
            return ((index, batch, last) for index, (batch, last) in enumerate(read_ahead(iter(data)), start))
        iterator = iter(self.data)  # (Lightning's iter() of its fetcher: now)
        if length is not None:
            data = iterator if profiler is None else profiled_iter(iterator, profiler, name)
            return zip(range(start, length), data, itertools.repeat(False))
        # Lightning's prefetching fetcher reads a loader without a length one batch ahead inside its iter()
        first = next(iterator, _END) if not profile_first or profiler is None else \
            _profiled_next(iterator, profiler, name)
        data = iterator if profiler is None else profiled_iter(iterator, profiler, name)
        return ((index, batch, last) for index, (batch, last) in enumerate(read_ahead(data, first), start))

    def advance(self, index):
        """Batch `index` is trained on: count it, and the samples of the global order it consumed."""
        position = self.position
        position.batch_in_epoch = index + 1
        position.samples_in_epoch = min(self._samples_cap, self._samples_base + (index + 1) * self._per_batch)

    def end_epoch(self):
        self.data.end_pass()
        position = self.position
        position.epoch += 1
        position.batch_in_epoch = position.samples_in_epoch = 0
        if hasattr(position, "data_from_batch"):  # (the Trainer's TrainState; a prepared loader's position has none)
            position.data_from_batch = 0
        self.length = self.full_length
        self._samples_base = 0
        self._begun = self._started = None

    @staticmethod
    def window(index, steps, length):
        """(first index, size) of the accumulation window holding batch `index` of an epoch of `length` batches
        (None: not known). Windows start at multiples of `steps`; the last one is cut short by the epoch's end."""
        start = index - index % steps
        return start, steps if length is None else min(steps, length - start)

    @staticmethod
    def per_window(loss, size):
        """A micro-batch's loss as its share of the window's gradient: divided by `size` (the Trainer's
        accumulate_grad_batches, also for a window the epoch cuts short, as Lightning's; the Accelerator's window
        length or gradient_accumulation_steps), the one place the Trainer and the Accelerator scale a loss for
        accumulation."""
        return loss / size if size > 1 else loss

    # -- resume -----------------------------------------------------------------------------------------------------
    def resume(self, saved: dict, saved_world: int, accumulate: int, *, source, epoch_name, world, owner="trainer",
               users_split=False, now=None, order_remedy=None, own_order_reason=None):
        """Continue from a saved position (`saved`: batch_in_epoch and samples_in_epoch, if known, written by
        `saved_world` shards; a prepared loader's state adds its kind, batch_size and split_batches): the next `begin`
        starts there. `world` is this run's number of shards, `now` this run's (batch_size, split_batches), `owner`
        "trainer" or "accelerator" (whose remedies an error names), `users_split` that every process reads the
        loader as the user built it (the Trainer's use_distributed_sampler=False).

        Refused before training, on every rank alike, when the epoch stopped in its middle and cannot continue
        exactly (see `check_resume`). `order_remedy` and `own_order_reason` replace the remedy and the reason an
        error gives."""
        start, samples = resume_point(saved, saved_world, self.data, self.world_size, accumulate)
        if start > int(saved.get("data_from_batch", 0)):  # (at that index nothing is skipped: the data starts over)
            check_resume(self.data, saved, saved_world, world, exact=samples is not None and not users_split,
                         source=source, epoch_name=epoch_name, owner=owner, users_split=users_split, now=now,
                         order_remedy=order_remedy, own_order_reason=own_order_reason)
        self.position.batch_in_epoch = start
        if samples is not None:
            self.position.samples_in_epoch = samples
        self._resume = (start, samples)
        return start, samples


# -- every error of a resume in the middle of an epoch (the Trainer's and the Accelerator's loaders) ------------------
_KINDS = {"sampler": "sharded by sampler", "stream": "a ShardedStream", "stateful": "a StatefulDataLoader's own state",
          "shard": "sharded in Accelerate's batch order", "dispatched": "dispatched from rank 0",
          "iterable shard": "an IterableDataset sharded by global batch"}


def check_resume(data, saved, saved_world, world, *, exact, source, epoch_name, owner, users_split=False, now=None,
                 order_remedy=None, own_order_reason=None):
    """Whether a position saved in the middle of an epoch can continue on `data` (a TrainData kind): the same kind
    of loader; and where the position is not a count of samples of an order every process draws alike (`exact`
    False: an order of the user's, an IterableDataset cut by global batch), the same number of shards and batches."""
    saved_kind = saved.get("kind")  # (a prepared loader's state: None when written before kinds were recorded)
    if "kind" in saved and (saved_kind or "sampler") != data.kind and (saved_kind is not None or data.sliced):
        raise ValueError(
            f"{source} stopped in the middle of {epoch_name} in a prepared loader of another kind "
            f"({_KINDS.get(saved_kind or 'sampler', saved_kind)}; this one is {_KINDS.get(data.kind, data.kind)}): "
            "prepare the loader with the same DataLoaderConfiguration(dispatch_batches=..., split_batches=...) as the "
            "run that saved it, or resume from a checkpoint taken at the end of an epoch.")
    if exact:
        saved_batch = saved.get("batch_size")
        if data.batched_order and now is not None and saved_batch is not None and saved_batch != now[0]:
            raise ValueError(
                f"{source} stopped in the middle of {epoch_name} with batch_size {saved_batch}, and this loader has "
                f"batch_size {now[0]}: its DataLoader workers each make whole batches of their own items of the "
                "IterableDataset, so the epoch's order depends on the batch size and the items left in it are not "
                f"known. Resume with batch_size {saved_batch} (any number of processes), or from a checkpoint taken "
                "at the end of an epoch.")
        return
    if saved_world != world:
        if users_split:
            why = ("with use_distributed_sampler=False each process reads the training loader as you built it, so "
                   "the Trainer cannot tell which samples the other processes had trained on, nor which are left for "
                   f"{world}")
        elif data.kind == "iterable shard":
            why = ("an IterableDataset sharded by global batch gives each process another slice of every global batch "
                   "then, so the samples done are not known")
        else:
            why = ("the training loader's order is its own (a sampler or batch sampler of yours, or an "
                   "IterableDataset), so the other processes' position is not known")
        raise ValueError(
            f"{source} stopped in the middle of {epoch_name} on {saved_world} processes, and this run has "
            f"{world}; {own_order_reason or why}. Resume on {saved_world} processes, or resume from a checkpoint taken "
            f"at the end of an epoch, or {order_remedy or _order_remedy(data, owner)}.")
    saved_batch, saved_split = saved.get("batch_size"), bool(saved.get("split_batches"))
    if now is not None and "batch_size" in saved and (saved_batch, saved_split) != (now[0], bool(now[1])):
        raise ValueError(
            f"{source} stopped in the middle of {epoch_name} with batch_size {saved_batch} (split_batches="
            f"{saved_split}), and this loader has batch_size {now[0]} (split_batches={bool(now[1])}): the batches "
            "counted there are not this loader's, and its order is not one the position can be counted in. Resume "
            "with the same batch_size and split_batches, or from a checkpoint taken at the end of an epoch, or "
            f"{order_remedy or _order_remedy(data, owner)}.")


def _order_remedy(data, owner):
    if owner == "trainer":
        return ("let the Trainer shard the data (use_distributed_sampler=True, a plain DataLoader with shuffle=True "
                "or False, no sampler, or an IterableDataset with a batch_size) so that the epoch continues exactly")
    if data.kind == "iterable shard":
        return ("prepare it with DataLoaderConfiguration(dispatch_batches=True) (rank 0 reads: resumes on any "
                "number of processes), or make the data set a tasktrain.data.ShardedStream")
    return "prepare a plain DataLoader (shuffle=True or False, no sampler)"


def warn_global_batch_change(source, saved, now, detail, continues_at):
    """Said once (by rank 0) when a resume changes the samples per optimizer step over all processes."""
    warnings.warn(
        f"{source} was trained with {saved} samples per optimizer step over all processes, and this run has {now} "
        f"({detail}): the global batch changes from {saved} to {now}. The epoch continues at sample {continues_at} "
        "of its order, each sample once; but each step now averages another number of samples, so the learning rate "
        "(and a schedule counted in steps) acts differently. Keep the global batch by scaling the per-process batch "
        "size.")


