"""SLURM on a real cluster: munged, slurmctld and two slurmd on this machine (tests/slurm_cluster.py), started once per
test session by the `cluster` fixture (this file only, so one pytest worker owns them) and stopped by pid at the end.
Jobs are real sbatch / srun / salloc jobs; docs/slurm.md's sbatch scripts run as written. Every wait is bounded."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from slurm_cluster import Cluster, missing_programs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "slurm_scripts")
JOB_TIMEOUT = 150  # seconds for one job on a loaded 2-core machine
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    missing = missing_programs()
    if missing:
        pytest.fail(f"SLURM's programs are missing ({', '.join(missing)}): run `make setup` as root (it installs "
                    "Debian's slurmd slurmctld slurm-client munge).")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def docs_script(name):
    """The sbatch script `# file: <name>` of docs/slurm.md, as written there."""
    text = open(os.path.join(ROOT, "docs", "slurm.md")).read()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        if f"# file: {name}\n" in block:
            return block
    raise AssertionError(f"docs/slurm.md has no bash block '# file: {name}'")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_folder(tmp_path, name):
    """A job's working folder with the test's training scripts as train.py / train_accelerator.py."""
    folder = tmp_path / name
    folder.mkdir()
    for script in ("train.py", "train_accelerator.py"):
        shutil.copy(os.path.join(SCRIPTS, script), folder / script)
    (folder / "out").mkdir()
    return folder


def job_env(folder, **settings):
    env = {"SLURM_TEST_OUT": str(folder / "out"), "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.update({f"SLURM_TEST_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def submit(cluster, folder, script_text, *args, **settings):
    # --time=10: docs' scripts ask for SIGUSR1 120 s before the limit, which must not come on its own here
    path = folder / "job.sbatch"
    path.write_text(script_text)
    result = cluster.run(["sbatch", "--parsable", "--time=10", f"--chdir={folder}", f"--output={folder}/job.log",
                          *args, str(path)], env=job_env(folder, **settings), cwd=str(folder))
    return result.stdout.strip().split(";")[0]


def job_state(cluster, job):
    line = cluster.run(["scontrol", "show", "job", "-o", job]).stdout
    return dict(re.findall(r"(\w+)=(\S*)", line))


def wait_job(cluster, job, until=FINAL, timeout=JOB_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(cluster, job)
        if state.get("JobState") in until:
            return state
        time.sleep(0.5)
    cluster.run(["scancel", job], check=False)
    raise AssertionError(f"job {job} not in {until} after {timeout} s: {job_state(cluster, job)}\n"
                         + cluster.logs())


def wait_file(path, job, cluster, timeout=JOB_TIMEOUT):
    deadline, polls = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return
        # the job's state (an scontrol process and a munge-signed call to slurmctld, ~7 ms of CPU) once a second;
        # the file, which costs nothing to look at, five times
        polls += 1
        if polls % 5 == 0 and job_state(cluster, job).get("JobState") in FINAL:
            break
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear: job {job_state(cluster, job)}")


def log(folder):
    return (folder / "job.log").read_text(errors="replace") if (folder / "job.log").exists() else ""


def facts(folder, world):
    out = []
    for rank in range(world):
        path = folder / "out" / f"facts-rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no facts:\n{log(folder)}"
        out.append(json.loads(path.read_text()))
    return out


def torchrun_reference(tmp_path):
    """The same training under torchrun, 2 processes (started, not waited for)."""
    folder = job_folder(tmp_path, "torchrun")
    env = dict(os.environ, **job_env(folder))
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k.startswith("SLURM_TEST_")}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", str(free_port()), "train.py"], cwd=str(folder), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return folder, proc


def requeue_and_release(cluster, job, folder, mark):
    """Send SLURM's warning signal once the run is past step `mark`, wait for the requeue, release the job from
    SLURM's requeue delay (an administrator's command) and wait for it to finish."""
    wait_file(folder / "out" / f"step-{mark}.mark", job, cluster)
    cluster.run(["scancel", "--signal=USR1", job])  # to the job's steps, as --signal=USR1@N does
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        state = job_state(cluster, job)
        if int(state.get("Restarts", "0")) >= 1 and state.get("JobState") == "PENDING":
            break
        if state.get("JobState") in FINAL:
            raise AssertionError(f"job {job} ended instead of being requeued: {state}\n{log(folder)}")
        time.sleep(0.3)
    else:
        raise AssertionError(f"job {job} was not requeued: {job_state(cluster, job)}\n{log(folder)}")
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    return wait_job(cluster, job)


def signal_and_wait(cluster, job, folder, mark, sig):
    """Another signal than the requeue signal, once the run is past step `mark`; the job's final state."""
    wait_file(folder / "out" / f"step-{mark}.mark", job, cluster)
    cluster.run(["scancel", f"--signal={sig}", job])
    return wait_job(cluster, job)


class Preemption(threading.Thread):
    """requeue_and_release (or signal_and_wait with sig=) in the background from the job's start on, so the signal
    comes while the job trains, whatever the test waits for meanwhile; result() joins (bounded) and returns the job's
    final state."""

    def __init__(self, cluster, job, folder, mark, sig=None):
        super().__init__(daemon=True)
        self.args, self.sig, self.state, self.error = (cluster, job, folder, mark), sig, None, None
        self.start()

    def run(self):
        try:
            self.state = signal_and_wait(*self.args, self.sig) if self.sig else requeue_and_release(*self.args)
        except BaseException as err:  # handed to the test in result()
            self.error = err

    def result(self):
        self.join(timeout=3 * JOB_TIMEOUT)
        if self.is_alive():
            raise AssertionError(f"the pre-emption of job {self.args[1]} did not end within {3 * JOB_TIMEOUT} s")
        if self.error is not None:
            raise self.error
        return self.state


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Every long job of this file, started together so that they overlap: docs' Trainer script on 2 nodes x 1 task
    (uninterrupted), the same script pre-empted by SLURM's warning signal, torchrun's run, docs' Accelerator script
    uninterrupted and pre-empted, docs' `tasktrain launch` script pre-empted, and the srun / salloc commands of
    CHECKS (1 node x 2 tasks is the salloc one)."""
    tmp = tmp_path_factory.mktemp("runs")
    runs = {}

    def job(name, script, *args, preempt_at=None, sig=None, **settings):
        folder = job_folder(tmp, name)
        if preempt_at:
            settings.update(mark=preempt_at)
        job = submit(cluster, folder, script, *args, **settings)
        runs[name] = (folder, job, Preemption(cluster, job, folder, preempt_at, sig) if preempt_at else None)

    trainer = docs_script("trainer.sbatch")
    job("two_nodes", trainer)
    job("preempted", trainer, sleep=0.4, preempt_at=3)
    one_task = ("--nodes=1", "--ntasks-per-node=1")  # what these two check needs no second process
    job("sigterm", trainer, *one_task, sleep=0.4, preempt_at=3, sig="TERM")
    job("requeue_off", trainer, *one_task, "--export=ALL,TASKTRAIN_SLURM_REQUEUE=0", sleep=0.4, preempt_at=3,
        sig="USR1")
    runs["torchrun"] = torchrun_reference(tmp)
    job("accelerator", docs_script("accelerator.sbatch"), steps=24)
    job("accelerator_pre", docs_script("accelerator.sbatch"), steps=24, sleep=0.3, preempt_at=2)
    job("launch_pre", docs_script("launch.sbatch").replace("29500", str(free_port())), sleep=0.4, preempt_at=3)
    job("forgot_srun", "#!/bin/bash\npython train.py\n", "--nodes=1", "--ntasks=2")
    for name in CHECKS:
        runs[name] = start_command(cluster, tmp, name)
    yield runs
    for name in (*CHECKS, "torchrun"):  # a test that failed early leaves its command: it ends here, by its group
        proc = runs[name][1]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def finished(cluster, runs, name, expected="COMPLETED"):
    folder, job, preemption = runs[name]
    state = preemption.result() if preemption else wait_job(cluster, job)
    assert state["JobState"] == expected, f"{name}: {state}\n{log(folder)}"
    return folder, state


def torchrun_params(runs):
    folder, code, output = command_output(runs, "torchrun")
    assert code == 0, output
    return facts(folder, 2)[0]["params"]


@pytest.mark.timeout(3 * JOB_TIMEOUT)
def test_world_from_slurm_matches_torchrun_bitwise(cluster, runs):
    """srun's tasks form one world from SLURM's variables: 2 nodes x 1 task (docs' sbatch script) and 1 node x 2 tasks
    with devices=2 (docs' "the same job on one node", run by srun inside salloc: one job fewer than an sbatch of its
    own, whose srun line would be the same), the weights of torchrun's 2 processes bit for bit."""
    reference = torchrun_params(runs)
    for name, nodes, per_node in (("two_nodes", 2, 1), ("salloc", 1, 2)):
        if name == "salloc":
            folder, code, output = command_output(runs, name)
            assert code == 0, output
        else:
            folder, _ = finished(cluster, runs, name)
        ranks = facts(folder, 2)
        for rank, f in enumerate(ranks):
            assert (f["rank"], f["world"], f["launcher"], f["num_nodes"]) == (rank, 2, "slurm", nodes)
            assert f["local_rank"] == rank % per_node and f["node_rank"] == rank // per_node
            assert f["params"] == reference, f"{name} rank {rank} differs from torchrun"
        assert len({f["host"] for f in ranks}) == nodes  # SLURMD_NODENAME: the task ran on that many nodes


@pytest.mark.timeout(4 * JOB_TIMEOUT)
def test_requeue_signal_saves_requeues_and_resumes_bitwise(cluster, runs):
    """SIGUSR1 (SLURM's warning): every rank saves, rank 0 requeues the job, the job's next start resumes from that
    checkpoint by itself and ends with the uninterrupted run's weights, bit for bit."""
    folder, state = finished(cluster, runs, "preempted")
    job, text = runs["preempted"][1], log(folder)
    assert state["Restarts"] == "1", f"{state}\n{text}"
    assert "pre-empted, requeued" in text and f"SLURM job {job} was requeued" in text, text
    assert "resuming from the pre-emption checkpoint" in text, text
    checkpoints = [n for n in os.listdir(folder / "out" / "checkpoints") if n.startswith("preempted-")]
    assert len(checkpoints) == 1, checkpoints
    step = int(re.search(r"step=(\d+)", checkpoints[0]).group(1))
    assert 3 <= step < 12, checkpoints  # saved mid-run, after the mark
    resumed = facts(folder, 2)
    assert all(f["restarts"] == 1 and f["step"] == 12 for f in resumed)
    uninterrupted, _ = finished(cluster, runs, "two_nodes")
    assert resumed[0]["params"] == facts(uninterrupted, 2)[0]["params"]
    # the record of the pre-emption is spent once the resumed fit ends
    assert not os.listdir(folder / "out" / ".slurm-requeue")
    # the loggers heard "finished" when the job was requeued (Lightning's SLURM handler), "success" at the end
    for rank in (0, 1):
        assert (folder / "out" / f"finalize-rank{rank}.txt").read_text().split() == ["finished", "success"], rank


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_sigterm_keeps_its_meaning_and_requeueing_is_off_by_a_flag(cluster, runs):
    """SIGTERM in a SLURM job is Lightning's (issue 37): SIGTERMException after the batch, the loggers hear "failed",
    the script ends there with exit status 0, nothing is saved (the script has no save_on_exception) or requeued.
    With TASKTRAIN_SLURM_REQUEUE=0, SIGUSR1 keeps its default action: the tasks end, nothing is saved or requeued."""
    folder, state = finished(cluster, runs, "sigterm")
    text = log(folder)
    assert state["Restarts"] == "0" and state["ExitCode"] == "0:0", f"{state}\n{text}"
    assert "Received SIGTERM" in text and "requeued" not in text and "Traceback" not in text, text
    assert not (folder / "out" / "facts-rank0.json").exists(), text  # (the script stopped inside fit)
    assert (folder / "out" / "finalize-rank0.txt").read_text().split() == ["failed"]
    assert not (folder / "out" / "checkpoints").exists() and not (folder / "out" / ".slurm-requeue").exists()
    folder, state = finished(cluster, runs, "requeue_off", expected="FAILED")
    text = log(folder)
    assert state["Restarts"] == "0" and "User defined signal 1" in text and "requeued" not in text, f"{state}\n{text}"
    assert not (folder / "out" / "checkpoints").exists() and not (folder / "out" / ".slurm-requeue").exists()


# srun / salloc commands started by the `runs` fixture: (command, Trainer settings, what the output must say)
CHECKS = {
    # devices=2, num_nodes=1 on 2 nodes x 1 task: the total agrees, the shape does not
    "devices": (["srun", "--nodes=2", "--ntasks-per-node=1", "python", "train.py"], dict(devices=2, nodes=1),
                ["SLURM_STEP_TASKS_PER_NODE", "devices=1", "--ntasks-per-node=2"]),
    "uneven": (["srun", "--nodes=2", "--ntasks=3", "python", "train.py"], {},
               ["unevenly", "SLURM_STEP_TASKS_PER_NODE=", "--ntasks-per-node"]),
    "launch": (["srun", "--nodes=2", "--ntasks-per-node=1", "tasktrain", "launch", "--cpu", "--num_machines", "1",
                "--num_processes", "1", "train.py"], {},
               ["num_machines=1", "SLURM_STEP_NUM_NODES=2", "--num_machines 2"]),
    # salloc's job name is "interactive": srun's two tasks inside must still form one world; 1 node x 2 tasks with
    # devices=2, as docs/slurm.md's one-node job (test_world_from_slurm_matches_torchrun_bitwise)
    "salloc": (["salloc", "--nodes=1", "--ntasks-per-node=2", "--job-name=interactive", "srun", "python", "train.py"],
               dict(devices=2), []),
}


def start_command(cluster, tmp, name):
    argv, settings, _ = CHECKS[name]
    folder = job_folder(tmp, name)
    options = ["--time=2"] + ([f"--job-name={name}"] if argv[0] == "srun" else [])
    return folder, subprocess.Popen(["timeout", "-k", "10", str(JOB_TIMEOUT), argv[0], *options, *argv[1:]],
                                    cwd=str(folder), env=dict(cluster.env, **job_env(folder, **settings)),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True, restore_signals=False)  # SIGPIPE ignored: slurm_cluster


def command_output(runs, name):
    folder, proc = runs[name]
    if not hasattr(proc, "output"):  # (kept: two tests read salloc's and torchrun's)
        try:
            proc.output = proc.communicate(timeout=JOB_TIMEOUT)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{name} did not end within {JOB_TIMEOUT} s") from None
    return folder, proc.returncode, proc.output


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_allocation_is_checked_against_the_run(cluster, runs):
    """Lightning's rules, checked before training, naming the SLURM variables and the fix; and the batch script
    that forgot srun fails at once instead of waiting for its missing task."""
    # sbatch --ntasks=2 whose body runs python without srun: an error naming srun, within seconds
    forgot, state = finished(cluster, runs, "forgot_srun", expected="FAILED")
    text = log(forgot)
    assert "srun python" in text and "SLURM_NTASKS=2" in text and "SLURM_STEP_ID" in text, text
    hours, minutes, seconds = map(int, state["RunTime"].split(":"))
    assert hours == minutes == 0 and seconds < 60, f"the missing srun took {state['RunTime']} to report"
    assert not (forgot / "out" / "facts-rank0.json").exists()
    for name in ("devices", "uneven", "launch"):
        folder, code, output = command_output(runs, name)
        assert code not in (0, 124), f"{name}: {code}\n{output}"
        for needle in CHECKS[name][2]:
            assert needle in output, f"{name}: {needle!r} not said:\n{output}"
        assert not (folder / "out" / "facts-rank0.json").exists(), name


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_srun_inside_an_interactive_allocation_forms_one_world(cluster, runs):
    """salloc (job name "interactive") + srun with two tasks: one run of two processes, not two runs of one."""
    folder, code, output = command_output(runs, "salloc")
    assert code == 0, output
    ranks = facts(folder, 2)
    assert [(f["rank"], f["world"], f["launcher"]) for f in ranks] == [(0, 2, "slurm"), (1, 2, "slurm")], output
    assert ranks[0]["params"] == torchrun_params(runs)


@pytest.mark.timeout(4 * JOB_TIMEOUT)
def test_accelerator_and_launch_requeue_and_resume_bitwise(cluster, runs):
    """docs' Accelerator and `tasktrain launch --max_restarts` scripts: pre-empted by SIGUSR1, requeued, resumed by
    themselves (save_state's folder; the Trainer's checkpoint under the launcher), equal to uninterrupted runs."""
    for name in ("accelerator_pre", "launch_pre"):
        folder, state = finished(cluster, runs, name)
        text = log(folder)
        assert state["Restarts"] == "1", f"{name}: {state}\n{text}"
        assert "pre-empted, requeued" in text, f"{name}:\n{text}"
        assert all(f["restarts"] == 1 for f in facts(folder, 2)), name
    reference = facts(finished(cluster, runs, "accelerator")[0], 2)[0]["params"]
    pre = runs["accelerator_pre"][0]
    assert "loading the pre-emption state" in log(pre) and (pre / "out" / ".slurm-requeue").is_dir()
    assert facts(pre, 2)[0]["params"] == reference
    launched = runs["launch_pre"][0]
    assert "resuming from the pre-emption checkpoint" in log(launched), log(launched)
    resumed = facts(launched, 2)
    assert [(f["world"], f["launcher"], f["step"]) for f in resumed] == [(2, "torchrun", 12)] * 2
    uninterrupted, _ = finished(cluster, runs, "two_nodes")
    assert resumed[0]["params"] == facts(uninterrupted, 2)[0]["params"]  # 2 machines x 1 process, launched: the same


# -- the rules without a cluster (the variables as srun / sbatch / salloc set them, measured on SLURM 22.05) ----------
def test_which_slurm_processes_form_a_world():
    from tasktrain.strategies.environment import SlurmAllocationError, detect_environment, refuse_unstarted_slurm_tasks

    step = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
            "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "interactive"}
    env = detect_environment(step)  # srun with 4 tasks inside salloc: one world, whatever the job's name
    assert (env.launcher, env.global_rank, env.world_size, env.local_world_size, env.node_rank) == ("slurm", 3, 4, 2, 1)
    assert env.main_address == "gpu07"
    shell = dict(step, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_STEP_TASKS_PER_NODE="1", SLURM_JOB_NAME="bash")
    assert detect_environment(shell).launcher is None  # `srun --pty bash`: a shell on a node, not a launch
    assert detect_environment(dict(shell, SLURM_JOB_NAME="train")).launcher == "slurm"  # a step of one task
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NNODES": "1",
             "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_ID": "78", "SLURM_JOB_NAME": "job.sbatch"}
    env = detect_environment(batch)  # the batch script itself, python without srun: read as Lightning's world ...
    assert (env.launcher, env.world_size, env.slurm_tasks_not_started) == ("slurm", 2, 1)
    with pytest.raises(SlurmAllocationError, match=r"SLURM_STEP_ID is not.*SLURM_NTASKS=2.*srun python"):
        refuse_unstarted_slurm_tasks(env)  # ... and refused where a run starts
    assert detect_environment(dict(batch, SLURM_JOB_NAME="bash")).launcher is None  # Lightning's opt-out by name
    assert detect_environment(dict(batch, SLURM_NTASKS="1")).world_size == 1  # --ntasks=1: a world of one
    with pytest.raises(SlurmAllocationError, match=r"unevenly.*SLURM_STEP_TASKS_PER_NODE=2,1.*--ntasks-per-node"):
        detect_environment(dict(step, SLURM_NTASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1"))


def test_allocation_and_launch_checks_name_the_variables_and_the_fix(monkeypatch):
    from tasktrain.strategies.environment import (ClusterEnvironment, SlurmAllocationError, check_launch_in_slurm,
                                                  check_slurm_allocation)

    monkeypatch.setenv("SLURM_NNODES", "2")
    env = ClusterEnvironment(world_size=2, local_world_size=1, launcher="slurm")
    check_slurm_allocation(env, devices=1, num_nodes=2)
    with pytest.raises(SlurmAllocationError, match=r"devices=2 .*1 task\(s\) per node.*--ntasks-per-node=2"):
        check_slurm_allocation(env, devices=2, num_nodes=1)
    with pytest.raises(SlurmAllocationError, match=r"num_nodes=1 nodes.*SLURM_NNODES=2.*--nodes=1"):
        check_slurm_allocation(ClusterEnvironment(world_size=4, local_world_size=2, launcher="slurm"), 2, 1)
    check_slurm_allocation(ClusterEnvironment(world_size=2, local_world_size=1, launcher="torchrun"), 2, 1)
    step = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2"}
    check_launch_in_slurm(2, 4, step)
    check_launch_in_slurm(1, 2, {})  # not in a job step: nothing to check
    with pytest.raises(SlurmAllocationError, match=r"--ntasks-per-node=1 tasktrain launch"):
        check_launch_in_slurm(2, 4, dict(step, SLURM_STEP_NUM_TASKS="4"))
    with pytest.raises(SlurmAllocationError, match=r"num_machines=1.*--num_machines 2"):
        check_launch_in_slurm(1, 2, step)


def test_requeue_settings():
    import signal

    from tasktrain.strategies.requeue import job_id, requeue_signal

    assert requeue_signal({"SLURM_JOB_ID": "5", "TASKTRAIN_REQUEUE_SIGNAL": "12"}) == signal.SIGUSR2
    assert requeue_signal({"SLURM_JOB_ID": "5", "TASKTRAIN_REQUEUE_SIGNAL": "sigusr1"}) == signal.SIGUSR1
    with pytest.raises(ValueError, match="TASKTRAIN_REQUEUE_SIGNAL='USR9'"):
        requeue_signal({"SLURM_JOB_ID": "5", "TASKTRAIN_REQUEUE_SIGNAL": "USR9"})
    assert job_id({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "3"}) == "8_3"
