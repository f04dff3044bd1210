"""The supervised Celery worker process (workers/supervisor.py starts it): `python -m workers.child OPTIONS`.

OPTIONS is the JSON of run_worker's keyword arguments; the settings come from the EAGLE_SYNTH_*
environment the CLI wrote for it (WorkerConfig.to_env).
"""

from __future__ import annotations

import json
import sys

from workers.app import run_worker

if __name__ == "__main__":
    run_worker(**json.loads(sys.argv[1]))
