"""Shared by the integration tests (run by the project's .venv or by Debian's python3): named
checks that report every failure and go on, the closing tally and exit code, free TCP ports, and
scratch folders removed when the script exits."""
import atexit
import shutil
import socket
import tempfile
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
