"""How late a busy machine may run an event, for the few tests that bound a wall clock.

Tests wait on events (a line, a file, a port), not on clocks. Where the property itself is about time (a
timeout is honoured, a refusal comes before the work, a hang is cut), the test bounds the wall clock; the
bound is the time the property allows plus ``LATE_S``, and the failure it guards against is designed to
take much longer than that (a hang, or a stand-in told to wait minutes), so two busy cores cannot fail it
and the regression still does.

    from timing import LATE_S          # tests/ is on sys.path (tests/conftest.py sits there)
    assert time.monotonic() - t0 < 0.5 + LATE_S
"""

# Seen here: with both cores busy and a Slurm lab running real engines, a Python start-up took several
# seconds and a 0.5 s socket timeout fired up to two seconds late.
LATE_S = 20.0
