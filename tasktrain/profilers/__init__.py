"""Profilers: where a run spends its time, action by action (Lightning's classes and action names).

    Trainer(profiler="simple")      # SimpleProfiler: wall time per action, a table at the end of the run
    Trainer(profiler="advanced")    # AdvancedProfiler: cProfile per action (the functions inside each)
    Trainer(profiler="pytorch")     # PyTorchProfiler: torch.profiler; a trace TensorBoard (and Perfetto) opens
    Trainer(profiler=SimpleProfiler(dirpath="prof", filename="perf"))   # an instance, with its options

The Trainer profiles these actions (Lightning's names; S: the strategy's class under Lightning's name, M: the module's):

    run_training_epoch, run_training_batch, [_TrainingEpochLoop].train_dataloader_next,
    [Strategy]S.training_step, [Strategy]S.backward, [LightningModule]M.optimizer_step,
    [LightningModule]M.optimizer_zero_grad, optimizer_step (a manual optimisation's step),
    [Strategy]S.validation_step / test_step / predict_step, [_EvaluationLoop].val_next / test_next,
    [_PredictionLoop].predict_next, [Strategy]S.setup_module_and_optimizers, save_checkpoint (during a run),
    [Callback]<state_key>.<event>, [LightningModule]M.<event>      (each hook that is overridden)

Without a profiler (the default) nothing is wrapped: the loop calls the strategy's methods and the hooks as they
are (the few once-per-run actions are a `with` on a shared no-op context). At the end of each run (fit,
validate, test, predict), `describe()` prints the summary on rank 0, or, with a `filename`, writes it to
`dirpath/<stage>-<filename>[-<local rank>].txt` on every rank; `dirpath` defaults to the trainer's log_dir.
"""
import contextlib
import cProfile
import inspect
import logging
import math
import io
import os
import pstats
import re
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Union

import torch

from tasktrain.exceptions import MisconfigurationException

log = logging.getLogger("tasktrain.profilers")
_NO_OP = contextlib.nullcontext()
profiler_warnings = set()  # PyTorchProfiler's warnings said so far, each once per process (Lightning's warning cache)


class Profiler:
    """The base: start(action) / stop(action), profile(action) as a context, summary() as text."""

    # Lightning's open report file, held from describe to teardown there; tasktrain opens and closes it inside
    # describe, so none is ever held (scripts that check it is closed after a run read None)
    _output_file = None

    def __init__(self, dirpath: Optional[Union[str, Path]] = None, filename: Optional[str] = None):
        self.dirpath = dirpath  # (as given, a str or a Path, as Lightning keeps it)
        self.filename = filename
        self._stage = None
        self._local_rank = None
        self._is_global_zero = True

    def start(self, action_name):
        raise NotImplementedError

    def stop(self, action_name):
        raise NotImplementedError

    def summary(self):
        raise NotImplementedError

    @contextlib.contextmanager
    def profile(self, action_name):
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def setup(self, stage, local_rank=None, log_dir=None, is_global_zero=True, module=None):
        """Called by the Trainer when a run starts. local_rank: None on one process."""
        self._stage, self._local_rank, self._is_global_zero = stage, local_rank, is_global_zero
        self.dirpath = self.dirpath or log_dir

    @property
    def local_rank(self):
        """Lightning's: the local rank setup() was given, 0 before a run and on one process."""
        return 0 if self._local_rank is None else self._local_rank

    def teardown(self, stage):
        """Called by the Trainer when a run ends (after describe)."""

    def describe(self):
        """Log the summary (INFO, logger "tasktrain.profilers", local rank 0), or, with a filename, append it to
        `dirpath/<stage>-<filename>[-<local rank>].txt` (every rank), as Lightning's."""
        text = self.summary()
        if not text:
            return
        if self.filename:
            path = os.path.join(self.dirpath or ".", self._prepare_filename())
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a") as f:
                f.write(text + "\n")
        elif self._local_rank in (None, 0):
            log.info(text)

    def _title(self):
        """Lightning's first line of a report: "FIT Profiler Report" (the stage's name, upper case, where known)."""
        return (f"{self._stage.upper()} " if self._stage is not None else "") + "Profiler Report"

    def _prepare_filename(self, action_name=None, extension=".txt"):
        """Lightning's file name: "<stage>-<filename>-<local rank>-<action>" (each part where there is one), the
        characters a path cannot hold replaced by "_", "profile" where nothing is left."""
        parts = [self._stage] if self._stage is not None else []
        parts += [str(self.filename)] if self.filename else []
        parts += [str(self._local_rank)] if self._local_rank is not None else []
        parts += [action_name] if action_name is not None else []
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(parts))).strip()
        return (base or "profile") + extension


class PassThroughProfiler(Profiler):
    """Profiles nothing (what `profiler=None` means)."""

    def start(self, action_name):
        pass

    def stop(self, action_name):
        pass

    def summary(self):
        return ""


class SimpleProfiler(Profiler):
    """Wall-clock time of every action: mean, count, total and share of the run, largest share first (Lightning's
    table). extended=False: action, mean and total only, the longest mean first."""

    def __init__(
        self,
        dirpath: Optional[Union[str, Path]] = None,
        filename: Optional[str] = None,
        extended: bool = True,
    ):
        super().__init__(dirpath, filename)
        self.extended = extended
        self.current_actions = {}
        self.recorded_durations = defaultdict(list)
        self.start_time = time.perf_counter()

    def setup(self, stage, local_rank=None, log_dir=None, is_global_zero=True, module=None):
        super().setup(stage, local_rank, log_dir, is_global_zero, module)
        self.start_time = time.perf_counter()

    def start(self, action_name):
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name):
        end = time.perf_counter()
        start = self.current_actions.pop(action_name, None)
        if start is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - start)

    def _make_report_extended(self):
        """([(action, mean, calls, total, share of the run in %)] largest share first, all calls, the run's seconds)."""
        run_time = time.perf_counter() - self.start_time
        rows = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)  # (exact sums: many short durations)
            rows.append((action, total / len(durations), len(durations), total, 100.0 * total / run_time))
        rows.sort(key=lambda row: row[4], reverse=True)
        return rows, sum(row[2] for row in rows), run_time

    def _make_report(self):
        """[(action, mean, total)], the longest mean first."""
        rows = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)
            rows.append((action, total / len(durations), total))
        rows.sort(key=lambda row: row[1], reverse=True)
        return rows

    def summary(self):
        """Lightning's table, cell for cell: the action column as wide as the longest name, the others 15 wide, each
        cell closed by a tab (expand the tabs to align it); numbers with 5 significant digits."""
        sep = os.linesep
        text = self._title() + sep
        if not self.recorded_durations:
            return text + sep
        width = max(len(action) for action in self.recorded_durations)

        def row(action, *cells):
            return f"{sep}|  {action:<{width}s}\t|" + "".join(f"  {cell:<15}\t|" for cell in cells)

        if self.extended:
            header = row("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            rows, calls, run_time = self._make_report_extended()
            body = [row("Total", "-", f"{calls}", f"{run_time:.5}", "100 %"), None]
            body += [row(action, f"{mean:.5}", f"{count}", f"{total:.5}", f"{share:.5}")
                     for action, mean, count, total, share in rows]
        else:
            header = row("Action", "Mean duration (s)", "Total time (s)")
            body = [row(action, f"{mean:.5}", f"{total:.5}") for action, mean, total in self._make_report()]
        rule = f"{sep}{'-' * len(header.expandtabs())}"
        text += rule + header + rule + "".join(rule if line is None else line for line in body) + rule
        return text + sep

    def teardown(self, stage):
        # recorded_durations stay (Lightning's SimpleProfiler keeps them: trainer.profiler.recorded_durations is
        # readable after fit, and a later run of the same Trainer adds to them)
        self.current_actions.clear()


class AdvancedProfiler(Profiler):
    """cProfile for every action: the functions each one spends its time in. line_count_restriction limits the
    rows per action (an int: that many; a float in (0, 1]: that fraction). dump_stats=True also writes each
    action's raw stats to `dirpath/<stage>-<filename>[-<local rank>]-<action>.prof` (pstats / snakeviz read them)."""

    def __init__(
        self,
        dirpath: Optional[Union[str, Path]] = None,
        filename: Optional[str] = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ):
        super().__init__(dirpath, filename)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self.profiled_actions = {}

    def start(self, action_name):
        if action_name not in self.profiled_actions:
            self.profiled_actions[action_name] = cProfile.Profile()
        self.profiled_actions[action_name].enable()

    def stop(self, action_name):
        profiler = self.profiled_actions.get(action_name)
        if profiler is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profiler.disable()

    def summary(self):
        parts = []
        for action_name, profiler in self.profiled_actions.items():
            if self.dump_stats:
                path = os.path.join(self.dirpath or ".", self._prepare_filename(action_name, ".prof"))
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                profiler.dump_stats(path)
            stream = io.StringIO()
            stats = pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats("cumulative")
            stats.print_stats(self.line_count_restriction)
            rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
            parts += [f"Profile stats for: {action_name}{rank}", stream.getvalue()]
        if not parts:
            return ""
        return os.linesep.join([self._title(), *parts])

    def teardown(self, stage):
        self.profiled_actions = {}


class PyTorchProfiler(Profiler):
    """torch.profiler over the run: each action is a `record_function` range
    ("[tasktrain][profile][Strategy]SingleDeviceStrategy.training_step", ...: Lightning's "[pl][profile]..." with
    "[pl]" renamed), each module's forward one too
    ("[tasktrain][module]<class>: <name>", record_module_names=True), and every training/validation/test/predict step
    is a profiler step (for a `schedule`).

    The trace is written by `torch.profiler.tensorboard_trace_handler` to `dirpath` as
    `<stage>-<filename>-<worker>.<time>.pt.trace.json`, which TensorBoard's PyTorch profiler plugin lists and
    Perfetto / chrome://tracing open (export_to_chrome=False: no trace). Without a `schedule` (the default) it
    records as Lightning's: `torch.profiler.schedule(wait=1, warmup=1, active=3)` counted per kind of step
    (training, validation, test, predict each wait one step, warm up one, record three, once per run), and where the
    run has fewer than 5 steps of the kind being profiled it warns once ("... not enough steps to properly record
    traces.") and records the whole run instead. `schedule=None` records the whole run; a schedule of one's own is
    counted per kind of step too, each kind recorded until the schedule's first save, as Lightning's. Other keyword arguments go to torch.profiler.profile
    (activities, record_shapes, profile_memory, with_flops, on_trace_ready, ...). The summary is the operator table
    (`key_averages().table(sort_by=sort_by_key, row_limit=row_limit, **table_kwargs)`; `function_events` keeps the last
    recording's events after the run). emit_nvtx is not supported.
    """

    STEP_FUNCTIONS = ("training_step", "validation_step", "test_step", "predict_step")
    # Lightning's: the sort_by_key values it takes (a key outside them is refused when the profiler is built)
    AVAILABLE_SORT_KEYS = {"cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage",
                           "cuda_memory_usage", "self_cpu_memory_usage", "self_cuda_memory_usage", "count"}

    def __init__(
        self,
        dirpath: Optional[Union[str, Path]] = None,
        filename: Optional[str] = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: Optional[str] = None,
        record_module_names: bool = True,
        table_kwargs: Optional[dict[str, Any]] = None,
        **profiler_kwargs,
    ):
        super().__init__(dirpath, filename)
        if emit_nvtx:
            raise ValueError("PyTorchProfiler(emit_nvtx=True) is not supported: run under Nsight Systems with "
                             "torch.autograd.profiler.emit_nvtx() around trainer.fit instead.")
        self._group_by_input_shapes = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        if sort_by_key is not None and sort_by_key not in self.AVAILABLE_SORT_KEYS:  # (Lightning's check and words)
            raise MisconfigurationException(
                f"Found sort_by_key: {sort_by_key}. Should be within {self.AVAILABLE_SORT_KEYS}. ")
        self._sort_by_key = sort_by_key
        self._table_kwargs = dict(table_kwargs or {})
        # (Lightning's check: the other keyword arguments of torch's EventList.table, checked before any run)
        table_keys = set(inspect.signature(torch.autograd.profiler_util.EventList.table).parameters) - {
            "self", "sort_by", "row_limit"}
        for key in self._table_kwargs:
            if key in ("sort_by", "row_limit"):
                raise KeyError(f"Found invalid table_kwargs key: {key}. This is already a positional argument of the "
                               "Profiler.")
            if key not in table_keys:
                raise KeyError(f"Found invalid table_kwargs key: {key}. Should be within {table_keys}.")
        self._record_module_names = record_module_names
        schedule = profiler_kwargs.pop("schedule", _DEFAULT)
        if schedule is not None and schedule is not _DEFAULT:  # (Lightning's checks, before any run)
            if not callable(schedule):
                raise MisconfigurationException(f"Schedule should be a callable. Found: {schedule}")
            action = schedule(0)
            if not isinstance(action, torch.profiler.ProfilerAction):
                raise MisconfigurationException(
                    f"Schedule should return a `torch.profiler.ProfilerAction`. Found: {action}")
        # Lightning's window by default, a schedule of one's own as given: either counted per kind of step, as
        # Lightning's ScheduleWrapper; None records the whole run (the default is dropped where a run is too short)
        self._schedule = StageSchedule() if schedule is _DEFAULT else None if schedule is None else \
            StageSchedule(schedule)
        self._profiler_kwargs = dict(profiler_kwargs)  # (with_stack=..., torch's, among them: Lightning's way)
        self.profiler = None
        self.function_events = None
        self._ranges = {}
        self._module = None
        self._hooks = None  # (the RegisterRecordFunction entered for the run's module)

    def setup(self, stage, local_rank=None, log_dir=None, is_global_zero=True, module=None):
        super().setup(stage, local_rank, log_dir, is_global_zero, module)
        self._module = module

    def _activities(self):
        activities = self._profiler_kwargs.get("activities")
        if activities is not None:
            return activities
        out = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            out.append(torch.profiler.ProfilerActivity.CUDA)
        return out

    def start(self, action_name):
        if self.profiler is None:
            kwargs = dict(self._profiler_kwargs, activities=self._activities(), schedule=self._schedule)
            if self._schedule is not None:
                self._schedule.reset(action_name)
            if self._export_to_chrome and "on_trace_ready" not in kwargs:
                worker = self._prepare_filename(extension="")
                kwargs["on_trace_ready"] = torch.profiler.tensorboard_trace_handler(self.dirpath or ".", worker)
            self.profiler = torch.profiler.profile(**kwargs)
            self.function_events = None  # (a new recording: the last one's events are let go)
            self.profiler.__enter__()
            if self._record_module_names and self._module is not None:
                self._hooks = RegisterRecordFunction(self._module).__enter__()
        if action_name not in self._ranges:
            span = torch.autograd.profiler.record_function("[tasktrain][profile]" + action_name)
            span.__enter__()
            self._ranges[action_name] = span

    def stop(self, action_name):
        span = self._ranges.pop(action_name, None)
        if span is not None:
            span.__exit__(None, None, None)
        if self.profiler is not None and action_name.endswith(self.STEP_FUNCTIONS):
            if self._schedule is not None:
                self._schedule.kind = action_name.rsplit("_", 1)[0].rsplit(".", 1)[-1]
                # Lightning's default window needs 5 steps of a kind (wait 1, warm up 1, record 3): with fewer, its
                # trace would never be saved (or torch fails), so the whole run is recorded instead, as Lightning's
                if self._schedule.default and self._steps_in_run(self._schedule.kind) < 5:
                    message = ("The PyTorch Profiler default schedule will be overridden as there is not enough "
                               "steps to properly record traces.")
                    if message not in profiler_warnings:
                        profiler_warnings.add(message)
                        if self._is_global_zero:
                            warnings.warn(message, UserWarning, stacklevel=2)
                    self._schedule = None
                    self.profiler.schedule = lambda step: torch.profiler.ProfilerAction.RECORD
                else:  # (the trace's ProfilerStep#<n> numbers the steps of the kind, as Lightning's)
                    self.profiler.step_num = self._schedule.count()
            self.profiler.step()

    def _steps_in_run(self, kind):
        """The steps of `kind` this run will take, as Lightning counts them for its warning (validation: the sanity
        check's too); inf where unknown (a profiler used outside a Trainer)."""
        trainer = getattr(self._module, "_trainer", None) if self._module is not None else None
        if trainer is None:
            return float("inf")
        if kind == "training":
            return trainer.num_training_batches
        if kind == "validation":
            return sum(trainer.num_val_batches) + sum(trainer.num_sanity_val_batches)
        return sum(trainer.num_test_batches if kind == "test" else trainer.num_predict_batches)

    def _finish(self):
        for span in self._ranges.values():
            span.__exit__(None, None, None)
        self._ranges = {}
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
        self._hooks = None
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)  # writes the trace (on_trace_ready)
            self.function_events = self.profiler.events()
            self.profiler = None

    def summary(self):
        self._finish()
        if not self.function_events:
            return ""
        sort_by = self._sort_by_key or ("cuda_time_total" if torch.profiler.ProfilerActivity.CUDA in
                                        self._activities() else "cpu_time_total")
        table = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes).table(
            sort_by=sort_by, row_limit=self._row_limit, **self._table_kwargs)
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        return os.linesep.join([self._title(), f"Profile stats for: records{rank}", table])

    def teardown(self, stage):
        # (function_events stay readable after the run, as Lightning's: the events of its last recording)
        self._finish()
        self._module = None


_DEFAULT = object()  # (PyTorchProfiler given no `schedule`)


class StageSchedule:
    """A schedule counted per kind of step, as Lightning's ScheduleWrapper: `window` (the user's schedule, else
    Lightning's default `torch.profiler.schedule(wait=1, warmup=1, active=3)`) is asked for the action at the count
    of the kind just stepped (training, validation, test, predict), each kind recorded until its first save, once
    per run. torch's step number is ignored."""

    def __init__(self, window=None):
        self.default = window is None
        self._window = torch.profiler.schedule(wait=1, warmup=1, active=3) if window is None else window
        self.reset(None)

    def reset(self, first_action):
        self.kind = None  # the kind of the step that just ended (the profiler sets it before stepping)
        self._first_action = first_action
        self._counts = defaultdict(int)
        self._done = set()
        self._previous = None

    def count(self):
        return self._counts[self.kind]

    def __call__(self, _step):
        Action = torch.profiler.ProfilerAction
        if self.kind is None or self.kind in self._done:
            return Action.NONE
        # (as Lightning's: a fit whose first profiled action is on_fit_start counts no sanity-check steps)
        if self.kind != "validation" or not (self._first_action or "").endswith("on_fit_start") \
                or self._counts["training"] > 0:
            self._counts[self.kind] += 1
        action = self._window(self._counts[self.kind])
        if self._previous == Action.RECORD and action == Action.WARMUP:
            # a kind starting while another records (validation inside the training window): torch refuses to go
            # from recording back to warming up, so it records on
            action = Action.RECORD
        if action == Action.RECORD_AND_SAVE:
            self._done.add(self.kind)
        self._previous = action
        return action


class RegisterRecordFunction:
    """`with RegisterRecordFunction(model): model(x)`: while inside, each submodule's forward is a record_function
    range named "[tasktrain][module]<module>.<class>: <name>" (PyTorchProfiler(record_module_names=True) enters it
    around a run); leaving removes the hooks. Lightning's class of that name, usable outside a Trainer too."""

    def __init__(self, model):
        self._model = model
        self._handles = []
        self._open = {}  # id(submodule) -> its ranges in progress (a module may be re-entered)

    def _start(self, module, args, label):
        span = torch.autograd.profiler.record_function(label)
        span.__enter__()
        self._open.setdefault(id(module), []).append(span)

    def _stop(self, module, args, output):
        spans = self._open.get(id(module))
        if spans:
            spans.pop().__exit__(None, None, None)

    def __enter__(self):
        for name, layer in self._model.named_modules():
            if not name:
                continue
            label = f"[tasktrain][module]{type(layer).__module__}.{type(layer).__name__}: {name}"
            self._handles.append(layer.register_forward_pre_hook(
                lambda module, args, label=label: self._start(module, args, label)))
            self._handles.append(layer.register_forward_hook(self._stop))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []


PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler,
             "passthrough": PassThroughProfiler}


def resolve_profiler(profiler):
    """Trainer(profiler=...): None, a name ("simple", "advanced", "pytorch", "passthrough") or a Profiler."""
    if profiler is None or isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str) and profiler.lower() in PROFILERS:
        return PROFILERS[profiler.lower()]()
    raise MisconfigurationException(
        "When passing string value for the `profiler` parameter of `Trainer`, it can only be one of "
        f"{list(PROFILERS)} (got {profiler!r}); or pass None or a Profiler instance (tasktrain.profilers).")


def strategy_action(strategy, hook):
    """Lightning's action name of a strategy's hook: "[Strategy]<class>.<hook>", the class under Lightning's name
    (SingleDevice is SingleDeviceStrategy there, DDP DDPStrategy, ...; a subclass of one's own keeps its name)."""
    kind = type(strategy)
    name = kind.__name__
    if kind.__module__.startswith("tasktrain.") and not name.endswith("Strategy"):
        name += "Strategy"
    return f"[Strategy]{name}.{hook}"


def module_action(module, hook):
    """Lightning's action name of a module's hook: "[LightningModule]<class>.<hook>" (a TaskModule is Lightning's
    LightningModule under the rename)."""
    return f"[LightningModule]{type(module).__name__}.{hook}"


def profiled_calls(profiler, event, fns):
    """The Trainer's hook list for `event` ((kind, fn, owner): owner a callback, or the module for kind "module"),
    each call inside profiler.profile("[Callback]<state_key>.<event>") or "[LightningModule]<class>.<event>"."""
    return [profiled(profiler, module_action(owner, event) if kind == "module" else
                     strategy_action(owner, event) if kind == "strategy" else
                     f"[Callback]{owner.state_key}.{event}", fn) for kind, fn, owner in fns]


def profiled(profiler, name, fn):
    """`fn`, each call inside profiler.profile(name)."""
    def call(*args, **kwargs):
        with profiler.profile(name):
            return fn(*args, **kwargs)
    return call


def profiled_iter(iterable, profiler, name):
    """Iterate `iterable`, each next() inside profiler.profile(name)."""
    iterator = iter(iterable)
    while True:
        with profiler.profile(name):
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item
