"""Accelerate's LocalSGD, DDP communication hooks (DistributedDataParallelKwargs and the DDP strategy's Lightning
arguments) and schedule-free optimizers (issue 41).

The two-process checks run in ONE `tasktrain launch` of tests/accelerator_scripts/features_worker.py, which writes
what it measured; the argument checks and the schedule-free runs are one process, here."""
import os
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from test_accelerator import SCRIPTS, launch
from tasktrain import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs, seed_everything
from tasktrain.strategies import ddp as ddp_module
from tasktrain.strategies.ddp import DDP


# -- two processes ----------------------------------------------------------------------------------------------------
def test_local_sgd_comm_hooks_and_post_local_sgd_on_two_processes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    launch(["--num_processes", "2", os.path.join(SCRIPTS, "features_worker.py"), str(out)], tmp_path, timeout=240)
    ranks = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    for result in ranks:
        # LocalSGD(local_sgd_steps=3): no gradient all-reduce; the parameters drift apart between two averages and
        # are, right after one, the mean of the two processes' parameters (a hand computation)
        steps = result["local_sgd_steps"]
        assert [s["num_steps"] for s in steps] == list(range(1, 9))
        assert not any(s["grads_equal"] for s in steps)
        for s in steps:
            averaged = s["num_steps"] % 3 == 0
            assert s["equal_after"] == averaged and s["changed"] == averaged, s
            if averaged:
                assert s["vs_hand_mean"] <= 1e-7, s
            else:
                assert s["vs_hand_mean"] > 1e-3, s  # each process still holds its own parameters
        # the `with` ends with an average (of 2 local steps here)
        assert result["local_sgd_final_equal"] and result["local_sgd_final_vs_mean"] <= 1e-7
        # save_state after 5 steps (between averages), a new Accelerator's load_state: the same 3 last steps
        assert result["resumed_num_steps"] == [6, 7, 8]
        assert result["resume_local_difference"] == 0.0 and result["resume_final_difference"] == 0.0

        # FP16 compression: the gradient is the fp16-rounded mean (each rank's gradient in fp16 / 2, summed in fp16)
        assert result["fp16_vs_hand"] == 0.0
        assert 0.0 < result["fp16_vs_exact"] <= 1e-3 * result["fp16_scale"]
        # PowerSGD, rank 1 from its third step: an exact all-reduce before, then a rank-1 gradient that differs
        # from the exact mean (whose second singular value is not small)
        for name in ("power_sgd", "power_sgd_fp16"):
            power = result[name]
            assert power["equal_on_ranks"]
            assert power["vs_exact"] > 1e-2 and power["exact_second_singular_value"] > 0.1
            assert power["second_singular_value"] < (1e-6 if name == "power_sgd" else 1e-3)
        assert result["power_sgd"]["warmup_vs_exact"] == 0.0
        assert 0.0 < result["power_sgd_fp16"]["warmup_vs_exact"] <= 1e-3  # the fp16 wrapper rounds even then
        # what gloo cannot run is refused when the Accelerator starts, naming what to use
        refusals = result["refusals"]
        assert "NCCL" in refusals["bf16"] and "fp16" in refusals["bf16"]
        assert "NCCL" in refusals["bf16_wrapper"]
        if ddp_module._batched_power_sgd_works():  # torch 2.13's batched PowerSGD is broken everywhere
            assert refusals["batched"] is None
        else:
            assert "POWER_SGD" in refusals["batched"]
        # the Trainer's DDP(ddp_comm_state=PostLocalSGDState(start_localSGD_iter=2), post_localSGD_hook,
        # model_averaging_period=2): all-reduced steps 0-1, then local steps averaged at steps 2 and 4
        assert result["post_local_sgd_equal_per_step"] == [True, True, True, False, True, False]
    assert ranks[0]["local_sgd_steps"][0]["vs_hand_mean"] != ranks[1]["local_sgd_steps"][0]["vs_hand_mean"]


# -- one process: LocalSGD --------------------------------------------------------------------------------------------
def test_local_sgd_on_one_process_is_a_pass_through_and_refuses_sharding_engines():
    from tasktrain.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=None, enabled=False) as local_sgd:
        local_sgd.step()
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        assert not local_sgd.enabled  # one process: nothing to average
        local_sgd.step()
        local_sgd.step()
    assert local_sgd.num_steps == 2 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))

    from tasktrain.strategies.base import Sharded

    class Engine(Sharded):
        def module_init_context(self, empty_init=False):
            raise AssertionError("not called")

        def describe(self):
            return "strategy=deepspeed_stage_2"

    engine = types.SimpleNamespace(use_distributed=True, strategy=Engine())
    with pytest.raises(NotImplementedError, match="use it with DDP"):
        LocalSGD(accelerator=engine, model=model, local_sgd_steps=2)


def test_local_sgd_checks_its_arguments(monkeypatch):
    from tasktrain.local_sgd import LocalSGD
    from tasktrain.trainer.accelerator import Accelerator as CoreAccelerator

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    monkeypatch.setattr(CoreAccelerator, "use_distributed", property(lambda self: True))
    monkeypatch.setattr(accelerator, "strategy", DDP())
    with pytest.raises(ValueError, match="local_sgd_steps=0"):
        LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=0)
    with pytest.raises(ValueError, match="the model accelerator.prepare returned"):
        LocalSGD(accelerator=accelerator, model=torch.nn.Linear(2, 1), local_sgd_steps=2)


# -- one process: the hook arguments ----------------------------------------------------------------------------------
def test_accelerate_and_lightning_hook_arguments_are_checked_before_anything_starts():
    from accelerate.utils import DDPCommunicationHookType as Theirs

    assert {m.name: m.value for m in DDPCommunicationHookType} == {m.name: m.value for m in Theirs}
    for handler, message in (
            (DistributedDataParallelKwargs(comm_wrapper="fp16"), "without comm_hook"),
            (DistributedDataParallelKwargs(comm_state_option={"matrix_approximation_rank": 2}), "without comm_hook"),
            (DistributedDataParallelKwargs(comm_hook="fp16", comm_state_option={"x": 1}), "PowerSGD's options"),
            (DistributedDataParallelKwargs(comm_hook="fp32"), "use one of"),
            (DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper="power_sgd"), "FP16 or BF16")):
        with pytest.raises(ValueError, match=message):
            Accelerator(cpu=True, kwargs_handlers=[handler])
    with pytest.raises(TypeError, match="PowerSGDState arguments"):
        Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="power_sgd",
                                                                             comm_state_option={"rank": 2})])
    options = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD, comm_wrapper="fp16",
                                            comm_state_option={"matrix_approximation_rank": 2}).comm_options()
    assert options["ddp_comm_hook"].__name__ == "powerSGD_hook"
    assert options["ddp_comm_state"].matrix_approximation_rank == 2

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook

    state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2)
    with pytest.raises(ValueError, match="needs model_averaging_period"):
        DDP(ddp_comm_state=state, ddp_comm_hook=post_localSGD_hook.post_localSGD_hook)
    with pytest.raises(ValueError, match="PostLocalSGDState"):
        DDP(ddp_comm_hook=default_hooks.fp16_compress_hook, model_averaging_period=2)
    with pytest.raises(ValueError, match="positive integer"):
        DDP(ddp_comm_state=state, ddp_comm_hook=post_localSGD_hook.post_localSGD_hook, model_averaging_period=0)
    with pytest.raises(ValueError, match="without ddp_comm_hook"):
        DDP(ddp_comm_wrapper=default_hooks.fp16_compress_wrapper)
    with pytest.raises(TypeError, match="pass a function"):
        DDP(ddp_comm_hook="fp16")
    strategy = DDP()
    strategy.configure_processes(ddp_kwargs={"ddp_comm_hook": default_hooks.fp16_compress_hook, "bucket_cap_mb": 5})
    assert strategy.comm["ddp_comm_hook"] is default_hooks.fp16_compress_hook and strategy.ddp_kwargs == {
        "bucket_cap_mb": 5}


@pytest.mark.parametrize("works", [True, False])
def test_the_hooks_refused_on_this_backend(monkeypatch, works):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    monkeypatch.setattr(ddp_module, "_batched_power_sgd_works", lambda: works)
    check = ddp_module._check_hook_runs_here
    for backend in ("gloo", "nccl"):
        check(default_hooks.fp16_compress_hook, None, backend)
        check(powerSGD_hook.powerSGD_hook, default_hooks.fp16_compress_wrapper, backend)
    check(default_hooks.bf16_compress_hook, None, "nccl")
    check(powerSGD_hook.powerSGD_hook, default_hooks.bf16_compress_wrapper, "nccl")
    for hook, wrapper in ((default_hooks.bf16_compress_hook, None),
                          (powerSGD_hook.powerSGD_hook, default_hooks.bf16_compress_wrapper)):
        with pytest.raises(ValueError, match="NCCL"):
            check(hook, wrapper, "gloo")
    if works:
        check(powerSGD_hook.batched_powerSGD_hook, None, "gloo")
    else:
        with pytest.raises(ValueError, match="batched_powerSGD_hook fails"):
            check(powerSGD_hook.batched_powerSGD_hook, None, "gloo")


# -- one process: schedule-free optimizers ----------------------------------------------------------------------------
def test_is_schedulefree_available_answers_for_this_process(monkeypatch):
    from tasktrain.compat.accelerate.utils import imports
    from tasktrain.utils import is_schedulefree_available

    assert is_schedulefree_available() == (imports._has("schedulefree"))
    monkeypatch.setattr(imports, "_has", lambda module: False)
    assert is_schedulefree_available() is False
    monkeypatch.setattr(imports, "_has", lambda module: module == "schedulefree")
    assert is_schedulefree_available() is True


def _schedule_free_data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(24, 4, generator=g), torch.randn(24, 1, generator=g))


def _schedule_free_epochs(model, optimizer, loader, epochs, backward=None, after_epoch=None):
    """Accelerate's schedule_free example: train() both, the epoch, eval() both (the weights to evaluate)."""
    for epoch in epochs:
        model.train()
        optimizer.train()
        for source, target in loader:
            loss = F.mse_loss(model(source), target)
            (backward or torch.Tensor.backward)(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        optimizer.eval()
        if after_epoch is not None:
            after_epoch(epoch)


def _schedule_free_objects():
    import schedulefree

    seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = schedulefree.AdamWScheduleFree(model.parameters(), lr=0.05, warmup_steps=3)
    return model, optimizer, DataLoader(_schedule_free_data(), batch_size=4)


def test_the_schedule_free_example_trains_as_a_hand_written_loop_and_resumes_exactly(tmp_path):
    model, optimizer, loader = _schedule_free_objects()
    _schedule_free_epochs(model, optimizer, loader, range(3))
    hand = {k: v.clone() for k, v in model.state_dict().items()}

    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(*_schedule_free_objects())
    start = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}

    def save_after_first(epoch):
        if epoch == 0:
            accelerator.save_state(tmp_path / "state")  # in eval mode, as the example evaluates each epoch

    _schedule_free_epochs(model, optimizer, loader, range(3), accelerator.backward, save_after_first)
    mine = accelerator.unwrap_model(model).state_dict()
    assert all(torch.equal(hand[k], mine[k]) for k in hand)
    assert not all(torch.equal(start[k], mine[k]) for k in hand)
    assert optimizer.param_groups[0]["train_mode"] is False  # eval() reached the optimizer through the wrapper

    resumed = Accelerator(cpu=True)
    model, optimizer, loader = resumed.prepare(*_schedule_free_objects())
    resumed.load_state(tmp_path / "state")
    _schedule_free_epochs(model, optimizer, loader, range(1, 3), resumed.backward)
    again = resumed.unwrap_model(model).state_dict()
    assert all(torch.equal(hand[k], again[k]) for k in hand)


def test_train_and_eval_pass_through_every_prepared_optimizer():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    calls = []

    class WithModes(torch.optim.SGD):
        def train(self):
            calls.append("train")

        def eval(self):
            calls.append("eval")

    _, with_modes = accelerator.prepare(model, WithModes(model.parameters(), lr=0.1))
    with_modes.train()
    with_modes.eval()
    assert calls == ["train", "eval"]
    plain = accelerator.prepare(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
    plain.train()  # an optimizer without modes: nothing to switch, as in Accelerate
    plain.eval()
