"""The supervised Celery worker process (workers/supervisor.py starts it): `python -m workers.child OPTIONS`.

OPTIONS is the JSON of run_worker's keyword arguments; the settings come from the EAGLE_SYNTH_*
environment the CLI wrote for it (WorkerConfig.to_env). It ends with its supervisor, whose pid
the supervisor puts in EAGLE_SYNTH_SUPERVISED (workers/parent_death.py).
"""

from __future__ import annotations

import json
import os
import sys

from workers.parent_death import end_with_parent
from workers.supervisor import ENV_CHILD

if __name__ == "__main__":
    # Before the (slow) Celery import: a supervisor already gone is noticed at once.
    end_with_parent(int(os.environ[ENV_CHILD]))
    from workers.app import run_worker

    run_worker(**json.loads(sys.argv[1]))
