"""Checks of configuration values at the edge (``Queue``, ``Worker``, call options).

Every numeric option is a real number: ``bool`` is refused (``True`` is not "1 second"), as
are NaN and the infinities, and every duration is at most :data:`~blitzq.limits.MAX_SECONDS`
(ten years). A duration may also be given as a :class:`datetime.timedelta`: it is read as its
``total_seconds()`` and checked as that number (a negative one gets the same error as a
negative number). Each check raises :class:`~blitzq.exceptions.ConfigurationError` naming the
option and the value, so a bad value never reaches a background loop (see
docs/configuration.md, "Validation").
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import logging
import math
from collections import Counter
from typing import Any
from urllib.parse import parse_qsl

from .exceptions import ConfigurationError
from .limits import MAX_SECONDS


def seconds(
    name: str,
    value: Any,
    *,
    minimum: float = 0.0,
    strict: bool = True,
    maximum: float = MAX_SECONDS,
) -> float:
    """Return ``value`` as a float number of seconds.

    Args:
        name: the option's name, used in the error message.
        value: the value given (``int``, ``float`` or ``timedelta``; not ``bool``).
        minimum: smallest allowed value (seconds).
        strict: ``minimum`` itself is refused (``> minimum``) when true, allowed when false.
        maximum: largest allowed value (seconds; default ten years).

    Raises:
        ConfigurationError: not a real number, a bool, NaN, an infinity, or out of range.
    """
    given = repr(value)
    if isinstance(value, _dt.timedelta):
        value = value.total_seconds()
        given = f"a timedelta of {_show(value)} s"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{name} must be a number of seconds (or a timedelta), got {value!r}"
        )
    bad = not math.isfinite(value) or value > maximum
    bad = bad or (value <= minimum if strict else value < minimum)
    if bad:
        low = f"> {_show(minimum)}" if strict else f">= {_show(minimum)}"
        high = "10 years" if maximum == MAX_SECONDS else f"{_show(maximum)} s"
        raise ConfigurationError(
            f"{name} must be a finite number of seconds {low} and at most {high} "
            f"({_show(maximum)} s), got {given}"
            if maximum == MAX_SECONDS
            else f"{name} must be a finite number of seconds {low} and at most {high}, got {given}"
        )
    return float(value)


def wait(value: Any, name: str = "timeout") -> float | None:
    """A wait's ``timeout`` argument (``result``, ``get_result``, ``get_results``,
    ``watch_progress``, a workflow's ``get``, their ``*_sync`` forms): ``None`` (no limit) or
    a finite number of seconds ``>= 0`` (0 looks once; or a ``timedelta``), at most ten years.

    Raises:
        ConfigurationError: a bool, NaN, an infinity, a negative number or anything else,
            before anything is waited for (instead of a ``ResultTimeout`` at once).
    """
    return None if value is None else seconds(name, value, strict=False)


def _show(number: float) -> str:
    """``number`` without a needless ``.0`` or exponent (``315360000``, ``0.5``)."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def integer(name: str, value: Any, *, minimum: int, unit: str = "") -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) of at least ``minimum``.

    Args:
        name: the option's name, used in the error message.
        value: the value given.
        minimum: smallest allowed value.
        unit: unit named in the message (``"bytes"``), or empty.

    Raises:
        ConfigurationError: not an int, a bool, or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        suffix = f" {unit}" if unit else ""
        raise ConfigurationError(f"{name} must be an int >= {minimum}{suffix}, got {value!r}")
    return value


#: Multipliers of the units :func:`byte_size` accepts (case-insensitive): decimal kB/MB/GB,
#: binary KiB/MiB/GiB, and bare K/M/G meaning the binary ones.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
}


def byte_size(name: str, value: Any, *, minimum: int = 1) -> int:
    """Return a size in bytes: an ``int`` of bytes, or a string with a unit (``"512MiB"``,
    ``"200MB"``, ``"1.5G"``; bare K/M/G are binary, kB/MB/GB decimal, case-insensitive).

    Args:
        name: the option's name, used in the error message.
        value: the value given.
        minimum: smallest allowed number of bytes.

    Raises:
        ConfigurationError: a bool, an unknown unit, not a finite number, or below ``minimum``.
    """
    if isinstance(value, str):
        number, unit = value.strip(), ""
        while number and number[-1].isalpha():
            number, unit = number[:-1], number[-1] + unit
        factor = _SIZE_UNITS.get(unit.lower())
        try:
            amount = float(number.strip()) if factor is not None else math.nan
        except ValueError:
            amount = math.nan
        if not math.isfinite(amount) or factor is None:
            raise ConfigurationError(
                f"{name} must be a size such as 512MiB, 200MB or 1G (units B, K, KiB, kB, M, "
                f"MiB, MB, G, GiB, GB), got {value!r}"
            )
        value = int(amount * factor)
    return integer(name, value, minimum=minimum, unit="bytes")


def flag(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool``.

    Raises:
        ConfigurationError: anything else (``"no"`` or ``0`` would silently mean something).
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


def text(name: str, value: Any, *, optional: bool = True) -> str | None:
    """Return ``value`` if it is a non-empty ``str`` (or ``None`` when ``optional``).

    Raises:
        ConfigurationError: a value of another type, or an empty string.
    """
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{name} must be a non-empty str, got {value!r}")
    return value


#: Level names :func:`log_level` accepts (case-insensitive), as ``--log-level`` does.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def log_level(name: str, value: Any) -> int:
    """Return ``value`` as a :mod:`logging` level number.

    Args:
        name: the option's name, used in the error message.
        value: a level name of :data:`LOG_LEVELS` (case-insensitive: ``"warning"``,
            ``"ERROR"``) or a level number of at least 1 (``logging.WARNING``, a custom one).

    Raises:
        ConfigurationError: another name, a number below 1, a bool or another type.
    """
    if isinstance(value, str) and value.lower() in LOG_LEVELS:
        return int(getattr(logging, value.upper()))
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigurationError(
        f"{name} must be a log level ({', '.join(LOG_LEVELS)}) or a level number >= 1, "
        f"got {value!r}"
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address, bracketed or not, or ``localhost``) names this machine
    only: ``127.0.0.0/8``, ``::1``, ``localhost``. A host name other than ``localhost`` is not
    resolved and counts as not loopback."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def repeated_option(url: str) -> tuple[str, int] | None:
    """The first query option of ``url`` given more than once, and how many times.

    A URL option given twice (``?pack=5&pack=7``, ``?socket_timeout=1&socket_timeout=5``)
    has no meaning blitzq could pick silently (redis-py reads the first, other parsers the
    last): every URL parser refuses it, naming the option. Names are compared decoded
    (``pa%63k`` is ``pack``).

    Args:
        url: one URL (a list of URLs separated by ``;`` is checked piece by piece by the
            caller).

    Returns:
        ``(name, count)``, or ``None`` when each option is given at most once.
    """
    query = url.partition("?")[2].partition("#")[0]
    if not query:
        return None
    counts = Counter(name for name, _ in parse_qsl(query, keep_blank_values=True))
    for name, count in counts.items():
        if count > 1:
            return name, count
    return None


def check_single_options(url: str, label: str, shown: str) -> None:
    """Refuse ``url`` when one of its query options is given more than once
    (:func:`repeated_option`).

    Args:
        url: one URL.
        label: what the URL is, for the message (``"broker URL"``, ``"amqp_url"``).
        shown: the URL as the message shows it (its passwords masked).

    Raises:
        ConfigurationError: an option given twice or more; the message names it.
    """
    found = repeated_option(url)
    if found is not None:
        name, count = found
        raise ConfigurationError(
            f"bad {label} {shown!r}: the option {name!r} is given {count} times; give it once"
        )
