"""A real Dask cluster: a scheduler and two worker processes on 127.0.0.1, started as
subprocesses the way a cluster starts them, and the CLI (``vtrain-fast sweep --scheduler``) as
a separate client process. One worker is killed with SIGKILL while it is writing a chunk and
other chunks are still pending; the sweep must finish on the other worker with exactly the rows
and the manifest of a local run of the same spec.

The kill is made race-free with SIGSTOP: the test watches ``/proc/PID/fd`` of each worker for an
open ``part-*.parquet.*.tmp``, freezes that worker, checks (while nothing can change) that the
manifest records at least one finished chunk, not this one and not all of them, and only then
sends SIGKILL. Nothing in the workers is patched; the ports are chosen by the operating system
(``--port 0``, address read back from the scheduler file).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from vtrain_fast.io.writer import read_manifest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(),
    reason="needs /proc/PID/fd (Linux) to see which chunk a worker is writing")

# 4 models x 6 token budgets x 5 gbs x 5 mbs x 3 recompute x 2 GPUs x 8 sizes x 4 tp x 4 pp
# x 2 vpp x 2 sequence_parallel = 1,843,200 points: 4 chunks of 2^19 points with --keep all
# (about 2 s each on one worker thread), every status, NaN rows included.
SPEC = """\
name = "real-dask"
[model]
presets = ["gpt3-350m", "gpt3-1.3b", "gpt3-13b", "llama2-7b"]
[training]
num_tokens = [1e9, 3e9, 1e10, 3e10, 1e11, 3e11]
global_batch_size = [64, 128, 256, 512, 1024]
micro_batch_size = [1, 2, 4, 8, 16]
recompute = ["none", "full", "selective"]
sequence_parallel = [false, true]
[cluster]
gpu = ["a100-sxm4-80gb", "h100-sxm-80gb"]
num_gpus = [8, 16, 32, 64, 128, 256, 512, 1024]
[parallel]
tp = [1, 2, 4, 8]
pp = [1, 2, 4, 8]
vpp = [1, 2]
"""

STARTUP_S = 90      # scheduler file, both workers registered
SWEEP_S = 240       # the distributed sweep, kill included
POLL_S = 0.005
GRACE_S = 5         # SIGTERM to SIGKILL at teardown (a worker closing waits for its running task)
TMP_RE = re.compile(r"part-(\d{6})\.parquet(\.[0-9a-f]+)?\.tmp$")     # PartWriter's temporary names


def _flat(text: str) -> str:
    """Whitespace-normalised text (messages must not depend on the terminal width)."""
    return " ".join(text.split())


class Processes:
    """Subprocesses of one test, each in its own session with its output in a log file;
    :meth:`stop_all` ends every one of them (SIGTERM, then SIGKILL) and reaps it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, object] = {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        """Start ``args`` as process ``name``; output goes to ``folder/name.log``."""
        log = open(self.folder / f"{name}.log", "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.folder, env=env, start_new_session=True)
        self.procs[name], self._logs[name] = proc, log
        return proc

    def tail(self, name: str, chars: int = 3000) -> str:
        """The last ``chars`` characters of process ``name``'s output."""
        self._logs[name].flush()
        return (self.folder / f"{name}.log").read_text(errors="replace")[-chars:]

    def report(self) -> str:
        """Exit status and output tail of every process, for failure messages."""
        return "\n".join(f"--- {name} (pid {p.pid}, returncode {p.poll()}):\n{self.tail(name)}"
                         for name, p in self.procs.items())

    def stop_all(self) -> list[str]:
        """End every process still running, the last started first (SIGTERM, then SIGKILL after
        GRACE_S) and reap it; return the names of those that had to be SIGKILLed. The scheduler
        goes last: a worker that closes while the scheduler is still there leaves at once (one
        told at the same time as the scheduler waits out the grace for it)."""
        forced = []
        for name, p in reversed(self.procs.items()):
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
            try:
                p.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                forced.append(name)
                _signal_group(p, signal.SIGKILL)
                p.wait(timeout=15)
        for log in self._logs.values():
            log.close()
        return forced


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the session (process group) that ``proc`` leads, i.e. ``proc`` and
    anything it started; nothing else."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture
def processes(tmp_path):
    """A :class:`Processes` whose every process is ended and reaped at teardown."""
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()
        alive = [name for name, p in procs.procs.items() if p.poll() is None]
        assert not alive, f"processes still running after teardown: {alive}"


def _wait_for(condition, timeout: float, what: str, procs: Processes):
    """Poll ``condition()`` until it returns something truthy; fail after ``timeout`` seconds,
    or at once if a process died, naming ``what`` and showing every process's output."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        dead = [name for name, p in procs.procs.items() if p.poll() is not None]
        if dead:
            pytest.fail(f"{', '.join(dead)} exited while waiting for {what}\n{procs.report()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{procs.report()}")
        time.sleep(0.05)


def _writing(pid: int) -> set[int]:
    """Chunks whose ``part-*.parquet.*.tmp`` process ``pid`` has open (from ``/proc/PID/fd``)."""
    chunks = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, PermissionError):
        return chunks
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = TMP_RE.search(target)
        if m:
            chunks.add(int(m.group(1)))
    return chunks


def _recorded(folder: Path) -> set[int] | None:
    """Chunks the running sweep's manifest records as finished (None before it exists)."""
    try:
        return {int(c) for c in json.loads((folder / "manifest.json").read_text())["chunks"]}
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


@pytest.mark.width_independent      # the sweep's process prints at COLUMNS=200; the local run's exit code only
def test_sweep_survives_a_killed_worker(tmp_path, cli, processes):
    spec = tmp_path / "real-dask.toml"
    spec.write_text(SPEC, encoding="utf-8")
    local, remote = tmp_path / "local", tmp_path / "dask"
    t0 = time.monotonic()
    res = cli("sweep", spec, "-o", local)        # also fills the Numba cache the workers load
    assert res.exit_code == 0, res.output
    local_manifest = read_manifest(local)
    num_chunks = local_manifest["plan"]["num_chunks"]
    assert num_chunks >= 3, "the spec must give several chunks for a kill mid-run"
    t_local = time.monotonic() - t0

    # scheduler and two worker processes (no nanny: the process killed is the worker itself)
    py = sys.executable
    sched_file = tmp_path / "scheduler.json"
    processes.start("scheduler", [py, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file),
                                  "--idle-timeout", "600"])

    def address():
        try:
            return json.loads(sched_file.read_text())["address"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return None
    addr = _wait_for(address, STARTUP_S, "the scheduler file", processes)
    assert addr.startswith("tcp://127.0.0.1:"), addr
    workers = {}
    for name in ("w0", "w1"):
        workers[name] = processes.start(name, [
            py, "-m", "distributed.cli.dask_worker", addr, "--name", name, "--nthreads", "1",
            "--no-nanny", "--host", "127.0.0.1", "--no-dashboard", "--death-timeout", "60",
            "--local-directory", str(tmp_path / f"dask-{name}")])

    from distributed import Client
    with Client(addr, timeout="30s") as client:
        _wait_for(lambda: len(client.scheduler_info()["workers"]) == 2, STARTUP_S,
                  "two workers registered with the scheduler", processes)
        pids = sorted(client.run(os.getpid).values())
    assert pids == sorted(p.pid for p in workers.values()), "the workers are not our two processes"

    # the CLI as its own client process
    t1 = time.monotonic()
    sweep = processes.start("sweep", [py, "-m", "vtrain_fast", "sweep", str(spec), "-o", str(remote),
                                      "--scheduler", addr])
    killed = None
    deadline = time.monotonic() + SWEEP_S
    while killed is None and sweep.poll() is None and time.monotonic() < deadline:
        done = _recorded(remote)
        if done:
            for name, w in workers.items():
                if not _writing(w.pid) - done:
                    continue
                w.send_signal(signal.SIGSTOP)             # freeze it, then look again
                writing, done_now = _writing(w.pid), _recorded(remote)
                mid = sorted(writing - done_now)
                if mid and 0 < len(done_now) < num_chunks:
                    w.send_signal(signal.SIGKILL)
                    killed = {"worker": name, "chunk": mid[0], "recorded": sorted(done_now),
                              "tmp": bool(list(remote.glob(f"part-{mid[0]:06d}.parquet*.tmp"))),
                              "part": (remote / f"part-{mid[0]:06d}.parquet").exists()}
                    break
                w.send_signal(signal.SIGCONT)
        time.sleep(POLL_S)
    assert killed is not None, (
        f"never saw a worker writing a chunk while others were pending, so nothing was killed "
        f"(sweep returncode {sweep.poll()}); the test would prove nothing\n{processes.report()}")
    victim = workers[killed["worker"]]
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL, victim.returncode
    # what the kill interrupted: a half-written part of an unrecorded chunk, chunks pending
    assert killed["tmp"] and not killed["part"], killed
    assert killed["chunk"] not in killed["recorded"], killed
    assert 1 <= len(killed["recorded"]) < num_chunks, killed

    try:
        sweep.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the sweep did not finish on the remaining worker within {SWEEP_S} s "
                    f"after killing {killed}\n{processes.report()}")
    t_dask = time.monotonic() - t1
    out = _flat(processes.tail("sweep"))
    assert sweep.returncode == 0, f"sweep exited {sweep.returncode} after killing {killed}: {out}"
    assert f"kept {local_manifest['num_rows']:,} rows (all)" in out, out
    survivor = next(p for name, p in workers.items() if name != killed["worker"])
    assert survivor.poll() is None, "the remaining worker died too\n" + processes.report()

    # the manifest: complete, every chunk recorded once with the local run's numbers
    manifest = read_manifest(remote)
    assert manifest["complete"] is True
    assert sorted(map(int, manifest["chunks"])) == list(range(num_chunks))
    assert manifest["chunks"] == local_manifest["chunks"]
    for k in ("num_rows", "status_counts", "parts", "sweep_key", "plan", "pruned_points"):
        assert manifest[k] == local_manifest[k], k
    assert (remote / f"part-{killed['chunk']:06d}.parquet").exists()
    assert not list(remote.rglob("*.tmp")), list(remote.rglob("*.tmp"))

    # the rows: all columns, exactly, in the same order, part by part (the parts are the local run's,
    # each one chunk's rows in grid order)
    t2 = time.monotonic()
    for part in manifest["parts"]:
        assert_frame_equal(pl.read_parquet(remote / part), pl.read_parquet(local / part), check_exact=True)
    print(f"local {t_local:.1f} s, cluster start {t1 - t0 - t_local:.1f} s, dask {t_dask:.1f} s, "
          f"compare {time.monotonic() - t2:.1f} s, killed {killed}")
