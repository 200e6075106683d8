"""The exceptions of autobatch.find: one per exit status of the `autobatch` command
(docs/errors.md). Each carries the result known when it was raised (`.result`, possibly None)."""

from __future__ import annotations

from typing import Any

from . import _core

# The `autobatch` command's exit statuses (include/autobatch/vocabulary/exit_codes.h).
_EXIT = _core.EXIT_CODES


class AutobatchError(Exception):
    """Base class of autobatch's errors (all but Cancelled, which is a KeyboardInterrupt).

    Attributes:
        result: the Result of the search so far (what it verified before the error), or None
            when no search ran (a bad argument, a check_batch trial).
        exit_code (int): the `autobatch` command's exit status for this error (docs/errors.md).

    Examples:
        >>> try:
        ...     autobatch.find(model, batch, memory_limit="64MiB")
        ... except autobatch.AutobatchError as e:
        ...     print(type(e).__name__, e.exit_code, e)
    """

    exit_code = _EXIT["runtime_error"]

    def __init__(self, message: str, result: Any = None) -> None:
        """Keeps `message` as the exception's text and `result` (a Result or None)."""
        super().__init__(message)
        self.result = result


class UsageError(AutobatchError, ValueError):
    """Bad input (exit status 2): the message says what was expected, what was given, and how to
    fix it.

    Raised before any trial for a bad argument (a memory_limit of 0, a float min_batch, an
    unknown option, a target_batch that is not a multiple of world_size, ...) and for calls
    autobatch cannot serve (a second search running in the process, a call inside
    torch.inference_mode(), a TorchScript model). Also a ValueError, so `except ValueError`
    catches it. `.result` is None.

    Examples:
        >>> autobatch.find(model, batch, memory_limit=0)
        Traceback (most recent call last):
        autobatch.UsageError: memory_limit: expected more than 0 bytes, but got 0; ...
    """

    exit_code = _EXIT["usage"]


class DoesNotFit(AutobatchError):
    """Nothing fits (exit status 3): not even `min_batch` fits under the memory limit, or only
    above the limit less the margin, or a trial or time budget ran out before any size was
    verified.

    With find(eval=...), also when the training state does not fit beside evaluation or no
    evaluation batch fits under the margin. `result` holds the search's trials;
    `result.raw["result"]["min_batch_needs_at_least_bytes"]` says what the minimum needs.

    Examples:
        >>> try:
        ...     autobatch.find(model, batch, memory_limit="1MiB")
        ... except autobatch.DoesNotFit as e:
        ...     print(e.result.raw["result"]["min_batch_needs_at_least_bytes"])
    """

    exit_code = _EXIT["does_not_fit"]


class ModelError(AutobatchError, RuntimeError):
    """The model, its loss or its optimizer raised an error that is not out of memory (exit 1).

    The original exception is `__cause__`; `micro_batch` is the micro-batch (samples) it was
    raised at (0 when unknown); `result` holds the sizes verified before it (the search stops
    there as if cancelled), or None from check_batch. Also a RuntimeError.

    Examples:
        >>> try:
        ...     autobatch.find(model, batch)
        ... except autobatch.ModelError as e:
        ...     print(e.micro_batch, repr(e.__cause__))
    """

    exit_code = _EXIT["runtime_error"]

    def __init__(self, message: str, result: Any = None, micro_batch: int = 0) -> None:
        """Keeps `message`, `result` (a Result or None) and `micro_batch` (samples, 0: none)."""
        super().__init__(message, result)
        self.micro_batch = micro_batch


class Cancelled(KeyboardInterrupt):
    """Ctrl-C during the search (exit status 130).

    The trial in progress was abandoned and the model restored; `result` holds the best
    verified micro-batch so far (status "cancelled"), or None from check_batch and
    check_eval_batch. A KeyboardInterrupt, not an AutobatchError, so code that lets Ctrl-C end
    the program still does.

    Examples:
        >>> try:
        ...     result = autobatch.find(model, batch)
        ... except autobatch.Cancelled as e:
        ...     result = e.result  # the best size verified before Ctrl-C
    """

    exit_code = _EXIT["interrupted"]

    def __init__(self, message: str, result: Any = None) -> None:
        """Keeps `message` as the exception's text and `result` (a Result or None)."""
        super().__init__(message)
        self.result = result
