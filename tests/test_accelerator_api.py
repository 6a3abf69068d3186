"""Accelerate's Accelerator API on one process: automatic checkpoint naming, scheduler stepping, handlers,
profile, find_executable_batch_size, utils; then tests/accelerator_scripts/api_worker.py, a script in Accelerate's
style that uses every Accelerator name of docs/accelerator.md, run on one process and on two through
`tasktrain launch` (MULTI_GPU and DEEPSPEED YAMLs) (test_accelerate_style_script_on_one_and_two_processes), its
trackers read back."""
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
    assert "aten::linear" in (tmp_path / "profile_0.json").read_text()


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


# -- the Accelerate-style script on 1 and 2 processes -----------------------------------------------------------------
def read_scalars(directory, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


LAUNCH_YAMLS = {  # Accelerate's keys; on this machine's CPUs the DDP one is MULTI_CPU to the Accelerator
    "MULTI_GPU": "distributed_type: MULTI_GPU\nnum_processes: 2\n",
    "DEEPSPEED": "distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\ndeepspeed_config:\n  zero_stage: 2\n",
    "FSDP": ("distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n  fsdp_version: 2\n"
             "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_reshard_after_forward: true\n"
             "  fsdp_use_orig_params: true\n"),
}
TOL = 1e-5  # FSDP against DDP in fp32: docs/fsdp.md (the gradient sums of 2 ranks added in another order)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launch_type", [None, "MULTI_GPU", "DEEPSPEED", "FSDP"],
                         ids=["one-process", "multi-gpu", "deepspeed", "fsdp"])
def test_accelerate_style_script_on_one_and_two_processes(tmp_path, launch_type):
    import json
    import subprocess
    import sys

    from test_accelerator import SCRIPTS, clean_env, launch

    out = tmp_path / "out"
    out.mkdir()
    script = os.path.join(SCRIPTS, "api_worker.py")
    processes = 1 if launch_type is None else 2
    if processes == 1:
        run = subprocess.run([sys.executable, script, str(out)], cwd=tmp_path, env=clean_env(tmp_path),
                             capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        output = run.stdout
    else:
        (tmp_path / "multi.yaml").write_text(LAUNCH_YAMLS[launch_type])
        output = launch(["--config_file", str(tmp_path / "multi.yaml"), script, str(out)], tmp_path, timeout=240)
    assert output.count("printed by the main process only") == 1
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)]
    everything = list(range(22))
    for r, result in enumerate(ranks):
        assert result["num_processes"] == processes and result["order"] == ["main_first", "local_first"]
        assert result["trigger"] is True and result["trigger_cleared"] is False  # set on the last process only
        assert result["gather"] == [i for p in range(processes) for i in (p, p)]
        assert result["gather_object"] == [f"r{p}" for p in range(processes)]  # flat, as Accelerate
        assert result["broadcast"] == [10] and result["reduce"] == sum(range(1, processes + 1))
        assert result["utils_reduce_mean"] == sum(range(1, processes + 1)) / processes
        # each sample once, in dataset order; lists of objects flat and in the same order
        assert result["gather_for_metrics"] == everything
        assert result["gather_for_metrics_objects"] == [f"s{i}" for i in everything]
        assert result["checkpoints"] == ["checkpoint_1", "checkpoint_2"] and result["counter"] == 2
        assert result["save_iteration"] == 3 and result["no_sync_differs"]
        assert (out / "traces" / f"profile_{r}.json").exists()
        expected_type = {None: "NO", "MULTI_GPU": "MULTI_CPU", "DEEPSPEED": "DEEPSPEED", "FSDP": "FSDP"}[launch_type]
        if expected_type == "MULTI_CPU" and torch.cuda.device_count() >= 2:
            expected_type = "MULTI_GPU"
        assert result["distributed_type"] == expected_type
        if launch_type == "DEEPSPEED":
            assert "keeps them in its own shards (DeepSpeed)" in result["portable"]  # Accelerate's layout refused
        elif launch_type == "FSDP":
            assert "keeps them in shards on every rank (FSDP)" in result["portable"]
        else:
            assert result["portable"] == sorted(["accelerator_state.pt", "custom_checkpoint_0.pkl",
                                                 "model.safetensors", "optimizer.bin", "scheduler.bin"]
                                                + [f"random_states_{p}.pkl" for p in range(processes)]) + [2]
    main = ranks[0]
    if processes == 1:
        assert main["split"] == [0, 1, 2, 3, 4] and main["decorated"] == ["main", "last", "index", "local main"]
        assert main["syncs"] == [False, True] * 3 and main["lr"] == pytest.approx(0.1 * 0.5 ** 3)
        assert main["padded"] == [1.0] and main["skipped_first"] == [8, 9, 10, 11]
    else:
        last = ranks[1]
        assert (main["split"], last["split"]) == ([0, 1, 2], [3, 4, 4])  # apply_padding repeats the last item
        assert (main["split_dict"], last["split_dict"]) == ([0, 1, 2], [3, 4])
        assert main["decorated"] == ["main", None, None, "local main"]
        assert last["decorated"] == [None, "last", "index", None]
        # Accelerate's rule: 2 optimizer steps, each stepping the scheduler once per process
        assert main["syncs"] == [False, True, True] and main["lr"] == pytest.approx(0.1 * 0.5 ** (2 * 2))
        assert main["padded"] == [1.0, -1.0, 1.0, 1.0] and last["utils_padded_first"] == [1.0, 1.0]
        assert main["utils_padded_first"] == [0.0, 1.0]
        # Accelerate's order: whole batches per process, the last one refilled from the epoch's start
        assert (main["skipped_first"], last["skipped_first"]) == ([16, 17, 18, 19], [20, 21, 0, 1])
        assert main["tracker"] == "SummaryWriter" and last["tracker"] == "GeneralTracker"
    if launch_type == "FSDP":
        assert "fsdp_config.fsdp_use_orig_params" in output  # reported as ignored by the launcher
        check_fsdp_cases(out, tmp_path)
    # The trackers, read back: written by the main process only, one row / scalar per log call.
    run_dir = out / "project" / "api"
    steps = [s for s, _ in read_scalars(run_dir, "loss")]
    assert steps == ([0, 1, 1, 2, 2, 3] if processes == 1 else [0, 1, 2])  # the optimizer steps done at each log
    assert "lr: 0.1" in (run_dir / "hparams.yaml").read_text()
    rows = (run_dir / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + len(steps)
    assert len([f for f in os.listdir(run_dir) if f.startswith("events.out")]) == 1
    # save_model(safe_serialization=True) wrote the weights once
    from safetensors.torch import load_file

    assert set(load_file(str(out / "model" / "model.safetensors"))) == {"weight", "bias"}


def check_fsdp_cases(out, tmp_path):
    """tests/accelerator_scripts/fsdp_cases.py, run inside the FSDP launch above, then its state loaded on 1 process."""
    import subprocess
    import sys

    from test_accelerator import SCRIPTS, clean_env

    ranks = [torch.load(out / f"fsdp_rank{r}.pt", weights_only=False) for r in range(2)]
    assert "strategy=fsdp (reshard_after_forward=True, state_dict_type=sharded), world_size=2" in ranks[0]["strategy"]
    for res in ranks:
        ddp, fsdp = res["ddp"], res["fsdp"]
        assert len(ddp["losses"]) == len(fsdp["losses"]) == 12 and len(fsdp["norms"]) == 6
        assert max(ddp["norms"]) > 0.2  # clipping (to 0.2) clipped
        # FSDP and its plugin (no resharding, a unit per Linear) train as DDP: loss by loss, norm by norm
        for run in (fsdp, res["plugin"]):
            torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(ddp["losses"]), rtol=0, atol=TOL)
            torch.testing.assert_close(torch.tensor(run["norms"]), torch.tensor(ddp["norms"]), rtol=0, atol=TOL)
            for key, value in ddp["weights"].items():
                torch.testing.assert_close(run["weights"][key], value, rtol=0, atol=TOL)
        # accumulation: no reduce-scatter in a window's first micro-batch, one per unit with parameters at its last
        # (the default wraps each child that holds some: the 3 Linear; the root holds none of its own)
        scatters = fsdp["scatters"]
        assert scatters[0] == 0 and all(scatters[i] == scatters[i - 1] for i in range(2, 12, 2))
        assert all(scatters[i] - scatters[i - 1] == 3 for i in range(1, 12, 2))
        assert res["unwrapped_is_model"]
        assert res["plugin_wrapped"] == ["0", "2", "4", ""]
        assert any("use_orig_params is ignored" in w for w in res["plugin_warnings"])
        # save_state mid-epoch, loaded by a fresh Accelerator: the rest of the run is the straight run's, exactly
        assert res["before_save"]["losses"] + res["resumed"]["losses"] == fsdp["losses"]
        assert all(torch.equal(res["resumed"]["weights"][k], v) for k, v in fsdp["weights"].items())
        assert {".metadata", "accelerator_state.pt", "__0_0.distcp", "__1_0.distcp"} <= set(res["state_files"])
        assert res["early_optimizer_stepped"]
        assert "steps parameters of no prepared model" in res["orphan"]
        assert res["built_on_meta"] and res["meta_local_rows"] == 16 and res["meta_halves_differ"]
        assert 0.05 < res["meta_weight_std"] < 1
    assert ranks[0]["local_numel"] + ranks[1]["local_numel"] == ranks[0]["full_numel"]  # each rank its shard
    # The 2-process state on 1 process: the weights and learning rate at the save; the epoch goes on from there
    # (2 processes had taken 2 batches of 8 each of its 96 samples: 64 left, 8 batches of 8 on 1 process).
    run = subprocess.run([sys.executable, os.path.join(SCRIPTS, "fsdp_cases.py"), str(out)], cwd=tmp_path,
                         env=clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    one = torch.load(out / "one_process.pt", weights_only=False)
    # 4 optimizer steps on 2 processes: 8 scheduler steps (Accelerate's rule), StepLR(step_size=2) halved four times
    assert one["difference"] == 0.0 and one["lr"] == one["saved_lr"] == 1e-2 * 0.5 ** 4
    assert one["micro_batches_after"] == 8 and one["steps_after"] == 4
    assert one["more"]  # bf16 plugin, SGD state, late optimizer, compiled, init_empty_weights (asserted inside)


def test_log_with_all_writes_tensorboard_wandb_and_mlflow_and_reads_back(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from test_loggers import scalars, wandb_history

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("WANDB_MODE", "offline")
    accelerator = Accelerator(log_with="all", project_dir=str(tmp_path))
    accelerator.init_trackers("acc", config={"lr": 0.5}, init_kwargs={"wandb": {"dir": str(tmp_path)}})
    assert [t.name for t in accelerator.trackers] == ["tensorboard", "wandb", "mlflow"]
    for step in range(2):
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
    run = accelerator.get_tracker("wandb", unwrap=True)
    run_id = accelerator.get_tracker("mlflow", unwrap=True).info.run_id
    with pytest.raises(ValueError, match="not one of this Accelerator's trackers"):
        accelerator.get_tracker("csv")
    accelerator.end_training()
    assert accelerator.trackers == [] and mlflow.active_run() is None
    points, _ = scalars(str(tmp_path / "acc"), "loss")
    assert points == [(0, 1.0), (1, 0.5)]
    assert [(row["_step"], row["loss"]) for row in wandb_history(run) if "loss" in row] == [(0, 1.0), (1, 0.5)]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(0, 1.0), (1, 0.5)]
    assert client.get_run(run_id).data.params == {"lr": "0.5"}
