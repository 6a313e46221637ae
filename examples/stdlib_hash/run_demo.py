"""blitzq demo: hash every file of the Python standard library through a real worker.

What happens, step by step:

1. The Queue in ``tasks.py`` starts (or reuses) the embedded Valkey server in ``./.blitzq``.
2. A worker starts in its own process, exactly as you would start one yourself:
   ``python -m blitzq worker examples.stdlib_hash.tasks:queue -c 32``.
3. One ``hash_file`` task per file of the standard library is enqueued with ``enqueue_many``,
   plus a few planted files that fail: two that can never be read (a directory, a dangling
   symlink) and three that are deleted after they are enqueued. Those are retried twice and
   then dead-lettered.
4. The results come back (``handle.result()``; failures raise ``TaskFailed``) while a
   progress bar counts them; then a summary, the dead letters, and a spot check of the hashes.
5. The worker is stopped with SIGTERM, as a process manager would stop it.

Run it with ``make demo``. It exits 0 on success and non-zero, with a message, on any failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from blitzq import DeadLetter, TaskFailed, TaskHandle

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # import the tasks as `examples.stdlib_hash.tasks`, like the worker
from examples.stdlib_hash.tasks import NAMESPACE, hash_file, queue  # noqa: E402

CONCURRENCY = 32  # tasks the worker runs at once (sync tasks: threads)
BATCH = 500  # calls per enqueue_many round-trip
WAITERS = 64  # results awaited at once
STALL_SECONDS = 60.0  # give up when no task completes for this long
HASH_CHECKS = 25  # results re-hashed locally to check them

console = Console()


class DemoError(Exception):
    """The demo itself failed (not one of the planted task failures)."""


@dataclass
class Tally:
    """What came back from the worker."""

    results: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, tuple[TaskHandle[Any], TaskFailed]] = field(default_factory=dict)
    last_success_at: float = 0.0  # time.perf_counter() of the last successful result

    @property
    def done(self) -> int:
        """Tasks with a final result, succeeded or failed."""
        return len(self.results) + len(self.failures)


def stdlib_files() -> list[str]:
    """Every regular file under the standard library directory, site-packages excluded."""
    top = sysconfig.get_paths()["stdlib"]
    found = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages"))
        for name in sorted(files):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
    return found


def plant_unreadable(tmp: Path) -> list[str]:
    """Paths that exist but can never be read as a file (chmod 000 would not stop root)."""
    directory = tmp / "a-directory.py"
    directory.mkdir()
    dangling = tmp / "dangling-symlink.py"
    dangling.symlink_to(tmp / "no-such-target")
    return [str(directory), str(dangling)]


def plant_vanishing(tmp: Path, count: int = 3) -> list[str]:
    """Files that exist now; the demo deletes them right after enqueueing them."""
    paths = []
    for i in range(count):
        path = tmp / f"vanishing-{i}.txt"
        path.write_text("here now, gone before the worker gets to it\n")
        paths.append(str(path))
    return paths


def start_worker(log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``blitzq worker`` in its own process; its logs go to ``log_path``."""
    command = [
        sys.executable,
        "-m",
        "blitzq",
        "worker",
        "examples.stdlib_hash.tasks:queue",
        "-c",
        str(CONCURRENCY),
        "--log-level",
        "warning",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with open(log_path, "wb") as log:
        # A session of its own: Ctrl-C reaches only the demo, which then stops the worker.
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def log_tail(log_path: Path, lines: int = 15) -> str:
    """The last lines of the worker's log, for error messages."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def stop_worker(worker: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """Stop the worker gracefully with SIGTERM and return its exit code."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise DemoError(f"the worker did not stop within {timeout:.0f} s of SIGTERM") from None
    return worker.returncode


async def wait_for_worker(worker: subprocess.Popen[bytes], log_path: Path, before: int) -> None:
    """Return once the worker has registered itself with the broker."""
    deadline = time.monotonic() + 60
    while (await queue.stats())["workers"] <= before:
        if worker.poll() is not None:
            raise DemoError(
                f"the worker exited with code {worker.returncode}:\n{log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise DemoError(f"the worker did not register within 60 s:\n{log_tail(log_path)}")
        await asyncio.sleep(0.1)


async def enqueue_all(
    corpus: list[str], unreadable: list[str], vanishing: list[str]
) -> list[tuple[str, TaskHandle[Any]]]:
    """Enqueue one hash_file task per path; return (path, handle) pairs."""
    jobs: list[tuple[str, TaskHandle[Any]]] = []
    paths = corpus + unreadable
    for start in range(0, len(paths), BATCH):
        batch = paths[start : start + BATCH]
        handles = await hash_file.enqueue_many([(path,) for path in batch])
        jobs += zip(batch, handles, strict=True)
    # Due in one second: they are surely deleted by then (delay= goes through the schedule).
    handles = await hash_file.options(delay=1.0).enqueue_many([(path,) for path in vanishing])
    jobs += zip(vanishing, handles, strict=True)
    for path in vanishing:
        os.unlink(path)
    return jobs


async def collect(jobs: Iterator[tuple[str, TaskHandle[Any]]], tally: Tally) -> None:
    """Wait for results one at a time; several of these share one iterator."""
    for path, handle in jobs:
        try:
            tally.results.append(await handle.result())
            tally.last_success_at = time.perf_counter()
        except TaskFailed as exc:  # the task ended failed or dead-lettered
            tally.failures[path] = (handle, exc)


async def wait_for_results(
    jobs: list[tuple[str, TaskHandle[Any]]], worker: subprocess.Popen[bytes], log_path: Path
) -> Tally:
    """Collect every result with WAITERS concurrent waiters, showing a progress bar."""
    tally = Tally()
    shared = iter(jobs)
    waiters = {asyncio.create_task(collect(shared, tally)) for _ in range(WAITERS)}
    columns = (*Progress.get_default_columns()[:-1], MofNCompleteColumn(), TimeElapsedColumn())
    last_done, last_change = 0, time.monotonic()
    try:
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("hashing", total=len(jobs))
            while waiters:
                done, waiters = await asyncio.wait(waiters, timeout=0.1)
                for task in done:
                    task.result()  # re-raises anything unexpected from a waiter
                failed = f" ([red]{len(tally.failures)} failed[/])" if tally.failures else ""
                progress.update(bar, completed=tally.done, description=f"hashing{failed}")
                if tally.done != last_done:
                    last_done, last_change = tally.done, time.monotonic()
                if waiters and worker.poll() is not None:
                    problem = f"the worker exited with code {worker.returncode}"
                elif time.monotonic() - last_change > STALL_SECONDS:
                    problem = f"no task completed for {STALL_SECONDS:.0f} s"
                else:
                    continue
                raise DemoError(f"{problem} ({tally.done}/{len(jobs)} done):\n{log_tail(log_path)}")
    finally:
        for task in waiters:
            task.cancel()
    return tally


def check_hashes(results: list[dict[str, Any]]) -> int:
    """Re-hash a random sample of files locally; return how many matched."""
    sample = random.sample(results, min(HASH_CHECKS, len(results)))
    matched = 0
    for result in sample:
        with open(result["path"], "rb") as f:
            matched += hashlib.sha256(f.read()).hexdigest() == result["sha256"]
    return matched


def show_summary(rows: list[tuple[str, str]]) -> None:
    """Print the summary table."""
    table = Table(title="blitzq demo: SHA-256 of the standard library", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def show_dead_letters(letters: list[DeadLetter], attempts: dict[str, int], tmp: Path) -> None:
    """Print this run's dead letters (paths shown relative to the demo's temp dir)."""
    table = Table(title="dead letters (queue.dead_letters())")
    for column in ("file", "attempts", "reason", "error"):
        table.add_column(column)
    for letter in letters:
        path = letter.args[0] if letter.args else "?"
        table.add_row(
            os.path.basename(path),
            str(attempts.get(letter.id, "?")),
            letter.reason,
            letter.error.replace(f"{tmp}/", ""),
        )
    console.print(table)


async def run(tmp: Path) -> None:
    """The whole demo; raises DemoError on any failure of the demo itself."""
    console.print(f"[bold]broker[/]: embedded Valkey at {queue.url}")
    corpus = stdlib_files()
    unreadable, vanishing = plant_unreadable(tmp), plant_vanishing(tmp)
    planted = unreadable + vanishing
    console.print(
        f"[bold]corpus[/]: {len(corpus)} files under {sysconfig.get_paths()['stdlib']}"
        f" + {len(planted)} planted to fail"
    )

    # Start clean: drop a previous run's dead letters and what an interrupted run left waiting.
    dead = await queue.purge_dead_letters()
    waiting = await queue.purge_queue()
    if dead or waiting:
        console.print(
            f"removed {dead} dead letter(s) and {waiting} waiting task(s) of a previous run"
        )

    log_path = Path(os.environ["BLITZQ_DATA_DIR"]) / "demo-worker.log"
    workers_before = (await queue.stats())["workers"]
    worker = start_worker(log_path)
    ok = False
    try:
        await wait_for_worker(worker, log_path, workers_before)
        console.print(
            f"[bold]worker[/]: pid {worker.pid}, {CONCURRENCY} threads, log in {log_path}"
        )

        started = time.perf_counter()
        jobs = await enqueue_all(corpus, unreadable, vanishing)
        console.print(f"enqueued {len(jobs)} tasks in {time.perf_counter() - started:.2f} s")
        tally = await wait_for_results(jobs, worker, log_path)
        elapsed = time.perf_counter() - started
        corpus_elapsed = tally.last_success_at - started
        ok = True
    finally:
        code = stop_worker(worker)
    if ok and code != 0:
        raise DemoError(f"the worker exited with code {code} after SIGTERM:\n{log_tail(log_path)}")

    # Every planted file must have failed and been dead-lettered after its retries.
    ours = {handle.id for _, handle in jobs}
    letters = [d for d in await queue.dead_letters(limit=1000) if d.id in ours]
    attempts: dict[str, int] = {}
    for _, (handle, _exc) in tally.failures.items():
        record = await handle.status()
        attempts[handle.id] = record.attempts if record else 0
    missing = [p for p in planted if p not in tally.failures]
    if missing:
        raise DemoError(f"planted files that did not fail: {missing}")
    if len(letters) != len(tally.failures):
        raise DemoError(f"{len(tally.failures)} tasks failed but {len(letters)} were dead-lettered")
    matched = check_hashes(tally.results)
    if matched != min(HASH_CHECKS, len(tally.results)):
        raise DemoError(
            f"only {matched} of {HASH_CHECKS} re-hashed files match the worker's SHA-256"
        )

    total_bytes = sum(r["bytes"] for r in tally.results)
    show_summary(
        [
            ("files", f"{len(jobs):,} ({len(corpus):,} stdlib + {len(planted)} planted)"),
            ("bytes hashed", f"{total_bytes:,} ({total_bytes / 1e6:,.1f} MB)"),
            ("lines counted", f"{sum(r['lines'] for r in tally.results):,}"),
            ("time, stdlib files", f"{corpus_elapsed:.2f} s"),
            ("time, all (with the retries)", f"{elapsed:.2f} s"),
            ("throughput, stdlib files", f"{len(corpus) / corpus_elapsed:,.0f} tasks/s"),
            ("succeeded", f"{len(tally.results):,}"),
            ("failed (TaskFailed)", f"{len(tally.failures)}"),
            (
                "dead-lettered",
                f"{len(letters)} (dead_letter_count: {await queue.dead_letter_count()})",
            ),
            (
                "retries seen (of the failed tasks)",
                f"{sum(max(0, n - 1) for n in attempts.values())}",
            ),
            (
                "SHA-256 spot check",
                f"{matched}/{min(HASH_CHECKS, len(tally.results))} match hashlib",
            ),
        ]
    )
    show_dead_letters(letters, attempts, tmp)
    console.print(
        "Worker stopped with SIGTERM. The dead letters stay until the next run; list them with\n"
        f"  [bold].venv/bin/blitzq --namespace {NAMESPACE} dead-letter list[/]\n"
        "The embedded Valkey keeps running (like any database) for the next run; stop it with\n"
        "  [bold].venv/bin/blitzq server stop[/]"
    )
    await queue.close()


def main() -> int:
    """Run the demo; return the process exit code."""
    os.environ.pop("BLITZQ_REDIS_URL", None)  # always the embedded server, never an inherited URL
    os.environ.setdefault("BLITZQ_DATA_DIR", str(ROOT / ".blitzq"))  # one server from any cwd
    with tempfile.TemporaryDirectory(prefix="blitzq-demo-") as tmp:
        try:
            asyncio.run(run(Path(tmp)))
        except DemoError as exc:
            console.print(f"[bold red]demo failed:[/] {exc}")
            return 1
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
