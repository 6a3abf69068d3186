"""The Strategy contract (tasktrain/strategies/base.py) and what stands on it: the plan a strategy is handed, the
precision it owns, the shared runtime set-up, the public trainer API callbacks use, per-run state, and the loop's
accumulation windows. The layering rules themselves are checked on the source: they are what keeps a new engine
(FSDP) from needing special cases."""
import ast
import os
import re
import sys
import threading

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from helpers import Linear, loader, quiet, regression_data
from tasktrain import DDP, Accelerator, Callback, DeepSpeed, GradientClipping, SingleDevice, Strategy, Trainer
from tasktrain.strategies.base import ClipsInsideStep, GradientClip, OneProcess, Plan
from tasktrain.strategies.deepspeed import DeepSpeedPrecision
from tasktrain.strategies.precision import MixedPrecision

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasktrain")


# -- layering, read from the source -------------------------------------------------------------------------------
def _sources(*parts):
    top = os.path.join(ROOT, *parts)
    for directory, _, files in os.walk(top):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as f:
                    yield os.path.relpath(path, ROOT), f.read()


def test_no_strategy_probes_or_name_tests_outside_the_strategies():
    probes = re.compile(r"(getattr|hasattr)\([^)]*strateg|_is_deepspeed|_is_engine|start_method|DeepSpeedEngine|"
                        r"strateg\w*(\.name)?\s*(==|!=|\.startswith\(|\bin\b)\s*[\"'(]|"
                        r"[\"'](deepspeed|ddp|dp|single_device)\w*[\"']\s*(==|!=|\bin\b)")
    found = [f"{path}: {line.strip()}" for path, text in _sources() if not path.startswith("strategies")
             and path != "names.py" for line in text.splitlines() if probes.search(line)]
    assert not found, found


def test_strategies_are_not_tested_by_their_class_or_by_retired_capability_attributes_outside_the_strategies():
    # A concrete class in an isinstance test is a name test in disguise; the capability attributes became classes.
    probes = re.compile(r"isinstance\([^)]*,\s*\(?(DDP|DeepSpeed|FSDP|SingleDevice|DataParallel)\b|"
                        r"strateg\w*\.(is_distributed|clips_inside_step|distributed_type|last_grad_norm)\b(?!\()")
    found = [f"{path}: {line.strip()}" for path, text in _sources() if not path.startswith("strategies")
             for line in text.splitlines() if probes.search(line)]
    assert not found, found


def _capabilities():
    from tasktrain.strategies.base import ClipsInsideStep, MultiProcess, Sharded

    return (MultiProcess, Sharded, ClipsInsideStep)


def test_what_a_capability_adds_is_called_only_where_the_capability_is_tested():
    """A method only a capability has (module_init_context, last_grad_norm, ...) is not on the core: a file that calls
    it outside the strategies tests isinstance(..., <that capability>)."""
    from tasktrain.strategies.base import Strategy

    owner = {name: cap for cap in _capabilities() for name in cap.__abstractmethods__}
    assert owner and not set(owner) & set(dir(Strategy))  # added by the capabilities, absent from the core
    found = []
    for path, text in _sources():
        if path.startswith("strategies"):
            continue
        tested = {node.args[1].id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2
                  and isinstance(node.args[1], ast.Name)}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in owner:
                receiver = ast.unparse(node.func.value)
                if "strateg" in receiver and owner[node.func.attr].__name__ not in tested:
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node)} without isinstance(..., "
                                 f"{owner[node.func.attr].__name__})")
    assert not found, found


def _builtin_strategies():
    """Every concrete Strategy class defined in tasktrain/strategies/, found by reading the modules."""
    import importlib
    import inspect

    from tasktrain.strategies.base import Strategy

    classes = set()
    for path, _ in _sources("strategies"):
        module = importlib.import_module("tasktrain." + path[:-3].replace(os.sep, "."))
        classes |= {cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, Strategy) and cls.__module__ == module.__name__}
    return classes


def test_every_builtin_strategy_implements_the_core_and_the_capabilities_it_declares():
    import inspect

    from tasktrain.strategies.base import OneProcess, Strategy
    from tasktrain.strategies.data_parallel import DataParallel
    from tasktrain.strategies.ddp import DDPStrategy
    from tasktrain.strategies.fsdp import FSDP
    from tasktrain.strategies.lightning import DeepSpeedStrategy, FSDPStrategy
    from tasktrain.strategies.model_parallel import ModelParallelStrategy
    from tasktrain.strategies.parallel import ParallelStrategy
    from tasktrain.strategies.single_device import SingleDeviceStrategy

    assert inspect.isabstract(Strategy) and {"reduce", "broadcast", "barrier", "world_size", "global_rank"} <= \
        Strategy.__abstractmethods__
    # Lightning's ParallelStrategy, the base of the multi-process engines, is abstract as Lightning's is: a concrete
    # one says how the module is wrapped for its processes
    assert inspect.isabstract(ParallelStrategy) and ParallelStrategy.__abstractmethods__ == {
        "setup_module_and_optimizers"}
    abstract = {Strategy, ParallelStrategy}
    classes = _builtin_strategies()
    assert classes == {Strategy, ParallelStrategy, SingleDevice, DataParallel, DDP, FSDP, DeepSpeed,
                       ModelParallelStrategy, DeepSpeedStrategy, FSDPStrategy, DDPStrategy, SingleDeviceStrategy}, classes
    has = {cls.__name__: tuple(cap.__name__ for cap in (OneProcess, *_capabilities()) if issubclass(cls, cap))
           for cls in classes - abstract}
    assert has == {"SingleDevice": ("OneProcess",), "DataParallel": ("OneProcess",), "DDP": ("MultiProcess",),
                   "FSDP": ("MultiProcess", "Sharded"), "ModelParallelStrategy": ("MultiProcess", "Sharded"),
                   "DeepSpeed": ("MultiProcess", "Sharded", "ClipsInsideStep"),
                   # Lightning's names (strategies/lightning.py, ddp.py, single_device.py)
                   "FSDPStrategy": ("MultiProcess", "Sharded"), "DDPStrategy": ("MultiProcess",),
                   "SingleDeviceStrategy": ("OneProcess",),
                   "DeepSpeedStrategy": ("MultiProcess", "Sharded", "ClipsInsideStep")}
    for cls in classes - abstract:
        assert not inspect.isabstract(cls), (cls, cls.__abstractmethods__)
        cls()  # each can be built with its defaults
    # A world is one process's or several's, never both nor neither; several processes' is a ParallelStrategy.
    for cls in classes - {Strategy}:
        assert issubclass(cls, OneProcess) != issubclass(cls, _capabilities()[0]), cls
        assert issubclass(cls, ParallelStrategy) == issubclass(cls, _capabilities()[0]), cls


def test_a_strategy_missing_its_world_or_a_capabilitys_method_cannot_be_created():
    from tasktrain.strategies.base import ClipsInsideStep, OneProcess, Sharded

    class NoWorld(Strategy):
        pass

    class NoNorm(ClipsInsideStep, OneProcess, Strategy):
        pass

    class NoInit(Sharded, DDP):
        pass

    for cls, missing in ((NoWorld, "reduce"), (NoNorm, "last_grad_norm"), (NoInit, "module_init_context")):
        with pytest.raises(TypeError, match=f"abstract.*{missing}"):
            cls()


def test_a_retired_capability_attribute_is_refused_when_the_class_is_defined():
    for attribute, instead in (("clips_inside_step", "ClipsInsideStep"), ("is_distributed", "MultiProcess"),
                               ("distributed_type", "distributed_type_of")):
        with pytest.raises(TypeError, match=f"Mine.{attribute}: .*{instead}"):
            type("Mine", (SingleDevice,), {attribute: True})


def test_accelerates_distributed_type_is_read_from_the_capabilities_as_the_launchers_table_names_it():
    from tasktrain.names import STRATEGIES
    from tasktrain.state import PartialState, distributed_type_of
    from tasktrain.strategies.registry import strategy_from_name

    for name, entry in STRATEGIES.items():
        extra = {"nvme_path": "/tmp"} if entry.kwargs.get("offload_device") == "nvme" else {}  # no name holds a folder
        assert distributed_type_of(strategy_from_name(name, **extra)) == entry.distributed_type, name
    # a strategy of one's own: one process is NO, whatever it clips
    from tasktrain.strategies.base import ClipsInsideStep

    class Own(ClipsInsideStep, SingleDevice):
        def last_grad_norm(self):
            return None

    assert distributed_type_of(Own()) == "NO"
    # DDP on CPUs is MULTI_CPU for Accelerate (the state reads the device)
    strategy = DDP(accelerator="cpu")
    assert str(PartialState._of(strategy).distributed_type) in ("MULTI_CPU", "DistributedType.MULTI_CPU")


def test_strategies_import_neither_the_trainer_nor_the_callbacks():
    found = []
    for path, text in _sources("strategies"):
        for node in ast.walk(ast.parse(text)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path}: {n}" for n in names if n.startswith(("tasktrain.trainer", "tasktrain.callbacks"))]
    assert not found, found


def test_callbacks_use_only_the_public_trainer_api():
    found = [f"{path}: {line.strip()}" for path, text in _sources("callbacks") for line in text.splitlines()
             if re.search(r"\btrainer\._", line)]
    assert not found, found


# -- the plan ----------------------------------------------------------------------------------------------------
class Recording(SingleDevice):
    """The contract's defaults, recording what the loop hands over."""

    def __init__(self, wants_micro_batch_size=True, **kwargs):
        super().__init__(**kwargs)
        self.plans, self.clip_calls = [], []
        self.wants_micro_batch_size = wants_micro_batch_size

    def needs_micro_batch_size(self):
        return self.wants_micro_batch_size

    def setup_module_and_optimizers(self, module, optimizers, plan):
        self.plans.append(plan)
        return super().setup_module_and_optimizers(module, optimizers, plan)

    def clip_gradients(self, optimizer, max_norm=None, max_value=None, norm_type=2.0, unscale=True):
        self.clip_calls.append((max_norm, max_value, norm_type))
        return super().clip_gradients(optimizer, max_norm, max_value, norm_type, unscale)


def test_the_trainer_tells_the_strategy_its_plan():
    strategy = Recording()
    trainer = Trainer(strategy=strategy, max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=0.5,
                      callbacks=[GradientClipping(max_value=3.0)], **quiet())
    trainer.fit(Linear(), loader(n=32, batch_size=8))
    trainer.validate(Linear(), loader())
    fit, validate = strategy.plans
    assert (fit.training, fit.calls_steps, fit.micro_batch_size, fit.accumulate_grad_batches) == (True, True, 8, 2)
    assert fit.loss_divided_by_window and fit.automatic_optimization and not fit.has_lr_schedulers
    assert set(fit.clipping) == {GradientClip(0.5, "norm", 2.0, "GradientClipping(max_norm=0.5)"),
                                 GradientClip(3.0, "value", 2.0, "GradientClipping(max_value=3.0)")}
    # ... and the clipping callbacks ask for exactly that at each of the 2 optimizer steps
    assert sorted(strategy.clip_calls, key=str) == sorted([(None, 3.0, 2.0), (0.5, None, 2.0)] * 2, key=str)
    assert not validate.training and validate.calls_steps and validate.clipping == ()
    # a strategy that does not read the micro-batch size is set up before the training loader is requested (Lightning's
    # order: train_dataloader when training starts); its Plan says the size is not known
    strategy = Recording(wants_micro_batch_size=False)
    Trainer(strategy=strategy, max_steps=1, **quiet()).fit(Linear(), loader(n=32, batch_size=8))
    assert strategy.plans[0].micro_batch_size is None


def test_the_accelerator_tells_the_strategy_its_plan():
    strategy = Recording()
    accelerator = Accelerator(strategy=strategy, gradient_accumulation_steps=3)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, prepared_optimizer, _ = accelerator.prepare(model, optimizer, loader(batch_size=4))
    (plan,) = strategy.plans
    assert (plan.calls_steps, plan.micro_batch_size, plan.accumulate_grad_batches) == (False, 4, 3)
    assert plan.loss_divided_by_window and plan.clipping == ()
    assert accelerator.unwrap_model(prepared) is model and prepared_optimizer.optimizer is optimizer
    # an optimizer prepared on its own, after its model, goes through setup_optimizer
    other = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.2))
    assert other.optimizer.defaults["lr"] == 0.2 and len(strategy.plans) == 1


def test_a_launch_configs_clipping_reaches_the_accelerators_plan(monkeypatch):
    monkeypatch.setenv("TASKTRAIN_LAUNCH", "1")
    monkeypatch.setenv("TASKTRAIN_GRADIENT_CLIPPING", "0.25")
    strategy = Recording()
    accelerator = Accelerator(strategy=strategy)
    accelerator.prepare(torch.nn.Linear(4, 1))
    assert strategy.plans[0].clipping == (GradientClip(0.25, "norm", 2.0, "the launch config's gradient_clipping"),)


def test_deepspeed_reads_its_clipping_from_the_plan_and_refuses_what_it_cannot_do():
    from tasktrain.strategies.deepspeed import _clip_norm_of

    assert _clip_norm_of(()) is None
    assert _clip_norm_of((GradientClip(0.5, "norm", 2.0, "Trainer(gradient_clip_val=0.5)"),)) == 0.5
    with pytest.raises(ValueError, match=r"by norm only \(GradientClipping\(max_value=1.0\)\)"):
        _clip_norm_of((GradientClip(1.0, "value", 2.0, "GradientClipping(max_value=1.0)"),))
    with pytest.raises(ValueError, match="2-norm"):
        _clip_norm_of((GradientClip(1.0, "norm", 3.0, "GradientClipping(max_norm=1.0)"),))
    with pytest.raises(ValueError, match="2 gradient clippings .*: DeepSpeed clips once"):
        _clip_norm_of((GradientClip(1.0), GradientClip(2.0)))


# -- precision: owned by the strategy ------------------------------------------------------------------------------
def test_a_strategys_own_precision_is_kept_or_a_clear_conflict(monkeypatch):
    trainer = Trainer(strategy=SingleDevice(precision="bf16"), **quiet())
    assert trainer.precision == "bf16-mixed" and isinstance(trainer.strategy.precision, MixedPrecision)
    assert Trainer(strategy=DDP(precision="bf16-mixed"), precision="bf16", **quiet()).precision == "bf16-mixed"
    with pytest.raises(ValueError, match=r"DDP\(precision='bf16-mixed'\) and the run's precision '64-true' disagree"):
        Trainer(strategy=DDP(precision="bf16-mixed"), precision=64, **quiet())
    with pytest.raises(ValueError, match="Precision 'fp8' is invalid"):
        SingleDevice(precision="fp8")
    # a launch config's precision fills the Trainer's, but the strategy's own is explicit: it wins, with a warning
    monkeypatch.setenv("TASKTRAIN_LAUNCH", "1")
    monkeypatch.setenv("TASKTRAIN_PRECISION", "64-true")
    with pytest.warns(UserWarning, match=r"SingleDevice\(precision='bf16-mixed'\) overrides precision='64-true'"):
        assert Trainer(strategy=SingleDevice(precision="bf16-mixed"), **quiet()).precision == "bf16-mixed"
    assert Trainer(strategy=SingleDevice(), **quiet()).precision == "64-true"


def test_a_precision_plugin_given_to_the_strategy_is_the_one_used():
    plugin = MixedPrecision("bf16-mixed", "cpu")
    module = Linear()
    trainer = Trainer(strategy=SingleDevice(precision=plugin), max_epochs=1, **quiet())
    trainer.fit(module, loader())
    assert trainer.strategy.precision is plugin and trainer.precision == "bf16-mixed"


def test_deepspeed_owns_its_precision_through_a_plugin_that_forwards_to_the_engine():
    strategy = DeepSpeed(stage=2)
    strategy.configure("cpu", 1, 1, "bf16-mixed")
    plugin = strategy.precision
    assert isinstance(plugin, DeepSpeedPrecision) and plugin.name == "bf16-mixed"
    assert not hasattr(plugin, "scaler")  # no GradScaler is built beside DeepSpeed's own loss scaling
    assert isinstance(strategy, ClipsInsideStep)

    class Engine:  # what the plugin asks of DeepSpeed's engine
        def __init__(self):
            self.steps, self.applied = 0, [True, False, True]

        def step(self):
            self.steps += 1

        def was_step_applied(self):
            return self.applied[self.steps - 1]

    engine = Engine()
    plugin.attach(engine, torch.bfloat16)
    assert [plugin.optimizer_step(None) for _ in range(3)] == [True, False, True] and plugin.skipped_steps == 1
    batch = plugin.convert_input((torch.ones(2), torch.ones(2, dtype=torch.long)))
    assert (batch[0].dtype, batch[1].dtype) == (torch.bfloat16, torch.long)
    plugin.detach()
    assert plugin.engine is None and plugin.skipped_steps == 1  # the count outlives the engine
    with pytest.raises(ValueError, match="disagree"):  # a plugin of the strategy's own, against the run's
        DeepSpeed(precision="bf16-mixed").configure("cpu", 1, 1, "32-true")


# -- the runtime, shared by the Trainer and the Accelerator ---------------------------------------------------------
def test_a_one_process_strategy_under_a_multi_process_launcher_is_an_error_for_both(monkeypatch):
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2"),
                       ("TORCHELASTIC_RUN_ID", "x")):  # (torchrun's: the Trainer, as Lightning's, needs it)
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match="started 2 processes, but strategy 'single_device'"):
        Trainer(strategy="single_device", **quiet())
    with pytest.raises(ValueError, match="started 2 processes, but strategy 'single_device'"):
        Accelerator(strategy="single_device")


def test_accumulation_is_checked_alike():
    for bad in (0, -1, 2.5, "2", True):
        with pytest.raises(ValueError, match="accumulate_grad_batches=.*positive integer"):
            Trainer(accumulate_grad_batches=bad, **quiet())
        with pytest.raises(ValueError, match="gradient_accumulation_steps=.*positive integer"):
            Accelerator(gradient_accumulation_steps=bad)


# -- the public trainer API callbacks use, and per-run state ---------------------------------------------------------
def test_the_public_trainer_api_callbacks_read():
    seen = {}

    class Read(Callback):
        def on_train_start(self, trainer, module):
            seen["fit"] = (trainer.enable_validation, trainer.num_training_batches, trainer.num_val_batches,
                           trainer.num_sanity_val_batches)
            trainer.log_to_loggers({"custom": torch.tensor(2.5)})

        def on_test_start(self, trainer, module):
            seen["test"] = (trainer.enable_validation, trainer.num_test_batches, trainer.num_val_batches)

    from tasktrain import Logger

    class Collect(Logger):
        def __init__(self):
            self.rows = []

        def log_metrics(self, metrics, step):
            self.rows.append((step, metrics))

    logger = Collect()
    trainer = Trainer(max_epochs=1, callbacks=[Read()], logger=logger, enable_progress_bar=False,
                      enable_checkpointing=False, num_sanity_val_steps=1, limit_val_batches=3)
    trainer.fit(Linear(), loader(n=32), loader(n=40))
    logged_in_fit = dict(trainer.logged_metrics)  # (each run starts logged_metrics afresh, as Lightning's)
    trainer.test(Linear(), loader(n=16))
    assert seen["fit"] == (True, 4, [3], [1])
    assert seen["test"] == (False, [2], [3])  # num_val_batches: the fit's, kept (Lightning's; beside_attributes)
    assert (0, {"custom": 2.5, "epoch": 0.0}) in logger.rows and logged_in_fit["custom"] == 2.5
    Trainer(max_epochs=1, callbacks=[Read()], **quiet(logger=logger)).fit(Linear(), loader())
    assert seen["fit"][:3] == (False, 4, [])


def test_a_resumed_fit_and_the_next_one_each_run_the_sanity_check(tmp_path):
    """A resumed fit runs the sanity check (Lightning 2.6's rule), and so does the next fit of the same Trainer."""
    checks = []

    class Count(Callback):
        def on_sanity_check_start(self, trainer, module):
            checks.append(trainer.global_step)

    first = Trainer(max_epochs=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                    num_sanity_val_steps=1)
    first.fit(Linear(), loader(), loader())
    path = first.checkpoint_callback.best_model_path
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, callbacks=[Count()], logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=1)
    trainer.fit(Linear(), loader(), loader(), ckpt_path=path)
    assert checks == [4]  # (global_step is the restored one when it starts)
    trainer.fit(Linear(), loader(), loader())  # max_epochs reached: trains nothing, but checks (Lightning's)
    assert checks == [4, 8]  # (the next fit goes on from the counters the last one reached, as Lightning's)


# -- the loop: windows of micro-batches ------------------------------------------------------------------------------
class Batches(IterableDataset):
    """An iterable (no length) over the 5 batches of regression_data(40)."""

    def __iter__(self):
        data = regression_data(40)
        for b in range(5):
            yield data[b * 8:(b + 1) * 8]


def test_a_loader_without_length_ends_its_last_window_on_its_last_batch():
    # windows [0,1], [2,3], [4]: no length, so each loss is divided by the configured window (2); the last window
    # is cut short by the loader's end and steps at its last batch, like every other window (before its
    # on_train_batch_end, and told to the strategy: no_backward_sync(False) there).
    module = Linear(lr=0.05)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(module.layer.state_dict())
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    data = regression_data(40)
    for window in ([0, 1], [2, 3], [4]):
        for b in window:
            x, y = data[b * 8:(b + 1) * 8]
            (torch.nn.functional.mse_loss(reference(x), y) / 2).backward()
        opt.step()
        opt.zero_grad()

    class Syncs(SingleDevice):
        def __init__(self):
            super().__init__()
            self.skipped = []

        def no_backward_sync(self, enabled, model=None):
            self.skipped.append(enabled)
            return super().no_backward_sync(enabled, model)

    steps_at_batch_end = []

    class Steps(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            steps_at_batch_end.append(trainer.global_step)

    strategy = Syncs()
    trainer = Trainer(strategy=strategy, max_steps=3, accumulate_grad_batches=2, callbacks=[Steps()], **quiet())
    trainer.fit(module, DataLoader(Batches(), batch_size=None))
    assert strategy.skipped == [True, False, True, False, False]
    assert steps_at_batch_end == [0, 1, 1, 2, 3]
    torch.testing.assert_close(module.layer.weight, reference.weight)
    torch.testing.assert_close(module.layer.bias, reference.bias)


# -- metrics logged from several threads (DataParallel's steps) -----------------------------------------------------
def test_self_log_from_threads_is_serialised_when_the_strategy_says_its_steps_run_in_threads():
    from tasktrain.trainer.metrics import MetricStore

    class Threads(OneProcess, Strategy):
        runs_steps_in_threads = True

    store = MetricStore(Threads())
    store.set_stage("train", False, True)

    def log_many():
        for _ in range(2000):
            store.log("x", torch.tensor(1.0), False, True, False, True, "sum", False, 1)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: unguarded updates of the sum get lost
    try:
        threads = [threading.Thread(target=log_many) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert float(store.reduce_epoch("train")["x"]) == 8 * 2000
