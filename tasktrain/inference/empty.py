"""Building a model without allocating its weights: `init_empty_weights`, as Accelerate users write it.

    with init_empty_weights():
        model = GPT2LMHeadModel(config)      # parameters on "meta": no memory, no initialisation cost
    model.tie_weights()                      # where the model ties weights (transformers models do)
    model = load_checkpoint_and_dispatch(model, "gpt2-folder", device_map="auto", offload_folder="offload")
"""
import contextlib

import torch
from torch import nn


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False):
    """Inside this context every parameter a module registers is put on the meta device.

    Buffers are left where the module created them (normally the CPU, with their real values) unless
    `include_buffers=True`, which builds everything, buffers and any other tensor the constructors create, on meta.
    Keeping buffers real matters for the ones a checkpoint does not hold (registered with `persistent=False`, such as
    rotary-embedding frequencies): they keep the values the constructor computed.

    Parameters keep their class, `requires_grad` and attributes. A constructor that fills a parameter before
    registering it (`nn.Parameter(torch.randn(...))`) still pays for that on the CPU; `include_buffers=True` avoids it.
    """
    if include_buffers:
        with torch.device("meta"):
            yield
        return
    original = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        original(module, name, param)
        if param is None or param.is_meta:
            return
        # A new Parameter of the same class on meta; the CPU tensor the constructor made is freed at once.
        moved = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        moved.__dict__.update(param.__dict__)
        module._parameters[name] = moved

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = original
