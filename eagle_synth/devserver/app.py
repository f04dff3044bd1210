"""The devserver's endpoints (SGLang's, and vLLM's with --api vllm) and its aiohttp transport.

Endpoint methods take the raw body and return a Reply (or the JSON to answer 200 with), which
the transport writes, drops, or dies after. They block (a /generate holds its slot for the emulated time), so each runs in a
pool thread on an event loop of the server's own (the main thread, or a daemon thread).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NoReturn

from aiohttp import web

from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.faults import DROP, FAIL, FaultPlan, malform, malform_completion
from eagle_synth.devserver.generation import Completion, Generator, ModelVocab
from eagle_synth.devserver.protocol import (
    ENGINE_ERROR_MESSAGE,
    KNOWN_FIELDS,
    PromptRequest,
    Reply,
    error_reply,
    json_reply,
    parse_completion_request,
    parse_generate_request,
    sglang_error_reply,
)
from eagle_synth.devserver.scheduler import ABORTED_WAITING, DevStats, PrefixCache, SlotJob, SlotScheduler
from eagle_synth.errors import ProtocolError, QueueFullError

log = logging.getLogger("eagle_synth.devserver")

# What /flush_cache says on success (SGLang's wording).
FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
# meta_info.weight_version of newer SGLang versions; clients must tolerate such extra fields.
WEIGHT_VERSION = "default"
# What a trickling /health sends, a byte at a time: long enough to outlast any probe timeout.
TRICKLE_BODY = b"." * 4096
# Idle keep-alive connections are closed after this long, like uvicorn (SGLang's server) does.
KEEPALIVE_TIMEOUT_S = 5.0
# Listen backlog: hundreds of clients connecting at once must queue, not be refused.
LISTEN_BACKLOG = 2048
# Requests blocked in endpoint methods at once (threads start on demand, up to this many).
HANDLER_THREADS = 4096
# Largest request body accepted (a big batch of long prompts is a few MB).
MAX_BODY_BYTES = 512 * 1024 * 1024
# Seconds stop() gives unfinished replies (a trickling /health) before closing them.
SHUTDOWN_TIMEOUT_S = 1.0
# Line printed (and flushed) once the port listens; tests and scripts wait for it.
LISTENING_LINE = "devserver listening on http://{host}:{port}"
# Launch arguments /server_info reports as they were given.
SERVER_INFO_FIELDS = (
    *("context_length", "skip_tokenizer_init", "reasoning_parser", "tool_call_parser", "api_key", "admin_api_key"),
    *("allow_auto_truncate", "preferred_sampling_params", "speculative_algorithm", "enable_deterministic_inference"),
    *("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "host", "port"),
    "max_queued_requests",
)
# What --api-key guards: SGLang's middleware lets paths with these prefixes through (probes and
# Prometheus need no key); vLLM's (0.32) guards only paths with these.
SGLANG_KEYLESS_PREFIXES = ("/health", "/metrics")
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
# SGLang's deprecated paths, answered as their successors with a warning: old -> new.
DEPRECATED_PATHS = {"/get_model_info": "/model_info", "/get_server_info": "/server_info"}
# path -> (methods, endpoint method), per API; every other path is a 404.
ROUTES = {
    "sglang": {
        "/generate": ("POST PUT", "generate"),
        "/health": ("GET", "health"),
        "/health_generate": ("GET", "health"),
        "/model_info": ("GET", "model_info"),
        "/get_model_info": ("GET", "model_info"),
        "/server_info": ("GET", "server_info"),
        "/get_server_info": ("GET", "server_info"),
        "/v1/models": ("GET", "models"),
        "/flush_cache": ("GET POST", "flush_cache"),
        "/abort_request": ("POST PUT", "abort_request"),
        "/dev/stats": ("GET", "dev_stats"),
        "/tokenize": ("POST", "sglang_tokenize"),
        "/v1/tokenize": ("POST", "sglang_tokenize"),
        "/dev/reset_stats": ("POST", "dev_reset_stats"),
    },
    "vllm": {
        "/v1/completions": ("POST", "completions"),
        "/health": ("GET", "health"),
        "/v1/models": ("GET", "vllm_models"),
        "/version": ("GET", "version"),
        "/server_info": ("GET", "vllm_server_info"),
        "/tokenize": ("POST", "tokenize"),
        "/dev/stats": ("GET", "dev_stats"),
        "/dev/reset_stats": ("POST", "dev_reset_stats"),
    },
}


def text_reply(text: str, status: int = 200) -> Reply:
    return Reply(status=status, body=text.encode(), content_type="text/plain; charset=utf-8")


def internal_error() -> Reply:
    """SGLang's FastAPI answer to an uncaught exception (a TypeError: unknown sampling key, ...)."""
    return Reply(status=500, body=b"Internal Server Error", content_type="text/plain")


class DevServer:
    """One emulated SGLang (or vLLM) server: its endpoints (docs/devserver.md) and lifecycle.

    Made, it has loaded the tokenizer; `serve()` keeps the port closed for startup_delay, binds,
    prints LISTENING_LINE and serves until cancelled or `die()` ends the process.
    """

    def __init__(self, config: DevServerConfig) -> None:
        c = config
        self.config = c
        t0 = time.monotonic()
        vocab = ModelVocab.load(
            tokenizer_dir=c.tokenizer, vocab_size=c.vocab_size, trust_remote_code=c.trust_remote_code
        )
        self.vocab = vocab
        log.info(
            "devserver loaded tokenizer %s in %.1fs: vocab %d, eos %s, think %s/%s, corpus %d tokens",
            *(c.tokenizer, time.monotonic() - t0, vocab.size, vocab.eos_id, vocab.think_open_id),
            *(vocab.think_close_id, len(vocab.corpus_ids)),
        )
        knobs = ("mean_output_tokens", "seed", "length_median", "length_sigma")
        self.generator = Generator(vocab=vocab, **{k: getattr(c, k) for k in knobs})
        self.cache = PrefixCache(c.effective_prefix_cache_tokens)
        self.stats = DevStats()
        faults = ("fail_rate", "drop_rate", "malformed_rate", "health_fail_rate", "die_after", "seed")
        self.faults = FaultPlan(**{k: getattr(c, k) for k in faults})
        self._ignored_logged: set[tuple[str, ...]] = set()  # vLLM warns once per set of ignored fields
        self.scheduler = SlotScheduler(c, self.stats, self.cache)
        self._tokenize = None if c.skip_tokenizer_init else vocab.encode  # text prompts (either API)
        self._listening_mono: float | None = None
        self._listening_at: float | None = None
        self._pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="devserver")

    def healthy(self) -> bool:
        mono = self._listening_mono
        return mono is not None and time.monotonic() - mono >= self.config.warmup

    def die(self, reason: str) -> NoReturn:
        """Die like SGLang after a fatal GPU error: log and end the process at once (from the event
        loop, so no other request is answered meanwhile)."""
        log.error("devserver dying: %s", reason)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    # ---- health and information (answered during warm-up too, as SGLang does) ----

    def health(self, body: bytes) -> Reply:
        self.stats.add(health_requests=1)
        if not self.healthy() or self.faults.health_flake():
            self.stats.add(health_unavailable=1)
            return Reply(status=503)
        if self.config.trickle_health:
            self.stats.add(health_trickled=1)
            return Reply(body=TRICKLE_BODY, content_type="text/plain", trickle=self.config.trickle_health)
        return Reply()

    def model_info(self, body: bytes) -> dict:
        c = self.config
        info: dict[str, Any] = {"model_path": c.effective_model_path, "tokenizer_path": c.tokenizer}
        info["is_generation"] = True
        info["preferred_sampling_params"] = c.preferred_sampling_params
        info |= {"weight_version": WEIGHT_VERSION}
        return info | {"has_image_understanding": False, "has_audio_understanding": False}

    def server_info(self, body: bytes) -> dict:
        """Launch arguments (secrets included, as SGLang's), its scheduler_info and version."""
        c = self.config
        info: dict[str, Any] = {"model_path": c.effective_model_path, "tokenizer_path": c.tokenizer}
        info["served_model_name"] = c.effective_model_path
        info["tp_size"] = 1
        info["dp_size"] = 1
        info["page_size"] = 1
        info["max_running_requests"] = c.slots
        info["random_seed"] = c.seed
        info["ssl_keyfile_password"] = None
        info |= {name: getattr(c, name) for name in SERVER_INFO_FIELDS}
        info["sampling_defaults"] = "model"
        info["vocab_size"] = self.vocab.size
        info["version"] = c.sglang_version
        # The KV-cache size: room for every slot at full context, so the context (not the cache)
        # is what limits one request, as on a well-sized server.
        info["max_total_num_tokens"] = c.slots * c.effective_context_length
        info["max_req_input_len"] = c.max_req_input_len
        return info | {"devserver": True}

    def models(self, body: bytes) -> dict:
        path = self.config.effective_model_path
        model = {"id": path, "object": "model", "created": int(self.stats.started_at), "owned_by": "sglang"}
        model["root"] = path
        model["max_model_len"] = self.config.effective_context_length
        return {"object": "list", "data": [model]}

    def flush_cache(self, body: bytes) -> Reply:
        running, waiting = self.scheduler.load
        if running or waiting:
            pending = f"#queue-req: {waiting}, #running-req: {running}"
            return text_reply(f"Cache not flushed because there are pending requests. {pending}", status=400)
        self.cache.flush()
        return text_reply(FLUSH_OK_TEXT)

    def abort_request(self, body: bytes) -> Reply:
        """{"rid": str | [str], "abort_all": bool}: the aborted prompts answer 200, finish abort."""
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return json_reply({"error": {"message": "Invalid JSON body."}}, status=400)
        if not isinstance(req, dict):
            return json_reply({"error": {"message": "The body must be a JSON object."}}, status=400)
        rid = req.get("rid")
        rids = {rid} if isinstance(rid, str) else {r for r in rid or [] if isinstance(r, str)}
        self.scheduler.abort(rids=None if req.get("abort_all") else rids)  # no rid named: nothing to end
        return Reply()

    def dev_stats(self, body: bytes) -> dict:
        running, waiting = self.scheduler.load
        healthy = self.healthy()
        at = self._listening_at
        healthy_at = at + self.config.warmup if at is not None and healthy else None
        live = {"slots": self.config.slots, "running": running, "waiting": waiting, "healthy": healthy}
        return self.stats.snapshot(**live, listening_at=at, healthy_at=healthy_at)

    def dev_reset_stats(self, body: bytes) -> dict:
        self.stats.reset()
        return {"ok": True}

    # ---- generation ----

    def fated(self, body: bytes, endpoint: str, serve: Callable[[bytes], Any], failed: Callable[[], Reply]) -> Reply:
        """One generation request (either API) with its fault drawn: `serve` answers a Reply, or
        the reply's JSON, which the fault may drop or malform (a buggy or patched server)."""
        self.stats.generate_received(healthy=self.healthy())
        fate = self.faults.next_generate()
        reply = failed() if fate.action == FAIL else serve(body)
        served = not isinstance(reply, Reply)  # a refusal is never dropped or malformed
        dropped = served and fate.action == DROP
        shape = fate.malformed_shape if served else None
        self.stats.add(injected_failures=fate.action == FAIL, injected_drops=dropped, injected_malformed=bool(shape))
        if dropped:
            reply = Reply(drop=True)
        elif served:
            broken = malform_completion if endpoint == "/v1/completions" else malform
            reply = json_reply(broken(reply, shape) if shape else reply)
        if fate.die_after_response and reply.die_reason is None:
            reply.die_reason = f"--die-after {fate.number}: answered the last allowed {endpoint}"
        return reply

    def hold_slots(self, prompts: list[PromptRequest]) -> list[tuple[PromptRequest, Completion, SlotJob]]:
        """Each prompt's completion, once it held a slot for its emulated time."""
        completions = [self.generator.complete(p) for p in prompts]
        jobs = [
            SlotJob(p.rid, p.group_rid, len(c.output_ids), prompt_ids=p.input_ids) for p, c in zip(prompts, completions)
        ]
        self.scheduler.submit(jobs)
        for job in jobs:
            job.done.wait()
        return list(zip(prompts, completions, jobs))

    def outcome(self, prompt: PromptRequest, completion: Completion, job: SlotJob):
        """(the ids a prompt answers with, counted; SGLang's finish_reason; the text, None with skip_tokenizer_init)."""
        if job.aborted:
            message = "Abort in waiting queue" if job.outcome == ABORTED_WAITING else "Aborted"
            # No `matched` in an abort's finish_reason, so render_text trims nothing from the cut ids.
            completion = Completion(completion.output_ids[: job.tokens_done], {"type": "abort", "message": message})
        self.stats.add(prompts=1, output_tokens=len(completion.output_ids), aborted=job.aborted)
        self.stats.add(prompt_tokens=len(prompt.input_ids), cached_tokens=job.cached_tokens)
        text = None if self.config.skip_tokenizer_init else self.generator.render_text(completion, prompt.params)
        return completion.output_ids, completion.finish_reason, text

    def generate(self, body: bytes) -> Reply:
        return self.fated(body, "/generate", partial(self._generate, received=time.monotonic()), internal_error)

    def _generate(self, body: bytes, *, received: float) -> Any:
        try:
            req = parse_generate_request(json.loads(body), self.config, tokenize=self._tokenize)
        except (ValueError, ProtocolError) as err:
            self.stats.add(client_errors=1)
            if not isinstance(err, ProtocolError):
                return json_reply({"error": {"message": "Invalid JSON body."}}, status=400)
            if err.status == 500:
                log.error("/generate raised %s", err)
                return internal_error()
            return json_reply({"error": {"message": str(err)}}, status=err.status)
        size = self.vocab.size
        if (bad := next((i for p in req.prompts for i in p.input_ids if not 0 <= i < size), None)) is not None:
            why = "device-side assert (real SGLang dies the same way)"
            return Reply(drop=True, die_reason=f"input id {bad} outside the vocabulary [0, {size}): {why}")
        try:
            held = self.hold_slots(req.prompts)
        except QueueFullError as err:
            self.stats.add(queue_full=1)
            error = {"object": "error", "message": str(err), "type": "Service Unavailable", "code": 503}
            return json_reply(error, status=503)
        items = [self._item(*each, received) for each in held]
        return items[0] if req.single else items

    def _item(self, prompt: PromptRequest, completion: Completion, job: SlotJob, received: float):
        c = self.config
        output_ids, finish, text = self.outcome(prompt, completion, job)
        if not job.aborted:
            self.cache.insert(prompt.input_ids + output_ids)
        matched = finish.get("matched")
        if c.drop_stop_id and finish["type"] == "stop" and isinstance(matched, int) and output_ids[-1:] == [matched]:
            output_ids = output_ids[:-1]
        item: dict[str, Any] = {} if text is None else {"text": text}
        item["output_ids"] = prompt.input_ids[-c.prefix_bug :] + output_ids if c.prefix_bug else output_ids
        item["meta_info"] = {
            "id": prompt.rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt.input_ids),
            "completion_tokens": max(0, len(output_ids) - c.understate_completion),
            "cached_tokens": job.cached_tokens,
            "e2e_latency": time.monotonic() - received,
            "weight_version": WEIGHT_VERSION,
        }
        return item

    # ---- vLLM's endpoints (--api vllm): the same generator, scheduler, faults and counters ----

    def vllm_models(self, body: bytes) -> dict:
        c = self.config
        created = int(self.stats.started_at)
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        model = {"id": c.effective_served_model_name, "object": "model", "created": created, "owned_by": "vllm"}
        model["root"] = c.effective_model_path
        model["parent"] = None
        model["max_model_len"] = c.effective_context_length
        return {"object": "list", "data": [{**model, "permission": [permission]}]}

    def version(self, body: bytes) -> dict:
        return {"version": self.config.vllm_version}

    def vllm_server_info(self, body: bytes) -> Reply | dict:
        """Only in dev mode: the configuration as `?config_format=json` gives it."""
        c = self.config
        if not c.dev_mode:
            return json_reply({"detail": "Not Found"}, status=404)
        model: dict[str, Any] = {"model": c.effective_model_path, "served_model_name": c.effective_served_model_name}
        model["tokenizer"] = c.tokenizer
        model["max_model_len"] = c.effective_context_length
        model["dtype"] = "bfloat16"
        model["seed"] = c.seed
        model["generation_config"] = c.generation_config
        model |= {"override_generation_config": json.loads(c.override_generation_config or "{}")}
        model["skip_tokenizer_init"] = c.skip_tokenizer_init
        model["logits_processors"] = None
        model["runner_type"] = "generate"
        config = {
            "model_config": model,
            "scheduler_config": {"max_num_seqs": c.slots, "max_num_batched_tokens": c.effective_context_length},
            "cache_config": {"enable_prefix_caching": True, "kv_cache_dtype": "auto"},
            "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1},
            "structured_outputs_config": {"reasoning_parser": c.reasoning_parser or ""},
            "speculative_config": None,
        }
        return {"vllm_config": config, "vllm_env": {}, "system_env": {}}

    def sglang_tokenize(self, body: bytes) -> Reply | dict:
        """SGLang's /tokenize (serving_tokenize.py): `prompt` a string or a list of strings,
        `add_special_tokens` true by default; {"tokens", "count", "max_model_len"}, the last the
        tokenizer's model_max_length. A server started with --skip-tokenizer-init has no tokenizer:
        its attempt ends in a 500, as SGLang's does."""
        try:
            request = json.loads(body)
        except ValueError:
            return sglang_error_reply("JSON decode error", status=400)
        prompt = request.get("prompt") if isinstance(request, dict) else None
        if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(p, str) for p in prompt)):
            return sglang_error_reply(f"Invalid prompt type: {type(prompt)}. Expected str or List[str].", status=400)
        if self.config.skip_tokenizer_init:
            message = "Internal server error during tokenization: 'NoneType' object has no attribute 'encode'"
            return sglang_error_reply(message, status=500)
        add_special = request.get("add_special_tokens", True) is not False
        tokenizer = self.vocab.tokenizer

        def encode(text: str) -> list[int]:
            return [int(i) for i in tokenizer.encode(text, add_special_tokens=add_special)]

        limit = getattr(tokenizer, "model_max_length", -1)
        if isinstance(prompt, str):
            one = encode(prompt)
            return {"tokens": one, "count": len(one), "max_model_len": limit}
        many = [encode(text) for text in prompt]
        return {"tokens": many, "count": [len(ids) for ids in many], "max_model_len": limit}

    def tokenize(self, body: bytes) -> Reply | dict:
        """TokenizeCompletionRequest; `add_special_tokens` defaults to true, as vLLM's does."""
        try:
            request = json.loads(body)
        except ValueError:
            return error_reply("JSON decode error", status=400)
        prompt = request.get("prompt") if isinstance(request, dict) else None
        if not isinstance(prompt, str):
            return error_reply("Field required: ('body', 'prompt')", status=400)
        model = request.get("model")
        if model is not None and model != self.config.effective_served_model_name:
            return error_reply(f"The model `{model}` does not exist.", status=404, param="model")
        add_special = request.get("add_special_tokens", True) is not False
        tokens = [int(i) for i in self.vocab.tokenizer.encode(prompt, add_special_tokens=add_special)]
        limit = self.config.effective_context_length
        return {"count": len(tokens), "max_model_len": limit, "tokens": tokens, "token_strs": None}

    def completions(self, body: bytes) -> Reply:
        return self.fated(
            body, "/v1/completions", self._complete, partial(error_reply, ENGINE_ERROR_MESSAGE, status=500)
        )

    def _complete(self, body: bytes) -> Any:
        c = self.config
        try:
            request = json.loads(body)
            prompts = parse_completion_request(request, c, self.vocab.size, self._tokenize)
        except (ValueError, ProtocolError) as err:
            self.stats.add(client_errors=1)
            if isinstance(err, ProtocolError):
                return error_reply(str(err), status=err.status, param=err.param)
            return error_reply("JSON decode error", status=400)
        unknown = tuple(sorted(set(request) - KNOWN_FIELDS))
        if unknown and unknown not in self._ignored_logged:
            self._ignored_logged.add(unknown)
            log.warning("The following fields were present in the request but ignored: %s", set(unknown))
        token_ids = bool(request.get("return_token_ids"))
        # vLLM's prefix cache spares prefill as SGLang's does (not reported: no prompt details).
        held = self.hold_slots(prompts)  # vLLM has no queue cap: requests wait
        choices = [self._choice(i, *each, token_ids) for i, each in enumerate(held)]
        completion_tokens = sum(job.tokens_done for _, _, job in held)
        prompt_tokens = sum(len(p.input_ids) for p in prompts if p.sample_index == 0)
        usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens}
        usage["completion_tokens"] = completion_tokens
        usage["prompt_tokens_details"] = None
        usage |= {"completion_tokens_details": None}
        reply = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
        reply["model"] = c.effective_served_model_name
        reply["choices"] = choices
        reply["service_tier"] = None
        # vLLM 0.32 answers "vllm-<version>-<build hash>"; the rest as the real CPU build does.
        reply |= {"system_fingerprint": f"vllm-{c.vllm_version}-devserver"}
        return reply | {"usage": usage, "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}

    def _choice(self, index: int, prompt: PromptRequest, completion: Completion, job: SlotJob, token_ids: bool):
        output_ids, finish, text = self.outcome(prompt, completion, job)
        if not job.aborted:
            self.cache.insert(prompt.input_ids + output_ids)
        matched = finish.get("matched")
        # vLLM reports the matched stop id or string; the model's EOS is reported as None.
        stop_reason = None if matched is None or matched == self.vocab.eos_id else matched
        return {
            "index": index,
            "text": text or "",
            "logprobs": None,
            "finish_reason": finish["type"],
            "stop_reason": stop_reason,
            "token_ids": output_ids if token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt.input_ids if token_ids else None,
            "routed_experts": None,
        }

    async def serve(self) -> None:
        """Delay, bind and serve until cancelled (Ctrl-C)."""
        c = self.config
        if c.startup_delay > 0:
            log.info("devserver startup delay: port closed for %.1fs", c.startup_delay)
            await asyncio.sleep(c.startup_delay)
        handlers = {path: (methods.split(), getattr(self, name)) for path, (methods, name) in ROUTES[c.api].items()}
        web_app = web.Application(client_max_size=MAX_BODY_BYTES)
        web_app.router.add_route("*", "/{path:.*}", partial(self._dispatch, handlers))
        timeouts: dict[str, Any] = {"keepalive_timeout": KEEPALIVE_TIMEOUT_S, "shutdown_timeout": SHUTDOWN_TIMEOUT_S}
        runner = web.AppRunner(web_app, access_log=log if c.access_log else None, **timeouts)
        await runner.setup()
        try:
            await web.TCPSite(runner, c.host, c.port, backlog=LISTEN_BACKLOG, reuse_address=True).start()
            self._listening_mono = time.monotonic()  # the warm-up clock starts
            self._listening_at = time.time()
            print(LISTENING_LINE.format(host=c.host, port=runner.addresses[0][1]), flush=True)
            if c.warmup > 0:
                log.info("devserver warm-up: health answers 503 for %.1fs", c.warmup)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _authorized(self, request: web.Request) -> bool:
        """Whether `request` passes --api-key, as the real server's middleware decides (the
        devserver's own /dev/ paths need no key)."""
        key = self.config.api_key
        api = self.config.api
        path = request.path
        keyless = ("/dev/", *(SGLANG_KEYLESS_PREFIXES if api == "sglang" else ()))
        guarded = path.startswith(VLLM_GUARDED_PREFIXES) if api == "vllm" else True
        if key is None or request.method == "OPTIONS" or path.startswith(keyless) or not guarded:
            return True
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())

    async def _dispatch(self, handlers: dict, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return await _send(request, json_reply({"detail": "Request body too large"}, status=413), close=True)
        path = request.path.rstrip("/") or "/"
        route = handlers.get(path)
        if not self._authorized(request):
            reply = json_reply({"error": "Unauthorized"}, status=401)
        elif route is None:
            reply = json_reply({"detail": "Not Found"}, status=404)
        elif request.method not in route[0]:
            reply = json_reply({"detail": "Method Not Allowed"}, status=405)
        else:
            if (new := DEPRECATED_PATHS.get(path)) is not None:
                self.stats.add(deprecated_info_calls=1)
                log.warning(
                    f"Endpoint '{path}' is deprecated and will be removed in a future version. Please use '{new}' instead."
                )
            try:
                reply = await asyncio.get_running_loop().run_in_executor(self._pool, route[1], body)
                reply = reply if isinstance(reply, Reply) else json_reply(reply)
            except Exception:
                log.exception("%s %s failed", request.method, path)
                reply = internal_error()
        if not reply.drop:
            response = await _send(request, reply)
        else:  # drop the connection
            if request.transport is not None:
                request.transport.close()
            response = web.Response()  # its write fails on the closed transport, which aiohttp ignores
        if reply.die_reason is not None:
            self.die(reply.die_reason)  # after the reply went out
        return response


async def _send(request: web.Request, reply: Reply, *, close: bool = False) -> web.StreamResponse:
    """Write `reply` whole (or with `trickle` a byte at a time), flushed before returning."""
    headers = {"Content-Type": reply.content_type, "Content-Length": str(len(reply.body))}
    response = web.StreamResponse(status=reply.status, headers=headers)
    if close:
        response.force_close()
    await response.prepare(request)
    try:
        for chunk in [reply.body[i : i + 1] for i in range(len(reply.body))] if reply.trickle else [reply.body]:
            await response.write(chunk)
            await asyncio.sleep(reply.trickle)
        await response.write_eof()
    except ConnectionError:
        pass  # the client gave up (what a deadline does); aiohttp closes the connection
    return response


def run_devserver(config: DevServerConfig) -> None:
    """Run a devserver in the calling thread until interrupted (Ctrl-C) or it dies (the process ends)."""
    try:
        asyncio.run(DevServer(config).serve())
    except KeyboardInterrupt:
        log.info("devserver interrupted")
