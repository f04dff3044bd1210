"""The Celery app both sides use: the producer publishes with it, workers consume with it.

Every choice in celery_config answers a trap of Celery on Redis for campaigns that run for
days (docs/reliability.md): late acks so a crash never loses a batch, no pickle, one
reserved task per slot, a visibility timeout longer than any task, no stored results.
The producer never imports worker code: it publishes by task name (payload.TASK_NAME).

The queue topology of a shared fleet (docs/operations.md "Sharing a fleet"): every campaign
has a queue of its own, `<base>:<campaign>` (campaign_queue), so a worker consumes exactly
the campaigns its servers serve (workers/servers/routing.py) and a cancel empties one queue. A
conversation's next turns go to the host queue of the worker that committed the turn before,
`<base>:<campaign>@<node>` (host_queue), which that worker takes first (workers/handoff.py). A
campaign's priority travels as the message priority: kombu's Redis transport splits each queue
into one list per priority step and every BRPOP names the lists of all consumed queues,
highest priority first, so a worker takes the most urgent batch of any campaign it serves.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
from collections.abc import Iterator

import msgpack
from celery import Celery

from eagle_synth.payload import TASK_NAME
from eagle_synth.priorities import PRIORITIES, message_priority, publish_facts
from eagle_synth.settings import BrokerSettings, broker_settings
from eagle_synth.state.batch_store import remember
from eagle_synth.state.keys import HOST_QUEUES

# Batches a prefork pool child would run before being replaced (the thread pool ignores it).
MAX_TASKS_PER_CHILD = 1000
# kombu's Redis transport: one list per step, named `<queue><SEP><step>` (step 0: the bare name).
PRIORITY_STEPS = list(PRIORITIES)
PRIORITY_SEPARATOR = "\x06\x16"
# Separates a campaign's name from the base queue name (':' is not allowed in campaign names).
CAMPAIGN_QUEUE_SEPARATOR = ":"
# Separates a campaign's queue from the worker node a host queue belongs to.
HOST_QUEUE_SEPARATOR = "@"


def campaign_queue(base: str, campaign: str) -> str:
    """The Celery queue of one campaign's batches."""
    return f"{base}{CAMPAIGN_QUEUE_SEPARATOR}{campaign}"


def host_queue(base: str, campaign: str, node: str) -> str:
    """The queue of one campaign's next turns committed by worker `node` (workers/handoff.py):
    that worker takes them first, the others after HANDOFF_DELAY."""
    return f"{campaign_queue(base, campaign)}{HOST_QUEUE_SEPARATOR}{node}"


def host_queues(client, base: str, campaign: str) -> list[str]:
    """The host queues of `campaign` that may hold messages (HOST_QUEUES)."""

    prefix = f"{campaign_queue(base, campaign)}{HOST_QUEUE_SEPARATOR}"
    names = (raw.decode() if isinstance(raw, bytes) else raw for raw in client.hkeys(HOST_QUEUES))
    return sorted(name for name in names if name.startswith(prefix))


def campaign_queues(client, base: str, campaign: str) -> list[str]:
    """Every queue that may hold `campaign`'s batches: its own, then its host queues."""
    return [campaign_queue(base, campaign), *host_queues(client, base, campaign)]


def queue_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps a queue's messages in, one per priority step, served first first."""
    return [f"{queue}{PRIORITY_SEPARATOR}{step}" if step else queue for step in PRIORITY_STEPS]


def readdressed(raw: bytes | str, *, queue: str | None = None, priority: int | None = None) -> bytes | str:
    """A queued kombu message moved by us to another list: addressed to `queue` (a restore after a
    worker takes it routes by its delivery_info) and/or at `priority` (a restore reads the list
    from there). A message that is not a kombu envelope is returned as it is."""
    try:
        message = json.loads(raw)
        properties = message["properties"]
        if priority is not None:
            properties["priority"] = priority
        if queue is not None:
            properties["delivery_info"]["exchange"] = queue
            properties["delivery_info"]["routing_key"] = queue
    except (ValueError, KeyError, TypeError):
        return raw  # not one of ours: moved as it is
    return json.dumps(message).encode()


def celery_config(settings: BrokerSettings) -> dict:
    """Celery settings for these broker settings (celeryconfig.py exposes the same)."""
    config: dict = {
        "broker_url": settings.url_without_ssl_query if settings.uses_tls else settings.redis_url,
        "broker_connection_retry_on_startup": True,
        # Retry a lost broker forever: a Redis restart must not end a days-long worker.
        "broker_connection_max_retries": None,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            "unacked_restore_interval": settings.restore_interval,
            # Scan on every sweep so restore_interval is the real redelivery latency.
            "unacked_restore_throttle": 1,
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
            "socket_keepalive": True,
            "health_check_interval": 10,
            # One list per campaign priority (PRIORITIES); kombu's default has four steps.
            "priority_steps": PRIORITY_STEPS,
            "sep": PRIORITY_SEPARATOR,
        },
        # No result backend: campaign state lives in our own keys.
        "result_backend": None,
        "task_ignore_result": True,
        # msgpack carries the binary id blob; json is for control and events. Never pickle.
        "task_serializer": "msgpack",
        "accept_content": ["msgpack", "json"],
        "result_accept_content": ["msgpack", "json"],
        "event_serializer": "json",
        "task_default_queue": settings.queue,
        "task_create_missing_queues": True,
        # A batch is acknowledged only once its records are written or its failures recorded.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Thread-pool tasks cannot be cancelled; a second copy after a reconnection is held off
        # by the batch lease instead (workers/lease.py).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_soft_shutdown_timeout": float(settings.soft_shutdown_timeout),
        "worker_enable_soft_shutdown_on_idle": True,
        # Flower shows what runs where from task events.
        "worker_send_task_events": True,
        "worker_hijack_root_logger": False,
        "worker_max_tasks_per_child": MAX_TASKS_PER_CHILD,
    }
    if settings.uses_tls:
        config["broker_use_ssl"] = settings.ssl_options()
    if settings.uses_sentinel:
        # kombu's SentinelChannel asks these sentinels for this master on each connection.
        config["broker_transport_options"]["master_name"] = settings.sentinel_master
        config["broker_transport_options"]["sentinel_kwargs"] = settings.sentinel_kwargs()
    return config


# Celery reads these before its configuration; a stale one would point us at another Redis.
CELERY_URL_OVERRIDES = ("CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL", "CELERY_BROKER_READ_URL")


def make_celery(settings: BrokerSettings | None = None) -> Celery:
    """A Celery app for these settings (default: resolved from the environment)."""
    for name in CELERY_URL_OVERRIDES:
        if os.environ.pop(name, None):
            logging.getLogger("eagle_synth.queue").warning(
                "ignoring %s: eagle-synth takes its broker from --redis / REDIS_URL", name
            )
    app = Celery("eagle_synth")
    app.conf.update(celery_config(settings or broker_settings()))
    return app


# Content type of our task messages (msgpack; anything else on the queue is not ours).
TASK_CONTENT_TYPE = "application/x-msgpack"
# Queue messages read per LRANGE step.
QUEUE_SCAN_STEP = 1000


def send_payload(app: Celery, base_queue: str, payload: dict, *, host: str | None = None) -> None:
    """Publish one encoded TaskPayload as a generate task on its campaign's queue, with the
    campaign's priority (producer and workers alike); with `host` (a worker's node name), on
    that worker's host queue of the campaign instead (a conversation's next turns)."""
    campaign = str(payload["campaign"])
    with app.producer_or_acquire() as producer:
        client = producer.channel.client
        priority, cancelled = publish_facts(client, campaign)
        if cancelled:
            # `eagle-synth cancel` freed its state: a follow-up turn or a republish must not refill it.
            logging.getLogger("eagle_synth.queue").info(
                "campaign %s was cancelled: batch %s not published", campaign, payload["batch"]
            )
            return
        # The campaign keeps a copy first, so a message the broker loses can be published again
        # (eagle_synth/state/batch_store.py); the broker's own client, so no second connection.
        remember(client, payload)
        queue = campaign_queue(base_queue, campaign) if host is None else host_queue(base_queue, campaign, host)
        # A short argsrepr: Celery would otherwise repr the whole id blob into every message.
        app.send_task(
            TASK_NAME,
            args=[payload],
            queue=queue,
            priority=message_priority(priority),
            serializer="msgpack",
            argsrepr=f"<{campaign} batch {payload['batch']}: {len(payload['keys'])} prompts>",
            kwargsrepr="{}",
            producer=producer,
        )
        if host is not None:
            # After the message: the handoff drops a name only when its lists are empty (one
            # script), so a name is listed whenever its queue holds a message.
            client.hset(HOST_QUEUES, queue, json.dumps([campaign_queue(base_queue, campaign), host]))


def payload_of_entry(raw: bytes | str) -> dict | None:
    """The raw payload dict (ids still compressed) of a queued kombu message or of an `unacked`
    entry ([message, exchange, routing key]), or None if not ours: kombu's JSON envelope holds
    the base64 of the msgpack task message `[args, kwargs, embed]`."""
    try:
        message = json.loads(raw)
        message = message[0] if isinstance(message, list) and message else message
        if not isinstance(message, dict) or message.get("content-type") != TASK_CONTENT_TYPE:
            return None  # not one of ours (a foreign or refused message)
        args, _kwargs, _embed = msgpack.unpackb(base64.b64decode(message["body"]), raw=False)
        payload = args[0]
    except (KeyError, IndexError, TypeError, ValueError, msgpack.UnpackException):
        return None
    return payload if isinstance(payload, dict) and "campaign" in payload and "batch" in payload else None


def queued_payloads(client, queue: str, *, step: int = QUEUE_SCAN_STEP) -> Iterator[dict]:
    """The raw payloads of our messages waiting in a queue (every priority list of it), read in
    LRANGE steps of `step` without taking them off."""
    for name in queue_lists(queue):
        for start in itertools.count(0, step):
            chunk = client.lrange(name, start, start + step - 1)
            yield from filter(None, map(payload_of_entry, chunk))
            if len(chunk) < step:
                break


def queued_count(client, queue: str) -> int:
    """Messages waiting in a queue, all priority lists together."""
    with client.pipeline(transaction=False) as pipe:
        for name in queue_lists(queue):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())
