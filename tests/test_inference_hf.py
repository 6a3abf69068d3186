"""Real Hugging Face checkpoints through load_checkpoint_and_dispatch (issue 21): small random transformers models
built from a config (nothing is downloaded), saved by transformers / huggingface_hub, loaded back onto cpu + disk."""
import json
import os
import shutil

import pytest
import torch

# transformers' own import is lazy; its model classes take ~2 CPU-s to import: they are read as attributes inside the
# tests (transformers.GPT2Config), not imported here, so that collection (every pytest worker collects every file,
# and only one of them runs this one) does not pay for them.
transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")
from huggingface_hub import save_torch_state_dict  # noqa: E402

from tasktrain.inference import init_empty_weights, load_checkpoint_and_dispatch, save_model  # noqa: E402

GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64, bos_token_id=0, eos_token_id=0)
# 545 KB in float32: wte 128 KB (tied to lm_head), wpe 16 KB, each GPT2Block 195 KB.
IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 4]])
# wte + wpe stay in CPU memory with room for one block brought in from disk; the blocks and ln_f go to disk.
CPU_AND_DISK = {"cpu": "400KB"}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval()


def empty_gpt2():
    with init_empty_weights():
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    model.tie_weights()
    return model.eval()


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture(scope="module")
def reference():
    return logits(gpt2())


def load(checkpoint, folder, **kwargs):
    model = empty_gpt2()
    return load_checkpoint_and_dispatch(model, checkpoint, max_memory=CPU_AND_DISK,
                                        no_split_module_classes=model._no_split_modules,
                                        offload_folder=folder, **kwargs)


def check_dispatched(model):
    assert model.hf_device_map["transformer.h.0"] == "disk" and model.hf_device_map["transformer.wte"] == "cpu"
    assert model.transformer.h[1].mlp.c_fc.weight.is_meta  # on disk while idle
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied


def test_sharded_safetensors_folder_onto_cpu_and_disk(tmp_path, reference):
    gpt2().save_pretrained(tmp_path / "gpt2", max_shard_size="200KB")
    shards = sorted(n for n in os.listdir(tmp_path / "gpt2") if n.endswith(".safetensors"))
    assert len(shards) == 3 and "lm_head.weight" not in json.loads(
        (tmp_path / "gpt2" / "model.safetensors.index.json").read_text())["weight_map"]
    model = load(tmp_path / "gpt2", tmp_path / "offload", strict=True)
    check_dispatched(model)
    assert torch.equal(logits(model), reference)
    assert torch.equal(logits(model), reference)  # again, after the disk weights were let go
    # The disk part is read from the shards themselves: nothing was copied.
    assert os.listdir(tmp_path / "offload") == ["index.json"]
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    assert {os.path.basename(e["safetensors_file"]) for e in index.values()} <= set(shards)
    # The index file itself works as the checkpoint too.
    model = load(tmp_path / "gpt2" / "model.safetensors.index.json", tmp_path / "offload2")
    assert torch.equal(logits(model), reference)


def test_single_safetensors_file(tmp_path, reference):
    gpt2().save_pretrained(tmp_path / "gpt2")
    assert "model.safetensors" in os.listdir(tmp_path / "gpt2")
    model = load(tmp_path / "gpt2" / "model.safetensors", tmp_path / "offload", strict=True)
    check_dispatched(model)
    assert torch.equal(logits(model), reference)


def test_sharded_bin_and_the_folder_prefers_safetensors(tmp_path, reference):
    # huggingface_hub writes the pytorch_model-0000i-of-0000N.bin layout (transformers 5 itself writes only safetensors).
    folder = tmp_path / "gpt2"
    folder.mkdir()
    save_torch_state_dict(gpt2().state_dict(), folder, safe_serialization=False, max_shard_size="200KB")
    assert "pytorch_model.bin.index.json" in os.listdir(folder)
    model = load(folder, tmp_path / "offload", strict=True)
    check_dispatched(model)
    assert torch.equal(logits(model), reference)
    # .bin tensors on disk are copied to the offload folder (raw files, memory-mapped when used).
    assert "transformer.h.0.attn.c_attn.weight.dat" in os.listdir(tmp_path / "offload")

    # Both formats in one folder: safetensors wins, as in transformers (here the .bin holds other weights).
    shutil.rmtree(folder)
    folder.mkdir()
    other = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    save_torch_state_dict(other.state_dict(), folder, safe_serialization=False, max_shard_size="200KB")
    gpt2().save_pretrained(folder, max_shard_size="200KB")
    model = load(folder, tmp_path / "offload3")
    assert torch.equal(logits(model), reference)


def test_llama_in_bfloat16_matches_transformers(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama", max_shard_size="100KB")
    expected_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.bfloat16).eval()
    with init_empty_weights():
        model = transformers.LlamaForCausalLM(config)
    # The rotary frequencies are a non-persistent buffer: init_empty_weights kept its real value.
    assert not model.model.rotary_emb.inv_freq.is_meta
    model = load_checkpoint_and_dispatch(model.eval(), tmp_path / "llama", max_memory={"cpu": "150KB"},
                                         no_split_module_classes=["LlamaDecoderLayer"], dtype=torch.bfloat16,
                                         offload_folder=tmp_path / "offload", strict=True)
    assert "disk" in model.hf_device_map.values()
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == expected_model.model.rotary_emb.inv_freq.dtype
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    # Converted on load, so copied to the offload folder; the rotary buffers (not in the checkpoint) stay float32.
    assert all("file" in e for e in index.values())
    assert {k for k, e in index.items() if e["dtype"] != "bfloat16"} <= {"model.rotary_emb.inv_freq",
                                                                         "model.rotary_emb.original_inv_freq"}
    assert index["model.layers.1.mlp.up_proj.weight"]["dtype"] == "bfloat16"
    ids = IDS % 300
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected_model(ids).logits)


def test_save_model_output_is_read_by_from_pretrained(tmp_path, reference):
    model = gpt2()
    for safe in (True, False):
        folder = tmp_path / ("safetensors" if safe else "bin")
        model.config.save_pretrained(folder)
        save_model(model, folder, max_shard_size="200KB", safe_serialization=safe)
        name = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
        assert json.loads((folder / name).read_text())["metadata"]["total_size"] == 544768
        again = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
        assert torch.equal(logits(again), reference)
        assert torch.equal(logits(load(folder, tmp_path / f"offload-{safe}", strict=True)), reference)


def test_strict_names_the_keys_of_a_model_that_does_not_match(tmp_path):
    gpt2().save_pretrained(tmp_path / "gpt2", max_shard_size="200KB")
    with init_empty_weights():
        bigger = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, "n_layer": 3}))
    with pytest.raises(ValueError, match=r"no value for 12 tensor\(s\).*'transformer.h.2.ln_1.weight'"):
        load_checkpoint_and_dispatch(bigger, tmp_path / "gpt2", device_map={"": "cpu"})
    with init_empty_weights():
        smaller = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, "n_layer": 1}))
    with pytest.raises(ValueError, match=r"strict=True\): unexpected key\(s\) 'transformer.h.1"):
        load_checkpoint_and_dispatch(smaller, tmp_path / "gpt2", device_map={"": "cpu"}, strict=True)
    with pytest.warns(UserWarning, match=r"12 entries the model does not use"):
        load_checkpoint_and_dispatch(smaller, tmp_path / "gpt2", device_map={"": "cpu"})


def test_a_base_model_checkpoint_loads_into_a_model_with_a_head(tmp_path):
    torch.manual_seed(0)
    base = transformers.GPT2Model(transformers.GPT2Config(**GPT2)).eval()
    base.save_pretrained(tmp_path / "base")  # keys "h.0.attn...", no "transformer." prefix
    model = load_checkpoint_and_dispatch(empty_gpt2(), tmp_path / "base", device_map={"": "cpu"}, strict=True)
    with torch.no_grad():
        assert torch.equal(model.transformer(IDS).last_hidden_state, base(IDS).last_hidden_state)
    assert model.lm_head.weight is model.transformer.wte.weight
