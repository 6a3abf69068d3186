"""ModelSummary: a table of the module's layers and parameter counts, printed by rank 0 when fit starts, in
Lightning 2.6's text.

    ModelSummary(max_depth=1, **summarize_kwargs)

On by default (`Trainer(enable_model_summary=True)`); `ModelSummary(max_depth=2)` in callbacks shows deeper
layers, `max_depth=-1` all of them, `max_depth=0` nothing. The columns are Lightning's: index, Name, Type, Params,
Mode, FLOPs, and, when the module sets `example_input_array`, In sizes and Out sizes; parameters that belong to no
listed layer are one more row, "other params". Then the totals: trainable, non-trainable and all parameters, the
estimated size in MB (at the bits of the trainer's precision: 16 for "16-true"/"bf16-true", 64 for "64-true", 32
otherwise; Lightning warns for a mixed precision and counts 32 bits, so does this), the modules in train and in eval
mode, and the total FLOPs.

It costs a walk over the modules and parameters, no forward pass: only when the module sets `example_input_array`
does it run one forward pass (eval mode, no gradients, under torch's FlopCounterMode) to show each layer's input and
output sizes and FLOPs; without it the FLOPs are 0, as in Lightning. Where the strategy partitions the
parameters over devices (DeepSpeed ZeRO-3) the counts are the whole parameters' and a "Params per Device" column
shows this device's partition, as Lightning's DeepSpeedSummary does. Where each rank holds a shard of the parameters
(DeepSpeed ZeRO-3, FSDP) the example forward runs on every rank, as Lightning runs it, since it needs them all.

`summarize(module, max_depth=1)` returns the same table as an object (`str()` it; `total_parameters`,
`trainable_parameters`, `layer_names`, `param_nums`, `total_flops`, ...), without a Trainer. As Lightning's, that
object measures once (the example forward runs when it is built) and is read live: layer types, modes, parameter
counts and the totals are the module's when read; `summarize()` on it is {layer name: LayerSummary}. RichModelSummary is
the same summary drawn with rich; it needs the `rich` package (ModuleNotFoundError without it, as Lightning).
"""
import importlib.util
import math
import warnings
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

import tasktrain
from tasktrain.callbacks.base import Callback

UNKNOWN_SIZE = "?"
# Lightning's flag (tests patch it to stand for a machine without rich); looked up, not imported: rich loads on use
_RICH_AVAILABLE = importlib.util.find_spec("rich") is not None
LEFTOVER_PARAMS_NAME = "other params"
NOT_APPLICABLE = "n/a"
_PRECISION_BITS = {"64": 64, "32": 32, "16": 16, "bf16": 16, "16-true": 16, "bf16-true": 16, "32-true": 32,
                   "64-true": 64}


class Summary:
    """The summary of a module: one row per layer down to `max_depth`, and the totals (Lightning's ModelSummary).

    As Lightning's, it is built once (the example forward, which records each layer's sizes and FLOPs, runs then) and
    read live: the layers' types, modes and parameter counts and the totals are the module's as they are when read."""

    def __init__(self, module, max_depth=1, numel=None, input_array=None, forward=None, precision=None,
                 device_numel=None):
        _check_depth(max_depth)
        self._model = module
        self._max_depth = self.max_depth = max_depth
        self._numel = numel or _initialized_numel
        self._device_numel = device_numel
        self._input_array = input_array
        self._forward = forward
        self.has_input = input_array is not None
        # (depth + 1: the root module is depth 0 to the counter)
        self._flop_counter = FlopCounterMode(display=False, depth=max_depth + 1)
        if precision is not None and precision not in _PRECISION_BITS:
            warnings.warn(f"Precision {precision} is not supported by the model summary.  Estimated model size in MB "
                          "will not be accurate. Using 32 bits instead.", UserWarning)
        self.precision_bits = _PRECISION_BITS.get(precision, 32)
        self._layer_summary = self.summarize()

    @property
    def named_modules(self):
        """The layers the summary hooks (Lightning's): none at depth 0, the children at 1, every sub-module below (the
        rows are then cut to max_depth)."""
        if self._max_depth == 0:
            return []
        if self._max_depth == 1:
            return list(self._model.named_children())
        return list(self._model.named_modules())[1:]

    def summarize(self):
        """{layer name: LayerSummary} down to max_depth, measured by one forward pass of the input where there is one
        (Lightning's summarize; __init__ calls it)."""
        summary = {name: LayerSummary(layer) for name, layer in self.named_modules}
        if self._input_array is not None:
            self._forward_example_input()
        for layer in summary.values():
            layer.detach_hook()
        if self._max_depth >= 1:
            summary = {name: layer for name, layer in summary.items() if name.count(".") < self._max_depth}
        return summary

    def _forward_example_input(self):
        """One forward pass in eval mode without gradients (each layer's mode restored after), under the FLOP
        counter: the layers' hooks record their first input and output sizes."""
        module = self._model
        modes = {layer: layer.training for layer in module.modules()}
        module.eval()
        try:
            with torch.no_grad(), self._flop_counter:
                if self._forward is not None:
                    self._forward(module, self._input_array)
                else:
                    _call(module, self._input_array)
        finally:
            for layer, training in modes.items():
                layer.training = training

    @property
    def layer_names(self):
        return list(self._layer_summary)

    @property
    def layer_types(self):
        return [layer.layer_type for layer in self._layer_summary.values()]

    @property
    def in_sizes(self):
        return [layer.in_size for layer in self._layer_summary.values()]

    @property
    def out_sizes(self):
        return [layer.out_size for layer in self._layer_summary.values()]

    @property
    def param_nums(self):
        return [sum(self._numel(p) for p in layer._module.parameters()) for layer in self._layer_summary.values()]

    @property
    def parameters_per_layer(self):
        """This device's share of each layer's parameters where they are partitioned over devices (DeepSpeed ZeRO-3:
        Lightning's DeepSpeedSummary column "Params per Device"); None otherwise."""
        if self._device_numel is None:
            return None
        return [sum(self._device_numel(p) for p in layer._module.parameters())
                for layer in self._layer_summary.values()]

    @property
    def training_modes(self):
        return [layer.training for layer in self._layer_summary.values()]

    @property
    def total_training_modes(self):
        """{"train": n, "eval": m}: the modules in each mode, the root left out."""
        modes = [layer.training for layer in list(self._model.modules())[1:]]
        return {"train": modes.count(True), "eval": modes.count(False)}

    @property
    def total_parameters(self):
        return sum(self._numel(p) for p in self._model.parameters())

    @property
    def trainable_parameters(self):
        return sum(self._numel(p) for p in self._model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self):
        return sum(self.param_nums)

    @property
    def model_size(self):
        """The parameters' size in MB at the precision's bits."""
        return self.total_parameters * self.precision_bits / 8 * 1e-6

    @property
    def total_flops(self):
        return self._flop_counter.get_total_flops()

    @property
    def flop_counts(self):
        """{layer name: {operator: FLOPs}} of the example forward ({} each without one)."""
        counts = self._flop_counter.get_flop_counts()
        root = type(self._model).__name__
        return {name: counts.get(f"{root}.{name}", {}) for name in self.layer_names}

    @property
    def flops(self):
        """Each layer's FLOPs in the example forward."""
        return [sum(counts.values()) for counts in self.flop_counts.values()]

    def _get_summary_data(self):
        """The table's columns: (header, cells), Lightning's order."""
        columns = [
            (" ", [str(i) for i in range(len(self._layer_summary))]),
            ("Name", self.layer_names),
            ("Type", self.layer_types),
            ("Params", [get_human_readable_count(n) for n in self.param_nums]),
            *([] if self._device_numel is None else
              [("Params per Device", [get_human_readable_count(n) for n in self.parameters_per_layer])]),
            ("Mode", ["train" if mode else "eval" for mode in self.training_modes]),
            ("FLOPs", [get_human_readable_count(n) for n in self.flops]),
        ]
        if self.has_input:
            columns += [("In sizes", [str(s) for s in self.in_sizes]), ("Out sizes", [str(s) for s in self.out_sizes])]
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:
            extra = {" ": " ", "Name": LEFTOVER_PARAMS_NAME, "Params": get_human_readable_count(leftover)}
            for header, cells in columns:
                cells.append(extra.get(header, NOT_APPLICABLE))
        return columns

    def __str__(self):
        return _format_summary_table(self.total_parameters, self.trainable_parameters, self.model_size,
                                     self.total_training_modes, self.total_flops, *self._get_summary_data())

    __repr__ = __str__


class LayerSummary:
    """Lightning's summary of one layer: `layer_type` (its class name), `num_parameters` (uninitialized lazy
    parameters count 0, with a warning), `training`, and `in_size` / `out_size`, recorded by the first forward pass
    after it was made (UNKNOWN_SIZE before; a hook that then removes itself; `detach_hook()` removes it before, as
    does the object's end). Not for a torch.jit.ScriptModule's sizes (no hook can be registered there)."""

    def __init__(self, module: torch.nn.Module):
        self._module = module
        self._in_size = self._out_size = None
        self._hook_handle = None
        if not isinstance(module, torch.jit.ScriptModule):
            self._hook_handle = module.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs, output):
        inputs = (*args, *kwargs.values())
        self._in_size = _shape(inputs[0] if len(inputs) == 1 else inputs)
        self._out_size = _shape(output)
        self.detach_hook()

    def __del__(self):
        self.detach_hook()

    def detach_hook(self):
        if self._hook_handle is not None:
            self._hook_handle.remove()

    @property
    def in_size(self):
        return self._in_size or UNKNOWN_SIZE

    @property
    def out_size(self):
        return self._out_size or UNKNOWN_SIZE

    @property
    def layer_type(self):
        return type(self._module).__name__

    @property
    def num_parameters(self):
        return sum(_initialized_numel(p) for p in self._module.parameters())

    @property
    def training(self):
        return self._module.training


class DeepSpeedSummary(Summary):
    """Lightning's DeepSpeedSummary(model, max_depth=1): the summary of a module whose parameters DeepSpeed ZeRO-3
    partitioned: counts of the whole parameters (`ds_numel`) and a "Params per Device" column (`parameters_per_layer`,
    this device's partitions: `partition_numel()`). A parameter DeepSpeed did not partition counts its own elements
    in both. With the module's example_input_array, one forward pass gives the sizes and FLOPs (every rank must run
    it under ZeRO-3)."""

    def __init__(self, model: "tasktrain.TaskModule", max_depth: int = 1):
        _check_depth(max_depth)
        super().__init__(model, max_depth, numel=_full_numel, device_numel=_partition_numel,
                         **_example_forward(model, max_depth))


# the summary's warnings said so far, each once per process (Lightning's warning_cache; clear() says them again)
warning_cache = set()
_LAZY_WARNING = ("The total number of parameters detected may be inaccurate because the model contains an instance "
                 "of `UninitializedParameter`. To get an accurate number, set `self.example_input_array` in your "
                 "module.")


def _initialized_numel(p):
    """p.numel(); 0 for a lazy layer's parameter not yet initialized, with Lightning's warning (once)."""
    if isinstance(p, torch.nn.parameter.UninitializedParameter):
        if _LAZY_WARNING not in warning_cache:
            warning_cache.add(_LAZY_WARNING)
            warnings.warn(_LAZY_WARNING, UserWarning)
        return 0
    return p.numel()


def _full_numel(p):
    return getattr(p, "ds_numel", None) or _initialized_numel(p)


def _partition_numel(p):
    return p.partition_numel() if hasattr(p, "partition_numel") else _initialized_numel(p)


class ModuleSummary(Summary):
    """Lightning's `lightning.pytorch.utilities.model_summary.ModelSummary(model, max_depth=1)` (that path's
    `ModelSummary`): the summary of a module on its own. As Lightning's, when the module sets `example_input_array`
    one forward pass of it gives the In / Out sizes and the FLOPs (without it: no size columns, FLOPs 0); a layer
    the forward does not reach shows "?". `input_array=` (tasktrain's) runs that input instead."""

    def __init__(self, model: "tasktrain.TaskModule", max_depth: int = 1, input_array=None):
        _check_depth(max_depth)
        super().__init__(model, max_depth, **_example_forward(model, max_depth, input_array))


def _example_forward(model, max_depth, input_array=None):
    """Summary's input_array / forward / precision for Lightning's ModelSummary(model): the example input (the
    module's example_input_array unless given) through the module's batch hooks, as Lightning's
    _forward_example_input: on_before_batch_transfer, transfer_batch_to_device to the module's device,
    on_after_batch_transfer (dataloader_idx 0; the attached trainer's DataModule's hook where it overrides one), in the
    module's own mode; then the forward (eval mode, no gradients) under the attached trainer's precision (its
    strategy's forward context, its bits for the size). No trainer: no precision context, 32 bits."""
    trainer = getattr(model, "_trainer", None)
    precision = None if trainer is None else trainer.precision
    if input_array is None:
        input_array = getattr(model, "example_input_array", None)
    if input_array is None:
        return {"precision": precision}
    if hasattr(model, "transfer_batch_to_device"):  # (a TaskModule: its hooks; a plain nn.Module has none)
        input_array = _batch_hook(model, trainer, "on_before_batch_transfer", input_array, 0)
        input_array = _batch_hook(model, trainer, "transfer_batch_to_device", input_array, model.device, 0)
        input_array = _batch_hook(model, trainer, "on_after_batch_transfer", input_array, 0)
    forward = None if trainer is None else _forward_in(trainer.strategy)
    return {"precision": precision, "input_array": input_array, "forward": forward}


def _as_a_batch(trainer, module, batch):
    """`batch` to the strategy's device as the Trainer moves a batch (dataloader_idx 0): the module's (or the
    DataModule's) on_before_batch_transfer, transfer_batch_to_device and on_after_batch_transfer where overridden, the
    strategy's move (and the precision's input cast) in place of a transfer hook that is not."""
    from tasktrain.trainer.datamodule import DataModule
    from tasktrain.trainer.module import TaskModule, is_overridden

    def overridden(name):
        return is_overridden(name, module, TaskModule) or (
            trainer.datamodule is not None and is_overridden(name, trainer.datamodule, DataModule))

    strategy = trainer.strategy
    if overridden("on_before_batch_transfer"):
        batch = _batch_hook(module, trainer, "on_before_batch_transfer", batch, 0)
    if overridden("transfer_batch_to_device"):
        batch = _batch_hook(module, trainer, "transfer_batch_to_device", batch, strategy.root_device, 0)
    else:
        batch = strategy.move_batch(batch)
    if overridden("on_after_batch_transfer"):
        batch = _batch_hook(module, trainer, "on_after_batch_transfer", batch, 0)
    return batch


def _batch_hook(model, trainer, name, *args):
    """Lightning's _call_batch_hook: the DataModule's hook where the trainer has one that overrides it, else the
    module's."""
    datamodule = None if trainer is None else getattr(trainer, "datamodule", None)
    if datamodule is not None:
        from tasktrain.trainer.datamodule import DataModule
        from tasktrain.trainer.module import is_overridden

        if is_overridden(name, datamodule, DataModule):
            return getattr(datamodule, name)(*args)
    return getattr(model, name)(*args)


def summarize(lightning_module, max_depth=1):
    """The summary of `lightning_module` (a TaskModule or any nn.Module; Lightning's parameter name), with sizes
    and FLOPs if it sets example_input_array (Lightning's summarize: its ModelSummary(module, max_depth))."""
    return ModuleSummary(lightning_module, max_depth)


class ModelSummary(Callback):
    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        _check_depth(max_depth)  # Lightning checks when fit starts; a bad depth is known here already
        self._max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs

    @property
    def max_depth(self):
        return self._max_depth

    def on_fit_start(self, trainer, pl_module):
        if not self._max_depth:
            return
        sharded = _sharded(trainer.strategy)
        if not trainer.is_global_zero and not (sharded and getattr(pl_module, "example_input_array", None) is not None):
            return  # the others have nothing to do; where each rank holds a shard, the example forward needs them all
        summary = self._summary(trainer, pl_module, sharded)
        if not trainer.is_global_zero:
            return  # only rank 0 prints
        self.summarize(summary._get_summary_data(), summary.total_parameters, summary.trainable_parameters,
                       summary.model_size, summary.total_training_modes, total_flops=summary.total_flops,
                       **self._summarize_kwargs)

    def _summary(self, trainer, pl_module, sharded=False):
        strategy = trainer.strategy
        input_array = getattr(pl_module, "example_input_array", None)
        forward = None
        if input_array is not None:  # (sharded: every rank runs it, as in Lightning; else rank 0 alone)
            # as a batch goes, as Lightning's: through the module's (or the DataModule's) batch hooks, dataloader_idx
            # 0, to the device (without hooks: the strategy's move and the precision's input cast)
            input_array = _as_a_batch(trainer, pl_module, input_array)
            forward = _forward_in(strategy)
        params = list(pl_module.parameters())
        partitioned = bool(params) and strategy.device_numel(params[0]) is not None
        return Summary(pl_module, self._max_depth, numel=strategy.full_numel, input_array=input_array,
                       forward=forward, precision=trainer.precision,
                       device_numel=strategy.device_numel if partitioned else None)

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs):
        """Print the table (Lightning logs it at INFO level)."""
        print(_format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes,
                                    total_flops, *summary_data), flush=True)


class RichModelSummary(ModelSummary):
    """ModelSummary drawn as a rich table (`header_style`, default "bold magenta"); needs the `rich` package."""

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if not _RICH_AVAILABLE:
            raise ModuleNotFoundError("`RichModelSummary` requires `rich` to be installed. Install it by running "
                                      "`pip install -U rich`.")
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs):
        from rich import get_console
        from rich.table import Table

        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        right = {"Params", "Params per Device", "FLOPs", "In sizes", "Out sizes"}
        for header, _ in summary_data:
            table.add_column(header, justify="right" if header in right else "left", style="dim" if header == " "
                             else None, no_wrap=header == "Name")
        for row in zip(*(cells for _, cells in summary_data)):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        # a grid, as Lightning's: rich highlights numbers in printed text, not in table cells
        counts = [get_human_readable_count(int(n)) for n in
                  (trainable_parameters, total_parameters - trainable_parameters, total_parameters)]
        counts = [f"{text:<10}" for text in counts + [f"{model_size:,.3f}"]]
        grid = Table.grid(expand=True)
        grid.add_column()
        grid.add_column()
        for row in (f"[bold]Trainable params[/]: {counts[0]}", f"[bold]Non-trainable params[/]: {counts[1]}",
                    f"[bold]Total params[/]: {counts[2]}",
                    f"[bold]Total estimated model params size (MB)[/]: {counts[3]}",
                    f"[bold]Modules in train mode[/]: {total_training_modes['train']}",
                    f"[bold]Modules in eval mode[/]: {total_training_modes['eval']}",
                    f"[bold]Total FLOPs[/]: {get_human_readable_count(total_flops)}"):
            grid.add_row(row)
        console.print(grid)


def get_human_readable_count(number):
    """123 -> '123  ', 1234 -> '1.2 K', 2e6 -> '2.0 M', 4e14 -> '400 T', 5e15 -> '5,000 T' (Lightning's)."""
    units = [" ", "K", "M", "B", "T"]
    groups = min(math.ceil((int(math.floor(math.log10(number))) + 1 if number > 0 else 1) / 3), len(units))
    scaled = number * 10 ** (-3 * (groups - 1))
    if groups == 1 or scaled >= 100:
        return f"{int(scaled):,d} {units[groups - 1]}"
    return f"{scaled:,.1f} {units[groups - 1]}"


def get_formatted_model_size(total_model_size):
    """Megabytes as the summary prints them: thousands separated, three decimals."""
    return f"{total_model_size:,.3f}"


def _format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes, total_flops,
                          *columns):
    widths = [max([len(header)] + [len(str(cell)) for cell in cells]) for header, cells in columns]
    rule = "-" * (sum(widths) + 3 * (len(columns) + 1))
    lines = [" | ".join(header.ljust(w) for (header, _), w in zip(columns, widths)), rule]
    for row in zip(*(cells for _, cells in columns)):
        lines.append(" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
    lines.append(rule)
    totals = [
        (get_human_readable_count(trainable_parameters), "Trainable params"),
        (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
        (get_human_readable_count(total_parameters), "Total params"),
        (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
        (total_training_modes["train"], "Modules in train mode"),
        (total_training_modes["eval"], "Modules in eval mode"),
        (get_human_readable_count(total_flops), "Total Flops"),
    ]
    lines += [f"{str(value):<10}{label}" for value, label in totals]
    return "\n".join(lines)


def _check_depth(max_depth):
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
        raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth}. -1 shows every layer, 0 no table.")


def _call(module, x):
    return module(*x) if isinstance(x, (list, tuple)) else module(**x) if isinstance(x, dict) else module(x)


def _sharded(strategy):
    """Whether each rank holds a shard of the parameters (DeepSpeed ZeRO-3, FSDP): a forward pass then needs every
    rank."""
    try:
        strategy.check_full_parameters("ModelSummary")
    except ValueError:
        return True
    return False


def _forward_in(strategy):
    def forward(module, x):
        with strategy.forward_context():
            return _call(module, x)
    return forward


def _shape(value):
    if hasattr(value, "shape"):
        return list(value.shape)
    if isinstance(value, (list, tuple)):
        return [_shape(v) for v in value]
    return UNKNOWN_SIZE
