"""The one key table (``broker/redis/keys.py``): the Lua scripts build every key name from it,
and every key in it is documented (in the table, in each script's header, in the docs).

No server: the scripts are read as text.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from blitzq.broker.redis import scripts
from blitzq.broker.redis.keys import TABLE, Keys

LUA = resources.files("blitzq.broker.redis").joinpath("lua")
ARCHITECTURE = Path(__file__).parents[2] / "docs" / "architecture.md"

#: Redis types a key may have (``channel``: a pub/sub channel, no key is stored).
TYPES = {"stream", "list", "string", "hash", "zset", "set", "channel"}

#: A Lua string literal, or a comment (skipped).
_TOKEN = re.compile(r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|--[^\n]*""")
#: The prefix (or an ARGV holding it) joined to a literal: a key made outside the table.
_CONCAT = re.compile(r"""(?:\bprefix|ARGV\[\d+\])\s*\.\.\s*['"]""")
#: The tags of the events channel's payloads ('r:<id>', 's:<due>', 'h:<worker>'), which are
#: not key names, written right after the channel in a PUBLISH.
_EVENT_TAG = re.compile(r"""'PUBLISH',\s*[^,]+,\s*'[rsh]:'\s*\.\.""")

#: Every literal piece of a key pattern: a Lua string equal to one is a hand-made key.
_KEY_TEXT = {literal for key in TABLE.values() for literal in key.literals if literal}


def _code(text: str) -> str:
    """``text`` without its comments (strings kept)."""
    return _TOKEN.sub(lambda m: "" if m.group().startswith("--") else m.group(), text)


def _offences(text: str) -> list[str]:
    """Lines of a Lua text that make a key name from a literal instead of ``KEY``."""
    found = []
    for line in text.splitlines():
        code = _code(line)
        literals = [m.group()[1:-1] for m in _TOKEN.finditer(code)]
        for literal in literals:
            if (literal in _KEY_TEXT or literal.endswith(":")) and not _EVENT_TAG.search(code):
                found.append(f"{literal!r}: {line.strip()}")
        if _CONCAT.search(code):
            found.append(f"concatenated key: {line.strip()}")
    return found


def _with_includes(name: str) -> str:
    """The text of ``lua/<name>.lua`` with its included files' text after it."""
    raw = LUA.joinpath(f"{name}.lua").read_text()
    included = re.findall(r"^--@include (\S+)$", raw, re.M)
    return "\n".join([raw, *(LUA.joinpath(file).read_text() for file in included)])


def _header(text: str) -> str:
    """The comment block a script starts with."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--") or line.startswith("--@include"):
            break
        lines.append(line)
    return "\n".join(lines)


def _pattern(key_text: str) -> str:
    """A key pattern with its placeholders' names dropped (``t:<id>`` is ``t:<task_id>``)."""
    return re.sub(r"<[^<>]*>", "<>", key_text)


def test_the_check_catches_a_key_made_by_hand() -> None:
    assert _offences("redis.call('GET', prefix .. 't:' .. id)")
    assert _offences("local k = ARGV[1] .. 'dlq'")
    assert _offences("local k = p .. 'newkey:' .. id")
    assert _offences("redis.call('DEL', 'sched:m')")
    assert not _offences("redis.call('GET', KEY.record(prefix, id))  -- not prefix .. 't:'")
    assert not _offences("redis.call('PUBLISH', KEY.events(prefix), 's:' .. due)")
    assert not _offences("redis.call('HSET', key, 'state', 'running')")


@pytest.mark.parametrize("name", scripts.names())
def test_no_script_makes_a_key_outside_the_table(name: str) -> None:
    assert _offences(LUA.joinpath(f"{name}.lua").read_text()) == []


@pytest.mark.parametrize("name", scripts.names())
def test_every_script_header_documents_its_keys_arguments_and_answer(name: str) -> None:
    raw = LUA.joinpath(f"{name}.lua").read_text()
    header = _header(raw)
    code = _code(raw)
    assert header.startswith(f"-- {name}.lua: ")
    for number in {int(n) for n in re.findall(r"\bKEYS\[(\d+)\]", code)}:
        assert f"KEYS[{number}] {{ns}}:" in header, f"KEYS[{number}] undocumented"
    if re.search(r"\bKEYS\b", code) and "KEYS[" not in code:
        assert "KEYS[i] {ns}:" in header
    for number in {int(n) for n in re.findall(r"\bARGV\[(\d+)\]", code)}:
        assert re.search(rf"ARGV\[{number}(\]|\.\.)", header) or "ARGV[2i" in header, number
    assert "Returns" in header or name == "dead_letters"
    # Every key it builds, its included files' among them, by its pattern.
    used = set(re.findall(r"\bKEY\.(\w+)\(", _code(_with_includes(name))))
    documented = _pattern(header)
    for key in sorted(used):
        assert _pattern("{ns}:" + TABLE[key].pattern) in documented, f"{key} undocumented"


def test_every_key_of_the_table_is_documented_and_is_what_keys_builds() -> None:
    keys = Keys("ns")
    methods = {n for n in dir(Keys) if not n.startswith("_")} - {"prefix", "namespace"}
    assert methods == set(TABLE)
    docs = ARCHITECTURE.read_text()
    section = docs[docs.index("## Redis keys") :]
    documented = {_pattern(k) for k in re.findall(r"`(\{ns\}:[^`]*)`", section)}
    for name, key in TABLE.items():
        assert key.type in TYPES, name
        assert len(key.holds) > 10, name
        assert all(part.isidentifier() for part in key.parts), name
        member = getattr(keys, name)
        built = member(*(f"<{part}>" for part in key.parts)) if key.parts else member
        assert built == "{ns}:" + key.pattern, name
        assert _pattern("{ns}:" + key.pattern) in documented, f"{name} not in architecture.md"


def test_a_key_call_becomes_the_concatenation_of_its_pattern() -> None:
    expand = scripts.expand_keys
    assert expand("KEY.record(prefix, id)") == "(prefix .. 't:' .. id)"
    assert expand("KEY.dead_letters(ARGV[1])") == "(ARGV[1] .. 'dlq')"
    assert (
        expand("redis.call('HSET', KEY.workflow_join(prefix, op[2], op[3]), 'f', 1)")
        == "redis.call('HSET', (prefix .. 'wf:' .. op[2] .. ':j:' .. op[3]), 'f', 1)"
    )
    for name, key in TABLE.items():  # each pattern, evaluated as Lua would concatenate it
        args = ["prefix", *key.parts]
        body = expand(f"KEY.{name}({', '.join(args)})").removeprefix("(").removesuffix(")")
        values = {"prefix": "{ns}:", **{part: f"<{part}>" for part in key.parts}}
        pieces = [p[1:-1] if p.startswith("'") else values[p] for p in body.split(" .. ")]
        assert "".join(pieces) == "{ns}:" + key.pattern, name


def test_a_key_call_the_table_cannot_make_is_refused() -> None:
    with pytest.raises(KeyError):
        scripts.expand_keys("KEY.no_such_key(prefix, id)")
    with pytest.raises(ValueError, match="takes"):
        scripts.expand_keys("KEY.record(prefix)")
    with pytest.raises(ValueError, match="line 2"):
        scripts.expand_keys("local a = 1\nreturn KEY.record(prefix, a .. b)")
    assert scripts.expand_keys("return KEYS[1]") == "return KEYS[1]"


def test_a_key_call_is_only_expanded_where_key_starts_a_word() -> None:
    # As a regex's \bKEY would: a name ending in KEY (a local, a field) is left as written,
    # and such a call is not refused as a malformed KEY call either.
    text = "local v = MYKEY.record(prefix, id); return t_KEY.x(a .. b), KEY.record(prefix, id)"
    assert scripts.expand_keys(text) == (
        "local v = MYKEY.record(prefix, id); return t_KEY.x(a .. b), (prefix .. 't:' .. id)"
    )
    assert scripts.expand_keys(".KEY.record(p, i)") == ".(p .. 't:' .. i)"
