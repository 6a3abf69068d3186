"""ModelParallelStrategy (issue 39): tensor x data parallel on one DeviceMesh, with real processes (gloo).

One 4-process launch (tests/mesh_scripts/train.py --case mesh) trains a tiny Llama-like model (ColwiseParallel /
RowwiseParallel, SequenceParallel, loss_parallel; fully_shard on the data-parallel mesh) on a (dp=2, tp=2) mesh, then
resumes its step-3 checkpoint on the same mesh (a DCP directory and a one-file checkpoint), on dp-only (4, 1) and
tp-only (1, 4), and runs the Accelerator with ParallelismConfig(dp_shard_size=2, tp_size=2) in a loop of its own.
In the test's own process, one process trains the same model on the full batch without any parallelism
(the reference: in the order the Trainer's shuffled DistributedSampler gives a sequential loader under a distributed
strategy, as Lightning's; the Accelerator's runs keep the loader's sequential order, Accelerate's rule, so theirs is
the `sequential` reference) and resumes the DCP checkpoint on one process.

Tolerances against the reference: the (2, 2) run computes the same sums in another order: the gradients of two
data-parallel halves are averaged by a reduce-scatter instead of summed in one backward, and every row-parallel
matmul adds two partial products through an all-reduce. In fp32 that moves the last bits of each value (~1e-7
relative). AdamW divides by sqrt(v) + eps, which amplifies such differences on parameters whose gradient is near
zero (embedding rows of tokens seen rarely: measured 2.5e-5 to 3.5e-5 after 10 steps at lr 1e-2, largest on the
embedding; on 2026-12-07's machine 9.2e-5 after 10 steps, and 9.4e-5 after the 6 steps the runs now take, saved after
3: the difference is there from the first steps, not grown by more of them), so parameters are compared at 1e-4; losses
at 1e-5 (measured 6e-7 to 7e-7 after 6 steps and after 10). A real error (one dp half's
gradient missing, a tensor-parallel shard not reduced, the wrong batch for a rank) moves both by 1e-2 or more.
Resumes on another mesh load identical parameters (the checkpoint holds them exactly: compared bitwise), and then
continue within the same kind of tolerance.
"""
import glob
import os
import subprocess
import sys

import pytest
import torch

from tasktrain import ModelParallelStrategy, TaskModule, Trainer
from tasktrain.strategies.registry import strategy_from_name

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mesh_scripts", "train.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
LOSS_TOL, PARAM_TOL = 1e-5, 1e-4


def run(*args, timeout=300, cwd=None):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), *filter(None, [env.get("PYTHONPATH")])])  # this copy
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)  # in the run's folder: what a save writes beside it (.last_checkpoint.json) too
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def biggest_difference(a, b):
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def logged_losses(folder):
    """train_loss per step as the CSV logger wrote it (rank 0, after self.log's sync_dist reduction)."""
    import csv

    with open(os.path.join(folder, "metrics.csv")) as f:
        return [float(row["train_loss"]) for row in csv.DictReader(f) if row.get("train_loss")]


def identical(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mesh_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mesh")
    mesh = run(SCRIPT, "--root", str(root), "--out", str(root / "mesh"), "--case", "mesh", timeout=400, cwd=root)
    ranks = [torch.load(root / f"mesh.rank{r}.pt", weights_only=False) for r in range(4)]
    # The one-process runs here (a world of one of our own; no second interpreter to start): the reference, on the
    # full batch without any parallelism, and the (1, 1) mesh resumed from the (2, 2) checkpoint.
    train = script()
    reference = train.fit(0, 1, train.BATCH, train.STEPS, csv=str(root / "reference"), shuffled=True)
    sequential = train.fit(0, 1, train.BATCH, train.STEPS)
    one = train.fit(1, 1, train.BATCH, train.STEPS, ckpt=str(root / "saved.ckpt"), csv=str(root / "one"))
    return dict(root=root, ranks=ranks, single=dict(reference=reference, sequential=sequential, one=one),
                log=mesh.stdout + mesh.stderr, steps=train.STEPS, save_at=train.SAVE_AT)


def test_a_2d_mesh_trains_like_one_process_on_the_full_batch(runs):
    reference, ranks = runs["single"]["reference"], runs["ranks"]
    a = [r["A"] for r in ranks]
    # The ranks of a tensor-parallel group read the same batch (same loss); the data-parallel groups different ones
    assert a[0]["losses"] == a[1]["losses"] and a[2]["losses"] == a[3]["losses"]
    assert a[0]["losses"] != a[2]["losses"]
    assert all(r["data_parallel"] == 2 for r in a)
    # the full batch's loss is the mean of the two data-parallel halves' losses (equal halves of it)
    for step, expected in enumerate(reference["losses"]):
        assert abs((a[0]["losses"][step] + a[2]["losses"][step]) / 2 - expected) < LOSS_TOL, step
    # what self.log(sync_dist=True) reports is reduced over data parallel: the full batch's loss too
    logged, reference_logged = logged_losses(runs["root"] / "A"), logged_losses(runs["root"] / "reference")
    assert len(logged) == len(reference_logged) == runs["steps"]
    assert max(abs(x - y) for x, y in zip(logged, reference_logged)) < LOSS_TOL
    assert biggest_difference(a[0]["end"], reference["end"]) < PARAM_TOL
    assert biggest_difference(a[0]["end"], reference["start"]) > 1e-2  # it trained: the comparison means something
    assert all(identical(r["end"], a[0]["end"]) for r in a)  # full_state_dict gathers the same weights everywhere
    # reduce("sum") counts each tensor-parallel group once: 1 per data-parallel rank
    assert all(s == 2.0 for r in a for s in r["summed"])
    assert "strategy=model_parallel (data_parallel=2, tensor_parallel=2" in runs["log"]


def test_resume_on_the_same_mesh_is_exact(runs):
    r0 = runs["ranks"][0]
    at_save = r0["A_file"]["end"]  # the run that wrote the one-file checkpoint stopped at step save_at
    for name in ("B", "B_file"):  # from the DCP directory, and from the one file
        assert identical(r0[name]["start"], at_save), name
        assert r0[name]["losses"] == r0["A"]["losses"][runs["save_at"]:], name
        assert identical(r0[name]["end"], r0["A"]["end"]), name


def test_resume_on_another_mesh_or_one_process(runs):
    r0, one = runs["ranks"][0], runs["single"]["one"]
    at_save, rest = r0["A_file"]["end"], slice(runs["save_at"], None)
    reference = runs["single"]["reference"]
    for name, result, dp in (("dp-only", r0["C"], 4), ("tp-only", r0["D"], 1), ("one process", one, 1)):
        assert identical(result["start"], at_save), name
        assert result["data_parallel"] == dp, name
        assert biggest_difference(result["end"], r0["A"]["end"]) < PARAM_TOL, name
        assert biggest_difference(result["end"], reference["end"]) < PARAM_TOL, name
    # tp-only and one process read the full batch each step: the reference's losses
    for result, folder in ((r0["D"], "D"), (one, "one")):
        assert max(abs(x - y) for x, y in zip(result["losses"], reference["losses"][rest])) < LOSS_TOL
        logged = logged_losses(runs["root"] / folder)
        assert max(abs(x - y) for x, y in zip(logged, reference["losses"][rest])) < LOSS_TOL
    assert ("written on (data_parallel=2, tensor_parallel=2), loaded onto (data_parallel=4, tensor_parallel=1)"
            in runs["log"])


def test_the_trainer_on_an_hsdp_mesh_resumes_the_2d_checkpoint(runs):
    """data_parallel_replicate_size=2 on 4 processes: 2 replicas of 2 FSDP shards (the mesh's third dimension), the
    data cut 4 ways by the flattened data-parallel rank; resumed from the (2, 2) checkpoint (another mesh shape)."""
    g = [r["G"] for r in runs["ranks"]]
    names = ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel")
    assert all(r["mesh"] == (names, (2, 2, 1)) for r in g)
    assert [r["data_parallel_rank"] for r in g] == [0, 1, 2, 3] and all(r["data_parallel"] == 4 for r in g)
    at_save, reference = runs["ranks"][0]["A_file"]["end"], runs["single"]["reference"]
    assert identical(g[0]["start"], at_save)
    assert biggest_difference(g[0]["end"], reference["end"]) < PARAM_TOL
    assert biggest_difference(g[0]["end"], at_save) > 1e-3  # it trained after the resume
    assert all(identical(r["end"], g[0]["end"]) for r in g)
    # the four quarters' losses average to the full batch's loss
    assert len(g[0]["losses"]) == runs["steps"] - runs["save_at"]
    assert max(abs(sum(r["losses"][i] for r in g) / 4 - loss)
               for i, loss in enumerate(reference["losses"][runs["save_at"]:])) < LOSS_TOL
    assert ("loaded onto (data_parallel=4 as 2 replicas x 2 shards, tensor_parallel=1): weights and optimizer state "
            "resharded" in runs["log"])


def test_convert_the_dcp_folder_to_one_file_and_safetensors(runs):
    from safetensors.torch import load_file

    from tasktrain.cli.main import main as tasktrain_cli  # `tasktrain convert`, without starting an interpreter

    root, at_save = runs["root"], runs["ranks"][0]["A_file"]["end"]
    assert tasktrain_cli(["convert", str(root / "saved.ckpt"), str(root / "saved-converted.ckpt")]) == 0
    converted = torch.load(root / "saved-converted.ckpt", weights_only=True)
    assert identical(converted["state_dict"], at_save)
    assert tasktrain_cli(["convert", str(root / "saved.ckpt"), str(root / "export"), "--format", "safetensors"]) == 0
    exported = {}
    for path in glob.glob(str(root / "export" / "*.safetensors")):
        exported.update(load_file(path))
    assert identical(exported, at_save)
    one_file = torch.load(root / "saved-one-file.ckpt", weights_only=True)
    assert identical(one_file["state_dict"], at_save)
    assert "device_mesh" not in one_file  # (Lightning's top level: the mesh is among tasktrain's own keys)
    assert one_file["loops"]["device_mesh"] == {"data_parallel": 2, "tensor_parallel": 2}


def test_the_accelerator_with_a_parallelism_config_trains_like_one_process(runs):
    reference = runs["single"]["sequential"]
    e = [r["E"] for r in runs["ranks"]]
    assert all(r["mesh"] == (("dp_replicate", "dp_shard", "cp", "tp"), (1, 2, 1, 2)) for r in e)
    assert [r["ranks"] for r in e] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # (data_parallel_shard_rank, tp rank)
    assert all(r["total_batch_size"] == 8 for r in e)  # 4 per data-parallel rank, 2 of them (not 4 processes)
    # accelerator.reduce(loss) over the world: the mean of the two data-parallel halves, the full batch's loss
    assert max(abs(x - y) for x, y in zip(e[0]["losses"], reference["losses"])) < LOSS_TOL
    assert biggest_difference(e[0]["end"], reference["end"]) < PARAM_TOL
    assert all(identical(r["end"], e[0]["end"]) for r in e)
    # E's save_state after step save_at (on the (dp_shard=2, tp=2) mesh) loaded on dp_shard=4: the same weights, then
    # the same training as the reference's steps after it
    h = runs["ranks"][0]["H"]
    assert identical(h["start"], e[0]["saved"])
    assert h["mesh"][1] == (1, 4, 1, 1) and len(h["losses"]) == runs["steps"] - runs["save_at"]
    assert max(abs(x - y) for x, y in zip(h["losses"], reference["losses"][runs["save_at"]:])) < LOSS_TOL
    assert biggest_difference(h["end"], e[0]["end"]) < PARAM_TOL
    assert "accelerator_state: written on (data_parallel=2, tensor_parallel=2" in runs["log"]
    # HSDP: ParallelismConfig(dp_replicate_size=2, dp_shard_size=2), fully_shard over the 2-D data-parallel mesh
    f = [r["F"] for r in runs["ranks"]]
    assert [r["mesh"][1] for r in f] == [(2, 2, 1, 1)] * 4 and [r["ranks"][0] for r in f] == [0, 1, 0, 1]
    assert all(r["total_batch_size"] == 8 for r in f)  # 2 per data-parallel rank, 4 of them
    assert max(abs(x - y) for x, y in zip(f[0]["losses"], reference["losses"])) < LOSS_TOL
    assert biggest_difference(f[0]["end"], reference["end"]) < PARAM_TOL


def test_lightnings_tensor_parallel_example_and_accelerates_nd_parallel_script_run_after_the_rename(runs):
    """tests/mesh_scripts/example_patterns.py: what those two scripts do, in the same 4-process launch."""
    lightning = [r["lightning_example"] for r in runs["ranks"]]
    assert all(r["global_step"] == 3 and r["backward"] == 3 for r in lightning)  # the backward override ran each step
    # the Trainer's sampler gives a tensor-parallel group one batch (Lightning's comment in the example)
    assert lightning[0]["batches"] == lightning[1]["batches"] != lightning[2]["batches"] == lightning[3]["batches"]
    assert lightning[0]["losses"] == lightning[1]["losses"] and all(0 < x < 10 for x in lightning[0]["losses"])
    first = lightning[0]
    assert first["dtypes"] == {"torch.bfloat16"}  # the example's own bf16 MixedPrecisionPolicy
    assert first["wrapped"] == ["FSDPCheckpointWrapper"] * 2  # checkpoint_wrapper, then fully_shard, put back
    assert first["heads"] == 2 and first["local_rows"] * 4 == 16  # wq split by tp (2), then its rows by dp (2)

    accelerate = [r["accelerate_example"] for r in runs["ranks"]]
    assert all(r["losses"] == accelerate[0]["losses"] and len(r["losses"]) == 3 for r in accelerate)  # over dp_cp
    assert all(0 < x < 10 for x in accelerate[0]["losses"]) and accelerate[0]["dp_cp"] == 2
    assert accelerate[0]["seen"] == accelerate[1]["seen"] != accelerate[2]["seen"] == accelerate[3]["seen"]
    # the fsdp_plugin beside parallelism_config: its wrap policy made the units; SHARDED_STATE_DICT a DCP folder
    assert accelerate[0]["units"] == ["FSDPCausalLM", "FSDPLlamaDecoderLayer", "FSDPLlamaDecoderLayer"]
    assert accelerate[0]["precision"] == "bf16" and accelerate[0]["hidden"] == 16
    assert ".metadata" in accelerate[0]["checkpoint"] and "__3_0.distcp" in accelerate[0]["checkpoint"]
    assert "Training completed!" in runs["log"]


def test_parallelism_config_checks_and_refusals():
    from types import SimpleNamespace

    from tasktrain import Accelerator, ParallelismConfig
    from tasktrain.utils import FullyShardedDataParallelPlugin, TorchContextParallelConfig

    with pytest.raises(ValueError, match="tp_size must be at least 1"):
        ParallelismConfig(tp_size=0)
    with pytest.raises(ValueError, match="cannot be used with pure data parallelism"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(ValueError, match="cp_size=2.: context parallelism .cp_size > 1. needs CUDA.*"
                                         "_scaled_dot_product_flash_attention_for_cpu has no sharding strategy"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2))  # before the count of processes
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    with pytest.raises(TypeError, match="use tasktrain.utils.TorchContextParallelConfig"):
        ParallelismConfig(cp_size=2, cp_handler=SimpleNamespace(cp_comm_strategy="alltoall"))
    assert ParallelismConfig(cp_size=2, cp_handler=TorchContextParallelConfig("alltoall")).cp_comm_strategy == \
        "alltoall"
    cp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)  # Accelerate's joint dimensions
    assert (cp.dp_shard_cp_dim_names, cp.dp_cp_dim_names, cp.fsdp_dim_names, cp.non_dp_dim_names) == \
        (["dp_shard", "cp"], ["dp_replicate", "dp_shard", "cp"], ["dp_replicate", "dp_shard_cp"], ["cp"])
    with pytest.raises(ValueError, match="pure data parallelism: leave parallelism_config out"):
        ParallelismConfig(dp_replicate_size=2)
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert (config.total_size, config.data_parallel_size, config.active_mesh_dims) == (4, 2, ["dp_shard", "tp"])
    with pytest.raises(ValueError, match=r"ParallelismConfig total_size \(4\) does not match num_processes \(1\)"):
        Accelerator(cpu=True, parallelism_config=config)
    with pytest.raises(ValueError, match="drop strategy= and deepspeed_plugin="):
        Accelerator(cpu=True, parallelism_config=config, strategy="ddp")
    # an fsdp_plugin beside it is Accelerate's way to give FSDP2's options: it needs a dimension to shard over
    with pytest.raises(ValueError, match="FSDP is enabled but the parallelism config has no dimension for FSDP"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2),
                    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    with pytest.raises(ValueError, match="fsdp_version: 1 is not supported"):
        FullyShardedDataParallelPlugin(fsdp_version=1)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Block"], reshard_after_forward=False,
                                            state_dict_type="FULL_STATE_DICT")
    strategy = config.strategy(plugin.options()[0])
    assert (strategy.wrap, strategy.reshard_after_forward, strategy.save_distributed_checkpoint) == \
        (["Block"], False, False)
    with pytest.raises(ValueError, match="cpu_ram_efficient_loading=True. beside parallelism_config"):
        config.strategy({"cpu_ram_efficient_loading": True})
    # a handler of a size-1 dimension: Accelerate's warning; of a larger one (tp): refused
    with pytest.warns(UserWarning, match="tp_handler is set, but tp_size is set to 1. This handler will be ignored"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_handler=object()))
    with pytest.raises(ValueError, match="tasktrain takes no tp handler"):
        ParallelismConfig(tp_size=2, tp_handler=object())
    # maybe_context_parallel without context parallelism does nothing, with Accelerate's warning (once)
    accelerator = Accelerator(cpu=True)
    tokens = torch.arange(8).view(1, 8)
    with pytest.warns(UserWarning, match="Context parallel training is not enabled"):
        with accelerator.maybe_context_parallel(buffers=[tokens], buffer_seq_dims=[1], no_restore_buffers={tokens}):
            assert tokens.shape == (1, 8)


# -- refusals before training (one process) --------------------------------------------------------------------------
class Tiny(TaskModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    def training_step(self, batch, batch_idx):
        return self.body(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Parallelized(Tiny):
    def configure_model(self):
        pass


def _loader():
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)


def _fit(module, precision=None, **options):
    trainer = Trainer(strategy=ModelParallelStrategy(**options), devices=1, accelerator="cpu", max_steps=1,
                      precision=precision,
                      gradient_clip_val=1e-3,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(module, _loader())
    return trainer


def test_arguments_and_the_mesh_shape_are_checked_before_any_process_starts():
    assert isinstance(strategy_from_name("model_parallel"), ModelParallelStrategy)
    with pytest.raises(ValueError, match=r"data_parallel_size=3 x tensor_parallel_size=2 = 6, but the world has 4"):
        Trainer(strategy=ModelParallelStrategy(data_parallel_size=3, tensor_parallel_size=2), devices=4,
                accelerator="cpu", logger=False)
    with pytest.raises(ValueError, match="tensor_parallel_size=3. does not divide the world of 4"):
        Trainer(strategy=ModelParallelStrategy(tensor_parallel_size=3), devices=4, accelerator="cpu", logger=False)
    with pytest.raises(ValueError, match="tensor_parallel_size='all'"):
        ModelParallelStrategy(tensor_parallel_size="all")
    # Lightning's "auto": the processes of a node split the layers, the nodes are the data-parallel dimension
    for devices, nodes in ((4, 1), (2, 2)):
        strategy = ModelParallelStrategy(tensor_parallel_size="auto")
        strategy.configure("cpu", devices=devices, num_nodes=nodes)
        assert strategy.mesh_shape(devices * nodes) == (nodes, devices) and strategy.tensor_parallel_size == devices
    with pytest.raises(ValueError, match="data_parallel_size=0"):
        ModelParallelStrategy(data_parallel_size=0)
    with pytest.raises(ValueError, match=r"data_parallel_replicate_size=3\) does not divide data_parallel_size=2"):
        Trainer(strategy=ModelParallelStrategy(data_parallel_replicate_size=3, tensor_parallel_size=2), devices=4,
                accelerator="cpu", logger=False)
    with pytest.raises(ValueError, match="data_parallel_replicate_size=0"):
        ModelParallelStrategy(data_parallel_replicate_size=0)


def test_refusals_before_training():
    with pytest.raises(TypeError, match="does not override configure_model"):
        _fit(Tiny())

    trainer = Trainer(strategy=ModelParallelStrategy(), devices=1, accelerator="cpu", logger=False)
    with pytest.raises(ValueError, match="random initialisation of sharded DTensors on a CPU device mesh"):
        with trainer.init_module(empty_init=True):
            pass

    class OnMeta(Parallelized):
        def configure_model(self):
            with torch.device("meta"):
                self.head = torch.nn.Linear(4, 4)

    with pytest.raises(ValueError, match="cannot be initialised on a CPU mesh"):
        _fit(OnMeta())

    class ShardsItself(Parallelized):
        def configure_model(self):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.body[0], mesh=self.device_mesh["data_parallel"])

    with pytest.raises(ValueError, match="configure_model applied fully_shard itself.*Drop wrap"):
        _fit(ShardsItself(), wrap={torch.nn.Linear})

    class BlockCompiled(Parallelized):
        def configure_model(self):
            from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

            parallelize_module(self.body, self.device_mesh["tensor_parallel"], {"0": ColwiseParallel()})
            self.body.compile()

    with pytest.raises(ValueError, match="'body' is compiled on its own"):
        _fit(BlockCompiled())


def test_the_strategys_fsdp_unit_options_act_on_the_units_it_makes():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    trainer = _fit(Parallelized(), wrap={torch.nn.Linear}, activation_checkpointing={torch.nn.Linear},
                   reshard_after_forward=False, mixed_precision=policy, precision="bf16-mixed")
    strategy = trainer.strategy
    assert strategy.wrapped_names == ["body.0", "body.1", ""] and strategy.checkpointed_names == ["body.0", "body.1"]
    state = strategy.module.body[0]._get_fsdp_state()._fsdp_param_group
    assert state.post_forward_mesh_info is None  # reshard_after_forward=False: kept after the forward
    assert state.mp_policy.param_dtype == torch.bfloat16


def test_one_process_mesh_trains_and_gives_the_module_its_mesh():
    seen = {}

    class Sees(Parallelized):
        def configure_model(self):
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            seen["names"] = self.device_mesh.mesh_dim_names
            seen["shape"] = tuple(self.device_mesh.shape)
            seen["calls"] = seen.get("calls", 0) + 1
            if seen["calls"] > 1:  # validate after fit: parallelized already
                return
            # two layers tensor parallel, the root's own fully_shard-ed only: gradients on two meshes, clipped
            parallelize_module(self.body, self.device_mesh["tensor_parallel"], {"0": ColwiseParallel(),
                                                                                 "1": RowwiseParallel()})
            self.extra = torch.nn.Linear(4, 4)

        def training_step(self, batch, batch_idx):
            return self.body(self.extra(batch[0])).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.body(self.extra(batch[0])).pow(2).mean())

    module = Sees()
    before = [p.detach().clone() for p in module.parameters()]
    trainer = _fit(module)
    assert seen == {"names": ("data_parallel", "tensor_parallel"), "shape": (1, 1), "calls": 1}
    after = trainer.strategy.full_state_dict()
    assert not torch.equal(after["body.0.weight"], before[0])  # it stepped
    # the same module validated after fit: its steps run as FSDP forward methods, registered once
    metrics = trainer.validate(module, _loader())[0]
    assert seen["calls"] == 2 and metrics["val_loss"] >= 0


def test_launch_yaml_parallelism_config(monkeypatch):
    from tasktrain import ParallelismConfig
    from tasktrain.cli.config import ConfigError, resolve
    from tasktrain.strategies.environment import launch_config
    from tasktrain.strategies.registry import strategy_of_launch

    file = {"distributed_type": "FSDP", "num_processes": 4, "use_cpu": True,
            "parallelism_config": {"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2}}
    settings = resolve(file, gpu_count=0)
    assert settings.strategy == "model_parallel"
    env = settings.worker_env()
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert (env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"], env["PARALLELISM_CONFIG_DP_SHARD_SIZE"],
            env["PARALLELISM_CONFIG_TP_SIZE"], env["PARALLELISM_CONFIG_CP_SIZE"]) == ("1", "2", "2", "1")
    for key, value in env.items():  # what a worker sees
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    # the Accelerator's ParallelismConfig() and the Trainer's strategy read the sizes
    config = ParallelismConfig()
    assert (config.dp_shard_size, config.tp_size) == (2, 2)
    strategy = strategy_of_launch(launch_config())
    assert isinstance(strategy, ModelParallelStrategy) and strategy.mesh_shape(4) == (2, 2)

    # fsdp_config's options are said to be unused (the mesh strategy shards by itself), not dropped silently
    with_fsdp = resolve(dict(file, fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "Block"}), gpu_count=0)
    assert with_fsdp.fsdp is None and any("wrap" in i for i in with_fsdp.ignored)

    for sizes, message in (({"parallelism_config_tp_size": 3}, "= 3, but num_processes is 4"),
                           ({"parallelism_config_cp_size": 2, "parallelism_config_dp_shard_size": 2},
                            "context parallelism needs CUDA .*this launch runs on CPU"),
                           ({"parallelism_config_tp": 2}, "parallelism_config key")):
        with pytest.raises(ConfigError, match=message):
            resolve(dict(file, parallelism_config=sizes), gpu_count=0)

    # HSDP: a Trainer script gets the replicate dimension too
    hsdp = resolve(dict(file, parallelism_config={"parallelism_config_dp_replicate_size": 2,
                                                  "parallelism_config_dp_shard_size": 2}), gpu_count=0)
    for key, value in hsdp.worker_env().items():
        if key.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.setenv(key, value)
    strategy = strategy_of_launch(launch_config())
    assert (strategy.data_parallel_replicate_size, strategy.mesh_shape(4)) == (2, (4, 1))
    # context parallelism on GPUs: the sizes go to the workers; a Trainer script is refused (no cp dimension)
    on_gpus = dict(file, use_cpu=False, parallelism_config={"parallelism_config_dp_shard_size": 2,
                                                             "parallelism_config_cp_size": 2})
    env = resolve(on_gpus, gpu_count=4).worker_env()
    assert (env["PARALLELISM_CONFIG_DP_SHARD_SIZE"], env["PARALLELISM_CONFIG_CP_SIZE"]) == ("2", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    with pytest.raises(ValueError, match="context parallelism is the Accelerator's"):
        strategy_of_launch(launch_config())
