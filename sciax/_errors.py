"""Exceptions raised by sciax.

Trace-time problems (bad arguments) raise subclasses of ``ValueError``/``TypeError`` at once;
run-time problems found in a result (a non-finite state) raise :class:`NonFiniteStateError`.
"""


class StateMismatchError(ValueError):
    """A state does not have the structure, shape or dtype its system expects."""


class NonFiniteStateError(RuntimeError):
    """A rollout produced NaN or Inf; the message names the first bad frame and its time."""

    def __init__(self, message: str, frame: int | None = None, time: float | None = None):
        super().__init__(message)
        self.frame = frame
        self.time = time
