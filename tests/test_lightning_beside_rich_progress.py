"""RichProgressBar beside Lightning 2.6's (a test-only dependency, never imported by the package): the same module,
loaders and bar configuration under both, each bar's console writing to a StringIO (no terminal, fixed width); what a
user reads from the bar and what it prints must be equal. Also Lightning's default rule (RichProgressBar /
RichModelSummary when rich is installed, else TQDMProgressBar / ModelSummary), both branches pinned by their probes."""
import contextlib
import dataclasses
import inspect
import io
import importlib.util
import re
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning.pytorch")
rich = pytest.importorskip("rich")

import tasktrain  # noqa: E402
from tasktrain.callbacks import progress  # noqa: E402
from tasktrain.callbacks.progress import rich_progress as our_rich_progress  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_rich_console():
    # both bars reconfigure rich's global console with their console_kwargs (Lightning's design): give the next test
    # the default console back, not one writing to this test's StringIO
    yield
    rich.reconfigure()


def _module(base):
    class Shown(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("shown", 0.25, prog_bar=True)
            self.log("as_tensor", torch.tensor(2.0), prog_bar=True)
            self.log("hidden", 0.5)
            return loss

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("val_shown", 1.5, prog_bar=True)

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("test_shown", 3.0)

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return batch[0]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Shown()


def _loader(n):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)


def _printed(text):
    """The bar's lines without what depends on the clock (elapsed, remaining, speed) or on padding."""
    text = re.sub(r"\d+:\d\d:\d\d", "T", text)
    text = re.sub(r"[\d.]+it/s", "Sit/s", text)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _task(bar, name):
    """A bar (a rich Task) as a user reads it, or the error when it is not drawn (the sanity check's bar is gone
    once leave=True restarted the display)."""
    try:
        task = getattr(bar, name)
    except AssertionError:
        return "AssertionError"
    return (task.description, task.completed, task.total, task.visible)


def _run(pkg, module_base, bar, tmp_path, **kwargs):
    """fit (2 validation loaders), test and predict under `pkg`; what the bar says after each, and what it printed."""
    out = bar._console_kwargs["file"]
    trainer = pkg.Trainer(max_epochs=2, callbacks=[bar], enable_checkpointing=False, enable_model_summary=False,
                          default_root_dir=str(tmp_path), logger=pkg.loggers.CSVLogger(str(tmp_path)),
                          num_sanity_val_steps=1, **kwargs)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.fit(_module(module_base), _loader(24), [_loader(8), _loader(12)])
        seen = {
            "train": _task(bar, "train_progress_bar"), "val": _task(bar, "val_progress_bar"),
            "sanity": _task(bar, "val_sanity_check_bar"),
            "metrics": list(bar.get_metrics(trainer, trainer.lightning_module).items()),
            "metrics_text": list(bar._metric_component._generate_metrics_texts()),
            "totals": (bar.total_train_batches, bar.total_val_batches),
            "flags": (bar.refresh_rate, bar.is_enabled, bar.is_disabled, bar._leave),
            "descriptions": (bar.train_description, bar.validation_description, bar.test_description,
                             bar.predict_description, bar.sanity_check_description),
            "ids": (bar.train_progress_bar_id, bar.val_progress_bar_id, bar.val_sanity_progress_bar_id),
        }
        seen["fit_printed"] = _printed(out.getvalue())
        out.seek(0), out.truncate()
        trainer.test(_module(module_base), [_loader(8), _loader(4)], verbose=False)
        seen["test"] = _task(bar, "test_progress_bar")
        trainer.predict(_module(module_base), _loader(12))
        seen["predict_id"] = bar.predict_progress_bar_id
        seen["printed"] = _printed(out.getvalue())
    return seen


@pytest.mark.parametrize("leave, val_check_interval", [(False, 1.0), (True, 1.0), (False, 0.5)])
def test_rich_progress_bar_says_and_prints_what_lightnings_does(tmp_path, leave, val_check_interval):
    seen = {}
    for name, pkg, base in (("ours", tasktrain, tasktrain.TaskModule), ("theirs", L, L.LightningModule)):
        theme = pkg.callbacks.progress.rich_progress.RichProgressBarTheme(metrics_format=".2f", description="bold")
        bar = pkg.callbacks.RichProgressBar(leave=leave, theme=theme,
                                            console_kwargs={"file": io.StringIO(), "force_terminal": False,
                                                            "width": 240})
        seen[name] = _run(pkg, base, bar, tmp_path / name, val_check_interval=val_check_interval)
    ours, theirs = seen["ours"], seen["theirs"]
    assert ours == theirs
    # what that is: the last epoch's bar with the metrics in the order logged, tensors as numbers
    # (Lightning's: a reused training bar loses the theme's description style; a new one, with leave, has it)
    assert ours["train"] == (f"{'[bold]' if leave else ''}Epoch 1/1 ", 6, 6, True)
    assert ours["val"][1:] == (3, 3, False)
    assert ours["sanity"] == ("AssertionError" if leave else ("[bold]Sanity Checking", 1, 1, False))
    assert ours["metrics_text"] == ["v_num: 0.00", "shown: 0.25", "as_tensor: 2.00", "val_shown/dataloader_idx_0: 1.50",
                                    "val_shown/dataloader_idx_1: 1.50"]
    epochs = [line for line in ours["fit_printed"] if line.startswith("Epoch")]
    assert [line.split(" ━")[0] for line in epochs] == (["Epoch 0/1", "Epoch 1/1"] if leave else ["Epoch 1/1"])
    assert "6/6 T • T Sit/s v_num: 0.00 shown: 0.25 as_tensor: 2.00" in epochs[-1]
    assert any(line.startswith("Testing ━") and "1/1" in line for line in ours["printed"])
    assert any(line.startswith("Predicting ━") and "3/3" in line for line in ours["printed"])


def test_rich_progress_bar_arguments_enabling_and_refusals_as_lightnings(monkeypatch):
    from lightning.pytorch.callbacks.progress import rich_progress as their_module
    from lightning.pytorch.utilities.exceptions import MisconfigurationException as TheirError

    from tasktrain.callbacks.progress import rich_progress as our_module
    from tasktrain.exceptions import MisconfigurationException

    def described(cls):
        return [(p.name, dataclasses.asdict(p.default) if dataclasses.is_dataclass(p.default) else p.default)
                for p in inspect.signature(cls).parameters.values()]

    assert described(our_module.RichProgressBar) == described(their_module.RichProgressBar)
    theirs = dataclasses.asdict(their_module.RichProgressBarTheme())
    assert dataclasses.asdict(our_module.RichProgressBarTheme()) == theirs
    for pkg, error in ((tasktrain, MisconfigurationException), (L, TheirError)):
        off = pkg.callbacks.RichProgressBar(refresh_rate=0)  # refresh_rate=0 draws nothing
        assert off.is_disabled and not off.is_enabled and off.refresh_rate == 0
        bar = pkg.callbacks.RichProgressBar()
        bar.disable()
        assert bar.is_disabled
        bar.enable()
        assert bar.is_enabled and bar.progress is None
        with pytest.raises(AssertionError):  # no bar before its loop runs
            bar.train_progress_bar
        with pytest.raises(error) as many:
            pkg.Trainer(callbacks=[pkg.callbacks.RichProgressBar(), pkg.callbacks.RichProgressBar()], logger=False)
        with pytest.raises(error) as disabled:
            pkg.Trainer(callbacks=[pkg.callbacks.RichProgressBar()], enable_progress_bar=False, logger=False)
        messages = [str(many.value), str(disabled.value)]
        screen = io.StringIO()  # a disabled bar draws nothing through a whole fit
        off = pkg.callbacks.RichProgressBar(refresh_rate=0, console_kwargs={"file": screen})
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trainer = pkg.Trainer(max_epochs=1, callbacks=[off], logger=False, enable_checkpointing=False,
                                  enable_model_summary=False)
            trainer.fit(_module(pkg.TaskModule if pkg is tasktrain else pkg.LightningModule), _loader(8))
        messages.append((screen.getvalue(), off.progress, off.train_progress_bar_id,
                         off.get_metrics(trainer, trainer.lightning_module)))
        if pkg is tasktrain:
            ours = messages
    assert ours == messages
    assert messages[2] == ("", None, None, {"shown": 0.25, "as_tensor": 2.0})
    # without rich: Lightning's ModuleNotFoundError at construction (the class itself still imports)
    monkeypatch.setattr(our_module, "_RICH_AVAILABLE", False)  # each module's own switch, as Lightning's
    monkeypatch.setattr(their_module, "_RICH_AVAILABLE", False)
    refused = []
    for cls in (our_module.RichProgressBar, their_module.RichProgressBar):
        with pytest.raises(ModuleNotFoundError) as missing:
            cls()
        refused.append(str(missing.value))
    assert refused[0] == refused[1]


@pytest.mark.parametrize("our_switch", ["callback_connector", "rich_available"])
def test_the_default_bar_and_summary_follow_lightnings_rule_in_both_branches(monkeypatch, our_switch):
    # Lightning's tests pin the branch by patching callback_connector._RICH_AVAILABLE: the same path, renamed, is
    # tasktrain's switch; tasktrain's own probe, progress.rich_available, still decides while the flag is unpatched
    from lightning.pytorch.trainer.connectors import callback_connector as theirs
    from tasktrain.trainer.connectors import callback_connector as ours

    assert bool(ours._RICH_AVAILABLE) is bool(theirs._RICH_AVAILABLE) is True  # rich is installed here
    for available in (True, False):
        if our_switch == "callback_connector":
            monkeypatch.setattr("tasktrain.trainer.connectors.callback_connector._RICH_AVAILABLE", available)
        else:
            monkeypatch.setattr(progress, "rich_available", lambda: available)
        monkeypatch.setattr(theirs, "_RICH_AVAILABLE", available)
        chosen = []
        for pkg in (tasktrain, L):
            trainer = pkg.Trainer(logger=False, enable_checkpointing=False)
            summaries = [type(c).__name__ for c in trainer.callbacks if isinstance(c, pkg.callbacks.ModelSummary)]
            chosen.append((type(trainer.progress_bar_callback).__name__, summaries))
        assert chosen[0] == chosen[1] == ([("RichProgressBar", ["RichModelSummary"]) if available else
                                           ("TQDMProgressBar", ["ModelSummary"])][0]), available


def test_rich_bar_draws_on_rank_zero_only_and_rich_is_imported_only_when_used(monkeypatch, capsys):
    out = io.StringIO()
    monkeypatch.setattr(tasktrain.Trainer, "is_global_zero", property(lambda self: False))
    bar = tasktrain.RichProgressBar(console_kwargs={"file": out})
    tasktrain.Trainer(max_epochs=1, callbacks=[bar], logger=False, enable_checkpointing=False,
                      enable_model_summary=False).fit(_module(tasktrain.TaskModule), _loader(8))
    assert bar.is_disabled and bar.progress is None and out.getvalue() == ""

    # rich_progress.py run afresh with rich unimportable (a fresh copy: the loaded module stays as it is), then a bar
    # and the default rule: none of it imports rich (rich_columns.py, which does, loads when a bar draws)
    class NoRich:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "rich":
                raise AssertionError(f"{name} imported")

    with monkeypatch.context() as patch:  # rich's modules back at the block's end
        for name in [name for name in sys.modules if name.split(".")[0] == "rich"]:
            patch.delitem(sys.modules, name)
        patch.setattr(sys, "meta_path", [NoRich(), *sys.meta_path])
        spec = importlib.util.spec_from_file_location("fresh_rich_progress", our_rich_progress.__file__)
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        fresh.RichProgressBar(theme=fresh.RichProgressBarTheme(), console_kwargs={"width": 80})
        assert type(progress.default_progress_bar()).__name__ == "RichProgressBar"
        assert not [name for name in sys.modules if name.split(".")[0] == "rich"]


class _Stream(torch.utils.data.IterableDataset):  # no length: the bar's total is inf ("--", a pulsing bar)
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        return iter([(torch.randn(4, generator=g), torch.randn(1, generator=g)) for _ in range(12)])


def test_rich_bar_of_a_loader_without_a_length_as_lightnings():
    seen = []
    for pkg, base in ((tasktrain, tasktrain.TaskModule), (L, L.LightningModule)):
        screen = io.StringIO()
        bar = pkg.callbacks.RichProgressBar(console_kwargs={"file": screen, "width": 200})
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trainer = pkg.Trainer(max_epochs=1, max_steps=3, callbacks=[bar], logger=False,
                                  enable_checkpointing=False, enable_model_summary=False)
            trainer.fit(_module(base), DataLoader(_Stream(), batch_size=4))
        seen.append((_task(bar, "train_progress_bar"), type(bar.train_progress_bar).__name__,
                     bar.train_progress_bar.time_remaining, _printed(screen.getvalue())))
    assert seen[0] == seen[1]
    assert seen[0][0] == ("Epoch 0/0 ", 3, float("inf"), True) and seen[0][1] == "CustomInfiniteTask"
    assert "3/-- T • -:--:-- Sit/s shown: 0.250" in seen[0][3][0]



def _recorded_rich_calls(monkeypatch):
    """Every call the bars make on rich's Progress (both frameworks' displays subclass it): (method, arguments)."""
    calls = []
    for name in ("update", "reset", "stop", "refresh"):
        original = getattr(rich.progress.Progress, name)

        def recording(self, *args, _name=name, _original=original, **kwargs):
            calls.append((_name, args, tuple(sorted(kwargs.items()))))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(rich.progress.Progress, name, recording)
    return calls


def _counting_bar(pkg):
    class Counting(pkg.callbacks.RichProgressBar):
        """Records each get_metrics call as Lightning's own test does: (stage, epoch, step, metrics)."""

        def __init__(self, **kwargs):
            super().__init__(console_kwargs={"file": io.StringIO(), "width": 200}, **kwargs)
            self.metric_calls = []

        def get_metrics(self, trainer, module):
            items = super().get_metrics(trainer, module)
            self.metric_calls.append((trainer.state.stage, trainer.current_epoch, trainer.global_step, items))
            return items

    return Counting


def test_rich_bar_reads_metrics_each_batch_and_drives_rich_as_lightnings(monkeypatch):
    """get_metrics is called at every training batch, each validation end and epoch end (what a get_metrics override
    sees), and the display gets the same update / reset / stop / refresh calls, for leave False and True, a
    validation loader and refresh_rate=0 (no call at all); the display redraws from a thread of refresh_rate."""
    seen = {}
    for name, pkg, base in (("ours", tasktrain, tasktrain.TaskModule), ("theirs", L, L.LightningModule)):
        runs = []
        for kwargs in ({}, {"leave": True}, {"refresh_rate": 0}):
            with monkeypatch.context() as patch:
                calls = _recorded_rich_calls(patch)
                bar = _counting_bar(pkg)(**kwargs)
                threads = []
                started = pkg.Callback()
                started.on_train_start = lambda trainer, module: threads.append(
                    (type(bar.progress.live._refresh_thread).__name__ != "NoneType",
                     bar.progress.live._refresh_thread.refresh_per_second,
                     bar.progress.live._refresh_thread.is_alive()) if bar.progress else None)
                trainer = pkg.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2,
                                      num_sanity_val_steps=1, callbacks=[bar, started], logger=False,
                                      enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1)
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    trainer.fit(_module(base), _loader(12), _loader(8))
                thread_after = bar.progress.live._refresh_thread if bar.progress else None
                runs.append((bar.metric_calls, calls, threads, thread_after))
        seen[name] = runs
    assert seen["ours"] == seen["theirs"]
    metric_calls, calls, threads, after = seen["ours"][0]
    stages = [call[0] for call in metric_calls]
    # per epoch: 3 training batches, validation end, training epoch end; the sanity check's validation end first
    assert stages == ["sanity_check"] + (["train"] * 3 + ["validate", "train"]) * 2
    assert [call[2] for call in metric_calls if call[0] == "train"] == [1, 2, 3, 3, 4, 5, 6, 6]
    assert metric_calls[0][3] == {"val_shown": 1.5} and metric_calls[1][3] == {"shown": 0.25, "as_tensor": 2.0}
    assert metric_calls[4][3] == {"shown": 0.25, "as_tensor": 2.0, "val_shown": 1.5}
    # per epoch 3 + 2 batches and the validation bar hidden at its end; the sanity batch and its hide; epoch 1's new
    # validation bar hides epoch 0's
    assert [c[0] for c in calls].count("update") == 2 * (3 + 2 + 1) + 2 + 1
    assert [c[0] for c in calls].count("reset") == 1 and [c[0] for c in calls].count("stop") == 1
    assert threads == [(True, 100, True)] and after is None  # redrawn by a thread of 100/s, gone once stopped
    assert [c[0] for c in seen["ours"][1][1]].count("reset") == 0  # leave=True: a new display per epoch
    assert [c[0] for c in seen["ours"][1][1]].count("stop") == 2
    assert seen["ours"][2][1] == [] and seen["ours"][2][0] == []  # refresh_rate=0: rich untouched, no metrics read


def test_rich_bar_names_theme_and_interrupt_as_lightnings(monkeypatch):
    """Lightning's module attributes are there (rich's Progress, the column classes) and the bar builds its display
    from them, so patching them takes effect as in Lightning's; the theme's styles reach the columns; a
    KeyboardInterrupt stops the display once (SystemExit, as Lightning)."""
    from unittest import mock

    from lightning.pytorch.callbacks.progress import rich_progress as their_module

    columns = ("CustomBarColumn", "BatchesProcessedColumn", "CustomTimeColumn", "ProcessingSpeedColumn")
    seen = []
    for pkg, module in ((tasktrain, our_rich_progress), (L, their_module)):
        assert module.Progress is rich.progress.Progress
        assert issubclass(module.CustomProgress, rich.progress.Progress)
        theme = module.RichProgressBarTheme(progress_bar="red", progress_bar_finished="green", batch_progress="blue",
                                            time="bold", processing_speed="italic", progress_bar_pulse="cyan")
        with mock.patch.multiple(module, **{name: mock.DEFAULT for name in columns}) as mocks:
            bar = module.RichProgressBar(theme=theme, console_kwargs={"file": io.StringIO()})
            bar.on_train_start(pkg.Trainer(logger=False), _module(tasktrain.TaskModule if pkg is tasktrain
                                                                   else L.LightningModule))
            styles = {name: mocks[name].call_args.kwargs for name in columns}
            bar.progress.columns = (rich.progress.TextColumn(""),)  # the mocks cannot draw the display's last state
            bar.teardown(None, None, "fit")
        with mock.patch.object(module, "CustomProgress") as display:  # a disabled bar never builds a display
            off = module.RichProgressBar(console_kwargs={"file": io.StringIO()})
            off.disable()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                pkg.Trainer(max_epochs=1, callbacks=[off], logger=False, enable_checkpointing=False,
                            enable_model_summary=False).fit(_module(tasktrain.TaskModule if pkg is tasktrain
                                                                    else L.LightningModule), _loader(8))
            built = display.call_count

        class Interrupted(type(_module(tasktrain.TaskModule if pkg is tasktrain else L.LightningModule))):
            def on_train_start(self):
                raise KeyboardInterrupt

        with monkeypatch.context() as patch:
            calls = _recorded_rich_calls(patch)
            with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                pkg.Trainer(fast_dev_run=True, logger=False, callbacks=[
                    module.RichProgressBar(console_kwargs={"file": io.StringIO()})]).fit(Interrupted(), _loader(8))
        seen.append((styles, built, [c[0] for c in calls if c[0] == "stop"]))
    assert seen[0] == seen[1]
    assert seen[0][0]["CustomBarColumn"] == {"complete_style": "red", "finished_style": "green", "pulse_style": "cyan"}
    assert seen[0][0]["BatchesProcessedColumn"] == {"style": "blue"} and seen[0][1:] == (0, ["stop"])
