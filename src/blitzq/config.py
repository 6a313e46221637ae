"""Settings without code: ``BLITZQ_*`` environment variables and ``[tool.blitzq]``.

A deployment configures blitzq from outside the application's code in two ways, and an
explicit argument always wins over both. The precedence, first that gives a value wins:

1. an explicit argument: ``Queue(namespace=...)``, a CLI option typed on the command line;
2. the environment: ``BLITZQ_REDIS_URL``, ``BLITZQ_NAMESPACE``, ... (:data:`SETTINGS`), and
   for every CLI option ``BLITZQ_<COMMAND>_<OPTION>`` (``BLITZQ_WORKER_CONCURRENCY``,
   ``BLITZQ_SCHEDULER_RUN_INTERVAL``): click's automatic variables;
3. the project file: the ``[tool.blitzq]`` table of ``$BLITZQ_CONFIG`` (a TOML file) if set,
   else of the project's ``pyproject.toml`` (:func:`search`): the nearest one from the
   current directory upwards, never above the project root (the first directory holding
   ``.git`` or a ``pyproject.toml`` of the current user or root), and never one another
   user owns or every user may write (refused with a warning). Its plain keys are the
   settings of :data:`SETTINGS`; a sub-table per command holds that command's options
   (``[tool.blitzq.worker]`` ``concurrency = 50``, ``[tool.blitzq.scheduler.run]``), with
   the option names of ``--help`` (``-`` or ``_``);
4. the built-in default.

``blitzq config show`` names the file used (and any refused), and prints every setting with
its value and where it came from. A key the table does not know is a
:class:`~blitzq.exceptions.ConfigurationError` naming the file, so a typo never silently
falls back to a default. Keep secrets (a password in a URL) in the environment, not in a
file under version control.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from . import _project
from .exceptions import ConfigurationError

T = TypeVar("T")

logger = logging.getLogger("blitzq.config")

#: Environment variable naming the TOML file whose ``[tool.blitzq]`` table is read.
CONFIG_ENV = "BLITZQ_CONFIG"


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of the plain ``[tool.blitzq]`` keys.

    Attributes:
        name: its key (``redis_url``).
        env: its environment variable (``BLITZQ_REDIS_URL``).
        help: what it sets.
        default: the value that applies when nothing sets it, or ``None`` when there is no
            such value (``unset`` then says what happens).
        unset: what an unset setting without a default means (``the embedded server``).
    """

    name: str
    env: str
    help: str
    default: str | None = None
    unset: str = ""


#: The settings every part of blitzq reads (the CLI's per-command options come on top).
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redis_url",
        "BLITZQ_REDIS_URL",
        "broker URL; unset: the embedded server",
        unset="the embedded server",
    ),
    Setting(
        "amqp_url",
        "BLITZQ_AMQP_URL",
        "RabbitMQ URL (the delivery transport)",
        unset="none: messages travel on the Redis server",
    ),
    Setting("namespace", "BLITZQ_NAMESPACE", "key namespace (default: blitzq)", "blitzq"),
    Setting("mode", "BLITZQ_MODE", "reliable or fast (default: reliable)", "reliable"),
    Setting(
        "data_dir",
        "BLITZQ_DATA_DIR",
        "the embedded server's directory (./.blitzq)",
        unset="./.blitzq of the current directory",
    ),
    Setting("log_level", "BLITZQ_LOG_LEVEL", "blitzq worker's log level (info)", "info"),
    Setting("log_format", "BLITZQ_LOG_FORMAT", "text or json (text)", "text"),
    Setting(
        "log_queue",
        "BLITZQ_LOG_QUEUE",
        "an embedded Queue moves the root logger's handlers behind a non-blocking queue",
        "false",
    ),
)
_BY_NAME = {s.name: s for s in SETTINGS}


def distrust(path: Path, uid: int | None = None) -> str | None:
    """Why the file at ``path`` must not configure this process, or ``None`` when it may
    (:func:`blitzq._project.distrust`: owned by ``uid`` or root, the link too, and not
    writable by every user).

    Args:
        path: the file (it exists).
        uid: the user trusted besides root (default: the effective uid of this process).
    """
    return _project.distrust(path, uid)


@dataclass(frozen=True, slots=True)
class Search:
    """What :func:`search` found.

    Attributes:
        file: the file whose ``[tool.blitzq]`` table applies, or ``None``.
        root: the project root the search stopped at (``None``: it reached ``/``); for
            ``$BLITZQ_CONFIG``, ``None``.
        refused: ``(path, why)`` of each ``pyproject.toml`` skipped as another user's
            (:func:`distrust`).
    """

    file: Path | None
    root: Path | None = None
    refused: tuple[tuple[Path, str], ...] = ()


_warned: set[Path] = set()


def search(start: Path | None = None, uid: int | None = None) -> Search:
    """Find the project file: ``$BLITZQ_CONFIG`` when set (the user named it: used whoever
    owns it), else the ``pyproject.toml`` of the project ``start`` (default: the current
    directory) is in.

    From ``start`` upwards, each directory's ``pyproject.toml`` is looked at: one that
    :func:`distrust` refuses is skipped, with a warning (logger ``blitzq.config``, once per
    file and process); the first other one ends the search, and it is the project file when
    it has a ``[tool.blitzq]`` table (none otherwise). A directory holding ``.git`` ends the
    search too: nothing above the project root is read. A ``pyproject.toml`` that
    :func:`blitzq._project.may_hold_table` shows cannot hold the table (most files: no
    ``blitzq`` key under ``tool``) is not parsed, so its TOML errors are not reported here.

    Args:
        start: the directory to search from.
        uid: the user trusted besides root (default: this process's effective uid).

    Raises:
        ConfigurationError: ``$BLITZQ_CONFIG`` names a file that does not exist, or the
            ``pyproject.toml`` found, which may hold a ``[tool.blitzq]`` table, is not valid
            TOML.
    """
    named = os.environ.get(CONFIG_ENV)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigurationError(f"{CONFIG_ENV}={named!r}: no such file")
        return Search(path.resolve())
    here = (start or Path.cwd()).resolve()
    found, root, skipped = _project.walk(str(here), uid)
    refused = tuple((Path(path), why) for path, why in skipped)
    for candidate, why in refused:
        if candidate not in _warned:
            _warned.add(candidate)
            logger.warning(
                "ignoring %s: it is %s; another local user could have set the broker "
                "URL or the code a worker imports in it (make it yours, or name it in "
                "%s to use it anyway)",
                candidate,
                why,
                CONFIG_ENV,
            )
    if found is None:
        return Search(None, Path(root) if root is not None else None, refused)
    path = Path(found)
    if not _project.may_hold_table(path.read_bytes()):
        return Search(None, Path(root or "/"), refused)  # certainly no table: not parsed
    return Search(
        path if "blitzq" in _read(path).get("tool", {}) else None, Path(root or "/"), refused
    )


def project_file(start: Path | None = None) -> Path | None:
    """The file whose ``[tool.blitzq]`` table applies (:func:`search`), else ``None``.

    Raises:
        ConfigurationError: ``$BLITZQ_CONFIG`` names a file that does not exist, or a
            ``pyproject.toml`` on the way is not valid TOML.
    """
    return search(start).file


_cache: dict[tuple[Path, float], dict[str, Any]] = {}


def _read(path: Path) -> dict[str, Any]:
    """The parsed TOML file (cached by path and modification time).

    Raises:
        ConfigurationError: it is not valid TOML.
    """
    key = (path, path.stat().st_mtime)
    if key not in _cache:
        import tomllib  # here: a process that reads no project file loads no TOML parser

        try:
            with path.open("rb") as f:
                _cache[key] = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"{path}: not valid TOML: {exc}") from exc
    return _cache[key]


def project_table(path: Path | None = None) -> dict[str, Any]:
    """The ``[tool.blitzq]`` table of :func:`project_file` (``{}`` when there is none).

    Raises:
        ConfigurationError: the table is not a table, or a plain key is not a setting of
            :data:`SETTINGS` (nor a sub-table of a command), or its value is not a string.
    """
    path = path or project_file()
    if path is None:
        return {}
    table = _read(path).get("tool", {}).get("blitzq", {})
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: [tool.blitzq] must be a table")
    for key, value in table.items():
        if isinstance(value, dict):
            continue  # a command's options, checked against the command (CLI)
        if key not in _BY_NAME:
            known = ", ".join(sorted(_BY_NAME))
            raise ConfigurationError(
                f"{path}: unknown setting {key!r} in [tool.blitzq] (settings: {known}; a "
                "command's options go in a sub-table such as [tool.blitzq.worker])"
            )
        if not isinstance(value, str):
            raise ConfigurationError(f"{path}: [tool.blitzq] {key} must be a string")
    return table


def value(name: str) -> str | None:
    """The value of setting ``name`` from the environment, else from the project file, else
    ``None`` (the caller's default applies).

    Raises:
        KeyError: ``name`` is not a setting of :data:`SETTINGS`.
        ConfigurationError: the project file is invalid, or ``BLITZQ_REDIS_URL`` is set to
            the empty string (refused, not read as unset: see docs/configuration.md).
    """
    setting = _BY_NAME[name]
    from_env = os.environ.get(setting.env)
    if from_env:
        return from_env
    if from_env == "" and name == "redis_url":
        # Read as unset, it would start an embedded server in the current directory: a
        # worker or producer silently on other data than the deployment meant.
        raise ConfigurationError(
            f"{setting.env} is set but empty: unset it (unset {setting.env}) to use the "
            "embedded server, or give a broker URL (redis://host:6379/0)"
        )
    found = project_table().get(name)
    return found if isinstance(found, str) and found else None


def data_dir() -> Path | None:
    """The ``data_dir`` setting as an absolute path, or ``None`` when nothing sets it.

    ``$BLITZQ_DATA_DIR`` is relative to the current directory; a relative ``data_dir`` of
    ``[tool.blitzq]`` is relative to the directory of the file that holds it, so every
    command run anywhere below the project meets the same embedded server.

    Raises:
        ConfigurationError: the project file is invalid.
    """
    from_env = os.environ.get(_BY_NAME["data_dir"].env)
    if from_env:
        return Path(from_env).expanduser().resolve()
    found = project_table().get("data_dir")
    if not found:
        return None
    where = project_file()
    base = where.parent if where is not None else Path.cwd()
    return (base / Path(found).expanduser()).resolve()


def source(name: str) -> str:
    """Where setting ``name``'s value comes from: ``"env BLITZQ_…"``, the project file's path
    with ``[tool.blitzq]``, or ``"default"``.

    Raises:
        KeyError: ``name`` is not a setting.
        ConfigurationError: the project file is invalid.
    """
    setting = _BY_NAME[name]
    if os.environ.get(setting.env):
        return f"env {setting.env}"
    if project_table().get(name):
        return f"{project_file()} [tool.blitzq]"
    return "default"


def check_mode(mode: Any) -> Any:
    """``mode`` itself when it is ``"reliable"`` or ``"fast"``.

    Raises:
        ConfigurationError: any other value.
    """
    if mode not in ("reliable", "fast"):
        raise ConfigurationError(f"mode must be 'reliable' or 'fast', got {mode!r}")
    return mode


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def check_bool(value: Any) -> bool:
    """``value`` as a bool: a ``bool`` itself, or (from the environment or a file) one of
    ``1 true yes on`` / ``0 false no off`` in any case.

    Raises:
        ConfigurationError: any other value.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigurationError(f"expected true or false (1/0, yes/no, on/off), got {value!r}")


def resolve(name: str, given: T | None, default: T, check: Callable[[Any], T]) -> T:
    """Setting ``name``: ``given`` when not ``None``, else its configured value (environment,
    then project file), else ``default``; passed through ``check``.

    Raises:
        ConfigurationError: ``check`` refused the value; for a configured one, the message
            starts with where it came from (:func:`source`).
    """
    if given is not None:
        return check(given)
    configured = value(name)
    try:
        return check(configured or default)
    except ConfigurationError as exc:
        if not configured:
            raise
        raise ConfigurationError(f"{source(name)}: {exc}") from None


def command_tables() -> dict[str, Any]:
    """The per-command sub-tables of ``[tool.blitzq]`` (nested as the commands are:
    ``{"worker": {...}, "scheduler": {"run": {...}}}``).

    Raises:
        ConfigurationError: the project file is invalid.
    """
    return {k: v for k, v in project_table().items() if isinstance(v, dict)}
