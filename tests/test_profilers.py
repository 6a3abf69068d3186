"""Trainer(profiler=...): the simple, advanced and PyTorch profilers over the loop's actions and the hooks; a
trace TensorBoard's profiler plugin reads; nothing wrapped without a profiler."""
import glob
import json
import os

import pytest
import torch
from helpers import Linear, loader, quiet

from tasktrain import Callback, Trainer
from tasktrain.profilers import AdvancedProfiler, PassThroughProfiler, PyTorchProfiler, SimpleProfiler


class Hooked(Linear):
    def on_train_epoch_end(self):
        pass


class Counter(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        pass


def test_simple_profiler_times_the_loop_actions_and_the_overridden_hooks(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="perf")
    trainer = Trainer(max_epochs=2, profiler=profiler, callbacks=[Counter()], accumulate_grad_batches=2,
                      **quiet(enable_model_summary=False))
    trainer.fit(Hooked(), loader(32), loader(16))
    text = open(tmp_path / "fit-perf.txt").read()
    counts = {line.split("|")[1].strip(): int(line.split("|")[3]) for line in text.splitlines()
              if line.startswith("|") and "Action" not in line and "Total" not in line}
    # 2 epochs x 4 batches, a step every 2; validation: 2 batches per epoch, no sanity check
    strategy = "[Strategy]SingleDeviceStrategy"  # (Lightning's action names)
    assert counts[f"{strategy}.training_step"] == counts[f"{strategy}.backward"] == counts["run_training_batch"] == 8
    module = "[LightningModule]Hooked"
    assert counts[f"{module}.optimizer_step"] == counts[f"{module}.optimizer_zero_grad"] == 4
    assert counts["run_training_epoch"] == 2 and counts[f"{strategy}.validation_step"] == 4
    # 4 batches per epoch (a loader with a length is not read past its end)
    assert counts["[_TrainingEpochLoop].train_dataloader_next"] == 8
    assert counts["[LightningModule]Hooked.on_train_epoch_end"] == 2
    assert counts["[Callback]Counter.on_train_batch_end"] == 8
    assert "Percentage %" in text and text.startswith("FIT Profiler Report")


def test_simple_profiler_covers_test_and_predict_and_logs_without_a_filename(caplog):
    trainer = Trainer(profiler="simple", **quiet(enable_model_summary=False))
    with caplog.at_level("INFO", logger="tasktrain.profilers"):  # (Lightning's: logged at INFO, not printed)
        trainer.test(Linear(), loader(24))
        trainer.predict(Linear(), loader(16))
    out = caplog.text
    assert "TEST Profiler Report" in out and "PREDICT Profiler Report" in out
    assert "[Strategy]SingleDeviceStrategy.test_step" in out and "[Strategy]SingleDeviceStrategy.predict_step" in out
    assert "[_EvaluationLoop].test_next" in out and "[_PredictionLoop].predict_next" in out


def test_advanced_profiler_shows_the_functions_inside_each_action(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="adv", dump_stats=True)
    Trainer(max_epochs=1, profiler=profiler, **quiet(enable_model_summary=False)).fit(Linear(), loader(16))
    text = open(tmp_path / "fit-adv.txt").read()
    assert "Profile stats for: [Strategy]SingleDeviceStrategy.training_step" in text and "mse_loss" in text
    assert os.path.exists(tmp_path / "fit-adv-[Strategy]SingleDeviceStrategy.training_step.prof")  # (Lightning's name)


def test_pytorch_profiler_writes_a_trace_tensorboard_reads(tmp_path):
    # (schedule=None: the whole run; the default window is tested beside Lightning below)
    trainer = Trainer(max_epochs=1, profiler=PyTorchProfiler(filename="run", schedule=None),
                      default_root_dir=tmp_path, **quiet(enable_model_summary=False))
    trainer.fit(Linear(), loader(24))
    traces = glob.glob(str(tmp_path / "fit-run*.pt.trace.json"))
    assert len(traces) == 1
    with open(traces[0]) as f:
        events = json.load(f)["traceEvents"]
    names = [e.get("name", "") for e in events]
    assert names.count("[tasktrain][profile][Strategy]SingleDeviceStrategy.training_step") == 3
    assert names.count("[tasktrain][profile][Strategy]SingleDeviceStrategy.backward") == 3
    assert any(n.startswith("[tasktrain][module]torch.nn.modules.linear.Linear: layer") for n in names)
    # TensorBoard's PyTorch profiler plugin parses it into its views
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    data = RunProfileData.parse("fit-run", None, traces[0], str(tmp_path / "cache"))
    profile = RunGenerator("fit-run", None, data).generate_run_profile()
    assert {"overall", "operator", "trace"} <= {view.name for view in profile.views}
    # a checkpoint saved after the run does not start the torn-down profiler again (it would never be stopped)
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    assert trainer.profiler.profiler is None and os.path.exists(tmp_path / "after.ckpt")


def test_without_a_profiler_nothing_is_wrapped():
    trainer = Trainer(max_epochs=1, callbacks=[Counter()], **quiet(enable_model_summary=False))
    trainer.fit(Hooked(), loader(16))
    # trainer.profiler reads Lightning's PassThroughProfiler, but the loop does not call it: one shared no-op
    assert isinstance(trainer.profiler, PassThroughProfiler) and trainer._profiler is None
    assert trainer._profile("a") is trainer._profile("b")
    (hook,) = trainer._callback_hooks["on_train_batch_end"]
    assert hook.func.__self__.__class__ is Counter  # the callback's bound method itself, not a wrapper
    # the loop calls the strategy's methods themselves: replacing one shows it is called directly, once per batch
    calls = []
    trainer = Trainer(max_epochs=1, **quiet(enable_model_summary=False))
    original = trainer.strategy.training_step
    trainer.strategy.training_step = lambda *a: calls.append(a[1]) or original(*a)
    trainer.fit(Linear(), loader(16))
    assert calls == [0, 1]


def test_profiler_surface_as_lightnings(tmp_path):
    """What a script written for Lightning reads of the profilers, beside Lightning: `trainer.profiler` without a
    profiler is a PassThroughProfiler a module can profile with; an unknown name and a stop without a start are refused
    with Lightning's words; PyTorchProfiler keeps its dirpath as given, its function_events after the run, checks
    table_kwargs and passes them to the table; RegisterRecordFunction names each submodule's forward."""
    L = pytest.importorskip("lightning.pytorch")
    import pathlib
    import warnings

    import torch

    import tasktrain

    def case(lib):
        classes = __import__(f"{lib.__name__}.demos.boring_classes", fromlist=["x"])
        profilers = __import__(f"{lib.__name__}.profilers.pytorch", fromlist=["x"])
        got = {}

        class Model(classes.BoringModel):
            def training_step(self, batch, batch_idx):
                with self.trainer.profiler.profile("my_action"):  # (works without a profiler too)
                    return super().training_step(batch, batch_idx)

        quiet_ = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(max_steps=1, limit_val_batches=0, **quiet_)
            trainer.fit(Model())
            got["default"] = type(trainer.profiler).__name__
            try:
                lib.Trainer(profiler="unknown", **quiet_)
            except Exception as error:  # (MisconfigurationException: a ValueError in tasktrain, not in Lightning)
                got["unknown"] = str(error).split(" [")[0]
            simple = lib.profilers.SimpleProfiler()
            for call in (lambda: simple.stop("a"), lambda: simple.start("a") or simple.start("a")):
                with pytest.raises(ValueError) as error:
                    call()
                got.setdefault("simple", []).append(str(error.value))
            from unittest import mock

            for extended in (True, False):  # the table, cell for cell (the clock held still)
                table = lib.profilers.SimpleProfiler(extended=extended)
                table.setup("fit")
                with mock.patch("time.perf_counter", return_value=70.0):
                    table.start_time = 63.0
                    table.recorded_durations.update({"a": [0.5, 0.25], "on_a_long_action": [1.125], "b": [2.0]})
                    got.setdefault("simple_table", []).append(table.summary())
            for key in ("row_limit", "nonexistent"):
                with pytest.raises(KeyError) as error:
                    profilers.PyTorchProfiler(table_kwargs={key: 1})
                got.setdefault("table_kwargs", []).append(error.value.args[0].split(" Should")[0])
            dirpath = tmp_path / lib.__name__
            pytorch = profilers.PyTorchProfiler(dirpath=dirpath, filename="p", schedule=None)
            trainer = lib.Trainer(max_steps=2, limit_val_batches=0, profiler=pytorch, **quiet_)
            trainer.fit(Model())
            got["dirpath"] = pytorch.dirpath == dirpath and isinstance(pytorch.dirpath, pathlib.Path)
            # (the tag: "[pl]" under Lightning, "[tasktrain]" here: docs/lightning.md's renames)
            names = {event.name.replace("[pl][", "[tasktrain][") for event in pytorch.function_events}
            got["events"] = sorted(n for n in names if n.endswith(("my_action", "training_step")))
            widths = []
            for kwargs in ({"max_name_column_width": 5}, None):
                narrow = profilers.PyTorchProfiler(dirpath=dirpath, filename="w", schedule=None, table_kwargs=kwargs)
                with narrow.profile("a"):
                    torch.ones(1)
                widths.append(narrow.summary().count("-"))
            got["narrower"] = widths[0] < widths[1]
            layers = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ReLU())
            recording = profilers.PyTorchProfiler(dirpath=dirpath, filename="r", schedule=None)
            with recording.profile("a"), profilers.RegisterRecordFunction(layers):
                layers(torch.ones(1, 1))
            recording.summary()
            got["modules"] = sorted(event.name.replace("[pl][", "[tasktrain][") for event in recording.function_events
                                    if "[module]" in event.name)
        return got

    ours, theirs = case(tasktrain), case(L)
    assert ours == theirs
    assert ours["default"] == "PassThroughProfiler" and ours["narrower"] and ours["dirpath"]
    assert ours["simple_table"][0].startswith("FIT Profiler Report") and "Percentage %" in ours["simple_table"][0]
    assert ours["modules"] == ["[tasktrain][module]torch.nn.modules.activation.ReLU: 1",
                               "[tasktrain][module]torch.nn.modules.linear.Linear: 0"]
    assert ours["events"] == ["[tasktrain][profile][Strategy]SingleDeviceStrategy.training_step",
                              "[tasktrain][profile]my_action"]


def test_profiler_names():
    assert isinstance(Trainer(profiler="advanced", **quiet()).profiler, AdvancedProfiler)
    assert isinstance(Trainer(profiler="passthrough", **quiet()).profiler, PassThroughProfiler)
    with pytest.raises(ValueError, match="'simple', 'advanced', 'pytorch'"):
        Trainer(profiler="fast")
    with pytest.raises(ValueError, match="emit_nvtx"):
        PyTorchProfiler(emit_nvtx=True)


def test_each_hook_call_is_named_after_its_own_owner_with_a_bare_mock_and_a_monitor_among_the_callbacks():
    """Issue 37: a Mock(spec=Callback) receives every hook (as in Lightning) and the epoch-end order puts monitors
    (EarlyStopping, Checkpoint) last; neither may shift the profiler's names onto other callbacks."""
    from unittest.mock import Mock

    from tasktrain import EarlyStopping

    class Stack(PassThroughProfiler):
        def __init__(self):
            super().__init__()
            self.stack = []

        def start(self, action_name):
            self.stack.append(action_name)

        def stop(self, action_name):
            self.stack.pop()

    seen = []

    class Plain(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(("Plain", trainer.profiler.stack[-1]))

        def on_train_epoch_end(self, trainer, module):
            seen.append(("Plain", trainer.profiler.stack[-1]))

    class Stopper(EarlyStopping):  # a monitor listed before Plain: at the epoch end it runs after the module
        def on_train_epoch_end(self, trainer, module):
            seen.append(("Stopper", trainer.profiler.stack[-1]))

        def on_validation_end(self, trainer, module):
            pass

    class Module(Linear):
        def on_train_epoch_end(self):
            seen.append(("Module", self.trainer.profiler.stack[-1]))

    mock = Mock(spec=Callback)
    stopper, plain = Stopper(monitor="loss"), Plain()
    Trainer(max_epochs=1, limit_train_batches=1, profiler=Stack(), callbacks=[mock, stopper, plain],
            **quiet(enable_model_summary=False)).fit(Module(), loader(16))
    assert mock.on_train_batch_end.call_count == 1
    assert seen == [("Plain", f"[Callback]{plain.state_key}.on_train_batch_end"),
                    ("Plain", f"[Callback]{plain.state_key}.on_train_epoch_end"),
                    ("Module", "[LightningModule]Module.on_train_epoch_end"),
                    ("Stopper", f"[Callback]{stopper.state_key}.on_train_epoch_end")]


def test_simple_profiler_keeps_its_durations_after_the_run_as_lightning():
    """trainer.profiler.recorded_durations is readable after fit and a later test adds to it (it was cleared at the
    end of each run), as in Lightning."""
    L = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel as Theirs

    from tasktrain.demos.boring_classes import BoringModel as Ours

    seen = {}
    for lib, model in ((L, Theirs), (__import__("tasktrain"), Ours)):
        trainer = lib.Trainer(max_steps=2, limit_val_batches=0, limit_test_batches=1, profiler="simple", logger=False,
                              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(model())
        after_fit = trainer.profiler.recorded_durations
        fit_steps = len(after_fit.get("run_training_epoch", []))
        trainer.test(model(), verbose=False)
        seen[lib.__name__] = fit_steps, len(trainer.profiler.recorded_durations["run_training_epoch"]), any(
            "test_step" in k for k in trainer.profiler.recorded_durations)
    assert seen["tasktrain"] == seen["lightning.pytorch"] == (1, 1, True), seen


@pytest.mark.parametrize("model", ["BoringModel", "ManualOptimBoringModel"])
def test_the_actions_are_named_and_counted_as_lightnings(model):
    """Each action the Trainer times carries Lightning's name and is timed as often as under Lightning, for the same
    fit, validate, test and predict of the same module with a callback of one's own: the strategy's steps
    ("[Strategy]SingleDeviceStrategy.training_step", ...), the module's hooks ("[LightningModule]<class>.<hook>"), the
    loops' loader reads ("[_TrainingEpochLoop].train_dataloader_next", "[_EvaluationLoop].val_next", ...),
    "run_training_batch", a manual optimisation's "optimizer_step", and, as Lightning, every hook of the module and of
    each callback whether overridden or not, the batch transfer hooks inside the strategy's batch_to_device, and the
    strategy's own hooks (on_train_start, ...): the same names, each counted the same."""
    L = pytest.importorskip("lightning.pytorch")
    import tasktrain

    def actions(lib):
        classes = __import__(f"{lib.__name__}.demos.boring_classes", fromlist=["x"])

        class Counted(lib.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                pass

        class Model(getattr(classes, model)):
            def on_train_epoch_end(self):
                pass

        trainer = lib.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2,
                              limit_predict_batches=2, num_sanity_val_steps=1, profiler="simple",
                              callbacks=[Counted()], logger=False, enable_progress_bar=False,
                              enable_model_summary=False, enable_checkpointing=False)
        module = Model()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module)
            trainer.validate(module, verbose=False)
            trainer.test(module, verbose=False)
            trainer.predict(module)
        return {name: len(times) for name, times in trainer.profiler.recorded_durations.items()}

    ours, theirs = actions(tasktrain), actions(L)
    assert ours == theirs
    strategy = "[Strategy]SingleDeviceStrategy"
    assert ours[f"{strategy}.training_step"] == ours["run_training_batch"] == 6
    assert ours["[_TrainingEpochLoop].train_dataloader_next"] == 6
    (callback,) = [n for n in ours if n.startswith("[Callback]") and n.endswith("Counted.on_train_batch_end")]
    assert ours[callback] == 6
    assert ours["[_EvaluationLoop].val_next"] == ours[f"{strategy}.validation_step"] == 1 + 2 * 2 + 2
    assert ours["[_EvaluationLoop].test_next"] == ours["[_PredictionLoop].predict_next"] == 2
    assert ours["[LightningModule]Model.on_train_epoch_end"] == 2
    assert ours[f"[Callback]{callback[len('[Callback]'):-len('.on_train_batch_end')]}.on_before_backward"] == \
        6  # (not overridden: timed all the same)
    assert ours[f"{strategy}.batch_to_device"] == ours["[LightningModule]Model.transfer_batch_to_device"]
    if model == "BoringModel":
        assert ours[f"{strategy}.backward"] == ours["[LightningModule]Model.optimizer_step"] == 6
    else:
        assert ours["optimizer_step"] == 6


@pytest.mark.parametrize("stage, limits", [
    ("fit", dict(limit_train_batches=8, limit_val_batches=6, num_sanity_val_steps=2)),  # windows of both kinds
    ("fit", dict(limit_train_batches=4, limit_val_batches=6, num_sanity_val_steps=0)),  # too few training steps
    ("fit", dict(limit_train_batches=7, limit_val_batches=2)),  # too few validation steps, with the sanity check's
    ("test", dict(limit_test_batches=6)),
    ("predict", dict(limit_predict_batches=4)),
    ("fit", dict(limit_train_batches=3, limit_val_batches=0, schedule=None)),  # the whole run, as asked: no warning
    # a schedule of one's own, counted per kind of step as Lightning's (over all steps, validation's window would
    # fall elsewhere); too few steps for it is no reason to drop it
    ("fit", dict(limit_train_batches=7, limit_val_batches=5, num_sanity_val_steps=1, schedule="wait0-warm1-active2")),
    ("fit", dict(limit_train_batches=2, limit_val_batches=0, schedule="wait0-warm1-active2")),
])
def test_pytorch_profiler_default_schedule_as_lightnings(tmp_path, stage, limits):
    """PyTorchProfiler without a schedule (or with one's own, counted per kind of step) records Lightning's window (wait 1, warm up 1, record 3 steps of each kind),
    and where a run has fewer than 5 steps of a kind warns once and records the whole run: the same steps in the
    same trace files, the same function_events and the same warning as Lightning's, run beside it."""
    L = pytest.importorskip("lightning.pytorch")
    import collections
    import warnings

    import tasktrain

    limits = dict(limits)
    kwargs = {"schedule": limits.pop("schedule")} if "schedule" in limits else {}
    if kwargs.get("schedule") == "wait0-warm1-active2":
        kwargs["schedule"] = torch.profiler.schedule(wait=0, warmup=1, active=2)

    def steps(names, tag):  # each kind of step's count among the recorded ranges
        return dict(collections.Counter(n.split(".")[-1] for n in names if n.startswith(tag) and n.endswith("_step")
                                        and "[Strategy]" in n))

    def case(lib, tag):
        classes = __import__(f"{lib.__name__}.demos.boring_classes", fromlist=["x"])
        cache = __import__(f"{lib.__name__}.profilers.pytorch", fromlist=["x"]).warning_cache
        dirpath = tmp_path / lib.__name__
        profiler = __import__(f"{lib.__name__}.profilers", fromlist=["x"]).PyTorchProfiler(
            dirpath=dirpath, filename="p", **kwargs)
        trainer = lib.Trainer(max_epochs=1, profiler=profiler, logger=False, enable_progress_bar=False,
                              enable_model_summary=False, enable_checkpointing=False, **limits)
        cache.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            getattr(trainer, stage)(classes.BoringModel())
        cache.clear()
        traces = []
        for path in glob.glob(str(dirpath / "*.pt.trace.json")):
            with open(path) as f:
                traces.append(steps([e.get("name", "") for e in json.load(f)["traceEvents"]], tag))
        return {"traces": sorted(traces, key=repr), "events": steps([e.name for e in profiler.function_events], tag),
                "warned": sum("not enough steps to properly record traces" in str(w.message) for w in caught),
                "dropped": profiler._schedule is None}

    ours, theirs = case(tasktrain, "[tasktrain][profile]"), case(L, "[pl][profile]")
    assert ours == theirs
    assert ours["traces"]  # (each case writes a trace)
