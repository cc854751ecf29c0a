"""A calculator tool for math agents: arithmetic on numbers, evaluated by walking the `ast` of
the expression (no eval/exec: only numbers, + - * / // % **, unary signs and parentheses pass).

Results are exact where they can be (integers and `Fraction`s: "1/3 + 1/6" is "1/2"), so that the
policy reads the same answer a `\\boxed{}` solution holds.

Bounded before it computes, so every call takes microseconds whatever the model writes: the
expression is at most 200 characters, every number it meets (literal, intermediate or result,
numerator and denominator alike) has at most 100 digits, and a power is refused up front when
its result would not fit (its size is known from the operands' bit lengths without computing
it). Checking afterwards is not enough: big-integer arithmetic holds the GIL, so
"(((1/10**64)**64)**64)**64" (a 16-million-digit denominator) once froze the agent's event loop
for 13 s, past any tool timeout, and one more "**64" ran away in memory.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100
_MAX_BITS = 333  # 10**100 < 2**333: a number of at most 100 digits has at most 333 bits
_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Fraction], Fraction]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# A word-level tokenizer (the tiny model's) decodes "12.5 ** 2" as "1 2 . 5 * * 2". Joined back,
# only what would otherwise be a syntax error: two numbers or operators are never just adjacent.
_RESPACE = [
    (re.compile(r"(?<=\d)\s+(?=[\d.])|(?<=\.)\s+(?=\d)"), ""),
    (re.compile(r"\*\s+\*"), "**"),
    (re.compile(r"/\s+/"), "//"),
]


def _bits(value: Fraction) -> int:
    return max(value.numerator.bit_length(), value.denominator.bit_length())


def _fits(value: Fraction) -> bool:
    """At most MAX_DIGITS digits above and below the line; the digits are counted only once the
    bit length shows it is cheap (a 333-bit number has at most 101 digits)."""
    return _bits(value) <= _MAX_BITS and max(len(str(abs(value.numerator))), len(str(value.denominator))) <= MAX_DIGITS


def _bounded(value: Fraction) -> Fraction:
    if not _fits(value):
        raise ValueError(f"numbers must have at most {MAX_DIGITS} digits")
    return value


def _value(node: ast.AST) -> Fraction:
    # bool is an int subclass, but True is no number here
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if not math.isfinite(node.value):
            raise ValueError(f"numbers must have at most {MAX_DIGITS} digits")
        return _bounded(Fraction(str(node.value)))  # via str: 0.1 is 1/10, not the nearest binary fraction
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponents must be integers of at most {MAX_EXPONENT}")
            if (_bits(left) - 1) * abs(right) > _MAX_BITS:  # |p**e| >= 2**((bits-1)*e): too big, not computed
                raise ValueError(f"result has more than {MAX_DIGITS} digits")
        # operands of at most 333 bits: any of these operations is cheap; only its result is checked
        result = _BINARY[type(node.op)](left, right)
        if not _fits(result):
            raise ValueError(f"result has more than {MAX_DIGITS} digits")
        return result
    raise ValueError(f"unsupported element {type(node).__name__!s} (numbers, + - * / // % ** and parentheses only)")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; ValueError (one line) for anything else."""
    if len(expression) > 4 * MAX_EXPRESSION_CHARS:  # before any work on it (spaces are joined below)
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    for spaced, joined in _RESPACE:
        text = spaced.sub(joined, text)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    try:
        return _value(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def format_number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "(3 + 4) * 12 / 7".

    Args:
        expression: numbers with + - * / // % ** and parentheses.
    """
    try:
        return format_number(evaluate(expression))
    except ValueError as e:
        return f"Error: {e}"
