"""Planted payloads and random damage for checkpoint files (tests/test_checkpoint_safety.py).

A payload is an object whose unpickling creates a marker file (`open(marker, "w")`): if any loader unpickles it, the
marker exists afterwards. Every planting keeps the file otherwise valid, so that a loader that runs it also "succeeds".
"""
import os
import pickle
import random

import torch


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant_torch(path, marker):
    """A torch file with a payload beside its contents (inside the dict, or wrapping anything else)."""
    obj = torch.load(path, map_location="cpu", weights_only=False)  # our own test file: trusted
    obj = dict(obj, _payload=Payload(marker)) if isinstance(obj, dict) else {"_payload": Payload(marker), "x": obj}
    torch.save(obj, path)


def plant_dcp_metadata(directory, marker):
    """DCP's .metadata with a payload attribute on its Metadata record."""
    path = os.path.join(directory, ".metadata")
    with open(path, "rb") as f:
        metadata = pickle.load(f)  # our own test file: trusted
    metadata.payload = Payload(marker)
    with open(path, "wb") as f:
        pickle.dump(metadata, f)


def plant_dcp_item(directory, marker):
    """A DCP checkpoint saved again with a payload in place of one non-tensor item of its .distcp file (the first
    param group's learning rate)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = _load_state_dict_from_keys(checkpoint_id=directory)  # our own test file: trusted
        state["optimizer_states"][0]["param_groups"][0]["lr"] = Payload(marker)
        for name in os.listdir(directory):
            if name.endswith(".distcp") or name == ".metadata":
                os.remove(os.path.join(directory, name))
        dcp.save(state, checkpoint_id=directory)


def truncate(path, rng):
    data = open(path, "rb").read()
    cut = rng.randrange(0, max(1, len(data)))
    with open(path, "wb") as f:
        f.write(data[:cut])
    return f"truncated to {cut} of {len(data)} bytes"


def flip(path, rng):
    data = bytearray(open(path, "rb").read())
    if not data:
        return "empty file"
    where = sorted(rng.randrange(len(data)) for _ in range(rng.randint(1, 4)))
    for i in where:
        data[i] ^= rng.randrange(1, 256)
    with open(path, "wb") as f:
        f.write(bytes(data))
    return f"bytes flipped at {where}"


def rng_for(*parts):
    return random.Random("/".join(map(str, parts)))
