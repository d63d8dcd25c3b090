"""The `--spec auto` controller an engine starts with: what it learnt before on these models here."""
from __future__ import annotations

import logging

from ..backends import Model
from ..config import ModelConfig
from .controller import Controller

log = logging.getLogger("specserve")


def learning_controller(cfg: ModelConfig, target: Model) -> Controller:
    """The `--spec auto` controller, starting from what it learnt last time on these models here."""
    from .. import learned

    if not (cfg.auto_profile and learned.enabled()):
        return Controller()
    try:
        store = learned.ProfileStore.for_models(cfg.target_path, cfg.draft_path,
                                                getattr(target, "n_threads", cfg.n_threads or 0))
    except OSError as e:
        log.warning("auto profile off: %s", e)
        return Controller()
    controller = Controller(store)
    if controller.load():
        log.info("auto: loaded what it learnt before from %s", store.path)
    return controller
