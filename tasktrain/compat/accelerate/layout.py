"""Accelerate's save_state folder layout (Accelerate 1.15 file names), read and written by the Accelerator.

    model.safetensors, model_1.safetensors, ...   (pytorch_model.bin, pytorch_model_1.bin with safe_serialization=False)
    optimizer.bin, optimizer_1.bin, ...           torch.save of each optimizer's state_dict
    scheduler.bin, scheduler_1.bin, ...           torch.save of each scheduler's state_dict
    scaler.pt                                     the fp16 GradScaler's state_dict
    random_states_{rank}.pkl                      torch.save of {"step", "random_state", "numpy_random_seed",
                                                  "torch_manual_seed"(, "torch_cuda_manual_seed")}, one per process
    custom_checkpoint_{i}.pkl                     torch.save of each register_for_checkpointing object's state_dict

Everything is read with torch.load(weights_only=True). Accelerate's random states hold numpy's generator state (a
numpy array): the only globals allowed besides torch's own are numpy's array reconstruction, so a file that
needs anything else (a pickled sampler object, a custom class) is refused with an error naming it, never
unpickled. sampler.bin (Accelerate's SeedableRandomSampler object, pickled) is therefore not read: the loaders'
order here is a function of the seed and the epoch already.
"""
import os
import random
import warnings

import numpy as np
import torch

from tasktrain import checkpoint_io as ckpt_io
from tasktrain.checkpoint_io import CheckpointError, atomic_save

ACCELERATE_MARKERS = ("model.safetensors", "pytorch_model.bin", "optimizer.bin", "random_states_0.pkl")


def _numbered(stem, i, ext):
    if stem == "custom_checkpoint":
        return f"{stem}_{i}{ext}"  # numbered from 0, unlike the others
    return f"{stem}{ext}" if i == 0 else f"{stem}_{i}{ext}"


def is_accelerate_folder(directory) -> bool:
    return any(os.path.exists(os.path.join(directory, name)) for name in ACCELERATE_MARKERS)


def safe_load(path):
    """checkpoint_io.safe_load with numpy's generator state allowed (checkpoint_io.ALLOWED_GLOBALS["numpy"]): any
    other object, or a truncated or corrupted file, is a CheckpointError naming the file; nothing in it runs."""
    try:
        return ckpt_io.safe_load(path, "numpy")
    except CheckpointError as err:
        if "truncated or corrupted" in str(err):
            raise
        raise CheckpointError(f"{err} tasktrain does not unpickle arbitrary objects: load that file with Accelerate "
                              "itself, or re-save the object's state as tensors and numbers.") from None


def _load_safetensors(path):
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as err:  # safetensors' own error for a truncated or corrupted header or body
        raise CheckpointError(f"Checkpoint {path!r} is truncated or corrupted and cannot be read "
                              f"({type(err).__name__}: {str(err)[:300]}).") from None


def _load_model_file(directory, i):
    safe = os.path.join(directory, _numbered("model", i, ".safetensors"))
    if os.path.exists(safe):
        return _load_safetensors(safe)
    plain = os.path.join(directory, _numbered("pytorch_model", i, ".bin"))
    if os.path.exists(plain):
        return safe_load(plain)
    raise FileNotFoundError(f"{directory} has no {_numbered('model', i, '.safetensors')} (nor "
                            f"{_numbered('pytorch_model', i, '.bin')}): Accelerate's save_state writes one per "
                            "prepared model. Prepare the same models before load_state.")


def read(directory, counts, rank):
    """What an Accelerate save_state folder holds, in tasktrain's terms: {"models", "optimizers", "schedulers",
    "precision", "custom", "rng_state"} for `counts` = {"models": n, ...} prepared objects."""
    state = {"models": [_load_model_file(directory, i) for i in range(counts["models"])]}
    for kind, stem, ext in (("optimizers", "optimizer", ".bin"), ("schedulers", "scheduler", ".bin"),
                            ("custom", "custom_checkpoint", ".pkl")):
        state[kind] = []
        for i in range(counts[kind]):
            path = os.path.join(directory, _numbered(stem, i, ext))
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} does not exist: the folder holds fewer {kind} than this "
                                        "Accelerator has prepared/registered. Prepare the same objects, in the same "
                                        "order, before load_state.")
            state[kind].append(safe_load(path))
        extra = os.path.join(directory, _numbered(stem, counts[kind], ext))
        if os.path.exists(extra):
            raise ValueError(f"{extra} exists: the folder holds more {kind} than this Accelerator has "
                             "prepared/registered. Prepare the same objects, in the same order, before load_state.")
    scaler = os.path.join(directory, "scaler.pt")
    state["precision"] = {"scaler": safe_load(scaler)} if os.path.exists(scaler) else {}
    if os.path.exists(os.path.join(directory, "sampler.bin")):
        warnings.warn(f"{directory}/sampler.bin (Accelerate's pickled sampler object) is not read: prepared loaders "
                      "take their order from the seed and the epoch; their position is not in an Accelerate folder "
                      "(use skip_first_batches to continue mid-epoch).")
    rng = os.path.join(directory, f"random_states_{rank}.pkl")
    if not os.path.exists(rng):
        rng = os.path.join(directory, "random_states_0.pkl")  # saved by fewer processes: rank 0's
    state["rng_state"] = _rng_from_accelerate(safe_load(rng)) if os.path.exists(rng) else None
    return state


def _rng_from_accelerate(states):
    kind, keys, pos, has_gauss, gauss = states["numpy_random_seed"]
    ours = {"python": states["random_state"],
            "numpy": [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos), int(has_gauss),
                      float(gauss)],
            "torch": states["torch_manual_seed"]}
    if "torch_cuda_manual_seed" in states:
        ours["cuda"] = states["torch_cuda_manual_seed"]
    return ours


def write(directory, models, optimizers, schedulers, precision_state, custom, rank, is_main,
          safe_serialization=True):
    """Write Accelerate's files: the main process the shared ones, every process its random_states_{rank}.pkl."""
    os.makedirs(directory, exist_ok=True)
    if is_main:
        for i, state in enumerate(models):
            if safe_serialization:
                from safetensors.torch import save_file

                path = os.path.join(directory, _numbered("model", i, ".safetensors"))
                # Tied weights share storage, which safetensors refuses: each tensor is written on its own.
                tensors = {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}
                save_file(tensors, path + ".tmp", metadata={"format": "pt"})
                os.replace(path + ".tmp", path)
            else:
                atomic_save(state, os.path.join(directory, _numbered("pytorch_model", i, ".bin")))
        for kind, stem, ext in ((optimizers, "optimizer", ".bin"), (schedulers, "scheduler", ".bin"),
                                (custom, "custom_checkpoint", ".pkl")):
            for i, state in enumerate(kind):
                atomic_save(state, os.path.join(directory, _numbered(stem, i, ext)))
        if precision_state.get("scaler"):
            atomic_save(precision_state["scaler"], os.path.join(directory, "scaler.pt"))
    states = {"step": 0, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
              "torch_manual_seed": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    atomic_save(states, os.path.join(directory, f"random_states_{rank}.pkl"))
