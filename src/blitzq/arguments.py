"""Typed task arguments and results: rich values a task's annotations ask for.

Plain data (see :mod:`blitzq.serialization`) crosses the broker as it is. A task whose
parameters (or return value) are annotated with a *rich* type -- a ``msgspec.Struct``, a
dataclass, an ``enum.Enum``, a ``NamedTuple`` or ``TypedDict``, ``set``/``frozenset``,
``tuple``, ``datetime.timedelta``, a pydantic v2 model, or a container of them
(``list[Point]``, ``Point | None``, ``dict[str, Color]``) -- gets those values back as that
type:

- at enqueue, the argument given for such a parameter is turned into plain data with
  ``msgspec.to_builtins`` (a pydantic model with ``model_dump(mode="json")``) and checked
  against the annotation (a value that does not fit -- a dict missing a field -- is a
  :class:`~blitzq.exceptions.SerializationError` there, not a failure in the worker); a rich
  value given for a parameter *not* annotated with a rich type stays a
  :class:`~blitzq.exceptions.SerializationError` there, as before;
- in the worker, the plain value is converted back with msgspec's typed conversion
  (``msgspec.convert``; pydantic models with ``model_validate``) before the function runs: a
  value that does not fit the annotation fails the attempt without retries;
- the same holds for the return value and ``handle.result()``.

Nothing is pickled: the wire form is plain MessagePack, readable by any consumer. A task
without rich annotations has no :class:`TypedCall` (``Task.arguments is None``) and costs
nothing more than before. Sources: msgspec's "Converters" and "Supported Types" docs
(``to_builtins``/``convert`` with ``builtin_types``), pydantic v2's ``model_dump`` /
``model_validate``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import decimal
import enum
import inspect
import logging
import typing
import uuid
from collections.abc import Callable, Collection
from typing import Any, Final

import msgspec

from .exceptions import SerializationError

logger = logging.getLogger(__name__)

#: Types the plain-data encoder carries itself (kept as they are by ``to_builtins``).
_PASSED_THROUGH: Final = (
    datetime.datetime,
    datetime.date,
    uuid.UUID,
    decimal.Decimal,
    bytes,
    bytearray,
)
_RICH_ORIGINS: Final = frozenset(
    {set, frozenset, tuple, collections.abc.Set, collections.abc.MutableSet}
)
_RICH_TYPES: Final = frozenset({set, frozenset, tuple, datetime.timedelta})


def _is_pydantic(tp: Any) -> bool:
    """Whether ``tp`` is a pydantic v2 model class (without importing pydantic)."""
    return isinstance(tp, type) and any(
        c.__name__ == "BaseModel" and c.__module__.startswith("pydantic") for c in tp.__mro__
    )


def _is_rich(tp: Any, seen: frozenset[int] = frozenset()) -> bool:
    """Whether annotation ``tp`` names (or contains) a type plain data cannot stand for."""
    if id(tp) in seen:
        return False
    seen = seen | {id(tp)}
    if tp in _RICH_TYPES:
        return True
    origin = typing.get_origin(tp)
    if origin in _RICH_ORIGINS:
        return True
    if isinstance(tp, type):
        if issubclass(tp, msgspec.Struct | enum.Enum) or dataclasses.is_dataclass(tp):
            return True
        if issubclass(tp, tuple) and hasattr(tp, "_fields"):  # NamedTuple
            return True
        if typing.is_typeddict(tp):
            return True
        if _is_pydantic(tp):
            return True
    return any(_is_rich(arg, seen) for arg in typing.get_args(tp))


def _enc_hook(value: Any) -> Any:
    """``to_builtins`` hook: pydantic models to JSON-compatible data."""
    dump = getattr(value, "model_dump", None)
    if _is_pydantic(type(value)) and dump is not None:
        return dump(mode="json")
    raise NotImplementedError(f"{type(value).__qualname__} is not plain data")


def _dec_hook(tp: Any, value: Any) -> Any:
    """``convert`` hook: pydantic models from their dumped data."""
    if _is_pydantic(tp):
        return tp.model_validate(value)
    raise NotImplementedError(f"cannot convert to {tp!r}")


def to_wire(value: Any) -> Any:
    """A rich value as plain data (still to be checked by the plain-data encoder).

    Raises:
        SerializationError: the value has a part neither msgspec nor pydantic can encode.
    """
    try:
        return msgspec.to_builtins(value, builtin_types=_PASSED_THROUGH, enc_hook=_enc_hook)
    except (TypeError, NotImplementedError, ValueError) as exc:
        raise SerializationError(str(exc)) from exc


def from_wire(value: Any, tp: Any) -> Any:
    """Convert plain ``value`` to annotation ``tp``.

    Raises:
        SerializationError: the value does not fit the annotation.
    """
    try:
        return msgspec.convert(value, tp, builtin_types=_PASSED_THROUGH, dec_hook=_dec_hook)
    except (msgspec.ValidationError, TypeError, ValueError, NotImplementedError) as exc:
        hint = ""
        if "Enums must contain either all str or all int values" in str(exc):
            hint = (
                " (an annotated Enum parameter needs members whose values are all str or all "
                "int: change the Enum's values, or annotate the parameter with the values' "
                "type and pass the member's .value)"
            )
        raise SerializationError(f"cannot read {value!r} as {tp!r}: {exc}{hint}") from exc


def _checked(value: Any, tp: Any) -> Any:
    """``value`` as plain data for a parameter annotated ``tp`` (``None``: plain, as it is),
    refused here when the worker could not read it back as ``tp``.

    Raises:
        SerializationError: it cannot be encoded, or does not fit ``tp`` (a dict missing a
            Struct's field, a str for an int field, ...): at enqueue, not in the worker.
    """
    if tp is None:
        return value
    wire = to_wire(value)
    from_wire(wire, tp)
    return wire


class TypedCall:
    """Which parameters (and whether the return value) of one task carry rich types.

    Args:
        positional: the annotation of each positional parameter in order (``None``: plain).
        var_positional: the annotation of ``*args`` items when rich, else ``None``.
        keyword: annotations of the rich parameters passable by keyword, by name.
        var_keyword: the annotation of ``**kwargs`` values when rich, else ``None``.
        returns: the return annotation when rich, else ``None``.
    """

    __slots__ = ("keyword", "positional", "returns", "var_keyword", "var_positional")

    def __init__(
        self,
        positional: list[Any],
        var_positional: Any,
        keyword: dict[str, Any],
        var_keyword: Any,
        returns: Any,
    ) -> None:
        self.positional = positional
        self.var_positional = var_positional
        self.keyword = keyword
        self.var_keyword = var_keyword
        self.returns = returns

    @classmethod
    def of(cls, fn: Callable[..., Any], skip: Collection[str] = ()) -> TypedCall | None:
        """The typed call of ``fn``, or ``None`` when none of its annotations is rich (or
        they cannot be resolved: the task then takes plain data, as before). Parameters
        named in ``skip`` (filled by the worker, not by messages) are left out."""
        try:
            hints = typing.get_type_hints(fn)
            signature = inspect.signature(fn)
        except Exception as exc:  # an unresolvable forward reference: plain data only
            logger.debug("annotations of %r not resolved (%s): plain data only", fn, exc)
            return None
        positional: list[Any] = []
        keyword: dict[str, Any] = {}
        var_positional = var_keyword = None
        for name, param in signature.parameters.items():
            tp = None if name in skip else hints.get(name)
            rich = tp if tp is not None and _is_rich(tp) else None
            if param.kind is param.VAR_POSITIONAL:
                var_positional = rich
            elif param.kind is param.VAR_KEYWORD:
                var_keyword = rich
            else:
                if param.kind is not param.KEYWORD_ONLY:
                    positional.append(rich)
                if rich is not None and param.kind is not param.POSITIONAL_ONLY:
                    keyword[name] = rich
        returns = hints.get("return")
        returns = returns if returns is not None and _is_rich(returns) else None
        if not (
            any(t is not None for t in positional)
            or keyword
            or var_positional
            or var_keyword
            or returns is not None
        ):
            return None
        return cls(positional, var_positional, keyword, var_keyword, returns)

    def _type_at(self, index: int) -> Any:
        return self.positional[index] if index < len(self.positional) else self.var_positional

    def _type_of(self, name: str) -> Any:
        return self.keyword.get(name, self.var_keyword)

    def encode(
        self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """Arguments of one call with the values of rich parameters as plain data.

        Raises:
            SerializationError: a rich parameter's value cannot be encoded.
        """
        out_args = [_checked(a, self._type_at(i)) for i, a in enumerate(args)]
        out_kwargs = {k: _checked(v, self._type_of(k)) for k, v in kwargs.items()}
        return out_args, out_kwargs

    def encode_step(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """:meth:`encode` for a workflow step's own arguments, which run at their position
        or, in a chain, one further (after the previous step's result): a value is encoded
        when either parameter is rich.

        Raises:
            SerializationError: a rich parameter's value cannot be encoded.
        """
        out_args = [
            to_wire(a) if self._type_at(i) is not None or self._type_at(i + 1) is not None else a
            for i, a in enumerate(args)
        ]  # not checked: the position the value will run at is not known yet
        return out_args, self.encode((), kwargs)[1]

    def decode(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Arguments read from a message, rich parameters converted to their annotations.

        Raises:
            SerializationError: a value does not fit its parameter's annotation.
        """
        out_args = list(args)
        for i, value in enumerate(args):
            tp = self._type_at(i)
            if tp is not None:
                out_args[i] = from_wire(value, tp)
        out_kwargs = dict(kwargs)
        for name, value in kwargs.items():
            tp = self._type_of(name)
            if tp is not None:
                out_kwargs[name] = from_wire(value, tp)
        return out_args, out_kwargs

    def encode_result(self, value: Any) -> Any:
        """A return value as plain data when the return annotation is rich.

        Raises:
            SerializationError: it cannot be encoded.
        """
        return to_wire(value) if self.returns is not None else value

    def decode_result(self, value: Any) -> Any:
        """A stored result converted to the return annotation when it is rich.

        Raises:
            SerializationError: it does not fit the annotation.
        """
        return from_wire(value, self.returns) if self.returns is not None else value
