"""Model discovery: the GGUF models a router can serve, found where users already keep them.

`discover(models_dir, stores)` lists a `Found` per model, named as the tool that keeps it names it:

- `--models-dir DIR` (llama-server's): each `*.gguf` is a model named by its file name without `.gguf`;
  a folder holding one model (one GGUF, or the split parts `NAME-00001-of-0000N.gguf`) is a model named
  by the folder; split parts lying in DIR itself are one model, NAME. `mmproj*` files are projectors,
  not models.
- `ollama`: `$OLLAMA_MODELS` or `~/.ollama/models`; `manifests/REGISTRY/NAMESPACE/NAME/TAG` is JSON whose
  layer of media type `application/vnd.ollama.image.model` names the GGUF blob, `blobs/sha256-HEX`.
  Named as Ollama names it: `qwen2.5-coder:1.5b` for the library, `NS/NAME:TAG` for another namespace,
  `REGISTRY/NS/NAME:TAG` for another registry.
- `lmstudio`: `~/.lmstudio/models` or `~/.cache/lm-studio/models`, `PUBLISHER/REPO/*.gguf`: `PUBLISHER/REPO`
  (`PUBLISHER/REPO/STEM` where the folder holds several models).
- `hf`: the Hugging Face hub cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`),
  `models--ORG--REPO/snapshots/REV/**.gguf`: `ORG/REPO` (`ORG/REPO:STEM` for several).
- `llama.cpp`: `$LLAMA_CACHE` or `~/.cache/llama.cpp`: its -hf downloads named `USER/MODEL:TAG` by their
  `manifest=USER=MODEL=TAG.json`, other GGUFs as in a models dir (and a hub cache where it holds one).
- `packaged`: specserve's own pulled models (`specserve models list`).

A model that cannot be served as found (a manifest naming a missing or truncated blob, a split part
missing, a file that is not GGUF) is listed with `error` saying why, so that the router shows it failed
instead of hiding it. Nothing here reads more than a file's first bytes.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

log = logging.getLogger("specserve.stores")

STORES = ("ollama", "lmstudio", "hf", "llama.cpp", "packaged")
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
_SPLIT = re.compile(r"^(?P<base>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Found:
    """One discovered model: its name, the file llama.cpp opens (a split model's first part), the store
    it came from, its bytes on disk (all parts), and why it cannot be served (None where it can)."""
    name: str
    path: Path | None
    store: str
    size: int = 0
    error: str | None = None


def looks_like_path(name: str) -> bool:
    """A model name that reads as a file path (absolute, relative, home, Windows, a `.gguf` file): a
    request may name models only as discovered, never open a file of its choosing."""
    return (name.startswith(("/", "~", "./", "../", "\\")) or "\\" in name or name.endswith(".gguf")
            or any(part in ("..", ".") for part in name.split("/")) or "//" in name
            or bool(re.match(r"^[A-Za-z]:[\\/]", name)) or "\x00" in name)


def _is_projector(path: Path) -> bool:
    return path.name.lower().startswith("mmproj")


def _not_gguf(path: Path) -> str | None:
    """Why `path` is not a GGUF file llama.cpp could open (None where its first bytes say it is one)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        return f"cannot read {path.name}: {e.strerror or e}"
    return None if magic == _GGUF_MAGIC else f"{path.name} is not a GGUF file (it starts {magic!r}, not b'GGUF')"


def from_file(name: str, path: Path, store: str) -> Found:
    """One model from its file (a preset's `model = PATH`), or why it cannot be served."""
    if not path.is_file():
        return Found(name, path, store, 0, f"{path}: no such file")
    return _checked(name, path, store)


def _checked(name: str, path: Path, store: str, size: int | None = None) -> Found:
    try:
        size = path.stat().st_size if size is None else size
    except OSError as e:
        return Found(name, path, store, 0, f"cannot read {path.name}: {e.strerror or e}")
    return Found(name, path, store, size, _not_gguf(path))


def _split_model(name: str, parts: list[Path], store: str) -> Found:
    """One model from its split parts (`NAME-0000I-of-0000N.gguf`): every part present, the first opened."""
    parts = sorted(parts)
    count = int(_SPLIT.match(parts[0].name)["count"])
    have = {int(_SPLIT.match(p.name)["part"]) for p in parts}
    missing = sorted(set(range(1, count + 1)) - have)
    first = parts[0]
    if missing:
        return Found(name, first, store, 0, f"split model: part(s) {', '.join(map(str, missing))} of {count} "
                                            f"missing beside {first.name}")
    found = _checked(name, first, store, sum(p.stat().st_size for p in parts))
    return found


def _models_in(folder: Path) -> list[tuple[str | None, list[Path]]]:
    """The models among a folder's own GGUF files: (stem, [file]) each, or (base, parts) per split set."""
    singles, splits = [], {}
    for f in sorted(folder.glob("*.gguf")):
        if not f.is_file() or _is_projector(f):
            continue
        m = _SPLIT.match(f.name)
        if m:
            splits.setdefault(m["base"], []).append(f)
        else:
            singles.append((f.name[:-len(".gguf")], [f]))
    return singles + list(splits.items())


def _model(name: str, files: list[Path], store: str) -> Found:
    return _split_model(name, files, store) if _SPLIT.match(files[0].name) else _checked(name, files[0], store)


def scan_models_dir(root: Path, store: str = "models-dir") -> list[Found]:
    """llama-server's --models-dir: the folder's GGUFs and split sets by name, each sub-folder holding one
    model by the folder's name (a sub-folder of several models: each by FOLDER/STEM)."""
    found = [_model(stem, files, store) for stem, files in _models_in(root)]
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        inside = _models_in(sub)
        if len(inside) == 1:
            found.append(_model(sub.name, inside[0][1], store))
        else:
            found += [_model(f"{sub.name}/{stem}", files, store) for stem, files in inside]
    return found


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """Ollama's name for a manifest's path: `model:tag` in the library, else with its namespace (and registry)."""
    if registry == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def _ollama_model(name: str, manifest: Path, blobs: Path) -> Found:
    shown = "/".join(manifest.parts[-4:])  # REGISTRY/NAMESPACE/MODEL/TAG under manifests/
    try:
        layers = json.loads(manifest.read_text())["layers"]
        layer = next(x for x in layers if x.get("mediaType") == OLLAMA_MODEL_LAYER)
        digest, size = str(layer["digest"]), int(layer["size"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, StopIteration):
        return Found(name, None, "ollama", 0, f"manifest {shown} is not an Ollama manifest with a model layer")
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
        return Found(name, None, "ollama", 0, f"manifest {shown}: model layer digest {digest!r} is not sha256:HEX")
    blob = blobs / f"sha256-{hexdigest}"
    if not blob.is_file():
        return Found(name, blob, "ollama", size, f"blob {blob.name} named by the manifest is missing from {blobs}")
    actual = blob.stat().st_size
    if actual != size:
        return Found(name, blob, "ollama", actual, f"blob {blob.name} is {actual} bytes, the manifest says {size} "
                                                   "(truncated or still downloading)")
    return _checked(name, blob, "ollama", size)


def scan_ollama(root: Path) -> list[Found]:
    """Ollama's store: every manifest with a GGUF model layer (depth 4 under manifests/)."""
    manifests, blobs = root / "manifests", root / "blobs"
    if not manifests.is_dir():
        return []
    return [_ollama_model(ollama_name(*m.relative_to(manifests).parts), m, blobs)
            for m in sorted(manifests.glob("*/*/*/*")) if m.is_file()]


def _named_folder(prefix: str, folder: Path, store: str, sep: str) -> list[Found]:
    inside = _models_in(folder)
    if len(inside) == 1:
        return [_model(prefix, inside[0][1], store)]
    return [_model(f"{prefix}{sep}{stem}", files, store) for stem, files in inside]


def scan_lmstudio(root: Path) -> list[Found]:
    """LM Studio's models folder: PUBLISHER/REPO/*.gguf."""
    return [m for repo in sorted(root.glob("*/*")) if repo.is_dir()
            for m in _named_folder(f"{repo.parent.name}/{repo.name}", repo, "lmstudio", "/")]


def _hf_snapshot(repo: Path) -> Path | None:
    """The revision refs/main names, else the newest snapshot."""
    try:
        rev = (repo / "refs" / "main").read_text().strip()
        if (repo / "snapshots" / rev).is_dir():
            return repo / "snapshots" / rev
    except OSError:
        pass
    snaps = [s for s in (repo / "snapshots").glob("*") if s.is_dir()]
    return max(snaps, key=lambda s: s.stat().st_mtime) if snaps else None


def scan_hf(root: Path, store: str = "hf") -> list[Found]:
    """The Hugging Face hub cache: models--ORG--REPO/snapshots/REV/**.gguf (files are links to blobs/)."""
    found = []
    for repo in sorted(root.glob("models--*")):
        snapshot = _hf_snapshot(repo)
        if snapshot is None:
            continue
        name = repo.name.removeprefix("models--").replace("--", "/", 1)
        for folder in sorted({f.parent for f in snapshot.rglob("*.gguf")}):
            found += _named_folder(name if folder == snapshot else f"{name}/{folder.relative_to(snapshot)}",
                                   folder, store, ":")
    return found


def _llama_cpp_manifests(root: Path) -> list[Found]:
    """llama.cpp's -hf downloads: `manifest=USER=MODEL=TAG.json` (the hub's answer, naming its `ggufFile`) beside
    the file `USER_MODEL_RFILENAME.gguf`; named `USER/MODEL:TAG`, as llama-server's router names them."""
    found = []
    for manifest in sorted(root.glob("manifest=*=*=*.json")):
        _, user, model, tag = manifest.name[:-len(".json")].split("=", 3)
        name = f"{user}/{model}:{tag}"
        try:
            rfilename = json.loads(manifest.read_text())["ggufFile"]["rfilename"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            found.append(Found(name, None, "llama.cpp", 0, f"{manifest.name} names no ggufFile"))
            continue
        path = root / f"{user}/{model}_{rfilename}".replace("/", "_")
        found.append(_checked(name, path, "llama.cpp") if path.is_file() else
                     Found(name, path, "llama.cpp", 0, f"{path.name}, named by {manifest.name}, is not in the cache"))
    return found


def scan_llama_cpp(root: Path) -> list[Found]:
    """llama.cpp's cache: its -hf downloads by their manifests, other GGUFs as a models dir, and a hub cache where
    it holds one."""
    named = _llama_cpp_manifests(root)
    claimed = {f.path.name[:-len(".gguf")] for f in named if f.path is not None}
    rest = [f for f in scan_models_dir(root, "llama.cpp") if f.name not in claimed]
    return named + rest + scan_hf(root, "llama.cpp")


def scan_packaged() -> list[Found]:
    from . import models

    return [_checked(m.name, m.path, "packaged") for m in models.list_models() if m.present]


def store_roots(env: Mapping[str, str] | None = None, home: Path | None = None) -> dict[str, list[Path]]:
    """Where each store is looked for, first existing folder wins."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else home / ".cache" / "huggingface"
    return {"ollama": [Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"],
            "lmstudio": [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"],
            "hf": [Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else hf_home / "hub"],
            "llama.cpp": [Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else home / ".cache" / "llama.cpp"]}


def parse_stores(text: str) -> tuple[str, ...]:
    """--models-from: comma-separated store names, or `all`. Raises ValueError naming the known ones."""
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if "all" in names:
        return STORES
    unknown = [n for n in names if n not in STORES]
    if unknown or not names:
        raise ValueError(f"--models-from: unknown store(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(STORES)}, all")
    return tuple(dict.fromkeys(names))


def _scan(store: str, roots: dict[str, list[Path]]) -> Iterator[Found]:
    if store == "packaged":
        yield from scan_packaged()
        return
    scanner = {"ollama": scan_ollama, "lmstudio": scan_lmstudio, "hf": scan_hf, "llama.cpp": scan_llama_cpp}[store]
    root = next((r.expanduser() for r in roots[store] if r.expanduser().is_dir()), None)
    if root is not None:
        yield from scanner(root)


def discover(models_dir: str | os.PathLike | None = None, stores: Sequence[str] = (),
             env: Mapping[str, str] | None = None, home: Path | None = None) -> list[Found]:
    """Every model of --models-dir and the stores, in that order; a name found twice keeps its first."""
    roots = store_roots(env, home)
    found: list[Found] = []
    if models_dir is not None:
        root = Path(models_dir).expanduser()
        if not root.is_dir():
            raise ValueError(f"--models-dir {models_dir}: not a folder")
        found += scan_models_dir(root)
    for store in stores:
        found += _scan(store, roots)
    seen: dict[str, Found] = {}
    for f in found:
        if f.name in seen:
            log.warning("model %s found in %s and %s: serving the first", f.name, seen[f.name].store, f.store)
        else:
            seen[f.name] = f
    return list(seen.values())


def lookup(name: str, names: Sequence[str]) -> str | None:
    """The discovered name a request's `name` means: itself, or with Ollama's default tag added or dropped."""
    if name in names:
        return name
    for other in (f"{name}:latest", name.removesuffix(":latest")):
        if other in names:
            return other
    return None
