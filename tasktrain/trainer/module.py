"""TaskModule: the user's model plus the hooks the Trainer calls."""
import copy
import inspect
import numbers

import torch

from tasktrain.tree import apply_to_leaves

_NOT_SET = object()


class AttributeDict(dict):
    """A dict whose keys read as attributes: `self.hparams.lr`."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"No hyper-parameter {key!r}; saved ones: {sorted(self)}") from err

    def __setattr__(self, key, value):
        self[key] = value


class TaskModule(torch.nn.Module):
    automatic_optimization = True

    def __init__(self):
        super().__init__()
        # Plain attributes, not submodules: the trainer must never become part of the state dict.
        object.__setattr__(self, "_trainer", None)
        object.__setattr__(self, "_hparams", AttributeDict())

    # -- what the user writes ----------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        raise NotImplementedError(
            f"{type(self).__name__} has no training_step. Define `def training_step(self, batch, batch_idx)` "
            "returning the loss tensor (or a dict with a 'loss' key)."
        )

    # validation_step, test_step, predict_step are optional: the Trainer checks whether they are defined.

    def predict_step(self, batch, batch_idx):
        batch = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(batch)

    def configure_optimizers(self):
        raise NotImplementedError(
            f"{type(self).__name__} has no configure_optimizers. Define it to return an optimizer, e.g. "
            "`return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
        )

    def train_dataloader(self):
        return None

    def val_dataloader(self):
        return None

    def test_dataloader(self):
        return None

    def predict_dataloader(self):
        return None

    # -- hooks (no-ops; the Trainer calls only the ones a subclass overrides) -------------------------------------
    def on_fit_start(self): ...
    def on_fit_end(self): ...
    def on_train_start(self): ...
    def on_train_end(self): ...
    def on_train_epoch_start(self): ...
    def on_train_epoch_end(self): ...
    def on_train_batch_start(self, batch, batch_idx): ...
    def on_train_batch_end(self, outputs, batch, batch_idx): ...
    def on_validation_start(self): ...
    def on_validation_end(self): ...
    def on_validation_epoch_start(self): ...
    def on_validation_epoch_end(self): ...
    def on_validation_batch_start(self, batch, batch_idx): ...
    def on_validation_batch_end(self, outputs, batch, batch_idx): ...
    def on_test_start(self): ...
    def on_test_end(self): ...
    def on_test_epoch_start(self): ...
    def on_test_epoch_end(self): ...
    def on_test_batch_start(self, batch, batch_idx): ...
    def on_test_batch_end(self, outputs, batch, batch_idx): ...
    def on_predict_start(self): ...
    def on_predict_end(self): ...
    def on_predict_epoch_start(self): ...
    def on_predict_epoch_end(self): ...
    def on_predict_batch_start(self, batch, batch_idx): ...
    def on_predict_batch_end(self, outputs, batch, batch_idx): ...
    def on_before_backward(self, loss): ...
    def on_after_backward(self): ...
    def on_before_optimizer_step(self, optimizer): ...
    def on_before_zero_grad(self, optimizer): ...
    def on_save_checkpoint(self, checkpoint): ...
    def on_load_checkpoint(self, checkpoint): ...
    def setup(self, stage): ...
    def teardown(self, stage): ...

    def __getstate__(self):
        # A copy or a pickle of the module (AveragedModel's deepcopy, a spawned worker) never takes the trainer along.
        state = dict(self.__dict__)
        state["_trainer"] = None
        return state

    # -- what the trainer gives the module ---------------------------------------------------------------------
    @property
    def trainer(self):
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call trainer.fit(module) first.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer):
        object.__setattr__(self, "_trainer", trainer)

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    def print(self, *args, **kwargs):
        if self.global_rank == 0:
            print(*args, **kwargs)

    # -- logging -----------------------------------------------------------------------------------------------
    def log(self, name, value, prog_bar=False, logger=True, on_step=None, on_epoch=None, reduce_fx="mean",
            sync_dist=False, batch_size=None, reduce=None):
        """Record a metric. Values stay tensors until a logger or the progress bar needs them."""
        trainer = self._trainer
        if trainer is None or trainer._metrics is None:
            raise RuntimeError(f"self.log({name!r}, ...) was called outside a Trainer run.")
        trainer._metrics.log(name, value, prog_bar, logger, on_step, on_epoch, reduce or reduce_fx, sync_dist,
                             batch_size)

    def log_dict(self, metrics: dict, **kwargs):
        for name, value in metrics.items():
            self.log(name, value, **kwargs)

    def all_gather(self, data):
        """Gather a tensor (or a dict/list of tensors) from every rank: a new leading dimension of world size."""
        strategy = self.trainer.strategy

        def gather(leaf):
            if not isinstance(leaf, torch.Tensor):
                leaf = torch.tensor(leaf, device=strategy.root_device)
            return strategy.all_gather(leaf)

        return apply_to_leaves(data, gather)

    # -- hyper-parameters ----------------------------------------------------------------------------------------
    def save_hyperparameters(self, *names, ignore=()):
        """Store the calling __init__'s arguments in self.hparams (and in checkpoints)."""
        frame = inspect.currentframe().f_back
        init_args = {}
        # Walk up through the __init__ chain of subclasses so the outermost __init__'s arguments win.
        while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is self:
            info = inspect.getargvalues(frame)
            local = info.locals
            args = {k: local[k] for k in info.args[1:] if k in local}
            if info.varargs and local.get(info.varargs):
                args[info.varargs] = list(local[info.varargs])
            if info.keywords:
                args.update(local.get(info.keywords, {}))
            init_args = {**args, **init_args}
            frame = frame.f_back
        if names and len(names) == 1 and isinstance(names[0], dict):
            init_args = dict(names[0])
        elif names:
            missing = [n for n in names if n not in init_args]
            if missing:
                raise ValueError(f"save_hyperparameters: {missing} are not arguments of __init__ ({sorted(init_args)}).")
            init_args = {n: init_args[n] for n in names}
        for name in ignore if not isinstance(ignore, str) else [ignore]:
            init_args.pop(name, None)
        for key, value in init_args.items():
            if isinstance(value, torch.nn.Module):
                continue  # modules are weights, not hyper-parameters
            self._hparams[key] = copy.deepcopy(value) if _is_plain(value) else value

    # -- manual optimisation ---------------------------------------------------------------------------------------
    def optimizers(self):
        from tasktrain.trainer.optim import ManualOptimizer

        opts = [ManualOptimizer(o, self.trainer) for o in self.trainer.optimizers]
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self):
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss, *args, **kwargs):
        trainer = self.trainer
        trainer._call("on_before_backward", loss)
        trainer.strategy.backward(loss, *args, **kwargs)
        trainer._call("on_after_backward")

    # -- loading -----------------------------------------------------------------------------------------------
    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location="cpu", strict=True, **overrides):
        """Rebuild the module from a checkpoint's saved hyper-parameters (overridden by **overrides)."""
        from tasktrain.checkpoint_io import load_checkpoint_file, load_plain_state_dict

        ckpt = load_checkpoint_file(checkpoint_path, map_location=map_location)
        hparams = dict(ckpt.get("hyper_parameters") or {})
        hparams.update(overrides)
        params = inspect.signature(cls.__init__).parameters
        takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
        kwargs = hparams if takes_kwargs else {k: v for k, v in hparams.items() if k in params}
        module = cls(**kwargs)
        module.on_load_checkpoint(ckpt)
        load_plain_state_dict(module, ckpt["state_dict"], strict=strict)
        return module


def _is_plain(value):
    return isinstance(value, (numbers.Number, str, bool, type(None), list, tuple, dict))


def is_overridden(name, obj, base) -> bool:
    if name in getattr(obj, "__dict__", {}):
        return True  # set on the instance (LambdaCallback): it replaces the class's method
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)
