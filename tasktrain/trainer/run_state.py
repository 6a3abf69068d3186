"""The run state: what a run saves to continue exactly, as one dict of stateful parts.

As torchtitan's checkpointer holds `Stateful` parts, a run's state is `RunState({name: part})`, each part with
`state_dict()` and `load_state_dict(state)`; a checkpoint is the dict of their states, with a versioned header
(checkpoint_io.format_header: format_version, tasktrain_version, torch_version). The Trainer's checkpoints and the
Accelerator's save_state are both written and read through it, from the same parts:

    what                   Trainer key                 Accelerator key    part
    the weights            state_dict                  models             Weights (through the strategy: an
                                                                          engine's shards)
    the optimizers         optimizer_states            optimizers         Optimizers (through the strategy)
    the schedulers         lr_schedulers               schedulers         Objects
    loss scaling           <plugin class qualname>     precision          the precision plugin
    the data position      loops.train_state           loaders            TrainState / each prepared loader's
                                                                          epoch iterator
    the loop position      loops.train_state           loop               TrainState / AcceleratorLoop (steps,
                                                                          window, seed)
    callbacks and objects  callbacks                   custom             Callbacks (by state_key) / Objects
    the DataModule         <its class qualname>        -                  the DataModule's state_dict()
    metrics                loops.metrics               -                  MetricStore (self.log's epoch
                                                                          accumulators)
    random generators      loops.rng_states            rng_states         RandomStates (every rank's, restored
                                                                          later)
    parameter names        loops.optimizer_param_names -                  per optimizer and group (conversions)
    the header             loops.format_version, ...   format_version, ...
    who wrote it           loops.world_size,           world_size         the number of processes; a
                           loops.weights_only                             weights-only file resumes nothing

The Trainer's top-level keys are exactly Lightning 2.6's (epoch, global_step, pytorch-lightning_version,
state_dict, loops, callbacks, optimizer_states, lr_schedulers, the precision plugin's and the DataModule's states
under their class names when non-empty, hyper_parameters when there are any: scripts and tools read
ckpt["state_dict"], ckpt["callbacks"]); everything only tasktrain reads is under Lightning's loop-state key "loops"
(a RunState of its own, with the header). The Accelerator's parts are lists because it prepares any number of
each, its header at the top level. `register_for_checkpointing` adds an object to the Accelerator's "custom" part.
Files of formats 1 and 2 load: `upgrade` maps them (checkpoint_io.upgrade_layout for the Trainer's).
"""
import warnings

import numpy as np
import torch

from tasktrain import checkpoint_io as ckpt_io


class RunState:
    """{name: part}; state_dict() is the checkpoint dict (each part's state under its name, after the header when
    `header`)."""

    def __init__(self, parts, header=True):
        self.parts, self.header = dict(parts), header

    def state_dict(self) -> dict:
        header = ckpt_io.format_header() if self.header else {}
        return {**header, **{name: part.state_dict() for name, part in self.parts.items()}}

    def load_state_dict(self, checkpoint: dict, only=None):
        """Each part (or those named in `only`, in that order) from its entry; a part the file lacks is left as is
        (a file written before that part existed)."""
        for name in only if only is not None else self.parts:
            if name in checkpoint:
                self.parts[name].load_state_dict(checkpoint[name])


def upgrade(checkpoint: dict) -> dict:
    """A checkpoint of an older format, in the current one (the dict itself when it is current). Format 3 changed
    the Trainer's layout only (checkpoint_io.upgrade_layout: load_checkpoint_file applies it already)."""
    checkpoint = ckpt_io.upgrade_layout(checkpoint)
    if (ckpt_io.format_version(checkpoint) or 1) >= 2:
        return checkpoint
    if "loaders" in checkpoint and "loop" not in checkpoint:  # the Accelerator's format 1: the loop at the top
        checkpoint = dict(checkpoint)
        checkpoint["loop"] = {"data_seed": checkpoint.pop("data_seed", None),
                              "micro_step": checkpoint.pop("accumulation", {}).get("micro_step", 0),
                              "steps": checkpoint.pop("steps", 0)}
    return checkpoint


# -- the parts ---------------------------------------------------------------------------------------------------------
class Weights:
    """The module's weights through the strategy (DeepSpeed and FSDP keep them in their own shards); `models` are
    the Accelerator's prepared models, None for the Trainer's one module."""

    def __init__(self, strategy, models=None):
        self.strategy, self.models = strategy, models

    def state_dict(self):
        if self.models is None:
            return self.strategy.module_state_dict()
        return [self.strategy.module_state_dict(model) for model in self.models]

    def load_state_dict(self, state):
        if self.models is None:
            self.strategy.load_module_state_dict(state)
            return
        for model, model_state in zip(self.models, state):
            self.strategy.load_module_state_dict(model_state, model)


class Optimizers:
    """The optimizers' states through the strategy (an engine's optimizer writes its own partitions)."""

    def __init__(self, strategy, optimizers):
        self.strategy, self.optimizers = strategy, optimizers

    def state_dict(self):
        return [self.strategy.optimizer_state(optimizer) for optimizer in self.optimizers]

    def load_state_dict(self, states):
        for optimizer, state in zip(self.optimizers, states):
            self.strategy.load_optimizer_state(optimizer, state)


class Objects:
    """A list of objects with state_dict/load_state_dict (schedulers, the Accelerator's registered objects,
    its loaders), saved and loaded in order."""

    def __init__(self, objects):
        self.objects = objects

    def state_dict(self):
        return [obj.state_dict() for obj in self.objects]

    def load_state_dict(self, states):
        for obj, state in zip(self.objects, states):
            obj.load_state_dict(state)


class Callbacks:
    """Callbacks by their state_key: a callback the file has no state for keeps its own."""

    def __init__(self, callbacks):
        self.callbacks = callbacks

    def state_dict(self):
        # Lightning's: a callback whose state_dict() is empty is not saved (loading skips a missing key)
        states = ((cb.state_key, cb.state_dict()) for cb in self.callbacks)
        return {key: state for key, state in states if state}

    def load_state_dict(self, states):
        found = set()
        for cb in self.callbacks:
            # a key the callback used before (getattr: the base Callback has none) still finds its state; a tuple
            # only (Lightning's DummyLogger answers every attribute with a function)
            legacy = getattr(cb, "_legacy_state_keys", ())
            keys = (cb.state_key, *(legacy if isinstance(legacy, (tuple, list)) else ()))
            key = next((k for k in keys if k in states), None)
            if key is not None:
                found.add(key)
            if key is not None and states[key]:  # (Lightning's: an empty state, or None from an override, is skipped)
                cb.load_state_dict(states[key])
        missing = [key for key, state in states.items() if state and key not in found]
        if missing:  # Lightning's warning (it saves only callbacks with a state: an empty one is not missed)
            warnings.warn("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be "
                          f"provided during `Trainer` instantiation. Please add the following callbacks: {missing}.",
                          UserWarning)


class RandomStates:
    """Every rank's random generators (gathered on save: a resume on another number of processes hands them out).
    Loading only keeps them: the caller restores this rank's when the loop is about to continue."""

    def __init__(self, strategy):
        self.strategy, self.loaded = strategy, None

    def state_dict(self):
        # the tensors travel as numpy arrays: pickling a tensor runs torch.save (its storage's reduction), which a
        # hook on torch.save would count as a checkpoint write on every rank, where Lightning's ranks write nothing
        gathered = self.strategy.all_gather_object(_map_arrays(ckpt_io.collect_rng_states(), torch.Tensor,
                                                               lambda t: t.numpy()))
        return _map_arrays(gathered, np.ndarray, torch.from_numpy)

    def load_state_dict(self, states):
        self.loaded = states


def _map_arrays(obj, kind, fn):
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_arrays(v, kind, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_arrays(v, kind, fn) for v in obj)
    return obj


class Value:
    """A plain value (a number, a list of names) under a key: saved as it is, loading hands it to `load`."""

    def __init__(self, value, load=None):
        self.value, self._load = value, load

    def state_dict(self):
        return self.value() if callable(self.value) else self.value

    def load_state_dict(self, state):
        if self._load is not None:
            self._load(state)


def check_counts(checkpoint: dict, name: str, mine: int, message):
    """The file holds as many `name` as this run has, or `message(saved)` is raised."""
    saved = len(checkpoint.get(name, []) or [])
    if saved != mine:
        raise ValueError(message(saved))


def check_global_batch(source, saved, now, processes, per_batch, accumulate, continues_at):
    """A resume that changes the samples per optimizer step over all processes (saved -> now) is said once, by the
    caller's rank 0 (the Trainer's resume and the Accelerator's prepared loaders). 0 on either side: not known."""
    if saved and now and saved != now:
        from tasktrain.trainer.epoch import warn_global_batch_change

        warn_global_batch_change(source, saved, now, f"{processes} process{'es' if processes > 1 else ''} x "
                                 f"{per_batch} per batch x {accumulate} accumulated", continues_at)
