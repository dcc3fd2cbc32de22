"""Inside the job: start the ranks, wait for readiness, report the endpoint, fail fast.

``prepare`` (pure: launch keys + allocation facts -> a LaunchPlan), ``srun`` (the step's srun
line, which the dry run prints too), ``ranks`` (ranks.sh from
templates/ranks.sh.j2), ``supervise`` (the loop that watches exit files, the srun step, rank start
and readiness) and ``launcher`` (the side effects around them; ``python -m envlayers launch --run-dir``).
Any rank that exits, the step dying, a rank that never starts, or a spent readiness budget ends the
job at once with an ``ENVLAYERS-ERROR:`` line, so no allocation idles on a dead server; so does a
serving rank that stops answering ``/health`` once live (``health``). In the replicas shape a replica
that exits or hangs after live is dropped and its node given back instead (``replicas``), and with
``SUCCESSORS`` a live job hands over to a successor job before its time limit (``successor``).
"""
