"""LocalSGD: local steps without the gradient all-reduce, the parameters averaged every `local_sgd_steps` steps.

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in data:
            ...                                      # backward under no_sync: each process keeps its own gradient
            optimizer.step()
            local_sgd.step()                         # every 8th call: parameters averaged over the processes

Accelerate's context manager (`accelerate.local_sgd.LocalSGD`, `tasktrain.local_sgd.LocalSGD` under the rename
rule). The processes' models drift apart between averages, and so do their optimizers' states (each steps on its
own gradients): save_state keeps what a resume needs to continue exactly, every process's optimizer state and,
between two averages, every process's parameters and the step count (the `local_sgd` part of the Accelerator's run
state, LocalSGDRecord below). A process group of one, or enabled=False, makes it a pass-through.
"""
import contextlib

import torch
import torch.distributed as dist

from tasktrain.strategies.base import Sharded


class LocalSGD:
    """Local SGD over `model` (the prepared model) of `accelerator`: no gradient all-reduce inside the `with`,
    the parameters averaged at every `local_sgd_steps`-th step() and when the `with` ends (not when it ends by an
    exception: the other processes may be at another collective then; Accelerate averages in that case too). DDP
    only (a sharding engine's parameters are not each process's own): DeepSpeed, FSDP and model parallelism raise
    NotImplementedError, as in Accelerate."""

    def __init__(self, accelerator, model, local_sgd_steps, enabled=True):
        strategy = accelerator.strategy
        if accelerator.use_distributed and isinstance(strategy, Sharded):
            raise NotImplementedError(f"LocalSGD averages each process's own copy of the model, which "
                                      f"{strategy.describe()} does not keep: use it with DDP (or one process).")
        self.enabled = bool(enabled) and accelerator.use_distributed
        self.num_steps = 0
        self.accelerator, self.model, self.local_sgd_steps = accelerator, model, local_sgd_steps
        self._inside = False
        self._sync_off = None
        if not self.enabled:
            return
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"LocalSGD(local_sgd_steps={local_sgd_steps!r}): use a positive integer (optimizer "
                             "steps between two parameter averages).")
        record = accelerator._local_sgd
        self.model_index = record.model_index(model)
        # a resume: the steps this `with` had made since its last average when save_state ran
        self.num_steps = record.take_resumed_steps(self.model_index)
        record.current = self

    def __enter__(self):
        if self.enabled:
            self._sync_off = contextlib.ExitStack()
            self._sync_off.enter_context(self.accelerator.no_sync(self.model))
            self._inside = True
        return self

    def __exit__(self, kind, value, traceback):
        if self.enabled:
            try:
                if kind is None:  # an exception: the other processes may never reach the average
                    self._average()
            finally:
                self._inside = False
                self._sync_off.close()

    def step(self):
        """One local step; every local_sgd_steps-th averages the parameters over the processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    def _average(self):
        params = [p for p in self.model.parameters()]
        world = self.accelerator.num_processes
        with torch.no_grad():
            # one all-reduce per dtype and device, not one per tensor
            for group in _by_dtype_and_device(params):
                flat = torch.cat([p.detach().reshape(-1) for p in group])
                dist.all_reduce(flat)
                flat.div_(world)
                offset = 0
                for p in group:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()

    def _diverged(self):
        return self._inside and self.num_steps % self.local_sgd_steps != 0

    def _optimizers(self):
        ids = {id(p) for p in self.model.parameters()}
        return [opt for opt in self.accelerator._optimizers if opt.parameter_ids() & ids]

    def state_dict(self):
        """Every process's part (a collective: save_state calls it on every process): its optimizers' states and,
        between two averages, its parameters and this `with`'s step count."""
        strategy = self.accelerator.strategy
        mine = {"optimizers": [strategy.optimizer_state(opt.optimizer) for opt in self._optimizers()]}
        if self._diverged():
            mine["parameters"] = [p.detach().cpu().clone() for p in self.model.parameters()]
        return {"model": self.model_index, "local_sgd_steps": self.local_sgd_steps,
                "num_steps": self.num_steps if self._inside else 0, "processes": strategy.all_gather_object(mine)}


class LocalSGDRecord:
    """The Accelerator's `local_sgd` run-state part: the last enabled LocalSGD made on it (None before), and the
    step count a resume hands to the next LocalSGD over the same model."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.current = None
        self._resumed = None  # (model index, num_steps) from load_state

    def model_index(self, model):
        for index, (prepared, _) in enumerate(self.accelerator._models):
            if model is prepared:
                return index
        raise ValueError("LocalSGD(model=...) needs the model accelerator.prepare returned (the DDP wrapper whose "
                         "gradient all-reduce it holds back): prepare the model first and pass what prepare gave.")

    def take_resumed_steps(self, model_index):
        resumed, self._resumed = self._resumed, None
        if resumed is not None and resumed[0] == model_index:
            return resumed[1]
        return 0

    def state_dict(self):
        current = self.current
        return None if current is None or not current.enabled else current.state_dict()

    def load_state_dict(self, state):
        """This process's optimizer states and parameters from the file (the models and optimizers were loaded
        from rank 0's just before); the step count waits for the next LocalSGD."""
        if state is None:
            return
        accelerator = self.accelerator
        processes = state["processes"]
        if len(processes) != accelerator.num_processes:
            if any("parameters" in part for part in processes):
                raise ValueError(f"This state was saved by LocalSGD on {len(processes)} processes between two "
                                 f"parameter averages (each process held its own parameters), and this run has "
                                 f"{accelerator.num_processes}. Resume on {len(processes)} processes, or save "
                                 "right after an average (local_sgd.step() at a multiple of local_sgd_steps, or "
                                 "after the `with` ends).")
            return  # every process continues from rank 0's optimizer state, as after any resume
        mine = processes[accelerator.process_index]
        model = accelerator._models[state["model"]][0]
        ids = {id(p) for p in model.parameters()}
        optimizers = [opt for opt in accelerator._optimizers if opt.parameter_ids() & ids]
        for optimizer, optimizer_state in zip(optimizers, mine["optimizers"]):
            accelerator.strategy.load_optimizer_state(optimizer.optimizer, optimizer_state)
        if "parameters" in mine:
            with torch.no_grad():
                for param, saved in zip(model.parameters(), mine["parameters"]):
                    param.copy_(saved)
        current = self.current
        if current is not None and current._inside and current.model_index == state["model"]:
            current.num_steps = int(state["num_steps"])  # load_state inside the `with`: it continues the count
        else:
            self._resumed = (state["model"], int(state["num_steps"]))


def _by_dtype_and_device(params):
    groups = {}
    for p in params:
        groups.setdefault((p.dtype, p.device), []).append(p)
    return list(groups.values())
