"""Reading what spied functions saw and gave, by name and by result, never by position.

A test that reads ``call.args[6]`` of a spy breaks (or, worse, reads another argument)
whenever the spied function's signature changes. ``calls`` binds each recorded call to
the function's signature, so a test reads ``calls(spy)[0]["bras"]``; a renamed or removed
parameter then fails by its name. Where a result says what the test checks, read the
result instead (``swept_batches``).
"""

from __future__ import annotations

import inspect


def calls(spy) -> list[dict]:
    """Each call that ``spy`` (``mocker.spy`` of a function) recorded, as {parameter name:
    argument}, the defaults the call left out included."""
    signature = inspect.signature(spy)
    bound = []
    for call in spy.call_args_list:
        arguments = signature.bind(*call.args, **call.kwargs)
        arguments.apply_defaults()
        bound.append(dict(arguments.arguments))
    return bound


def swept_batches(spy) -> list[tuple[int, int]]:
    """(B, R) of each sweep that ``spy`` (``mocker.spy`` of ``deferred.sweep`` or
    ``deferred._sweep_chunk``) recorded: the state vectors swept as one batch and the bras
    of each, the leading axes of the gradients (B, R, columns) that it returned."""
    return [gradients.shape[:2] for gradients in spy.spy_return_list]
