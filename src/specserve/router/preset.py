"""--models-preset FILE: llama-server's INI of per-model flags.

A section per model name holds its `specserve serve` flags without their dashes (`ctx-size = 8192`,
short forms too: `c = 8192`; `model-draft = /path/draft.gguf`, `none` for no draft, `auto` to choose among
the discovered models, the router's default); `[*]` holds
flags for every model. A section naming a model that was not discovered adds it, and must give
`model = PATH`. A flag's `true` gives it, `false` leaves it out. Beside the flags, as in llama-server:
`load-on-startup = true` loads the model when the router starts. Precedence, as llama-server's: the
router's command line, then the model's section, then `[*]`.
"""
from __future__ import annotations

import configparser
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

GLOBAL = "*"
_OWN = {"load-on-startup", "stop-timeout", "version"}
# flags the router sets for each child itself
_ROUTER_OWNED = {"host", "port", "alias", "a", "api-key", "api-key-file", "models-dir", "models-from",
                 "models-max", "models-preset", "models-memory", "no-models-autoload"}


@dataclass
class Preset:
    """One section: the child's flags, its model path where it gives one, its draft, whether it loads at start."""
    args: list[str] = field(default_factory=list)
    model: Path | None = None
    draft: str | None = None
    draft_given: bool = False  # model-draft was set (a file, or none): the router does not choose one
    load_on_startup: bool = False


def _truth(section: str, key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"--models-preset [{section}] {key} = {value!r}: expected true or false")


def _section(name: str, items: dict[str, str], takes_value: Callable[[str], bool | None], base: Path) -> Preset:
    preset = Preset()
    for key, value in items.items():
        value = (value or "").strip()
        if key in _OWN:
            if key == "load-on-startup":
                preset.load_on_startup = _truth(name, key, value)
            continue
        if key in _ROUTER_OWNED:
            raise ValueError(f"--models-preset [{name}] {key}: the router sets this for each model itself")
        if key in ("model", "m"):
            preset.model = (base / value).resolve() if value else None
            continue
        if key in ("model-draft", "md"):
            preset.draft_given = True
            preset.draft = None if value.lower() in ("none", "auto") else value
            if preset.draft is None:
                preset.args += ["-md", value.lower()]
            else:
                path = Path(value).expanduser()
                preset.args += ["-md", str(path if path.is_absolute() or not path.suffix else (base / path).resolve())]
            continue
        option = f"-{key}" if takes_value(f"-{key}") is not None else f"--{key}"
        wants = takes_value(option)
        if wants is None:
            raise ValueError(f"--models-preset [{name}] {key}: not a flag of specserve serve (see specserve serve "
                             "--help)")
        if wants:
            preset.args += [option, value]
        elif _truth(name, key, value):
            preset.args.append(option)
    return preset


def read_preset(path: str, takes_value: Callable[[str], bool | None]) -> tuple[dict[str, Preset], Preset]:
    """The sections of the preset file at `path`, `[*]`'s flags first in each, and `[*]` alone: what a model
    without a section of its own gets (as llama-server's). `takes_value(option)`: True for a flag with a
    value, False for one without, None for no such flag. Raises ValueError saying what and where."""
    parser = configparser.ConfigParser(default_section="\x00", interpolation=None, strict=False,
                                       inline_comment_prefixes=(";", "#"))
    parser.optionxform = str  # keys as written (LLAMA_ARG_... and flags are case-sensitive)
    try:
        text = Path(path).read_text()
        parser.read_string("[\x01]\n" + text, source=path)  # keys before any section (version = 1) are allowed
    except (OSError, UnicodeDecodeError, configparser.Error) as e:
        raise ValueError(f"--models-preset {path}: {e}") from None
    base = Path.cwd()  # llama-server: paths relative to the server's working directory
    sections = {name: dict(parser.items(name)) for name in parser.sections() if name != "\x01"}
    common = _section(GLOBAL, sections.pop(GLOBAL, {}), takes_value, base)
    out = {}
    for name, items in sections.items():
        own = _section(name, items, takes_value, base)
        inherited = common.args
        if "model-draft" in items or "md" in items:  # the section's draft (or none) replaces [*]'s
            at = [i for i, a in enumerate(inherited) if a == "-md"]
            inherited = [a for i, a in enumerate(inherited) if not any(i in (j, j + 1) for j in at)]
        own.args = inherited + own.args
        if not own.draft_given:
            own.draft, own.draft_given = common.draft, common.draft_given
        out[name] = own
    return out, common
