"""The router's command line (fast tier): which flags reach each model's child, and --models-preset's INI."""
from __future__ import annotations

import pytest

from specserve.cli import build_parser
from specserve.cli.router import _takes_value, child_argv
from specserve.router.preset import read_preset


@pytest.fixture(scope="module")
def serve_parser():
    return build_parser().parse_args(["serve"]).serve_parser


def test_child_gets_the_flags_the_router_does_not_own(serve_parser):
    argv = ["--models-dir", "/m", "--models-max=2", "--no-models-autoload", "--host", "0.0.0.0", "--port", "9",
            "--api-key", "k", "-a", "x", "-c", "2048", "-np", "4", "--spec", "ngram", "--models-from", "ollama",
            "--cors-origin", "http://a", "--no-webui", "-t", "2"]
    assert child_argv(argv, serve_parser) == ["-c", "2048", "-np", "4", "--spec", "ngram", "--no-webui", "-t", "2"]


def test_preset_sections_flags_and_precedence(tmp_path, serve_parser):
    ini = tmp_path / "p.ini"
    ini.write_text("version = 1\n; comment\n[*]\nc = 8192\nmodel-draft = /d/global.gguf\nno-webui = true\n"
                   "[qwen2.5-coder:1.5b]\nctx-size = 4096\nmodel-draft = /d/qwen-0.5b.gguf\nload-on-startup = true\n"
                   "[plain]\nmodel-draft = none\nspec = ngram  ; inline comment\n"
                   "[custom]\nmodel = /models/custom.gguf\nslots = false\n")
    presets, common = read_preset(str(ini), _takes_value(serve_parser))
    q = presets["qwen2.5-coder:1.5b"]
    assert q.args == ["-c", "8192", "--no-webui", "--ctx-size", "4096", "-md", "/d/qwen-0.5b.gguf"]  # [*] first
    assert q.draft == "/d/qwen-0.5b.gguf" and q.load_on_startup and q.model is None
    plain = presets["plain"]
    assert plain.draft is None and plain.draft_given and plain.args[-4:] == ["-md", "none", "--spec", "ngram"]
    assert "/d/global.gguf" not in plain.args  # its own model-draft replaces [*]'s
    custom = presets["custom"]
    assert str(custom.model) == "/models/custom.gguf" and custom.draft == "/d/global.gguf"
    assert "--slots" not in custom.args and "*" not in presets
    assert common.args == ["-c", "8192", "-md", "/d/global.gguf", "--no-webui"] and common.draft_given


@pytest.mark.parametrize("text, error", [
    ("[m]\nno-such-flag = 1\n", "no-such-flag: not a flag of specserve serve"),
    ("[m]\nport = 9\n", "the router sets this"),
    ("[m]\nno-webui = maybe\n", "expected true or false"),
    ("[m\n", "p.ini"),
])
def test_preset_errors_say_what_and_where(tmp_path, serve_parser, text, error):
    ini = tmp_path / "p.ini"
    ini.write_text(text)
    with pytest.raises(ValueError, match=error):
        read_preset(str(ini), _takes_value(serve_parser))


def test_help_documents_the_router_flags(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--models-dir", "--models-from", "--models-max", "--no-models-autoload", "--models-preset",
                 "--models-memory"):
        assert flag in out


def test_child_memory_adds_weights_slots_store_and_process(tiny_paths, serve_parser):
    from specserve.memory import ModelShape, estimate
    from specserve.router.budget import PROCESS_BYTES, child_memory

    target, draft = str(tiny_paths["target"]), str(tiny_paths["draft_close"])
    alone, note = child_memory(["-m", target, "-c", "512", "-np", "2", "--no-cross-request"], serve_parser)
    one = estimate(ModelShape.from_gguf(target), 512)
    assert alone > PROCESS_BYTES + one.weights + 2 * one.kv and "2 slot(s)" in note
    assert child_memory(["-m", target, "-c", "512", "-np", "1", "--no-cross-request"], serve_parser)[0] < alone
    paired, note = child_memory(["-m", target, "-md", draft, "-c", "512", "-np", "2"], serve_parser)
    assert paired > alone + 64 * (1 << 20) and "draft weights" in note and "cross-request store" in note


def test_a_model_without_a_section_gets_the_presets_star(tmp_path, tiny_paths):
    """llama-server's [*] applies to every model; a model with no section of its own got none of it (its
    children drafted with -md auto under a preset saying model-draft = none)."""
    import shutil

    from specserve.cli.router import _models

    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_paths["target"], folder / "alpha.gguf")
    shutil.copy(tiny_paths["target"], folder / "beta.gguf")
    ini = tmp_path / "p.ini"
    ini.write_text("[*]\nmodel-draft = none\nc = 1024\n[beta]\nc = 2048\n")
    argv = ["--models-dir", str(folder), "--models-preset", str(ini)]
    args = build_parser().parse_args(["serve", *argv])
    models, _ = _models(args, args.serve_parser, argv)
    by_name = {m.found.name: m.args for m in models}
    assert by_name["alpha"][-4:] == ["-md", "none", "-c", "1024"] and "auto" not in by_name["alpha"]
    assert by_name["beta"][-6:] == ["-md", "none", "-c", "1024", "-c", "2048"] and "auto" not in by_name["beta"]
