"""OpenAI's GET /v1/models (and llama-server's /models): the served model and its profiles, each by the name
a request gives as `model`."""
from __future__ import annotations

import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....draft_choice import of_engine
from ...http.endpoint import Endpoint
from ...state import server_of


def routes() -> list[Endpoint]:
    return [Endpoint(path, models, ("GET",), needs_model=False) for path in ("/v1/models", "/models")]


async def models(request: Request) -> Response:
    state = server_of(request)
    created = int(time.time())
    draft = state.engine.draft
    # File names, not paths: a path tells a client about the host's directories and user names.
    served = state.settings.model_name
    choice = of_engine(state.engine)  # how the draft was chosen (-md auto), as /props shows it
    data = [{"id": name, "object": "model", "created": created, "owned_by": "specserve",
             # llama-server's: every name the served model answers to (--alias a,b), and --tags
             **({"aliases": [served, *state.settings.aliases], "tags": list(state.settings.tags)}
                if name == served else {}),
             "specserve": {"target": Path(state.engine.target.path).name,
                           "draft": Path(draft.path).name if draft is not None else None,
                           "n_ctx": state.engine.n_ctx, "draft_choice": choice, **p.describe()}}
            for name, p in state.profiles.items()]
    return JSONResponse({"object": "list", "data": data})
