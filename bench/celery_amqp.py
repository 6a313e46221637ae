"""Celery on RabbitMQ, for bench/amqp.py's comparison: the drain of pre-enqueued no-op tasks.

Run with a Python that has Celery (not in blitzq's lock: e.g. a separate virtualenv with
``pip install celery redis``)::

    <celery-python> bench/celery_amqp.py --amqp URL --redis URL [--tasks N] [--pool threads]

Celery is configured as close to blitzq's drain as it goes: late acks (at-least-once, as
blitzq's RabbitMQ transport), results stored in Redis, prefetch multiplier 1 per slot
(``worker_prefetch_multiplier = 2``, blitzq's prefetch), the default exchange into one queue
of this run (a classic queue: Celery declares classic queues unless told otherwise). A worker
process starts on another queue; once it answers, it is told to consume the queue holding
the ``--tasks`` pre-enqueued tasks (``add_consumer``) and the clock runs until every task
counted itself in Redis and the last result is stored. Prints one line: ``<tasks/s>``.
The queue and keys are deleted afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

# bench/amqp.py would shadow py-amqp (Celery's AMQP client): keep this directory off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

QUEUE = os.environ.get("CELERY_BENCH_QUEUE", "")
COUNTER = QUEUE + "-ran"


def make_app():
    """The Celery app of this run (its URLs from the environment)."""
    from celery import Celery

    app = Celery(
        "celery_amqp",
        broker=os.environ["CELERY_BENCH_AMQP"],
        backend=os.environ["CELERY_BENCH_REDIS"],
    )
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=2,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
    )
    import redis

    client = redis.Redis.from_url(os.environ["CELERY_BENCH_REDIS"])

    @app.task(name="bench.noop")
    def noop() -> int:
        client.incr(COUNTER)
        return 1

    return app, noop, client


if QUEUE:
    app, noop, _client = make_app()


def main() -> None:
    """Enqueue, start a worker, let it consume, time the drain, clean up."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--amqp", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--pool", default="threads", help="threads or prefork")
    parser.add_argument("--concurrency", type=int, default=200)
    args = parser.parse_args()
    queue = f"celery-bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, CELERY_BENCH_QUEUE=queue, CELERY_BENCH_AMQP=args.amqp)
    env["CELERY_BENCH_REDIS"] = args.redis
    os.environ.update(env)
    global app, noop, COUNTER
    COUNTER = queue + "-ran"
    app, noop, client = make_app()
    ids = [noop.apply_async(queue=queue).id for _ in range(args.tasks)]
    idle = queue + "-idle"
    here = tempfile.mkdtemp(prefix="celery-bench-")  # the app module, away from bench/
    shutil.copy(os.path.abspath(__file__), os.path.join(here, "celery_bench_app.py"))
    cmd = [sys.executable, "-m", "celery", "-A", "celery_bench_app:app", "worker", "-Q", idle]
    cmd += ["-P", args.pool, "-c", str(args.concurrency), "--without-gossip"]
    cmd += ["--without-mingle", "--without-heartbeat", "-l", "warning"]
    worker = subprocess.Popen(cmd, cwd=here, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(timeout=0.5):
            if time.monotonic() > deadline:
                raise SystemExit("the Celery worker did not start")
        t0 = time.perf_counter()
        app.control.add_consumer(queue, reply=False)
        last = app.AsyncResult(ids[-1])
        while int(client.get(COUNTER) or 0) < args.tasks or not last.ready():
            time.sleep(0.005)
            if time.perf_counter() - t0 > 300:
                raise SystemExit("the Celery drain did not end within 300 s")
        elapsed = time.perf_counter() - t0
        print(f"{args.tasks / elapsed:.1f}")
    finally:
        worker.terminate()
        worker.wait(30)
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            for name in (queue, idle):
                with contextlib.suppress(Exception):  # best effort cleanup
                    channel.queue_delete(name)
        client.delete(COUNTER, *[f"celery-task-meta-{i}" for i in ids])
        shutil.rmtree(here, ignore_errors=True)


if __name__ == "__main__":
    main()
