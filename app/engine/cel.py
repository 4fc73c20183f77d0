"""DRA device selectors: Kubernetes' CEL environment for `device`, compiled once, evaluated per distinct device.

PURE (no I/O). A DeviceClass's and a request's `selectors[].cel.expression` see one variable, `device`, as the
kube-scheduler's structured allocator gives it (k8s.io/dynamic-resource-allocation cel/compile.go; the DRA
docs' "CEL selectors"):
- `device.driver`, `device.allowMultipleAllocations`;
- `device.attributes['<domain>'].<name>`: an attribute written bare (`type`) is under the driver's own domain,
  a qualified one (`resource.kubernetes.io/pcieRoot`) under its prefix; a domain the device has none of is an
  empty map (so `has(...)` is false and reading a name from it is an error);
- `device.capacity['<domain>'].<name>`: quantities.
An evaluation error (a name the device does not have) makes the device not match: the scheduler fails the
allocation on such a device, never allocates it.

The CEL runtime is `cel-expr-python`, Google's binding of cel-cpp (the C++ implementation of the CEL spec
that cel-go, the apiserver's, also conforms to). Chosen over `cel-python` (pure Python) because it
type-checks at compile time, so a syntax error or an unknown function is found once per expression and
named, never guessed per device; and because it evaluates in tens of microseconds, where cel-python took
about 3.5 ms an evaluation here (40,000 devices must be counted in about a second).

Kubernetes' own CEL libraries are partly declared here, on plain values: a quantity is an int of
thousandths (`quantity()`, and on it `compareTo`, `isGreaterThan`, `isLessThan`, `asInteger`,
`asApproximateFloat`, `isInteger`, `sign`), a version attribute is its string (`semver()`, `isSemver()`,
`major`/`minor`/`patch`, `compareTo`, `isGreaterThan`, `isLessThan`). Any other function (`add`, `sub`,
`ip`, `cidr`, ...) does not compile: such a selector's count is `unknown`, named. (Mixing a quantity with a
plain int, which the apiserver's type checker would refuse, is not refused here.)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel

from app.models.dra import Device, milli, parse_quantity

# Semantic versions as Kubernetes' semver library reads them (blang/semver: no leading "v", no leading zeros).
_SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")


def _semver(text: str) -> tuple[int, int, int, tuple[tuple[int, int | str], ...]]:
    match = _SEMVER.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is no semantic version")
    pre = tuple((0, int(p)) if p.isdecimal() else (1, p) for p in (match.group(4) or "").split(".") if p)
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), pre


def _version_order(a: str, b: str) -> int:
    (*ka, pa), (*kb, pb) = _semver(a), _semver(b)
    if ka != kb:
        return -1 if ka < kb else 1
    if pa == pb:
        return 0
    if not pa or not pb:  # a release sorts after its pre-releases
        return 1 if not pa else -1
    return -1 if pa < pb else 1


def _quantity(text: str) -> int:
    value = parse_quantity(text)
    if value is None:
        raise ValueError(f"{text!r} is no quantity")
    return milli(value)


def _as_integer(thousandths: int) -> int:
    if thousandths % 1000:
        raise ValueError("the quantity is no integer")
    return thousandths // 1000


def _is_semver(text: str) -> bool:
    return _SEMVER.fullmatch(text) is not None


def _checked_semver(text: str) -> str:
    _semver(text)
    return text


T = cel.Type


def _overload(name: str, result: Any, params: list[Any], impl: Any, member: bool = True) -> Any:
    return cel.Overload(name, result, params, is_member=member, impl=impl)


_FUNCTIONS = [
    cel.FunctionDecl("quantity", [_overload("quantity_string", T.INT, [T.STRING], _quantity, member=False)]),
    cel.FunctionDecl("semver", [_overload("semver_string", T.STRING, [T.STRING], _checked_semver, member=False)]),
    cel.FunctionDecl("isSemver", [_overload("is_semver_string", T.BOOL, [T.STRING], _is_semver, member=False)]),
    cel.FunctionDecl("compareTo", [
        _overload("quantity_compare", T.INT, [T.INT, T.INT], lambda a, b: (a > b) - (a < b)),
        _overload("semver_compare", T.INT, [T.STRING, T.STRING], _version_order)]),
    cel.FunctionDecl("isGreaterThan", [
        _overload("quantity_greater", T.BOOL, [T.INT, T.INT], lambda a, b: a > b),
        _overload("semver_greater", T.BOOL, [T.STRING, T.STRING], lambda a, b: _version_order(a, b) > 0)]),
    cel.FunctionDecl("isLessThan", [
        _overload("quantity_less", T.BOOL, [T.INT, T.INT], lambda a, b: a < b),
        _overload("semver_less", T.BOOL, [T.STRING, T.STRING], lambda a, b: _version_order(a, b) < 0)]),
    cel.FunctionDecl("asInteger", [_overload("quantity_as_integer", T.INT, [T.INT], _as_integer)]),
    cel.FunctionDecl("asApproximateFloat", [_overload("quantity_as_float", T.DOUBLE, [T.INT], lambda a: a / 1000)]),
    cel.FunctionDecl("isInteger", [_overload("quantity_is_integer", T.BOOL, [T.INT], lambda a: a % 1000 == 0)]),
    cel.FunctionDecl("sign", [_overload("quantity_sign", T.INT, [T.INT], lambda a: (a > 0) - (a < 0))]),
    cel.FunctionDecl("major", [_overload("semver_major", T.INT, [T.STRING], lambda a: _semver(a)[0])]),
    cel.FunctionDecl("minor", [_overload("semver_minor", T.INT, [T.STRING], lambda a: _semver(a)[1])]),
    cel.FunctionDecl("patch", [_overload("semver_patch", T.INT, [T.STRING], lambda a: _semver(a)[2])]),
]
_ENV = cel.NewEnv(variables={"device": T.DYN}, functions=_FUNCTIONS)

# What an expression reads of a device, when it reads it only this way: `device.driver`,
# `device.allowMultipleAllocations`, `device.attributes['<domain>'].<name>` (or `['<name>']`), the same for
# capacity. Then a device's result depends only on those values, and one evaluation serves every device that
# has the same ones (40,000 GPUs of a few models: a handful of evaluations). Anything else that names `device`
# (a comprehension over a domain, `size(...)`, a computed key) makes the result depend on the whole device.
_LITERAL = r"""(?:'([^'\\\n]*)'|"([^"\\\n]*)")"""
_ACCESS = re.compile(
    rf"\bdevice\s*\.\s*(?:(attributes|capacity)\s*\[\s*{_LITERAL}\s*\]\s*"
    rf"(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()|\[\s*{_LITERAL}\s*\])|driver\b|allowMultipleAllocations\b)")
_DEVICE = re.compile(r"\bdevice\b")
_STRING = re.compile(_LITERAL)
# A comprehension's range must be typed for cel-cpp's checker, and `device` is dynamic: such an expression is
# compiled unchecked (functions are then resolved at evaluation, where an unknown one is still named).
_RANGE_TYPE_ERROR = "cannot be the range of a comprehension"
# Runtime errors that say the expression, not the device, is at fault.
_EXPRESSION_FAULTS = ("No matching overloads", "undeclared reference", "no such overload")

Read = tuple[str, str, str]  # ("attributes" | "capacity", domain, name)


@dataclass(frozen=True)
class Selector:
    """One compiled expression: `fault` says why it cannot be evaluated ("" when it can); `reads` what it
    reads of a device (None: anything); `domains` every string literal, as domains a device may lack."""

    expression: str
    fault: str
    program: Any
    reads: tuple[Read, ...] | None
    domains: frozenset[str]


_COMPILED: dict[str, Selector] = {}
_LOCK = threading.Lock()


def compile_selector(expression: str) -> Selector:
    """The expression compiled, once per distinct text (cached for the process: selectors are few)."""
    found = _COMPILED.get(expression)
    if found is None:
        found = _compile(expression)
        with _LOCK:
            if len(_COMPILED) > 4096:
                _COMPILED.clear()
            _COMPILED[expression] = found
    return found


def _compile(expression: str) -> Selector:
    domains = frozenset(a or b for a, b in _STRING.findall(expression))
    if not expression.strip():
        return Selector(expression, "the selector has no CEL expression", None, (), domains)
    try:
        program = _ENV.compile(expression)
    except Exception as e:  # cel-cpp reports syntax and type errors as RuntimeError
        message = str(e)
        if _RANGE_TYPE_ERROR not in message:
            return Selector(expression, f"CEL expression {expression!r} does not compile: {_first_line(message)}",
                            None, (), domains)
        try:
            program = _ENV.compile(expression, disable_check=True)
        except Exception as again:
            return Selector(expression, f"CEL expression {expression!r} does not compile: "
                            f"{_first_line(str(again))}", None, (), domains)
    reads: list[Read] = []
    for match in _ACCESS.finditer(expression):
        where, domain, name = match.group(1), match.group(2) or match.group(3), match.group(4) or match.group(5) or \
            match.group(6)
        if where:
            reads.append((where, domain, name))
    rest = _ACCESS.sub(" ", expression)
    return Selector(expression, "", program, None if _DEVICE.search(rest) else tuple(sorted(set(reads))), domains)


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] if lines else message
    return text.removeprefix("INVALID_ARGUMENT: ").removeprefix("ERROR: ")


def device_view(driver: str, device: Device) -> dict[str, Any]:
    """`device` as the expression sees it: attributes and capacity by domain, capacities in thousandths."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, _, bare = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[bare] = value
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in device.capacity.items():
        amount = parse_quantity(value)
        if amount is not None:
            domain, _, bare = name.rpartition("/")
            capacity.setdefault(domain or driver, {})[bare] = milli(amount)
    return {"driver": driver, "attributes": attributes, "capacity": capacity,
            "allowMultipleAllocations": device.allow_multiple_allocations}


def read_key(selector: Selector, driver: str, device: Device) -> Any:
    """What `selector`'s result depends on for this device (read from the device as written, without building
    its view): equal keys, equal results."""
    if selector.reads is None:
        return (driver, device.allow_multiple_allocations, tuple(sorted(device.attributes.items())),
                tuple(sorted((k, str(v)) for k, v in device.capacity.items())))
    values = []
    for where, domain, name in selector.reads:
        source = device.attributes if where == "attributes" else device.capacity
        value = source.get(f"{domain}/{name}", _ABSENT)
        if value is _ABSENT and domain == driver:
            value = source.get(name, _ABSENT)  # written bare: the driver's own domain
        values.append(value if where == "attributes" or value is _ABSENT else str(value))
    return (driver, device.allow_multiple_allocations, tuple(values))


_ABSENT = object()


@dataclass(frozen=True)
class Outcome:
    matches: bool
    fault: str = ""  # the expression cannot be evaluated (an unknown function at run time): "" when it can


def evaluate(selector: Selector, view: Mapping[str, Any]) -> Outcome:
    """The selector on one device's view. An error the device causes (a name it lacks) is no match."""
    if selector.fault:
        return Outcome(False, selector.fault)
    attributes = dict(view["attributes"])
    capacity = dict(view["capacity"])
    for domain in selector.domains:  # a domain the device has none of reads as an empty map
        attributes.setdefault(domain, {})
        capacity.setdefault(domain, {})
    data = {**view, "attributes": attributes, "capacity": capacity}
    try:
        result = selector.program.eval(data={"device": data})
    except Exception as e:
        return Outcome(False, f"CEL expression {selector.expression!r} cannot be evaluated: {_first_line(str(e))}")
    value = result.value()
    if result.type().name() == "ERROR":
        message = str(value)
        if any(fault in message for fault in _EXPRESSION_FAULTS):
            return Outcome(False, f"CEL expression {selector.expression!r} cannot be evaluated: {message}")
        return Outcome(False)
    if not isinstance(value, bool):
        return Outcome(False, f"CEL expression {selector.expression!r} gives {result.type().name()}, not a bool")
    return Outcome(value)
