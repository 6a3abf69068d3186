"""Automatic restarts with background checkpoints (issue 29), with real processes.

`tasktrain launch --num_processes 2 --max_restarts 3` runs restart_scripts/train.py (2 gloo processes, a tiny
model, ModelCheckpoint(async_save=True) at every step); a rank picked at random (fixed seed) is SIGKILLed at three
moments, one of them inside a background write. (The three strategies' killed runs share one launch, --max_restarts
9, after their uninterrupted references: each run is restarted three times, each restart skips the runs done.) torch's elastic agent restarts both workers each time and the fit,
given no ckpt_path, resumes from the newest complete checkpoint of the launch. The end must be bitwise the
uninterrupted run's: the weights, every rank's optimizer state and the sample ids of every step.
"""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "restart_scripts", "train.py")
ROOT = os.path.dirname(HERE)


def launch(root, strategy=None, kills="", timeout=420, plain=False, runs=None):
    """tasktrain launch --max_restarts 3 (plain=True: `python train.py` with Trainer(max_restarts=3)); runs: the
    script's --runs (several runs in turn), --max_restarts their kills in all."""
    os.makedirs(root, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "TASKTRAIN_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    script = [SCRIPT, "--root", str(root), "--out", os.path.join(root, "out")]
    script += ["--runs", json.dumps(runs)] if runs else ["--strategy", strategy]
    restarts = sum(len(k.split(",")) for _, _, k in runs if k) if runs else 3
    if plain:
        cmd = [sys.executable, *script, "--trainer-restarts", str(restarts)]
    else:
        cmd = [sys.executable, "-m", "tasktrain.cli", "launch", "--num_processes", "2", "--use_cpu", "--max_restarts",
               str(restarts), *script]
    if kills:
        cmd += ["--kills", kills]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def outputs(out):
    return [torch.load(f"{out}.rank{r}.pt", weights_only=True) for r in range(2)]


def kill_plan(seed):
    """Three (step, rank, when) moments: increasing steps (each attempt gets past the previous one's checkpoint),
    one of them inside a background write."""
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(2, 11), 3))
    whens = ["step", "write", "step"]
    rng.shuffle(whens)
    return ",".join(f"{s}:{rng.randrange(2)}:{w}" for s, w in zip(steps, whens))


STRATEGIES = ["ddp", "zero2", "fsdp"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch (--max_restarts 9) for every strategy: the uninterrupted run of each, one after the other in the
    same two processes, then each strategy's run killed three times (its plan below), one after the other; each
    restart skips the runs already done, so the launch's processes and imports start once per attempt (10), not once
    per strategy and attempt (3 references and 3 x 4 attempts in four launches). Returns ({strategy: the reference's
    ranks}, {strategy: (plan, the killed run's ranks, the attempt it ended in)}, the launch's output, its root)."""
    root = tmp_path_factory.mktemp("launched")
    plans = {strategy: kill_plan(seed={"ddp": 0, "zero2": 1, "fsdp": 2}[strategy]) for strategy in STRATEGIES}
    runs = [[f"ref-{s}", s, ""] for s in STRATEGIES] + [[f"killed-{s}", s, plans[s]] for s in STRATEGIES]
    proc = launch(root, runs=runs, timeout=1080)
    references = {s: outputs(os.path.join(root, f"out-ref-{s}")) for s in STRATEGIES}
    killed = {s: (plans[s], outputs(os.path.join(root, f"out-killed-{s}")), 3 * (i + 1))
              for i, s in enumerate(STRATEGIES)}
    return references, killed, proc.stdout + proc.stderr, root


@pytest.fixture(scope="module")
def references(launched):
    return launched[0]


def assert_same_end(ref_ranks, got_ranks, plan, output, attempt=3, restarts=None):
    """attempt: the attempt the killed run must end in (the fourth of its own: 3 restarts); restarts: the output's
    lines of its restarts (default: every restart line of the output)."""
    for rank in range(2):
        ref, got = ref_ranks[rank], got_ranks[rank]
        assert got["attempt"] == attempt, f"{plan}: expected attempt {attempt} to finish (3 restarts of this run)\n" \
                                          f"{output[-4000:]}"
        assert got["global_step"] == ref["global_step"] == 12
        assert got["samples"] == ref["samples"], plan
        assert ref["weights"].keys() == got["weights"].keys()
        for name in ref["weights"]:
            assert torch.equal(ref["weights"][name], got["weights"][name]), (plan, name)
        assert len(ref["optimizer"]) == len(got["optimizer"]) > 0
        for a, b in zip(ref["optimizer"], got["optimizer"]):
            assert torch.equal(a, b), plan
    if restarts is None:
        restarts = [line for line in output.splitlines() if "restart " in line]
    assert len(restarts) >= 3, restarts  # "[tasktrain] restart N of this launch: resuming from ..."


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_killed_three_times_ends_bitwise_as_uninterrupted(launched, strategy):
    references, killed, output, root = launched
    plan, ranks, attempt = killed[strategy]
    # this run's restarts: the attempts that resumed it from its own checkpoints
    folder = os.path.join(str(root), f"killed-{strategy}") + os.sep
    restarts = [line for line in output.splitlines() if "restart " in line and folder in line]
    assert_same_end(references[strategy], ranks, plan, output, attempt=attempt, restarts=restarts)


@pytest.mark.timeout(1200)
def test_trainer_max_restarts_starts_the_elastic_agent_itself(tmp_path, references):
    """`python train.py` with Trainer(strategy="ddp", devices=2, max_restarts=3): the process becomes torch's elastic
    agent, and the same three kills end as the uninterrupted run."""
    plan = kill_plan(seed=3)
    proc = launch(tmp_path / "killed", "ddp", kills=plan, plain=True)
    output = proc.stdout + proc.stderr
    assert "under torch's elastic agent" in output
    assert_same_end(references["ddp"], outputs(tmp_path / "killed" / "out"), plan, output)
