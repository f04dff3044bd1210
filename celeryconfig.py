"""Celery configuration for eagle-synth, resolved from the environment (REDIS_URL, ...).

`celery -A workers.app worker` uses the same settings through eagle_synth.queue; this module
exists so that any Celery tool (`celery -A ... inspect`, Flower's `--conf`) can read them:
`celery --config celeryconfig ...`. The reasoning behind each value is in eagle_synth/queue.py.
"""

from eagle_synth.queue import celery_config
from eagle_synth.settings import broker_settings

globals().update(celery_config(broker_settings()))
