"""Checkpoint files for big-model inference (issue 21): safetensors and sharded layouts read by
load_checkpoint_and_dispatch, written by save_model / `tasktrain convert` / Accelerator.save_model, init_empty_weights,
and the peak memory of a sharded load. Models from transformers are in test_inference_hf.py."""
import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import tasktrain
from helpers import Linear, loader, quiet
from tasktrain.cli.main import main as cli
from tasktrain.inference import init_empty_weights, load_checkpoint_and_dispatch, save_model


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.register_buffer("scale", torch.full((16,), 0.5))  # persistent: in checkpoints
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))  # an integer buffer keeps its dtype

    def forward(self, x):
        return x + self.norm(torch.relu(self.fc(x))) * self.scale


class Tied(nn.Module):
    """embed (16x16) -> 4 blocks -> head tied to embed. 1024 B per weight matrix in float32."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 16)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(16, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_tied(seed=0):
    torch.manual_seed(seed)
    model = Tied().eval()
    with torch.no_grad():  # buffers with values a default would not give
        for i, block in enumerate(model.blocks):
            block.scale.uniform_(0.5, 1.5)
            block.calls.fill_(i + 3)
    return model


IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])


def empty_tied():
    with init_empty_weights():
        return Tied().eval()


def outputs(model):
    with torch.no_grad():
        return model(IDS)


# -- init_empty_weights -------------------------------------------------------------------------------------------
def test_init_empty_weights_puts_parameters_on_meta_and_keeps_buffers():
    assert tasktrain.init_empty_weights is init_empty_weights
    register = nn.Module.register_parameter
    with init_empty_weights():
        model = Tied()
        frozen = nn.Linear(3, 3)
        frozen.weight.requires_grad_(False)
        frozen.bias = nn.Parameter(torch.ones(3), requires_grad=False)
    assert all(p.is_meta for p in model.parameters())
    assert type(model.embed.weight) is nn.Parameter and model.head.weight is model.embed.weight
    assert not frozen.bias.requires_grad and frozen.bias.is_meta and model.blocks[0].fc.weight.requires_grad
    assert not model.blocks[0].scale.is_meta and torch.equal(model.blocks[0].scale, torch.full((16,), 0.5))
    assert nn.Module.register_parameter is register  # restored
    assert not nn.Linear(2, 2).weight.is_meta

    with init_empty_weights(include_buffers=True):
        everything = Tied()
    assert everything.blocks[0].scale.is_meta and everything.embed.weight.is_meta
    assert not torch.empty(1).is_meta

    with pytest.raises(RuntimeError, match="boom"):
        with init_empty_weights():
            raise RuntimeError("boom")
    assert nn.Module.register_parameter is register


# -- save_model ---------------------------------------------------------------------------------------------------
def test_save_model_single_file_and_round_trip(tmp_path):
    model = make_tied()
    paths = save_model(model, tmp_path / "out")
    assert paths == [str(tmp_path / "out" / "model.safetensors")]
    with safe_open(paths[0], framework="pt") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    # The tied head is stored once (safetensors refuses shared storage), under the first name.
    assert "embed.weight" in keys and "head.weight" not in keys and "blocks.2.calls" in keys
    loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path / "out", device_map={"": "cpu"}, strict=True)
    assert loaded.head.weight is loaded.embed.weight
    assert torch.equal(outputs(loaded), outputs(model))
    assert loaded.blocks[2].calls.dtype == torch.int64 and loaded.blocks[2].calls.item() == 5


def test_save_model_shards_and_index(tmp_path):
    model = make_tied()
    paths = save_model(model, tmp_path, max_shard_size="2KB")
    shards = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))
    count = len(shards)
    assert count >= 4 and shards[0] == f"model-00001-of-{count:05d}.safetensors"
    assert paths[-1] == str(tmp_path / "model.safetensors.index.json") and len(paths) == count + 1
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    state = model.state_dict()
    unique = {k: v for k, v in state.items() if k != "head.weight"}
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in unique.values())
    assert sorted(index["weight_map"]) == sorted(unique) and set(index["weight_map"].values()) == set(shards)
    for shard in shards:  # every shard within the limit: none holds a tensor above 2 KB here
        size = sum(state[k].numel() * state[k].element_size() for k, f in index["weight_map"].items() if f == shard)
        assert 0 < size <= 2000
    loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path / "model.safetensors.index.json",
                                          device_map={"": "cpu"}, strict=True)
    assert torch.equal(outputs(loaded), outputs(model))

    # Saving again with fewer shards removes the stale ones; files that are not weights stay.
    (tmp_path / "config.json").write_text("{}")
    save_model(model, tmp_path, max_shard_size="1MB")
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]


def test_save_model_torch_format_keeps_tied_names_and_big_tensors_get_their_own_shard(tmp_path):
    model = make_tied()
    save_model(model, tmp_path, max_shard_size="500B", safe_serialization=False)
    index = json.loads((tmp_path / "pytorch_model.bin.index.json").read_text())
    assert index["weight_map"]["head.weight"] == index["weight_map"]["embed.weight"]  # same file, stored once
    shard = torch.load(tmp_path / index["weight_map"]["embed.weight"], weights_only=True)
    assert shard["head.weight"].untyped_storage().data_ptr() == shard["embed.weight"].untyped_storage().data_ptr()
    assert list(shard) == ["embed.weight", "head.weight"]  # 1024 B > 500 B: a shard of its own
    loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path, device_map={"": "cpu"}, strict=True)
    assert torch.equal(outputs(loaded), outputs(model))


def test_save_model_writes_views_and_slices_as_their_own_bytes(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    state = {"a": base[:, :2], "b": base[1:], "c": base.t(), "same": base, "alias": base}
    save_model(state, tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    assert sorted(saved) == ["a", "b", "c", "same"]  # "alias" is "same" again
    for key, value in saved.items():
        assert torch.equal(value, state[key])
    save_model(state, tmp_path / "bin", safe_serialization=False)
    single = torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)
    assert sorted(single) == ["a", "alias", "b", "c", "same"] and torch.equal(single["c"], base.t())
    assert single["b"].untyped_storage().nbytes() == 8 * 4  # the slice, not the whole storage


def test_save_model_errors(tmp_path):
    with init_empty_weights():
        empty = Tied()
    with pytest.raises(ValueError, match="'embed.weight' is on the meta device"):
        save_model(empty, tmp_path)
    partitioned = nn.Linear(2, 2)
    partitioned.weight.ds_id = 0
    with pytest.raises(ValueError, match="ZeRO-3 partitioned.*tasktrain convert"):
        save_model(partitioned, tmp_path)
    with pytest.raises(ValueError, match="max_shard_size"):
        save_model(make_tied(), tmp_path, max_shard_size=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        save_model(make_tied(), tmp_path / "file")
    with pytest.raises(TypeError, match="nn.Module or a state dict"):
        save_model([1], tmp_path)
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))  # no temporary file left


# -- loading: layouts, keys, dtype, disk ---------------------------------------------------------------------------
def test_disk_offload_reads_the_safetensors_file_instead_of_copying(tmp_path):
    model = make_tied()
    save_model(model, tmp_path / "ckpt", max_shard_size="3KB")
    device_map = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "disk",
                  "head": "cpu"}
    loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path / "ckpt", device_map=device_map,
                                          offload_folder=tmp_path / "offload")
    assert torch.equal(outputs(loaded), outputs(model))
    assert loaded.blocks[1].fc.weight.is_meta
    assert os.listdir(tmp_path / "offload") == ["index.json"]  # nothing copied
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    entry = index["blocks.1.fc.weight"]
    assert entry["weight_name"] == "blocks.1.fc.weight" and entry["dtype"] == "float32"
    assert os.path.dirname(entry["safetensors_file"]) == str(tmp_path / "ckpt")

    # In another dtype the stored bytes are not the tensor: it is converted and written to the offload folder.
    loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path / "ckpt", device_map=device_map,
                                          offload_dir=tmp_path / "offload16", dtype=torch.bfloat16)
    index = json.loads((tmp_path / "offload16" / "index.json").read_text())
    assert index["blocks.1.fc.weight"] == {"dtype": "bfloat16", "shape": [16, 16], "file": "blocks.1.fc.weight.dat"}
    assert index["blocks.1.calls"]["dtype"] == "int64"  # integer buffers keep their dtype
    expected = make_tied().to(torch.bfloat16)
    assert torch.equal(outputs(loaded), outputs(expected))

    # dispatch_model's own name is offload_dir; offload_folder works there too.
    from tasktrain.inference import dispatch_model

    dispatched = dispatch_model(make_tied(), device_map, offload_folder=tmp_path / "offload-dispatch")
    assert torch.equal(outputs(dispatched), outputs(model))
    assert "blocks.1.fc.weight.dat" in os.listdir(tmp_path / "offload-dispatch")
    with pytest.raises(ValueError, match="name two folders"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path / "ckpt", device_map=device_map,
                                     offload_folder=tmp_path / "a", offload_dir=tmp_path / "b")


def test_strict_reports_missing_and_unexpected_keys(tmp_path):
    model = make_tied()
    state = {k: v.clone() for k, v in model.state_dict().items() if k not in ("head.weight", "blocks.3.scale")}
    state["blocks.9.fc.weight"] = torch.zeros(2)
    save_file(state, tmp_path / "partial.safetensors")
    with pytest.raises(ValueError, match=r"strict=True\): missing key\(s\) 'blocks.3.scale'; unexpected key\(s\) "
                                         r"'blocks.9.fc.weight'"):
        load_checkpoint_and_dispatch(make_tied(), tmp_path / "partial.safetensors", device_map={"": "cpu"},
                                     strict=True)
    # strict=False: warned and returned; a missing tensor with a value keeps it.
    base = make_tied(seed=1)
    with torch.no_grad():
        base.blocks[3].scale.fill_(2.0)
    with pytest.warns(UserWarning) as caught:
        loaded, info = load_checkpoint_and_dispatch(base, tmp_path / "partial.safetensors", device_map={"": "cpu"},
                                                    output_loading_info=True)
    assert info == {"missing_keys": ["blocks.3.scale"], "unexpected_keys": ["blocks.9.fc.weight"]}
    messages = " ".join(str(w.message) for w in caught)
    assert "no value for 1 tensor(s) of the model: 'blocks.3.scale'" in messages
    assert "1 entries the model does not use, 'blocks.9.fc.weight'" in messages
    assert torch.equal(loaded.blocks[3].scale, torch.full((16,), 2.0))
    assert torch.equal(loaded.blocks[0].fc.weight, model.blocks[0].fc.weight)
    # init_empty_weights keeps buffers real: a missing buffer keeps what the constructor gave it.
    with pytest.warns(UserWarning, match="blocks.3.scale"):
        with pytest.warns(UserWarning, match="blocks.9.fc.weight"):
            loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path / "partial.safetensors",
                                                  device_map={"": "cpu"})
    assert torch.equal(loaded.blocks[3].scale, torch.full((16,), 0.5))
    # A missing parameter on meta has no value at all: an error whatever strict says.
    del state["blocks.1.fc.bias"]
    save_file(state, tmp_path / "partial.safetensors")
    with pytest.raises(ValueError, match=r"no value for 1 tensor\(s\).*'blocks.1.fc.bias'.*on meta"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path / "partial.safetensors", device_map={"": "cpu"})
    # Nothing in common: say so.
    save_file({"x.weight": torch.zeros(1)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="None of the checkpoint's keys"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path / "other.safetensors", device_map={"": "cpu"})


def test_checkpoint_paths_that_cannot_be_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no checkpoint: looked for model.safetensors"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path, device_map={"": "cpu"})
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"It holds \['weights.safetensors'\]"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path, device_map={"": "cpu"})
    paths = save_model(make_tied(), tmp_path / "sharded", max_shard_size="2KB")
    first, second = (os.path.basename(p) for p in paths[:2])
    os.remove(paths[1])
    with pytest.raises(FileNotFoundError, match=rf"names shard\(s\) \['{second}'\]"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path / "sharded", device_map={"": "cpu"})
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    moved = {k: first for k in json.loads(index.read_text())["weight_map"]}
    index.write_text(json.dumps({"weight_map": moved}))
    with pytest.raises(ValueError, match="does not hold it"):
        load_checkpoint_and_dispatch(empty_tied(), index, device_map={"": "cpu"})
    (tmp_path / "bad.index.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a sharded checkpoint index"):
        load_checkpoint_and_dispatch(empty_tied(), tmp_path / "bad.index.json", device_map={"": "cpu"})


# -- exporting what was trained -----------------------------------------------------------------------------------
def test_convert_a_trainer_checkpoint_to_safetensors_shards(tmp_path, capsys):
    model = make_tied()

    class Wrapper(nn.Module):  # a TaskModule holding the network as self.model saves keys "model.*"
        def __init__(self):
            super().__init__()
            self.model = model

    checkpoint = {"format_version": 1, "state_dict": Wrapper().state_dict(), "hyper_parameters": {"width": 16},
                  "weights_only": True}
    torch.save(checkpoint, tmp_path / "trained.ckpt")
    out = tmp_path / "export"
    assert cli(["convert", str(tmp_path / "trained.ckpt"), str(out), "--format", "safetensors",
                "--max-shard-size", "3KB", "--prefix", "model"]) == 0
    assert "wrote" in capsys.readouterr().out
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "embed.weight" in index["weight_map"] and "head.weight" not in index["weight_map"]
    loaded = load_checkpoint_and_dispatch(empty_tied(), out, device_map={"embed": "cpu", "blocks": "disk",
                                                                         "head": "cpu"},
                                          offload_folder=tmp_path / "offload", strict=True)
    assert torch.equal(outputs(loaded), outputs(model))

    assert cli(["convert", str(tmp_path / "trained.ckpt"), str(tmp_path / "bin"), "--format", "bin"]) == 0
    assert sorted(torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True))[0] == "model.blocks.0.calls"
    capsys.readouterr()
    assert cli(["convert", str(tmp_path / "trained.ckpt"), str(tmp_path / "x"), "--format", "safetensors",
                "--prefix", "net"]) == 2
    assert "no weight of" in (err := capsys.readouterr().err) and "['model']" in err
    assert cli(["convert", str(tmp_path / "missing.ckpt"), str(tmp_path / "y"), "--format", "safetensors"]) == 2
    assert "is not a file" in capsys.readouterr().err
    assert cli(["convert", str(tmp_path / "trained.ckpt"), str(tmp_path / "z.ckpt"), "--max-shard-size", "1MB"]) == 2
    assert "--max-shard-size apply to --format safetensors or bin" in capsys.readouterr().err


def test_trainer_and_accelerator_export_a_trained_module(tmp_path):
    module = Linear()
    trainer = tasktrain.Trainer(max_epochs=1, **quiet())
    trainer.fit(module, loader())
    save_model(trainer.module, tmp_path / "trainer")
    with init_empty_weights():
        fresh = Linear()
    loaded = load_checkpoint_and_dispatch(fresh, tmp_path / "trainer", device_map={"": "cpu"}, strict=True)
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(loaded(x), module(x))

    accelerator = tasktrain.Accelerator()
    model = accelerator.prepare(make_tied())
    accelerator.save_model(model, tmp_path / "accelerator", max_shard_size="3KB")
    assert (tmp_path / "accelerator" / "model.safetensors.index.json").is_file()
    loaded = load_checkpoint_and_dispatch(empty_tied(), tmp_path / "accelerator", device_map={"": "cpu"},
                                          strict=True)
    assert torch.equal(outputs(loaded), outputs(make_tied()))


# -- peak memory --------------------------------------------------------------------------------------------------
_PEAK_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torch import nn
    from tasktrain.inference import init_empty_weights, load_checkpoint_and_dispatch

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    folder, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    io = torch.load(folder + "/io.pt")
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(24)])
    before = status("VmRSS:")
    model = load_checkpoint_and_dispatch(model, folder + "/ckpt", max_memory={"cpu": "10MB"}, dtype=dtype,
                                         offload_folder=folder + "/offload-" + sys.argv[2])
    with torch.no_grad():
        y = model(io["x"].to(dtype))
    print(json.dumps({"increase": status("VmHWM:") - before, "equal": torch.equal(y, io[sys.argv[2]]),
                      "on_disk": sum(d == "disk" for d in model.hf_device_map.values())}))
""")


@pytest.mark.timeout(180)
def test_peak_memory_of_a_sharded_load_stays_near_one_shard_plus_the_cpu_budget(tmp_path):
    """A 100 MB model in 12.6 MB safetensors shards, loaded with a 10 MB CPU budget (the rest on disk), in a fresh
    process: peak resident memory (load and one forward) grows by less than the largest shard plus the CPU budget plus
    one more shard of allowance (the allocator's retained blocks, the file pages just read and the forward's buffers
    differ between CPUs and kernels: 16 MiB here, 26 MiB on another machine), whether the disk part is read from the
    checkpoint itself (float32) or converted and copied to the offload folder (bfloat16). Loading the whole model
    would add 96 MiB."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(24)])
    x = torch.randn(2, 1024)
    with torch.no_grad():
        io = {"x": x, "float32": model(x), "bfloat16": copy.deepcopy(model).to(torch.bfloat16)(x.to(torch.bfloat16))}
    paths = save_model(model, tmp_path / "ckpt", max_shard_size="13MB")
    torch.save(io, tmp_path / "io.pt")
    del model
    model_bytes = 24 * 1024 * 1024 * 4
    largest_shard = max(os.path.getsize(p) for p in paths if p.endswith(".safetensors"))
    assert len(paths) - 1 >= 7 and model_bytes > 7 * largest_shard
    bound = 2 * largest_shard + 10 * 10**6
    script = tmp_path / "peak.py"
    script.write_text(_PEAK_SCRIPT)
    for dtype in ("float32", "bfloat16"):
        run = subprocess.run([sys.executable, str(script), str(tmp_path), dtype], check=True, capture_output=True,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=150)
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["equal"] and result["on_disk"] >= 20, (dtype, result)
        assert result["increase"] < bound, (
            f"{dtype}: peak RSS grew by {result['increase'] / 2**20:.1f} MiB; bound {bound / 2**20:.1f} MiB "
            f"(2 x largest shard {largest_shard / 2**20:.1f} MiB + CPU budget 10 MB), model {model_bytes / 2**20:.0f} MiB")
    offloaded = os.listdir(tmp_path / "offload-float32")
    assert offloaded == ["index.json"]  # float32 on disk: read from the shards, nothing copied
    assert len(os.listdir(tmp_path / "offload-bfloat16")) > 20


def test_keep_in_fp32_modules_follows_transformers_rule(tmp_path):
    save_model(make_tied(), tmp_path)

    def loaded_dtypes(dtype, keep=None, strict_keep=None, **kwargs):
        model = empty_tied()
        model._keep_in_fp32_modules, model._keep_in_fp32_modules_strict = keep, strict_keep
        model = load_checkpoint_and_dispatch(model, tmp_path, device_map={"": "cpu"}, dtype=dtype, **kwargs)
        return model.blocks[1].norm.weight.dtype, model.blocks[1].fc.weight.dtype, model.blocks[1].scale.dtype

    # _keep_in_fp32_modules: only when loading in float16; _keep_in_fp32_modules_strict: float16 and bfloat16.
    assert loaded_dtypes(torch.float16, keep=["norm"]) == (torch.float32, torch.float16, torch.float16)
    assert loaded_dtypes(torch.bfloat16, keep=["norm"]) == (torch.bfloat16,) * 3
    assert loaded_dtypes(torch.bfloat16, strict_keep=["norm"]) == (torch.float32, torch.bfloat16, torch.bfloat16)
    # An explicit list, for any dtype, with dotted names; it replaces the model's own.
    assert loaded_dtypes(torch.bfloat16, keep=["norm"], keep_in_fp32_modules=["blocks.1"]) == (torch.float32,) * 3
    assert loaded_dtypes(torch.float16, keep=["norm"], keep_in_fp32_modules=["fc"]) == (
        torch.float16, torch.float32, torch.float16)
