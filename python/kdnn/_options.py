# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The options of the extension's calls, as labelled records.

python/src/options.cpp binds each of kdnn's C++ options structs (and the
attention mask as Python passes it) as a class of _kdnn, one read-write
field per C++ member. An operator describes a call's options as an
Options record of the fields it sets, by name, and the extension takes
record.bound(): that class's object, with the C++ defaults and these
fields. An autograd function keeps the record, not the bound object, on
its ctx: a record is plain Python, so that an autograd graph still alive at
interpreter exit holds no extension object (nanobind would report it
leaked), and the backward makes its own bound object from it.
"""
from . import _kdnn


class Options:
    """The fields of the bound struct `struct` (a _kdnn class's name) that
    a call sets, by name, read-only; a nested struct's value is an Options
    of its own, e.g. Options("FusedAttentionOptions", scale=0.125,
    launch=Options("Launch", allow_tf32=True)). record.name reads a field."""

    __slots__ = ("_struct", "_fields")

    def __init__(self, struct, **fields):
        object.__setattr__(self, "_struct", struct)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name):
        if name in Options.__slots__:  # not set yet (a copy under construction)
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"{self._struct} record has no field {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"{self._struct} record is read-only")

    def __repr__(self):
        fields = ", ".join(f"{name}={value!r}" for name, value in self._fields.items())
        return f"Options({self._struct!r}, {fields})"

    def bound(self):
        """The _kdnn object of this record: its class's C++ defaults, with
        the record's fields set (a field the struct does not have is an
        AttributeError, a value of the wrong type a TypeError)."""
        made = getattr(_kdnn, self._struct)()
        for name, value in self._fields.items():
            setattr(made, name, value.bound() if isinstance(value, Options) else value)
        return made
