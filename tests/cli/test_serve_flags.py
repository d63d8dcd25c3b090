"""`specserve serve`'s flags -> ServerSettings, before any model loads."""
from specserve.cli import build_parser
from specserve.cli.serve import settings_from


def served_name(*argv: str) -> str:
    args = build_parser().parse_args(["serve", *argv])
    return settings_from(args, "/models/some-target.gguf").model_name


def test_the_served_model_is_named_after_the_pairs_target_without_m():
    assert served_name() == "qwen2.5-coder-1.5b-f16"
    assert served_name("--pair", "smollm2") == "smollm2-f16"


def test_a_packaged_name_a_path_and_an_alias_name_the_model():
    assert served_name("-m", "smollm2-f16") == "smollm2-f16"
    assert served_name("-m", "/models/some-target.gguf") == "some-target"
    assert served_name("--pair", "smollm2", "--alias", "mine") == "mine"
