"""`dg-lsp serve-engine` on Ray Serve: replicas of the resident engine behind one FIM ingress.

Two deployments. `EngineReplica` holds a loaded engine (one per GPU on a GPU cluster; CPU replicas
here); the requests that queue while it works run as its next batch of canvases (`LocalBackend`,
`dg_lsp/engine/batching.py`). Its `check_health` fails after repeated failed requests, so Serve
replaces a replica whose model broke, as it replaces one whose process died. `Ingress` is the FastAPI
app (`dg_lsp/team/api.py`) in a single replica, because the newest-request-per-document rule needs one
place that sees every request of a document: it cancels the older request's call (Ray Serve delivers the
cancellation to the replica's task, and the batch drops that row before its next step), and it sends a
request whose replica died to another one.

Ray Serve's own HTTP proxy carries the traffic; the ingress enforces the bounds, the Origin/Host rules and
the bearer token. By default a local Ray is started (`num_cpus` bounded, no dashboard); `--address`
joins an existing cluster instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from ray import serve

from dg_lsp.engine.types import Cancelled, InfillRequest, InfillResult
from dg_lsp.settings import Settings
from dg_lsp.team.local import LocalBackend

log = logging.getLogger(__name__)

APP_NAME = "dg-lsp"
UNHEALTHY_AFTER = 3
"""Consecutive failed batches after which a replica reports itself unhealthy and Serve replaces it."""
RETRIES = 2
"""Times a request whose replica died is sent to another replica before the client gets a 503."""


@dataclass(frozen=True)
class TeamConfig:
    settings: Settings
    replicas: int = 1
    max_replicas: int | None = None
    """Autoscaling: between `replicas` and this many, on ongoing requests per replica."""
    batching: bool = True
    continuous: bool = False
    """Continuous batching instead of static batches (`LocalBackend`)."""
    max_batch: int = 16
    batch_wait_ms: float = 5.0
    cpus_per_replica: float = 1.0
    threads: int = 1
    token: str | None = None
    host: str = "127.0.0.1"
    port: int = 8765
    request_timeout_s: float = 30.0
    model_name: str = "dg-lsp"


@serve.deployment(health_check_period_s=2, health_check_timeout_s=30, graceful_shutdown_timeout_s=2)
class EngineReplica:
    def __init__(
        self,
        settings: Settings,
        batching: bool,
        max_batch: int,
        batch_wait_s: float,
        threads: int,
        continuous: bool = False,
    ):
        import torch

        from dg_lsp.engine.loader import load_engine

        torch.set_num_threads(threads)
        engine = load_engine(settings)
        engine.warmup()
        # Not `@serve.batch`: Ray 2.60 cuts a batch when its first request arrives (plus the wait) and
        # queues it behind the running one, so under load a busy replica ran batches of 1-2 requests while
        # 14 more waited (its completions at 16 typists, benchmarks/results/team_serve/shipped/). Here the
        # requests that queued while the model worked are the next batch (or join its running decode:
        # `continuous`), as in `--no-ray`.
        self.backend = LocalBackend(engine, batching, max_batch, batch_wait_s, continuous)
        self.runner = self.backend.runner
        self.failed_in_a_row = 0

    async def infill(self, rid: str, request: InfillRequest) -> tuple[str, Any]:
        """("ok", result), ("cancelled", None) or ("error", text): plain values, so nothing about the
        failure depends on an exception class crossing the process boundary. A cancelled call (the client
        left, or `/v1/fim/cancel`) drops its row before the batch's next step."""
        try:
            result = await self.backend.complete(rid, request)
        except Cancelled:
            return ("cancelled", None)
        except Exception as exc:  # one request's failure; a run of them marks the replica unhealthy
            self.failed_in_a_row += 1
            return ("error", f"{type(exc).__name__}: {str(exc)[:300]}")
        self.failed_in_a_row = 0
        return ("ok", result)

    def describe(self) -> dict[str, str]:
        return {**self.runner.engine.describe(), "batching": str(self.runner.max_batch > 1)}

    def stats(self) -> dict[str, Any]:
        batcher = self.runner.batcher
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "batches": self.runner.batches,
            "requests": self.runner.requests,
            "cancelled": self.runner.cancelled,
            "forwards": getattr(batcher, "forwards", 0),
            "batch_sizes": dict(self.backend.size_counts),
        }

    def check_health(self) -> None:
        if self.failed_in_a_row >= UNHEALTHY_AFTER:
            raise RuntimeError(f"{self.failed_in_a_row} requests in a row failed")


_STATE: dict[str, Any] = {}


def _current_backend():
    """The ingress replica's backend; a module function so the pickled app finds it by name there."""
    return _STATE["backend"]


class RayBackend:
    """`api.Backend` over the engine deployment's handle."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.running: dict[str, Any] = {}
        self.cancelled: set[str] = set()

    async def complete(self, rid: str, request: InfillRequest) -> InfillResult:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
        from ray.serve.exceptions import BackPressureError, RequestCancelledError

        lost = (RayActorError, ActorDiedError, ActorUnavailableError)
        for attempt in range(RETRIES + 1):
            response = self.handle.infill.remote(rid, request)
            self.running[rid] = response
            try:
                kind, value = await response
            except asyncio.CancelledError:
                response.cancel()
                raise
            except RequestCancelledError:
                raise Cancelled() from None
            except BackPressureError:
                raise ReplicaLost("every engine replica's queue is full; try again") from None
            except lost as exc:
                if rid in self.cancelled:
                    raise Cancelled() from None
                log.warning(
                    "engine replica lost mid-request (%s); attempt %d", type(exc).__name__, attempt + 1
                )
                continue
            finally:
                self.running.pop(rid, None)
            if kind == "cancelled" or rid in self.cancelled:
                self.cancelled.discard(rid)
                raise Cancelled()
            self.cancelled.discard(rid)  # a cancel that came too late leaves nothing behind
            if kind == "error":
                raise RuntimeError(value)
            return value
        self.cancelled.discard(rid)
        raise ReplicaLost(f"the engine replica was lost {RETRIES + 1} times; try again")

    async def cancel(self, rid: str) -> None:
        response = self.running.get(rid)
        if response is not None:
            self.cancelled.add(rid)
            response.cancel()

    async def describe(self) -> dict[str, str]:
        return await self.handle.describe.remote()


class ReplicaLost(RuntimeError):
    """Every attempt's replica died, or every replica's queue is full: the ingress answers 503."""

    http_status = 503


def _install_backend(handle) -> None:
    _STATE["backend"] = RayBackend(handle)


def build_app(cfg: TeamConfig):
    """The Serve application: the ingress bound to the engine deployment."""
    from dg_lsp.team.api import MAX_CONCURRENT, make_app

    fastapi_app = make_app(
        _current_backend,
        token=cfg.token,
        host=cfg.host,
        request_timeout_s=cfg.request_timeout_s,
        model_name=cfg.model_name,
        watch_disconnect=False,  # the proxy cancels the request of a client that hung up
    )

    @serve.deployment(num_replicas=1, max_ongoing_requests=MAX_CONCURRENT + 8)
    @serve.ingress(fastapi_app)
    class Ingress:
        def __init__(self, engine) -> None:
            _install_backend(engine)

    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": cfg.cpus_per_replica},
        "max_ongoing_requests": max(2, 2 * cfg.max_batch),
        "max_queued_requests": MAX_CONCURRENT,
    }
    if cfg.max_replicas and cfg.max_replicas > cfg.replicas:
        options["autoscaling_config"] = autoscaling_config(cfg)
    else:
        options["num_replicas"] = cfg.replicas
    engine = EngineReplica.options(**options).bind(
        cfg.settings, cfg.batching, cfg.max_batch, cfg.batch_wait_ms / 1000, cfg.threads, cfg.continuous
    )
    return Ingress.bind(engine)


def autoscaling_config(cfg: TeamConfig) -> dict[str, Any]:
    """Scale on requests in flight per replica: a replica runs about one batch's worth at a time."""
    return {
        "min_replicas": cfg.replicas,
        "initial_replicas": cfg.replicas,
        "max_replicas": cfg.max_replicas,
        "target_ongoing_requests": max(1, cfg.max_batch // 2),
        "upscale_delay_s": 5,
        "downscale_delay_s": 60,
    }


def start(cfg: TeamConfig, address: str | None = None, num_cpus: int | None = None) -> None:
    """Start (or join) Ray, start Serve's proxy on `cfg.host:cfg.port`, deploy, return when ready."""
    import ray

    if not ray.is_initialized():
        if address:  # an existing cluster keeps its own resources and dashboard settings
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(build_app(cfg), name=APP_NAME, route_prefix="/", blocking=False)


SHUTDOWN_S = 30.0
"""How long Serve gets to drain and stop its actors before Ray is taken down regardless."""


def stop(timeout_s: float = SHUTDOWN_S) -> None:
    """Serve down, then Ray. Serve's shutdown waits on its controller, which once outlived a 90 s wait
    after Ctrl-C in the slow tests; it runs in a thread with a bound, and `ray.shutdown` (which ends
    the local cluster this process started, its actors with it) follows either way."""
    import threading

    import ray

    def shutdown_serve() -> None:
        try:
            serve.shutdown()
        except Exception as exc:  # the cluster may already be going: nothing left to drain
            log.warning("Serve shutdown: %s", exc)

    worker = threading.Thread(target=shutdown_serve, name="serve-shutdown", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        log.warning("Serve did not stop within %.0f s; taking Ray down regardless", timeout_s)
    ray.shutdown()


def serve_forever(cfg: TeamConfig, address: str | None = None, num_cpus: int | None = None) -> None:
    """What `dg-lsp serve-engine` runs: serve until interrupted, then take Serve (and a local Ray) down."""
    import signal

    def interrupted(signum, _frame) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def listen() -> None:
        signal.signal(signal.SIGINT, interrupted)
        signal.signal(signal.SIGTERM, interrupted)

    # Ctrl-C and a service manager's SIGTERM take Serve and Ray down, also while they start: the proxy
    # answers before `serve.run` returns, and a process whose parent ignored SIGINT inherits that (a
    # test run did, and lost its Ctrl-C). Set again once Ray has started: it installs handlers of its own.
    listen()
    try:
        start(cfg, address, num_cpus)
        listen()
        auth = "bearer token required" if cfg.token else "no token (loopback only)"
        log.info("serving on http://%s:%d (%s)", cfg.host, cfg.port, auth)
        while True:  # short sleeps: a signal that lands on one of Ray's threads only runs the handler
            time.sleep(0.5)  # when the main thread next runs Python
    except KeyboardInterrupt as exc:
        log.info("stopping (%s)", exc or "SIGINT")
    finally:
        stop()
