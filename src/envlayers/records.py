"""``NamedTuple`` without importing :mod:`typing`: the record classes of the modules ``env_layers render``
imports (envfile, catalog, layers) keep typing.NamedTuple's class syntax, and the command does not pay
typing's import (about 3 ms, a tenth of its budget: docs/layers.md, "Start-up").

As typing.NamedTuple does it: the class body's annotations name the fields in order, a field with a value
has that default (only trailing ones may), the other attributes (methods, the docstring) go onto the
class :func:`collections.namedtuple` makes, and that class is the result. The annotations stay as written
(strings under ``from __future__ import annotations``); typing would wrap them in ForwardRef.
"""

from __future__ import annotations

import collections

# what typing refuses to let a NamedTuple body set, and what it does not copy onto the class
_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                         "_make", "_replace", "_asdict", "_source"})
_SPECIAL = frozenset({"__module__", "__name__", "__annotations__", "__qualname__", "__orig_bases__"})


class _RecordMeta(type):
    def __new__(mcs, name: str, bases: tuple, ns: dict):
        fields = list(ns.get("__annotations__", {}))
        defaults = []
        for field in fields:
            if field in ns:
                defaults.append(ns[field])
            elif defaults:
                raise TypeError(f"non-default field {field!r} follows a default field in {name}")
        cls = collections.namedtuple(name, fields, defaults=defaults, module=ns["__module__"])
        cls.__annotations__ = dict(ns.get("__annotations__", {}))
        for key, value in ns.items():
            if key in _PROHIBITED:
                raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
            if key not in _SPECIAL and key not in fields:
                setattr(cls, key, value)
        return cls


_Record = type.__new__(_RecordMeta, "NamedTuple", (), {})


class _NamedTuple:
    """The base named in ``class X(NamedTuple):``; it stands for the metaclass's base, as typing's does."""

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (_Record,)

    def __repr__(self) -> str:
        return "envlayers.records.NamedTuple"


NamedTuple = _NamedTuple()
