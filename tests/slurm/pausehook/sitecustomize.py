"""A pause for one test (test_access_e2e.py), put on PYTHONPATH by that test only: a Python started with
``PAUSE_BEFORE_RECORD=FILE`` in its environment (the chain follower, which inherits it from ``env_layers
tunnel``) hands a ``before_record`` to each successor's ``open_tunnel``. Once that successor's forward is
up and before anything records it, the pause writes FILE (the follower's PID and the new step) and waits
until FILE is removed (at most 10 min), so that the test can kill the follower there."""

import json
import os
import time
from pathlib import Path

PATH = os.environ.get("PAUSE_BEFORE_RECORD")

if PATH:
    from envlayers.access import tunnel

    _open_tunnel = tunnel.open_tunnel

    def _pause(record) -> None:
        Path(PATH).write_text(json.dumps({"follower_pid": os.getpid(), "srun_pid": record.srun_pid,
                                          "step_id": record.step_id, "node_pid": record.node_pid}))
        deadline = time.monotonic() + 600
        while Path(PATH).exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def open_tunnel(*args, **kwargs):
        if kwargs.get("took_over_from"):  # a successor's tunnel, opened by the follower
            kwargs["before_record"] = _pause
        return _open_tunnel(*args, **kwargs)

    tunnel.open_tunnel = open_tunnel
