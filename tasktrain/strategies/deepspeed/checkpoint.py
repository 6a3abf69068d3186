"""DeepSpeed checkpoint directories: their file names, and the converters between them and plain checkpoints
(`tasktrain convert`)."""
import contextlib
import io
import os
import shutil

import torch

from tasktrain.checkpoint_io import (CheckpointError, atomic_save, check_files, format_header, load_checkpoint_file,
                                     load_resumable_file, own_state, plain_name, replace_dir, safe_load, weights_file,
                                     with_own)
from tasktrain.strategies.deepspeed.engine import import_deepspeed


STATE_FILE = "tasktrain_state.pt"  # our part of a checkpoint directory: loop state, callbacks, RNG, ...
ENGINE_TAG = "zero"  # engine.save_checkpoint(tag=...): one fixed tag per checkpoint directory
SIXTEEN_BIT_FILE = "model_16bit.pt"  # save_16bit_model=True: consolidated 16-bit weights for inference
_WRAPPER_PREFIX = "module."  # parameter names under our _EngineForward wrapper
def check_deepspeed_folder(directory):
    """Issue 38: every torch file of a DeepSpeed checkpoint directory (the engine's model and optimizer states, a
    universal checkpoint's files, ours) passes the weights_only check with DeepSpeed's allow-list before DeepSpeed's
    own loaders (load_checkpoint, zero_to_fp32, ds_to_universal: weights_only=False) unpickle any of it. The scripts
    DeepSpeed copies in (zero_to_fp32.py) are never run."""
    directory = os.fspath(directory)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else DeepSpeed warns that it fell back to the CPU
    import_deepspeed()  # the allow-list's classes are DeepSpeed's (imported without mlflow: engine.py)
    check_files(sorted(os.path.join(folder, name) for folder, _, names in os.walk(directory) for name in names
                       if name.endswith(".pt")), "deepspeed")


def _strip(key, prefix):
    """The plain name of an engine's key: without our wrapper's prefix, nor the "_orig_mod." of compiled submodules."""
    return plain_name(key[len(prefix):] if prefix and key.startswith(prefix) else key)


def convert_zero_checkpoint(checkpoint_dir, output_path=None, optimizer=False):
    """Consolidate a DeepSpeed checkpoint directory into one checkpoint dict in our format.

    By default the fp32 weights only (Lightning's layout: {"state_dict": ..., "hyper_parameters": ..., "loops":
    {"weights_only": True, ...}, ...}: checkpoint_io.weights_file):
    `TaskModule.load_from_checkpoint(output_path)` and `torch.load(output_path, weights_only=True)` read it.
    With `optimizer=True`, a whole resumable checkpoint instead: the optimizer's state (each parameter's moments
    and step count, the groups' hyper-parameters, as torch's optimizer.state_dict() lays them out, through
    DeepSpeed's universal checkpoint), the loop's state, schedulers, callbacks and random states, so that a fit
    on another strategy (one process or DDP) continues the run. With `output_path`, it is also written there.
    Runs in one process; needs as much memory as the whole model (and, with the optimizer, its state) in fp32.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"{checkpoint_dir!r} is not a directory: convert takes a DeepSpeed checkpoint directory "
                              "(what ModelCheckpoint writes under the DeepSpeed strategy).")
    check_deepspeed_folder(checkpoint_dir)
    state_file = os.path.join(checkpoint_dir, STATE_FILE)
    ckpt = load_checkpoint_file(state_file) if os.path.isfile(state_file) else {}
    meta = own_state(ckpt).get("deepspeed", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{state_file!r} is corrupted: its 'deepspeed' entry is a {type(meta).__name__}.")
    tag = meta.get("tag")
    if tag is None and not os.path.isfile(os.path.join(checkpoint_dir, "latest")):
        raise CheckpointError(f"{checkpoint_dir!r} has neither {STATE_FILE} nor DeepSpeed's 'latest' file: not a "
                              "DeepSpeed checkpoint directory.")
    if meta.get("stage") == 0 and optimizer:
        raise CheckpointError(f"{checkpoint_dir!r} was written at ZeRO stage 0, which has no shards to consolidate: "
                              "its engine file holds the whole module already.")
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else DeepSpeed warns that it fell back to the CPU
    prefix = meta.get("key_prefix", "")
    try:
        return _convert(checkpoint_dir, output_path, optimizer, ckpt, meta, tag, prefix)
    except CheckpointError:
        raise
    except Exception as err:  # the files passed the safety check but do not make a checkpoint (damaged, incomplete)
        raise CheckpointError(f"{checkpoint_dir!r} is not a complete DeepSpeed checkpoint and cannot be converted "
                              f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}).") from None


def _convert(checkpoint_dir, output_path, optimizer, ckpt, meta, tag, prefix):
    if optimizer:
        return _convert_with_optimizer(checkpoint_dir, ckpt, tag, prefix, output_path)
    if meta.get("universal"):  # written by `tasktrain convert --to deepspeed`: no shards, the universal layout
        from tasktrain.strategies.deepspeed.universal import read_universal

        weights = read_universal(checkpoint_dir, tag)[0]
    elif meta.get("stage") == 0:  # (an evaluation engine's save below stage 3, or a stage-0 fit): whole, in one file
        weights = safe_load(os.path.join(checkpoint_dir, tag, "mp_rank_00_model_states.pt"), "deepspeed")["module"]
    else:
        import_deepspeed()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        # It prints a progress report per shard (and its errors are raised, not printed).
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            weights = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=tag)
    state_dict = {_strip(k, prefix): v.contiguous() for k, v in weights.items()}
    out = weights_file(ckpt, state_dict, world_size=own_state(ckpt).get("world_size", meta.get("world_size")))
    if output_path is not None:
        atomic_save(out, os.fspath(output_path))
    return out


def _convert_with_optimizer(checkpoint_dir, ckpt, tag, prefix, output_path):
    from tasktrain.strategies.deepspeed import universal

    own = own_state(ckpt)
    names = own.get("optimizer_param_names")
    if own.get("weights_only") or not own.get("train_state") or not names:
        raise CheckpointError(
            f"{checkpoint_dir!r} does not say which parameter each part of its optimizer state belongs to (it was "
            "written with weights only, by an older tasktrain, or not by the Trainer): only its weights can be "
            "converted. Leave out --to ckpt.")
    if len(names) != 1:
        raise CheckpointError(f"{checkpoint_dir!r} has {len(names)} optimizers; a DeepSpeed checkpoint has one.")
    utag = tag if own.get("deepspeed", {}).get("universal") else universal.to_universal(checkpoint_dir, tag)
    weights, param_state, universal_groups = universal.read_universal(checkpoint_dir, utag)
    saved = (ckpt.get("optimizer_states") or [{}])[0]
    hyper = saved.get("param_groups") or universal_groups
    state, groups, index = {}, [], 0
    for group_names, group in zip(names[0], hyper):
        ids = []
        for name in group_names:
            entry = param_state.get(prefix + name)
            if entry is not None:
                shape = weights[prefix + name].shape
                state[index] = {key: (torch.tensor(float(value)) if key == "step" else value.reshape(shape))
                                for key, value in entry.items()}
            ids.append(index)
            index += 1
        groups.append(dict(group, params=ids))
    out = {key: value for key, value in ckpt.items() if key not in ("deepspeed", "optimizer_states")}
    out.update({
        "state_dict": {_strip(k, prefix): v.contiguous() for k, v in weights.items()},
        "optimizer_states": [{"state": state, "param_groups": groups}],
        "loops": {**{k: v for k, v in own.items() if k != "deepspeed"}, **format_header(), "weights_only": False},
    })
    if output_path is not None:
        atomic_save(out, os.fspath(output_path))
    return out


def convert_to_deepspeed(checkpoint_path, output_dir):
    """Write a plain checkpoint (a Trainer checkpoint of one process or DDP, one file) as a DeepSpeed
    checkpoint directory that any ZeRO stage resumes on any number of processes, optimizer state included: the
    weights and each parameter's Adam moments and step count in DeepSpeed's universal layout, and the rest of the
    checkpoint (loop state, schedulers, callbacks, random states) in our state file. Returns `output_dir`; a
    directory already there is replaced only once the new one is complete."""
    from tasktrain.strategies.deepspeed import universal

    ckpt = load_resumable_file(checkpoint_path, "a DeepSpeed fit")
    own = own_state(ckpt)
    names = own["optimizer_param_names"]
    if len(ckpt["optimizer_states"]) != 1:
        raise CheckpointError(f"{checkpoint_path!r} has {len(ckpt['optimizer_states'])} optimizers; DeepSpeed drives "
                              "one per engine.")
    optimizer, group_names = ckpt["optimizer_states"][0], names[0]
    if len(optimizer["param_groups"]) != len(group_names):
        raise CheckpointError(f"{checkpoint_path!r}: its optimizer state and its parameter names disagree.")
    prefix = _WRAPPER_PREFIX  # the Trainer's engine names; a load by the Accelerator renames (rekeyed)
    param_state = {}
    for group, names_of_group in zip(optimizer["param_groups"], group_names):
        for index, name in zip(group["params"], names_of_group):
            if name is None:
                raise CheckpointError(f"{checkpoint_path!r}: a parameter of its optimizer is not one of the module's.")
            if index in optimizer["state"]:
                param_state[prefix + name] = optimizer["state"][index]
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer["param_groups"]]
    output_dir = os.path.abspath(os.fspath(output_dir))
    tmp = f"{output_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tag = universal.universal_tag(ENGINE_TAG)
        universal.write_universal(tmp, tag, {prefix + k: v for k, v in ckpt["state_dict"].items()}, param_state,
                                  hyper, global_steps=own.get("train_state", {}).get("global_step", 0))
        state = {key: value for key, value in ckpt.items() if key != "optimizer_states"}
        state.update(state_dict={}, optimizer_states=[{"deepspeed": "in the universal checkpoint of this directory",
                                                       "param_groups": hyper}])
        state = with_own(state, deepspeed={"tag": tag, "universal": True, "stage": None,
                                           "world_size": own.get("world_size"), "key_prefix": prefix})
        atomic_save(state, os.path.join(tmp, STATE_FILE))
        replace_dir(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


def _check_no_zero3_placeholders(obj, where):
    if not isinstance(obj, dict):
        return
    empty = [k for k, v in obj.items() if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == 0]
    if empty:
        raise ValueError(
            f"Refusing to save {where}: the state dict holds ZeRO-3 placeholders (shape (0,) tensors, e.g. "
            f"{empty[0]!r}) instead of weights, because under DeepSpeed stage 3 each process holds only a slice of "
            "every parameter. Build it with accelerator.get_state_dict(model), called on every process, which "
            "gathers the slices."
        )
