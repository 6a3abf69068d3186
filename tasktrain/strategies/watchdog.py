"""The watchdog: a distributed run that cannot hang silently.

A rank that dies is caught by the launchers (launcher.py, torchrun). A rank that stops making progress is not:
a deadlock, an endless loop, a data loader stuck on I/O or a collective that only some ranks call leaves the
others waiting in gloo/nccl until the process-group timeout (30 minutes), and the error then names nobody. The
watchdog turns that into one message, on every rank, within `stall_timeout` plus a few seconds:

    [tasktrain] watchdog: rank 1 (pid 4242 on node-a) has made no progress for 5.6 s (stall_timeout=5 s) ...

How it works, per process (one Watchdog per process group; multi-process strategies start it):
- The loop marks progress: `watchdog.mark(event, step, batch)` stores the event, the step, the batch and a
  timestamp in Python attributes. That is all the hot path does: no collective, no store call, no lock.
- A background thread ("tasktrain-watchdog") publishes those attributes as this rank's heartbeat in the process
  group's TCPStore (its own client connection, so a main thread blocked in a store call cannot block it), every
  `tick` = stall_timeout / 10 seconds (0.1 to 5 s), together with the sum of the sequence numbers of its world-
  sized process groups: the number of collectives this rank has issued, which torch counts anyway.
- Rank 0's thread is the judge: it reads every heartbeat once a tick. A rank "has stalled" when it is inside a
  watched loop, not in a long event, and its last mark is older than stall_timeout. Ranks waiting in a
  collective for a stuck peer stall as well, so the judge blames the rank that is *behind*: the one that
  issued the fewest collectives (the others are waiting for it to join), then the one idle longest. Only if
  that rank has itself stalled is there a verdict; if it is busy in a long event, the judge says once who
  waits for it and does nothing else.
- The verdict is written to the store (first writer wins). Every rank's thread checks for it once a tick, then
  dumps the Python stacks of all its threads to a file (faulthandler; this works while the main thread is
  blocked in a C++ collective or a sleep, which release the GIL), prints the same message, writes it where
  the launcher reads a failed rank's error (self-launch, torchrun's error file), meets the others at a short
  store barrier, and ends its process with os._exit(1): a main thread stuck in a collective would never reach
  a Python exception.
- Every other rank also watches the judge's heartbeat: if rank 0's thread stops ticking while armed (native
  code holding the GIL, a stopped process), another rank issues the verdict against it.
- If the store itself is gone (its host, rank 0 under self-launch or the torchrun agent, died), a rank inside
  a watched loop says so and exits 1 rather than wait for a peer that cannot answer.

Why rank 0 judges instead of every rank reading every heartbeat: N ranks reading N heartbeats per tick is N^2
store requests; one judge reads N, and every other rank reads one key (the verdict) and rank 0's heartbeat.

What counts as progress, and what may take long (the timeout applies between marks):
- the Trainer marks every training batch (before training_step, before backward, before fetching the next
  batch) and every validation/test/predict batch; the Accelerator marks every batch of a prepared loader,
  backward and optimizer.step. A long validation is many short steps, not one long one.
- the first batch of every loop may take any time: loader workers start, torch.compile compiles, kernels are
  autotuned there (`mark(..., long=True)`).
- events that may take long say so with `with watchdog.long_event(name):` (optionally with a timeout of their
  own): checkpoint saving, the Accelerator's save_state/load_state, and whatever the user wraps in
  `trainer.long_event(name)` / `accelerator.long_event(name)`.
- only the loops are watched (`arm()`/`disarm()`): set-up before the first batch and code between runs are
  not, so a script may do anything for any time outside them.

The mismatched-collective check (TASKTRAIN_DEBUG_COLLECTIVES=1, read when the strategy starts): every
collective a strategy runs through `@checked_collective` (reduce, all_gather, all_gather_object, broadcast,
barrier; the Trainer's sync_dist reductions go through them) first publishes (number, op, arguments' dtypes
and shapes, label, call site) and waits until every rank has published the same number; ranks that called
different collectives raise CollectiveMismatchError naming every side's call site, instead of hanging or, worse,
reducing the wrong tensors together. A rank that waits there while a peer has entered a collective this rank
never joins (its collective count is ahead: DDP's gradient all-reduce, say) is a deadlock, reported at once.
It costs a few store round trips per collective, hence the switch. Collectives inside engines (DDP's gradient
buckets, DeepSpeed's partitions) are not ours to check: torch's TORCH_DISTRIBUTED_DEBUG=DETAIL compares those
(op and shapes, without call sites; a collective that only one rank calls still waits for the full timeout).

For a strategy author (FSDP and later ones): start the watchdog in setup_environment once the process group
exists (`self.watchdog = start_watchdog(...)`, as DDP does; a DDP subclass inherits it), decorate every
collective method with `@checked_collective(op, data=...)`, and wrap work that may take long in
`long_event`. Nothing here imports the trainer or the callbacks.
"""
import contextlib
import faulthandler
import functools
import inspect
import json
import os
import socket
import sys
import sysconfig
import tempfile
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_STALL_TIMEOUT = 300.0  # seconds; the Trainer's and the Accelerator's default
DEBUG_ENV = "TASKTRAIN_DEBUG_COLLECTIVES"
EXIT_CODE = 1
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../tasktrain
_monotonic = time.monotonic


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives (TASKTRAIN_DEBUG_COLLECTIVES=1 found it before they could hang)."""


def resolve_stall_timeout(value):
    """stall_timeout as given to the Trainer / Accelerator -> seconds, or None when the watchdog is off."""
    if value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0):
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ValueError(f"stall_timeout={value!r}: give seconds (a positive number or a timedelta) after which a "
                         "rank that makes no progress stops the run, or None (or 0) to turn the watchdog off.")
    return float(value)


def debug_collectives_enabled():
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def tick_for(stall_timeout):
    """Seconds between two heartbeats: a tenth of the timeout, 0.1 to 5 s (5 s at the default of 300 s)."""
    return 5.0 if not stall_timeout else min(5.0, max(0.1, stall_timeout / 10.0))


def no_mark(event, step=-1, batch=-1, long=False):
    """What the loops call instead of Watchdog.mark when there is no watchdog (one process, or turned off)."""


# -- the process's watchdog -----------------------------------------------------------------------------------------
_PROCESS = {"watchdog": None}


def watched_batches(watchdog, items, event, step_of, start=0, first_is_long=True, end_event=None):
    """A loop's batches as the watchdog sees them: the one place where the loops (the Trainer's training and
    evaluation epochs, the Accelerator's prepared loaders) mark their progress. `items` yields tuples whose first
    element is the batch index. Before each batch is fetched: "fetching a batch" (the first fetch may take any
    time: workers start); when a batch comes: `event` (the first one may take any time when `first_is_long`:
    compilation, autotuning); at the end, `end_event` if given. `step_of()` is the optimizer step to report.
    Without a watchdog: `items` itself, so the loop costs nothing more."""
    if watchdog is None:
        return items
    return _watched(watchdog.mark, items, event, step_of, start, first_is_long, end_event)


def _watched(mark, items, event, step_of, start, first_is_long, end_event):
    index, long = start - 1, first_is_long
    mark("fetching a batch", step_of(), start, True)
    try:
        for item in items:
            index = item[0]
            mark(event, step_of(), index, long)
            long = False
            yield item
            mark("fetching a batch", step_of(), index + 1)
    finally:
        if end_event is not None:
            mark(end_event, step_of(), index)


def watched_action(watchdog, event, fn, after=None):
    """`fn`, marked as `event` inside the current batch (its step, batch and long flag stay) each time it runs;
    with `after`, a new mark once it returned (e.g. what follows the optimizer step has a deadline again)."""
    if watchdog is None:
        return fn
    sub_event, mark = watchdog.sub_event, watchdog.mark

    def call(*args, **kwargs):
        sub_event(event)
        result = fn(*args, **kwargs)
        if after is not None:
            mark(after, watchdog.step, watchdog.batch)
        return result
    return call


def start_watchdog(rank, world_size, stall_timeout, on_stop=None, on_exit=None, report=None):
    """The watchdog of this process, started on the first call that wants one: with a stall_timeout, or with
    TASKTRAIN_DEBUG_COLLECTIVES=1. None for a world of one. Call it after the process group exists.

    on_stop: called when a verdict is reached (before any output); on_exit: called last, before os._exit;
    report(message): where the launcher reads why this rank failed.
    """
    watchdog = _PROCESS["watchdog"]
    if watchdog is not None:
        return watchdog
    if not stall_timeout and not debug_collectives_enabled():
        return None  # turned off: no thread, no store connection
    if world_size < 2 or not dist.is_initialized():
        return None
    watchdog = Watchdog(_own_store_client(), rank, world_size, check_collectives=debug_collectives_enabled(),
                        on_stop=on_stop, on_exit=on_exit, report=report)
    watchdog.start()
    _PROCESS["watchdog"] = watchdog
    return watchdog


def stop_watchdog():
    """Stop this process's watchdog thread (at exit, before the process group goes)."""
    watchdog, _PROCESS["watchdog"] = _PROCESS["watchdog"], None
    if watchdog is not None:
        watchdog.stop()


def _own_store_client():
    """A client connection of our own to the process group's TCPStore (the main thread may sit in a blocking
    call on the group's own client). Short timeouts: a store that does not answer within them is gone."""
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return dist.TCPStore(store.host, store.port, is_master=False, timeout=timedelta(seconds=10),
                             wait_for_workers=False)
    return store  # a FileStore / HashStore (not made by tasktrain): shared with the group


def _key_prefix():
    # torchrun's agent keeps one store across restarts of the workers: a restart must not read an old verdict.
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return f"tasktrain/watchdog/{run}/{restart}/"


def group_sequence(world_size):
    """How many collectives this process has issued, over its process groups that span the whole world (torch's
    own per-group sequence numbers: DDP's buckets and DeepSpeed's cloned world group included)."""
    total = 0
    try:
        groups = list(dist.distributed_c10d._world.pg_map)
    except Exception:
        groups = []
    for group in groups:
        try:
            if group.size() == world_size:
                total += group._get_sequence_number_for_group()
        except Exception:  # a backend without sequence numbers, or a group being destroyed
            pass
    return total


class Watchdog:
    def __init__(self, store, rank, world_size, check_collectives=False, on_stop=None, on_exit=None, report=None,
                 prefix=None):
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.check_collectives = check_collectives
        self.on_stop, self.on_exit, self.report = on_stop, on_exit, report
        self.prefix = _key_prefix() if prefix is None else prefix
        self.host = socket.gethostname()
        self.pid = os.getpid()
        # What the main thread writes (mark, long_event, arm) and the thread reads.
        self.event, self.step, self.batch, self.long_mark, self.t = "started", -1, -1, False, _monotonic()
        self.stall_timeout = None
        self.stack_dir = None
        self._armed = 0
        self._long_events = ()  # ((name, started, deadline or None), ...), innermost last
        self._label = None
        self._checked = 0  # checked collectives so far
        self._last_checked = None
        self._in_check = False
        # The thread's own state.
        self._stopped = threading.Event()
        self._thread = None
        self._tick_count = 0
        self._acting = False
        self._store_failing_since = None
        self._judge_seen = {}  # rank -> (its tick, when the judge first saw that tick)
        self._warned = set()
        self._main_ident = threading.main_thread().ident

    # -- the main thread's side: cheap ------------------------------------------------------------------------
    def mark(self, event, step=-1, batch=-1, long=False):
        """Progress: `event` starts now. long=True: it may take any time (the next mark ends that)."""
        self.event = event
        self.step = step
        self.batch = batch
        self.long_mark = long
        self.t = _monotonic()

    def sub_event(self, event):
        """Progress inside the current step (backward, optimizer step): the step, batch and long flag stay."""
        self.event = event
        self.t = _monotonic()

    @contextlib.contextmanager
    def long_event(self, name, timeout=None):
        """Work that may legitimately take longer than stall_timeout (a checkpoint save, a compilation). With a
        `timeout` (seconds) it stalls when it runs longer than that; without, it has no deadline of its own."""
        previous = self._long_events
        step, batch, long = self.step, self.batch, self.long_mark
        now = _monotonic()
        self.mark(name, step, batch)
        self._long_events = previous + ((name, now, None if timeout is None else now + float(timeout)),)
        try:
            yield
        finally:
            self._long_events = previous
            self.mark(f"after {name}", step, batch, long)

    def arm(self, stall_timeout, stack_dir=None):
        """Watch from here (a loop starts); arm/disarm nest (an evaluation loop inside a training loop)."""
        self.stall_timeout = stall_timeout
        if stack_dir:
            self.stack_dir = os.fspath(stack_dir)
        self._armed += 1
        self.t = _monotonic()

    def disarm(self):
        self._armed = max(0, self._armed - 1)

    @property
    def armed(self):
        return self._armed > 0

    @contextlib.contextmanager
    def label(self, name):
        """Name the collectives run inside (e.g. which sync_dist metrics), for the mismatch check."""
        previous, self._label = self._label, name
        try:
            yield
        finally:
            self._label = previous

    # -- the thread ---------------------------------------------------------------------------------------------
    def start(self):
        self._publish()  # the first heartbeat before anyone judges
        self._thread = threading.Thread(target=self._run, name="tasktrain-watchdog", daemon=True)
        self._thread.start()

    def stop(self):
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self):
        while not self._stopped.wait(tick_for(self.stall_timeout)):
            try:
                self._tick()
                self._store_failing_since = None
            except (dist.DistError, OSError) as err:  # the store did not answer
                if self._stopped.is_set() or self._acting:
                    return
                now = _monotonic()
                if self._store_failing_since is None:
                    self._store_failing_since = now
                elif now - self._store_failing_since >= max(3.0, 2 * tick_for(self.stall_timeout)):
                    if self.armed:
                        self._store_lost(err)
                    return  # between runs nothing is watched: the thread ends quietly
            except Exception as err:  # a bug of ours must not stop a run that is fine: say so, and stop watching
                print(f"[tasktrain] watchdog: rank {self.rank} stops watching after an internal error: "
                      f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)
                return

    def _tick(self):
        self._tick_count += 1
        self._publish()
        verdict = self._read_verdict()
        if verdict is not None:
            self._act(verdict)
            return
        if self.rank == 0:
            self._judge()
        else:
            self._watch_judge()

    def heartbeat(self):
        """This rank's state, as published."""
        now = _monotonic()
        idle = now - self.t
        long = self._long_events[-1] if self._long_events else None
        timeout = self.stall_timeout
        if not self.armed or not timeout:
            stalled = False
        elif long is not None:
            stalled = long[2] is not None and now > long[2]
        else:
            stalled = not self.long_mark and idle > timeout
        where = _where_main_thread(self._main_ident)
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "tick": self._tick_count,
            "armed": self.armed, "stalled": stalled, "idle": round(idle, 3), "stall_timeout": timeout,
            "event": self.event, "step": self.step, "batch": self.batch,
            "long": None if long is None else long[0], "long_for": None if long is None else round(now - long[1], 3),
            "first_batch": self.long_mark, "seq": group_sequence(self.world_size), "in_check": self._in_check,
            "where": where, "stacks": self._stack_path(), "debug": self.check_collectives,
            "collective": self._last_checked,
        }

    def _publish(self):
        self.store.set(self._key(f"hb/{self.rank}"), json.dumps(self.heartbeat()))

    def _read_heartbeat(self, rank):
        key = self._key(f"hb/{rank}")
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key))

    def _read_verdict(self):
        key = self._key("verdict")
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key))

    def _key(self, name):
        return self.prefix + name

    def _judge(self):
        keys = [self._key(f"hb/{r}") for r in range(self.world_size)]
        if not self.store.check(keys):
            return  # a rank has not started its watchdog yet
        records = [json.loads(v) for v in self.store.multi_get(keys)]
        now = _monotonic()
        unresponsive = []
        for record in records:
            if record["rank"] == self.rank:
                continue  # this thread is running: the judge's own heartbeat is fresh by definition
            seen = self._judge_seen.get(record["rank"])
            if seen is None or seen[0] != record["tick"]:
                self._judge_seen[record["rank"]] = (record["tick"], now)
            elif record["armed"] and record["stall_timeout"] and \
                    now - seen[1] > record["stall_timeout"] + 3 * tick_for(record["stall_timeout"]):
                unresponsive.append(record["rank"])
        culprit, waiting = find_culprit(records, unresponsive)
        if culprit is not None:
            others = [r for r in records if r["rank"] != culprit["rank"]]
            self._act(self._issue({"kind": "unresponsive" if culprit["rank"] in unresponsive else "stall",
                                   "culprit": culprit, "others": others[:8], "others_count": len(others),
                                   "reporter": self.rank, "reporter_host": self.host}))
        elif waiting is not None:
            blocker, waiters = waiting
            # Said once per long event (or first batch, or stretch outside the loops) of the blocking rank.
            key = (blocker["rank"], blocker["long"], blocker["first_batch"], blocker["armed"], blocker["step"],
                   blocker["batch"] if blocker["first_batch"] else None)
            if (blocker["long"] or blocker["first_batch"] or not blocker["armed"]) and key not in self._warned:
                self._warned.add(key)
                print(describe_long_wait(blocker, waiters), file=sys.stderr, flush=True)

    def _watch_judge(self):
        record = self._read_heartbeat(0)
        if record is None:
            return
        now = _monotonic()
        seen = self._judge_seen.get(0)
        if seen is None or seen[0] != record["tick"]:
            self._judge_seen[0] = (record["tick"], now)
        elif record["armed"] and record["stall_timeout"] and \
                now - seen[1] > record["stall_timeout"] + 3 * tick_for(record["stall_timeout"]):
            self._act(self._issue({"kind": "unresponsive", "culprit": record, "others": [self.heartbeat()],
                                   "others_count": self.world_size - 1, "reporter": self.rank,
                                   "reporter_host": self.host}))

    def _issue(self, verdict):
        """Publish a verdict; the first one written wins, and is what every rank acts on (returned)."""
        return json.loads(self.store.compare_set(self._key("verdict"), "", json.dumps(verdict)))

    # -- acting on a verdict ------------------------------------------------------------------------------------
    def _act(self, verdict):
        if self._acting:
            return
        self._acting = True
        raising = verdict.get("raising", ())
        if self.rank in raising:
            return  # its main thread raises CollectiveMismatchError and tells the story itself
        if self.on_stop is not None:
            _quietly(self.on_stop)
        message = describe_verdict(verdict)
        self._dump_stacks(message)
        # The whole story from the rank that found it (rank 0, the judge, as a rule), and from the stuck rank when it
        # runs on another machine (its own log); one line from every other rank: N ranks sharing a terminal should
        # not print it N times.
        culprit = verdict.get("culprit", {}).get("rank")
        elsewhere = self.rank == culprit and verdict.get("reporter_host") != self.host
        short = self.rank != verdict.get("reporter", 0) and not elsewhere and verdict["kind"] != "mismatch"
        print(summarize_verdict(verdict, self.rank) if short else message, file=sys.stderr, flush=True)
        if self.report is not None:
            _quietly(self.report, message)
        _silence_the_rest()
        self._exit_barrier(self.world_size - len(raising))
        self._end_process()

    def _exit_barrier(self, expected, join=True):
        """Every rank has read the verdict before any leaves: a peer that exits first breaks the collective this
        rank's main thread is in (its traceback would bury the message), and the store's host must not go first.
        Every rank checks for the verdict once a tick: two ticks and a margin are enough for all but a rank that
        cannot run at all."""
        try:
            key = self._key("exiting")
            if join:
                self.store.add(key, 1)
            deadline = _monotonic() + 2 * tick_for(self.stall_timeout) + 3.0
            while self.store.add(key, 0) < expected and _monotonic() < deadline:
                time.sleep(0.02)
        except Exception:
            pass

    def _end_process(self):
        if self.on_exit is not None:
            _quietly(self.on_exit)
        for stream in (sys.stdout, sys.stderr):
            _quietly(stream.flush)
        os._exit(EXIT_CODE)

    def _store_lost(self, err):
        self._acting = True
        address = f"{getattr(self.store, 'host', '?')}:{getattr(self.store, 'port', '?')}"
        path = self._stack_path()
        message = (
            f"[tasktrain] watchdog: rank {self.rank} (pid {self.pid} on {self.host}) lost the rendezvous store at "
            f"{address} ({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}). "
            "The process that hosts it (rank 0 when the Trainer started the processes, the launcher of the first "
            "machine under torchrun) is gone, so the other ranks can no longer be reached; stopping this rank "
            f"(exit code {EXIT_CODE}). Its last progress: {_progress(self.heartbeat())}. Python stacks of its "
            f"threads: {path}."
        )
        self._dump_stacks(message)
        print(message, file=sys.stderr, flush=True)
        if self.report is not None:
            _quietly(self.report, message)
        _silence_the_rest()
        self._end_process()

    def _stack_path(self):
        directory = self.stack_dir or os.getcwd()
        return os.path.join(os.path.abspath(directory), f"tasktrain-stacks-rank{self.rank}-pid{self.pid}.txt")

    def _dump_stacks(self, header):
        """Every thread's Python stack, by faulthandler (the main thread may be blocked in native code)."""
        path = self._stack_path()
        for candidate in (path, os.path.join(tempfile.gettempdir(), os.path.basename(path))):
            try:
                os.makedirs(os.path.dirname(candidate), exist_ok=True)
                with open(candidate, "w") as f:
                    names = {t.ident: t.name for t in threading.enumerate()}
                    f.write(f"{header}\n\nPython stacks of rank {self.rank} (pid {self.pid} on {self.host}), "
                            f"written by tasktrain's watchdog at {time.strftime('%Y-%m-%d %H:%M:%S')}.\n")
                    f.write("Threads: " + ", ".join(f"0x{ident:016x} = {name}" for ident, name in names.items())
                            + f"\nThe main thread is 0x{self._main_ident:016x}.\n\n")
                    f.flush()
                    faulthandler.dump_traceback(file=f, all_threads=True)
                return candidate
            except OSError:
                continue
        return None

    # -- the mismatched-collective check (TASKTRAIN_DEBUG_COLLECTIVES=1), on the main thread ----------------------
    def check_collective(self, op, signature, compared, site):
        """Publish this collective, wait until every rank has published its collective of the same number, and
        raise CollectiveMismatchError (on every rank that took part) when they differ."""
        number = self._checked = self._checked + 1
        mine = {"rank": self.rank, "number": number, "op": op, "signature": signature, "compared": compared,
                "label": self._label, "site": site, "step": self.step, "event": self.event, "host": self.host}
        self._last_checked = {k: mine[k] for k in ("number", "op", "signature", "label", "site")}
        self.sub_event(op)
        keys = [self._key(f"collective/{number}/{r}") for r in range(self.world_size)]
        self.store.set(keys[self.rank], json.dumps(mine))
        self._in_check = True
        try:
            self._wait_for_peers(keys, mine)
        finally:
            self._in_check = False
        records = [json.loads(v) for v in self.store.multi_get(keys)]
        if number > 1:  # every rank has read number-1 (it published `number` after): ours can go
            _quietly(self.store.delete_key, self._key(f"collective/{number - 1}/{self.rank}"))
        if len({(r["op"], r["compared"], r["label"]) for r in records}) > 1:
            message = describe_mismatch(records)
            self._issue({"kind": "mismatch", "message": message, "raising": list(range(self.world_size))})
            raise CollectiveMismatchError(message)

    def _wait_for_peers(self, keys, mine):
        my_sequence = group_sequence(self.world_size)
        started = _monotonic()
        delay, next_look = 0.001, started + 0.1
        while not self.store.check(keys):
            now = _monotonic()
            if now >= next_look:  # look at who is missing, and what they are doing
                next_look = now + 0.2
                for rank, key in enumerate(keys):
                    if self.store.check([key]):
                        continue
                    peer = self._read_heartbeat(rank)
                    if peer is None:
                        continue
                    problem = None
                    if not peer.get("debug"):
                        problem = "debug"
                    elif peer["seq"] > my_sequence:
                        problem = "deadlock"  # it is inside a collective this rank has not issued, waiting for us
                    elif not self.stall_timeout and peer["idle"] > DEFAULT_STALL_TIMEOUT and not peer["long"] \
                            and now - started > DEFAULT_STALL_TIMEOUT:
                        problem = "absent"  # no stall watchdog to catch it: this check bounds the wait itself
                    if problem:
                        message = describe_missing(mine, peer, problem)
                        self._issue({"kind": "mismatch", "message": message, "raising": [self.rank]})
                        # The others print the verdict before this rank's exit breaks their collectives.
                        self._exit_barrier(self.world_size - 1, join=False)
                        raise CollectiveMismatchError(message)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def checked_collective(op, data=(), objects=(), arguments=None):
    """Decorate a strategy's collective method: marks it as a sub-event for the watchdog (so a rank stuck in it
    is seen there) and, with TASKTRAIN_DEBUG_COLLECTIVES=1, compares it across ranks before it runs.

    data: the arguments that carry tensors: their dtype and shape are compared (a number: its type), not their
    values. objects: arguments holding any picklable object (all_gather_object, broadcast): not compared.
    Every other argument (op, src, name) is compared by value. arguments: a function of the bound arguments (a
    dict) giving the (name, value) pairs that describe the call, where several spellings mean one call (reduce's
    Lightning reduce_op= and tasktrain's op=: the reduction once)."""

    def decorate(fn):
        parameters = inspect.signature(fn)

        @functools.wraps(fn)
        def run(strategy, *args, **kwargs):
            watchdog = strategy.watchdog
            if watchdog is None:
                return fn(strategy, *args, **kwargs)
            previous = (watchdog.event, watchdog.step, watchdog.batch, watchdog.long_mark)
            if watchdog.check_collectives:
                bound = parameters.bind(strategy, *args, **kwargs)
                bound.apply_defaults()
                # (keyword-only arguments left at None, Lightning's group= / reduce_op= aliases: not part of the call)
                given = [(name, value) for name, value in list(bound.arguments.items())[1:]
                         if not (value is None and parameters.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY)]
                if arguments is not None:
                    given = arguments(bound.arguments)
                signature, compared = _describe_arguments(given, data, objects)
                watchdog.check_collective(op, signature, compared, _call_site())
            else:
                watchdog.sub_event(op)
            try:
                return fn(strategy, *args, **kwargs)
            finally:
                watchdog.mark(*previous)  # back to the event the collective was part of

        return run

    return decorate


def collective_label(strategy, name):
    """`with collective_label(strategy, "sync_dist ..."):` names the collectives inside for the check."""
    watchdog = strategy.watchdog
    if watchdog is None or not watchdog.check_collectives:
        return contextlib.nullcontext()
    return watchdog.label(name)


def find_culprit(records, unresponsive=()):
    """Which rank stops the others: (its heartbeat, None), or (None, (blocker, waiters)) when every waiting rank
    waits for one that is legitimately busy (a long event, its first batch, or outside a watched loop), or
    (None, None).

    The rank behind is the one that issued the fewest collectives (the others sit in one it has not joined); a
    rank waiting in a checked collective, or outside a run, counts half a collective further (it is not the
    one holding the others up); then the one idle longest; then the lowest rank."""
    if not records:
        return None, None

    def position(r):
        waiting = r.get("in_check") or not r["armed"]
        return (r["seq"] + (0.5 if waiting else 0.0), -r["idle"], r["rank"])

    behind = min(records, key=position)
    if behind["stalled"] or behind["rank"] in unresponsive:
        return behind, None
    waiters = [r for r in records if r["stalled"] and r["rank"] != behind["rank"]]
    if waiters:
        return None, (behind, waiters)
    return None, None


# -- messages ---------------------------------------------------------------------------------------------------
def _progress(r):
    parts = []
    if r.get("step", -1) >= 0:
        parts.append(f"step {r['step']}")
    if r.get("batch", -1) >= 0:
        parts.append(f"batch {r['batch']}")
    parts.append(f"event '{r['event']}'")
    return ", ".join(parts)


def _seconds(value):
    return f"{value:.0f} s" if value >= 10 or value == int(value) else f"{value:.1f} s"


def describe_verdict(verdict):
    if verdict["kind"] == "mismatch":
        return f"[tasktrain] watchdog: {verdict['message']}"
    c = verdict["culprit"]
    who = f"rank {c['rank']} (pid {c['pid']} on {c['host']})"
    timeout = c["stall_timeout"]
    if verdict["kind"] == "unresponsive":
        head = (f"[tasktrain] watchdog: {who} stopped responding: its watchdog thread has not run for more than "
                f"{_seconds(timeout)} (stall_timeout={_seconds(timeout)}); native code holds the GIL or the process "
                "is stopped. Stopping every rank.")
        stacks = (f"  its stacks could not be taken from inside; on {c['host']}: `py-spy dump --pid {c['pid']}` "
                  f"(or faulthandler's file {c['stacks']} if it got to write it)")
    else:
        if c.get("long"):
            idle = f"has been in '{c['long']}' for {_seconds(c['long_for'])}, longer than its own timeout"
        else:
            idle = f"has made no progress for {_seconds(c['idle'])} (stall_timeout={_seconds(timeout)})"
        head = f"[tasktrain] watchdog: {who} {idle}. Stopping every rank."
        stacks = f"  Python stacks of all its threads: {c['stacks']}"
    lines = [head, f"  its last progress: {_progress(c)}"]
    if c.get("where"):
        lines.append(f"  its main thread is at: {c['where']}")
    lines.append(stacks)
    others = verdict.get("others") or []
    if others:
        described = []
        for r in others[:8]:
            state = "waits for it inside a collective" if r["seq"] > c["seq"] else \
                "waits for it" if r["stalled"] or r.get("in_check") else "running"
            described.append(f"rank {r['rank']} {state} ({_progress(r)})")
        count = verdict.get("others_count", len(others))
        more = f", and {count - len(described)} more" if count > len(described) else ""
        lines.append("  the other ranks: " + "; ".join(described) + more)
    lines.append("  Every rank exits with code 1, and each wrote its own stacks next to that file. If the work is "
                 "legitimately long, wrap it in `with trainer.long_event(\"name\"):` (accelerator.long_event), or "
                 "raise stall_timeout; stall_timeout=None turns the watchdog off.")
    return "\n".join(lines)


def summarize_verdict(verdict, rank):
    """The one line a rank other than 0 and the stuck one prints."""
    c = verdict["culprit"]
    what = "stopped responding" if verdict["kind"] == "unresponsive" else \
        f"has made no progress for {_seconds(c['idle'])}"
    return (f"[tasktrain] watchdog: rank {c['rank']} (pid {c['pid']} on {c['host']}) {what} ({_progress(c)}; its "
            f"stacks: {c['stacks']}); rank {rank} stops too (exit code {EXIT_CODE}). Rank "
            f"{verdict.get('reporter', 0)} printed the details.")


def describe_long_wait(blocker, waiters):
    names = ", ".join(str(r["rank"]) for r in waiters[:8]) + (" ..." if len(waiters) > 8 else "")
    names = f"ranks {names} have" if len(waiters) > 1 else f"rank {names} has"
    if blocker.get("long"):
        what = f"in '{blocker['long']}' for {_seconds(blocker['long_for'])}, a long event with no deadline"
    elif blocker.get("first_batch"):
        what = f"in the first batch of a loop ({_progress(blocker)}) for {_seconds(blocker['idle'])}: no deadline"
    elif not blocker["armed"]:
        what = f"outside the watched loops ({_progress(blocker)}) for {_seconds(blocker['idle'])}"
    else:
        what = f"still making progress ({_progress(blocker)})"  # not said by the judge (it would repeat)
    return (f"[tasktrain] watchdog: {names} waited longer than stall_timeout for rank {blocker['rank']} "
            f"(pid {blocker['pid']} on {blocker['host']}), which is {what}; not stopping the run.")


def _collective_text(r):
    label = f" '{r['label']}'" if r.get("label") else ""
    return f"{r['op']}({r['signature']}){label} at {r['site']}"


def describe_mismatch(records):
    number = records[0]["number"]
    groups = {}
    for r in records:
        groups.setdefault((r["op"], r["compared"], r["label"]), []).append(r)
    lines = [f"mismatched collectives (TASKTRAIN_DEBUG_COLLECTIVES=1): the ranks called different collectives as "
             f"their collective #{number}:"]
    for members in groups.values():
        ranks = ", ".join(str(r["rank"]) for r in members)
        first = members[0]
        lines.append(f"  rank {ranks}: {_collective_text(first)} ({_progress(first)})")
    lines.append(_MISMATCH_ADVICE)
    return "\n".join(lines)


def describe_missing(mine, peer, problem):
    head = (f"mismatched collectives (TASKTRAIN_DEBUG_COLLECTIVES=1): rank {mine['rank']} calls "
            f"{_collective_text(mine)} as its collective #{mine['number']} ({_progress(mine)}), but")
    last = peer.get("collective")
    last_text = (f"; its last checked collective was #{last['number']} {_collective_text(last)}" if last else
                 "; it has made no checked collective yet")
    where = f", at {peer['where']}" if peer.get("where") else ""
    peer_who = f"rank {peer['rank']} (pid {peer['pid']} on {peer['host']})"
    if problem == "debug":
        return (f"{head} {peer_who} does not check its collectives: set {DEBUG_ENV}=1 for every rank (in the "
                "environment the launcher passes on).")
    if problem == "deadlock":
        what = (f"{peer_who} will not call it: it waits in another collective that rank {mine['rank']} has not "
                f"called ({_progress(peer)}{where}){last_text}.")
    else:
        what = (f"{peer_who} has not called it for {_seconds(peer['idle'])} ({_progress(peer)}{where})"
                f"{last_text}.")
    return f"{head} {what}\n{_MISMATCH_ADVICE}"


_MISMATCH_ADVICE = (
    "  Every rank must call the same collectives in the same order, with the same dtypes and shapes: look for a "
    "collective (strategy.reduce/all_gather/broadcast/barrier, accelerator.gather/reduce/wait_for_everyone) or a "
    "self.log(..., sync_dist=True) that only some ranks reach, e.g. under `if trainer.is_global_zero:` or after a "
    "rank-dependent condition.")


# -- frames and call sites ---------------------------------------------------------------------------------------
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                              for p in [sysconfig.get_paths().get(key)] if p} | {_PACKAGE_DIR + os.sep,
                             os.path.dirname(os.path.abspath(torch.__file__)) + os.sep}))


def _is_user_file(filename):
    return not filename.startswith("<") and not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


_INSTALLED_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in ("purelib", "platlib")
                                for p in [sysconfig.get_paths().get(key)] if p}, key=len, reverse=True))


def _short_path(filename):
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return os.path.relpath(path, os.path.dirname(_PACKAGE_DIR))  # tasktrain/...
    for installed in _INSTALLED_DIRS:  # torch/..., deepspeed/...
        if path.startswith(installed):
            return path[len(installed):]
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    return path


def _frame_text(frame):
    return f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _chain(frame):
    """'file:line in function' of `frame`, then (outwards) of the innermost tasktrain frame and of the innermost
    frame in the user's code, where those differ: where a thread is, in the terms that explain it."""
    frames, tasktrain_seen, f = [frame], frame.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep), frame
    while f is not None and not _is_user_file(f.f_code.co_filename):
        if not tasktrain_seen and f.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep):
            frames.append(f)
            tasktrain_seen = True
        f = f.f_back
    if f is not None and f is not frame:
        frames.append(f)
    return " <- ".join(_frame_text(f) for f in frames)


def _where_main_thread(ident):
    frame = sys._current_frames().get(ident)
    return None if frame is None else _chain(frame)


def _call_site():
    """Who called the strategy's collective (outside this file), and the user's frame above it."""
    frame = sys._getframe(2)  # _call_site <- run (the decorator) <- the caller
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return "?" if frame is None else _chain(frame)


def _describe_arguments(arguments, data, objects):
    """(what the message shows, what must be equal on every rank) for a collective's bound arguments."""
    shown, compared = [], []
    for name, value in arguments:
        if name in objects:
            shown.append(f"{name}=<{type(value).__name__}>")  # any object: its value and type may differ
            continue
        if isinstance(value, torch.Tensor):
            text = f"{name}={str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        elif name in data:
            text = f"{name}=<{type(value).__name__}>"  # a number carries data: its value may differ, not its type
        else:
            text = f"{name}={value!r}"
        shown.append(text)
        compared.append(text)
    return ", ".join(shown), ", ".join(compared)


def _silence_the_rest():
    """The message is out; what this process would say next is a consequence, not news: once a peer has exited,
    the main thread's collective fails, and its traceback (or a later error written for the launcher) would bury
    the message. So no more exception reports, and stdout/stderr go to /dev/null until os._exit."""
    sys.excepthook = lambda *args: None
    threading.excepthook = lambda *args: None
    for stream in (sys.stdout, sys.stderr):
        _quietly(stream.flush)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    except OSError:
        pass


def _quietly(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass
