"""Hidden-test grading of a workspace's `solution.py`: the solution runs in the episode's sandbox,
the verdict is reached outside it.

Each hidden test is `assert solution.f(args) == <literal>` (or `is True` / `is False` / `is None`).
Only the calls travel into the sandbox: one sandboxed Python process (`python -I`, so that a `json.py`
or `signal.py` in the workspace cannot stand in for the module the runner imports) imports
`solution.py` and makes each call under its own alarm, then prints one line: a fresh random marker
and the `repr` of each call's value (None where it raised). The expected values never leave this
process: each repr is read back with `ast.literal_eval` and compared here. Whatever the solution
does inside its process (print the marker line itself, exit early, return an object equal to
everything, patch the runner), it earns a test only by returning a plain value equal to the answer
it never sees. The calls travel in the command, not as a file, so the agent never finds them in
its workspace.
"""

from __future__ import annotations

import ast
import json
import secrets
from typing import Any

from roll.agentic.sandbox import Sandbox

PER_TEST_S = 2  # alarm per hidden test inside the grading process
_SINGLETONS = (True, False, None)  # the only values a test may compare with `is`

_RUNNER = """
import importlib.util, json, signal, sys
MARK, CALLS, PER_TEST = {mark!r}, {calls!r}, {per_test}
def _timeout(*_):
    raise TimeoutError("test timed out")
signal.signal(signal.SIGALRM, _timeout)
sys.path.insert(0, ".")
shown = [None] * len(CALLS)
try:
    signal.alarm(PER_TEST)
    spec = importlib.util.spec_from_file_location("solution", "solution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signal.alarm(0)
except BaseException:
    signal.alarm(0)
    CALLS = ()
for n, call in enumerate(CALLS):
    try:
        signal.alarm(PER_TEST)
        shown[n] = repr(eval(call, {{"solution": module}}))
    except BaseException:
        pass
    finally:
        signal.alarm(0)
print(MARK + json.dumps(shown), flush=True)
"""


def parse_test(test: str) -> tuple[str, str, Any]:
    """`assert solution.f(args) == <literal>` -> ("solution.f(args)", "==", literal); any other
    shape is a ValueError naming the test (the grader compares values, never runs the assertion)."""
    try:
        body = ast.parse(test).body
    except SyntaxError as e:
        raise ValueError(f"hidden test {test!r} does not parse: {e}") from None
    node = body[0].test if len(body) == 1 and isinstance(body[0], ast.Assert) else None
    if not isinstance(node, ast.Compare) or len(node.ops) != 1 or not _calls_solution(node.left):
        raise ValueError(f"hidden test {test!r} is not 'assert solution.<f>(...) == <literal>'")
    op = {ast.Eq: "==", ast.Is: "is"}.get(type(node.ops[0]))
    try:
        expected = ast.literal_eval(node.comparators[0])
    except ValueError:
        raise ValueError(f"hidden test {test!r}: the expected value is not a literal") from None
    if op is None or (op == "is" and not any(expected is s for s in _SINGLETONS)):
        raise ValueError(f"hidden test {test!r}: compare with == (or `is` True/False/None)")
    return ast.unparse(node.left), op, expected


def _calls_solution(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "solution"


def grade(sandbox: Sandbox, tests: tuple[str, ...]) -> list[bool]:
    """Which hidden `tests` the workspace's solution.py passes (all False if grading broke)."""
    parsed = [parse_test(test) for test in tests]
    mark = f"@@grade-{secrets.token_hex(8)}@@"
    runner = _RUNNER.format(mark=mark, calls=[call for call, _, _ in parsed], per_test=PER_TEST_S)
    result = sandbox.run([sandbox.python, "-I", "-c", runner])
    shown = _marked(result.output, mark, len(tests))
    return [_passes(value, op, expected) for value, (_, op, expected) in zip(shown, parsed)]


def _marked(output: str, mark: str, count: int) -> list[Any]:
    """The reprs on the last marked line, or Nones."""
    for line in reversed(output.splitlines()):
        if line.startswith(mark):
            try:
                shown = json.loads(line[len(mark) :])
            except ValueError:
                break
            if isinstance(shown, list) and len(shown) == count:
                return shown
            break
    return [None] * count


def _passes(shown: Any, op: str, expected: Any) -> bool:
    """Whether the value a call showed (its repr) is the expected one; only a plain value counts."""
    if not isinstance(shown, str):
        return False
    try:
        value = ast.literal_eval(shown)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False  # not a plain value (an object of the solution's), or too big or deep to read
    return value is expected if op == "is" else value == expected
