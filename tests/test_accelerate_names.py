"""The names Accelerate's own test scripts (accelerate/test_utils/scripts) import, at Accelerate's paths under the
rename rule, each behaving as Accelerate documents it: on one process here, on two real processes in one
`tasktrain launch` of tests/accelerator_scripts/names_worker.py (reduce max/min, debug mode's shape checks,
copy_tensor_to_devices, synchronize_rng_states, GradientState, an assigned distributed_type,
trigger_sync_in_backward, destroy_process_group)."""
import importlib.util
import json
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader


# -- import paths -------------------------------------------------------------------------------------------------
def test_the_accelerator_module_and_the_top_level_name_coexist():
    import tasktrain
    import tasktrain.accelerator as module
    from tasktrain.accelerator import Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin
    from tasktrain.state import GradientState

    assert Accelerator is tasktrain.Accelerator and tasktrain.accelerator is module  # a module, and the class
    assert DataLoaderConfiguration is tasktrain.DataLoaderConfiguration
    assert GradientAccumulationPlugin is tasktrain.GradientAccumulationPlugin
    assert module.GradientState is GradientState


def test_every_distributed_type_of_accelerate():
    from accelerate.utils import DistributedType as Theirs

    from tasktrain.utils.dataclasses import DistributedType

    assert {m.name: m.value for m in DistributedType} == {m.name: m.value for m in Theirs}
    assert DistributedType("MULTI_HPU") is DistributedType.MULTI_HPU


def test_the_paths_accelerate_scripts_import_from():
    import tasktrain.utils as utils
    from tasktrain.utils import imports, operations, random

    assert operations.DistributedOperationException is utils.DistributedOperationException
    assert issubclass(utils.DistributedOperationException, Exception)
    assert random.synchronize_rng_states is utils.synchronize_rng_states
    assert operations.copy_tensor_to_devices is utils.copy_tensor_to_devices
    assert imports.is_xpu_available is utils.is_xpu_available and imports.is_cuda_available is utils.is_cuda_available


@pytest.mark.parametrize("name, expected", [
    ("is_cuda_available", lambda: torch.cuda.is_available()),
    ("is_mps_available", lambda: torch.backends.mps.is_available()),
    ("is_xpu_available", lambda: hasattr(torch, "xpu") and torch.xpu.is_available()),
    ("is_hpu_available", lambda: importlib.util.find_spec("habana_frameworks") is not None and torch.hpu.is_available()),
    ("is_npu_available", lambda: importlib.util.find_spec("torch_npu") is not None and torch.npu.is_available()),
    ("is_mlu_available", lambda: importlib.util.find_spec("torch_mlu") is not None and torch.mlu.is_available()),
    ("is_musa_available", lambda: importlib.util.find_spec("torch_musa") is not None and torch.musa.is_available()),
    ("is_torch_xla_available", lambda: importlib.util.find_spec("torch_xla") is not None),
    ("is_ipex_available", lambda: importlib.util.find_spec("intel_extension_for_pytorch") is not None),
    ("is_datasets_available", lambda: importlib.util.find_spec("datasets") is not None),
    ("is_pytest_available", lambda: True),
    ("is_fp16_available", lambda: True),
    ("is_bf16_available", lambda: torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True),
    ("is_fp8_available", lambda: False),  # refused by tasktrain's Accelerator
])
def test_availability_checks_are_honest(name, expected):
    import tasktrain.utils

    value = getattr(tasktrain.utils, name)()
    assert isinstance(value, bool) and value == bool(expected()), name


def test_the_precisions_said_available_run():
    from tasktrain import Accelerator
    from tasktrain.utils import is_bf16_available, is_fp16_available, is_fp8_available

    for precision, available in (("bf16", is_bf16_available()), ("fp16", is_fp16_available())):
        if available:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # fp16 on a CPU warns that it is slow
                assert Accelerator(mixed_precision=precision).mixed_precision == precision
    assert not is_fp8_available()
    with pytest.raises(ValueError):
        Accelerator(mixed_precision="fp8")


# -- one process ----------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_state():
    from tasktrain.state import PartialState

    PartialState._reset_state()
    yield
    PartialState._reset_state()  # debug mode and an assigned distributed_type do not leak into other tests


def test_reduce_max_min_and_copy_on_one_process(fresh_state):
    from tasktrain import Accelerator
    from tasktrain.utils import copy_tensor_to_devices, reduce

    t = torch.tensor([1.0, 5.0])
    assert reduce(t, "max").tolist() == [1.0, 5.0] and reduce(t, "min").tolist() == [1.0, 5.0]
    assert Accelerator().reduce(t, "min").tolist() == [1.0, 5.0]
    with pytest.raises(ValueError, match="'max', 'min'"):
        reduce(t, "median")
    assert torch.equal(copy_tensor_to_devices(t), t)
    with pytest.raises(ValueError, match="no process passed a tensor"):
        copy_tensor_to_devices(None)


@pytest.mark.parametrize("variable", ["ACCELERATE_DEBUG_MODE", "TASKTRAIN_DEBUG_MODE"])
def test_debug_mode_comes_from_the_environment_and_checks_nothing_on_one_process(variable, monkeypatch, fresh_state):
    from tasktrain.state import PartialState
    from tasktrain.utils import broadcast, gather, pad_across_processes, reduce

    monkeypatch.setenv(variable, "1")
    assert PartialState().debug is True
    t = torch.zeros(1, 5)
    for op in (gather, broadcast, reduce, pad_across_processes):  # one process: nobody to disagree with
        assert torch.equal(op(t), t)
    PartialState().debug = False
    assert PartialState().debug is False
    monkeypatch.delenv(variable)
    PartialState._reset_state()
    assert PartialState().debug is False


def test_synchronize_rng_states_on_one_process_and_its_errors(fresh_state):
    from tasktrain.utils import synchronize_rng_states

    torch.manual_seed(3)
    expected = torch.rand(1)
    torch.manual_seed(3)
    synchronize_rng_states(["torch", "generator"], generator=torch.Generator())
    assert torch.equal(torch.rand(1), expected)  # one process: its own state, untouched
    with pytest.raises(ValueError, match="needs generator"):
        synchronize_rng_states(["generator"])
    with pytest.raises(ValueError, match="XLA"):
        synchronize_rng_states(["xla"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no cuda device"):
            synchronize_rng_states(["cuda"])


def test_distributed_type_is_assignable_until_the_next_accelerator(fresh_state):
    from tasktrain import Accelerator
    from tasktrain.state import AcceleratorState, PartialState
    from tasktrain.utils import DistributedType

    accelerator = Accelerator()
    accelerator.state.distributed_type = DistributedType.FSDP
    assert accelerator.distributed_type == PartialState().distributed_type == AcceleratorState().distributed_type \
        == DistributedType.FSDP
    with pytest.warns(UserWarning, match="only supported for multi-GPU"):
        with accelerator.join_uneven_inputs([torch.nn.Linear(1, 1)]):
            pass
    with pytest.raises(ValueError):
        accelerator.state.distributed_type = "NOT_A_TYPE"
    assert Accelerator().distributed_type == DistributedType.NO


def test_reset_state_cuts_the_accelerator_off(fresh_state):
    from tasktrain import Accelerator
    from tasktrain.state import AcceleratorState

    accelerator = Accelerator()
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError) as raised:
        accelerator.prepare(torch.nn.Linear(1, 1))
    # the fragments Accelerate's test_reinstantiated_state looks for, and what to do
    assert "`AcceleratorState` object has no attribute" in str(raised.value)
    assert "This happens if `AcceleratorState._reset_state()`" in str(raised.value)
    assert "make a new Accelerator()" in str(raised.value)
    with pytest.raises(RuntimeError, match="create Accelerator"):
        AcceleratorState()
    fresh = Accelerator()
    assert AcceleratorState().mixed_precision == "no" and fresh.prepare(torch.nn.Linear(1, 1)) is not None


def test_gradient_state_reads_the_accelerator_and_its_loader():
    from tasktrain import Accelerator, GradientAccumulationPlugin
    from tasktrain.state import GradientState

    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    outer, inner = accelerator.prepare(DataLoader(list(range(10)), batch_size=4),
                                       DataLoader(list(range(3)), batch_size=2))
    view = accelerator.gradient_state
    assert view.active_dataloader is None and not view.in_dataloader and view.remainder == -1
    assert view.num_steps == 2 and view.adjust_scheduler and view.sync_with_dataloader
    seen = []
    for i, _ in enumerate(outer):
        with accelerator.accumulate():
            seen.append((view.active_dataloader is outer, view.end_of_dataloader, view.remainder,
                         view.sync_gradients, GradientState().sync_gradients))
        if i == 0:
            for _ in inner:  # the innermost loader is the active one while it runs
                assert view.active_dataloader is inner and view.dataloader_references == [None, outer, inner]
            assert view.end_of_dataloader is False and view.active_dataloader is outer
    # 3 batches of 4, 4, 2: the end only at the last; remainder 10 % 4; the window of 2 cut by the loader's end
    assert seen == [(True, False, 2, False, False), (True, False, 2, True, True), (True, True, 2, True, True)]
    assert view.active_dataloader is None and view.end_of_dataloader is False
    with pytest.raises(AttributeError):
        view.sync_gradients = False  # the Accelerator's loop sets it
    with pytest.raises(TypeError, match="Accelerator"):
        GradientState(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    GradientState._reset_state()
    assert accelerator.gradient_state.num_steps == 2


def test_split_between_processes_takes_a_hugging_face_dataset():
    datasets = pytest.importorskip("datasets")
    from tasktrain.state import PartialState

    data = datasets.Dataset.from_list([{"k": v} for v in range(3)])
    with PartialState().split_between_processes(data) as mine:  # one process: all of it
        assert mine["k"] == [0, 1, 2]


# -- two processes ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from test_accelerator import SCRIPTS, launch

    tmp_path = tmp_path_factory.mktemp("names")
    out = tmp_path / "out"
    out.mkdir()
    launch(["--num_processes", "2", os.path.join(SCRIPTS, "names_worker.py"), str(out)], tmp_path, timeout=240)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_reduce_max_min_on_two_processes(two_ranks):
    for result in two_ranks:  # rank 0 holds [1, 4], rank 1 [2, 3]
        assert result["distributed_type"] == "MULTI_CPU"
        assert result["max"] == [2.0, 4.0] and result["min"] == [1.0, 3.0] and result["accelerator_max"] == [2.0, 4.0]


def test_debug_mode_raises_on_mismatched_shapes_only(two_ranks):
    for rank, result in enumerate(two_ranks):
        assert result["debug_from_env"] is True and result["debug_off"] is False
        assert result["gather_same_shapes"] == [1.0, 4.0, 2.0, 3.0]  # equal shapes: no error
        assert result["pad_same_ndim"] == ([0, 1, 2, 0] if rank == 0 else [0, 1, 2, 3])
        for name, message in result["raised"].items():
            assert message is not None, f"{name} did not raise on rank {rank}"
            assert "process 0: [(1, 5)]" in message, message
        assert "process 1: [(1, 1, 6)]" in result["raised"]["pad_across_processes"]
        assert "number of dimensions" in result["raised"]["pad_across_processes"]
        assert "process 1: [(1, 2, 5)]" in result["raised"]["reduce"]


def test_copy_and_rng_states_on_two_processes(two_ranks):
    first, second = two_ranks
    assert first["copied"] == second["copied"] == [1, 2, 3] and second["copied_dtype"] == "torch.int32"
    assert first["rng_before"] != second["rng_before"]  # seeded apart, then rank 0's state everywhere
    assert first["rng_after"] == second["rng_after"] and first["generator_after"] == second["generator_after"]


def test_gradient_state_on_two_processes(two_ranks):
    for result in two_ranks:
        assert result["before_loop"] == result["after_loop"] == [True, False, False, -1]
        steps = result["steps"]
        assert len(steps) == result["batches"] and all(s["active"] and s["in"] for s in steps)
        assert [s["end"] for s in steps] == [False] * (len(steps) - 1) + [True]
        assert [s["global_view_end"] for s in steps] == [s["end"] for s in steps]
        assert all(s["remainder"] == 10 % 4 and s["num_steps"] == 2 for s in steps)  # 10 samples, 2 x 2 a batch
        assert steps[0]["sync"] is False and steps[-1]["sync"] is True


def test_assigned_type_trigger_sync_and_destroy_on_two_processes(two_ranks):
    for result in two_ranks:
        assert result["assigned"] == ["FSDP", "FSDP"]
        assert len(result["join_warning"]) == 1 and "only supported for multi-GPU" in result["join_warning"][0]
        assert result["grads_differ_before"] and result["grads_equal_after"]
        assert result["destroyed"]


def test_save_state_into_a_folder_per_process_is_refused_on_every_rank(two_ranks):
    for result in two_ranks:
        message, written = result["own_folders"]
        assert "different folders" in message and "own_folder_0" in message and "own_folder_1" in message
        assert written is False


def test_patch_environment_sets_upper_cased_names_and_restores_them(monkeypatch):
    import os

    from tasktrain.utils import patch_environment

    monkeypatch.setenv("TT_KEPT", "before")
    monkeypatch.delenv("TT_NEW", raising=False)
    with patch_environment(tt_kept=1, tt_new="x"):
        assert os.environ["TT_KEPT"] == "1" and os.environ["TT_NEW"] == "x"
    assert os.environ["TT_KEPT"] == "before" and "TT_NEW" not in os.environ
