"""The application of the CPU-pool tests (``tests/reliability/test_cpu_pool.py``).

Its tasks run with ``executor="cpu"``: the worker's forkserver imports this module before it
forks the pool's children (so the module stays small). With ``BLITZQ_TEST_REFUSE_FORK=1`` in
the environment, importing it *in the forkserver* makes every later fork there fail
(``RLIMIT_NPROC`` 0, as an unprivileged user): the OS refusing the forkserver, for the
exit-code test.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from blitzq import Queue

MB = 1024 * 1024

queue = Queue("cpu", visibility_timeout=30)
_HELD: list[bytes] = []


def _in_forkserver() -> bool:
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


if os.environ.get("BLITZQ_TEST_REFUSE_FORK") == "1" and _in_forkserver():
    if os.getuid() == 0:  # root ignores RLIMIT_NPROC: become nobody first
        os.setgid(65534)
        os.setuid(65534)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


@queue.task(executor="cpu")
def crunch(n: int) -> list[int]:
    """Sum the squares below ``n`` (computes in the child); return ``[sum, child pid]``."""
    return [sum(i * i for i in range(n)), os.getpid()]


@queue.task(executor="cpu", timeout=2, retries=0)
def stuck(pid_file: str) -> None:
    """Write this child's pid to ``pid_file``, then never return (a hard timeout's victim)."""
    _write(pid_file, str(os.getpid()))
    while True:
        time.sleep(1)


@queue.task(executor="cpu")
def held(pid_file: str) -> None:
    """Write this child's pid to ``pid_file``, then never return (a cancel's victim)."""
    _write(pid_file, str(os.getpid()))
    while True:
        time.sleep(1)


@queue.task(executor="cpu")
def gated(pid_file: str, gate: str) -> int:
    """Write this child's pid to ``pid_file``, wait until the file ``gate`` exists, return
    the pid (a sibling that must survive another child's kill)."""
    _write(pid_file, str(os.getpid()))
    while not os.path.exists(gate):
        time.sleep(0.02)
    return os.getpid()


@queue.task(executor="cpu")
def child_pid() -> int:
    """Return the pid of the child running the call."""
    return os.getpid()


@queue.task(executor="cpu")
def hog(megabytes: int) -> int:
    """Hold ``megabytes`` of touched memory in this child for good; return its pid."""
    _HELD.append(b"\x01" * (megabytes * MB))
    return os.getpid()


@queue.task
def plain_pid() -> int:
    """A sync task on its default executor: ``--pool cpu`` runs it in the CPU pool."""
    return os.getpid()
