"""ModelSummary: a table of the module's layers and parameter counts, printed by rank 0 when fit starts.

On by default (`Trainer(enable_model_summary=True)`); `ModelSummary(max_depth=2)` in callbacks shows deeper
layers, `max_depth=-1` all of them, `max_depth=0` nothing. It costs a walk over the modules and parameters, no
forward pass: only when the module sets `example_input_array` does it run one forward pass (rank 0, eval mode,
no gradients) to show each layer's input and output sizes.

`summarize(module, max_depth=1)` returns the same table as an object (`str()` it; `total_parameters`,
`trainable_parameters`, `layer_names`, ...), without a Trainer.
"""
import torch

from tasktrain.callbacks.base import Callback


class Summary:
    """The summary of a module: one row per layer down to `max_depth`, and the totals."""

    def __init__(self, module, max_depth=1, numel=None, input_array=None, forward=None):
        _check_depth(max_depth)
        numel = numel or (lambda p: p.numel())
        self.max_depth = max_depth
        rows = []
        for name, layer in module.named_modules():
            depth = name.count(".") + 1
            if not name or (max_depth != -1 and depth > max_depth):
                continue
            rows.append([name, type(layer).__name__, sum(numel(p) for p in layer.parameters()),
                         "train" if layer.training else "eval"])
        self.layer_names = [r[0] for r in rows]
        self.layer_types = [r[1] for r in rows]
        self.param_nums = [r[2] for r in rows]
        self.training_modes = [r[3] == "train" for r in rows]
        params = list(module.parameters())
        self.total_parameters = sum(numel(p) for p in params)
        self.trainable_parameters = sum(numel(p) for p in params if p.requires_grad)
        self.total_size_bytes = sum(numel(p) * p.element_size() for p in params)
        children = list(module.modules())[1:]
        self.total_training_modes = {"train": sum(m.training for m in children),
                                     "eval": sum(not m.training for m in children)}
        self.in_sizes = self.out_sizes = None
        if input_array is not None and rows:
            self.in_sizes, self.out_sizes = _sizes(module, self.layer_names, input_array, forward)

    def __str__(self):
        header = ["", "Name", "Type", "Params", "Mode"]
        body = [[str(i), n, t, _human(p), "train" if m else "eval"]
                for i, (n, t, p, m) in enumerate(zip(self.layer_names, self.layer_types, self.param_nums,
                                                     self.training_modes))]
        if self.in_sizes is not None:
            header += ["In sizes", "Out sizes"]
            for row, i, o in zip(body, self.in_sizes, self.out_sizes):
                row += [i, o]
        lines = []
        if body and self.max_depth != 0:
            widths = [max(len(str(r[c])) for r in [header] + body) for c in range(len(header))]
            fmt = lambda row: " | ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
            rule = "-" * len(fmt(header))
            lines += [fmt(header), rule, *(fmt(r) for r in body), rule]
        lines += [
            f"{_human(self.trainable_parameters):<10}Trainable params",
            f"{_human(self.total_parameters - self.trainable_parameters):<10}Non-trainable params",
            f"{_human(self.total_parameters):<10}Total params",
            f"{self.total_size_bytes / 1e6:<10.3f}Total estimated model params size (MB)",
            f"{self.total_training_modes['train']:<10}Modules in train mode",
            f"{self.total_training_modes['eval']:<10}Modules in eval mode",
        ]
        return "\n".join(lines)

    __repr__ = __str__


def summarize(module, max_depth=1):
    """The summary of `module` (a TaskModule or any nn.Module), with sizes if it sets example_input_array."""
    return Summary(module, max_depth, input_array=getattr(module, "example_input_array", None))


class ModelSummary(Callback):
    def __init__(self, max_depth=1):
        _check_depth(max_depth)
        self.max_depth = max_depth

    def on_fit_start(self, trainer, module):
        if self.max_depth == 0:
            return
        strategy = trainer.strategy
        input_array = getattr(module, "example_input_array", None)
        forward = None
        if input_array is not None:
            try:  # a forward pass of rank 0 alone: impossible where each rank holds a shard of the parameters
                strategy.check_full_parameters("ModelSummary's In/Out sizes (a forward pass on rank 0 alone)")
            except ValueError:
                input_array = None
            else:
                input_array = strategy.batch_to_device(input_array)
                forward = _forward_in(strategy)
        if not trainer.is_global_zero:
            return
        summary = Summary(module, self.max_depth, numel=strategy.full_numel, input_array=input_array,
                          forward=forward)
        print(summary, flush=True)


def _check_depth(max_depth):
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
        raise ValueError(f"max_depth={max_depth!r}: use -1 (every layer), 0 (no table) or a positive depth.")


def _forward_in(strategy):
    def forward(module, x):
        with strategy.forward_context():
            return module(*x) if isinstance(x, tuple) else module(**x) if isinstance(x, dict) else module(x)
    return forward


def _sizes(module, names, input_array, forward=None):
    """Each named layer's input and output sizes, from one forward pass in eval mode without gradients."""
    seen = {}
    layers = dict(module.named_modules())

    def hook_for(name):
        def hook(layer, inputs, output):
            seen[name] = (_shape(inputs[0] if len(inputs) == 1 else inputs), _shape(output))
        return hook

    handles = [layers[n].register_forward_hook(hook_for(n)) for n in names]
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            if forward is not None:
                forward(module, input_array)
            elif isinstance(input_array, tuple):
                module(*input_array)
            elif isinstance(input_array, dict):
                module(**input_array)
            else:
                module(input_array)
    finally:
        for handle in handles:
            handle.remove()
        module.train(was_training)
    return [seen.get(n, ("?", "?"))[0] for n in names], [seen.get(n, ("?", "?"))[1] for n in names]


def _shape(value):
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (list, tuple)):
        return [_shape(v) for v in value]
    return "?"


def _human(n):
    """1234 -> '1.2 K', Lightning's style: K, M, B, T."""
    n = float(n)
    for unit in ("", " K", " M", " B", " T"):
        if abs(n) < 1000 or unit == " T":
            return f"{int(n)}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
