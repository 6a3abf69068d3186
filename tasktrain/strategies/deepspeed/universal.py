"""DeepSpeed checkpoints across numbers of processes and strategies, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds each rank's flat partition of the fp32 weights and of the optimizer state, so it loads only
on the number of processes that wrote it. DeepSpeed's *universal* format keeps the same things per parameter
instead (`zero/<name>/fp32.pt`, `exp_avg.pt`, `exp_avg_sq.pt`, `step.pt`, and `zero/optimizer_state.pt` for the
param groups), and an engine whose config says `"checkpoint": {"load_universal": true}` loads it on any number of
processes and any ZeRO stage. Measured with DeepSpeed 0.19.8 on CPU/gloo: stages 1, 2 and 3, 2 -> 1 and 1 -> 2
processes, Adam(W) moments and step counts carried, training continues within fp32 reduction-order noise of an
uninterrupted run.

This module is the part of the DeepSpeed strategy that deals with that format:
- `to_universal(dir, tag)`: DeepSpeed's own converter (deepspeed.checkpoint.ds_to_universal), run in this
  process, written next to the shards under another tag, atomically;
- `write_universal(...)`: the same layout written from full (unsharded) weights and a torch optimizer state, for
  `tasktrain convert --to deepspeed` (a plain checkpoint becomes one that any ZeRO stage resumes);
- `read_universal(...)`: the layout read back into full weights and per-parameter optimizer state, for
  `tasktrain convert` to a plain checkpoint with its optimizer state;
- `repair_universal_load(...)`: what DeepSpeed 0.19.8's universal loader gets wrong at stage 3 (see there).

It imports deepspeed only inside the functions that need it.
"""
import contextlib
import glob
import io
import math
import os
import re
import shutil

import torch

from tasktrain.checkpoint_io import safe_load

UNIVERSAL_SUFFIX = "_universal"  # DeepSpeed's own convention: <tag>_universal next to <tag>
MODEL_STATES = ("mp_rank_00_model_states.pt",  # what stages 0-2 read
                "zero_pp_rank_0_mp_rank_00_model_states.pt")  # what stage 3 reads


def universal_tag(tag):
    return f"{tag}{UNIVERSAL_SUFFIX}"


def is_universal(directory, tag):
    return os.path.isfile(os.path.join(directory, tag, "zero", "optimizer_state.pt"))


def to_universal(directory, tag):
    """Convert the ZeRO shards in `directory/tag` into DeepSpeed's universal layout in `directory/<tag>_universal`
    (kept there: a second resume on another number of processes reuses it). Runs in this process only (call it
    on one rank); needs the memory of the whole optimizer state. Returns the universal tag."""
    out_tag = universal_tag(tag)
    out = os.path.join(directory, out_tag)
    if is_universal(directory, out_tag):
        return out_tag
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from argparse import Namespace

    from tasktrain.strategies.deepspeed.engine import import_deepspeed

    import_deepspeed()
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # inject_missing_state: the engine records the "universal checkpoint info" only for models that declare it
    # (Megatron); a plain module needs none beyond the version. One worker: no process pool.
    args = Namespace(input_folder=os.path.join(directory, tag), output_folder=tmp, num_extract_workers=1,
                     num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ds_to_universal(args)  # it prints a progress report per step and bar
        _write_zero3_extras(os.path.join(directory, tag), os.path.join(tmp, "zero"))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write_latest_universal(directory, out_tag)
    return out_tag


def _write_zero3_extras(source, zero_dir):
    """At stage 3 the converter writes the trainable parameters only; buffers (BatchNorm statistics) and frozen
    parameters are added here, from the ranks' model-state files (buffers whole, frozen parameters as each rank's
    flat fragment, in rank order), so that `restore_module_extras` finds them. Stages 1-2: the converter writes
    them itself (from the whole module state)."""
    files = glob.glob(os.path.join(source, "zero_pp_rank_*_mp_rank_00_model_states.pt"))
    if not files:
        return
    files.sort(key=lambda f: int(re.search(r"zero_pp_rank_(\d+)_", os.path.basename(f)).group(1)))
    states = [safe_load(f, "deepspeed") for f in files]  # no weights in them at stage 3
    extras = {name: states[0]["module"][name] for name in states[0].get("buffer_names") or []}
    for name, shape in (states[0].get("frozen_param_shapes") or {}).items():
        flat = torch.cat([s["frozen_param_fragments"][name].reshape(-1) for s in states])
        extras[name] = flat[:math.prod(shape)].reshape(shape)
    for name, tensor in extras.items():
        folder = os.path.join(zero_dir, name)
        if not os.path.isfile(os.path.join(folder, "fp32.pt")):
            os.makedirs(folder, exist_ok=True)
            torch.save({"param": tensor.float() if tensor.is_floating_point() else tensor, "cat_dim": 0},
                       os.path.join(folder, "fp32.pt"))


def restore_module_extras(module, directory, tag, partitioned):
    """Put back what DeepSpeed 0.19.8's universal loader leaves at their initial values: the module's buffers
    (BatchNorm statistics) and its frozen parameters (requires_grad=False), from `directory/tag/zero/<name>`.
    Every rank reads them (DeepSpeed's own loader assumes every rank sees the checkpoint too). `partitioned`:
    ZeRO-3, whose frozen parameters are gathered to be written."""
    root = os.path.join(directory, tag, "zero")
    frozen = [(name, p) for name, p in module.named_parameters() if not p.requires_grad]
    targets = list(module.named_buffers()) + frozen
    missing = [name for name, _ in targets if not os.path.isfile(os.path.join(root, name, "fp32.pt"))]
    if missing:
        raise FileNotFoundError(f"{os.path.join(directory, tag)} has no value for {missing[0]!r} (a buffer or a frozen "
                                "parameter of this module): it was not written from this model.")
    gather = contextlib.nullcontext()
    if partitioned and frozen:
        from tasktrain.strategies.deepspeed.engine import import_deepspeed

        deepspeed = import_deepspeed()

        gather = deepspeed.zero.GatheredParameters([p for _, p in frozen], modifier_rank=0)
    with gather, torch.no_grad():
        for name, tensor in targets:
            value = safe_load(os.path.join(root, name, "fp32.pt"), "deepspeed")["param"]
            tensor.copy_(value.reshape(tensor.shape).to(tensor.dtype))


def _write_latest_universal(directory, tag):
    # What a plain DeepSpeed user's engine.load_checkpoint(dir) reads with load_universal and no tag.
    with open(os.path.join(directory, "latest_universal"), "w") as f:
        f.write(tag)


def write_universal(directory, tag, weights, param_state, param_groups, global_steps=0):
    """Write DeepSpeed's universal layout from whole tensors.

    weights: {name: tensor}, the module's whole state dict (parameters and buffers), names as the engine's module
        names them; param_state: {name: {"exp_avg": tensor, "exp_avg_sq": tensor, "step": number}} for each trainable
        parameter (a torch Adam/AdamW state, keyed by name); param_groups: the torch optimizer's param groups without
        "params" (hyper-parameters, in the optimizer's group order); global_steps: the engine's step counter.
    Every parameter of a group must have its state (ZeRO keeps one step count per group)."""
    from tasktrain.strategies.deepspeed.engine import import_deepspeed

    deepspeed = import_deepspeed()

    root = os.path.join(directory, tag, "zero")
    os.makedirs(root, exist_ok=True)
    steps = []
    for name, tensor in weights.items():
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        value = tensor.detach().float() if tensor.is_floating_point() else tensor.detach()
        torch.save({"param": value.contiguous(), "cat_dim": 0}, os.path.join(folder, "fp32.pt"))
        state = param_state.get(name)
        if state is None:
            continue
        for key, value in state.items():
            if key == "step":
                step = float(value)
                steps.append(step)
                torch.save(torch.tensor(step), os.path.join(folder, "step.pt"))
            elif isinstance(value, torch.Tensor) and value.numel() == tensor.numel():
                torch.save({"param": value.detach().float().reshape(tensor.shape).contiguous(), "cat_dim": 0},
                           os.path.join(folder, f"{key}.pt"))
    groups = [dict(group, params=[i]) for i, group in enumerate(param_groups)]
    step = max(steps) if steps else 0.0
    optimizer_state = {
        # stages 1-2 read these (zip with the engine's groups; the loss scaler and clipping keep their defaults)
        "param_groups": groups,
        "ds_version": deepspeed.__version__,
        # stage 3 reads the hyper-parameters and the step count here
        "optimizer_state_dict": {"state": {0: {"step": torch.tensor(step)}}, "param_groups": groups},
    }
    torch.save(optimizer_state, os.path.join(root, "optimizer_state.pt"))
    model_states = {
        "module": {k: v.detach().contiguous() for k, v in weights.items()}, "buffer_names": [], "optimizer": None,
        "lr_scheduler": None, "skipped_steps": 0, "global_steps": int(global_steps), "global_samples": 0,
        "dp_world_size": 1, "mp_world_size": 1, "ds_version": deepspeed.__version__,
    }
    for name in MODEL_STATES:
        torch.save(model_states, os.path.join(directory, tag, name))
    _write_latest_universal(directory, tag)


def read_universal(directory, tag):
    """(weights, param_state, param_groups) of a universal checkpoint: whole fp32 tensors by name, each parameter's
    optimizer state by name ({"exp_avg": ..., "step": ...}), and the groups' hyper-parameters (without params)."""
    root = os.path.join(directory, tag, "zero")
    optimizer_state = safe_load(os.path.join(root, "optimizer_state.pt"), "deepspeed")
    inner = optimizer_state.get("optimizer_state_dict") or {}
    groups = optimizer_state.get("param_groups") or inner.get("param_groups") or []
    group_step = None
    if inner.get("state"):  # stage 3 keeps one step count, not one per parameter
        group_step = next(iter(inner["state"].values())).get("step")
    shapes = _param_shapes(os.path.join(directory, tag))  # stage 3 writes flat tensors
    weights, param_state = {}, {}
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue
        state = {}
        for file in sorted(os.listdir(folder)):
            key, ext = os.path.splitext(file)
            if ext != ".pt":
                continue
            value = safe_load(os.path.join(folder, file), "deepspeed")
            value = value["param"] if isinstance(value, dict) else value
            if isinstance(value, torch.Tensor) and name in shapes and value.numel() == math.prod(shapes[name]):
                value = value.reshape(shapes[name])
            if key == "fp32":
                weights[name] = value.detach().clone()
            elif key == "step":
                state["step"] = float(value)
            else:
                state[key] = value.detach().clone()
        if state:
            if "step" not in state and group_step is not None:
                state["step"] = float(group_step)
            param_state[name] = state
    return weights, param_state, [{k: v for k, v in g.items() if k != "params"} for g in groups]


def _param_shapes(folder):
    """{name: shape} of the parameters, from a model-state file of the checkpoint (DeepSpeed records them)."""
    files = sorted(glob.glob(os.path.join(folder, "*model_states.pt")))
    if not files:
        return {}
    states = safe_load(files[0], "deepspeed")
    shapes = {}
    for group in states.get("param_shapes") or []:
        shapes.update({name: tuple(shape) for name, shape in group.items()})
    shapes.update({name: tuple(shape) for name, shape in (states.get("frozen_param_shapes") or {}).items()})
    return shapes


def rekeyed(directory, tag, old_prefix, new_prefix):
    """The universal checkpoint `directory/tag` under names with `new_prefix` instead of `old_prefix` (the Trainer's
    engine names the module's parameters "module.<name>", the Accelerator's "<name>"), as a new tag of hard links
    (copies where links fail). Returns the new tag."""
    new_tag = f"{tag}_as_{new_prefix.rstrip('.') or 'module_root'}"
    source, target = os.path.join(directory, tag), os.path.join(directory, new_tag)
    if is_universal(directory, new_tag):
        return new_tag
    tmp = f"{target}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for folder, _, files in os.walk(source):
            relative = os.path.relpath(folder, source)
            parts = relative.split(os.sep)
            if len(parts) == 2 and parts[0] == "zero":  # zero/<name>: the parameter's folder
                name = parts[1]
                if not name.startswith(old_prefix):
                    continue
                relative = os.path.join("zero", new_prefix + name[len(old_prefix):])
            os.makedirs(os.path.join(tmp, relative), exist_ok=True)
            for file in files:
                src, dst = os.path.join(folder, file), os.path.join(tmp, relative, file)
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return new_tag


def repair_universal_load(optimizer, param_groups):
    """Undo what DeepSpeed 0.19.8's universal loader gets wrong at ZeRO stage 3, on the engine's base optimizer:

    - it gives every param group the hyper-parameters of the first (a bias group with weight_decay=0 gets the
      weights' decay; a group's own lr is lost): `param_groups` (the groups' saved hyper-parameters, in order)
      are put back;
    - it stores one step tensor object in the state of every group, so that torch's Adam, which counts steps in
      place, advances it once per group per step: each group gets its own copy.
    Harmless at stages 1-2, where the loader does both right."""
    if param_groups is not None:
        if len(param_groups) != len(optimizer.param_groups):
            raise ValueError(f"The checkpoint's optimizer has {len(param_groups)} param groups and this run's has "
                             f"{len(optimizer.param_groups)}: configure_optimizers must build the same groups.")
        for group, saved in zip(optimizer.param_groups, param_groups):
            for key, value in saved.items():
                if key != "params":
                    group[key] = value
    for state in optimizer.state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            state["step"] = step.clone()
