"""What one server holds: settings, the engine, its scheduler, its metrics and whether it sleeps."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from ..engine import Engine
from ..grammar import GrammarWorker
from ..memory import rss_bytes
from .core.batcher import SLOWDOWN, STALL
from .core.metrics import ServerMetrics
from .core.model_presets import Profile
from .core.reasoning import FORMATS as REASONING_FORMATS
from .core.scheduler import Scheduler
from .core.sleep import Sleeper
from .core.slot_records import SlotRecords
from .http.proxies import networks

MAX_BODY_BYTES = 4 << 20
READ_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 20.0
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_CLIENT = 32
REQUEST_LINE_TIMEOUT_S = 10.0
MIN_BATCH = 66  # the last token, a draft of at most 64, and one more


@dataclass(frozen=True)
class ServerSettings:
    """How the server behaves; the command line maps onto this."""

    model_name: str  # the served model's name (--alias, else the target file's stem)
    profiles: dict[str, Profile] = field(default_factory=dict)  # name -> profile, the served model's first
    parallel: int = 2  # slots: requests generating at once
    queue: int = 16  # requests waiting for a slot before 503
    n_batch: int = 512  # most tokens in one forward pass (--batch-size): verifications, then prompt chunks
    prefill_slowdown: float = SLOWDOWN  # a pass with a prompt chunk beside streams costs at most this x theirs...
    prefill_stall: float = STALL  # ...or this many seconds, whichever is more
    api_keys: tuple[str, ...] = ()  # none: no authentication
    key_scopes: dict[str, str] = field(default_factory=dict)  # API key -> the cross-request scope it confines to
    max_body: int = MAX_BODY_BYTES
    allowed_hosts: frozenset[str] = frozenset()  # Host names served besides IPs and localhost; "*": any
    cors_origins: frozenset[str] = frozenset()  # origins allowed cross-origin; "*": any
    read_timeout: float = READ_TIMEOUT_S  # seconds for a request's headers, then again for its body
    drain_timeout: float = DRAIN_TIMEOUT_S  # seconds a drain waits before it ends the requests in flight
    max_connections: int = MAX_CONNECTIONS  # connections served at once; requests on more get 503
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT  # open connections from one address; 0: no limit
    trusted_proxies: tuple[str, ...] = ()  # addresses or networks whose X-Forwarded-For is believed (http/proxies.py)
    request_line_timeout: float = REQUEST_LINE_TIMEOUT_S  # seconds a connection may wait before its request line
    webui: bool = True  # the chat page at / (webui.py); --no-webui: off, / is 404
    aliases: tuple[str, ...] = ()  # other names of the served model (--alias a,b,c), listed in /v1/models
    tags: tuple[str, ...] = ()  # --tags, listed in /v1/models
    slots_endpoint: bool = True  # GET /slots (--no-slots: 501, as llama-server)
    verbose: bool = False  # answers carry `__verbose` (llama-server's --verbose)
    gcp_predict: bool = False  # POST /predict, Vertex AI's route (llama-server's, with AIP_MODE=PREDICTION)
    template_kwargs: dict = field(default_factory=dict)  # chat template variables (--reasoning, --chat-template-kwargs)
    reasoning_format: str = "auto"  # how a chat's reasoning block is parted from its answer (core/reasoning.py)
    reasoning_budget: int = -1  # a chat's reasoning budget in tokens unless it gives one; -1: unlimited
    sleep_idle_seconds: float = -1  # free the models after this long without requests (core/sleep.py); -1: never

    def __post_init__(self) -> None:
        if self.model_name not in self.profiles:
            object.__setattr__(self, "profiles", {self.model_name: Profile(self.model_name), **self.profiles})
        if self.max_body < 1024:
            raise ValueError(f"max_body must be >= 1024 bytes, got {self.max_body}")
        if any(not k or k != k.strip() for k in self.api_keys):
            raise ValueError("an API key must be non-empty and have no surrounding whitespace")
        if any(k not in self.api_keys or not s or len(s) > 128 for k, s in self.key_scopes.items()):
            raise ValueError("a key scope must belong to a listed API key and be 1 to 128 characters")
        networks(self.trusted_proxies)  # ValueError naming a bad one
        if self.max_connections_per_client < 0:
            raise ValueError(f"max_connections_per_client must be >= 0 (0: no limit), "
                             f"got {self.max_connections_per_client}")
        for name, value in (("read_timeout", self.read_timeout), ("drain_timeout", self.drain_timeout),
                            ("request_line_timeout", self.request_line_timeout)):
            if not 0 < value < 1e6:  # also refuses NaN
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got "
                             f"{self.reasoning_format!r}")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be -1 (unlimited) or >= 0, got {self.reasoning_budget}")
        if not (self.sleep_idle_seconds == -1 or 0 < self.sleep_idle_seconds < 1e9):
            raise ValueError(f"sleep_idle_seconds must be > 0 (or -1: never sleep), got {self.sleep_idle_seconds}")
        if self.n_batch < MIN_BATCH:
            raise ValueError(f"--batch-size must be >= {MIN_BATCH} (a verification of the longest draft), "
                             f"got {self.n_batch}")
        if not 0 <= self.prefill_slowdown < 1e6 or 0 < self.prefill_slowdown <= 1:
            raise ValueError(f"prefill_slowdown must be > 1 (or 0: off), got {self.prefill_slowdown}")
        if not 0 <= self.prefill_stall < 1e6:
            raise ValueError(f"prefill_stall must be >= 0 seconds, got {self.prefill_stall}")
        if self.max_connections < self.parallel + self.queue + 1:
            raise ValueError(f"max_connections must exceed parallel + queue ({self.parallel + self.queue}), "
                             f"got {self.max_connections}")


class ServerState:
    """Per-app state, reached from handlers as `server_of(request)`."""

    def __init__(self, engine: Engine, settings: ServerSettings):
        self.engine = engine
        self.settings = settings
        self.t_start = time.time()  # llama-server's Process-Start-Time-Unix (/metrics)
        self.profiles = settings.profiles
        self.metrics = ServerMetrics(busy_slots=lambda: self.scheduler.pool.busy,
                                     queue_depth=lambda: self.scheduler.pool.waiting,
                                     suffix_store=engine.suffix_store, scopes=set(settings.key_scopes.values()))
        self.scheduler = Scheduler(engine, settings.parallel, settings.queue, settings.n_batch,
                                   on_pass=self.metrics.target_pass, prefill_slowdown=settings.prefill_slowdown,
                                   prefill_stall=settings.prefill_stall)
        self.slot_records = SlotRecords(settings.parallel)  # GET /slots
        self.grammars = GrammarWorker()  # compiles grammars off the event loop (core/constraints/compiling.py)
        # frees the models while idle (--sleep-idle-seconds); None: they stay loaded
        self.sleeper = Sleeper(self, settings.sleep_idle_seconds) if settings.sleep_idle_seconds > 0 else None
        self.embedder = None  # the target's embeddings, made by the first request (core/embeddings.py)

    def close_embedder(self) -> None:
        """Free the embedding context (before the weights it uses: at sleep and at stop), with the engine
        thread stopped; the next request opens it again."""
        if self.embedder is not None:
            self.embedder.close()

    @property
    def n_slots(self) -> int:
        """The server's slots (-np)."""
        return len(self.scheduler.pool.slots)

    def health(self) -> dict:
        pool = self.scheduler.pool
        return {
            "status": "draining" if self.scheduler.draining else "ok",
            "model": self.settings.model_name,
            "slots_idle": self.n_slots - pool.busy,
            "slots_processing": pool.busy,
            "queue_depth": pool.waiting,
            "queue_max": pool.max_waiting,
            "requests_active": self.scheduler.active,
            "rss_bytes": rss_bytes(),
            "is_sleeping": self.sleeper is not None and self.sleeper.asleep,
        }


def server_of(request: HTTPConnection | Starlette) -> ServerState:
    """The state of the server that took `request` (given the app itself: the app's)."""
    app = request if isinstance(request, Starlette) else request.app
    return app.state.server
