"""The ``slurm_lab`` fixture: a real local Slurm cluster (cluster/slurm-lab) for end-to-end tests.

Use it from tests under tests/slurm/ and mark them ``@pytest.mark.slurm``::

    @pytest.mark.slurm
    def test_something(slurm_lab):
        jobid = slurm_lab.submit("srun hostname\\n", "--nodes=2", "-p", "mi300")
        assert slurm_lab.wait_job(jobid, timeout_s=30) == "COMPLETED"
        print(slurm_lab.job_output(jobid))

When the lab cannot start here (not root, no apt, ...) the tests are skipped with the reason, unless
ENVLAYERS_REQUIRE_SLURM=1 (CI), where they fail instead.
"""

from __future__ import annotations

import pytest

import labtools
from labtools import unavailable


@pytest.fixture(scope="session")
def slurm_lab():
    """A running lab with at least 3 nodes (n1..n3), shared by the whole session.

    Yields labtools.Lab: .env (SLURM_CONF, ENVLAYERS_LAB_DIR, PATH: merge into a subprocess env),
    .nodes ({'n1': '10.200.0.11', ...}), .mode ('netns' | 'nonetns'), .workdir, .lab_dir, .conf,
    .submit(script_text, *sbatch_args, cwd=None, env=None) -> jobid,
    .wait_job(jobid, timeout_s=60.0) -> final JobState, .wait_running(jobid), .job_info(jobid),
    .job_output(jobid), .cancel(jobid), .track(jobid), .run(argv).
    """
    try:
        lab = labtools.acquire_lab(nodes=3)
    except labtools.LabUnavailable as exc:
        unavailable(str(exc))
    try:
        yield lab
    finally:
        lab.cancel_all_submitted()
        labtools.release_lab(lab)


@pytest.fixture(scope="module")
def lab4():
    """A second lab with 4 nodes (n1..n4), for the catalog's 4-node models (glm53, kimi27sglang): its own
    folder, subnet and ports beside the session lab, up only while the module that asks for it runs, so
    the session lab and the tests that know its nodes stay as they are. Needs network namespaces."""
    try:
        lab = labtools.acquire_lab(nodes=4, lab_dir=labtools.default_lab_dir() / "four-nodes")
    except labtools.LabUnavailable as exc:
        unavailable(str(exc))
    try:
        if lab.mode != "netns":
            unavailable(f"the 4-node lab runs in {lab.mode} mode; its tests need network namespaces")
        yield lab
    finally:
        lab.cancel_all_submitted()
        labtools.release_lab(lab)


@pytest.fixture
def netns_lab(slurm_lab):
    """slurm_lab, for tests that need each node to have its own address and hostname."""
    if slurm_lab.mode != "netns":
        unavailable(f"lab runs in {slurm_lab.mode} mode (all nodes share 127.0.0.1); needs network namespaces")
    return slurm_lab


@pytest.fixture(autouse=True)
def _lab_clean_after_each_test(request):
    """A test that fails half-way must not leave its job holding nodes for the next test: after each test
    on the lab, every job still in the lab's queue is cancelled (the lab is this session's own), and the
    next test starts once Slurm has let them go (bounded).

    A test whose job was shrunk (``scontrol update JobId=J NodeList=...``, as the replicas shape does when a
    replica dies) leaves Slurm 22.05's node selection with stale state: slurmctld logs "unable to update job's
    core use information due to job resizing", every node shows idle, and yet a later two-node job is placed
    on n[1,3] instead of n[1-2], which the tests that name their nodes depend on. ``scontrol reconfigure``
    rebuilds that state from the jobs, so it is run after such a test (seen in slurmctld's log)."""
    lab = None
    log_size = 0
    if "slurm_lab" in request.fixturenames or "netns_lab" in request.fixturenames:
        lab = request.getfixturevalue("slurm_lab")
        log_size = _slurmctld_log(lab).stat().st_size if _slurmctld_log(lab).exists() else 0
    yield
    if lab is None:
        return
    import time

    queued = lab.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    if queued:
        lab.run(["scancel", *queued], check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and lab.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
            time.sleep(0.2)
    if _resized_since(lab, log_size):
        lab.run(["scontrol", "reconfigure"], check=False)


def _slurmctld_log(lab):
    return lab.lab_dir / "log" / "slurmctld.log"


def _resized_since(lab, offset: int) -> bool:
    """Whether slurmctld logged a job's node list being changed after byte ``offset`` of its log."""
    try:
        with open(_slurmctld_log(lab), "rb") as fh:
            fh.seek(offset)
            return b"_update_job: setting nodes to" in fh.read()
    except OSError:
        return False


@pytest.fixture(scope="module")
def two_users(slurm_lab):
    """Two throw-away users for the module, ``victim`` and ``attacker`` (usertools.Users), made with their
    home folders and removed after, even when a test fails. They run the launcher from a root-owned,
    world-readable copy of this checkout (usertools.user_python) and submit to the session's lab; their jobs
    are cancelled before they are removed. Root only: elsewhere the tests are skipped with the reason
    (a failure under ENVLAYERS_REQUIRE_SLURM=1)."""
    import usertools

    made = usertools.make_users(slurm_lab.env)
    try:
        users = next(made)
    except usertools.UsersUnavailable as exc:
        unavailable(str(exc))
    try:
        yield users
    finally:
        for user in (users.victim, users.attacker):
            slurm_lab.run(["scancel", "-u", user.name], check=False)
        for user in (users.victim, users.attacker):
            _wait_no_jobs_of(slurm_lab, user.name)
        made.close()  # runs make_users' cleanup: stops what it started, removes the users


def _wait_no_jobs_of(lab, user: str, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and lab.run(["squeue", "-h", "-u", user, "-o", "%i"], check=False).stdout.split():
        time.sleep(0.2)


@pytest.fixture(scope="module")
def meter():
    """The real-vLLM jobs' times and the machine's peak memory (labruns.Meter), printed at the module's end."""
    from labruns import Meter

    m = Meter()
    yield m
    print("\n" + m.close(), flush=True)
