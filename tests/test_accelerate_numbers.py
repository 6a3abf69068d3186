"""A script moved from Accelerate trains to Accelerate's weights (issue 41).

Small scripts shaped like Accelerate 1.15's examples (accelerator_scripts/numbers_worker.py: cv_example,
complete_nlp_example / gradient_accumulation, automatic_gradient_accumulation, cross_validation, checkpointing and
its resume) run under Accelerate itself and, imports renamed, under tasktrain, one after the other in the same
processes: one process (the weights must be equal bit for bit) and two gloo processes through `tasktrain launch`
(within float-summation noise: NOISE). The sources of difference this pins: what set_seed seeds, the global random
draws prepare and each epoch make (the plain DataLoader's on one process, a generator seeded by one draw at prepare
and broadcast from rank 0 on two), reading one batch ahead (a data set drawing from the global generator
interleaves with dropout), the scheduler's steps per process, accumulate()'s loss division and clipping.

Where Accelerate's own resume is not exact (its loaders keep no order state: a resumed epoch is drawn anew), ours
is: our resume equals the uninterrupted run, and a folder written by one framework loads in the other."""
import os
import subprocess
import sys

import pytest
import torch

from test_accelerator import SCRIPTS, clean_env, launch

WORKER = os.path.join(SCRIPTS, "numbers_worker.py")
TRAINED = ["vision", "nlp", "options", "autoacc", "crossval", "resume_full"]
CASES = TRAINED + ["resume_save", "resume_load", "resume_cross"]
SINGLE = {"autoacc", "crossval"}  # nothing distributed of their own: run on one process only (test time)
NOISE = 1e-6  # two processes: gloo's all-reduce may sum in another order than Accelerate's DDP; fp32 noise


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-processes"])
def runs(request, tmp_path_factory):
    """Every case under both frameworks in one run: {(case, framework, rank): what the worker saved}."""
    world = request.param
    out = tmp_path_factory.mktemp(f"numbers{world}")
    cases = CASES if world == 1 else [case for case in CASES if case not in SINGLE]
    args = [WORKER, "accelerate,tasktrain", str(out), *cases]
    if world == 1:
        run = subprocess.run([sys.executable, *args], cwd=out, env=clean_env(out), capture_output=True, text=True,
                             timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    else:
        launch(["--num_processes", "2", *args], out, timeout=240)
    results = {}
    for case in cases:
        for framework in ("accelerate", "tasktrain"):
            for rank in range(world):
                results[case, framework, rank] = torch.load(out / f"{case}_{framework}_rank{rank}.pt",
                                                            weights_only=False)
    return world, out, results


def difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.timeout(300)
def test_trained_weights_are_accelerates(runs):
    world, _, results = runs
    cases = [case for case in TRAINED if world == 1 or case not in SINGLE]
    for case in cases:
        for rank in range(world):
            theirs, ours = results[case, "accelerate", rank], results[case, "tasktrain", rank]
            assert theirs["num_processes"] == ours["num_processes"] == world
            if world == 1:
                assert difference(theirs["weights"], ours["weights"]) == 0.0, case
            else:
                assert difference(theirs["weights"], ours["weights"]) <= NOISE, case
                assert difference(ours["weights"], results[case, "tasktrain", 0]["weights"]) == 0.0  # one model
            # what the script measured on the way: metrics, clipped norms, learning rate, the global generator after
            for key in theirs.keys() - {"weights", "num_processes"}:
                if torch.is_tensor(theirs[key]):
                    assert (theirs[key] - ours[key]).abs().max().item() <= (0.0 if world == 1 else NOISE), key
                elif key == "norms" and world > 1:
                    assert ours[key] == pytest.approx(theirs[key], rel=1e-5), (case, key)
                else:
                    assert theirs[key] == ours[key], (case, key)


@pytest.mark.timeout(300)
def test_save_state_writes_accelerates_folders_and_resumes_exactly(runs):
    world, out, results = runs
    for rank in range(world):
        theirs, ours = results["resume_save", "accelerate", rank], results["resume_save", "tasktrain", rank]
        # ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2): the same folders, Accelerate's
        # files in them (ours adds accelerator_state.pt: the loaders' positions, for an exact resume)
        assert theirs["folders"] == ours["folders"] == ["checkpoint_1", "checkpoint_2"]
        assert set(theirs["files"]) == {"model.safetensors", "optimizer.bin", "scheduler.bin",
                                        *(f"random_states_{r}.pkl" for r in range(world))}
        assert set(ours["files"]) == set(theirs["files"]) | {"accelerator_state.pt"}
        # our resume continues exactly: the weights and the global generator of the uninterrupted run (which are
        # Accelerate's: test_trained_weights_are_accelerates[resume_full])
        full, resumed = results["resume_full", "tasktrain", rank], results["resume_load", "tasktrain", rank]
        assert difference(full["weights"], resumed["weights"]) == 0.0
        assert full["rng"] == resumed["rng"]
        # across frameworks: Accelerate resumes from our folder as from its own, and we from Accelerate's folder
        # as Accelerate does (it has no loader positions: the script's skip_first_batches places the loader)
        accelerate_resumed = results["resume_load", "accelerate", rank]["weights"]
        assert difference(results["resume_cross", "accelerate", rank]["weights"], accelerate_resumed) == 0.0
        assert difference(results["resume_cross", "tasktrain", rank]["weights"], accelerate_resumed) <= \
            (0.0 if world == 1 else NOISE)
    # and Accelerate's own resume is not exact here (the resumed epoch is drawn again): what ours avoids
    assert difference(results["resume_full", "accelerate", 0]["weights"],
                      results["resume_load", "accelerate", 0]["weights"]) > 1e-4
