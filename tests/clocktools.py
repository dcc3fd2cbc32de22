"""The tests' one fake clock: time that passes only when slept, so no unit test sleeps for real."""

from __future__ import annotations


class Clock:
    """Fake monotonic time, reading 1000.0 at first and moving only when slept (or set through ``t``, alias
    ``now``). ``at(t, fn)`` runs ``fn`` once a sleep reaches 1000 + ``t``; every sleep is kept in ``slept``.
    Call it (or ``monotonic``) for the time; ``watch()`` is the same clock as ops.watch.Clock."""

    def __init__(self):
        self.t = 1000.0
        self.events: list[tuple[float, object]] = []
        self.slept: list[float] = []

    @property
    def now(self) -> float:
        return self.t

    @now.setter
    def now(self, value: float) -> None:
        self.t = value

    def __call__(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def at(self, t: float, fn) -> None:
        self.events.append((1000.0 + t, fn))

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s
        due = [e for e in self.events if e[0] <= self.t]
        self.events = [e for e in self.events if e[0] > self.t]
        for _, fn in sorted(due, key=lambda e: e[0]):
            fn()

    def watch(self):
        from envlayers.ops import watch

        return watch.Clock(monotonic=self.monotonic, sleep=self.sleep)
