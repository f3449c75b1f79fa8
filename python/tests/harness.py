"""Real grps daemons for the Python package's tests: a coordinator and its
servers as separate processes on loopback, always torn down (by PID)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("GRPS_BIN", "")
PYTHON_DIR = os.environ.get("GRPS_PYTHON_DIR", "")
HERE = os.path.dirname(os.path.abspath(__file__))


def _die_with_parent():
    """In the child before exec: SIGKILL when the test process dies, however
    it dies (a ctest timeout kills it outright, skipping __exit__)."""
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wait_file(path, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        time.sleep(0.05)
    raise TimeoutError("no %s after %ss" % (path, seconds))


class Job:
    """`with Job(servers=2, workers=2, flags=[...]) as job:` starts the
    coordinator (--model=user) and the servers; job.worker(script, args,
    rank) starts a Python worker; every process started is ended at exit."""

    def __init__(self, servers=2, workers=2, flags=(), checkpoint_dir=None, tokens=None):
        if not BIN:
            raise RuntimeError("set GRPS_BIN to the folder of the grps binaries")
        self.servers, self.workers, self.flags = servers, workers, list(flags)
        self.work = tempfile.mkdtemp(prefix="grps-py.")
        self.checkpoint_dir = checkpoint_dir
        self.procs = {}
        self.address = None
        # (admin, worker): the daemons get both, the workers theirs.
        self.tokens = tokens

    def __enter__(self):
        port_file = os.path.join(self.work, "coordinator.port")
        flags = ["--model=user", "--servers=%d" % self.servers, "--workers=%d" % self.workers,
                 "--listen=127.0.0.1:0", "--port_file=" + port_file, "--heartbeat_ms=200",
                 "--heartbeat_timeout_ms=2000"] + self.flags
        if self.checkpoint_dir:
            flags.append("--checkpoint_dir=" + self.checkpoint_dir)
        self.start("coordinator", [os.path.join(BIN, "grps-coordinator")] + flags,
                   self.daemon_env())
        _wait_file(port_file, 20)
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()
        for s in range(self.servers):
            self.start_server(s)
        return self

    def start_server(self, shard):
        args = [os.path.join(BIN, "grps-server"), "--coordinator=" + self.address,
                "--shard=%d" % shard]
        if self.checkpoint_dir:
            args.append("--checkpoint_dir=" + self.checkpoint_dir)
        return self.start("server%d" % shard, args, self.daemon_env())

    def daemon_env(self):
        env = dict(os.environ)
        if self.tokens:
            env["GRPS_TOKEN"], env["GRPS_WORKER_TOKEN"] = self.tokens
        return env

    def start(self, name, args, env=None):
        log = open(os.path.join(self.work, name + ".log"), "ab")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        self.procs[name] = proc
        return proc

    def worker(self, script, args=(), rank=-1, name=None, env_extra=None):
        env = dict(os.environ)
        if self.tokens:
            env["GRPS_WORKER_TOKEN"] = self.tokens[1]
        env.update(env_extra or {})
        env["GRPS_COORDINATOR"] = self.address
        env["GRPS_RANK"] = str(rank)
        env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + HERE + os.pathsep + env.get("PYTHONPATH", "")
        return self.start(name or "worker%d" % rank,
                          [sys.executable, os.path.join(HERE, script)] + list(args), env)

    def kill(self, name, sig=signal.SIGKILL):
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(timeout=30)

    def status(self):
        """The job's status (grps.JobClient) as the admin sees it."""
        import grps
        return grps.JobClient(self.address, token=self.tokens[0] if self.tokens else None).status()

    def wait_running(self, seconds=30):
        end = time.time() + seconds
        while time.time() < end:
            if self.status().get("state") == "JOB_STATE_RUNNING":
                return
            time.sleep(0.1)
        raise TimeoutError("the job is not running after %ss\n%s" % (seconds, self.logs()))

    def wait(self, name, timeout):
        return self.procs[name].wait(timeout=timeout)

    def log(self, name):
        path = os.path.join(self.work, name + ".log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    def logs(self):
        return "\n".join("---- %s\n%s" % (n, self.log(n)[-3000:]) for n in sorted(self.procs))

    def path(self, name):
        return os.path.join(self.work, name)

    def __exit__(self, *exc):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.time() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.environ.get("KEEP_WORK") == "1" or exc[0] is not None:
            print("work dir kept: " + self.work, file=sys.stderr)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return False
