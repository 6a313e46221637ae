"""The one masking function (issue 28, item 1): every kind of broker URL, its password
masked in what ``mask_url`` shows and nowhere left in what ``redact`` returns."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from blitzq.redaction import mask_url, redact
from tests.parsing import parse_source

pytestmark = pytest.mark.timeout(30)

SECRET = "hunter2"


def leaks(text: str, *secrets: str) -> bool:
    """Whether ``text`` holds any of ``secrets`` (default: the pieces of ``hunter2`` a
    malformed URL may be cut into)."""
    return any(s in text for s in secrets or ("hunter", "ter2"))


# (url, its masked form): every scheme blitzq reads, several hosts, query passwords and
# malformed URLs a parser would cut elsewhere.
CASES = [
    ("redis://:hunter2@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    (
        "redis://user:hunter2@host:6379/0?socket_timeout=abc",
        "redis://user:***@host:6379/0?socket_timeout=abc",
    ),
    ("redis://hunter2@host", "redis://***@host"),
    ("rediss://default:hunter2@host:6380/1", "rediss://default:***@host:6380/1"),
    ("valkey://:hunter2@host", "valkey://:***@host"),
    ("unix://:hunter2@/tmp/r.sock?db=1", "unix://:***@/tmp/r.sock?db=1"),
    ("unix:///tmp/r.sock?db=1&password=hunter2", "unix:///tmp/r.sock?db=1&password=***"),
    ("redis://host/0?password=hunter2&username=u", "redis://host/0?password=***&username=u"),
    ("redis://host/0?ssl_password=hunter2", "redis://host/0?ssl_password=***"),
    ("redis://host/0?pass%77ord=hunter2", "redis://host/0?pass%77ord=***"),
    ("redis://host/0?token=hunter2;db=2", "redis://host/0?token=***;db=2"),
    ("redis+cluster://:hunter2@n1:7000/0", "redis+cluster://:***@n1:7000/0"),
    (
        "rediss+cluster://u:hunter2@n1:7000/0?layout=spread",
        "rediss+cluster://u:***@n1:7000/0?layout=spread",
    ),
    (
        "redis+sentinel://:hunter2@s1:26379,s2:26380/m/2?sentinel_password=hunter2&timeout=2",
        "redis+sentinel://:***@s1:26379,s2:26380/m/2?sentinel_password=***&timeout=2",
    ),
    ("amqp://guest:hunter2@rabbit:5672/%2F", "amqp://guest:***@rabbit:5672/%2F"),
    ("amqps://guest:hunter2@rabbit/vh?heartbeat=10", "amqps://guest:***@rabbit/vh?heartbeat=10"),
    (
        "amqp://u:hunter2@h1:5672//;amqp://u:hunter2@h2:5672//",
        "amqp://u:***@h1:5672//;amqp://u:***@h2:5672//",
    ),
    ("redis://:hun/ter2@host/0", "redis://:***@host/0"),  # a "/" in the password
    ("redis://:hun?ter2@host/0?db=1", "redis://:***@host/0?db=1"),  # a "?" in it
    ("redis://:hun#ter2@host", "redis://:***@host"),  # a "#" in it
    ("redis://:hun@ter2@host", "redis://:***@host"),  # an "@" in it
    ("http://:hunter2@host:6379/0", "http://:***@host:6379/0"),  # an unsupported scheme
    ("user:hunter2@host:6379", "user:***@host:6379"),  # no scheme at all
]


@pytest.mark.parametrize(("url", "masked"), CASES)
def test_mask_url_masks_every_password(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert not leaks(masked)
    assert mask_url(masked) == masked  # masking twice changes nothing


@pytest.mark.parametrize(
    "url",
    ["redis://host:6379/0", "unix:///tmp/r.sock", "redis://host/0?client_name=a@b", "memory://x"],
)
def test_a_url_without_a_secret_is_shown_as_it_is(url: str) -> None:
    assert mask_url(url) == url


@pytest.mark.parametrize(("url", "masked"), CASES)
def test_redact_masks_the_urls_in_a_message(url: str, masked: str) -> None:
    text = f"Error: bad broker URL {url!r}: something"
    shown = redact(text, url)
    assert not leaks(shown), shown
    if "://" in url:
        assert "***" in shown


def test_redact_removes_a_piece_of_a_malformed_password_a_library_quoted() -> None:
    url = "redis+sentinel://:longpass/second@s1:26379/m"
    # what a parser cutting at "/" would complain about
    message = "sentinel address ':longpass' has no host; path '/second@s1:26379/m'"
    shown = redact(message, url)
    assert not leaks(shown, "longpass", "second"), shown


@pytest.mark.parametrize("password", ["wrong", "guest"])
def test_a_url_in_a_message_shows_its_user_name_even_when_it_is_the_password(
    password: str,
) -> None:
    # One rule for every refusal: RabbitMQ's 403 (guest:wrong) and 530 (guest:guest, an
    # unknown vhost) both show guest:***; the password is still masked outside the URL.
    url = f"amqp://guest:{password}@127.0.0.1:5672/novhost"
    text = f"RabbitMQ closed the connection (connecting to {url}): 530 ({password})"
    shown = redact(text, url)
    assert shown == (
        "RabbitMQ closed the connection (connecting to amqp://guest:***@127.0.0.1:5672/novhost):"
        " 530 (***)"
    )


def test_redact_leaves_text_without_urls_alone() -> None:
    text = "queue default: 3 waiting, password policy unchanged"
    assert redact(text) == text
    assert redact(text, None, "redis://host/0") == text


# ------------------------------------------------------------------ the sites, statically
SRC = Path(__file__).resolve().parents[2] / "src" / "blitzq"
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
OUTPUT_CALLS = {"echo", "secho", "print", "emit_json", "repr", "str"}
#: (module, kind) of the places allowed to show a URL as it is, with the reason.
ALLOWED = {
    ("cli/server.py", "echo"): "the embedded server's unix:// URL, made by blitzq: no password",
}


def _names_a_url(node: ast.expr) -> bool:
    """An expression that is a URL by its name (``url``, ``redis_url``, ``self.url``)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.lower().endswith("url")


def _unmasked(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, kind)`` of each place ``tree`` puts a URL variable into text itself (not
    through ``mask_url``/``redact``): an f-string, a ``%`` or ``.format`` argument, a log
    call's argument, an output or ``repr``/``str`` call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue) and _names_a_url(node.value):
            yield node.lineno, "f-string"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
            if isinstance(node.left, ast.Constant) and any(_names_a_url(v) for v in values):
                yield node.lineno, "%"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            args = [*node.args, *(k.value for k in node.keywords)]
            if not any(_names_a_url(a) for a in args):
                continue
            if isinstance(func, ast.Attribute) and name in LOG_METHODS:
                yield node.lineno, "log"
            elif name == "format" or name in OUTPUT_CALLS:
                yield node.lineno, name


def test_no_module_puts_a_url_into_text_unmasked() -> None:
    """Every site found (errors, logs, reprs, output) masks; a new one that does not fails
    here with its place."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for line, kind in _unmasked(parse_source(path.read_text(), str(path))):
            if (module, kind) not in ALLOWED:
                found.append(f"{module}:{line} ({kind})")
    assert not found, "a URL reaches text without mask_url/redact: " + ", ".join(found)


def test_the_static_check_sees_each_kind_of_site() -> None:
    source = textwrap.dedent(
        """
        raise ValueError(f"bad {url!r}")
        logger.warning("cannot reach %s", self.redis_url)
        text = "at %s" % queue.url
        print(amqp_url)
        shown = "{}".format(url)
        fine = f"bad {mask_url(url)!r}"
        """
    )
    kinds = [kind for _line, kind in _unmasked(parse_source(source))]
    assert sorted(kinds) == ["%", "f-string", "format", "log", "print"]
