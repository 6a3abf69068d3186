"""The fit's data, set up for the Trainer: the training loader prepared once (sharded over the data-parallel ranks,
dispatched or sliced by its kind, limited, its epoch iterator built), the validation loaders counted, both reloaded
from the hooks when asked (reload_dataloaders_every_n_epochs, a resumed DataModule).

Functions over the Trainer: what they set on it (train_dataloader, num_training_batches, num_val_batches, ...) are
the Trainer's public attributes, Lightning's names."""
import math
import warnings

from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from tasktrain.strategies.base import OneProcess
from tasktrain.trainer import evaluation, guards
from tasktrain.trainer.combined import CombinedLoader, CombinedTrainData, check_training_mode, combined_eval, \
    is_combined, loaders_view
from tasktrain.trainer.datamodule import DataModule
from tasktrain.trainer.data import _with_sampler, check_workers, prepare_eval_loader, prepare_train_data, \
    samples_per_step
from tasktrain.trainer.epoch import EpochIterator
from tasktrain.trainer.seed import add_worker_init_fn, sampler_seed
from tasktrain.trainer.module import TaskModule, is_overridden


def shards(trainer):
    """(world size, rank) the loaders are sharded for: (1, 0) with use_distributed_sampler=False. Tensor-parallel
    peers read the same data: only the data-parallel ranks split it."""
    if not trainer.use_distributed_sampler:
        return 1, 0
    return trainer.strategy.data_parallel_size, trainer.strategy.data_parallel_rank


def eval_shuffle_seed(trainer):
    """The seed a shuffling validation/test loader's DistributedSampler gets (Lightning's: under a distributed
    strategy with use_distributed_sampler, also of one process); None where the loader is kept as it is."""
    if not trainer.use_distributed_sampler or isinstance(trainer.strategy, OneProcess):
        return None
    return sampler_seed()


def train_data_now(trainer):
    """The fit's training data, requested and prepared once (from configure_optimizers on)."""
    if trainer._train_data is None:
        module, train_loader = trainer._pending_train
        owner = None if train_loader is not None else (
            trainer._attached[1] if trainer._attached[1] is not None else module)
        train_loader = train_loader if train_loader is not None else trainer._loader_of(module, "train_dataloader")
        evaluation.check_loaders_iterable(train_loader, "fit", owner, "train_dataloader")
        trainer._train_data = setup_train(trainer, train_loader)
        trainer._train_data.given_loader = train_loader
    return trainer._train_data


def setup_train(trainer, loader, previous=None):
    """The epoch iterator of a training loader (a rebuilt loader keeps the resume of the `previous` one)."""
    world_size, rank = shards(trainer)
    # Lightning shards (DistributedSampler) under any distributed strategy, and its training sampler always
    # shuffles there (a sequential loader too), except with overfit_batches: the same batches every epoch
    keeps_sampler = not trainer.use_distributed_sampler or isinstance(trainer.strategy, OneProcess)
    shuffle = False if trainer.overfit_batches else (None if keeps_sampler else True)

    def prepared(one):
        one = trainer.strategy.process_dataloader(one)  # (Lightning's: the loader the strategy returns is read)
        check_loader_workers(trainer, one, "train")
        add_worker_init_fn(one, trainer.global_rank)  # seed_everything(workers=True), before the loader is rebuilt
        data = prepare_train_data(one, world_size, rank, trainer.state.data_seed, shuffle=shuffle,
                                  broadcast=trainer.strategy.broadcast, reads=trainer.strategy.is_global_zero,
                                  keeps_sampler=keeps_sampler, lightning=True)
        data.holds_iterator = True  # (non-persistent workers stop at the next iter(), as under Lightning)
        if data.kind == "dispatched":
            if data.reader is not None:  # (the process that reads the loader: its iterator is held alike)
                data.reader.holds_iterator = True
            if data.num_processes == 1:
                data.reads_ahead = False  # (the loop reads ahead where Lightning's fetcher does: dispatch.py)
        return data

    if is_combined(loader):
        # several training loaders (a dict, list or CombinedLoader): each prepared as one (its own shard and
        # order), limit_train_batches applied to each, the epoch's length the mode's (Lightning's fit loop)
        combined = loader if isinstance(loader, CombinedLoader) else CombinedLoader(loader, "max_size_cycle")
        inner = [prepared(one) for one in combined.flattened]
        limits = [evaluation.apply_limit(len(one) if one.has_len() else None, trainer.limit_train_batches,
                                         "limit_train_batches") for one in inner]
        train_data = CombinedTrainData(combined, inner, limits, trainer.state.data_seed)
        if combined.mode == "sequential":  # refused (before training), num_training_batches counted first: Lightning
            trainer._num_training_batches = train_data.length()  # counts its loaders, then refuses at the epoch
        check_training_mode(combined)
        trainer.train_dataloader = train_data.shown  # Lightning's: the combined loader's iterables
        length = train_data.length()
        each = [(type(one).__name__, len(data) if data.has_len() else None)
                for one, data in zip(combined.flattened, inner)]
        guards.check_training_batches(train_length(trainer, each, length), loader)
        trainer._epoch_length = length
    else:
        train_data = prepared(loader)
        trainer.train_dataloader = train_data.shown  # (the loader given where Lightning's Trainer keeps it)
        length = len(train_data) if train_data.has_len() else None
        # issue 38: an empty training loader is an error (on several processes: empty on every rank)
        guards.check_training_batches(train_length(trainer, [(type(loader).__name__, length)], length), loader)
        trainer._epoch_length = evaluation.apply_limit(length, trainer.limit_train_batches, "limit_train_batches")
    trainer._num_training_batches = trainer._epoch_length
    trainer.val_check_batch = val_check_batch(trainer)
    # samples of the global order per optimizer step, all processes together (a resume says when it changes)
    accumulate = trainer.accumulate_grad_batches if trainer.module.automatic_optimization else 1
    trainer.state.global_batch_size = (samples_per_step(batch_size_of(loader), world_size) or 0) * accumulate
    # (a loader without a length ends each epoch where it runs out, as in Lightning: max_epochs passes of it)
    trainer._loader_data = train_data
    trainer._train_loaded_epoch = trainer.current_epoch  # reload_dataloaders_every_n_epochs counts from here
    epochs = EpochIterator(train_data, world_size, trainer._epoch_length, trainer.state)
    if previous is not None:
        epochs.keep_resume_of(previous)
    return epochs


def train_loaders_read(trainer):
    """The training loader(s) the fit's loop reads, in the structure trainer.train_dataloader has: the Trainer's
    rebuild where trainer.train_dataloader shows the loader given (Lightning's, which it reads as it is). None before
    the fit's training data is set up. For the Trainer's own passes over the data (StochasticWeightAveraging's
    BatchNorm update): they draw from the rebuild's generator, not from torch's global one as the given loader's
    iter() would."""
    data = trainer._loader_data
    if data is None or trainer.train_dataloader is None:
        return None
    return data.loader.iterables if isinstance(data, CombinedTrainData) else data.loader


def train_length(trainer, each, length):
    """The training loader's batches as the empty-loader rule reads them: this rank's on one process; on several, the
    total over the ranks, after Lightning's checks of a rank without batches beside ranks with some, on each loader
    (`each`: (class name, batches on this rank) of each) then on the CombinedLoader around them (`length`), as its fit
    loop (guards.check_zero_length_ranks: refused unless allow_zero_length_dataloader_with_multiple_devices)."""
    names = [name for name, _ in each] + ["CombinedLoader"]
    return guards.check_zero_length_ranks(trainer, names, [n for _, n in each] + [length])[-1]


def check_loader_workers(trainer, loader, prefix):
    """Lightning's warnings on a loader a run sets up, by global rank 0: its workers (data.check_workers), an
    evaluation loader of no batches, and a length given to an IterableDataset (each worker then iterates the whole
    stream unless told otherwise, so the length may not be what the workers yield)."""
    if trainer.is_global_zero:
        check_workers(loader, f"{prefix}_dataloader", trainer.num_devices, trainer.reload_dataloaders_every_n_epochs)
        if prefix != "train" and not isinstance(loader, (list, tuple, dict)) and _has_len(loader) and \
                len(loader) == 0:  # (an empty training loader is refused: guards.check_training_batches)
            warnings.warn(f"Total length of `{type(loader).__name__}` across ranks is zero. Please make sure this was "
                          "your intention.")
        if isinstance(getattr(loader, "dataset", None), IterableDataset) and _has_len(loader):
            warnings.warn("Your `IterableDataset` has `__len__` defined. In combination with multi-process data "
                          "loading (when num_workers > 1), `__len__` could be inaccurate if each worker is not "
                          "configured independently to avoid having duplicate data.")


def _has_len(loader):
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        return False
    return True


def val_check_batch(trainer):
    """Lightning's trainer.val_check_batch once the training data is set up: the batches between validations (an
    int interval as given, a fraction of the epoch's batches, inf for a fraction 1.0 of a loader without a length;
    None with a time interval)."""
    interval, batches = trainer.val_check_interval, trainer._num_training_batches
    if trainer._val_check_time_interval is not None:
        return None
    if isinstance(interval, int):
        return interval
    if batches is None:
        return float("inf")
    return max(1, int(batches * (1.0 if interval is None else interval)))


def plan_fit_val(trainer, module, val_loader):
    """Whether the fit validates: validation_step, limit_val_batches != 0, and a loader given or a val_dataloader
    hook. The loader itself is requested at the sanity check, at the training start, or at the first validation
    (val_data_now), as Lightning does."""
    trainer._val_loader = None
    trainer._val_loaded_epoch = -math.inf
    hooked = is_overridden("val_dataloader", trainer._attached[1] if trainer._attached[1] is not None else module,
                           DataModule if trainer._attached[1] is not None else TaskModule)
    validates = (is_overridden("validation_step", module, TaskModule) and trainer.limit_val_batches != 0
                 and (val_loader is not None or hooked))
    trainer._pending_val = (module, val_loader) if validates else None
    return bool(validates)


def val_data_now(trainer):
    """The fit's validation loaders, requested and counted the first time they are needed (None: the hook gave none,
    and the fit does not validate)."""
    if trainer._pending_val is not None:
        module, val_loader = trainer._pending_val
        trainer._pending_val = None
        owner = None if val_loader is not None else (
            trainer._attached[1] if trainer._attached[1] is not None else module)
        val_loader = val_loader if val_loader is not None else trainer._loader_of(module, "val_dataloader")
        evaluation.check_loaders_iterable(val_loader, "fit", owner, "val_dataloader")  # (Lightning's words: fit's)
        setup_val(trainer, val_loader)
    return trainer._val_loader


def val_data_at_train_start(trainer):
    """Without a sanity check, the validation loaders are requested before on_train_start when the first epoch
    validates at its end (Lightning's fit loop does, for the progress bar's totals); otherwise at the first
    validation."""
    every = trainer.check_val_every_n_epoch
    if trainer.enable_validation and (every is None or (trainer.current_epoch + 1) % every == 0):
        val_data_now(trainer)


def train_data_early(trainer, strategy):
    """The training loader before the strategy's set-up, where the strategy needs the micro-batch size in its Plan
    (DeepSpeed without one in its config, as Lightning's DeepSpeed asks for the loader in its set-up); None
    elsewhere: the loader is requested when training starts."""
    return train_data_now(trainer).given_loader if strategy.needs_micro_batch_size() else None


def datamodule_restored(trainer):
    """A DataModule's state was restored: a training loader requested from its hook before that (in
    configure_optimizers, or for the strategy's set-up) is requested again, so that the hooks see the restored
    state."""
    if trainer._train_data is not None and trainer._loaders_from_hooks[0]:
        previous = trainer._train_data
        trainer._train_data = setup_train(trainer, trainer._loader_of(trainer.module, "train_dataloader"), previous)
        trainer._train_data.given_loader = previous.given_loader


def setup_val(trainer, loader):
    """The validation loaders, counted once per fit (a fraction of a loader without a length fails here, before
    training)."""
    world_size, rank = shards(trainer)
    ones = evaluation.as_loaders(loader, "validate")
    if trainer.overfit_batches > 0:
        ones = in_order_for_overfit(ones, trainer.is_global_zero)
    ones = [trainer.strategy.process_dataloader(one) for one in ones]  # (Lightning's: what it returns is read)
    for one in ones:
        check_loader_workers(trainer, one, "val")
    val_loaders = combined_eval(loader, [prepare_eval_loader(one, world_size, rank, "val", eval_shuffle_seed(trainer),
                                                             trainer.global_rank) for one in ones])
    trainer._val_loader = val_loaders
    trainer._loader_views["validate"] = loaders_view(loader, val_loaders)  # (trainer.val_dataloaders: as given)
    limit = trainer.limit_val_batches
    # (fit's counts, whatever run the Trainer is in: fit_loop.epoch_loop.val_loop.setup_data() may be called after a
    # validate run, whose counts num_val_batches reads; trainer.num_sanity_val_batches: these cut to
    # num_sanity_val_steps, at each read)
    trainer._counts["fit"] = [0 if limit == 0 else evaluation.limit_eval(one, limit, "val") for one in val_loaders]
    _val_set_up(trainer)


def in_order_for_overfit(ones, warn):
    """Lightning's rule for fit's validation loaders under overfit_batches (its _resolve_overfit_batches, as for the
    training loader): unless every loader's sampler is a SequentialSampler, it warns and the map-style loaders are
    built again to read in order, so each validation sees the same first batches."""
    if all(isinstance(one.sampler, SequentialSampler) for one in ones if hasattr(one, "sampler")):
        return ones
    if warn:
        warnings.warn("You requested to overfit but enabled val dataloader shuffling. We are turning off the val "
                      "dataloader shuffling for you.")
    return [_with_sampler(one, SequentialSampler(one.dataset)) if isinstance(one, DataLoader) and
            not isinstance(one.dataset, IterableDataset) else one for one in ones]


def _val_set_up(trainer):
    """Lightning's evaluation loop, each time it sets up its loaders: the step of the validation's on_step values
    (each loader's batch count) starts again at 0; the epoch is noted for reload_dataloaders_every_n_epochs, except by
    a sanity check before an epoch that does not validate."""
    if trainer._metrics is not None:
        logged = trainer._metrics.eval_batches_logged
        for key in [key for key in logged if key[0] == "validate"]:
            del logged[key]
    every = trainer.check_val_every_n_epoch
    if not trainer.sanity_checking or every is None or (trainer.current_epoch + 1) % every == 0:
        trainer._val_loaded_epoch = trainer.current_epoch


def val_reload_due(trainer):
    """Lightning's rule (its evaluation loop's _should_reload_val_dl): with reload_dataloaders_every_n_epochs=n, fit's
    validation loaders are set up again once n epochs passed since they last were."""
    every = trainer.reload_dataloaders_every_n_epochs
    return bool(every) and trainer.current_epoch - getattr(trainer, "_val_loaded_epoch", -math.inf) >= every


def reload_val_when_due(trainer):
    """Before a validation of fit (Lightning's rule): with reload_dataloaders_every_n_epochs=n, the loaders are set up
    again once n epochs passed since they last were (val_dataloader called again; given loaders are kept)."""
    if not val_reload_due(trainer):
        return
    if trainer._loaders_from_hooks[1]:
        setup_val(trainer, trainer._loader_of(trainer.module, "val_dataloader"))
    else:
        _val_set_up(trainer)


def train_reload_due(trainer):
    """Lightning's rule (its fit loop's _should_reload_train_dl), asked when the fit's loop starts and before each
    epoch: with reload_dataloaders_every_n_epochs=n, the training loader is requested again once n epochs passed since
    it last was, counted in current_epoch. So a fit resumed from an epoch-end checkpoint of epoch E, whose loader is
    requested at E (the checkpoint's current_epoch), reloads it at E + n: with n=1 at its first epoch too."""
    every = trainer.reload_dataloaders_every_n_epochs
    return bool(every) and trainer.current_epoch - getattr(trainer, "_train_loaded_epoch", -math.inf) >= every


def reload(trainer, fit):
    """The training loader from its hook again (reload_dataloaders_every_n_epochs), keeping the pending resume of the
    one it replaces. A given loader stays (its epoch is noted all the same, as Lightning's set-up notes it)."""
    train_data = fit.epochs
    trainer._train_loaded_epoch = trainer.current_epoch
    if trainer._loaders_from_hooks[0]:
        fit.epochs = setup_train(trainer, trainer._loader_of(trainer.module, "train_dataloader"), train_data)
    # (the validation loaders: at the validation, reload_val_when_due)


def batch_size_of(loader):
    """Samples per micro-batch of a training loader, where it says (None: a custom batch sampler, ...)."""
    size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if size else None
