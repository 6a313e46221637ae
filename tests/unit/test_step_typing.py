"""``task.s()`` and ``task.si()`` are typed against the task's function as ``enqueue`` is
(issue 27, point 6): mypy, run as a user runs it on their own module, accepts the calls a
workflow makes and reports the ones that do not fit the function."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

USER_MODULE = textwrap.dedent(
    """
    from blitzq import Queue
    from blitzq.workflow import chord

    queue = Queue("typing", redis_url="redis://127.0.0.1:6379")


    @queue.task()
    async def add(a: int, b: int) -> int:
        return a + b


    @queue.task()
    def total(results: list[int], bonus: int = 0) -> int:
        return sum(results) + bonus


    async def fine() -> None:
        await add.enqueue(1, 2)
        first = add.s(1, 2)               # a first step: all the arguments
        then = add.s(10)                  # chained: the previous result is `a`
        by_name = add.s(b=10)
        fixed = add.si(1, 2)
        callback = total.s(bonus=1000)    # a chord's callback: the results are `results`
        chord([first, then, by_name, fixed], callback)


    async def wrong() -> None:
        await add.enqueue("x", 2)  # wrong (enqueue's own check, for comparison)
        add.s("x", 2)  # wrong
        add.s(1, 2, 3)  # wrong
        add.s(c=1)  # wrong
        add.si(1)  # wrong
        add.si(1, "y")  # wrong
        total.s(bonus="many")  # wrong
    """
)


@pytest.mark.timeout(300)
def test_steps_are_checked_against_the_function_like_enqueue(tmp_path: Path) -> None:
    module = tmp_path / "user_flows.py"
    module.write_text(USER_MODULE)
    out, err, _status = mypy_api.run(
        [
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports=silent",
            str(module),
        ]
    )
    errors = sorted(int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line)
    assert not err, err
    wrong = [n for n, line in enumerate(USER_MODULE.splitlines(), 1) if "# wrong" in line]
    # Exactly the wrong calls, each once (a mismatch on both overloads is one error).
    assert len(wrong) == 7
    assert errors == wrong, out
