"""The one exception family the CLI turns into a clear one-line error, and the launcher's failure inside the job."""

from __future__ import annotations


class EnvLayersError(Exception):
    """An error meant for the operator.

    ``where`` is a ``file:line`` or a key path, ``hint`` says how to fix it.
    ``str(err)`` is the single line the CLI prints.
    """

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"; hint: {self.hint}"
        return text


class LayerSyntaxError(EnvLayersError):
    """A statement in an env layer that is not an accepted assignment."""


class CatalogError(EnvLayersError):
    """setups.yaml or the layer catalog is malformed, or a name is unknown."""


class StackError(EnvLayersError):
    """A layer stack that cannot be rendered faithfully."""


class EdfError(EnvLayersError):
    """A container definition that is invalid or cannot be installed."""


class KeyValueError(EnvLayersError):
    """A launch key whose value its type refuses (``envlayers.keys``): ``key`` names it, ``where`` is the
    ``file:line`` of the assignment when the merged Env is known (the login node), else ``None`` (in the job).

    ``str(err)`` is ``file:line: KEY: message; hint: ...``. Inside the job it ends the launch before srun
    like a :class:`LaunchFailure` (``rank`` and ``lines`` are for that)."""

    rank = None
    lines: tuple[str, ...] = ()

    def __init__(self, key: str, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message, where=where, hint=hint)
        self.key = key

    def __str__(self) -> str:
        head = f"{self.where}: {self.key}" if self.where else self.key
        text = f"{head}: {self.message}"
        if self.hint:
            text += f"; hint: {self.hint}"
        return text


class TopologyError(EnvLayersError):
    """A deployment shape that wastes or over-asks GPUs."""


class SlurmError(EnvLayersError):
    """Slurm refused or failed a request."""


class SlurmUnreachable(SlurmError):
    """Slurm's controller did not answer (stopped, restarting, overloaded). Not bad input: the same
    command may work a minute later, so the exit status is 75 (sysexits' EX_TEMPFAIL), not 2."""

    exit_code = 75


class LaunchFailure(Exception):
    """Inside the job, the launch stops: the message is printed as ENVLAYERS-ERROR; ``rank`` names the rank
    whose log tail explains it."""

    def __init__(self, message: str, rank: int | None = None, lines: tuple[str, ...] = ()):
        super().__init__(message)
        self.rank = rank
        self.lines = lines  # what the launch had to say before it stopped


class StepSignalled(LaunchFailure):
    """The ranks' step ended because a signal reached every rank (``scancel --signal=TERM JOB`` signals the
    steps and not the batch script): the end of a serving job, recorded as that signal, not as a failure."""

    def __init__(self, message: str, signum: int, live: bool):
        super().__init__(message)
        self.signum, self.live = signum, live
