"""Making the frozen records of app.models (Replica, JobGroup, UserPlacement) on the hot path.

A frozen dataclass's `__init__` sets every field through `object.__setattr__`, one call each: on
the bench job (a PyTorchJob with 2 replica types) the two `Replica`s, the `JobGroup` and a
`UserPlacement` were about 40% of its parse (instructions counted under callgrind).
`build_record` makes the same instance the way pickle remakes one (`__new__`, then the instance
dict), at about a fifth of the cost. The records' types stay as app.models declares them; only
who fills them in differs.
"""

from __future__ import annotations

from typing import Any, TypeVar

R = TypeVar("R")

_new = object.__new__


def build_record(cls: type[R], fields: dict[str, Any]) -> R:
    """The instance `cls(**fields)` would make, without running its `__init__`.

    NB: only for dataclasses whose `__init__` does nothing but store the fields (no
    `__post_init__`, no `__slots__`, every field an init field), and `fields` must name every field
    in declaration order, defaults included, so the instance dict is the one `__init__` builds.
    tests/unit/jobs/test_records.py checks both for every class built here.
    """
    record = _new(cls)
    record.__dict__.update(fields)
    return record


# The NamedTuples internal to app/jobs (PodFacts, JobMeta, ...) are made on the hot path by `build_tuple(cls, values)`:
# a NamedTuple's own `__new__` is a Python function (namedtuple generates it), and `tuple.__new__` makes the same
# instance in C at about half the cost (0.16 vs 0.34 us for five fields).
# NB: `values` must hold every field, defaults included, in declaration order (nothing checks the count).
build_tuple = tuple.__new__
