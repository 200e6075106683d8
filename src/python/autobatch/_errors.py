"""The exceptions of autobatch.find: one per exit status of the `autobatch` command
(docs/errors.md). Each carries the result known when it was raised (`.result`, possibly None)."""


class AutobatchError(Exception):
    """Base class. `result` is the Result of the search so far (None when none ran)."""

    exit_code = 1

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class UsageError(AutobatchError, ValueError):
    """Bad input (exit status 2): the message says what was expected and how to fix it."""

    exit_code = 2


class DoesNotFit(AutobatchError):
    """Nothing fits at the minimum micro-batch, or only above the limit less the margin (exit 3).
    `result.raw["result"]["min_batch_needs_at_least_bytes"]` says what the minimum needs."""

    exit_code = 3


class ModelError(AutobatchError, RuntimeError):
    """The model, its loss or its optimizer raised an error that is not out of memory (exit 1);
    the original exception is `__cause__`, the micro-batch it was raised at `micro_batch`."""

    exit_code = 1

    def __init__(self, message, result=None, micro_batch=0):
        super().__init__(message, result)
        self.micro_batch = micro_batch


class Cancelled(KeyboardInterrupt):
    """Ctrl-C during the search (exit 130): the trial in progress was abandoned, the model restored,
    and `result` holds the best verified micro-batch so far (status "cancelled")."""

    exit_code = 130

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result
