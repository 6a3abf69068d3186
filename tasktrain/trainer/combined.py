"""Several loaders read as one (issue 37): Lightning's CombinedLoader and its modes, and the Trainer's training data
over it.

`CombinedLoader(iterables, mode)` takes one iterable or a (nested) dict / list / tuple of them, as Lightning's:

    max_size_cycle  a batch of every loader per step (the same structure); ends with the longest, the shorter ones
                    start again when they run out (what the Trainer makes of a dict or list of training loaders)
    max_size        the same, but a loader that ran out gives None until the longest ends
    min_size        (the default) ends with the shortest
    sequential      each loader to its end in turn; yields (batch, batch_idx, dataloader_idx)

The other modes yield (batch, batch_idx, 0). `len()` needs an iter() first (Lightning's rule); `limits` caps each
loader (sequential reads each to its limit; the other modes only count with them: the length is the mode's over the
capped lengths, the loop stops there).

The Trainer (loaders.setup_train) prepares each inner training loader as it prepares one (`prepare_train_data`:
its own shard, its own order and set_epoch under a distributed strategy) and drives them through `CombinedTrainData`
(modes min_size, max_size_cycle, max_size: Lightning's fit refuses sequential, `check_training_mode`),
one TrainData kind, so that the epoch iterator (epoch.py) counts, limits and resumes the combined batches like any
loader's. A resume in the middle of an epoch starts each inner loader where the uninterrupted run's would be at that
combined batch (its own skip: without loading on the Trainer's order; a StatefulDataLoader of its own order: from its
saved state), on the same number of processes.

Evaluation (validate, test, the fit's validation) reads a sequential CombinedLoader (or a dict / list of loaders) each
loader in turn; a CombinedLoader in another mode as one pass over its prepared loaders together
(`CombinedEvalLoaders`), as Lightning's evaluation loop does. predict refuses those modes (Lightning's error).
"""
import math
from typing import Any, Literal

from tasktrain.trainer.data import StatefulLoaderData, TrainData, held_until_next_iter

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")


# -- the structure of the iterables: Lightning's flattening (dicts, lists and tuples; a container of plain values,
# such as a list of ints, is one iterable) -------------------------------------------------------------------------
def _is_node(tree):
    if not isinstance(tree, (dict, list, tuple)):
        return False
    children = tree.values() if isinstance(tree, dict) else tree
    return not all(isinstance(child, (int, float, str)) for child in children)


def flatten(tree):
    """(leaves in order, spec): the spec rebuilds the same structure around other leaves (`unflatten`)."""
    if not _is_node(tree):
        return [tree], None
    keys = list(tree.keys()) if isinstance(tree, dict) else None
    leaves, specs = [], []
    for child in (tree.values() if keys is not None else tree):
        flat, spec = flatten(child)
        leaves += flat
        specs.append((len(flat), spec))
    return leaves, (type(tree), keys, specs)


def unflatten(leaves, spec):
    if spec is None:
        return leaves[0]
    kind, keys, specs = spec
    children, at = [], 0
    for count, child in specs:
        children.append(unflatten(leaves[at:at + count], child))
        at += count
    if keys is not None:
        return kind(zip(keys, children))
    if kind is list:
        return children
    return kind(*children) if hasattr(kind, "_fields") else kind(children)  # (a namedtuple takes its fields)


def _length(iterable):
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return None


def mode_length(mode, lengths, limits=None):
    """Batches of a combined pass: the mode's function of the loaders' lengths (None: unknown), each capped by its
    limit. None where the result is not finite."""
    lengths = [math.inf if n is None else n for n in lengths]
    if limits is not None:
        lengths = [min(n, math.inf if limit is None else limit) for n, limit in zip(lengths, limits)]
    if not lengths:
        return 0
    total = {"min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum}[mode](lengths)
    return None if total == math.inf else int(total)


# -- one pass in each mode: (batches of the flat loaders, batch_idx, dataloader_idx); `start`: the combined batch the
# pass starts at (the Trainer's resume), each loader started where it would be then --------------------------------
def _zip_pass(mode, loaders, lengths, start=0, skip=None, restart=None, started=None):
    """min_size, max_size and max_size_cycle. `skip(i, n)` starts loader i n batches in (default: read and drop);
    `restart(i)` is called before a loader is started again inside the pass (max_size_cycle); `started`: the loaders'
    iterators, started already (a pass from the first batch)."""
    n = len(loaders)
    consumed = [False] * n
    iterators = [None] * n
    if started is not None:
        iterators, start = list(started), 0
    for i, loader in enumerate(loaders if started is None else ()):
        ahead = start
        if start and mode == "max_size_cycle":
            if lengths[i] is None:
                raise ValueError("A training CombinedLoader(mode='max_size_cycle') cannot resume in the middle of an "
                                 "epoch when one of its loaders has no length (where it cycled is not known): resume "
                                 "from a checkpoint taken at the end of an epoch.")
            consumed[i] = start >= lengths[i]
            ahead = start % lengths[i]
            if consumed[i] and ahead == 0 and restart is not None:
                restart(i)  # (the uninterrupted run started it again when it took this very batch)
        elif start and lengths[i] is not None and start >= lengths[i]:
            iterators[i] = iter(())  # ran out before the resumed batch (max_size: None from here)
            continue
        iterators[i] = _started(loader, ahead, i, skip)
    index = start
    while True:
        out = [None] * n
        got = False
        for i in range(n):
            try:
                out[i] = next(iterators[i])
                got = True
            except StopIteration:
                if mode == "min_size":
                    return
                consumed[i] = True
                if mode == "max_size":
                    continue  # (None for this loader)
                if all(consumed):
                    return  # max_size_cycle: every loader ran out once
                if restart is not None:
                    restart(i)
                iterators[i] = held_until_next_iter(loaders[i], iter(loaders[i]))
                out[i] = next(iterators[i])
                got = True
        if not got:
            return
        yield out, index, 0
        index += 1


def _started(loader, ahead, i, skip):
    if ahead and skip is not None:
        return skip(i, ahead)
    iterator = held_until_next_iter(loader, iter(loader))
    for _ in range(ahead):  # (a CombinedLoader of the user's never starts ahead: only the Trainer's resume does)
        next(iterator, None)
    return iterator


def _sequential_pass(loaders, limits, first=None):
    """Each loader to its end (or its limit) in turn. `first`: the first loader's iterator, started already."""
    for i, loader in enumerate(loaders):
        limit = limits[i] if limits is not None else None
        limit = math.inf if limit is None else limit
        if i == 0 and first is not None:
            iterator = first
        else:
            iterator = held_until_next_iter(loader, iter(loader))
        batch_idx = 0
        while batch_idx < limit:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            yield batch, batch_idx, i
            batch_idx += 1


class CombinedLoader:
    """Lightning's `lightning.pytorch.utilities.CombinedLoader` (see the module's docstring for the modes)."""

    def __init__(
        self, iterables: Any, mode: Literal["min_size", "max_size_cycle", "max_size", "sequential"] = "min_size"
    ):
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = flatten(iterables)
        self._mode = mode
        self._iterator = None
        self._limits = None

    @property
    def iterables(self):
        """The collection of iterables as given (rebuilt around a new `flattened`)."""
        return self._iterables

    @property
    def mode(self):
        return self._mode

    @property
    def flattened(self):
        """The iterables as one flat list, in the order of the structure."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened):
        if len(flattened) != len(self._flattened):
            raise ValueError(f"Mismatch in flattened length ({len(flattened)}) and existing length "
                             f"({len(self._flattened)})")
        self._iterables = unflatten(list(flattened), self._spec)
        self._flattened = list(flattened)

    @property
    def sampler(self):
        """Each iterable's sampler (None where it has none), in the iterables' structure."""
        return unflatten([getattr(one, "sampler", None) for one in self._flattened], self._spec)

    @property
    def batch_sampler(self):
        """Each iterable's batch sampler (None where it has none), in the iterables' structure."""
        return unflatten([getattr(one, "batch_sampler", None) for one in self._flattened], self._spec)

    @property
    def limits(self):
        """Batches each iterable is read to at most (None: no limits)."""
        return self._limits

    @limits.setter
    def limits(self, limits):
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables "
                             f"({len(self._flattened)})")
        self._limits = limits

    def __iter__(self):
        # iter() starts the iterables' iterators (a DataLoader's workers) here, as Lightning's: every one, or in
        # sequential mode the first one only
        if self._mode == "sequential":
            first = [held_until_next_iter(one, iter(one)) for one in self._flattened[:1]]
            self._iterator = _sequential_pass(self._flattened, self._limits, first[0] if first else None)
        else:
            started = [held_until_next_iter(one, iter(one)) for one in self._flattened]
            self._iterator = self._zip(started)
        return self

    def _zip(self, started):
        lengths = [_length(one) for one in self._flattened]
        for out, batch_idx, dataloader_idx in _zip_pass(self._mode, self._flattened, lengths, started=started):
            yield unflatten(out, self._spec), batch_idx, dataloader_idx

    def __next__(self):
        if self._iterator is None:
            raise TypeError("Call iter(combined_loader) before next().")
        return next(self._iterator)

    def __len__(self):
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        length = mode_length(self._mode, [_length(one) for one in self._flattened], self._limits)
        if length is None:
            raise TypeError("This CombinedLoader has no length: one of its iterables has none.")
        return length

    def __getstate__(self):
        # a pass in flight is not copied (a DataLoader's iterator cannot be pickled, nor a generator): a copy or an
        # unpickled loader has its length, and reads from a new iter() (Lightning's drops its DataLoader iterators)
        state = dict(self.__dict__)
        if state["_iterator"] is not None:
            state["_iterator"] = _PassNotCopied()
        return state

    def reset(self):
        """Forget the pass in flight and stop the workers of its DataLoaders (the next iter() starts again)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        for one in self._flattened:
            iterator = getattr(one, "_iterator", None)
            if iterator is not None and callable(getattr(iterator, "_shutdown_workers", None)):
                iterator._shutdown_workers()

    def _state_dicts(self):
        """The state of each iterable that keeps one (state_dict / load_state_dict, a StatefulDataLoader)."""
        return [one.state_dict() for one in self._flattened if _stateful(one)]

    def _load_state_dicts(self, states):
        if not states:
            return
        stateful = [one for one in self._flattened if _stateful(one)]
        if len(stateful) != len(states):
            raise RuntimeError(f"The CombinedLoader has {len(stateful)} stateful loaders, but found {len(states)} "
                               "states in the checkpoint. Please make sure you define the same dataloaders that were "
                               "used when saving the checkpoint.")
        for one, state in zip(stateful, states):
            one.load_state_dict(state)


class _PassNotCopied:
    """The pass of a CombinedLoader copied or unpickled after its iter(): len() works, reading needs a new iter()."""

    def __next__(self):
        raise RuntimeError("This CombinedLoader was copied or unpickled in the middle of a pass, which is not copied: "
                           "call iter() on it to read it from its start.")

    def close(self):
        pass


def _stateful(one):
    return callable(getattr(one, "state_dict", None)) and callable(getattr(one, "load_state_dict", None))


def check_training_mode(combined):
    """Lightning's fit loop refuses a sequential CombinedLoader (at its first epoch; here before training)."""
    if combined.mode == "sequential":
        raise ValueError('`_FitLoop` does not support the `CombinedLoader(mode="sequential")` mode. The available '
                         f"modes are: {[mode for mode in MODES if mode != 'sequential']}")


class CombinedEvalLoaders(list):
    """An evaluation's loaders of a CombinedLoader in mode min_size, max_size or max_size_cycle (Lightning's evaluation
    loop runs them so): the flat list of prepared loaders (each counted under limit_*_batches, num_*_batches a count
    per loader, as Lightning's max_batches), read together as one pass whose batch is the structure of the inner
    batches, batch_idx counted over the pass, dataloader_idx 0 and not passed to the step or hooks."""

    def __init__(self, loaders, mode, spec):
        super().__init__(loaders)
        self.mode, self.spec = mode, spec

    def length(self, limits):
        """Batches of the pass (Lightning's fetcher: len() of the combined loader, None where an inner loader has no
        length: the pass runs to the mode's end)."""
        lengths = [_length(one) for one in self]
        if any(n is None for n in lengths):
            return None
        return mode_length(self.mode, lengths, [math.inf if limit is None else limit for limit in limits])

    def batches(self):
        combined = CombinedLoader(unflatten(list(self), self.spec), self.mode)
        return (batch for batch, _, _ in iter(combined))


def combined_eval(loader, prepared):
    """`prepared` (the flat loaders of `loader`, prepared) as the evaluation reads them: together where `loader` is a
    CombinedLoader in a mode other than sequential, else in turn (a plain list)."""
    if isinstance(loader, CombinedLoader) and loader.mode != "sequential":
        return CombinedEvalLoaders(prepared, loader.mode, loader._spec)
    return prepared


def loaders_view(given, prepared):
    """Lightning's trainer.val_dataloaders / test_dataloaders / predict_dataloaders (its combined loader's
    `iterables`): the run's prepared loaders (`prepared`, flat) in the structure they were given. One loader is
    itself, a list of one a list, a tuple a tuple, a (nested) dict the same dict, a CombinedLoader its iterables in
    any mode; an empty collection stays as given."""
    if isinstance(given, CombinedLoader):
        return unflatten(list(prepared), given._spec)
    if isinstance(given, (list, tuple, dict)) and not given:
        return given
    return unflatten(list(prepared), flatten(given)[1])


def is_combined(loader):
    """Several training loaders: a CombinedLoader, or a dict / list / tuple of loaders (Lightning combines them in
    max_size_cycle mode)."""
    return isinstance(loader, CombinedLoader) or _is_node(loader)


class CombinedTrainData(TrainData):
    """The Trainer's training data over several loaders: each inner loader prepared as one (`inner`, TrainData kinds),
    read together in the CombinedLoader's mode (not sequential: check_training_mode). A batch is the structure of the
    inner batches. `limits`: each inner loader's batches after limit_train_batches (None: no length)."""

    kind = "combined"

    def __init__(self, combined, inner, limits, seed):
        super().__init__(CombinedLoader(unflatten([one.loader for one in inner], combined._spec), combined.mode),
                         None, None, seed)
        self.mode, self.inner, self.limits, self._spec = combined.mode, inner, limits, combined._spec
        self.loader.limits = list(limits)
        self._start = 0

    @property
    def shown(self):
        """What trainer.train_dataloader shows: Lightning's combined loader's iterables, each inner loader as it shows
        (the one given where Lightning keeps it)."""
        return unflatten([one.shown for one in self.inner], self._spec)

    def __len__(self):
        length = self.length()
        if length is None:
            raise TypeError("The combined training loaders have no length.")
        return length

    def length(self):
        """Batches of a combined epoch, limits applied (None: not finite)."""
        return mode_length(self.mode, [len(one) if one.has_len() else None for one in self.inner], self.limits)

    def has_len(self):
        return self.length() is not None

    @property
    def resumes_on_any_world_size(self):
        return False  # (the position is a count of combined batches, each inner loader's its own: same world)

    @property
    def num_samples(self):
        return None

    def samples_per_batch(self, world_size):
        return None

    def batches_from(self, num_samples):
        return None

    def set_epoch(self, epoch):
        for one in self.inner:  # Lightning sets each inner loader's sampler epoch
            one.set_epoch(epoch)

    # Lightning's draws: iter() of the combined loader iterates every inner loader, its first batch takes a batch of
    # each
    def draw_at_iter(self, epoch=None):
        for one in self.inner:
            one.draw_at_iter(epoch)

    def draw_at_first_batch(self):
        for one in self.inner:
            one.draw_at_first_batch()

    def _redraw(self, i):
        # an inner loader started again inside the epoch (max_size_cycle): its iter() and first batch draw as under
        # Lightning
        self.inner[i].draw_at_iter()
        self.inner[i].draw_at_first_batch()

    def drawn_order(self):
        orders = [one.drawn_order() for one in self.inner]
        return {"combined": orders} if any(order is not None for order in orders) else None

    def load_drawn_order(self, state):
        orders = (state or {}).get("combined")
        if orders is None or len(orders) != len(self.inner):
            orders = [None] * len(self.inner)
        for one, order in zip(self.inner, orders):
            one.load_drawn_order(order)

    def draws_own_order(self):
        return any(one.draws_own_order() for one in self.inner)

    def end_pass(self):
        for one in self.inner:
            one.end_pass()

    def skip(self, num_batches):
        """Start the next pass at combined batch `num_batches` (each inner loader where it is then)."""
        self._start = max(0, int(num_batches))

    def skip_samples(self, num_samples):
        raise ValueError("Combined training loaders resume by combined batch, not by sample count.")

    # inner loaders that keep their own state (a StatefulDataLoader over data whose order is its own:
    # StatefulLoaderData) resume from it, as one such loader alone does; the others skip on the Trainer's order
    def keeps_loader_states(self):
        return any(isinstance(one, StatefulLoaderData) for one in self.inner)

    def loader_state(self, batch_in_epoch):
        """Each inner loader's state once the loop has trained on `batch_in_epoch` combined batches (None for a loader
        without one, or at its pass's start): where it is in its current pass (max_size_cycle: since it last started
        again)."""
        states = []
        for one, length in zip(self.inner, [len(one) if one.has_len() else None for one in self.inner]):
            at = batch_in_epoch
            if length is not None and at >= length:
                at = at % length if self.mode == "max_size_cycle" else 0  # (ran out: max_size reads it no more)
            states.append(one.loader_state(at) if isinstance(one, StatefulLoaderData) and at > 0 else None)
        return {"combined": states}

    def load_loader_state(self, state):
        """This rank's saved states: each stateful inner loader's resumed pass starts from its own (read and drop
        where none was saved)."""
        states = (state or {}).get("combined")
        if states is None or len(states) != len(self.inner):
            raise RuntimeError(f"The combined training loaders have {len(self.inner)} loaders, but the checkpoint "
                               f"holds {len(states or [])} loader states: resume with the loaders of the saved run.")
        for one, saved in zip(self.inner, states):
            if isinstance(one, StatefulLoaderData) and saved is not None:
                one.load_loader_state(saved)

    def _skip_inner(self, i, num_batches):
        self.inner[i].skip(num_batches)
        return iter(self.inner[i])

    def __iter__(self):
        start, self._start = self._start, 0
        lengths = [len(one) if one.has_len() else None for one in self.inner]
        return (unflatten(out, self._spec) for out, _, _ in
                _zip_pass(self.mode, self.inner, lengths, start, self._skip_inner, restart=self._redraw))
