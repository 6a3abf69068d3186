"""Nothing in a checkpoint is code, on every path (issue 38): every file of every layout tasktrain reads is loaded the
weights_only way (its layout's allow-list in checkpoint_io.ALLOWED_GLOBALS), DCP's .metadata by an unpickler
restricted to DCP's records, and the files an engine's own loader unpickles (DeepSpeed's load_checkpoint and
zero_to_fp32, DCP's reader) are checked before it sees them. A payload (an object whose unpickling creates a marker
file) is refused with a CheckpointError naming the file and the type, and the marker never appears. The fuzz test
damages every file of every kind tasktrain writes: always a CheckpointError (or, for bytes flipped inside tensor data,
which no format here checksums, a load), never another error, never the marker, never a hang.

The checkpoints are built once per session, in one subprocess (checkpoint_scripts/build_kinds.py)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "checkpoint_scripts")
sys.path.insert(0, SCRIPTS)
import payloads  # noqa: E402

from tasktrain import CheckpointError  # noqa: E402

_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _run(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def kinds(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    proc = _run(os.path.join(SCRIPTS, "build_kinds.py"), str(root), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


def _copy(kinds, name, tmp_path):
    source = kinds / name
    target = tmp_path / name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    return target


# -- planted payloads: each case of issue 38 item 1 -------------------------------------------------------------------
def _deepspeed_files(directory):
    return sorted(os.path.relpath(os.path.join(d, n), directory) for d, _, names in os.walk(directory)
                  for n in names if n.endswith(".pt"))


def test_a_payload_in_any_deepspeed_file_is_refused_by_convert(kinds, tmp_path, capsys):
    """`tasktrain convert DIR out.ckpt --to ckpt`, `--format safetensors` and the weights-only convert: before, the
    payload ran from DeepSpeed's files (deepspeed_universal.py and zero_to_fp32 load with weights_only=False)."""
    from tasktrain.cli.main import main
    from tasktrain.strategies.deepspeed import convert_zero_checkpoint

    files = _deepspeed_files(kinds / "deepspeed.ckpt")
    assert len(files) == 3  # our state file, the model states and the ZeRO-2 optimizer states
    marker = tmp_path / "marker"
    for n, name in enumerate(files):
        directory = tmp_path / f"ds{n}"
        shutil.copytree(kinds / "deepspeed.ckpt", directory)
        payloads.plant_torch(directory / name, str(marker))
        for optimizer in (False, True):
            with pytest.raises(CheckpointError, match=rf"{os.path.basename(name)}.*pickled (io|builtins)\.open"):
                convert_zero_checkpoint(str(directory), optimizer=optimizer)
        for args in (["--to", "ckpt"], ["--format", "safetensors"], []):
            out = tmp_path / f"out{n}"
            assert main(["convert", str(directory), str(out), *args]) == 2
            assert "open, which is not" in capsys.readouterr().err, (name, args)
            assert not out.exists()
        assert not marker.exists(), name


def test_a_payload_in_an_fsdp_folder_is_refused_by_convert(kinds, tmp_path, capsys):
    """`.metadata` (DCP's reader unpickles it with pickle.load) and a non-tensor item of a `.distcp` file (DCP's
    planner unpickles those with weights_only=False)."""
    from tasktrain.cli.main import main
    from tasktrain.strategies.fsdp import convert_fsdp_checkpoint

    marker = tmp_path / "marker"
    for plant, where in ((payloads.plant_dcp_metadata, r"\.metadata"), (payloads.plant_dcp_item, r"\.distcp")):
        directory = tmp_path / plant.__name__
        shutil.copytree(kinds / "fsdp.ckpt", directory)
        plant(str(directory), str(marker))
        assert not marker.exists()
        with pytest.raises(CheckpointError, match=rf"{where}.*pickled (io|builtins)\.open"):
            convert_fsdp_checkpoint(str(directory), optimizer=True)
        assert main(["convert", str(directory), str(tmp_path / "out.ckpt"), "--to", "ckpt"]) == 2
        assert "open, which is not" in capsys.readouterr().err
        assert not marker.exists(), plant.__name__
    planted = tmp_path / "state"
    shutil.copytree(kinds / "fsdp.ckpt", planted)
    payloads.plant_torch(planted / "tasktrain_state.pt", str(marker))
    with pytest.raises(CheckpointError, match=r"tasktrain_state.pt.*pickled (io|builtins)\.open"):
        convert_fsdp_checkpoint(str(planted))
    assert not marker.exists()


@pytest.mark.timeout(600)
def test_fit_refuses_a_payload_in_deepspeed_and_fsdp_folders(kinds, tmp_path):
    """Trainer(strategy="deepspeed_stage_2").fit(ckpt_path=DIR) (DeepSpeed's own loader) and
    Trainer(strategy="fsdp").fit(ckpt_path=DIR) (DCP's reader): refused before anything runs, in one process."""
    marker = tmp_path / "marker"
    deepspeed = _copy(kinds, "deepspeed.ckpt", tmp_path)
    payloads.plant_torch(deepspeed / "zero" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", str(marker))
    fsdp = _copy(kinds, "fsdp.ckpt", tmp_path)
    payloads.plant_dcp_metadata(str(fsdp), str(marker))
    proc = _run(os.path.join(SCRIPTS, "resume_from.py"), str(fsdp), str(deepspeed))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fsdp: CheckpointError" in proc.stdout and "deepspeed_stage_2: CheckpointError" in proc.stdout, proc.stdout
    assert ".metadata" in proc.stdout and "optim_states.pt" in proc.stdout and "open, which is not" in proc.stdout
    assert not marker.exists()


# -- the fuzz test ------------------------------------------------------------------------------------------------------
def _load_trainer_file(path):
    from tasktrain.checkpoint_io import load_checkpoint_file

    load_checkpoint_file(path)


def _load_deepspeed(path):
    from tasktrain.strategies.deepspeed import convert_zero_checkpoint

    convert_zero_checkpoint(str(path), optimizer=True)


def _load_fsdp(path):
    from tasktrain.strategies.fsdp import convert_fsdp_checkpoint

    convert_fsdp_checkpoint(str(path), optimizer=True)


def _read_files(path):
    from tasktrain.inference.checkpoint_files import CheckpointFiles, ShardReader

    files = CheckpointFiles(str(path))
    reader = ShardReader(files)
    for key in files.keys():
        reader.get(key).sum()


def _dispatch(path):
    from tasktrain.inference.dispatch import load_checkpoint_and_dispatch

    def model():
        net = torch.nn.Module()
        net.a, net.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2, bias=False)
        return net

    load_checkpoint_and_dispatch(model, str(path), device_map={"": "cpu"}, strict=True)


# (kind, what to load it with, the files a mutation damages: every file the loader reads)
KINDS = [
    ("trainer.ckpt", _load_trainer_file, [""]),
    ("accelerator", lambda p: _load_trainer_file(p / "accelerator_state.pt"), ["accelerator_state.pt"]),
    ("deepspeed.ckpt", _load_deepspeed, ["tasktrain_state.pt", "zero/mp_rank_00_model_states.pt",
                                          "zero/zero_pp_rank_0_mp_rank_00_optim_states.pt"]),
    ("fsdp.ckpt", _load_fsdp, ["tasktrain_state.pt", ".metadata", "__0_0.distcp"]),
    ("model.safetensors", _dispatch, [""]),
    ("sharded", _dispatch, ["model.safetensors.index.json", "model-00001-of-00002.safetensors",
                            "model-00002-of-00002.safetensors"]),
    ("bin", _read_files, ["pytorch_model.bin"]),
]
CASES_PER_FILE = 4  # truncations and flips each, per file; a payload once per torch file


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind,load,files", KINDS, ids=[k[0] for k in KINDS])
def test_fuzz_every_checkpoint_kind(kinds, tmp_path, kind, load, files):
    load(kinds / kind)  # the undamaged checkpoint loads
    marker = tmp_path / "marker"
    outcomes = {"refused": 0, "loaded": 0}
    for name in files:
        cases = [("truncate", i) for i in range(CASES_PER_FILE)] + [("flip", i) for i in range(CASES_PER_FILE)]
        if name.endswith((".pt", ".ckpt", ".bin")) or (kind == "trainer.ckpt"):
            cases.append(("payload", 0))
        for how, i in cases:
            target = tmp_path / f"{how}{i}"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(kinds / kind, target) if (kinds / kind).is_dir() else shutil.copyfile(kinds / kind, target)
            damaged = target / name if name else target
            rng = payloads.rng_for(kind, name, how, i)
            if how == "payload":
                payloads.plant_torch(damaged, str(marker))
                what = "a planted payload"
            else:
                what = getattr(payloads, how)(damaged, rng)
            try:
                load(target)
            except CheckpointError:
                outcomes["refused"] += 1
            except Exception as err:  # any other error is a failure of this test
                pytest.fail(f"{kind}/{name} ({what}): {type(err).__name__}: {err}")
            else:
                # Only flipped bytes may go unnoticed (inside tensor data, or a flip that leaves the file valid).
                assert how == "flip", f"{kind}/{name} ({what}) loaded"
                outcomes["loaded"] += 1
            assert not marker.exists(), f"{kind}/{name} ({what}) ran the payload"
    assert outcomes["refused"] >= len(files) * CASES_PER_FILE, outcomes  # at least every truncation


# -- file-level failures (issue 38 item 4) ------------------------------------------------------------------------------
def _trained(root):
    from helpers import Linear, loader, quiet

    from tasktrain import Trainer

    trainer = Trainer(strategy="single_device", max_steps=1, default_root_dir=str(root), **quiet())
    trainer.fit(Linear(), loader())
    return trainer


def test_a_full_disk_says_how_much_and_keeps_the_previous_file(tmp_path, monkeypatch):
    from tasktrain import checkpoint_io

    trainer = _trained(tmp_path / "root")
    path = tmp_path / "files" / "run.ckpt"
    path.parent.mkdir()
    trainer.save_checkpoint(path)
    before = path.read_bytes()
    # free space already too small: refused before writing, with both figures
    monkeypatch.setattr(checkpoint_io, "free_bytes", lambda directory: 0)
    with pytest.raises(CheckpointError, match=r"needs at least \d+\.\d MiB and .* has 0\.0 MiB free"):
        trainer.save_checkpoint(path)
    assert path.read_bytes() == before and os.listdir(path.parent) == ["run.ckpt"]
    monkeypatch.undo()

    # the disk fills during the write: torch's own error is `unexpected pos`, the cause only in the chain
    def full(obj, f, *args, **kwargs):
        f.write(b"x" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint_io, "free_bytes", lambda directory: 12345 * 2**20)
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match=r"No space left .* needs at least .* has 12345\.0 MiB free"):
        trainer.save_checkpoint(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(path.parent) == ["run.ckpt"]


def test_the_next_save_removes_the_leftovers_of_dead_writers_only(tmp_path):
    import time

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        old = time.time() - 600
        names = {"dead": f"epoch=0-step=1.ckpt.tmp-{ended.pid}", "live": f"epoch=0-step=2.ckpt.tmp-{running.pid}",
                 "fresh": f"epoch=0-step=3.ckpt.tmp-{ended.pid}", "own": f"epoch=0-step=4.ckpt.tmp-{os.getpid()}",
                 "dead folder": f"out.tmp-{ended.pid}"}
        for what, name in names.items():
            if what == "dead folder":
                (tmp_path / name).mkdir()
                (tmp_path / name / "part.pt").write_bytes(b"x" * 1000)
            else:
                (tmp_path / name).write_bytes(b"x" * 1000)
            if what != "fresh":
                os.utime(tmp_path / name, (old, old))
        _trained(tmp_path.parent / f"{tmp_path.name}-root").save_checkpoint(tmp_path / "new.ckpt")
        assert sorted(os.listdir(tmp_path)) == sorted(["new.ckpt", names["live"], names["fresh"], names["own"]])
    finally:
        running.kill()
        running.wait()


def test_inference_loaders_raise_checkpoint_error_on_damaged_files(kinds, tmp_path):
    from tasktrain.inference.checkpoint_files import read_state_dict

    random_bytes = tmp_path / "random.bin"
    random_bytes.write_bytes(os.urandom(4096))
    truncated = tmp_path / "model.safetensors"
    truncated.write_bytes((kinds / "model.safetensors").read_bytes()[:200])
    for path in (random_bytes, truncated):
        with pytest.raises(CheckpointError, match=f"{path.name}.*truncated or corrupted"):
            read_state_dict(path)
        with pytest.raises(CheckpointError, match=f"{path.name}.*truncated or corrupted"):
            _dispatch(path)
