"""The values, operations and functions a space expression may use, each bounded.

Every operation checks its operand types and its result (ints below
``2**MAX_INT_BITS``, finite floats, strings under ``MAX_STR_LEN``) and raises
``ExprError`` rather than a Python exception; ``expr.py`` compiles expressions
onto these. Standard library only.
"""

from __future__ import annotations

import ast
import difflib
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

MAX_SOURCE_CHARS = 1000
MAX_NODES = 500
MAX_DEPTH = 50
MAX_INT_BITS = 256
MAX_STR_LEN = 1000
MAX_ROUND_DIGITS = 64

_INT_LIMIT = 2**MAX_INT_BITS
_Closure = Callable[[Mapping[str, object]], object]


class ExprError(ValueError):
    """A space expression that cannot be parsed or evaluated.

    ``message`` says what went wrong, ``hint`` how to fix it, ``column`` is the
    0-based character offset into ``source`` where the problem starts, or None
    when no single place is to blame (a cycle between derived values).
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        column: int | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.column = column
        self.source = source

    def __str__(self) -> str:
        text = self.message
        if self.column is not None:
            text += f" at column {self.column}"
        if self.source is not None:
            shown = self.source if len(self.source) <= 120 else self.source[:117] + "..."
            text += f" in {shown!r}"
        if self.hint:
            text += f"; hint: {self.hint}"
        return text

    def __reduce__(self):
        # Ray and multiprocessing rebuild exceptions as cls(*args), which would
        # drop the keyword-only fields; rebuild from all of them instead.
        return (_rebuild_error, (self.message, self.hint, self.column, self.source))


def _rebuild_error(message, hint, column, source) -> ExprError:
    return ExprError(message, hint=hint, column=column, source=source)


def _suggest(name: str, candidates: Iterable[object]) -> str:
    """A did-you-mean hint for an unknown `name`, or the names that exist."""
    known = sorted(c for c in candidates if isinstance(c, str))
    matches = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if matches:
        return "did you mean " + " or ".join(repr(m) for m in matches) + "?"
    if not known:
        return "no names are defined here"
    more = ", ..." if len(known) > 12 else ""
    return "known names: " + ", ".join(known[:12]) + more


# The operation helpers below raise ExprError without a column; _apply adds the
# column of the node that failed and turns Python's own errors into ExprError.


def _type_name(value: object) -> str:
    return type(value).__name__


def _short_repr(value: object) -> str:
    # Values come from the env too; keep a long string or list out of the message.
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _need_numbers(what: str, *values: object) -> None:
    for value in values:
        if not isinstance(value, (int, float)):
            raise ExprError(
                f"{what} needs numbers, got {_type_name(value)} {_short_repr(value)}",
                hint="arithmetic and math functions work on numbers only",
            )


def _checked(value: object) -> object:
    """Return `value` if it is within the evaluation limits, else raise."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if -_INT_LIMIT < value < _INT_LIMIT:
            return value
        raise ExprError(
            f"integer result exceeds the limit of 2**{MAX_INT_BITS}",
            hint="check the magnitudes involved; sizes this large are a typo",
        )
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise ExprError("result is not a finite number", hint="check for overflow")
    if isinstance(value, complex):
        raise ExprError(
            "result is a complex number",
            hint="a negative number to a fractional power has no real value",
        )
    return value


def _check_str_len(length: int) -> None:
    if length > MAX_STR_LEN:
        raise ExprError(
            f"string result of {length} characters exceeds the limit of {MAX_STR_LEN}",
            hint="expressions build short labels, not long text",
        )


def _add(a, b):
    if isinstance(a, str) and isinstance(b, str):
        _check_str_len(len(a) + len(b))
        return a + b
    _need_numbers("'+'", a, b)
    return a + b


def _multiply(a, b):
    if (isinstance(a, str) and isinstance(b, int)) or (isinstance(a, int) and isinstance(b, str)):
        text, times = (a, b) if isinstance(a, str) else (b, a)
        # Check the size before building the string: 'a' * 10**9 must not allocate.
        _check_str_len(len(text) * max(times, 0))
        return text * times
    _need_numbers("'*'", a, b)
    return a * b


def _power(base, exponent):
    _need_numbers("'**'", base, exponent)
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        # |base| >= 2**(bits - 1), so the result has at least (bits - 1) * exponent
        # bits; refuse before computing 9**9**9 rather than after.
        if (abs(base).bit_length() - 1) * exponent >= MAX_INT_BITS:
            raise ExprError(
                f"exponent {exponent} makes the result exceed 2**{MAX_INT_BITS}",
                hint="check the exponent; sizes this large are a typo",
            )
    return base**exponent


def _arithmetic(symbol: str, apply: Callable[[object, object], object]):
    def numeric(a, b):
        _need_numbers(f"'{symbol}'", a, b)
        return apply(a, b)

    return numeric


def _negate(x):
    _need_numbers("unary '-'", x)
    return -x


def _positive(x):
    _need_numbers("unary '+'", x)
    return +x


def _ordering(symbol: str, compare: Callable[[object, object], bool]):
    def ordered(a, b):
        both_numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
        if not (both_numbers or isinstance(a, str) and isinstance(b, str)):
            raise ExprError(
                f"cannot compare {_type_name(a)} with {_type_name(b)} using '{symbol}'",
                hint="'<', '<=', '>', '>=' compare two numbers or two strings",
            )
        return compare(a, b)

    return ordered


_BINARY = {
    ast.Add: ("+", _add),
    ast.Sub: ("-", _arithmetic("-", operator.sub)),
    ast.Mult: ("*", _multiply),
    ast.Div: ("/", _arithmetic("/", operator.truediv)),
    ast.FloorDiv: ("//", _arithmetic("//", operator.floordiv)),
    ast.Mod: ("%", _arithmetic("%", operator.mod)),
    ast.Pow: ("**", _power),
}
_UNARY = {ast.USub: ("-", _negate), ast.UAdd: ("+", _positive)}
_COMPARE = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", _ordering("<", operator.lt)),
    ast.LtE: ("<=", _ordering("<=", operator.le)),
    ast.Gt: (">", _ordering(">", operator.gt)),
    ast.GtE: (">=", _ordering(">=", operator.ge)),
    ast.In: ("in", lambda value, choices: value in choices),
    ast.NotIn: ("not in", lambda value, choices: value not in choices),
}
_REFUSED_OPERATORS = {
    ast.MatMult: "@",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.BitAnd: "&",
    ast.Invert: "~",
    ast.Is: "is",
    ast.IsNot: "is not",
}


def _round(x, ndigits=None):
    _need_numbers("round()", x)
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS:
        # round(1, -10**9) would compute 10**(10**9) before answering.
        raise ExprError(
            f"round() needs an int ndigits within ±{MAX_ROUND_DIGITS}, got {_short_repr(ndigits)}",
            hint="e.g. round(x, 2)",
        )
    return round(x, ndigits)


def _to_number(convert: Callable[[object], object], name: str):
    def number(x):
        if not isinstance(x, (int, float, str)):
            message = f"{name}() needs a number or a numeric string, got {_type_name(x)}"
            raise ExprError(message, hint=f"e.g. {name}(d_model / 3)")
        return convert(x)

    return number


def _round_to(x, multiple):
    """Nearest multiple of `multiple` to `x`, never below `multiple`; ties go up."""
    _need_numbers("round_to()", x, multiple)
    if multiple <= 0:
        raise ExprError(
            f"round_to() needs a positive multiple, got {_short_repr(multiple)}",
            hint="e.g. round_to(8/3 * d_model, 64)",
        )
    if isinstance(x, int) and isinstance(multiple, int):
        # Exact integer arithmetic, so 2**200 + 1 does not lose its low bits.
        quotient, remainder = divmod(x, multiple)
        if 2 * remainder >= multiple:
            quotient += 1
    else:
        # Ties go up (96 -> 128 for 64) rather than to even as round() does, so
        # a width sitting exactly between two multiples rounds the same way each time.
        quotient = math.floor(x / multiple + 0.5)
    return max(quotient * multiple, multiple)


def _clamp(x, lo, hi):
    _need_numbers("clamp()", x, lo, hi)
    if lo > hi:
        message = f"clamp() needs lo <= hi, got lo={lo!r}, hi={hi!r}"
        raise ExprError(message, hint="call it as clamp(x, lo, hi)")
    return min(max(x, lo), hi)


def _math(name: str, apply: Callable[..., object]):
    def numeric(*args):
        _need_numbers(f"{name}()", *args)
        return apply(*args)

    return numeric


@dataclass(frozen=True)
class _Function:
    apply: Callable[..., object]
    min_args: int
    max_args: int
    signature: str


_FUNCTIONS = {
    "abs": _Function(_math("abs", abs), 1, 1, "abs(x)"),
    "ceil": _Function(_math("ceil", math.ceil), 1, 1, "ceil(x)"),
    "clamp": _Function(_clamp, 3, 3, "clamp(x, lo, hi)"),
    "exp": _Function(_math("exp", math.exp), 1, 1, "exp(x)"),
    "float": _Function(_to_number(float, "float"), 1, 1, "float(x)"),
    "floor": _Function(_math("floor", math.floor), 1, 1, "floor(x)"),
    "int": _Function(_to_number(int, "int"), 1, 1, "int(x)"),
    "log": _Function(_math("log", math.log), 1, 2, "log(x) or log(x, base)"),
    "log2": _Function(_math("log2", math.log2), 1, 1, "log2(x)"),
    # min and max take two or more numbers: there are no sequences to pass.
    "max": _Function(_math("max", max), 2, MAX_NODES, "max(a, b, ...)"),
    "min": _Function(_math("min", min), 2, MAX_NODES, "min(a, b, ...)"),
    "round": _Function(_round, 1, 2, "round(x) or round(x, ndigits)"),
    "round_to": _Function(_round_to, 2, 2, "round_to(x, multiple)"),
    "sqrt": _Function(_math("sqrt", math.sqrt), 1, 1, "sqrt(x)"),
}
ALLOWED_FUNCTIONS: tuple[str, ...] = tuple(sorted(_FUNCTIONS))


def _python_error_hint(exc: Exception) -> str:
    if isinstance(exc, ZeroDivisionError):
        return "guard the divisor, e.g. 'a / b if b != 0 else 0'"
    if isinstance(exc, OverflowError):
        return "the result is too large; check the magnitudes involved"
    if isinstance(exc, ValueError):
        return "check the argument is in the function's domain (sqrt and log need x > 0)"
    return "check the operand types"


def _apply(label: str, apply: Callable[..., object], args, column: int) -> object:
    """Run one operation, turning every failure into ExprError at `column`."""
    try:
        return _checked(apply(*args))
    except ExprError as err:
        err.column = column
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ExprError(f"{label}: {exc}", hint=_python_error_hint(exc), column=column) from exc
