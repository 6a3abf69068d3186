"""A notebook session, as a script: the parent computes with torch first (its OpenMP pool is warm, as in a notebook
that ran cells before), then calls notebook_launcher on several functions defined here, as cells would, and
records what each did in OUT/report.json (the children write OUT/<case>/rank<R>.json). tests/test_notebook_launcher.py
runs it once and checks every case.

    python notebook_driver.py OUT
"""
import json
import os
import socket
import sys
import time
import traceback

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Accelerator, PartialState, notebook_launcher

OUT = sys.argv[1]
report = {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def write(case, record):
    os.makedirs(os.path.join(OUT, case), exist_ok=True)
    with open(os.path.join(OUT, case, f"rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)


def train(case, scale):
    """Trains a linear model on 16 samples, batch 4, with an Accelerator built here (inside the function)."""
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    start = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    seen = 0
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen += len(x)
    gathered = accelerator.gather(torch.tensor([float(accelerator.process_index) * scale]))
    weight = accelerator.unwrap_model(model).weight.detach()
    write(case, {"rank": accelerator.process_index, "num_processes": accelerator.num_processes,
                 "distributed_type": str(accelerator.distributed_type), "mixed_precision": accelerator.mixed_precision,
                 "gathered": gathered.tolist(), "seen": seen, "weight": weight.flatten().tolist(),
                 "moved": float((weight - start).abs().sum()), "threads": torch.get_num_threads(), "pid": os.getpid(),
                 "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")})


def fail_on_rank_1(sleep_seconds):
    state = PartialState()
    if state.process_index == 1:
        raise ValueError("rank 1 refuses to train")
    time.sleep(sleep_seconds)  # the monitor must stop this process long before


def fail_on_first_attempt(case):
    state = PartialState()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    write(f"{case}-attempt{attempt}", {"rank": state.process_index, "restart": attempt})
    if attempt == 0 and state.process_index == 1:
        raise RuntimeError("first attempt fails")
    state.wait_for_everyone()


def case(name):
    def run(body):
        started = time.monotonic()
        try:
            report[name] = {"ok": True, **(body() or {})}
        except Exception as err:  # recorded: the test says which case failed and why
            report[name] = {"ok": False, "type": type(err).__name__, "error": str(err)[-3000:],
                            "traceback": traceback.format_exc()[-3000:]}
        report[name]["seconds"] = time.monotonic() - started
        with open(os.path.join(OUT, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
    return run


a = torch.randn(256, 256)
for _ in range(20):  # OpenMP parallel regions in the parent: a plain fork would hang its children's first op
    a = (a @ a).tanh()
report["parent_threads"] = torch.get_num_threads()


@case("static")
def _():
    notebook_launcher(train, ("static", 10.0), num_processes=2, use_port=free_port(), mixed_precision="bf16")


@case("c10d")
def _():
    notebook_launcher(train, ("c10d", 1.0), num_processes=2, use_port=free_port(), rdzv_backend="c10d")


@case("fails")
def _():
    try:
        notebook_launcher(fail_on_rank_1, (120,), num_processes=2, use_port=free_port(), monitor_interval=0.05)
    except ChildFailedError as err:
        return {"raised": type(err).__name__, "message": str(err)[-3000:]}
    return {"raised": None}


@case("restart")
def _():
    notebook_launcher(fail_on_first_attempt, ("restart",), num_processes=2, use_port=free_port(), max_restarts=1)


@case("single")
def _():
    # Last: this one builds an Accelerator in this very process.
    notebook_launcher(train, ("single", 1.0), num_processes=1, mixed_precision="bf16")
    return {"parent_pid": os.getpid()}


@case("after_accelerator")
def _():
    try:
        notebook_launcher(train, ("never", 1.0), num_processes=2, use_port=free_port())
    except ValueError as err:
        return {"raised": str(err)}
    return {"raised": None}
