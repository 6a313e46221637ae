"""``delegate()``: a client's method offered as its owner's, of the same kind and signature."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

from blitzq.client.delegate import delegate


class Client:
    def __init__(self) -> None:
        self.closed = False

    def plain(self, a: int, /, b: int = 2, *, c: int = 3) -> tuple[int, int, int]:
        """Plain doc."""
        return a, b, c

    async def coro(self, a: int, *args: int, **kwargs: int) -> tuple[object, ...]:
        """Coroutine doc."""
        return a, args, kwargs

    async def gen(self, n: int) -> AsyncIterator[int]:
        """Generator doc."""
        try:
            for i in range(n):
                yield i
        finally:
            self.closed = True


class Owner:
    def __init__(self) -> None:
        self._client = Client()

    plain = delegate("_client", Client.plain)
    coro = delegate("_client", Client.coro)
    gen = delegate("_client", Client.gen)


def test_kinds_names_docstrings_and_signatures_are_the_clients() -> None:
    assert not inspect.iscoroutinefunction(Owner.plain)
    assert inspect.iscoroutinefunction(Owner.coro)
    assert inspect.isasyncgenfunction(Owner.gen)
    for name in ("plain", "coro", "gen"):
        made, original = getattr(Owner, name), getattr(Client, name)
        assert made.__name__ == name
        assert made.__doc__ == original.__doc__
        assert inspect.signature(made) == inspect.signature(original)


def test_calls_run_on_the_owners_client() -> None:
    owner = Owner()
    assert owner.plain(1, c=5) == (1, 2, 5)
    assert asyncio.run(owner.coro(1, 2, x=3)) == (1, (2,), {"x": 3})


def test_a_generator_closed_early_closes_the_clients() -> None:
    owner = Owner()

    async def first() -> int:
        items = owner.gen(10)
        value = await anext(items)
        await items.aclose()  # type: ignore[attr-defined]
        return value

    assert asyncio.run(first()) == 0
    assert owner._client.closed
