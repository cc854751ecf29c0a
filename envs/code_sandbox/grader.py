"""Hidden-test grading of a workspace's `solution.py`, run inside the episode's sandbox.

One sandboxed Python process imports `solution.py` from the workspace and runs each hidden test
(a statement that sees the module as `solution`) under its own alarm; it prints one line: a fresh
random marker, then a JSON list of booleans. Only a line with the marker counts, so a solution
that exits early or prints its own verdict passes nothing. The tests travel in the command, not
as a file, so the agent never finds them in its workspace.
"""

from __future__ import annotations

import json
import secrets

from roll.agentic.sandbox import Sandbox

PER_TEST_S = 2  # alarm per hidden test inside the grading process

_RUNNER = """
import importlib.util, json, signal, sys
MARK, TESTS, PER_TEST = {mark!r}, {tests!r}, {per_test}
def _timeout(*_):
    raise TimeoutError("test timed out")
signal.signal(signal.SIGALRM, _timeout)
sys.path.insert(0, ".")
try:
    signal.alarm(PER_TEST)
    spec = importlib.util.spec_from_file_location("solution", "solution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signal.alarm(0)
except BaseException as e:
    signal.alarm(0)
    print(MARK + json.dumps([False] * len(TESTS)), flush=True)
    raise SystemExit(0)
results = []
for test in TESTS:
    try:
        signal.alarm(PER_TEST)
        exec(test, {{"solution": module}})
        results.append(True)
    except BaseException:
        results.append(False)
    finally:
        signal.alarm(0)
print(MARK + json.dumps(results), flush=True)
"""


def grade(sandbox: Sandbox, tests: tuple[str, ...]) -> list[bool]:
    """Which hidden `tests` the workspace's solution.py passes (all False if grading broke)."""
    mark = f"@@grade-{secrets.token_hex(8)}@@"
    result = sandbox.run_python(_RUNNER.format(mark=mark, tests=list(tests), per_test=PER_TEST_S))
    for line in reversed(result.output.splitlines()):
        if line.startswith(mark):
            try:
                passed = json.loads(line[len(mark) :])
            except json.JSONDecodeError:
                break
            if isinstance(passed, list) and len(passed) == len(tests):
                return [item is True for item in passed]
            break
    return [False] * len(tests)
