"""A DataLoader subclass of the user's built again around another sampler, as Lightning builds it (issue 37): the
user's class called with the user's own constructor arguments, its sampler or batch sampler replaced.

The arguments are recorded while the loader hooks run (`recording_init_args`, around train_dataloader() & co. of the
module or DataModule: where Lightning records them), for DataLoaders and BatchSamplers built there: the arguments the
class was called with (a subclass's own, extra ones too). A loader built elsewhere (handed to fit directly) is read
back from its public attributes, as Lightning reads it; where its class needs an argument that is not among them,
Lightning's MisconfigurationException names it. The recording wraps the classes' `__init__` for the hook's duration
only (a class defined inside the hook is read back from attributes).

What the hook sets on a DataLoader once built (`loader.name = ...`) is set again on the loader built again, as
Lightning replays it."""
import contextlib
import functools
import inspect
import re
import warnings

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from tasktrain.exceptions import MisconfigurationException

_RECORD = "_tasktrain_init_args"  # (args, kwargs) the class was called with; "_": not read back as an argument
_SETS = "_tasktrain_sets"  # [(name, value)] set on a DataLoader in the hook after its constructor returned
_IN_INIT = "_tasktrain_in_init"  # constructors of the object running (a subclass's calls its parent's)
_recording = [0]  # nesting depth of recording_init_args (a hook calling another hook)


def _recording_init(init):
    """`init` that first records, on an object that has no record yet (the outermost constructor of a subclass
    chain: the arguments the user's class was called with), its arguments."""
    @functools.wraps(init)
    def recording(obj, *args, **kwargs):
        if _RECORD not in vars(obj):
            object.__setattr__(obj, _RECORD, (args, dict(kwargs)))
        depth = vars(obj).get(_IN_INIT, 0)
        object.__setattr__(obj, _IN_INIT, depth + 1)
        try:
            init(obj, *args, **kwargs)
        finally:
            object.__setattr__(obj, _IN_INIT, depth)

    recording.records = init
    return recording


def _recording_setattr(setattr_):
    """DataLoader's __setattr__ that also records what the hook sets on a loader once built (not inside its
    constructor), so that the loader built again gets it too."""
    @functools.wraps(setattr_)
    def recording(obj, name, value):
        setattr_(obj, name, value)
        if _RECORD in vars(obj) and not vars(obj).get(_IN_INIT):
            vars(obj).setdefault(_SETS, []).append((name, value))

    recording.records = setattr_
    return recording


def _classes(base):
    found, todo = [], [base]
    while todo:
        kind = todo.pop()
        if kind not in found:
            found.append(kind)
            todo.extend(kind.__subclasses__())
    return found


@contextlib.contextmanager
def recording_init_args():
    """While it is open, each DataLoader and BatchSampler (subclasses too) built keeps its constructor arguments:
    each class's own __init__ is wrapped for that time (the classes defined by then)."""
    patched = []
    if _recording[0] == 0:
        for kind in _classes(DataLoader) + _classes(BatchSampler):
            init = vars(kind).get("__init__")
            if init is not None and not hasattr(init, "records"):
                kind.__init__ = _recording_init(init)
                patched.append((kind, "__init__", init))
        patched.append((DataLoader, "__setattr__", DataLoader.__setattr__))
        DataLoader.__setattr__ = _recording_setattr(DataLoader.__setattr__)
    _recording[0] += 1
    try:
        yield
    finally:
        _recording[0] -= 1
        for kind, name, method in patched:
            setattr(kind, name, method)


def recorded(obj):
    """(args, kwargs, names of the positional args) `obj` was built with in a loader hook, or None."""
    record = vars(obj).get(_RECORD)
    if record is None:
        return None
    args, kwargs = record
    params = [p.name for p in inspect.signature(type(obj).__init__).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return args, dict(kwargs), tuple(params[:len(args)])


def _replace_arg(name, value, args, kwargs, names, defaults):
    """(args, kwargs) with argument `name` set to `value` (positional, keyword or one left at its default), or None
    where the constructor has no such argument."""
    if name in names:
        index = names.index(name)
        return args[:index] + (value,) + args[index + 1:], kwargs
    if name in kwargs or name in defaults:
        return args, dict(kwargs, **{name: value})
    return None


def _batch_sampler_again(batch_sampler, sampler, predicting, warn):
    """The loader's custom batch sampler built again around `sampler` (Lightning's rule): from its recorded
    arguments (sampler replaced; drop_last=False when predicting, warned where it has none), else as a BatchSampler
    is built: (sampler, batch_size=, drop_last=)."""
    from tasktrain.trainer.data import _CANNOT_INJECT

    kind = type(batch_sampler)
    record = recorded(batch_sampler)
    if record is not None:
        args, kwargs, names = record
        defaults = {p.name for p in inspect.signature(kind.__init__).parameters.values()
                    if p.default is not p.empty and p.name not in kwargs and p.name not in names}
        if predicting:
            replaced = _replace_arg("drop_last", False, args, kwargs, names, defaults)
            if replaced is None:
                if warn:
                    warnings.warn(f"Trying to inject `drop_last=False` into batch sampler since you are predicting, "
                                  f"however it seems the class `{kind.__qualname__}` does not support it. Your "
                                  "predictions might be incomplete. To mitigate this, expose `drop_last` in the "
                                  "`__init__` method of your custom class.")
            else:
                args, kwargs = replaced
        replaced = _replace_arg("sampler", sampler, args, kwargs, names, defaults)
        if replaced is None:
            raise TypeError("Trying to inject a modified sampler into the batch sampler; however, it seems the class "
                            f"`{kind.__qualname__}` does not have an argument called `sampler.` To mitigate this, "
                            "expose an argument `sampler` in the `__init__` method of your custom class.")
        return _instantiate(kind, *replaced[0], **replaced[1])
    if not (hasattr(batch_sampler, "batch_size") and hasattr(batch_sampler, "drop_last")):
        if not predicting:
            raise TypeError(_CANNOT_INJECT)
        if warn:  # (predicting: it is kept, warned, as Lightning keeps it)
            from tasktrain.exceptions import PossibleUserWarning

            warnings.warn(f"You are using a custom batch sampler `{kind.__qualname__}` for prediction. Lightning would"
                          " normally set `drop_last=False` to ensure all samples are returned, but for custom samplers"
                          " it can't guarantee this. Make sure your sampler is configured correctly to return all "
                          "indices.", PossibleUserWarning)
        return batch_sampler
    try:
        return kind(sampler, batch_size=batch_sampler.batch_size,
                    drop_last=False if predicting else batch_sampler.drop_last)
    except TypeError as error:
        if "__init__() got multiple values" not in str(error):
            raise  # (Lightning lets any other TypeError through as it is)
        raise TypeError(_CANNOT_INJECT) from error


def init_arguments(loader, sampler, predicting=False, batch_sampler=None, warn=True):
    """(args, kwargs) that build `loader`'s class again with `sampler` (Lightning's _get_dataloader_init_args_and_
    kwargs): its recorded arguments, else its public attributes that differ from the constructor's defaults; the
    sampler in place of the loader's (a custom batch sampler built again around it, or `batch_sampler` given: then
    batch_size=1, drop_last=False, as Lightning passes them). Lightning's errors where the class cannot be called so."""
    if not isinstance(loader, DataLoader):
        raise ValueError(f"The dataloader {loader} needs to subclass `torch.utils.data.DataLoader`")
    record = recorded(loader)
    if record is not None:
        args, kwargs, names = record
    else:
        attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
        attrs["multiprocessing_context"] = loader.multiprocessing_context  # (a property)
        args, names = (), ()
    params = dict(inspect.signature(loader.__init__).parameters)
    variadic = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if variadic:  # (a **kwargs passed down to DataLoader: its arguments are the class's too)
        base = inspect.signature(DataLoader.__init__).parameters
        params.update({k: v for k, v in base.items() if k != "self" and (record is None or v.default is not v.empty)})
    if record is None:
        # (`is not`: an attribute that cannot be compared with == (an array) is kept)
        kwargs = {k: v for k, v in attrs.items() if k in params and (k == "dataset" or params[k].default is not v)}
        kwargs["dataset"] = attrs.get("dataset", loader.dataset)
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(sampler=None, batch_sampler=None)
    else:
        kwargs.update(_sampler_arguments(loader, sampler, predicting, batch_sampler, warn))
    required = sorted(p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                      and p.default is p.empty and p.name not in kwargs and p.name not in names)
    name = type(loader).__name__
    if required:
        raise MisconfigurationException(
            f"Trying to inject custom `Sampler` into the `{name}` instance. This would fail as some of the `__init__` "
            f"arguments are not available as instance attributes. The missing attributes are {required}. If you "
            f"instantiate your `{name}` inside a `*_dataloader` hook of your module, we will do this for you. "
            f"Otherwise, define {', '.join(f'`self.{arg}`' for arg in required)} inside your `__init__`.")
    if not variadic:
        unknown = sorted((set(kwargs) | set(names)) - params.keys())
        if unknown:
            raise MisconfigurationException(
                f"Trying to inject parameters into the `{name}` instance. This would fail as it doesn't expose all its "
                f"attributes in the `__init__` signature. The missing arguments are {unknown}. HINT: If you wrote the "
                f"`{name}` class, add the `__init__` arguments or allow passing `**kwargs`")
    return args, kwargs


class _IndexBatchSamplerWrapper:
    """A predict loader's batch sampler, as Lightning's Trainer wraps every one (its class's name, which code that
    inspects `trainer.predict_dataloaders.batch_sampler` sees): the wrapped batch sampler's attributes (`batch_size`,
    `drop_last`, `sampler`), its length and batches, and `seen_batch_indices`, the dataset indices of each batch the
    current pass has given out (emptied when a pass starts; the prediction writers' batch_indices)."""

    def __init__(self, batch_sampler):
        vars(self).update({k: v for k, v in getattr(batch_sampler, "__dict__", {}).items()
                           if k not in ("__next__", "__iter__", "__len__", "__getstate__")})
        self._batch_sampler = batch_sampler
        self._iterator = None
        self.seen_batch_indices = []

    def __getattr__(self, name):  # (names not copied above: the wrapped sampler's class attributes, properties)
        if name.startswith("__") or name in ("_batch_sampler", "_iterator", "seen_batch_indices"):
            raise AttributeError(name)
        return getattr(self._batch_sampler, name)

    def __iter__(self):
        # (a generator per pass, so two passes do not share a position; next(wrapper) reads the latest one, as
        # scripts written for Lightning's wrapper, whose __iter__ returns itself, may call it)
        self._iterator = self._batches()
        return self._iterator

    def __next__(self):
        if self._iterator is None:
            raise TypeError("_IndexBatchSamplerWrapper: iterate it (iter(wrapper)) before calling next().")
        return next(self._iterator)

    def _batches(self):
        seen = self.seen_batch_indices
        seen.clear()  # (in place: the run holds this list for its writers)
        for batch in self._batch_sampler:
            seen.append(batch)
            yield batch

    def __len__(self):
        return len(self._batch_sampler)

    def __getstate__(self):
        return {**self.__dict__, "_iterator": None}  # (a running generator does not pickle)

    def __setstate__(self, state):
        self.__dict__.update(state)


def _sampler_arguments(loader, sampler, predicting, batch_sampler, warn):
    """The order arguments of the loader built again (Lightning's _dataloader_init_kwargs_resolve_sampler; predicting:
    its batch sampler wrapped to keep each batch's indices)."""
    own = loader.batch_sampler
    if batch_sampler is None and own is not None and (type(own) is not BatchSampler or predicting):
        batch_sampler = _batch_sampler_again(own, sampler, predicting, warn)
    if predicting and batch_sampler is not None and not isinstance(batch_sampler, _IndexBatchSamplerWrapper):
        batch_sampler = _IndexBatchSamplerWrapper(batch_sampler)
    if batch_sampler is not None:  # (exclusive with batch_size, shuffle, sampler and drop_last)
        return {"sampler": None, "shuffle": False, "batch_sampler": batch_sampler, "batch_size": 1, "drop_last": False}
    return {"sampler": sampler, "shuffle": False, "batch_sampler": None}


def _instantiate(kind, *args, **kwargs):
    """kind(*args, **kwargs), with Lightning's error where two of the class's arguments reach one of its parent's."""
    try:
        return kind(*args, **kwargs)
    except TypeError as error:
        match = re.match(r".*__init__\(\) got multiple values .* '(\w+)'", str(error))
        if not match:
            raise
        argument = match.groups()[0]
        raise MisconfigurationException(
            f"The {kind.__name__} implementation has an error where more than one `__init__` argument can be passed "
            f"to its parent's `{argument}=...` `__init__` argument. This is likely caused by allowing passing both a "
            f"custom argument that will map to the `{argument}` argument as well as `**kwargs`. `kwargs` should be "
            f"filtered to make sure they don't contain the `{argument}` key. This argument was automatically passed "
            "to your object by PyTorch Lightning.") from error


def build_again(loader, sampler, predicting=False, batch_sampler=None, warn=True):
    """`loader`'s class built again around `sampler` (or `batch_sampler`), with the user's arguments."""
    args, kwargs = init_arguments(loader, sampler, predicting, batch_sampler, warn)
    rebuilt = _instantiate(type(loader), *args, **kwargs)
    sets = list(vars(loader).get(_SETS, ()))
    for name, value in sets:  # (what the hook set on the loader once built, as Lightning replays it)
        setattr(rebuilt, name, value)
    if rebuilt.worker_init_fn is None and loader.worker_init_fn is not None:
        rebuilt.worker_init_fn = loader.worker_init_fn  # (seed_everything(workers=True)'s, added before the rebuild)
    # (built again later, e.g. for a prediction writer, alike)
    object.__setattr__(rebuilt, _RECORD, (args, kwargs))
    object.__setattr__(rebuilt, _SETS, sets)
    return rebuilt
