"""The shipped coding tasks: fix or write one function in `solution.py` so that hidden tests pass.

Each task has the text the agent reads, the starter `solution.py` it finds in its workspace (a
stub or a bug), the expert's `solution.py`, and hidden tests, each `assert solution.f(args) ==
<literal>` (or `is True` / `False` / `None`): the grader makes the call in the sandbox and compares
the value outside it (grader.py). The agent never sees the tests. Every
starter fails at least one test and the expert passes them all (tests/envs/test_code_sandbox.py
runs both in the sandbox).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodeTask:
    name: str
    prompt: str
    starter: str
    solution: str
    tests: tuple[str, ...]


TASKS: tuple[CodeTask, ...] = (
    CodeTask(
        name="add",
        prompt="Write add(a, b) that returns the sum of two integers.",
        starter="def add(a, b):\n    raise NotImplementedError\n",
        solution="def add(a, b):\n    return a + b\n",
        tests=(
            "assert solution.add(1, 2) == 3",
            "assert solution.add(-5, 5) == 0",
            "assert solution.add(10**12, 1) == 1000000000001",
        ),
    ),
    CodeTask(
        name="is_even",
        prompt="Fix is_even(n): it should return True when the integer n is even.",
        starter="def is_even(n):\n    return n % 2 == 1\n",
        solution="def is_even(n):\n    return n % 2 == 0\n",
        tests=(
            "assert solution.is_even(0) is True",
            "assert solution.is_even(7) is False",
            "assert solution.is_even(-4) is True",
        ),
    ),
    CodeTask(
        name="reverse_string",
        prompt="Write reverse(s) that returns the string s backwards.",
        starter="def reverse(s):\n    return s\n",
        solution="def reverse(s):\n    return s[::-1]\n",
        tests=(
            "assert solution.reverse('abc') == 'cba'",
            "assert solution.reverse('') == ''",
            "assert solution.reverse('racecar') == 'racecar'",
            "assert solution.reverse('ab c') == 'c ba'",
        ),
    ),
    CodeTask(
        name="factorial",
        prompt="Fix factorial(n) for integers n >= 0 (factorial(0) is 1).",
        starter="def factorial(n):\n    out = 0\n    for k in range(1, n + 1):\n        out *= k\n    return out\n",
        solution="def factorial(n):\n    out = 1\n    for k in range(1, n + 1):\n        out *= k\n    return out\n",
        tests=(
            "assert solution.factorial(0) == 1",
            "assert solution.factorial(1) == 1",
            "assert solution.factorial(5) == 120",
            "assert solution.factorial(10) == 3628800",
        ),
    ),
    CodeTask(
        name="fizzbuzz",
        prompt=(
            "Write fizzbuzz(n) that returns 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, "
            "'FizzBuzz' for multiples of both, and str(n) otherwise."
        ),
        starter="def fizzbuzz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n"
        "        return 'Buzz'\n    return str(n)\n",
        solution="def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n"
        "        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n",
        tests=(
            "assert solution.fizzbuzz(3) == 'Fizz'",
            "assert solution.fizzbuzz(10) == 'Buzz'",
            "assert solution.fizzbuzz(30) == 'FizzBuzz'",
            "assert solution.fizzbuzz(7) == '7'",
        ),
    ),
    CodeTask(
        name="max_of_list",
        prompt="Fix largest(xs): it should return the largest number of a non-empty list.",
        starter="def largest(xs):\n    best = 0\n    for x in xs:\n        if x > best:\n            best = x\n"
        "    return best\n",
        solution="def largest(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n"
        "            best = x\n    return best\n",
        tests=(
            "assert solution.largest([1, 5, 3]) == 5",
            "assert solution.largest([-3, -1, -2]) == -1",
            "assert solution.largest([7]) == 7",
        ),
    ),
    CodeTask(
        name="count_vowels",
        prompt="Write count_vowels(s): how many of the letters of s are vowels (a, e, i, o, u, any case).",
        starter="def count_vowels(s):\n    return 0\n",
        solution="def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')\n",
        tests=(
            "assert solution.count_vowels('hello') == 2",
            "assert solution.count_vowels('AEIOU') == 5",
            "assert solution.count_vowels('rhythm') == 0",
            "assert solution.count_vowels('') == 0",
        ),
    ),
    CodeTask(
        name="is_palindrome",
        prompt="Write is_palindrome(s): True when s reads the same backwards, ignoring case and spaces.",
        starter="def is_palindrome(s):\n    return s == s[::-1]\n",
        solution="def is_palindrome(s):\n    t = s.replace(' ', '').lower()\n    return t == t[::-1]\n",
        tests=(
            "assert solution.is_palindrome('abba') is True",
            "assert solution.is_palindrome('Never odd or even') is True",
            "assert solution.is_palindrome('abc') is False",
        ),
    ),
    CodeTask(
        name="sum_digits",
        prompt="Write sum_digits(n): the sum of the decimal digits of the integer n (ignore the sign).",
        starter="def sum_digits(n):\n    return sum(int(c) for c in str(n))\n",
        solution="def sum_digits(n):\n    return sum(int(c) for c in str(abs(n)))\n",
        tests=(
            "assert solution.sum_digits(123) == 6",
            "assert solution.sum_digits(0) == 0",
            "assert solution.sum_digits(-45) == 9",
        ),
    ),
    CodeTask(
        name="dedupe",
        prompt="Write dedupe(xs): the items of the list xs without repeats, in order of first appearance.",
        starter="def dedupe(xs):\n    return list(set(xs))\n",
        solution="def dedupe(xs):\n    seen = []\n    for x in xs:\n        if x not in seen:\n"
        "            seen.append(x)\n    return seen\n",
        tests=(
            "assert solution.dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]",
            "assert solution.dedupe([]) == []",
            "assert solution.dedupe(['b', 'a', 'b']) == ['b', 'a']",
        ),
    ),
    CodeTask(
        name="fibonacci",
        prompt="Fix fib(n): the n-th Fibonacci number with fib(0) = 0 and fib(1) = 1.",
        starter="def fib(n):\n    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        solution="def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        tests=(
            "assert solution.fib(0) == 0",
            "assert solution.fib(1) == 1",
            "assert solution.fib(10) == 55",
            "assert solution.fib(30) == 832040",
        ),
    ),
    CodeTask(
        name="word_count",
        prompt="Write word_count(text): a dict from each whitespace-separated word to how often it occurs.",
        starter="def word_count(text):\n    return {}\n",
        solution="def word_count(text):\n    counts = {}\n    for word in text.split():\n"
        "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
        tests=(
            "assert solution.word_count('a b a') == {'a': 2, 'b': 1}",
            "assert solution.word_count('') == {}",
            "assert solution.word_count('x  x\\nx') == {'x': 3}",
        ),
    ),
)
"""The task set, in a fixed order (a seed picks one: `CodeSandboxEnv`)."""

TASKS_BY_NAME = {task.name: task for task in TASKS}
