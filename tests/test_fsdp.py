"""FSDP strategy (torch's FSDP2): real 2-process gloo runs on the digits classifier (tests/fsdp_scripts/train.py).

One launch trains DDP, then FSDP in several set-ups; the others kill and resume, and load a checkpoint at another
world size. The loss tolerance against DDP: FSDP reduce-scatters where DDP all-reduces, so the two gradient sums
of 2 ranks are added in another order; with fp32 this moves the 4th-7th digit of a loss (measured: at most
2.4e-7 after 44 micro-batches), far below 1e-5, which any real difference (a missed reduction, a wrong clip, a
wrong window) exceeds by orders of magnitude.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tasktrain import FSDP, Trainer
from tasktrain.state import distributed_type_of
from tasktrain.strategies.fsdp import STATE_FILE
from tasktrain.strategies.registry import strategy_from_name

from helpers import cli_commands_here

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "fsdp_scripts", "train.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
TOL = 1e-5


def run(*args, expect_ok=True, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    else:
        assert proc.returncode != 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def results(out, ranks=(0, 1)):
    return [torch.load(f"{out}.rank{rank}.pt", weights_only=False) for rank in ranks]


def classifier():
    examples = os.path.join(os.path.dirname(HERE), "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from digits import Classifier

    return Classifier


# -- one process, no launch ----------------------------------------------------------------------------------------
def test_names_and_arguments():
    assert strategy_from_name("fsdp").cpu_offload is False
    offload = strategy_from_name("fsdp_cpu_offload")
    assert offload.cpu_offload is True and offload.name == "fsdp_cpu_offload"
    with pytest.raises(ValueError, match="state_dict_type"):
        FSDP(state_dict_type="local")
    with pytest.raises(TypeError, match="wrap="):
        FSDP(wrap="Linear")
    with pytest.raises(TypeError, match="reshard_after_forward"):
        FSDP(reshard_after_forward=2)
    with pytest.raises(ValueError, match="FSDP runs precision '32-true', 'bf16-mixed', '16-mixed', 'bf16-true', "
                                         "'16-true'"):
        Trainer(strategy="fsdp", precision="64-true", devices=1, logger=False)
    # A plugin object given to the strategy: FSDP's own of that name (the sharded scaler), or the same refusal
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from tasktrain.strategies.precision import make_precision

    with pytest.warns(UserWarning, match="16-mixed"):
        trainer = Trainer(strategy=FSDP(precision=make_precision("16-mixed")), devices=1, logger=False)
    assert isinstance(trainer.strategy.precision.scaler, ShardedGradScaler)
    with pytest.raises(ValueError, match="FSDP runs precision"):
        Trainer(strategy=FSDP(precision=make_precision("64-true")), devices=1, logger=False)


def test_accelerate_fsdp_plugin_maps_onto_fsdp_options():
    """FullyShardedDataParallelPlugin's fields go through the table tasktrain launch's fsdp_config uses."""
    from tasktrain import FullyShardedDataParallelPlugin

    with pytest.warns(UserWarning, match=r"use_orig_params is ignored \(FSDP2 always keeps the original"):
        strategy = FullyShardedDataParallelPlugin(
            fsdp_version=2, sharding_strategy="SHARD_GRAD_OP", cpu_offload=True, state_dict_type="FULL_STATE_DICT",
            auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap="Linear",
            use_orig_params=True).strategy()
    assert (strategy.reshard_after_forward, strategy.cpu_offload, strategy.state_dict_type, strategy.wrap) == \
        (False, True, "full", ["Linear"])
    assert FSDP(wrap=["Linear"])._wrap_targets(classifier()(hidden=8)) == ["net.0", "net.3"]
    assert FSDP(wrap=[])._wrap_targets(classifier()(hidden=8)) == []  # NO_WRAP: the root alone
    assert FullyShardedDataParallelPlugin(auto_wrap_policy="NO_WRAP").strategy().wrap == []
    assert FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True).strategy().cpu_ram_efficient_loading is True
    assert FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=False).strategy().cpu_ram_efficient_loading is False
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            transformer_cls_names_to_wrap=["Linear"], activation_checkpointing=True,
                                            mixed_precision_policy=policy)
    strategy = plugin.strategy()
    assert strategy.activation_checkpointing == ["Linear"] and strategy.mixed_precision is policy
    for field, value, message in (("fsdp_version", 1, "FSDP2"),
                                  ("activation_checkpointing", True, "true needs transformer_cls_names_to_wrap"),
                                  ("auto_wrap_policy", "SIZE_BASED_WRAP", "TRANSFORMER_BASED_WRAP"),
                                  ("cpu_ram_efficient_loading", "maybe", "rank 0's weights are broadcast"),
                                  ("state_dict_type", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"),
                                  ("mixed_precision_policy", object(), "mixed_precision='bf16'")):
        with pytest.raises(ValueError, match=f"FullyShardedDataParallelPlugin: {field}: .*{message}"):
            FullyShardedDataParallelPlugin(**{field: value})
    assert distributed_type_of(FSDP()) == "FSDP"  # Accelerate's name, not DDP's MULTI_GPU
    with pytest.warns(UserWarning, match=r"DistributedDataParallelKwargs \['bucket_cap_mb'\] are not used under FSDP"):
        FSDP().configure_processes(ddp_kwargs={"bucket_cap_mb": 1})


def test_unfreezing_during_training_is_refused():
    with pytest.raises(ValueError, match="BaseFinetuning changed which parameters require gradients.*ddp"):
        FSDP().trainable_parameters_changed("BaseFinetuning")


def test_wrap_policies_choose_submodules():
    Classifier = classifier()
    module = Classifier(hidden=8)
    assert FSDP()._wrap_targets(module) == ["net"]  # each child with parameters
    assert FSDP(wrap={torch.nn.Linear})._wrap_targets(module) == ["net.0", "net.3"]
    assert FSDP(wrap=lambda m: isinstance(m, torch.nn.Linear) and m.out_features == 10)._wrap_targets(module) == \
        ["net.3"]
    with pytest.raises(ValueError, match="no submodule of these classes"):
        FSDP(wrap={torch.nn.Conv2d})._wrap_targets(module)
    # A GPT-like root (the Accelerator hands over the model itself): a ModuleList stands for its blocks, and tied
    # embeddings stay with the root (a parameter lives in one unit only).
    gpt = torch.nn.Module()
    gpt.wte, gpt.blocks, gpt.head = torch.nn.Embedding(5, 4), torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in
                                                                                    range(2)), torch.nn.Linear(4, 5)
    gpt.head.weight = gpt.wte.weight
    assert FSDP()._wrap_targets(gpt) == ["blocks.0", "blocks.1"]
    with pytest.raises(ValueError, match=r"\['head'\] share parameters \(tied weights\) with"):
        FSDP(wrap={torch.nn.Linear})._wrap_targets(gpt)


@pytest.mark.filterwarnings("ignore:precision=.16-mixed. on CPU")
def test_16_mixed_sharded_scaler_state_is_in_checkpoints(tmp_path):
    """The ShardedGradScaler's scale goes into the checkpoint directory's state file and comes back on resume: an
    inf at step 1 halves it, and the resumed run starts from the lowered scale, not the initial 2**16."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from tasktrain import Callback, ModelCheckpoint, TaskModule
    from tasktrain.checkpoint_io import load_checkpoint_file

    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).float().pow(2).mean()

        def on_after_backward(self):
            if self.global_step == 1:
                self.layer.weight.grad.to_local().fill_(float("inf"))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    class ScaleAtStart(Callback):
        def on_train_start(self, trainer, module):
            self.scale = trainer.strategy.precision.scaler.get_scale()

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
    trainer = Trainer(strategy="fsdp", devices=1, precision="16-mixed", max_steps=3, default_root_dir=str(tmp_path),
                      logger=False, enable_progress_bar=False, callbacks=[ModelCheckpoint(save_last=True)])
    trainer.fit(Net(), data)
    scaler, skipped = trainer.strategy.precision.scaler, trainer.strategy.precision.skipped_steps
    # The injected inf, and maybe an overflow of the first scale (2**16 times an fp16 gradient): each halves it
    assert isinstance(scaler, ShardedGradScaler) and skipped >= 1 and scaler.get_scale() == 2.0 ** (16 - skipped)
    last = trainer.checkpoint_callback.last_model_path
    saved = scaler.get_scale()
    assert load_checkpoint_file(os.path.join(last, STATE_FILE))["FSDPPrecision"]["scaler"]["scale"] == saved
    start = ScaleAtStart()
    Trainer(strategy="fsdp", devices=1, precision="16-mixed", max_steps=4, default_root_dir=str(tmp_path),
            logger=False, enable_progress_bar=False, enable_checkpointing=False,
            callbacks=[start]).fit(Net(), data, ckpt_path=last)
    assert start.scale == saved


def test_an_optimizer_without_state_resumes(tmp_path):
    """SGD without momentum has no per-parameter state: its checkpoint holds hyper-parameters only (no shard), which
    failed to load (torch's full-state broadcast finds no tensor to take a device from). They load as they are;
    the learning rate a scheduler lowered comes back."""
    from tasktrain import Callback, ModelCheckpoint, TaskModule

    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(
                optimizer, 1, 0.5), "interval": "step"}}

    class LrAtStart(Callback):
        def on_train_start(self, trainer, module):
            self.lr = trainer.optimizers[0].param_groups[0]["lr"]

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
    options = dict(strategy="fsdp", devices=1, default_root_dir=str(tmp_path), logger=False,
                   enable_progress_bar=False)
    Trainer(max_steps=2, callbacks=[ModelCheckpoint(save_last=True)], **options).fit(Net(), data)
    start = LrAtStart()
    trainer = Trainer(max_steps=3, enable_checkpointing=False, callbacks=[start], **options)
    trainer.fit(Net(), data, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert trainer.global_step == 3 and start.lr == pytest.approx(0.01 * 0.5 ** 2)


@pytest.mark.filterwarnings("ignore:precision=.16-mixed. on CPU")
def test_a_users_mixed_precision_policy_is_what_the_forward_sees(capsys):
    """FSDP(mixed_precision=MixedPrecisionPolicy(...)): the policy runs as given (under "32-true": no autocast); the
    forward sees its param_dtype (and its cast inputs), the shards stay fp32. A policy that contradicts the run's
    precision is refused when the Trainer is built."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from tasktrain import TaskModule

    class Seeing(torch.nn.Linear):
        def forward(self, x):
            self.seen = (self.weight.dtype, x.dtype)  # inside the unit's forward: its gathered parameters
            return super().forward(x)

    class Probe(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = Seeing(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).float().pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    module = Probe()
    trainer = Trainer(strategy=FSDP(mixed_precision=policy), devices=1, max_steps=2, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(module, data)
    assert module.layer.seen == (torch.bfloat16, torch.bfloat16)
    assert module.layer.weight.dtype == torch.float32  # the shards: fp32 master weights
    assert "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)" in trainer.strategy.describe()
    assert ("FSDP uses your MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) for every unit (the "
            "run's precision is 32-true)") in capsys.readouterr().out  # said, not silent
    # Agreeing pairs are accepted; contradicting ones name both sides.
    for precision in ("bf16-mixed", "bf16-true"):
        Trainer(strategy=FSDP(mixed_precision=policy), precision=precision, devices=1, logger=False)
    with pytest.raises(ValueError, match=r"param_dtype=torch.bfloat16\)\) contradicts precision='16-mixed'"):
        Trainer(strategy=FSDP(mixed_precision=policy), precision="16-mixed", devices=1, logger=False)
    with pytest.raises(ValueError, match="contradicts precision='bf16-true'"):
        Trainer(strategy=FSDP(mixed_precision=MixedPrecisionPolicy(param_dtype=torch.float32)),
                precision="bf16-true", devices=1, logger=False)
    with pytest.raises(TypeError, match="MixedPrecisionPolicy"):
        FSDP(mixed_precision="bf16")


def test_activation_checkpointing_recomputes_the_chosen_blocks_with_the_same_losses():
    """FSDP(activation_checkpointing={Block}): each Block's forward runs again in the backward (counted), and the
    losses and weights are those of the run without it, bit for bit (the same ops on the same inputs; the dropout
    inside the block draws the same mask again: torch's checkpoint restores the RNG state)."""
    from tasktrain import TaskModule

    calls = {"n": 0}

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = torch.nn.Linear(8, 8), torch.nn.Dropout(0.2)

        def forward(self, x):
            calls["n"] += 1
            return x + self.drop(torch.tanh(self.fc(x)))

    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.blocks = torch.nn.Sequential(Block(), Block(), Block())
            self.head = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            loss = self.head(self.blocks(batch[0])).pow(2).mean()
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            self.losses = []
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    def run(**options):
        torch.manual_seed(1)
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 8)), batch_size=4)
        calls["n"] = 0
        module = Net()
        trainer = Trainer(strategy=FSDP(wrap={Block}, **options), devices=1, max_steps=6, logger=False,
                          enable_progress_bar=False, enable_checkpointing=False)
        trainer.fit(module, data)
        return module.losses, calls["n"], trainer.strategy.full_state_dict(module), trainer.strategy

    plain, plain_calls, plain_weights, _ = run()
    checkpointed, ac_calls, ac_weights, strategy = run(activation_checkpointing={Block})
    assert plain_calls == 6 * 3 and ac_calls == 2 * plain_calls  # every block's forward again in the backward
    assert strategy.checkpointed_names == ["blocks.0", "blocks.1", "blocks.2"]
    assert checkpointed == plain and max(plain) != min(plain)
    assert sorted(ac_weights) == sorted(plain_weights)  # the same parameter names: checkpoints do not change
    for name, value in plain_weights.items():
        assert torch.equal(ac_weights[name], value), name
    _, by_callable, _, _ = run(activation_checkpointing=lambda m: m is not None and isinstance(m, Block))
    assert by_callable == ac_calls
    with pytest.raises(ValueError, match=r"activation_checkpointing=\['Conv2d'\].*no submodule of these classes"):
        run(activation_checkpointing={torch.nn.Conv2d})
    with pytest.raises(TypeError, match="activation_checkpointing="):
        FSDP(activation_checkpointing=True)


# -- 2 processes -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    """DDP, then FSDP (default wrap, a checkpoint every step: top 2 + last), FSDP wrap={Linear} without resharding,
    fsdp_cpu_offload, activation checkpointing, bf16-mixed, 16-mixed and bf16-true, in one 2-process launch
    (accumulation 2, clipping 0.5). Last in the same launch, once the results are written, test_kill_and_resume's
    FSDP fit under ROOT/killed, whose rank 1 is SIGKILLed after step 15: the launch ends there, non-zero (a launch
    of its own would start the processes and import everything again). `proc.stdout` is what came before it (rank
    0's line that says it starts)."""
    root = tmp_path_factory.mktemp("fsdp_compare")
    proc = run(SCRIPT, "--root", str(root), "--out", str(root / "out"), "--case", "compare", "--kill-at", "15",
               expect_ok=False, timeout=600)
    marker = "-- the killed fit starts --"
    assert proc.stdout.count(marker) == 1, proc.stdout[-5000:] + proc.stderr[-5000:]  # the comparison ran to its end
    proc.stdout = proc.stdout.split(marker)[0]
    return root, results(root / "out"), proc


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_fsdp_trains_like_ddp(compare):
    _, ranks, proc = compare
    assert proc.stdout.count("FSDP wrapped 1 module(s) [net] and the root Classifier") == 9  # rank 0, once per FSDP fit
    assert "FSDP activation checkpointing: 1 module(s) [net] recompute their forward in the backward" in proc.stdout
    assert "FSDP wrapped 2 module(s) [net.0, net.3]" in proc.stdout
    # ModelSummary's example forward ran on both ranks (on rank 0 alone it would wait for rank 1's all-gather)
    # (the default summary is Rich's table where rich is installed, the plain one elsewhere)
    assert proc.stdout.count("In sizes") == 1 and re.search(r"\[3, 64\] *[|│] *\[3, 10\]", proc.stdout)
    for rank, res in enumerate(ranks):
        ddp = res["ddp"]
        assert ddp["global_step"] == 22 and len(ddp["losses"]) == 44 and ddp["val_acc"] > 0.8
        assert max(ddp["norms"]) > 0.5  # clipping really clipped
        for name in ("fsdp", "fsdp_linear", "fsdp_offload", "fsdp_ac"):
            run_ = res[name]
            n = len(run_["losses"])
            assert n in (22, 44) and run_["global_step"] == n // 2, name
            torch.testing.assert_close(torch.tensor(run_["losses"]), torch.tensor(ddp["losses"][:n]), rtol=0, atol=TOL)
            # clip_grad_norm_ over the DTensor shards: the global norm, DDP's
            torch.testing.assert_close(torch.tensor(run_["norms"]), torch.tensor(ddp["norms"][:n // 2]), rtol=0,
                                       atol=TOL)
            assert run_["validate_after_fit"] == pytest.approx(run_["val_acc"], abs=1e-6), name
        for name, value in ddp["weights"].items():
            torch.testing.assert_close(res["fsdp"]["weights"][name], value, rtol=0, atol=TOL)
        assert res["fsdp"]["val_acc"] == pytest.approx(ddp["val_acc"], abs=1e-6), rank
        assert res["fsdp"]["validate_last"] == pytest.approx(res["fsdp"]["val_acc"], abs=1e-6)
        # Accumulation: no reduce-scatter in the window's first micro-batch, one per unit with parameters at its
        # last (the default wrap: "net"; the root holds none), two with wrap={Linear}.
        assert res["fsdp"]["scatters"][:6] == [0, 1, 1, 2, 2, 3]
        assert res["fsdp"]["scatters"][-1] == 22
        assert res["fsdp_linear"]["scatters"][:4] == [0, 2, 2, 4]
        assert "cpu_offload" in res["fsdp_offload"]["describe"]
        bf16 = res["fsdp_bf16"]
        assert bf16["global_step"] == 11 and all(torch.isfinite(torch.tensor(bf16["losses"])))
        assert bf16["losses"][-1] < bf16["losses"][0] and bf16["val_acc"] > 0.8
        assert bf16["losses"] != ddp["losses"][:22]  # computed in bf16, not fp32
        assert bf16["param_dtype"] == torch.float32  # fp32 master shards
        # 16-mixed: the ShardedGradScaler all-reduces the inf found in rank 1's shard, so both ranks skip step 6
        # (the whole weights, both shards, are unchanged by it) and count the same skipped steps.
        fp16 = res["fsdp_fp16"]
        assert fp16["global_step"] == 11 and fp16["param_dtype"] == torch.float32
        assert fp16["skipped"] == ranks[0]["fsdp_fp16"]["skipped"] and fp16["scales"] == ranks[0]["fsdp_fp16"]["scales"]
        assert fp16["skipped"][6] == fp16["skipped"][5] + 1 and fp16["scales"][6] == fp16["scales"][5] / 2
        # (one epoch with a step skipped: well above chance, 0.1; its draws follow the seed again at the fit's set-up,
        # Lightning's reset_seed, which left it at 0.798)
        assert fp16["skipped"][-1] < 11 and fp16["val_acc"] > 0.75
        for name, value in fp16["before"].items():
            assert torch.equal(fp16["after"][name], value), name
        assert any(not torch.equal(res["fsdp_fp16"]["weights"][k], v) for k, v in fp16["after"].items())
        true = res["fsdp_bf16_true"]  # the module cast before fully_shard: bf16 shards, bf16 reduction
        assert true["param_dtype"] == torch.bfloat16 and true["global_step"] == 11
        assert all(torch.isfinite(torch.tensor(true["losses"]))) and true["losses"][-1] < true["losses"][0]


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_checkpoint_directories_and_convert(compare, tmp_path):
    root, ranks, _ = compare
    directory = root / "fsdp" / "checkpoints"
    assert sorted(os.listdir(directory)) == ["epoch=1-step=21.ckpt", "epoch=1-step=22.ckpt", "last.ckpt"]
    newest, last = directory / "epoch=1-step=22.ckpt", directory / "last.ckpt"
    assert sorted(os.listdir(last)) == sorted([".metadata", "__0_0.distcp", "__1_0.distcp", STATE_FILE])
    state = torch.load(last / STATE_FILE, weights_only=True)  # Lightning's top level; the layout under "loops"
    assert "fsdp" not in state and state["loops"]["fsdp"] == {"world_size": 2, "layout": "dcp"}
    for part in os.listdir(last):  # save_last=True: last.ckpt is a write of its own after the newest (Lightning's)
        assert os.stat(last / part).st_ino != os.stat(newest / part).st_ino
    assert not (root / "fsdp" / ".last_checkpoint.json").exists()  # no launch restart: no record beside them

    from tasktrain import CheckpointError

    Classifier = classifier()
    with pytest.raises(CheckpointError):
        Classifier.load_from_checkpoint(str(last))
    # Both `tasktrain convert` commands through the CLI's entry point in this process (helpers.cli_commands_here):
    # to one file, to safetensors.
    out = tmp_path / "model.ckpt"
    export = tmp_path / "export"
    converted = cli_commands_here([["convert", last, out], ["convert", last, export, "--format", "safetensors"]])
    for code, stdout, stderr in converted:
        assert code == 0, stdout + stderr
    assert "wrote" in converted[0][1]
    module = Classifier.load_from_checkpoint(str(out))
    trained = ranks[0]["fsdp"]["weights"]
    assert set(module.state_dict()) == set(trained)
    for name, value in module.state_dict().items():
        assert torch.equal(value, trained[name]), name
    from tasktrain.inference.checkpoint_files import read_state_dict

    index = export / "model.safetensors"
    for name, value in read_state_dict(index).items():
        assert torch.equal(value, trained[name]), name


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_full_state_dict_files(compare):
    """FSDP(state_dict_type="full"): one ordinary file (whole weights, optimizer state keyed by name), gathered on
    rank 0; a new fit resumes from it exactly (the continuous "fsdp" fit of the same launch is the reference)."""
    root, ranks, _ = compare
    for res in ranks:
        first, resumed, reference = res["full_first"], res["full_resumed"], res["fsdp"]
        assert os.path.isfile(first["last"])
        assert res["full_file"]["keys"] == res["full_file"]["optimizer_keys"] == sorted(reference["weights"])
        assert first["losses"] == reference["losses"][:22]
        assert resumed["global_step"] == 22 and resumed["losses"] == reference["losses"][22:]
        for name, value in reference["weights"].items():
            assert torch.equal(resumed["weights"][name], value), name
    module = classifier().load_from_checkpoint(ranks[0]["full_first"]["last"])  # loads anywhere, no FSDP
    assert set(module.state_dict()) == set(ranks[0]["fsdp"]["weights"])


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_meta_init_allocates_only_the_shard(compare):
    """trainer.init_module(empty_init=True): a 64 MiB model built on the meta device; each of the 2 ranks grows by
    its 32 MiB shard (plus the set-up's own small allocations) and never by the whole model."""
    _, ranks, _ = compare
    for res in ranks:
        meta = res["meta"]
        assert meta["built_on_meta"] and meta["global_step"] == 2
        assert meta["full_bytes"] == 2 * meta["local_bytes"] == 16 * (1024 * 1024 + 1024) * 4
        assert meta["local_bytes"] * 0.9 < meta["peak_growth"] < meta["full_bytes"] * 0.75, meta["peak_growth"]
        # reset_parameters() filled each shard: nn.Linear's uniform(+-1/sqrt(1024)) has std 1/sqrt(3 * 1024)
        assert meta["weight_std"] == pytest.approx((3 * 1024) ** -0.5, rel=0.05) and meta["halves_differ"]


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_a_whole_weights_file_streams_into_the_shards_from_rank_0(compare):
    """The 64 MiB model of the meta-init test, saved as one ordinary file (state_dict_type="full"), resumed by a new
    fit of a meta-built sharded model: rank 0 reads the file and broadcasts it, each rank keeping its shard. Rank 1
    maps the file but never touches its tensors: while the weights go in, its peak grows by less than its own 32 MiB
    shard (measured: 8 to 24 MiB, torch's broadcast buffers; reading the file whole grew it by 84 MiB), where rank
    0's grows by the whole file (which shows that the measurement sees a whole read). Loading the optimizer then
    adds a gradient-sized shard on every rank for a moment (torch's set_optimizer_state_dict makes the optimizer's
    state with a step on zero gradients): rank 1 stays below the whole model (measured 34 to 44 MiB; 98 MiB when it
    read the file)."""
    _, ranks, _ = compare
    full = ranks[0]["meta"]["full_bytes"]
    for rank, res in enumerate(ranks):
        loaded = res["meta"]["full_load"]
        assert loaded["same"] and loaded["global_step"] == 2  # every weight as saved, on every rank
        if rank == 0:
            assert loaded["module_load_growth"] > 0.9 * full, loaded["module_load_growth"]
        else:
            assert loaded["module_load_growth"] < 0.5 * full, loaded["module_load_growth"]
            assert loaded["load_growth"] < full, loaded["load_growth"]


def test_full_checkpoint_files_are_mapped_not_read(tmp_path):
    """FSDP.load_checkpoint maps a whole-weights file (its tensors' pages are read only when used); a file in torch's
    old pre-zip format cannot be mapped and is read as before."""
    state = {"state_dict": {"w": torch.arange(6.0)}, "train_state": {"global_step": 3}}
    torch.save(state, tmp_path / "new.ckpt")
    torch.save(state, tmp_path / "old.ckpt", _use_new_zipfile_serialization=False)
    strategy = FSDP()
    mapped = {}
    for name in ("new.ckpt", "old.ckpt"):
        loaded = strategy.load_checkpoint(str(tmp_path / name))
        assert torch.equal(loaded["state_dict"]["w"], torch.arange(6.0)) and loaded["loops"]["train_state"]["global_step"] == 3
        address = loaded["state_dict"]["w"].untyped_storage().data_ptr()
        with open("/proc/self/maps") as f:  # "start-end perms offset dev inode path": is the tensor in the file?
            spans = [line.split()[0].split("-") for line in f if line.rstrip().endswith(str(tmp_path / name))]
        mapped[name] = any(int(lo, 16) <= address < int(hi, 16) for lo, hi in spans)
    assert mapped == {"new.ckpt": True, "old.ckpt": False}


def test_meta_init_needs_reset_parameters():
    class NoReset(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))

    from tasktrain.strategies.fsdp import _check_resettable

    with torch.device("meta"):
        module = torch.nn.Sequential(torch.nn.Linear(3, 3), NoReset())
    with pytest.raises(ValueError, match=r"\['1'\] hold parameters or buffers of their own but define no "
                                         "reset_parameters"):
        _check_resettable(module)
    assert FSDP().module_init_context(empty_init=False) is not None
    with FSDP().module_init_context(empty_init=True):
        assert torch.nn.Linear(2, 2).weight.is_meta
    with FSDP().module_init_context(empty_init=False):
        assert not torch.nn.Linear(2, 2).weight.is_meta


@pytest.fixture(scope="module")
def moved(compare, tmp_path_factory):
    """2 -> 1: the 2-rank fit's checkpoint of step 21 on one process, trained on (launch ONE); 1 -> 2: what that one
    process wrote, on two (launch TWO). TWO then resumes test_kill_and_resume's killed fit (ROOT/killed, from
    ckpt_path="last") into RESUMED: one 2-process launch for both (its processes and imports started once)."""
    root, _, _ = compare
    base = tmp_path_factory.mktemp("fsdp_moved")
    one, two, resumed = base / "one", base / "two", base / "resumed"
    saved = root / "fsdp" / "checkpoints" / "epoch=1-step=21.ckpt"
    run(SCRIPT, "--root", str(one), "--out", str(one / "out"), "--case", "load", "--devices", "1", "--ckpt",
        str(saved))
    more = results(one / "out", ranks=(0,))[0]["more"]
    proc = run(SCRIPT, "--root", str(two), "--out", str(two / "out"), "--case", "load", "--devices", "2", "--ckpt",
               more["last"], "--epochs", "4", "--resume-root", str(root / "killed"), "--resume-out", str(resumed))
    marker = "-- the resume starts --"
    assert proc.stdout.count(marker) == 1, proc.stdout[-5000:] + proc.stderr[-5000:]
    return dict(saved=saved, one=one, two=two, resumed=resumed, resume_stdout=proc.stdout.split(marker)[1])


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_kill_and_resume_is_exact(compare, moved):
    root, ranks, _ = compare
    reference = ranks[0]["fsdp"]
    # the killed fit ran last in the compare launch (rank 1 SIGKILLed after step 15), under root/killed
    killed = root / "killed"
    assert not any("killed_fit_ended" in res for res in ranks)  # the launch ended in it
    assert os.path.isdir(killed / "fsdp" / "checkpoints" / "last.ckpt")
    # resumed (ckpt_path="last") in the `moved` fixture's 2-process launch, after its load case
    stdout = moved["resume_stdout"]
    assert "resumed from" in stdout and "global step 14" in stdout
    resumed = results(moved["resumed"])[0]["fsdp"]
    assert resumed["global_step"] == 22
    assert resumed["losses"] == reference["losses"][-len(resumed["losses"]):]
    for name, value in reference["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name


@pytest.mark.world_size(2)
@pytest.mark.timeout(700)
def test_checkpoints_load_at_another_world_size(moved):
    """2 -> 1: a checkpoint of the 2-rank fit, on one process (DCP reshards the module and the optimizer), then
    trained on; 1 -> 2: what that one process wrote, on two."""
    from tasktrain.strategies.fsdp import convert_fsdp_checkpoint

    saved, one, two = moved["saved"], moved["one"], moved["two"]
    res = results(one / "out", ranks=(0,))[0]
    for name, value in convert_fsdp_checkpoint(saved)["state_dict"].items():
        assert torch.equal(res["loaded"][name], value), name
    more = res["more"]
    assert more["global_step"] > 21 and more["val_acc"] > 0.8 and all(torch.isfinite(torch.tensor(more["losses"])))
    for res in results(two / "out"):
        for name, value in more["weights"].items():  # last.ckpt holds the 1-process fit's final weights
            assert torch.equal(res["loaded"][name], value), name
        assert res["more"]["global_step"] > more["global_step"] and res["more"]["val_acc"] > 0.8
