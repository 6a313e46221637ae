"""Passwords out of text: the one place a broker URL is masked before it reaches a message.

Every URL blitzq shows -- in an exception, a log line, a repr, ``blitzq config show``, the
dashboard, the health endpoints, the CLI's output -- goes through :func:`mask_url` (a URL
known as such) or :func:`redact` (free text that may hold URLs, e.g. a library's error
message). What is masked:

- the userinfo's password (``redis://user:pw@host`` → ``redis://user:***@host``); a bare
  userinfo is a password to redis-py (``redis://pw@host`` → ``redis://***@host``); the
  user name stays shown in a URL even where it is also the password (``guest:guest`` →
  ``guest:***``, as ``guest:wrong``), while :func:`redact` masks the password elsewhere;
- the value of every query parameter whose name holds ``pass``, ``pwd``, ``secret``,
  ``token`` or ``credential`` (``?password=``, ``?sentinel_password=``, ``?ssl_password=``);
- in each of several URLs in one string (``amqp://u:p@h1//;amqp://u:p@h2//``).

A malformed URL is masked conservatively: a password holding ``/``, ``#`` or ``?`` is
masked whole (the userinfo runs to the last ``@`` before the query), never cut where a URL
parser would cut it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote, unquote_plus

__all__ = ["MASK", "mask_url", "redact"]

#: What a secret is replaced with.
MASK = "***"

#: Words that make a query parameter's value a secret (lower case, after unquoting).
SECRET_WORDS = ("pass", "pwd", "secret", "token", "credential")

# A URL in free text: a scheme, "://", then anything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]*")
# Where a second URL starts in a string of several (after ";", "," or white space).
_NEXT_URL = re.compile(r"(?<=[;,\s])(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
# Characters a URL parser may cut a malformed secret at: its pieces are secrets too.
_CUTS = re.compile(r"[/?#@:;&=,\s]+")
_QUERY_SEPARATORS = re.compile(r"([&;])")


def _userinfo_end(rest: str) -> int:
    """Index of the ``@`` that ends the userinfo in ``rest`` (a URL after ``://``), -1 if
    none: the last ``@`` before the first ``?``; else, when the password holds a ``?``,
    the last ``@`` after it that comes before any ``=`` or ``&`` (a query's)."""
    question = rest.find("?")
    head = rest if question < 0 else rest[:question]
    at = head.rfind("@")
    if at >= 0 or question < 0:
        return at
    tail = rest[question + 1 :]
    stops = [i for i in (tail.find("="), tail.find("&")) if i >= 0]
    at = tail.rfind("@", 0, min(stops) if stops else len(tail))
    return question + 1 + at if at >= 0 else -1


def _is_secret_key(key: str) -> bool:
    name = unquote_plus(key).lower()
    return any(word in name for word in SECRET_WORDS)


def _split(url: str) -> tuple[str, str | None, str, str, str]:
    """``(scheme + "://", userinfo or None, host and path, "?" or "", query)`` of one URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = _userinfo_end(rest)
    userinfo = rest[:end] if end >= 0 else None
    rest = rest[end + 1 :] if end >= 0 else rest
    where, question, query = rest.partition("?")
    return scheme + sep, userinfo, where, question, query


def _mask_one(url: str) -> str:
    start, userinfo, where, question, query = _split(url)
    shown = ""
    if userinfo is not None:
        user, colon, _password = userinfo.partition(":")
        shown = f"{user}:{MASK}@" if colon else f"{MASK}@"
    parts = _QUERY_SEPARATORS.split(query)
    for i in range(0, len(parts), 2):  # odd indexes hold the separators
        key, equals, _value = parts[i].partition("=")
        if equals and _is_secret_key(key):
            parts[i] = f"{key}={MASK}"
    return f"{start}{shown}{where}{question}{''.join(parts)}"


def mask_url(url: str) -> str:
    """``url`` with its passwords replaced by ``***`` (see the module docstring); several
    URLs in one string are masked each.

    Args:
        url: any text meant as a URL (``redis://``, ``rediss://``, ``unix://``,
            ``redis+sentinel://``, ``redis+cluster://``, ``amqp://``, ``amqps://``, ...);
            one without ``://`` is masked the same way (``user:pw@host``).

    Returns:
        The masked text (``url`` itself when it holds no secret).
    """
    pieces = _NEXT_URL.split(url)
    if len(pieces) > 1:
        return "".join(_mask_one(piece) for piece in pieces)
    return _mask_one(url)


def _secrets(url: str) -> set[str]:
    """The secrets of ``url`` as they may appear in text: raw and unquoted, and the pieces
    (3 characters or more) a URL parser may have cut a malformed one into. A bare userinfo
    (``redis://name@host``) is masked in a URL but not searched for in text: redis-py and
    aio-pika read it as a user name, which may be a common word (``default``)."""
    found: set[str] = set()
    for piece in _NEXT_URL.split(url):
        _start, userinfo, _where, _question, query = _split(piece)
        values = []
        if userinfo is not None:
            _user, colon, password = userinfo.partition(":")
            if colon:
                values.append(password)
        for item in re.split(r"[&;]", query):
            key, equals, value = item.partition("=")
            if equals and _is_secret_key(key):
                values.append(value)
        for value in values:
            for form in {value, unquote(value), unquote_plus(value)}:
                if form:
                    found.add(form)
                    found.update(p for p in _CUTS.split(form) if len(p) >= 3)
    found.discard(MASK)
    return found


def redact(text: str, *urls: str | None) -> str:
    """``text`` with every URL in it masked (:func:`mask_url`) and every secret of ``urls``
    replaced by ``***`` wherever it appears (a library's message may quote a piece of a
    malformed URL).

    Args:
        text: a message, a log line, an error document.
        urls: the URLs whose secrets must not appear (``None`` entries are skipped).

    Returns:
        The redacted text.
    """
    found: set[str] = set()
    for url in urls:
        if url:
            found |= _secrets(url)
    secrets = sorted(found, key=len, reverse=True)

    def plain(segment: str) -> str:
        for secret in secrets:
            segment = segment.replace(secret, MASK)
        return segment

    if "://" not in text:
        return plain(text)
    out: list[str] = []
    last = 0
    for match in _URL_IN_TEXT.finditer(text):
        out.append(plain(text[last : match.start()]))
        out.append("".join(_masked_in_text(p, plain) for p in _NEXT_URL.split(match.group())))
        last = match.end()
    out.append(plain(text[last:]))
    return "".join(out)


def _masked_in_text(url: str, plain: Callable[[str], str]) -> str:
    """One URL found in text, masked as :func:`mask_url` masks it -- its user name shown
    even where it is also a secret (``amqp://guest:guest@host`` shows ``guest:***``, as
    ``amqp://guest:wrong@host`` does: one rule) -- and the secrets replaced (``plain``) in
    the rest of it (its host, path and query)."""
    start, userinfo, where, question, query = _split(_mask_one(url))
    shown = "" if userinfo is None else userinfo + "@"
    return f"{start}{shown}{plain(where + question + query)}"
