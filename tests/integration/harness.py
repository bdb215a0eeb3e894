"""Shared by the integration tests (run by the project's .venv or by Debian's python3): named
checks that report every failure and go on, the closing tally and exit code, free TCP ports,
scratch folders removed when the script exits, and a redis-server."""
import atexit
import shutil
import socket
import subprocess
import tempfile
import time
import traceback

_RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


def check(name, fn):
    """Runs one named check; a failure prints its traceback and the run goes on."""
    try:
        fn()
        _RESULTS["passed"] += 1
        print(f"PASS {name}", flush=True)
    except Exception:  # noqa: BLE001 - report every failure and go on
        _RESULTS["failed"] += 1
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)


def skip(name, why):
    _RESULTS["skipped"] += 1
    print(f"SKIP {name}: {why}", flush=True)


def summary():
    """Prints the tally; returns the exit code (1 if any check failed)."""
    skipped = f", {_RESULTS['skipped']} skipped" if _RESULTS["skipped"] else ""
    print(f"{_RESULTS['passed']} passed, {_RESULTS['failed']} failed{skipped}", flush=True)
    return 1 if _RESULTS["failed"] else 0


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch_dir(prefix):
    """A new folder under the system's temporary directory, removed with everything in it when the
    script exits, however it exits short of a kill: stores written there (gigabytes of SSD files)
    must not pile up run after run."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class Redis:
    """A redis-server (Debian's) on a free loopback port, without persistence; killed when the
    script exits if it still runs. stop() and start() again: an empty one, as after a crash."""

    def __init__(self):
        self.port = free_port()
        self.process = None
        self.start()

    def start(self):
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning"], stdout=subprocess.DEVNULL)
        atexit.register(self.process.kill)
        for _ in range(200):
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.025)
        raise AssertionError("redis-server did not start")

    def stop(self):
        self.process.kill()
        self.process.wait()

    def cli(self, *words):
        result = subprocess.run(["redis-cli", "--raw", "-p", str(self.port), *words],
                                capture_output=True, text=True)
        return result.stdout.strip()

    def chunks_per_layout(self):
        """Stored chunk keys per layout tag (strata:1:<tag>:<codec>:k:...; one tag per
        tensor-parallel rank)."""
        counts = {}
        for key in self.cli("KEYS", "strata:1:*:k:*").split():
            tag = key.split(":")[2]
            counts[tag] = counts.get(tag, 0) + 1
        return counts
