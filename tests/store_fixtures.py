"""Model stores as users have them, written by the tests: an Ollama store (manifests and sha256 blobs),
LM Studio's and the Hugging Face hub cache's folders. The GGUFs are whatever bytes the test gives
(tiny models from tiny_models.py, or a few bytes where only discovery is tested)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

MODEL_LAYER = "application/vnd.ollama.image.model"


def ollama_model(root: Path, name: str, data: bytes, *, namespace: str = "library",
                 registry: str = "registry.ollama.ai", size: int | None = None, write_blob: bool = True) -> Path:
    """Add `name` (`model:tag`) to the Ollama store at `root` with `data` as its GGUF blob; `size` is what the
    manifest claims (default: the real size; another: a truncated blob), `write_blob=False` leaves it missing."""
    model, _, tag = name.partition(":")
    digest = hashlib.sha256(data).hexdigest()
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    if write_blob:
        (blobs / f"sha256-{digest}").write_bytes(data)
    config = json.dumps({"model_format": "gguf", "model_family": "llama"}).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    (blobs / f"sha256-{config_digest}").write_bytes(config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": f"sha256:{config_digest}", "size": len(config)},
                "layers": [{"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}",
                            "size": len(data) if size is None else size},
                           {"mediaType": "application/vnd.ollama.image.license",
                            "digest": f"sha256:{config_digest}", "size": len(config)}]}
    path = root / "manifests" / registry / namespace / model / (tag or "latest")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def fake_gguf(text: str = "") -> bytes:
    """Bytes that start as a GGUF does (discovery reads no further)."""
    return b"GGUF" + b"\x03\x00\x00\x00" + text.encode()
