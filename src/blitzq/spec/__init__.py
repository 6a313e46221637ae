"""The machine-readable spec of blitzq: JSON for the errors, the configuration, the command
line and the message schemas, plus an ``llms.txt`` index (https://llmstxt.org), all generated
from the code.

``python -m blitzq.spec`` writes, under the docs directory (``--docs``, default ``docs``):

* ``spec/errors.json``: every exception class of :mod:`blitzq.exceptions` with its base,
  summary and the CLI's exit code for it;
* ``spec/config.json``: the settings of :data:`blitzq.config.SETTINGS`, every CLI option
  with its ``BLITZQ_*`` variable, and the ``Queue(...)``, ``Worker(...)`` and
  ``RetryPolicy(...)`` parameters (annotation, default, unit);
* ``spec/cli.json``: the commands, their arguments and options, and the exit codes;
* ``spec/messages.json``: msgspec's JSON schema of the Envelope (a positional MessagePack
  array on the wire), the stored task record, ``TaskRecord``, ``DeadLetter`` and
  ``Progress``;
* ``llms.txt``: a title, a summary, and links to the docs pages and to the files above;

and, in the source tree, ``src/blitzq/cli/_help.py``: what click prints for ``blitzq --help``
and a bare ``blitzq`` (:mod:`blitzq.spec.cli_help`), which ``blitzq --help`` serves without
importing click.

``--check`` writes nothing and exits 1 naming every file that is missing or differs from
what the code gives (0 when all are current). The output is deterministic: keys sorted, no
timestamps, nothing from the environment, no memory addresses. tests/unit/test_spec.py keeps
the committed files equal to it, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import cli_help
from .collect import constructors, doc_entries, errors, settings
from .commands import commands, exit_codes

#: The command that regenerates the committed spec (from the repository root).
REGENERATE = "PYTHONPATH=src python -m blitzq.spec"

#: Version of the spec's format (bumped when a file's structure changes).
SPEC_VERSION = 1

_SUMMARY = (
    "blitzq is an async-first distributed task queue for Python on Redis/Valkey Streams "
    "(with a fast list mode and a RabbitMQ transport): typed tasks, retries, dead letters, "
    "periodic tasks, workflows, rate limits, a CLI and a dashboard."
)


def _json(data: Any) -> str:
    """``data`` as the spec writes it: sorted keys, two-space indent, a final newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _messages() -> dict[str, Any]:
    import msgspec

    from ..dead_letters import DeadLetter
    from ..progress import Progress
    from ..records import RECORD_FIELDS, TaskRecord, _Stored
    from ..serialization import Envelope

    types = (Envelope, _Stored, TaskRecord, DeadLetter, Progress)
    _, definitions = msgspec.json.schema_components(types, ref_template="#/schemas/{name}")
    described = doc_entries(Envelope.__doc__, "Attributes")
    return {
        "encoding": "MessagePack (msgspec); the schemas describe the decoded values",
        "schemas": definitions,
        "envelope_fields": [
            {"position": i, "name": name, "doc": described.get(name, "")}
            for i, name in enumerate(Envelope.__struct_fields__)
        ],
        "record_fields": list(RECORD_FIELDS),
        "notes": {
            "Envelope": "a positional array: fields are only ever appended, with defaults, so "
            "messages of older producers keep decoding (docs/architecture.md)",
            "_Stored": "a task record as written to {ns}:t:<id>; a field left out is not "
            "written at all; TaskRecord is what queue.inspect() returns",
        },
    }


def _config() -> dict[str, Any]:
    options = [
        {"command": c["command"], **{k: p[k] for k in _OPTION_KEYS if k in p}}
        for c in commands()
        for p in c["params"]
        if p["kind"] == "option"
    ]
    return {
        "precedence": [
            "an explicit argument (Queue(...), Worker(...)) or an option typed on the command line",
            "the environment: the settings' variables, and BLITZQ_<COMMAND>_<OPTION> for "
            "every CLI option",
            "the [tool.blitzq] table of $BLITZQ_CONFIG or the nearest pyproject.toml",
            "the built-in default",
        ],
        "settings": settings(),
        "cli_options": options,
        "constructors": constructors(),
    }


_OPTION_KEYS = ("name", "env", "type", "default", "range", "choices", "multiple", "help")


def _doc_pages(docs: Path) -> list[tuple[str, str]]:
    """``(file name, title)`` of every ``*.md`` page in ``docs``, sorted by name."""
    pages = []
    for path in sorted(docs.glob("*.md")):
        title = path.stem
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                title = line[2:].strip()
                break
        pages.append((path.name, title))
    return pages


_SPEC_FILES = {
    "spec/errors.json": "every exception class: base, summary, CLI exit code",
    "spec/config.json": "settings, CLI options with their BLITZQ_* variables, Queue/Worker/"
    "RetryPolicy parameters with defaults and units",
    "spec/cli.json": "every command with its arguments, options and exit codes",
    "spec/messages.json": "JSON schemas of the message envelope, task records, dead letters "
    "and progress",
}


def _llms(docs: Path) -> str:
    lines = ["# blitzq", "", f"> {_SUMMARY}", ""]
    lines += [
        "The spec files are generated from the code by `python -m blitzq.spec` and kept in "
        "sync by a test; the pages are the user documentation.",
        "",
        "## Docs",
        "",
    ]
    lines += [f"- [{title}]({name})" for name, title in _doc_pages(docs)]
    lines += ["", "## Spec", ""]
    lines += [f"- [{name}]({name}): {what}" for name, what in _SPEC_FILES.items()]
    return "\n".join(lines) + "\n"


def generate(docs: Path) -> dict[str, str]:
    """The spec files for the docs directory ``docs``: relative path -> text.

    Args:
        docs: the docs directory (its ``*.md`` pages are listed in ``llms.txt``).
    """
    return {
        "spec/errors.json": _json({"spec_version": SPEC_VERSION, "errors": errors()}),
        "spec/config.json": _json({"spec_version": SPEC_VERSION, **_config()}),
        "spec/cli.json": _json(
            {"spec_version": SPEC_VERSION, "commands": commands(), "exit_codes": exit_codes()}
        ),
        "spec/messages.json": _json({"spec_version": SPEC_VERSION, **_messages()}),
        "llms.txt": _llms(docs),
    }


def stale(docs: Path) -> list[str]:
    """The spec files under ``docs`` that are missing or differ from :func:`generate`."""
    out = []
    for name, text in generate(docs).items():
        path = docs / name
        if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
            out.append(name)
    return out


def write(docs: Path) -> list[str]:
    """Write the spec files under ``docs``; return those that changed."""
    changed = stale(docs)
    for name, text in generate(docs).items():
        if name in changed:
            path = docs / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("utf-8"))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m blitzq.spec [--docs DIR] [--check]``; returns the exit code (0, or 1
    when ``--check`` finds stale files, or 2 for a docs directory that does not exist)."""
    parser = argparse.ArgumentParser(
        prog="python -m blitzq.spec", description="Generate blitzq's machine-readable spec."
    )
    parser.add_argument(
        "--docs", type=Path, default=Path("docs"), help="docs directory (default: docs)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    args = parser.parse_args(argv)
    docs: Path = args.docs
    if not docs.is_dir():
        print(f"error: --docs {docs}: no such directory", file=sys.stderr)
        return 2
    if args.check:
        old = [str(docs / name) for name in stale(docs)]
        if cli_help.stale():
            old.append(str(cli_help.HELP_MODULE))
        for name in old:
            print(f"stale: {name}", file=sys.stderr)
        if old:
            print(f"regenerate with: {REGENERATE}", file=sys.stderr)
        return 1 if old else 0
    for name in write(docs):
        print(f"wrote {docs / name}")
    if cli_help.write():
        print(f"wrote {cli_help.HELP_MODULE}")
    return 0


__all__ = ["REGENERATE", "SPEC_VERSION", "generate", "main", "stale", "write"]
