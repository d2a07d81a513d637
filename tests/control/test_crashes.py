"""A crashed worker's Python stack reaches the launcher (control/crashes.py)."""

import subprocess
import sys
import textwrap

import pytest

# A launcher whose faulthandler is on (pytest's) and whose SIGABRT handler a library has
# since replaced: faulthandler.enable() in the worker alone installed no handler, and the
# worker died with no stack (a CI run of the full suite).
LAUNCHER = textwrap.dedent("""
    import faulthandler, multiprocessing as mp, os, signal
    from fastsgd.control.crashes import Stacks
    faulthandler.enable()
    signal.signal(signal.SIGABRT, signal.SIG_DFL)
    def crash_here():
        os.kill(os.getpid(), signal.SIGABRT)
    def worker(fn):
        os.environ["RANK"] = "0"
        fn()
    stacks = Stacks(1)
    p = mp.get_context("fork").Process(target=worker, args=(stacks.armed(crash_here),))
    p.start()
    p.join()
    print(p.exitcode)
    print(stacks.read(0))
""")


@pytest.mark.multiproc
def test_a_crashed_workers_stack_is_read_though_a_library_replaced_the_handler():
    out = subprocess.run([sys.executable, "-c", LAUNCHER], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    exitcode, _, stack = out.partition("\n")
    assert exitcode == "-6"
    assert "in crash_here" in stack and "in worker" not in stack, stack
