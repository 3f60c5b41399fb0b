"""Safe evaluation of the small expressions written in space files.

Space files hold derived values (``d_ff: "round_to(8/3 * d_model, 64)"``) and
constraints (``"loops * num_layers <= 24"``). Those files are shared between
people, so their strings are untrusted input and never reach ``eval``.

The safety model has three layers:

1. A whitelist, not a blacklist. ``parse`` runs ``ast.parse(mode="eval")`` and
   accepts only the node types ``_Compiler`` has a method for: constants,
   names, arithmetic, comparisons, ``and``/``or``/``not``, ``a if c else b``,
   tuple or list literals after ``in``, and calls to the plain names in
   ``ALLOWED_FUNCTIONS``. Attribute access, subscripts, comprehensions,
   lambdas, f-strings and the rest are refused by name, so no expression can
   reach an object's attributes, the builtins, or an import.
2. A bounded parse. Source length is capped before the parser sees it, and
   node count and nesting depth are capped during the walk, so a hostile
   string cannot make the parser or the validator run away.
3. A bounded evaluation. The checked tree becomes a tree of Python closures
   (no code object is ever compiled). Each operation checks its operand types
   and its result: ints stay below ``2**MAX_INT_BITS`` in magnitude, floats
   stay finite, strings stay under ``MAX_STR_LEN``, and ``**`` and ``round``
   refuse arguments whose result would blow up before computing it. The
   language has no loops, so evaluation costs at most ``MAX_NODES`` bounded
   operations.

Every failure, at parse or at evaluation, is an ``ExprError`` carrying a
message, a hint on how to fix it, and the column where it starts.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from archsearch.space.expr_ops import (
    _BINARY,
    _COMPARE,
    _FUNCTIONS,
    _REFUSED_OPERATORS,
    _UNARY,
    ALLOWED_FUNCTIONS,
    MAX_DEPTH,
    MAX_INT_BITS,
    MAX_NODES,
    MAX_ROUND_DIGITS,
    MAX_SOURCE_CHARS,
    MAX_STR_LEN,
    ExprError,
    _apply,
    _check_str_len,
    _checked,
    _Closure,
    _short_repr,
    _suggest,
    _type_name,
)

__all__ = [
    "ALLOWED_FUNCTIONS",
    "MAX_DEPTH",
    "MAX_INT_BITS",
    "MAX_NODES",
    "MAX_ROUND_DIGITS",
    "MAX_SOURCE_CHARS",
    "MAX_STR_LEN",
    "Expr",
    "ExprError",
    "evaluate",
    "order_derived",
    "parse",
]

_COMPREHENSION = (
    "comprehensions are not allowed",
    "expressions cannot loop; list the values explicitly, e.g. x in (1, 2, 3)",
)
_F_STRING = ("f-strings are not allowed", "join strings with +")
_YIELD = ("'await' and 'yield' are not allowed", "write a plain expression")
_REFUSED_NODES = {
    ast.Attribute: (
        "attribute access is not allowed",
        "read values by their axis name, e.g. 'd_model' rather than 'cfg.d_model'",
    ),
    ast.Subscript: ("subscripts are not allowed", "read values by their axis name"),
    ast.Slice: ("slices are not allowed", "read values by their axis name"),
    ast.Lambda: ("lambda is not allowed", "write the expression inline"),
    ast.ListComp: _COMPREHENSION,
    ast.SetComp: _COMPREHENSION,
    ast.DictComp: _COMPREHENSION,
    ast.GeneratorExp: _COMPREHENSION,
    ast.JoinedStr: _F_STRING,
    ast.FormattedValue: _F_STRING,
    ast.NamedExpr: (
        "assignment expressions (:=) are not allowed",
        "a derived value is named by its key in the space file",
    ),
    ast.Dict: ("dict literals are not allowed", "expressions compute a single value"),
    ast.Set: ("set literals are not allowed", "use a tuple after 'in', e.g. x in (1, 2)"),
    ast.Starred: ("starred arguments (*x) are not allowed", "pass arguments one by one"),
    ast.Tuple: (
        "tuple and list literals are only allowed after 'in'",
        "e.g. mixer in ('attn', 'hybrid')",
    ),
    ast.List: (
        "tuple and list literals are only allowed after 'in'",
        "e.g. mixer in ['attn', 'hybrid']",
    ),
    ast.Await: _YIELD,
    ast.Yield: _YIELD,
    ast.YieldFrom: _YIELD,
}
_OPERATOR_HINT = "allowed operators: + - * / // % ** == != < <= > >= in, not in, and, or, not"


def _line_starts(text: str) -> list[int]:
    """Offset of each line's first character, splitting lines as Python's tokenizer does."""
    return [0] + [match.end() for match in re.finditer(r"\r\n|\r|\n", text)]


class _Compiler:
    """Checks one parsed expression against the whitelist and builds its closures.

    `text` is `source` with leading whitespace stripped (what ast.parse saw);
    `offset` is how many characters were stripped, so columns point into the
    source the user wrote.
    """

    def __init__(self, source: str, text: str, offset: int) -> None:
        self.source = source
        self.text = text
        self.offset = offset
        self.line_starts = _line_starts(text)
        self.node_count = 0
        self.name_columns: dict[str, int] = {}

    def column(self, node: ast.AST) -> int | None:
        """Character column of `node` in the source; ast counts UTF-8 bytes per line."""
        lineno = getattr(node, "lineno", None)
        byte_col = getattr(node, "col_offset", None)
        if lineno is None or byte_col is None or not 0 < lineno <= len(self.line_starts):
            return None
        start = self.line_starts[lineno - 1]
        line = self.text[start:].encode("utf-8", errors="replace")
        chars = len(line[:byte_col].decode("utf-8", errors="ignore"))
        return self.offset + start + chars

    def refuse(self, node: ast.AST, message: str, hint: str) -> ExprError:
        return ExprError(message, hint=hint, column=self.column(node), source=self.source)

    def refuse_operator(self, node: ast.AST, op: ast.AST) -> ExprError:
        symbol = _REFUSED_OPERATORS[type(op)]
        hint = "use == or != to compare values" if symbol in ("is", "is not") else _OPERATOR_HINT
        return self.refuse(node, f"operator '{symbol}' is not allowed", hint)

    def compile(self, node: ast.AST, depth: int) -> _Closure:
        """Closure computing `node` from an env; `depth` is its nesting level."""
        self.node_count += 1
        if self.node_count > MAX_NODES:
            message = f"expression has more than {MAX_NODES} parts"
            raise self.refuse(node, message, "split it into derived values")
        if depth > MAX_DEPTH:
            message = f"expression nests deeper than {MAX_DEPTH} levels"
            raise self.refuse(node, message, "split it into derived values")
        method = self._METHODS.get(type(node))
        if method is None:
            generic = (f"{type(node).__name__} is not allowed", _OPERATOR_HINT)
            raise self.refuse(node, *_REFUSED_NODES.get(type(node), generic))
        return method(self, node, depth + 1)

    def constant(self, node: ast.Constant, depth: int) -> _Closure:
        value = node.value
        if isinstance(value, (bytes, complex)) or value is Ellipsis:
            message = f"{_type_name(value)} literals are not allowed"
            raise self.refuse(node, message, "use ints, floats, strings, True, False or None")
        try:
            _checked(value)
            if isinstance(value, str):
                _check_str_len(len(value))
        except ExprError as err:
            raise self.refuse(node, err.message, err.hint) from None
        return lambda env: value

    def name(self, node: ast.Name, depth: int) -> _Closure:
        name, column = node.id, self.column(node)
        if name.startswith("__"):
            message = f"names starting with '__' are not allowed: {name!r}"
            raise self.refuse(node, message, "use the axis name")
        self.name_columns.setdefault(name, column)

        def read(env: Mapping[str, object]) -> object:
            try:
                return env[name]
            except KeyError:
                hint = _suggest(name, env)
                raise ExprError(f"unknown name {name!r}", hint=hint, column=column) from None

        return read

    def unary(self, node: ast.UnaryOp, depth: int) -> _Closure:
        operand = self.compile(node.operand, depth)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if type(node.op) not in _UNARY:
            raise self.refuse_operator(node, node.op)
        (symbol, apply), column = _UNARY[type(node.op)], self.column(node)
        label = f"unary '{symbol}'"
        return lambda env: _apply(label, apply, (operand(env),), column)

    def binary(self, node: ast.BinOp, depth: int) -> _Closure:
        if type(node.op) not in _BINARY:
            raise self.refuse_operator(node, node.op)
        left, right = self.compile(node.left, depth), self.compile(node.right, depth)
        (symbol, apply), column = _BINARY[type(node.op)], self.column(node)
        label = f"'{symbol}'"
        return lambda env: _apply(label, apply, (left(env), right(env)), column)

    def boolean(self, node: ast.BoolOp, depth: int) -> _Closure:
        parts = [self.compile(value, depth) for value in node.values]
        # Python's own semantics: stop at the first decisive operand and return it.
        stop_when = not isinstance(node.op, ast.And)

        def short_circuit(env: Mapping[str, object]) -> object:
            for part in parts:
                value = part(env)
                if bool(value) is stop_when:
                    return value
            return value

        return short_circuit

    def compare(self, node: ast.Compare, depth: int) -> _Closure:
        left, column = self.compile(node.left, depth), self.column(node)
        links = []
        for op, comparator in zip(node.ops, node.comparators):
            if type(op) not in _COMPARE:
                raise self.refuse_operator(node, op)
            if isinstance(op, (ast.In, ast.NotIn)):
                right = self.choices(comparator, depth)
            else:
                right = self.compile(comparator, depth)
            symbol, apply = _COMPARE[type(op)]
            links.append((f"'{symbol}'", apply, right))

        def chain(env: Mapping[str, object]) -> bool:
            # a < b < c reads b once and stops at the first false link, as Python does.
            a = left(env)
            for label, apply, right in links:
                b = right(env)
                if not _apply(label, apply, (a, b), column):
                    return False
                a = b
            return True

        return chain

    def choices(self, node: ast.AST, depth: int) -> _Closure:
        """The tuple or list literal on the right of 'in'."""
        if not isinstance(node, (ast.Tuple, ast.List)):
            message = "'in' needs a tuple or list literal on its right"
            raise self.refuse(node, message, "e.g. mixer in ('attn', 'hybrid')")
        self.node_count += 1
        items = [self.compile(item, depth + 1) for item in node.elts]
        if all(isinstance(item, ast.Constant) for item in node.elts):
            values = tuple(item.value for item in node.elts)
            return lambda env: values
        return lambda env: tuple(item(env) for item in items)

    def conditional(self, node: ast.IfExp, depth: int) -> _Closure:
        test = self.compile(node.test, depth)
        body, orelse = self.compile(node.body, depth), self.compile(node.orelse, depth)
        return lambda env: body(env) if test(env) else orelse(env)

    def call(self, node: ast.Call, depth: int) -> _Closure:
        func, allowed = node.func, ", ".join(ALLOWED_FUNCTIONS)
        if not isinstance(func, ast.Name):
            if type(func) in _REFUSED_NODES:
                raise self.refuse(func, *_REFUSED_NODES[type(func)])
            raise self.refuse(node, "only named functions can be called", f"allowed: {allowed}")
        function = _FUNCTIONS.get(func.id)
        if function is None:
            message = f"function {func.id!r} is not allowed; allowed: {allowed}"
            raise self.refuse(func, message, "only these math helpers can be called")
        if node.keywords:
            hint = f"pass arguments by position: {function.signature}"
            raise self.refuse(node.keywords[0], "keyword arguments are not allowed", hint)
        if not function.min_args <= len(node.args) <= function.max_args:
            message = f"{func.id}() got {len(node.args)} arguments"
            raise self.refuse(node, message, f"call it as {function.signature}")
        args = [self.compile(arg, depth) for arg in node.args]
        label, apply, column = f"{func.id}()", function.apply, self.column(node)
        return lambda env: _apply(label, apply, [arg(env) for arg in args], column)

    _METHODS = {
        ast.Constant: constant,
        ast.Name: name,
        ast.UnaryOp: unary,
        ast.BinOp: binary,
        ast.BoolOp: boolean,
        ast.Compare: compare,
        ast.IfExp: conditional,
        ast.Call: call,
    }


@dataclass(frozen=True, kw_only=True)
class Expr:
    """A parsed, checked expression; build it with `parse`.

    ``source`` is the text as written, ``names`` the free variables it reads
    (in every branch, taken or not), which is what dependency ordering needs.
    Parse once, then call ``evaluate`` for each point of a space.
    """

    source: str
    names: frozenset[str]
    _run: _Closure = field(repr=False, compare=False)
    _name_columns: Mapping[str, int] = field(repr=False, compare=False)

    def evaluate(self, env: Mapping[str, object]) -> object:
        """Value of the expression with its names read from `env`.

        Raises ExprError for an unknown name (with a did-you-mean hint), a type
        mismatch, a division by zero, a math domain error, or a result over the limits.
        """
        try:
            return self._run(env)
        except ExprError as err:
            if err.source is None:
                err.source = self.source
            raise

    def __reduce__(self):
        # Closures do not pickle; an Expr travels (to Ray workers) as its source.
        return (parse, (self.source,))


def parse(source: str) -> Expr:
    """Parse and check `source` against the whitelist; raise ExprError if it fails.

    Results are cached by source, so parsing the same constraint for every
    point of a space costs one parse.
    """
    if not isinstance(source, str):
        raise ExprError(
            f"an expression must be a string, got {_type_name(source)} {_short_repr(source)}",
            hint="quote the expression in the space file",
        )
    return _parse_cached(source)


@functools.lru_cache(maxsize=4096)
def _parse_cached(source: str) -> Expr:
    if len(source) > MAX_SOURCE_CHARS:
        raise ExprError(
            f"expression is {len(source)} characters long; the limit is {MAX_SOURCE_CHARS}",
            hint="split it into derived values",
        )
    # ast.parse refuses leading whitespace ("unexpected indent"), which YAML
    # block strings often carry; strip it and shift columns back.
    text = source.lstrip()
    if not text:
        hint = "write a value, e.g. 4 * d_model"
        raise ExprError("expression is empty", hint=hint, source=source)
    offset = len(source) - len(text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        starts = _line_starts(text)
        known = exc.lineno is not None and 0 < exc.lineno <= len(starts) and exc.offset
        column = offset + starts[exc.lineno - 1] + exc.offset - 1 if known else None
        raise ExprError(
            f"invalid syntax: {exc.msg}",
            hint="expressions use Python syntax, e.g. round_to(8/3 * d_model, 64)",
            column=column,
            source=source,
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        # Null bytes and unencodable characters are ValueErrors; the C parser
        # signals runaway nesting with RecursionError or MemoryError.
        message = f"cannot parse expression: {exc}"
        raise ExprError(message, hint="remove unusual characters", source=source) from None
    compiler = _Compiler(source, text, offset)
    run = compiler.compile(tree.body, depth=1)
    return Expr(
        source=source,
        names=frozenset(compiler.name_columns),
        _run=run,
        _name_columns=dict(compiler.name_columns),
    )


def evaluate(source: str, env: Mapping[str, object]) -> object:
    """Parse `source` (cached) and evaluate it with names read from `env`."""
    return parse(source).evaluate(env)


def order_derived(derived: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """Names of `derived` in an order where each comes after every derived name it reads.

    `derived` maps a name to its expression; `known` are names available before
    any derived value is computed (the sampled axes). A name in both is ordered
    as derived. Independent names keep their order in `derived`, so the result
    is the same on every run.

    Raises ExprError for an expression that does not parse, a name that is
    neither known nor derived (with a did-you-mean hint), or a cycle, naming
    its path ("a -> b -> a").
    """
    exprs: dict[str, Expr] = {}
    for name, source in derived.items():
        try:
            exprs[name] = parse(source)
        except ExprError as err:
            message = f"derived {name!r}: {err.message}"
            raise ExprError(
                message, hint=err.hint, column=err.column, source=err.source
            ) from err
    available = set(known) | set(exprs)
    for name, expr in exprs.items():
        unknown = sorted(expr.names - available)
        if unknown:
            raise ExprError(
                f"derived {name!r} reads {unknown[0]!r}, which is neither an axis nor derived",
                hint=_suggest(unknown[0], available),
                column=expr._name_columns[unknown[0]],
                source=expr.source,
            )

    position = {name: index for index, name in enumerate(exprs)}

    def reads(name: str) -> list[str]:
        return sorted((n for n in exprs[name].names if n in exprs), key=position.__getitem__)

    # Depth-first, post-order, with an explicit stack so a long chain of
    # derived values cannot hit Python's recursion limit.
    order: list[str] = []
    done: set[str] = set()
    for root in exprs:
        if root in done:
            continue
        path, pending = [root], [iter(reads(root))]
        while pending:
            following = next(pending[-1], None)
            if following is None:
                finished = path.pop()
                pending.pop()
                done.add(finished)
                order.append(finished)
            elif following in path:
                cycle = path[path.index(following) :] + [following]
                raise ExprError(
                    f"derived values form a cycle: {' -> '.join(cycle)}",
                    hint="a derived value cannot depend on itself; make one of them an axis",
                )
            elif following not in done:
                path.append(following)
                pending.append(iter(reads(following)))
    return order
