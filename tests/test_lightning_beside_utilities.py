"""`lightning.pytorch.utilities` (issue 37) beside Lightning 2.6 itself: every function is called under both frameworks
on the same inputs and the results compared (FLOPs of a small model, tied parameters, the worker-count bound on a
patched CPU count, the shared-filesystem check on a one-process and a fake two-rank strategy, enums, parsing, memory,
batch sizes, hook signatures, torch.compile round trips), and the Trainer's `enable_autolog_hparams` (the loggers'
hparams files and calls) and `model_registry` arguments, through the Trainer and TaskCLI. In-process, no launch.
Lightning is a test dependency, imported inside the tests only."""
import dataclasses
import os
import pickle
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tasktrain
import tasktrain.utilities as TU

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv
import lightning.pytorch.utilities as LU  # noqa: E402

BOTH = (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule))


def both(path):
    """The same name under Lightning's path and tasktrain's (`memory.recursive_detach` -> both functions)."""
    import importlib

    module, _, name = path.rpartition(".")
    suffix = f".{module}" if module else ""
    return [getattr(importlib.import_module(root + suffix), name)
            for root in ("lightning.pytorch.utilities", "tasktrain.utilities")]


def test_every_public_name_of_lightnings_utilities_is_here():
    missing = [n for n in dir(LU) if not n.startswith("_") and not hasattr(TU, n)]
    assert missing == []
    assert tasktrain.disable_possible_user_warnings is TU.disable_possible_user_warnings
    assert TU.FLOAT16_EPSILON == LU.FLOAT16_EPSILON and TU.FLOAT64_EPSILON == LU.FLOAT64_EPSILON
    assert TU.FLOAT32_EPSILON == LU.FLOAT32_EPSILON == torch.finfo(torch.float32).eps


def test_measure_flops_forward_and_training_step():
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    x = torch.randn(8, 16)
    got = []
    for measure in both("measure_flops"):
        net = model()
        got.append((measure(net, lambda: net(x)), measure(net, lambda: net(x), lambda y: y.sum())))
    assert got[0] == got[1]
    forward, step = got[1]
    assert forward == 2 * 8 * (16 * 32 + 32 * 4) and step > forward  # two matmuls; the backward adds its own
    with torch.device("meta"):  # Lightning's recommended way: nothing computed
        net, xm = model(), torch.randn(8, 16)
    assert [measure(net, lambda: net(xm)) for measure in both("measure_flops")] == [forward, forward]


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.body = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 5, bias=False))
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight
        self.body[1].weight = self.embed.weight


def test_shared_parameters_found_and_tied_again():
    found = [find(Tied()) for find in both("find_shared_parameters")]
    assert found[0] == found[1] == [["embed.weight", "body.1.weight", "head.weight"]]
    assert [find(torch.nn.Linear(2, 2)) for find in both("find_shared_parameters")] == [[], []]
    for set_shared in both("set_shared_parameters"):
        model = Tied()
        model.head.weight = torch.nn.Parameter(model.head.weight.detach().clone())  # untied (as a copy would)
        model.body[1].weight = torch.nn.Parameter(model.head.weight.detach().clone())
        assert set_shared(model, found[0]) is model
        assert model.head.weight is model.embed.weight and model.body[1].weight is model.embed.weight


@pytest.mark.parametrize("affinity", [True, False])
def test_suggested_max_num_workers(monkeypatch, affinity):
    """Both branches of the CPU count (the cores this process may use; os.cpu_count where that is not known), pinned
    by patching, not read from the host."""
    if affinity:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    else:
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cases = [1, 2, 3, 4, 8, 16]
    results = [[suggest(n) for n in cases] for suggest in both("suggested_max_num_workers")]
    assert results[0] == results[1] == [7, 3, 1, 1, 1, 1]  # cores // processes - 1, at least 1
    for suggest in both("suggested_max_num_workers"):
        with pytest.raises(ValueError, match="local_world_size"):
            suggest(0)


class FakeRanks:
    """A strategy of two ranks seen from one of them: the collectives answer with this rank's own values."""

    def __init__(self, is_global_zero):
        self.world_size, self.is_global_zero = 2, is_global_zero

    def broadcast(self, obj, src=0):
        return obj

    def reduce_boolean_decision(self, decision, all=True):
        return bool(decision)

    def barrier(self, *args, **kwargs):
        pass


def test_is_shared_filesystem(tmp_path):
    one = tasktrain.Trainer(accelerator="cpu", devices=1, logger=False).strategy
    lit_one = L.Trainer(accelerator="cpu", devices=1, logger=False).strategy
    lit, ours = both("is_shared_filesystem")
    assert lit(lit_one, tmp_path) is ours(one, tmp_path) is True  # one process: shared without a check
    assert lit(FakeRanks(False), "s3://bucket/x") is ours(FakeRanks(False), "s3://bucket/x") is True
    # rank 0 writes the marker and sees it; a rank that never sees rank 0's marker says "not shared" after timeout
    assert lit(FakeRanks(True), tmp_path) is ours(FakeRanks(True), tmp_path) is True
    assert lit(FakeRanks(False), tmp_path, timeout=0.05) is ours(FakeRanks(False), tmp_path, timeout=0.05) is False
    assert not os.listdir(tmp_path)  # the marker is removed
    for check in (lit, ours):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            check(FakeRanks(True), tmp_path / "missing")


def test_enums_and_gradient_clip_algorithm_type():
    (lit_type, our_type), (lit_enum, our_enum) = both("GradClipAlgorithmType"), both("LightningEnum")
    assert both("enums.GradClipAlgorithmType") == [lit_type, our_type]
    for cls in (lit_type, our_type):
        assert cls.supported_types() == ["value", "norm"] and cls.supported_type("norm") and not cls.supported_type("x")
        assert cls.NORM == "NORM" and cls.from_str("value") is cls.VALUE and cls("norm") is cls.NORM
        assert {cls.VALUE: 1}["value"] == 1 and cls.VALUE.lower() == "value"
    assert issubclass(our_type, our_enum) and issubclass(our_enum, str)
    assert our_enum is type(tasktrain.trainer.states.TrainerFn.FITTING).__mro__[1]  # the core's enum, not a copy
    for pkg in (L, tasktrain):  # the Trainer takes the enum for gradient_clip_algorithm
        trainer = pkg.Trainer(gradient_clip_val=1.0, gradient_clip_algorithm=pkg.utilities.GradClipAlgorithmType.VALUE,
                              logger=False, enable_checkpointing=False, enable_progress_bar=False)
        assert trainer.gradient_clip_algorithm == "value"


def test_parsing():
    values = [1, "a", [1, 2], lambda: 0, threading.Lock()]
    picklable = [[check(v) for v in values] for check in both("is_picklable")]
    assert picklable[0] == picklable[1] == [True, True, True, False, False]
    for clean in both("parsing.clean_namespace"):
        hparams = {"lr": 0.1, "fn": lambda: 0}
        with pytest.warns(UserWarning, match="'fn' removed from hparams"):
            clean(hparams)
        assert hparams == {"lr": 0.1}

    class Model:
        def __init__(self, hparams, *my_args, anykw=42, **my_kwargs):
            pass

    assert [parse(Model) for parse in both("parsing.parse_class_init_keys")] == [("self", "my_args", "my_kwargs")] * 2
    assert TU.parsing.AttributeDict is TU.AttributeDict is tasktrain.trainer.module.AttributeDict


def test_init_args_and_save_hyperparameters_from_a_helper():
    import inspect

    found = []
    for name, pkg, base in BOTH:
        parsing = pkg.utilities.parsing

        class Base:
            def __init__(self, x, *rest, **extra):
                self.collected = parsing.collect_init_args(inspect.currentframe(), [])
                self.own = parsing.get_init_args(inspect.currentframe())
                super().__init__()

        class Child(Base):
            def __init__(self, y=2, **extra):
                super().__init__(1, z=3)

        def helper(obj):  # a helper of the user's: the __init__ frame is given
            parsing.save_hyperparameters(obj, ignore="depth", frame=inspect.currentframe().f_back)

        class Net(base):
            def __init__(self, lr=0.1, depth=2, act="relu"):
                super().__init__()
                helper(self)

        class Direct(base):
            def __init__(self, lr=0.5, depth=3):
                super().__init__()
                parsing.save_hyperparameters(self, "lr")  # the caller's frame

        child = Child(w=4)
        found.append((child.collected, child.own, dict(Net(act="gelu").hparams), dict(Direct().hparams)))
    assert found[0] == found[1]
    assert found[1] == ([{"x": 1, "z": 3}, {"y": 2, "w": 4}], {"x": 1, "z": 3}, {"lr": 0.1, "act": "gelu"},
                        {"lr": 0.5})


def test_lightning_getattr_setattr(tmp_path):
    for name, pkg, base in BOTH:
        parsing = pkg.utilities.parsing
        getattr_, setattr_, hasattr_ = parsing.lightning_getattr, parsing.lightning_setattr, parsing.lightning_hasattr

        class Net(base):
            def __init__(self, lr=0.1):
                super().__init__()
                self.save_hyperparameters()
                self.batch_size = 4

        dm = (L.LightningDataModule if name == "lightning" else tasktrain.DataModule)()
        dm.batch_size = 8
        net = Net()
        net._trainer = SimpleNamespace(datamodule=dm)
        assert hasattr_(net, "lr") and not hasattr_(net, "nothing")
        assert getattr_(net, "lr") == 0.1 and getattr_(net, "batch_size") == 8, name  # the DataModule's: the last
        setattr_(net, "batch_size", 16)
        assert net.batch_size == dm.batch_size == 16
        with pytest.raises(AttributeError, match="neither stored in the model namespace"):
            getattr_(net, "nothing")


def test_memory():
    batch = {"x": torch.ones(2, requires_grad=True) * 2, "rest": [torch.zeros(1, requires_grad=True) + 1, "text", 3]}
    for detach in both("memory.recursive_detach"):
        out = detach(batch, to_cpu=True)
        assert not out["x"].requires_grad and not out["rest"][0].requires_grad and out["rest"][1:] == ["text", 3]
        assert torch.equal(out["x"], batch["x"].detach())
    errors = [RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"),
              RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
              RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory: you tried"),
              RuntimeError("shape mismatch"), ValueError("CUDA out of memory")]
    names = ("is_oom_error", "is_cuda_out_of_memory", "is_cudnn_snafu", "is_out_of_cpu_memory")
    table = [[[fn(e) for e in errors] for fn in both(f"memory.{n}")] for n in names]
    for lit, ours in table:
        assert lit == ours
    assert table[0][1] == [True, True, True, False, False]
    for collect in both("memory.garbage_collection_cuda"):
        collect()  # (no CUDA here: it collects Python's garbage and returns)


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    label: str


def test_data_helpers():
    batches = [torch.zeros(3, 2), torch.tensor(5.0), [torch.zeros(4), {"y": torch.zeros(4, 1)}],
               Batch(torch.zeros(6), "a"), {"ids": torch.zeros(2, 7), "text": ["a", "b"]}]
    sizes = [[extract(b) for b in batches] for extract in both("data.extract_batch_size")]
    assert sizes[0] == sizes[1] == [3, 1, 4, 6, 2]
    for extract in both("data.extract_batch_size"):
        with pytest.warns(UserWarning, match="ambiguous collection. The batch size we found is 9"):
            assert extract([torch.zeros(9), torch.zeros(3)]) == 9
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same message again: said once per process (Lightning's cache)
            assert extract([torch.zeros(9), torch.zeros(5)]) == 9
        with pytest.raises(Exception, match="could not infer the batch_size") as error:
            extract({"a": None})
        assert type(error.value).__name__ == "MisconfigurationException"

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    loaders = [DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2), DataLoader(Stream()), [1, 2, 3]]
    for sized_len, has_iterable in zip(both("data.sized_len"), both("data.has_iterable_dataset")):
        assert [sized_len(d) for d in loaders] == [2, None, 3]
        assert [has_iterable(d) for d in loaders] == [False, True, False]
    strategies = (L.Trainer(accelerator="cpu", devices=1, logger=False).strategy,
                  tasktrain.Trainer(accelerator="cpu", devices=1, logger=False).strategy)
    for has_len_all_ranks, strategy in zip(both("data.has_len_all_ranks"), strategies):
        assert has_len_all_ranks(loaders[0], strategy) is True and has_len_all_ranks(loaders[1], strategy) is False
        with pytest.warns(UserWarning, match="across ranks is zero"):
            assert has_len_all_ranks([], strategy) is True


def test_is_param_in_hook_signature():
    class Hooks:
        def a(self, batch, batch_idx): ...
        def b(self, *args): ...
        def c(self, x, y, z): ...

    hooks = Hooks()
    cases = [(hooks.a, "batch_idx", False, None), (hooks.a, "dataloader_idx", False, None),
             (hooks.b, "batch_idx", False, None), (hooks.b, "batch_idx", True, None),
             (hooks.c, "dataloader_idx", True, 3), (Hooks.a, "batch", False, None)]
    results = [[check(*case) for case in cases] for check in both("signature_utils.is_param_in_hook_signature")]
    assert results[0] == results[1] == [True, False, True, False, True, True]


def test_compile_round_trip():
    for name, pkg, base in BOTH:
        from_compiled, to_uncompiled = (getattr(pkg.utilities.compile, n) for n in ("from_compiled", "to_uncompiled"))

        class Net(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 2)

            def forward(self, x):
                return self.layer(x)

        net = Net()
        original_forward = net.forward
        module = from_compiled(torch.compile(net))  # (nothing is compiled until it is called)
        assert module is net and module._compiler_ctx["original_forward"] == original_forward
        assert module.forward != original_forward and module.training_step != Net.training_step.__get__(net)
        assert to_uncompiled(module) is net and net._compiler_ctx is None and net.forward == original_forward
        with pytest.raises(ValueError, match="non-compiled"):
            to_uncompiled(net)
        with pytest.raises(ValueError, match="OptimizedModule"):
            from_compiled(net)
        with pytest.raises(ValueError, match="compiled"):
            from_compiled(torch.compile(torch.nn.Linear(2, 2)))

        class Step(Net):
            def training_step(self, batch, batch_idx):
                return self(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = pkg.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False)  # the module from_compiled gave trains (eager backend: fast)
        trainer.fit(from_compiled(torch.compile(Step(), backend="eager")),
                    DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
        assert trainer.global_step == 2


def test_migration_and_warnings_and_exceptions():
    from tasktrain.utilities.migration import migrate_checkpoint, pl_legacy_patch

    with pl_legacy_patch():  # a no-op here: tasktrain never unpickles classes
        pass
    lightning_written = {"state_dict": {}, "pytorch-lightning_version": "1.5.0", "loops": {"fit_loop": {}}}
    with pytest.raises(ValueError, match="not written by tasktrain.*upgrade_checkpoint"):
        migrate_checkpoint(lightning_written)
    with pytest.raises(ValueError, match="target_version"):
        migrate_checkpoint({"state_dict": {}}, target_version="2.0.0")
    old = {"state_dict": {"w": torch.ones(1)}, "train_state": {"epoch": 1, "global_step": 5}, "format_version": 1}
    upgraded, applied = migrate_checkpoint(old)
    assert upgraded is old and old["global_step"] == 5 and old["loops"]["format_version"] == 1 and applied
    assert migrate_checkpoint(old) == (old, {})  # current: nothing left to do
    for pkg in (L, tasktrain):
        warning = pkg.utilities.warnings.PossibleUserWarning
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pkg.utilities.disable_possible_user_warnings("some\\.other\\.module")
            warnings.warn("kept", warning)
            pkg.utilities.disable_possible_user_warnings()
            warnings.warn("dropped", warning)
        assert [str(w.message) for w in seen] == ["kept"]
    assert issubclass(TU.exceptions.SIGTERMException, SystemExit)
    assert issubclass(TU.exceptions.MisconfigurationException, ValueError)
    # (model_registry's functions: test_model_registry_without_litmodels_as_lightnings)


def test_submodules_are_attributes_and_pickle_by_name():
    for name in ("argparse", "compile", "data", "enums", "exceptions", "grads", "imports", "memory", "migration",
                 "model_registry", "model_summary", "parameter_tying", "parsing", "signature_utils"):
        assert hasattr(TU, name) and hasattr(LU, name)
    assert TU.grads.grad_norm is TU.grad_norm and TU.imports.package_available("torch")
    batch = [torch.zeros(2, 3), (torch.zeros(1), "text"), 5]
    shapes = [parse(batch) for parse in both("model_summary.parse_batch_shape")]
    assert shapes[0] == shapes[1] == [[2, 3], [[1], "?"], "?"]
    sizes = [[fmt(v) for v in (0.0, 12345.6789)] for fmt in both("model_summary.get_formatted_model_size")]
    assert sizes[0] == sizes[1] == ["0.000", "12,345.679"]
    assert pickle.loads(pickle.dumps(TU.GradClipAlgorithmType.NORM)) is TU.GradClipAlgorithmType.NORM


def hparams_module(base):
    class Net(base):
        def __init__(self, lr=0.1):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("loss", loss)  # (an event: the TensorBoard folder exists under both)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Net


@pytest.mark.parametrize("autolog", [True, False])
def test_enable_autolog_hparams(tmp_path, autolog):
    """Trainer(enable_autolog_hparams=False): the loggers get no hyper-parameters, no graph, no save at the run's
    start. The hparams files the CSV and TensorBoard loggers leave, and the calls a logger receives, beside
    Lightning."""
    from unittest.mock import Mock

    found = {}
    for name, pkg, base in BOTH:
        root = tmp_path / name
        csv, tb = pkg.loggers.CSVLogger(str(root), name="csv"), pkg.loggers.TensorBoardLogger(str(root), name="tb")
        mock = Mock()
        trainer = pkg.Trainer(default_root_dir=str(root), logger=[csv, tb, mock], max_steps=1, log_every_n_steps=1,
                              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                              enable_autolog_hparams=autolog)
        assert trainer.enable_autolog_hparams is autolog
        trainer.fit(hparams_module(base)(), DataLoader(TensorDataset(torch.randn(4, 3)), batch_size=2))
        files = {}
        for sub in ("csv", "tb"):
            path = root / sub / "version_0" / "hparams.yaml"
            files[sub] = path.read_text().strip() if path.exists() else None
        calls = [c[0] for c in mock.method_calls if c[0] in ("log_hyperparams", "log_graph", "save")]
        found[name] = (files, calls[:3])
    assert found["tasktrain"] == found["lightning"]
    files, calls = found["tasktrain"]
    if autolog:
        assert files == {"csv": "lr: 0.1", "tb": "lr: 0.1"} and calls == ["log_hyperparams", "log_graph", "save"]
    else:
        # no hyper-parameters: the CSV logger writes no hparams.yaml, TensorBoard's an empty one when the run ends
        assert "log_hyperparams" not in calls and "log_graph" not in calls and files == {"csv": None, "tb": "{}"}


def test_model_registry_without_litmodels_as_lightnings(tmp_path, caplog, monkeypatch):
    """Without the litmodels package (not installed here) Lightning keeps the name (its version cut off), adds its
    plain ModelCheckpoint, which saves locally, and says once, at the run's start, that litmodels would upload: so
    does tasktrain. Its registry helpers find a downloaded model's file as Lightning's, and the download asks for
    litmodels (ImportError) under both."""
    import logging

    from tasktrain.trainer import arguments

    assert not arguments.litmodels_installed()  # (the venv has no litmodels: Lightning runs its path without it)
    # (the tip is logged on global rank 0 as read from the environment; the beside files put Lightning's logger level
    # back after each test: conftest.py quiet_lightning)
    for name in ("tasktrain", "lightning.pytorch"):
        monkeypatch.setattr(logging.getLogger(name), "disabled", False)
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for pkg in (L, tasktrain):
        assert pkg.Trainer(model_registry=None, logger=False).enable_autolog_hparams is True
    found = {}
    for name, pkg, base in BOTH:
        caplog.clear()
        with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="tasktrain"):
            trainer = pkg.Trainer(default_root_dir=str(tmp_path / name), model_registry="my-model:v2", logger=False,
                                  max_steps=2, enable_progress_bar=False, enable_model_summary=False)
            module = hparams_module(base)()
            trainer.fit(module, DataLoader(TensorDataset(torch.randn(4, 3)), batch_size=2))
            trainer.fit(module, DataLoader(TensorDataset(torch.randn(4, 3)), batch_size=2))  # (max_steps reached)
        tips = [r.getMessage() for r in caplog.records if "litmodels" in r.getMessage()]
        files = sorted(p.name for p in (tmp_path / name).rglob("*.ckpt"))
        found[name] = (trainer._model_registry, tips, files, type(trainer.checkpoint_callback).__name__)
    assert found["tasktrain"] == found["lightning"]
    registry, tips, files, kind = found["tasktrain"]
    assert registry == "my-model" and files == ["epoch=0-step=2.ckpt"] and kind == "ModelCheckpoint"
    assert len(tips) == 1 and "pip" not in tips[0] and "LitModelCheckpoint" in tips[0]  # once: not again at the second run
    for pkg in (L, tasktrain):  # no tip without the default ModelCheckpoint
        caplog.clear()
        with caplog.at_level(logging.INFO):
            pkg.Trainer(default_root_dir=str(tmp_path), logger=False, enable_checkpointing=False, max_steps=1,
                        enable_progress_bar=False, enable_model_summary=False).fit(
                hparams_module(pkg.LightningModule if pkg is L else pkg.TaskModule)(),
                DataLoader(TensorDataset(torch.randn(2, 3)), batch_size=2))
        assert not [r for r in caplog.records if "litmodels" in r.getMessage()]

    # the registry helpers: names and folders, the local file, the download without litmodels
    model_dir = tmp_path / "root" / "my-model_v2"
    model_dir.mkdir(parents=True)
    (model_dir / "notes.txt").write_text("")
    (model_dir / "best.ckpt").write_bytes(b"")
    (tmp_path / "x").mkdir()  # a model folder without a .ckpt file
    results = []
    for registry in both("model_registry"):
        row = [registry._determine_model_name(p, "default")
               for p in ("registry:my-model:version:v2", "REGISTRY:my-model", "registry:version:v2")]
        row += [registry._is_registry(t) for t in ("registry", "Registry:x", "my_registry", "", None)]
        row.append(registry.find_model_local_ckpt_path("registry:version:v2", "my-model", str(tmp_path / "root")))
        for bad in ("registry", "model.ckpt"):
            with pytest.raises(ValueError) as error:
                registry._determine_model_name(bad, None)
            row.append(str(error.value))
        with pytest.raises(RuntimeError) as error:
            registry.find_model_local_ckpt_path("registry:x", None, str(tmp_path))
        row.append(str(error.value))
        trainer = SimpleNamespace(local_rank=0, _model_registry="my-model", default_root_dir=str(tmp_path),
                                  strategy=SimpleNamespace(barrier=lambda name: None))
        with pytest.raises(ImportError) as error:
            registry.download_model_from_registry("registry:my-model", trainer)
        row.append(str(error.value))
        results.append(row)
    assert results[0] == results[1]
    assert results[1][:3] == ["my-model:v2", "my-model", "default:v2"]
    assert results[1][8] == str(model_dir / "best.ckpt") and "pip install litmodels" in results[1][-1]

    # with litmodels installed Lightning would upload through LitModelCheckpoint (written for its own Trainer):
    # refused, naming litmodels and what to do
    monkeypatch.setattr(arguments, "litmodels_installed", lambda: True)
    with pytest.raises(ValueError, match="model_registry='my-model'.*litmodels.*LitModelCheckpoint.*locally"):
        tasktrain.Trainer(model_registry="my-model", logger=False)
    assert tasktrain.Trainer(model_registry="", logger=False)._model_registry is None  # "" is None, as Lightning's


def test_task_cli_parses_the_new_trainer_arguments():
    from tasktrain.cli import TaskCLI
    from tasktrain.demos.boring_classes import BoringModel

    cli = TaskCLI(BoringModel, run=False, args=["--trainer.enable_autolog_hparams=false", "--trainer.logger=false",
                                                "--trainer.enable_progress_bar=false"])
    assert cli.trainer.enable_autolog_hparams is False
    cli = TaskCLI(BoringModel, run=False, args=["--trainer.model_registry=my-model:v1", "--trainer.logger=false"])
    assert cli.trainer._model_registry == "my-model"


def test_layer_summary_and_deepspeed_summary_as_lightnings():
    """LayerSummary of one layer (before and after a forward pass, a detached hook, a lazy layer) and DeepSpeedSummary
    of the same model, its parameters carrying ZeRO-3's attributes (ds_numel: the whole parameter; partition_numel():
    this device's part, here a half), under both frameworks: the same attributes, rows and totals."""
    def case(root, Module):
        summaries = root.utilities.model_summary
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(3, 8, 3)
        layer = summaries.LayerSummary(conv)
        before = (layer.layer_type, layer.num_parameters, layer.training, layer.in_size, layer.out_size)
        conv(torch.rand(1, 3, 5, 5))
        conv.eval()
        after = (layer.in_size, layer.out_size, layer.training)
        detached = summaries.LayerSummary(torch.nn.Linear(2, 2))
        detached.detach_hook()
        detached._module(torch.zeros(4, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Lightning warns about the lazy parameter)
            lazy = summaries.LayerSummary(torch.nn.LazyLinear(3)).num_parameters

        class Net(Module):
            def __init__(self):
                super().__init__()
                self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
                self.head = torch.nn.Linear(2, 1)
                self.scale = torch.nn.Parameter(torch.ones(3))  # (no layer's: the "other params" row)
                self.example_input_array = torch.zeros(5, 4)
                self.head.requires_grad_(False)
                for p in self.parameters():
                    p.ds_numel = p.numel()
                    p.partition_numel = (lambda n: lambda: -(-n // 2))(p.numel())

            def forward(self, x):
                return self.head(self.encoder(x)) * self.scale.sum()

        rows = []
        for depth in (1, 2):
            summary = summaries.DeepSpeedSummary(Net(), max_depth=depth)
            rows.append((summary._get_summary_data(), summary.total_parameters, summary.trainable_parameters,
                         summary.parameters_per_layer, summary.param_nums, summary.in_sizes, summary.out_sizes))
        return before, after, (detached.in_size, detached.out_size), lazy, rows

    theirs, ours = case(L, L.LightningModule), case(tasktrain, tasktrain.TaskModule)
    assert ours == theirs
    assert ours[0] == ("Conv2d", 224, True, "?", "?") and ours[1] == ([1, 3, 5, 5], [1, 8, 3, 3], False)
    assert ours[2] == ("?", "?") and ours[3] == 0
    data = dict(ours[4][0][0])
    assert data["Params per Device"] == ["22  ", "2  ", "n/a"] and data["Name"] == ["encoder", "head", "other params"]


def test_requirement_cache_compare_version_module_available_and_the_logo_as_lightnings():
    import operator

    import lightning_utilities.core.imports as theirs

    from tasktrain.utilities import imports as ours

    cases = [dict(requirement="torch>=2.0"), dict(requirement="torch>100.0"), dict(requirement="torch"),
             dict(requirement="unknown_package_xyz"), dict(requirement="unknown_package_xyz>=1"),
             dict(module="torch.utils"), dict(module="unknown.module.path"),
             dict(requirement="torch>=2.0", module="torch.nn"), dict(requirement="torch>=2.0", module="not_a_module"),
             dict(requirement="packaging>=1,<2000")]
    for kwargs in cases:
        results = []
        for lib in (theirs, ours):
            cache = lib.RequirementCache(**kwargs)
            results.append((bool(cache), str(cache), repr(cache)))
        assert results[0] == results[1], kwargs
    assert bool(ours.RequirementCache("torch>=2.0")) and not ours.RequirementCache("torch>100.0")
    for mod in (theirs, ours):
        with pytest.raises(ValueError, match="At least one arguments need to be set."):
            mod.RequirementCache()
        with pytest.raises(ValueError, match="Expected semicolon"):  # (packaging's InvalidRequirement)
            bool(mod.RequirementCache("not a requirement!!"))
    for args in [("torch", operator.ge, "2.0"), ("torch", operator.lt, "2.0"), ("does_not_exist", operator.ge, "0.0"),
                 ("torch", operator.ge, torch.__version__.split("+")[0], True), ("packaging", operator.gt, "1.0")]:
        assert ours.compare_version(*args) == theirs.compare_version(*args), args
    assert ours.compare_version("torch", operator.ge, "2.0") and not ours.compare_version("torch", operator.lt, "2.0")
    for path in ("os", "os.path", "os.bla", "bla.bla", "torch.nn.functional", "torch.not_there"):
        assert ours.module_available(path) == theirs.module_available(path), path
        assert ours.package_available(path.split(".")[0]) == theirs.package_available(path.split(".")[0])
    assert tasktrain.module_available is ours.module_available and L.module_available("os.path")
    assert isinstance(tasktrain.LIGHTNING_LOGO, str) and tasktrain.LIGHTNING_LOGO.strip()
    assert isinstance(L.LIGHTNING_LOGO, str)


def test_requirement_cache_extras_are_lightning_utilities(tmp_path, monkeypatch):
    """`package[extra]`: lightning_utilities takes the package's Requires-Dist lines that contain the extra's name
    anywhere (not the `extra ==` marker): "yaml" also takes the line of the "ruamel" extra that names ruamel.yaml,
    "fast" the line of "fastest"; truth values and messages beside lightning_utilities on a distribution made here."""
    import lightning_utilities.core.imports as theirs

    from tasktrain.utilities import imports as ours

    info = tmp_path / "tt_fake_extras-1.0.dist-info"
    info.mkdir()
    lines = ["packaging; extra == 'gpu'", "packaging>=1; extra == 'yaml'",
             "tt-not-installed-ruamel.yaml>=1; extra == 'ruamel'", "torch; extra == 'fastest'",
             "torch>1000; extra == 'old'", "tt-not-installed-xyz; extra == 'all'"]
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tt-fake-extras\nVersion: 1.0\n"
                                   + "".join(f"Requires-Dist: {line}\n" for line in lines))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = {}
    for kwargs in [dict(requirement="tt-fake-extras[gpu]"), dict(requirement="tt-fake-extras[yaml]"),
                   dict(requirement="tt-fake-extras[fast]"), dict(requirement="tt-fake-extras[old]"),
                   dict(requirement="tt-fake-extras[nothing]"), dict(requirement="tt-fake-extras[gpu,all]"),
                   dict(requirement="tt-fake-extras[gpu]>=2"), dict(requirement="tt-fake-extras[gpu]>=1"),
                   dict(requirement="tt-fake-extras[yaml]", module="os.path")]:
        results = [(bool(cache), str(cache)) for cache in (lib.RequirementCache(**kwargs) for lib in (theirs, ours))]
        assert results[0] == results[1], kwargs
        seen[kwargs["requirement"], kwargs.get("module")] = results[1][0]
    seen = {requirement: value for (requirement, module), value in seen.items() if module is None}
    # the substring rule at work: a marker-based check would say the opposite for yaml and fast
    assert seen["tt-fake-extras[gpu]"] and not seen["tt-fake-extras[yaml]"] and seen["tt-fake-extras[fast]"]
    assert not seen["tt-fake-extras[nothing]"] and not seen["tt-fake-extras[gpu]>=2"]


def test_model_summary_of_a_module_runs_its_example_input_as_lightnings():
    """`utilities.model_summary.ModelSummary(model)` and `summarize` run the module's example_input_array as
    Lightning's do: through its batch hooks (on_before_batch_transfer in the module's mode, transfer_batch_to_device
    to its device, on_after_batch_transfer, dataloader_idx 0), then one forward in eval mode without gradients, under
    the attached trainer's precision (bf16-mixed: autocast; its warning and bits for the size). The tables (In / Out
    sizes, "?" for a layer the forward skips, FLOPs, no size columns without an example) and the hook calls are
    compared."""
    def case(root, Module):
        summaries = root.utilities.model_summary
        log = []

        class Net(Module):
            def __init__(self, example=True):
                super().__init__()
                torch.manual_seed(0)
                self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU())
                self.head = torch.nn.Linear(6, 1)
                self.unused = torch.nn.Linear(3, 3)  # ("?" sizes)
                if example:
                    self.example_input_array = {"x": torch.zeros(5, 7)}

            def forward(self, x):
                log.append(("forward", self.training, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
                return self.head(self.encoder(x))

            def predict_step(self, batch, batch_idx):
                return self(**batch)

            def on_before_batch_transfer(self, batch, dataloader_idx):
                log.append(("before", dataloader_idx, self.training))
                return {"x": batch["x"][:, :4]}  # (the sizes show the hook ran)

            def transfer_batch_to_device(self, batch, device, dataloader_idx):
                log.append(("transfer", str(device), dataloader_idx))
                return {k: v.to(device) for k, v in batch.items()}

            def on_after_batch_transfer(self, batch, dataloader_idx):
                log.append(("after", dataloader_idx))
                return batch

        out = []
        for depth in (1, 2, 0):
            summary = summaries.ModelSummary(Net(), max_depth=depth)
            out.append((str(summary), summary.in_sizes, summary.out_sizes, summary.total_flops))
        summary = summaries.ModelSummary(Net(example=False))
        out.append((str(summary), summary.in_sizes, summary.out_sizes))
        out.append(str(summaries.summarize(Net(), max_depth=2)))
        net = Net()
        trainer = root.Trainer(precision="bf16-mixed", accelerator="cpu", devices=1, logger=False,
                               enable_progress_bar=False)
        # (Lightning's batch hooks need a trainer that ran: its data hook selector)
        trainer.predict(net, torch.utils.data.DataLoader([{"x": torch.zeros(7)}] * 2, batch_size=2))
        log.append("attached")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = summaries.ModelSummary(net)
        out.append((str(summary), summary.model_size, [str(w.message) for w in caught if "summary" in str(w.message)]))
        return out, log

    theirs, ours = case(L, L.LightningModule), case(tasktrain, tasktrain.TaskModule)
    assert ours == theirs
    out, log = ours
    assert out[0][1] == [[5, 4], [5, 6], "?"] and out[0][2] == [[5, 6], [5, 1], "?"] and out[0][3] > 0
    assert "In sizes" not in out[3][0] and out[3][1] == ["?", "?", "?"]
    assert log[:4] == [("before", 0, True), ("transfer", "cpu", 0), ("after", 0), ("forward", False, False, False)]
    assert log[-1] == ("forward", False, False, True) and len(out[-1][2]) == 1  # autocast; the precision warning


def test_the_model_summary_callback_sends_the_example_input_through_the_batch_hooks_as_lightnings():
    """At fit start the ModelSummary callback's example forward takes the module's batch hooks as a batch does
    (on_before_batch_transfer, on_after_batch_transfer, dataloader_idx 0; here they cut the input to the layer's
    width), then the forward in eval mode; the same calls under both frameworks."""
    from torch.utils.data import DataLoader, TensorDataset

    def case(root, Module):
        log = []

        class Net(Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)
                self.example_input_array = torch.zeros(3, 6)

            def forward(self, x):
                log.append(("forward", tuple(x.shape), self.training))
                return self.layer(x)

            def training_step(self, batch, batch_idx):
                return self(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            def on_before_batch_transfer(self, batch, dataloader_idx):
                log.append(("before", dataloader_idx))
                return batch[:, :4] if isinstance(batch, torch.Tensor) else [one[:, :4] for one in batch]

            def on_after_batch_transfer(self, batch, dataloader_idx):
                log.append(("after", dataloader_idx))
                return batch

        trainer = root.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                               callbacks=[root.callbacks.ModelSummary(max_depth=1)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Net(), DataLoader(TensorDataset(torch.zeros(2, 6)), batch_size=2))
        return log

    theirs, ours = case(L, L.LightningModule), case(tasktrain, tasktrain.TaskModule)
    assert ours == theirs
    assert ours[:3] == [("before", 0), ("after", 0), ("forward", (3, 4), False)]


def test_model_summary_is_read_live_from_lightnings_module_paths_as_lightnings():
    """Lightning's summary modules `utilities.model_summary.model_summary` and `.model_summary_deepspeed` (where its
    tests and scripts import ModelSummary, summarize and DeepSpeedSummary from), and the summary read live as
    Lightning's: built once (the example forward measures the sizes then), its layer types, modes and parameter counts
    and the totals are the module's when read (a layer put in eval mode, frozen or replaced after the summary was
    made shows so); `summarize()` is {name: LayerSummary}; a lazy layer's parameters count 0 with one warning per
    process (warning_cache); a bad max_depth's message. Compared under both frameworks."""
    import importlib

    def case(root, Module):
        path = root.__name__ + ".utilities.model_summary"
        summaries = importlib.import_module(path + ".model_summary")
        deepspeed_summaries = importlib.import_module(path + ".model_summary_deepspeed")
        assert summaries.ModelSummary is importlib.import_module(path).ModelSummary
        assert deepspeed_summaries.DeepSpeedSummary is importlib.import_module(path).DeepSpeedSummary

        class Net(Module):
            def __init__(self):
                super().__init__()
                self.branch = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Sequential(torch.nn.Linear(5, 3)))
                self.head = torch.nn.Linear(3, 2)
                self.example_input_array = torch.zeros(2, 5)

            def forward(self, x):
                return self.head(self.branch(x))

        out = []
        for depth in (1, -1):
            net = Net()
            summary = summaries.ModelSummary(net, max_depth=depth)
            before = (str(summary), summary.total_training_modes, summary.trainable_parameters)
            net.branch[1].eval()
            net.head.requires_grad_(False)
            net.branch[0] = torch.nn.Linear(5, 5, bias=False)  # (replaced: its count and type are the new one's)
            layers = summary.summarize()
            out.append((before, str(summary), summary.total_training_modes, summary.training_modes,
                        summary.param_nums, summary.trainable_parameters, summary.total_parameters,
                        [(name, type(layer).__name__, layer.layer_type, layer.in_size, layer.out_size)
                         for name, layer in layers.items()], sorted(summary._layer_summary)))

        class Lazy(Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.LazyLinear(3)

        summaries.warning_cache.clear()
        lazy = summaries.summarize(Lazy())
        counts = []
        for _ in range(2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                counts.append((lazy.total_parameters, lazy.trainable_parameters,
                               ["may be inaccurate" in str(w.message) for w in caught]))
        out.append(counts)
        with pytest.raises(ValueError) as error:
            summaries.ModelSummary(Net(), max_depth="temp")
        out.append(str(error.value).split(".")[0])
        return out

    theirs, ours = case(L, L.LightningModule), case(tasktrain, tasktrain.TaskModule)
    assert ours == theirs
    (before, table, modes, layer_modes, params, trainable, total, layers, names), deep = ours[0], ours[1]
    assert before[1] == {"train": 5, "eval": 0} and before[2] == 56
    assert modes == {"train": 3, "eval": 2} and layer_modes == [True, True]
    assert params == [43, 8] and trainable == 43 and total == 51 and "Sequential | 43 " in table
    assert deep[3] == [True, True, False, False, True] and [row[0] for row in deep[7]] == \
        ["branch", "branch.0", "branch.1", "branch.1.0", "head"]
    assert ours[2] == [(0, 0, [True]), (0, 0, [])]
    assert ours[3] == "`max_depth` can be -1, 0 or > 0, got temp"
