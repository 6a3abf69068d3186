"""fsdp_cpu_ram_efficient_loading (FSDP(cpu_ram_efficient_loading=True)): an Accelerate FSDP2 YAML as `accelerate
config` writes it (tests/data/accelerate_fsdp2.yaml) runs under `tasktrain launch --config_file` on 2 CPU processes,
and every rank starts from rank 0's weights: those of a model each rank initialised differently, and those of a
model only rank 0 built in memory (the other on the meta device). One launch (tests/fsdp_scripts/loading.py)."""
import os
import subprocess
import sys

import pytest
import torch

from tasktrain import FSDP
from tasktrain.cli.config import load_config

HERE = os.path.dirname(os.path.abspath(__file__))
YAML = os.path.join(HERE, "data", "accelerate_fsdp2.yaml")
SCRIPT = os.path.join(HERE, "fsdp_scripts", "loading.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT = 240


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_yaml_resolves_to_fsdp_loading_from_rank_0(tmp_path):
    settings = load_config(YAML, {})
    assert settings.strategy == "fsdp" and settings.num_processes == 2
    assert settings.fsdp["cpu_ram_efficient_loading"] is True and settings.fsdp["wrap"] == ["Block"]
    assert FSDP(cpu_ram_efficient_loading=True).cpu_ram_efficient_loading is True
    with pytest.raises(TypeError, match="cpu_ram_efficient_loading"):
        FSDP(cpu_ram_efficient_loading="yes")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("loading") / "out")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    env["TASKTRAIN_CONFIG_DIR"] = os.path.dirname(out)  # never the developer's own default config
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, "-m", "tasktrain.cli.main", "launch", "--config_file", YAML, SCRIPT,
                               out], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"tasktrain launch did not finish within {TIMEOUT} s:\n{err.stdout}\n{err.stderr}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [torch.load(f"{out}.rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.world_size(2)
@pytest.mark.timeout(TIMEOUT + 30)
def test_every_rank_starts_from_rank_0s_weights(ranks):
    r0, r1 = ranks
    assert r0["strategy"] == "FSDP" and r0["cpu_ram_efficient_loading"] is True
    assert "blocks.0" in r0["wrapped"] and "blocks.1" in r0["wrapped"]  # fsdp_transformer_layer_cls_to_wrap: Block
    assert not same(r0["own"], r1["own"])  # the ranks' own initial weights differ ...
    for record in (r0, r1):
        assert same(record["start"], r0["own"])  # ... and both start from rank 0's
        assert torch.equal(record["start_scale"], r0["own_scale"])  # a non-persistent buffer too
    assert not torch.equal(r0["own_scale"], r1["own_scale"])


@pytest.mark.world_size(2)
@pytest.mark.timeout(TIMEOUT + 30)
def test_the_run_trains(ranks):
    r0, r1 = ranks
    assert r0["losses"] == r1["losses"]
    assert all(b < a for a, b in zip(r0["losses"], r0["losses"][1:])), r0["losses"]
    assert same(r0["trained"], r1["trained"]) and not same(r0["trained"], r0["start"])
    for key, value in r0["reference"].items():  # one process, unsharded, from rank 0's weights
        torch.testing.assert_close(r0["trained"][key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.world_size(2)
@pytest.mark.timeout(TIMEOUT + 30)
def test_under_init_module_only_rank_0_builds_the_model(ranks):
    r0, r1 = ranks
    assert r0["built_on_meta"] is False and r1["built_on_meta"] is True
    for record in (r0, r1):
        assert same(record["built_start"], r0["built"])
        assert torch.equal(record["built_scale"], r0["built"].get("scale", r0["built_scale"]))
    assert torch.equal(r1["built_scale"], r0["built_scale"])
