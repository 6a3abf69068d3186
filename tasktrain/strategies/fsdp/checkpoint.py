"""FSDP checkpoint directories: DCP shards (torch.distributed.checkpoint) next to our state file, and the
converters between them and plain checkpoints (`tasktrain convert`)."""
import os
import warnings

import torch

from tasktrain.checkpoint_io import (CheckpointError, atomic_save, format_header, load_checkpoint_file,
                                     load_resumable_file, own_state, plain_name, read_dcp, replace_dir, weights_file,
                                     with_own, without_own)
from tasktrain.strategies.fsdp.sharding import _holds_dtensors, _keyed_by_name

STATE_FILE = "tasktrain_state.pt"  # our part of a checkpoint directory (loop state, callbacks, RNG, ...)
# The checkpoint values that hold shards (the Trainer's, then the Accelerator's save_state): written by DCP.
_SHARD_KEYS = ("state_dict", "optimizer_states", "models", "optimizers")
_SHARDED_MARK = "sharded: in the DCP files of this checkpoint directory"


def _split(checkpoint):
    """(the DCP part: the values holding shards, the rest: our state file, with a mark where a value went)."""
    shards, state = {}, dict(checkpoint)
    for key in _SHARD_KEYS:
        if key in state and _holds_dtensors(state[key]):
            shards[key] = state[key]
            state[key] = _SHARDED_MARK
    return shards, state


def is_fsdp_checkpoint(path) -> bool:
    """A directory written by this strategy (DCP's .metadata next to our state file)."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, STATE_FILE))


def convert_fsdp_checkpoint(checkpoint_dir, output_path=None, optimizer=False):
    """Gather the shards of an FSDP checkpoint directory (written by the Trainer) into one checkpoint dict in our
    format. Returns it and, with `output_path`, writes it there.

    By default the module's weights only (the optimizer's shards stay behind): `TaskModule.load_from_checkpoint`
    reads it. With `optimizer=True`, a whole resumable checkpoint instead: the optimizer state in the layout of
    torch's optimizer.state_dict() (keyed by parameter number over the groups, in order, with the names of those
    parameters in `optimizer_param_names`), and the loop state, schedulers, callbacks and random states as saved,
    so that a fit on one process, DDP or (through `convert_to_deepspeed`) DeepSpeed continues the run. Runs in one
    process, without a process group (DCP's no-dist load); needs as much memory as the whole module (and, with the
    optimizer, its state)."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    ckpt = _read_fsdp_state(checkpoint_dir)
    try:
        return _convert(checkpoint_dir, output_path, optimizer, ckpt)
    except CheckpointError:
        raise
    except Exception as err:  # the files passed the safety check but do not make a checkpoint (damaged, incomplete)
        raise CheckpointError(f"{checkpoint_dir!r} is not a complete FSDP checkpoint and cannot be converted "
                              f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}).") from None


def _convert(checkpoint_dir, output_path, optimizer, ckpt):
    key = "state_dict" if ckpt.get("state_dict") == _SHARDED_MARK else "models"
    if ckpt.get(key) != _SHARDED_MARK:
        raise CheckpointError(f"{checkpoint_dir!r} holds no sharded module weights.")
    if optimizer:
        return _whole_from_fsdp(checkpoint_dir, ckpt, output_path)
    loaded = _load_without_process_group(checkpoint_dir, {key})[key]
    state_dict = _owned(loaded if key == "state_dict" else loaded[0])
    out = weights_file(ckpt, state_dict, world_size=own_state(ckpt).get("fsdp", {}).get("world_size"))
    if output_path is not None:
        atomic_save(out, os.fspath(output_path))
    return out


def _read_fsdp_state(checkpoint_dir):
    if not is_fsdp_checkpoint(checkpoint_dir):
        if os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
            raise CheckpointError(
                f"{checkpoint_dir!r} holds DCP shards but no {STATE_FILE}: not a checkpoint of the Trainer's FSDP "
                "strategy. For the Accelerator's save_state directory (accelerator_state.pt beside the shards): "
                "`tasktrain convert DIR OUT_DIR --to ckpt` (or convert_fsdp_state_dir) writes the directory "
                "save_state writes without FSDP; load_state(dir) under FSDP reads it on any number of processes "
                "as it is.")
        raise CheckpointError(f"{checkpoint_dir!r} is not an FSDP checkpoint directory (it needs {STATE_FILE} and "
                              "DCP's .metadata).")
    return load_checkpoint_file(os.path.join(checkpoint_dir, STATE_FILE))


def _load_without_process_group(checkpoint_dir, keys):
    return read_dcp(checkpoint_dir, set(keys))  # issue 38: .metadata and non-tensor items read the safe way


def _owned(state):
    """Tensors that own their memory (a view would make torch.save write the storage it is a view of)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() != v.nbytes else v
            for k, v in state.items()}


def _whole_from_fsdp(checkpoint_dir, ckpt, output_path):
    own = own_state(ckpt)
    names = own.get("optimizer_param_names")
    if own.get("weights_only") or not ckpt.get("optimizer_states") or not names:
        raise CheckpointError(
            f"{checkpoint_dir!r} holds no optimizer state with the names of its parameters (written with weights "
            "only, without an optimizer, or by an older tasktrain): only its weights can be converted. Leave out "
            "--to ckpt.")
    # An optimizer without per-parameter state (SGD without momentum) has no shards: it is in the state file whole.
    sharded = ckpt["optimizer_states"] == _SHARDED_MARK
    loaded = _load_without_process_group(checkpoint_dir, {"state_dict", "optimizer_states"} if sharded else
                                         {"state_dict"})
    optimizers = [_numbered_optimizer_state(saved, group_names, checkpoint_dir) for saved, group_names in
                  zip(loaded["optimizer_states"] if sharded else ckpt["optimizer_states"], names)]
    out = without_own(ckpt, "fsdp")
    out.update({"state_dict": _owned(loaded["state_dict"]), "optimizer_states": optimizers,
                "loops": {**{k: v for k, v in own.items() if k != "fsdp"}, **format_header(), "weights_only": False}})
    if output_path is not None:
        atomic_save(out, os.fspath(output_path))
    return out


def _numbered_optimizer_state(saved, group_names, where):
    """An optimizer state keyed by parameter name (FSDP's, get_optimizer_state_dict) -> optimizer.state_dict()'s
    layout: numbered over the groups in order (each group's names are in the optimizer's order), checked against
    `group_names` (the checkpoint's optimizer_param_names; None: the Accelerator's state, which has none)."""
    groups, state, index = [], {}, 0
    if group_names is not None and [[plain_name(n) for n in g["params"]] for g in saved["param_groups"]] != group_names:
        raise CheckpointError(f"{where!r}: its optimizer state and its parameter names (optimizer_param_names) "
                              "disagree; the checkpoint is not one the FSDP strategy wrote.")
    for group in saved["param_groups"]:
        numbers = []
        for name in group["params"]:
            if name in saved["state"]:
                state[index] = _owned(saved["state"][name])
            numbers.append(index)
            index += 1
        groups.append(dict(group, params=numbers))
    return {"state": state, "param_groups": groups}


def convert_to_fsdp(checkpoint_path, output_dir):
    """Write a plain checkpoint (one file: a Trainer checkpoint of one process or DDP, `tasktrain convert --to ckpt`'s
    output, or FSDP's state_dict_type="full" file) as the directory FSDP's sharded save writes (DCP files of the
    weights and the optimizer state keyed by parameter name, plus tasktrain_state.pt with the loop state, schedulers,
    callbacks and random states), which `fit(ckpt_path=DIR)` under FSDP resumes on any number of processes. Runs in
    one process, without a process group. Returns `output_dir`; a directory already there is replaced only once the
    new one is complete."""
    import shutil

    import torch.distributed.checkpoint as dcp

    checkpoint_path = os.fspath(checkpoint_path)
    if os.path.isdir(checkpoint_path):
        fix = ("it is an FSDP checkpoint already: fit(ckpt_path=...) under FSDP resumes it on any number of "
               "processes" if is_fsdp_checkpoint(checkpoint_path) else
               "a DeepSpeed checkpoint directory goes to one file first: tasktrain convert DIR run.ckpt --to ckpt")
        raise CheckpointError(f"{checkpoint_path!r} is a directory: --to fsdp takes one checkpoint file (a Trainer "
                              f"checkpoint of one process or DDP); {fix}.")
    ckpt = load_resumable_file(checkpoint_path, "an FSDP fit")
    names = own_state(ckpt)["optimizer_param_names"]
    if len(names) != len(ckpt["optimizer_states"]):
        raise CheckpointError(f"{checkpoint_path!r}: its optimizer states and its parameter names disagree.")
    optimizers = [_named_optimizer_state(saved, group_names, checkpoint_path)
                  for saved, group_names in zip(ckpt["optimizer_states"], names)]
    shards = {"state_dict": dict(ckpt["state_dict"]), "optimizer_states": optimizers}
    state = with_own({**ckpt, "state_dict": _SHARDED_MARK, "optimizer_states": _SHARDED_MARK},
                     fsdp={"world_size": own_state(ckpt).get("world_size"), "layout": "dcp",
                           "converted_from": "one file"})
    output_dir = os.path.abspath(os.fspath(output_dir))
    tmp = f"{output_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
            dcp.save(shards, checkpoint_id=tmp, no_dist=True)
        atomic_save(state, os.path.join(tmp, STATE_FILE))
        replace_dir(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


def _named_optimizer_state(saved, group_names, where):
    """optimizer.state_dict()'s layout (numbered) -> FSDP's (keyed by parameter name, as get_optimizer_state_dict)."""
    if _keyed_by_name(saved) and saved.get("state"):
        return saved  # FSDP's state_dict_type="full" file: keyed by name already
    if len(saved["param_groups"]) != len(group_names):
        raise CheckpointError(f"{where!r}: its optimizer state and its parameter names disagree.")
    state, groups = {}, []
    for group, names_of_group in zip(saved["param_groups"], group_names):
        if len(group["params"]) != len(names_of_group) or None in names_of_group:
            raise CheckpointError(f"{where!r}: a parameter of its optimizer is not one of the module's (or the "
                                  "names and the state disagree).")
        for index, name in zip(group["params"], names_of_group):
            if index in saved["state"]:
                state[name] = saved["state"][index]
        groups.append(dict(group, params=list(names_of_group)))
    return {"state": state, "param_groups": groups}


def convert_fsdp_state_dir(checkpoint_dir, output_dir, state_name):
    """The Accelerator's save_state directory written under FSDP (DCP shards of its models and optimizers, plus
    `state_name`, its state file) -> the directory save_state writes without FSDP (that file alone, with the whole
    weights and each optimizer's state numbered as optimizer.state_dict() numbers it), which load_state reads on one
    process or DDP. Runs in one process without a process group. Returns `output_dir`, replaced only once complete."""
    import shutil

    checkpoint_dir = os.fspath(checkpoint_dir)
    state_file = os.path.join(checkpoint_dir, state_name)
    if not os.path.isfile(state_file) or not os.path.isfile(os.path.join(checkpoint_dir, ".metadata")):
        raise CheckpointError(f"{checkpoint_dir!r} is not a save_state directory written under FSDP (it needs "
                              f"{state_name} and DCP's .metadata).")
    state = load_checkpoint_file(state_file)
    keys = [key for key in ("models", "optimizers") if state.get(key) == _SHARDED_MARK]
    if "models" not in keys:
        raise CheckpointError(f"{checkpoint_dir!r} holds no sharded models: nothing to convert.")
    loaded = _load_without_process_group(checkpoint_dir, keys)
    state["models"] = [_owned(weights) for weights in loaded["models"]]
    if "optimizers" in keys:
        state["optimizers"] = [_numbered_optimizer_state(saved, None, checkpoint_dir)
                               for saved in loaded["optimizers"]]
    state = without_own(state, "fsdp")
    output_dir = os.path.abspath(os.fspath(output_dir))
    tmp = f"{output_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        atomic_save(state, os.path.join(tmp, state_name))
        replace_dir(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output_dir
