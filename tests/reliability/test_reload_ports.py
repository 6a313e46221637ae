"""A replacement worker and the ops ports of its slot (``--health-port``, ``--metrics-port``):
on a reload (SIGHUP) or a recycle the new worker starts while its predecessor still serves the
slot's ports, keeps running tasks and binds them once the predecessor released them
(docs/supervisor.md, "Reload"); a first start on a port another socket holds still exits 78
(a configuration error).

Real processes and the shared Redis, each test on its own namespace.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from blitzq import Queue
from tests.polling import wait_until
from tests.ports import free_port
from tests.reliability import test_process_control as pc
from tests.reliability.test_supervisor import ROOT, Supervised, alive, registered_pids

HOST = "127.0.0.1"
GATED, WORK, runs, workers_are = pc.GATED, pc.WORK, pc.runs, pc.workers_are
#: The fixtures of test_process_control (its supervisor, producer and Redis client).
start, producer, client = pc.start, pc.producer, pc.client


def port_pair(count: int = 2) -> int:
    """A free port whose next ``count - 1`` ports are free too (slots add their index)."""

    def pair() -> int | None:
        port = free_port()
        try:
            for n in range(1, count):
                with socket.socket() as probe:
                    probe.bind((HOST, port + n))
        except OSError:
            return None
        return port

    return wait_until(pair, 10, "two consecutive free ports")  # type: ignore[no-any-return]


def get(port: int, path: str) -> tuple[int, bytes]:
    """``(status, body)`` of ``GET http://127.0.0.1:port/path``; ``(0, b"")`` when nothing
    answers."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def ready_worker(port: int) -> str | None:
    """The process instance of the worker whose ``/ready`` on ``port`` answers 200, else
    ``None`` (not its id: a slot's successor keeps the slot's stable ``worker`` id)."""
    status, body = get(port, "/ready")
    return json.loads(body)["instance"] if status == 200 else None  # type: ignore[no-any-return]


@pytest.fixture
def held() -> Iterator[Callable[[int], socket.socket]]:
    """Listen on ports as "another program" would; closed at the end."""
    socks: list[socket.socket] = []

    def hold(port: int) -> socket.socket:
        sock = socket.socket()
        sock.bind((HOST, port))
        sock.listen()
        socks.append(sock)
        return sock

    yield hold
    for sock in socks:
        sock.close()


def test_sighup_with_health_and_metrics_ports_keeps_both_workers_serving(
    start: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    health = port_pair(4)
    metrics = health + 2
    sup = start(
        *("--workers", "2", "-c", "4", "--shutdown-timeout", "120", "--ops-host", HOST),
        *("--health-port", str(health), "--metrics-port", str(metrics)),
    )
    old = set(workers_are(sup, client, namespace, 2))
    old_ids = {
        wait_until(lambda p=p: ready_worker(p), 30, f"/ready on {p}\n{sup.output()}")
        for p in (health, health + 1)
    }
    path, gate = tmp_path / "runs.txt", tmp_path / "gate"
    handles = [producer.send_sync(GATED, (str(path), str(i), str(gate))) for i in range(8)]
    wait_until(lambda: len(runs(path)) == 8, 40, f"8 tasks running\n{sup.output()}")
    sup.proc.send_signal(signal.SIGHUP)
    new = wait_until(
        lambda: (p := set(sup.workers())) and len(p - old) == 2 and p - old,
        40,
        f"two new workers\n{sup.output()}",
    )
    # The new workers run (registered: past their ops start) while the old ones, their runs
    # held by the gate, keep the ports: /ready answers from the old ones, saying they stop.
    wait_until(
        lambda: new <= registered_pids(client, namespace),
        60,
        f"the new workers registered\n{sup.output()}",
    )
    # Each new worker logs that it retries the ports (the log reaches the supervisor's
    # output through a pipe: it may trail the registration).
    wait_until(
        lambda: sup.output().count("retries for up to") == 2,
        30,
        f"both new workers retrying the ports\n{sup.output()}",
    )
    for port in (health, health + 1):
        wait_until(lambda port=port: get(port, "/ready")[0] == 503, 30, f"/ready 503 on {port}")
        status, body = get(port, "/ready")
        assert status == 503
        assert "worker" in json.loads(body)["failing"], body
    gate.touch()
    # Each finished; where it began, unless the loaded machine let an old worker's lease
    # lapse (the app's visibility timeout is 1.5 s) and a new worker ran it again, which
    # at-least-once allows: every task ran, none was lost with the reload.
    assert {h.result_sync(timeout=60) for h in handles} <= old | new
    assert {t for t, _ in runs(path)} == {str(i) for i in range(8)}
    for pid in old:
        wait_until(lambda pid=pid: not alive(pid), 60, f"old worker {pid} gone\n{sup.output()}")
    for port in (health, health + 1):
        worker = wait_until(
            lambda port=port: (w := ready_worker(port)) and w not in old_ids and w,
            60,
            f"/ready 200 from a new worker on {port}\n{sup.output()}",
        )
        assert worker not in old_ids
        assert get(port, "/health")[0] == 200
    for port in (metrics, metrics + 1):
        _, body = wait_until(
            lambda port=port: (a := get(port, "/metrics"))[0] == 200 and a,
            60,
            f"/metrics on {port}\n{sup.output()}",
        )
        assert b"blitzq_" in body
    assert sup.proc.poll() is None
    assert set(sup.workers()) == new
    answer = producer.send_sync(WORK, (str(path), "after", 0.0)).result_sync(timeout=30)
    assert answer in new
    assert "Address already in use" not in sup.output().split("reloading every worker")[0]
    assert "not restarting it" not in sup.output()


def test_max_tasks_per_child_recycles_and_keeps_serving_metrics(
    start: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    sup = start("--max-tasks-per-child", "3", "--metrics-port", str(port), "--ops-host", HOST)
    workers_are(sup, client, namespace, 1)
    path = tmp_path / "runs.txt"
    handles = [producer.send_sync(WORK, (str(path), str(i), 0.0)) for i in range(9)]
    pids = {h.result_sync(timeout=80) for h in handles}
    assert len(pids) >= 3, pids  # recycled at least twice
    last = wait_until(
        lambda: (p := sup.workers()) and p[0] not in pids and p[0], 40, "the next worker"
    )
    _, body = wait_until(
        lambda: (a := get(port, "/metrics"))[0] == 200 and a, 40, f"/metrics\n{sup.output()}"
    )
    assert b"blitzq_" in body
    assert sup.proc.poll() is None
    assert alive(last)
    assert "not restarting it" not in sup.output()


@pytest.mark.parametrize("option", ["--health-port", "--metrics-port"])
def test_first_start_on_a_port_another_socket_holds_exits_78(
    start: Callable[..., Supervised],
    held: Callable[[int], socket.socket],
    option: str,
) -> None:
    port = port_pair()
    held(port)
    held(port + 1)
    sup = start("--workers", "2", option, str(port), "--ops-host", HOST)
    code = wait_until(lambda: sup.proc.poll(), 60, f"the supervisor exits\n{sup.output()}")
    assert code == 78, sup.output()
    kind = "health endpoints" if option == "--health-port" else "metrics"
    assert f"cannot serve {kind} on {HOST}:{port}" in sup.output()
    assert "Address already in use" in sup.output()
    assert "retries for up to" not in sup.output()  # a first start does not wait


def test_a_replacement_gives_up_on_a_port_still_held_after_its_wait(
    held: Callable[[int], socket.socket], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    held(port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(PYTHONUNBUFFERED="1", BLITZQ_OPS_PORT_WAIT="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    cmd = [sys.executable, "-m", "blitzq", "worker", "tests.reliability.test_process_control:queue"]
    cmd += ["--redis-url", redis_url, "--namespace", namespace, "--health-port", str(port)]
    cmd += ["--ops-host", HOST, "--no-supervise"]  # a supervisor's first start does not wait
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 78, output
    assert "retries for up to 1 s" in output  # it ran meanwhile
    assert f"cannot serve health endpoints on {HOST}:{port}" in output
    assert "still in use after 1 s" in output
