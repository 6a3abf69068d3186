"""The fit's data, set up for the Trainer: the training loader prepared once (sharded over the data-parallel ranks,
dispatched or sliced by its kind, limited, its epoch iterator built), the validation loaders counted, both reloaded
from the hooks when asked (reload_dataloaders_every_n_epochs, a resumed DataModule).

Functions over the Trainer: what they set on it (train_dataloader, num_training_batches, num_val_batches, ...) are
the Trainer's public attributes, Lightning's names."""
from tasktrain.trainer import evaluation, guards
from tasktrain.trainer.data import prepare_eval_loader, prepare_train_data, samples_per_step
from tasktrain.trainer.epoch import EpochIterator
from tasktrain.trainer.module import TaskModule, is_overridden


def shards(trainer):
    """(world size, rank) the loaders are sharded for: (1, 0) with use_distributed_sampler=False. Tensor-parallel
    peers read the same data: only the data-parallel ranks split it."""
    if not trainer.use_distributed_sampler:
        return 1, 0
    return trainer.strategy.data_parallel_size, trainer.strategy.data_parallel_rank


def train_data_now(trainer):
    """The fit's training data, requested and prepared once (from configure_optimizers on)."""
    if trainer._train_data is None:
        module, train_loader = trainer._pending_train
        train_loader = train_loader if train_loader is not None else trainer._loader_of(module, "train_dataloader")
        if train_loader is None:
            raise ValueError("fit needs training data: pass train_dataloaders or datamodule=, or define "
                             "train_dataloader() on the module.")
        trainer._train_data = setup_train(trainer, train_loader)
        trainer._train_data.given_loader = train_loader
    return trainer._train_data


def setup_train(trainer, loader, previous=None):
    """The epoch iterator of a training loader (a rebuilt loader keeps the resume of the `previous` one)."""
    world_size, rank = shards(trainer)
    train_data = prepare_train_data(loader, world_size, rank, trainer.state.data_seed,
                                    shuffle=False if trainer.overfit_batches else None,
                                    broadcast=trainer.strategy.broadcast, reads=trainer.strategy.is_global_zero)
    trainer.train_dataloader = train_data.loader
    length = len(train_data) if train_data.has_len() else None
    guards.check_training_batches(length, loader)  # issue 38: an empty training loader is an error
    trainer._epoch_length = evaluation.apply_limit(length, trainer.limit_train_batches, "limit_train_batches")
    trainer.num_training_batches = trainer._epoch_length
    # samples of the global order per optimizer step, all processes together (a resume says when it changes)
    accumulate = trainer.accumulate_grad_batches if trainer.module.automatic_optimization else 1
    trainer.state.global_batch_size = (samples_per_step(batch_size_of(loader), world_size) or 0) * accumulate
    if trainer.num_training_batches is None and trainer.max_steps == -1:
        raise ValueError(
            "The training loader has no length (an infinite or iterable dataset) and max_steps is not set, so "
            "training would never end. Set Trainer(max_steps=N), or give the loader a __len__ / set "
            "limit_train_batches=N to define an epoch."
        )
    trainer._loader_data = train_data
    epochs = EpochIterator(train_data, world_size, trainer._epoch_length, trainer.state)
    if previous is not None:
        epochs.keep_resume_of(previous)
    return epochs


def setup_fit_val(trainer, module, val_loader):
    """The fit's validation loaders; False when it has none (no validation_step, limit_val_batches=0, None)."""
    if not is_overridden("validation_step", module, TaskModule) or trainer.limit_val_batches == 0:
        return False
    val_loader = val_loader if val_loader is not None else trainer._loader_of(module, "val_dataloader")
    if val_loader is None:
        return False
    setup_val(trainer, val_loader)
    return True


def setup_val(trainer, loader):
    """The validation loaders, counted once per fit (a fraction of a loader without a length fails here, before
    training)."""
    world_size, rank = shards(trainer)
    val_loaders = [prepare_eval_loader(one, world_size, rank) for one in evaluation.as_loaders(loader)]
    trainer._val_loader = val_loaders
    limit, sanity_steps = trainer.limit_val_batches, trainer.num_sanity_val_steps
    trainer.num_val_batches = [0 if limit == 0 else evaluation.limit_eval(one, limit) for one in val_loaders]
    trainer.num_sanity_val_batches = [evaluation.sanity_limit(one, limit, sanity_steps) if sanity_steps else 0
                                      for one in val_loaders]


def reload(trainer, fit, train_data=None, has_val=None):
    """The loaders from the hooks again (reload_dataloaders_every_n_epochs; a resumed DataModule's state): the
    training one keeps the pending resume of the one it replaces. Given loaders stay."""
    from_train_hook, from_val_hook = trainer._loaders_from_hooks
    train_data = fit.epochs if fit is not None else train_data
    has_val = trainer._val_loader is not None if has_val is None else has_val
    if from_train_hook:
        train_data = setup_train(trainer, trainer._loader_of(trainer.module, "train_dataloader"), train_data)
        if fit is not None:
            fit.epochs = train_data
    if from_val_hook and has_val:
        setup_val(trainer, trainer._loader_of(trainer.module, "val_dataloader"))
    return train_data


def batch_size_of(loader):
    """Samples per micro-batch of a training loader, where it says (None: a custom batch sampler, ...)."""
    size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if size else None
