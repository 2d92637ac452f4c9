"""Shared helpers of the Python tests.

Run through scripts/test_python.sh, which sets SHOAL_LIBRARY (the libshoal.so under
test) and PYTHONPATH=bindings/python. Multi-rank tests run either as threads of this
process over a memory:// store (ctypes releases the GIL, so threads really run in
parallel) or as processes under build/bin/shoalrun.
"""
import itertools
import os
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_store_ids = itertools.count()

# test_installed.py checks an installed wheel; only SHOAL_TEST_WHEEL=1 scripts/test_python.sh runs it.
collect_ignore = [] if os.environ.get("TEST_INSTALLED_WHEEL") == "1" else ["test_installed.py"]


def library():
    path = os.environ.get("SHOAL_LIBRARY")
    if not path:
        pytest.fail("SHOAL_LIBRARY is not set; run the tests through scripts/test_python.sh <build dir>")
    return path


def shoalrun_path():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(library()))), "bin", "shoalrun")
    if not os.path.exists(path):
        pytest.fail("shoalrun not found at %s (build the shoalrun target)" % path)
    return path


def run_threads(nranks, body, timeout_s=20.0, **comm_args):
    """Runs body(comm) on nranks threads, each with its own Communicator over one memory:// store.
    Returns the per-rank results; re-raises the first exception."""
    import shoal
    store = "memory://pytest-%d-%d" % (os.getpid(), next(_store_ids))
    results, errors = [None] * nranks, [None] * nranks

    def rank_main(rank):
        try:
            comm = shoal.Communicator(rank=rank, world_size=nranks, store=store, timeout_s=comm_args.get(
                "comm_timeout_s", 10.0))
            try:
                results[rank] = body(comm)
            finally:
                comm.finalize()
        except BaseException as error:  # handed to the main thread
            errors[rank] = error

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        if t.is_alive():
            pytest.fail("a rank thread is still running after %.0f s: a hang" % timeout_s)
    for e in errors:
        if e is not None:
            raise e
    return results


def shoalrun(nranks, script, *args, timeout_s=120, env=None):
    """Runs tests/python/workers/<script> on nranks processes under shoalrun; returns (rc, output)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONPATH"] = os.path.join(ROOT, "bindings", "python")
    full_env.update(env or {})
    command = [shoalrun_path(), "-np", str(nranks), "--timeout-s", str(timeout_s), sys.executable,
               os.path.join(HERE, "workers", script)] + [str(a) for a in args]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                          timeout=timeout_s + 30)
    return proc.returncode, proc.stdout.decode(errors="replace")


def torch_or_skip():
    """torch, or a skip when it is not installed (the only reason a torch test may skip)."""
    return pytest.importorskip("torch")
