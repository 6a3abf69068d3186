"""Self-launched ranks share the machine's CPUs out (Lightning's _set_num_threads_if_needed): with OMP_NUM_THREADS
unset, each of N ranks gets cpus // N torch threads (at least 1), not one per core each; a user's OMP_NUM_THREADS
stays. (Measured: `make demo`, 2 ranks on 2 cores, 47 CPU-s with 2 threads a rank, 20 with 1.)"""
import os
import subprocess

import pytest
import torch

from tasktrain.strategies import launcher
from tasktrain.strategies.launcher import SubprocessLauncher, threads_per_process


@pytest.fixture
def environ(monkeypatch):
    """A private os.environ (launch() writes RANK, MASTER_PORT, ... into it) and torch's thread count put back."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    monkeypatch.setattr(os, "environ", env)
    threads = torch.get_num_threads()
    yield env
    torch.set_num_threads(threads)


def test_threads_per_process_shares_the_cpus_and_keeps_the_users_setting(environ, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    assert [threads_per_process(n) for n in (1, 2, 3, 8, 16)] == ["8", "4", "2", "1", "1"]
    environ["OMP_NUM_THREADS"] = "3"
    assert threads_per_process(2) is None


@pytest.mark.parametrize("users", [None, "3"])
def test_self_launch_gives_every_rank_its_share(environ, monkeypatch, users):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    if users:
        environ["OMP_NUM_THREADS"] = users
    started = []

    class Proc:
        def __init__(self, cmd, env):
            started.append(env)

        def poll(self):
            return None

    monkeypatch.setattr(subprocess, "Popen", Proc)
    # (the command the children would run: under pytest-xdist this process has no script file to re-run)
    monkeypatch.setattr(launcher, "_command", lambda: ["python", "train.py"])
    monkeypatch.setattr(launcher.atexit, "register", lambda fn: None)
    torch.set_num_threads(4)
    run = SubprocessLauncher(2)
    try:
        run.launch()
    finally:
        run._ending = True  # the watcher thread of the fake children stops
    assert [env["RANK"] for env in started] == ["1"]
    if users:  # the user's setting reaches the children unchanged, and rank 0's threads are left alone
        assert started[0]["OMP_NUM_THREADS"] == environ["OMP_NUM_THREADS"] == "3"
        assert torch.get_num_threads() == 4
    else:  # 4 CPUs, 2 ranks: 2 threads each, rank 0 (this process) included
        assert started[0]["OMP_NUM_THREADS"] == environ["OMP_NUM_THREADS"] == "2"
        assert torch.get_num_threads() == 2
