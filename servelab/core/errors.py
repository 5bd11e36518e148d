"""The one error type for user mistakes.

A ``UserError`` says that something the user gave (a file, a CLI option, a spec string, a
policy parameter) is wrong, and its message names that input: ``path:line: ...``,
``--slo 'ttft:2,ttft:3': ...``, ``policy 'static' parameter 'max_wait_s': ...``. It is raised
where the rule lives (the spec parser, a Config, a loader), never invented by the CLI, and
the CLI prints it as one line with exit status 2. Any other exception is a bug in servelab
and keeps its traceback.

It subclasses ``ValueError`` so that code and tests that expect a ``ValueError`` from bad
values keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad user input; the message names the input (file:line, option, parameter or spec)."""


class UnknownNameError(UserError, KeyError):
    """A name looked up in a catalog (a GPU, a model) that is not there.

    Also a ``KeyError``, as a dictionary lookup's miss is, so ``except KeyError`` callers keep
    working; its text is the plain message, not ``KeyError``'s quoted repr.
    """

    __str__ = Exception.__str__


def shown(value: object, width: int = 40) -> str:
    """``repr(value)`` cut to ``width`` characters, so one bad cell cannot flood an error line."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
