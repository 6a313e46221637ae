"""Lazy public names of a package (PEP 562 module ``__getattr__``): a name is imported from
the module that defines it on first access, so ``import blitzq`` (and ``blitzq.workflow``)
loads none of the parts an application does not use (issue 29's start-up and idle memory)."""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, MutableMapping
    from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    module_of: Mapping[str, str],
    namespace: MutableMapping[str, Any],
    public: Iterable[str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__``.
        module_of: public name -> the module defining it, relative to ``package``
            (``".queue"``).
        namespace: the package's ``globals()``: a name imported once is cached there.
        public: the package's ``__all__``.

    Returns:
        ``(__getattr__, __dir__)``. ``__getattr__(name)`` imports the module that defines
        public ``name`` and caches the value; a submodule's name (``blitzq.testing``) imports
        that submodule, as an eager package did; it raises ``AttributeError`` for any other
        name. ``__dir__()`` lists the public names and the package's own attributes.
    """
    names = tuple(public)

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            try:
                return import_module(f".{name}", package)
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
