"""Redis side of unique tasks and locks (mixed into :class:`~.common.RedisBroker`).

- Unique keys ``{ns}:u:<task>:<key>`` hold the id of the task that claimed them, with a TTL.
  :meth:`RedisControl.claim_unique` claims a batch in one script run per 1000 keys; the
  completion op ``unique_release`` (``lua/complete.lua``) deletes a key only while it holds
  the given id.
- Locks ``{ns}:lk:<key>`` are sorted sets of holder -> lease expiry (server time).
  :meth:`RedisControl.acquire_lock` takes a place, :meth:`RedisControl.renew_locks` renews
  leases, and the completion op ``lock_release`` removes a holder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Sequence
from importlib import resources
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...exceptions import BrokerError
from ...limits import CHUNK_ITEMS
from .keys import Keys

P = ParamSpec("P")
R = TypeVar("R")


def _translated(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Turn redis-py errors raised by ``fn`` into :class:`BrokerError`."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (RedisError, OSError) as exc:
            transient = isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError))
            raise BrokerError(f"{type(exc).__name__}: {exc}", transient) from exc

    return wrapper


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisControl:
    """Unique-key and lock operations of the Redis brokers (a mixin; needs ``client``, ``keys``)."""

    client: Any
    keys: Keys

    def _control_script(self, name: str) -> Any:
        scripts: dict[str, Any] = self.__dict__.setdefault("_control_scripts", {})
        script = scripts.get(name)
        if script is None:
            source = resources.files(__package__).joinpath("lua", name).read_text()
            script = scripts[name] = self.client.register_script(source)
        return script

    @_translated
    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """Claim ``(key, task_id, ttl seconds)`` unique keys, each atomically, in one script
        run per :data:`~blitzq.limits.CHUNK_ITEMS` keys.

        Returns:
            Per item, ``None`` when this call claimed the key, else the id of the task that
            already holds it.
        """
        out: list[str | None] = []
        script = self._control_script("unique_claim.lua")
        for start in range(0, len(items), CHUNK_ITEMS):  # one short script call per chunk
            chunk = items[start : start + CHUNK_ITEMS]
            keys = [self.keys.unique(key) for key, _, _ in chunk]
            args: list[Any] = [self.keys.prefix]
            for _, task_id, ttl in chunk:
                args += (task_id, max(1, int(ttl * 1000)))
            answer = await script(keys=keys, args=args)
            out += [None if not v else _text(v) for v in answer]
        return out

    @_translated
    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """Take a place of lock ``key`` for ``holder`` for ``lease`` seconds (server time).

        Returns:
            ``0.0`` when the place is taken, else seconds until the earliest lease expires.
        """
        answer = await self._control_script("lock_acquire.lua")(
            keys=[self.keys.lock(key)], args=[holder, int(limit), repr(float(lease))]
        )
        return float(_text(answer))

    @_translated
    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """Renew ``(key, holder, lease seconds)`` lock places still held; return how many."""
        if not items:
            return 0
        keys = [self.keys.lock(key) for key, _, _ in items]
        args: list[Any] = []
        for _, holder, lease in items:
            args += (holder, repr(float(lease)))
        return int(await self._control_script("lock_renew.lua")(keys=keys, args=args))
