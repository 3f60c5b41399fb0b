"""Behaviour of the safe expression evaluator behind derived values and constraints."""

from __future__ import annotations

import ast
import math
import operator
import pickle
import sys
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import archsearch.space.expr as expr_module
from archsearch.space.expr import (
    ALLOWED_FUNCTIONS,
    MAX_DEPTH,
    MAX_INT_BITS,
    Expr,
    ExprError,
    evaluate,
    order_derived,
    parse,
)

# One point of a typical space, shared by the behaviour tests.
ENV = {"d_model": 512, "num_heads": 8, "loops": 2, "num_layers": 12, "mixer": "hybrid"}

# derandomize: the same examples on every run; database=None: nothing written
# into a checkout other people are working in.
# No deadline: a loaded machine can stall any example past one (the limits are the evaluator's own).
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("2 + 3 * 4", 14, id="mul-binds-tighter-than-add"),
        pytest.param("(2 + 3) * 4", 20, id="parentheses"),
        pytest.param("2 ** 3 ** 2", 512, id="power-is-right-associative"),
        pytest.param("-2 ** 2", -4, id="power-binds-tighter-than-minus"),
        pytest.param("10 - 4 - 3", 3, id="minus-is-left-associative"),
        pytest.param("7 / 2", 3.5, id="true-division"),
        pytest.param("-7 // 2", -4, id="floor-division-rounds-down"),
        pytest.param("-7 % 3", 2, id="modulo-takes-divisor-sign"),
        pytest.param("2 ** -1", 0.5, id="negative-exponent"),
        pytest.param("1 + 0.5", 1.5, id="int-plus-float"),
        pytest.param("'ab' + 'c'", "abc", id="string-join"),
        pytest.param("'ab' * 2", "abab", id="string-repeat"),
        pytest.param("d_model * 4 // num_heads", 256, id="names"),
        pytest.param("not 0", True, id="not"),
        pytest.param("0 or 'x'", "x", id="or-returns-operand"),
        pytest.param("1 and 0", 0, id="and-returns-operand"),
        pytest.param("False and 1 / 0", False, id="and-short-circuits"),
        pytest.param("True or 1 / 0", True, id="or-short-circuits"),
        pytest.param("loops if mixer == 'hybrid' else 1", 2, id="conditional-true"),
        pytest.param("loops if mixer == 'attn' else 1", 1, id="conditional-false"),
        pytest.param("1 if True else 1 / 0", 1, id="conditional-is-lazy"),
        pytest.param("None", None, id="none"),
        pytest.param("  d_model + 1", 513, id="leading-whitespace"),
        pytest.param("(d_model +\n num_heads)", 520, id="multi-line"),
    ],
)
def test_arithmetic_and_logic(source, expected):
    result = evaluate(source, ENV)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("loops * num_layers <= 24", True, id="budget-constraint"),
        pytest.param("d_model % num_heads == 0", True, id="divisible-heads"),
        pytest.param("mixer == 'hybrid' or loops == 1", True, id="hybrid-or-no-loops"),
        pytest.param("1 < 2 < 3", True, id="chain-true"),
        pytest.param("1 < 3 < 2", False, id="chain-false-at-second-link"),
        pytest.param("3 > 2 >= 2 != 1 == 1", True, id="chain-mixed"),
        pytest.param("2 > 3 < 1 / 0", False, id="chain-short-circuits"),
        pytest.param("'attn' < 'hybrid'", True, id="strings-order"),
        pytest.param("1 == 1.0", True, id="int-equals-float"),
        pytest.param("'a' == 1", False, id="mixed-types-are-unequal"),
        pytest.param("mixer in ('attn', 'hybrid')", True, id="in-tuple"),
        pytest.param("mixer in ['attn']", False, id="in-list"),
        pytest.param("mixer not in ('attn',)", True, id="not-in"),
        pytest.param("d_model in (256, 2 * 256)", True, id="in-computed-choices"),
        pytest.param("0 < num_heads in (4, 8)", True, id="in-inside-chain"),
    ],
)
def test_comparisons(source, expected):
    assert evaluate(source, ENV) is expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("min(3, 1, 2)", 1, id="min"),
        pytest.param("max(3, 1.5)", 3, id="max"),
        pytest.param("abs(-4)", 4, id="abs"),
        pytest.param("round(2.567, 2)", 2.57, id="round-ndigits"),
        pytest.param("round(2.5)", 2, id="round-half-even"),
        pytest.param("round(1234, -2)", 1200, id="round-negative-ndigits"),
        pytest.param("int(3.9)", 3, id="int-truncates"),
        pytest.param("int('42')", 42, id="int-of-string"),
        pytest.param("float(3)", 3.0, id="float"),
        pytest.param("log(1)", 0.0, id="log"),
        pytest.param("log(8, 2)", 3.0, id="log-base"),
        pytest.param("log2(1024)", 10.0, id="log2"),
        pytest.param("exp(0)", 1.0, id="exp"),
        pytest.param("sqrt(16)", 4.0, id="sqrt"),
        pytest.param("ceil(2.1)", 3, id="ceil"),
        pytest.param("floor(-2.1)", -3, id="floor"),
        pytest.param("round_to(8/3 * d_model, 64)", 1344, id="round-to-swiglu-width"),
        pytest.param("round_to(1000, 64)", 1024, id="round-to-up"),
        pytest.param("round_to(1050, 64)", 1024, id="round-to-down"),
        pytest.param("round_to(96, 64)", 128, id="round-to-tie-goes-up"),
        pytest.param("round_to(160, 64)", 192, id="round-to-tie-goes-up-not-even"),
        pytest.param("round_to(10, 64)", 64, id="round-to-never-below-multiple"),
        pytest.param("round_to(-500, 8)", 8, id="round-to-negative"),
        pytest.param("round_to(0.7, 0.25)", 0.75, id="round-to-float-multiple"),
        pytest.param("round_to(2**200 + 1, 2)", 2**200 + 2, id="round-to-exact-big-int"),
        pytest.param("clamp(5, 0, 3)", 3, id="clamp-high"),
        pytest.param("clamp(-1, 0, 3)", 0, id="clamp-low"),
        pytest.param("clamp(2, 0, 3)", 2, id="clamp-inside"),
    ],
)
def test_functions(source, expected):
    result = evaluate(source, ENV)
    assert result == (pytest.approx(expected) if isinstance(expected, float) else expected)
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("1 / 0", id="division-by-zero"),
        pytest.param("5 % 0", id="modulo-by-zero"),
        pytest.param("0 ** -1", id="zero-to-negative-power"),
        pytest.param("'a' + 1", id="str-plus-int"),
        pytest.param("-'a'", id="negate-str"),
        pytest.param("'a' - 'b'", id="str-minus-str"),
        pytest.param("'a' < 1", id="order-str-and-int"),
        pytest.param("'%s' % 1", id="string-formatting"),
        pytest.param("sqrt(-1)", id="sqrt-domain"),
        pytest.param("log(0)", id="log-domain"),
        pytest.param("log(2, 1)", id="log-base-one"),
        pytest.param("exp(1000)", id="exp-overflow"),
        pytest.param("int('abc')", id="int-of-word"),
        pytest.param("(-8) ** 0.5", id="complex-result"),
        pytest.param("1e308 * 10", id="float-to-infinity"),
        pytest.param("round_to(100, 0)", id="round-to-zero-multiple"),
        pytest.param("round_to('a', 8)", id="round-to-str"),
        pytest.param("clamp(1, 3, 0)", id="clamp-lo-above-hi"),
        pytest.param("min(1, 'a')", id="min-of-mixed"),
        pytest.param("round(1.5, 0.5)", id="round-float-ndigits"),
    ],
)
def test_runtime_errors_are_expr_errors(source):
    with pytest.raises(ExprError) as caught:
        evaluate(source, ENV)
    assert caught.value.column is not None
    assert caught.value.hint


ATTACKS = [
    pytest.param("__import__('os').system('x')", id="import-os"),
    pytest.param("().__class__.__bases__[0].__subclasses__()", id="dunder-walk"),
    pytest.param("open('/etc/passwd')", id="open-file"),
    pytest.param("[x for x in range(10**9)]", id="list-comprehension"),
    pytest.param("sum(i for i in (1, 2))", id="generator"),
    pytest.param("lambda: 1", id="lambda"),
    pytest.param("(lambda: 1)()", id="call-lambda"),
    pytest.param("9**9**9", id="power-tower"),
    pytest.param("2**100000", id="huge-power"),
    pytest.param("1.5 ** 10**9", id="float-power-overflow"),
    pytest.param("'a'*10**9", id="string-repeat-bomb"),
    pytest.param("'a' * 999 + 'a' * 999", id="string-join-over-limit"),
    pytest.param("10**400*1.0", id="int-to-float-overflow"),
    pytest.param("1" + "0" * 100, id="huge-int-literal"),
    pytest.param("1e999", id="infinite-literal"),
    pytest.param("float('inf')", id="float-infinity"),
    pytest.param("int(1e300)", id="int-of-huge-float"),
    pytest.param("ceil(1e300)", id="ceil-of-huge-float"),
    pytest.param("2**255 * 2**255", id="int-product-over-limit"),
    pytest.param("round(1, -10**9)", id="round-huge-ndigits"),
    pytest.param("1 << 10**9", id="shift-bomb"),
    pytest.param("(" * 10_000 + "1" + ")" * 10_000, id="nested-parens-10k"),
    pytest.param("(" * 300 + "1" + ")" * 300, id="nested-parens-300"),
    pytest.param("-" * 900 + "1", id="nested-unary-900"),
    pytest.param("abs(" * 60 + "1" + ")" * 60, id="nested-calls-60"),
    pytest.param("1+" * 50_000 + "1", id="expression-100k-chars"),
    pytest.param("x<" * 499 + "x", id="too-many-nodes"),
    pytest.param("getattr(x, '__class__')", id="getattr"),
    pytest.param("eval('1')", id="eval"),
    pytest.param("exec('import os')", id="exec"),
    pytest.param("globals()", id="globals"),
    pytest.param("type(x)", id="type"),
    pytest.param("__builtins__", id="dunder-name"),
    pytest.param("x.__class__", id="attribute"),
    pytest.param("'{0.__class__}'.format(x)", id="str-format-method"),
    pytest.param("f'{x}'", id="f-string"),
    pytest.param("(y := 1)", id="walrus"),
    pytest.param("x[0]", id="subscript"),
    pytest.param("x[1:2]", id="slice"),
    pytest.param("max(*x)", id="starred"),
    pytest.param("round(x, ndigits=2)", id="keyword-argument"),
    pytest.param("max(**x)", id="double-starred"),
    pytest.param("{'a': 1}", id="dict"),
    pytest.param("{1, 2}", id="set"),
    pytest.param("(1, 2)", id="bare-tuple"),
    pytest.param("x is None", id="is"),
    pytest.param("x @ x", id="matmul"),
    pytest.param("~x", id="invert"),
    pytest.param("b'x'", id="bytes"),
    pytest.param("1j", id="complex"),
    pytest.param("...", id="ellipsis"),
    pytest.param("await x", id="await"),
    pytest.param("1\x00", id="null-byte"),
    pytest.param("", id="empty"),
    pytest.param("import os", id="statement"),
]


@pytest.mark.parametrize("source", ATTACKS)
def test_attacks_are_refused(source):
    with pytest.raises(ExprError) as caught:
        evaluate(source, {"x": 3})
    # A refusal tells the user how to fix it, not only that it failed.
    assert caught.value.hint


def test_module_imports_only_the_standard_library():
    # Space files are read by the CLI and the dashboards too: no torch, numpy, etc.
    import archsearch.space.expr_ops as ops_module

    imported = set()
    for module in (expr_module, ops_module):
        with open(module.__file__) as source:
            tree = ast.parse(source.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module != "archsearch.space.expr_ops":
                imported.add(node.module if node.level == 0 else "<relative import>")
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names)


def test_refusals_name_the_construct():
    with pytest.raises(ExprError, match="attribute access is not allowed") as caught:
        parse("d_model + cfg.width")
    assert caught.value.column == 10
    assert caught.value.source == "d_model + cfg.width"

    with pytest.raises(ExprError, match="function 'open' is not allowed; allowed: abs,") as caught:
        parse("open('/etc/passwd')")
    assert all(name in caught.value.message for name in ALLOWED_FUNCTIONS)

    with pytest.raises(ExprError, match="comprehensions are not allowed"):
        parse("[x for x in range(10**9)]")
    with pytest.raises(ExprError, match="subscripts are not allowed"):
        parse("x[0]")
    with pytest.raises(ExprError, match=r"clamp\(\) got 2 arguments"):
        parse("clamp(1, 2)")


def test_columns_count_characters_not_bytes():
    with pytest.raises(ExprError) as caught:
        parse("'é' + x.y")
    assert caught.value.column == 6


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ExprError, match="did you mean 'd_model'") as caught:
        evaluate("4 * d_modle", ENV)
    assert caught.value.column == 4
    assert caught.value.source == "4 * d_modle"


def test_names_are_the_free_variables_in_every_branch():
    expr = parse("a + b * min(c, 2) if d else e in (f, 'g')")
    # Function names are not variables; both branches count for dependency ordering.
    assert expr.names == frozenset("abcdef")
    assert parse("round_to(3, 2)").names == frozenset()


def test_expr_is_frozen_and_travels_as_its_source():
    expr = parse("round_to(8/3 * d_model, 64)")
    with pytest.raises(FrozenInstanceError):
        expr.source = "1"
    # Ray ships exprs and errors between processes by pickling them.
    copy = pickle.loads(pickle.dumps(expr))
    assert copy == expr
    assert copy.evaluate(ENV) == 1344
    with pytest.raises(ExprError) as caught:
        evaluate("1 / (loops - 2)", ENV)
    error = pickle.loads(pickle.dumps(caught.value))
    assert (error.message, error.hint, error.column, error.source) == (
        caught.value.message,
        caught.value.hint,
        caught.value.column,
        caught.value.source,
    )


def test_one_parse_evaluates_many_points():
    expr = parse("round_to(8/3 * d_model, 64)")
    for d_model in range(64, 4096, 64):
        width = expr.evaluate({"d_model": d_model})
        assert width % 64 == 0
        assert abs(width - 8 / 3 * d_model) <= 32
    assert parse("1 + d_model") is parse("1 + d_model")


def test_order_derived_puts_each_name_after_what_it_reads():
    derived = {"d_ff": "round_to(8/3 * d_model, 64)", "d_model": "num_heads * head_dim"}
    assert order_derived(derived, known=["num_heads", "head_dim"]) == ["d_model", "d_ff"]


def test_order_derived_keeps_independent_names_in_file_order():
    assert order_derived({"c": "x", "a": "x + 1", "b": "2"}, known=["x"]) == ["c", "a", "b"]


@pytest.mark.parametrize(
    ("derived", "cycle"),
    [
        pytest.param({"a": "a + 1"}, "a -> a", id="self"),
        pytest.param({"a": "b + 1", "b": "a + 1"}, "a -> b -> a", id="two"),
        pytest.param(
            {"x": "a", "a": "b", "b": "c", "c": "a * 2"}, "a -> b -> c -> a", id="behind-a-prefix"
        ),
    ],
)
def test_order_derived_names_the_cycle(derived, cycle):
    with pytest.raises(ExprError) as caught:
        order_derived(derived, known=[])
    assert caught.value.message == f"derived values form a cycle: {cycle}"


def test_order_derived_refuses_unknown_names_with_a_suggestion():
    with pytest.raises(ExprError, match="did you mean 'd_model'") as caught:
        order_derived({"d_ff": "4 * d_modle"}, known=["d_model"])
    assert caught.value.column == 4
    with pytest.raises(ExprError, match="derived 'd_ff': attribute access"):
        order_derived({"d_ff": "cfg.d_model"}, known=["d_model"])


@PROPERTY
@given(
    num_names=st.integers(min_value=1, max_value=12),
    edges=st.sets(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=30),
    insertion=st.randoms(use_true_random=False),
)
def test_order_derived_is_a_topological_order(num_names, edges, insertion):
    # Name i may read name j only when j < i, so the graph has no cycle.
    reads = {f"n{i}": {f"n{j}" for i2, j in edges if i2 == i and j < i} for i in range(num_names)}
    names = list(reads)
    insertion.shuffle(names)
    derived = {name: " + ".join(sorted(reads[name]) + ["base"]) for name in names}
    order = order_derived(derived, known=["base"])
    assert sorted(order) == sorted(names)
    position = {name: index for index, name in enumerate(order)}
    assert all(position[read] < position[name] for name in names for read in reads[name])


_TOKENS = [
    "1", "0", "9", "2.5", "x", "y", "'a'", "+", "-", "*", "/", "//", "%", "**", "(", ")",
    ",", " ", "<", "==", " in ", " not ", " and ", " or ", " if ", " else ", "min(",
    "round_to(", "clamp(", "sqrt(", "log(", "round(", "[", "]", ".", "__class__", "lambda",
    ":", "10**400", "9**9", "1e308", "'a'*999",
]  # fmt: skip


VALID_SOURCE = "min(x * 2, y) + 1"  # the fuzzer's positive control: it parses, and evaluates to 7


@PROPERTY
@example(VALID_SOURCE)
@given(st.text(max_size=300) | st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join))
def test_any_text_parses_or_raises_expr_error(source):
    try:
        expr = parse(source)
    except ExprError:
        assert source != VALID_SOURCE, "the positive control was refused"
        return
    if source == VALID_SOURCE:
        assert evaluate(source, {"x": 3, "y": 6}) == 7
    assert isinstance(expr, Expr)
    # Whatever parses also evaluates, or fails, within the limits.
    try:
        evaluate(source, {name: 3 for name in expr.names})
    except ExprError:
        pass


_OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}


def _arithmetic_trees():
    """Trees of small ints: an int leaf, ("neg", tree), or (op, tree, tree).

    The exponent of ** is a small int leaf, so the reference below stays cheap
    however deep the tree grows.
    """
    leaves = st.integers(min_value=-9, max_value=9)

    def extend(children):
        return st.one_of(
            st.tuples(st.just("neg"), children),
            st.tuples(st.sampled_from([op for op in _OPERATORS if op != "**"]), children, children),
            st.tuples(st.just("**"), children, st.integers(min_value=-3, max_value=3)),
        )

    return st.recursive(leaves, extend, max_leaves=12)


def _render(tree) -> str:
    if isinstance(tree, int):
        return str(tree) if tree >= 0 else f"({tree})"
    if tree[0] == "neg":
        return f"(-{_render(tree[1])})"
    op, left, right = tree
    return f"({_render(left)} {op} {_render(right)})"


class _OverLimit(Exception):
    """The reference arithmetic left the evaluator's limits."""


def _reference(tree):
    """Python's own arithmetic on the tree, held to the evaluator's limits."""
    if isinstance(tree, int):
        return tree
    if tree[0] == "neg":
        value = -_reference(tree[1])
    else:
        op, left, right = tree
        try:
            value = _OPERATORS[op](_reference(left), _reference(right))
        except ArithmeticError as exc:
            raise _OverLimit from exc
    if isinstance(value, complex):
        raise _OverLimit
    if isinstance(value, float) and not math.isfinite(value):
        raise _OverLimit
    if isinstance(value, int) and abs(value) >= 2**MAX_INT_BITS:
        raise _OverLimit
    return value


def _depth(tree) -> int:
    """Nesting depth of the rendered tree as ast sees it; (-3) is two levels."""
    if isinstance(tree, int):
        return 1 if tree >= 0 else 2
    return 1 + max(_depth(child) for child in tree[1:])


@PROPERTY
@given(_arithmetic_trees())
def test_arithmetic_agrees_with_python(tree):
    source = _render(tree)
    try:
        if _depth(tree) > MAX_DEPTH:
            raise _OverLimit
        expected = _reference(tree)
    except _OverLimit:
        with pytest.raises(ExprError):
            evaluate(source, {})
        return
    result = evaluate(source, {})
    assert type(result) is type(expected)
    assert result == expected
