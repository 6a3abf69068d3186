"""Accelerate's Accelerator API on one process: automatic checkpoint naming, scheduler stepping, handlers,
profile, find_executable_batch_size, utils. The two-process run of the same names is
tests/accelerator_scripts/api_worker.py (test_accelerator_api_two_processes)."""
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import (Accelerator, AutocastKwargs, GradScalerKwargs, ProfileKwargs, ProjectConfiguration,
                       find_executable_batch_size)
from tasktrain.utils import gather_object, pad_across_processes, send_to_device, set_seed


def small():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    return model, optimizer, data


def test_save_state_names_checkpoints_and_keeps_total_limit(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(project_config=config)
    model, optimizer, data = accelerator.prepare(*small())
    written = []
    for _ in range(3):
        (x,) = next(iter(data))
        accelerator.backward(model(x).sum())
        optimizer.step()
        written.append(accelerator.save_state())
    root = tmp_path / "checkpoints"
    assert written == [str(root / f"checkpoint_{i}") for i in range(3)]
    assert sorted(os.listdir(root)) == ["checkpoint_1", "checkpoint_2"]  # the oldest went, after the newest was whole
    last = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    accelerator.project_configuration.iteration = 0
    accelerator.load_state()  # the newest, and the next save continues the numbering
    assert torch.equal(model.weight, last) and accelerator.save_iteration == 3
    with pytest.raises(ValueError, match="exists already"):
        accelerator.project_configuration.iteration = 2
        accelerator.save_state()
    with pytest.raises(ValueError, match="automatic_checkpoint_naming=True"):
        Accelerator().save_state()


def test_step_scheduler_with_optimizer_false_steps_at_every_call():
    for with_optimizer, expected in ((True, 2), (False, 4)):
        accelerator = Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=with_optimizer)
        model, optimizer, data = small()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
        for (x,) in data:
            with accelerator.accumulate(model):
                accelerator.backward(model(x).sum())
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        assert scheduler.scheduler.last_epoch == expected


def test_grad_scaler_and_autocast_handlers(monkeypatch):
    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=8.0)])
    assert accelerator.strategy.precision.scaler.get_scale() == 8.0
    accelerator = Accelerator(mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(enabled=False)])
    with accelerator.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32  # autocast off, as asked
    accelerator = Accelerator(mixed_precision="bf16")
    with accelerator.autocast(autocast_handler=AutocastKwargs(enabled=False)):
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32
    with accelerator.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16  # only inside that block


def test_profile_writes_a_trace(tmp_path):
    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path), record_shapes=True)])
    with accelerator.profile() as profiler:
        torch.nn.Linear(4, 4)(torch.randn(3, 4))
    assert any("aten::linear" in event.key for event in profiler.key_averages())
    assert "aten::linear" in (tmp_path / "trace_rank_0.json").read_text()


def test_find_executable_batch_size_shrinks_on_out_of_memory():
    tried = []

    @find_executable_batch_size(starting_batch_size=100)
    def train(batch_size, scale):
        tried.append(batch_size)
        if batch_size > 75:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return batch_size * scale

    assert train(2) == 144 and tried == [100, 90, 81, 72]

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size):
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()


def test_utils_on_one_process():
    set_seed(3)
    first = torch.rand(1)
    set_seed(3)
    assert torch.equal(first, torch.rand(1))
    assert gather_object([1, 2]) == [1, 2]
    assert torch.equal(pad_across_processes(torch.ones(2)), torch.ones(2))
    moved = send_to_device({"a": torch.ones(1), "b": [torch.zeros(1)], "c": "text"}, "cpu")
    assert moved["c"] == "text" and moved["b"][0].device.type == "cpu"
