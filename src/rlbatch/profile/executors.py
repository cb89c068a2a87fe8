"""Executors: where trials run.

Every trial is one `rlbatch train CONFIG --resume --json` process, so a crash stays inside its
trial, and a finished trial is skipped by the trainer itself (its run directory says so). The
executors only start processes and report when they end; the profile's driver watches the run
directories for progress and early stopping.

- `LocalExecutor(workers)`: up to `workers` subprocesses at once on this machine.
- `RayExecutor(address, workers, num_cpus, num_gpus)`: each trial is a Ray task with a
  resource request that runs the same command on a Ray worker; run directories must be on a
  filesystem the driver can read (a local Ray runtime, or a shared filesystem on a cluster).
- `RayJobExecutor(address, workers, num_cpus, num_gpus)`: each trial is a job on an
  existing Ray cluster (job submission API), for commands that start Ray themselves.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlbatch.core.errors import ConfigError
from rlbatch.core.launch import module_argv


def available_threads() -> int:
    """The threads the profile's trials may use together: `RLBATCH_THREADS` where the
    profile's own environment sets it (a machine shared with other work), otherwise the CPUs
    this process may run on (its affinity: taskset, a cgroup cpuset, a batch scheduler's
    allocation), not every core of the machine."""
    given = os.environ.get("RLBATCH_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity call (macOS)
        return os.cpu_count() or 1


def trial_env(workers: int) -> dict:
    """Environment of a trial process: unbuffered output, and the available threads split
    between concurrent trials (oversubscribed intra-op threads slow every trial down, by 10x
    and more where two trials' threads spin on the same cores)."""
    threads = max(1, available_threads() // max(1, workers))
    return dict(os.environ, PYTHONUNBUFFERED="1", RLBATCH_THREADS=str(threads))


def trial_command(config_path: Path, die_with_parent: bool = False) -> list[str]:
    """`rlbatch train CONFIG --resume --json`, the working directory last on sys.path
    (core/launch.py); `die_with_parent`: SIGTERM to the trial when its starter ends (a local
    trial: the profile), which the trial handles as any SIGTERM, stopping its command."""
    return module_argv("rlbatch.cli.main", "train", str(config_path), "--resume", "--json",
                       die_with_parent=die_with_parent)


@dataclass
class Finished:
    name: str
    returncode: int
    log: Path


class _Executor:
    """What both executors share: up to `workers` trials in flight, each kept as
    name -> (handle, log path) until it is reported finished."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._running: dict[str, tuple[object, Path]] = {}

    def capacity(self) -> int:
        return self.workers - len(self._running)

    def running(self) -> list[str]:
        return list(self._running)

    def _reap(self, exit_code: Callable[[object], int | None]) -> list[Finished]:
        """The trials whose `exit_code(handle)` is not None, no longer in flight."""
        done = []
        for name, (handle, log) in list(self._running.items()):
            code = exit_code(handle)
            if code is not None:
                done.append(Finished(name, code, log))
                del self._running[name]
        return done


class LocalExecutor(_Executor):
    name = "local"

    def submit(self, name: str, config_path: Path, log_path: Path) -> None:
        env = trial_env(self.workers)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(trial_command(config_path, die_with_parent=True),
                                    stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
        self._running[name] = (proc, log_path)

    def poll(self) -> list[Finished]:
        return self._reap(lambda proc: proc.poll())

    def shutdown(self, grace_s: float = 120.0) -> None:
        """SIGTERM to every trial still running (each writes `failed: terminated by SIGTERM`
        and stops what it runs), SIGKILL to any still there after `grace_s`."""
        for proc, _ in self._running.values():
            proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc, _ in self._running.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._running.clear()


def _run_trial_command(cmd: list[str], log_path: str, threads: int) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1", RLBATCH_THREADS=str(threads))
    with open(log_path, "ab") as log:
        return subprocess.run(check=False, args=cmd, stdout=log, stderr=log, env=env,
                              stdin=subprocess.DEVNULL).returncode


class RayExecutor(_Executor):
    name = "ray"

    def __init__(self, address: str | None = None, workers: int = 1, num_cpus: float = 1,
                 num_gpus: float = 0):
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs the `ray` extra: pip install 'rlbatch[ray]'")
        super().__init__(workers)
        self.ray = ray
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(1, workers * int(num_cpus or 1)), log_to_driver=False,
                         include_dashboard=False)
        self.num_cpus = num_cpus
        self._task = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_run_trial_command)

    def submit(self, name: str, config_path: Path, log_path: Path) -> None:
        threads = max(1, int(self.num_cpus))
        ref = self._task.remote(trial_command(config_path), str(log_path), threads)
        self._running[name] = (ref, log_path)

    def poll(self) -> list[Finished]:
        if not self._running:
            return []
        refs = [ref for ref, _ in self._running.values()]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        return self._reap(lambda ref: int(self.ray.get(ref)) if ref in ready else None)

    def shutdown(self) -> None:
        for ref, _ in self._running.values():
            self.ray.cancel(ref, force=True)
        self._running.clear()


RAY_JOB_EXIT = {"SUCCEEDED": 0, "STOPPED": 143}  # a FAILED job's code is in its message


class RayJobExecutor(_Executor):
    """Each trial is a job submitted to an existing Ray cluster through Ray's job submission
    API (the dashboard's address, e.g. http://head:8265), with its own CPU and GPU request:
    how verl and OpenRLHF runs are launched, since their drivers call `ray.init` themselves
    and cannot run inside a Ray task. The job's entrypoint is the trial's `rlbatch train`,
    which starts the user's command and follows its log; the cluster's nodes must see this
    Python environment and the profile folder at the same paths (one machine, or a shared
    filesystem). The job's output is copied into the trial's log when it ends; a job stopped
    with `stop_job` gets SIGTERM, then SIGKILL after Ray's RAY_JOB_STOP_WAIT_TIME_S."""

    name = "ray-job"

    def __init__(self, address: str | None, workers: int = 1, num_cpus: float = 1,
                 num_gpus: float = 0):
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise ConfigError("--executor ray-job needs Ray's job submission client: pip "
                              "install 'rlbatch[ray]' (ray[default])") from None
        address = address or os.environ.get("RAY_ADDRESS")
        if not address:
            raise ConfigError("--executor ray-job needs --address: the Ray dashboard's "
                              "address, e.g. http://127.0.0.1:8265 (or RAY_ADDRESS)")
        super().__init__(workers)
        try:
            self.client = JobSubmissionClient(address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"--address: no Ray job server at {address} "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") \
                from None
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self._jobs: dict[str, str] = {}

    def submit(self, name: str, config_path: Path, log_path: Path) -> None:
        import shlex

        job = f"rlbatch-{name}-{os.getpid()}-{time.time_ns()}"  # ids are never reused
        threads = max(1, int(self.num_cpus))
        # the job starts where Ray puts it: the trial runs in this folder, as locally
        entrypoint = f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(trial_command(config_path))}"
        self.client.submit_job(
            entrypoint=entrypoint, submission_id=job,
            runtime_env={"env_vars": {"PYTHONUNBUFFERED": "1", "RLBATCH_THREADS": str(threads)}},
            entrypoint_num_cpus=self.num_cpus, entrypoint_num_gpus=self.num_gpus)
        with open(log_path, "a") as log:
            log.write(f"ray job {job}\n")
        self._running[name] = (job, log_path)
        self._jobs[name] = job

    def _exit_code(self, job: str) -> int | None:
        info = self.client.get_job_info(job)
        status = str(getattr(info.status, "value", info.status))
        if status in ("PENDING", "RUNNING"):
            return None
        if status in RAY_JOB_EXIT:
            return RAY_JOB_EXIT[status]
        found = re.search(r"exit code (-?\d+)", info.message or "")
        return int(found.group(1)) if found else 1

    def poll(self) -> list[Finished]:
        done = self._reap(self._exit_code)
        for fin in done:  # the job's output, kept by Ray, joins the trial's log
            job = self._jobs.pop(fin.name)
            with open(fin.log, "a") as log:
                log.write(self.client.get_job_logs(job))
        return done

    def shutdown(self) -> None:
        for job, _ in self._running.values():
            self.client.stop_job(job)
        self._running.clear()


# Frameworks whose driver starts its own Ray actors and asks Ray for their GPUs (verl's
# resource pools, OpenRLHF's placement groups). A ray-job's entrypoint_num_gpus are reserved
# for the entrypoint, "separately from any tasks or actors launched by it" (Ray 2.60,
# dashboard/modules/job/sdk.py `submit_job`), so they would be GPUs those actors cannot have.
RAY_DRIVER_FRAMEWORKS = ("verl", "openrlhf")


def check_trial_gpus(executor: str, trial_gpus: float, cfg) -> None:
    """Refuse `--trial-gpus` on a ray-job whose command starts its own GPU actors, and
    `--executor ray` for such a command: its driver calls `ray.init` itself (verl 1dda039
    verl/trainer/main_ppo.py 57-74, OpenRLHF 3c3be62 openrlhf/cli/train_ppo_ray.py 21-24)
    and asks Ray for its actors' GPUs, which a Ray task holding the trial cannot pass on;
    a Ray job (RayJobExecutor) is how such a driver is run on a cluster."""
    framework = cfg.command.framework if cfg.backend == "command" and cfg.command else None
    if executor == "ray" and framework in RAY_DRIVER_FRAMEWORKS:
        raise ConfigError(
            f"--executor ray: {framework}'s driver starts Ray and its GPU actors itself, "
            "which a trial run as a Ray task cannot hold; use --executor ray-job --address "
            "http://HEAD:8265 (each trial a Ray job)")
    if executor == "ray-job" and trial_gpus > 0 and framework in RAY_DRIVER_FRAMEWORKS:
        raise ConfigError(
            f"--trial-gpus {trial_gpus:g}: a Ray job's GPUs are reserved for its entrypoint, "
            f"apart from the actors it starts, so {framework}'s own actors could not use them; "
            f"leave --trial-gpus at 0 ({framework} asks Ray for its GPUs itself) and set "
            "profile.workers to the number of trials the cluster holds at once")


def make_executor(name: str, workers: int, address: str | None = None,
                  num_cpus: float = 1, num_gpus: float = 0):
    if num_cpus <= 0 or num_gpus < 0:
        raise ConfigError("--trial-cpus must be > 0 and --trial-gpus >= 0")
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(address=address, workers=workers, num_cpus=num_cpus,
                           num_gpus=num_gpus)
    if name == "ray-job":
        return RayJobExecutor(address, workers=workers, num_cpus=num_cpus, num_gpus=num_gpus)
    raise ConfigError(f"--executor: unknown executor '{name}'; use local, ray or ray-job")
