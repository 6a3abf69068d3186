"""The one walk over a batch's containers (lists, tuples, namedtuples, dicts, nested), used wherever something
is done to every tensor of a batch or an output: moving to a device, casting, gathering, unsqueezing."""


def apply_to_leaves(data, fn):
    """`fn(leaf)` for every leaf, in containers of the same types: a namedtuple stays that namedtuple, a dict
    subclass (OrderedDict) that class. Anything that is not a list, tuple or dict is a leaf (tensors, numbers,
    strings, objects with their own `.to`): `fn` decides what to do with it."""
    if isinstance(data, dict):
        return type(data)((key, apply_to_leaves(value, fn)) for key, value in data.items())
    if isinstance(data, (list, tuple)):
        items = [apply_to_leaves(item, fn) for item in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    return fn(data)
