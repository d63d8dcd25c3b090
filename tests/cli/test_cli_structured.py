"""`specserve generate --json-schema / --grammar`: constrained output, clear refusals."""
from __future__ import annotations

import json
import subprocess
import sys

import jsonschema

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}


def specserve(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "specserve", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_json_schema_output_validates_and_stats_carry_grammar_time(tiny_paths, tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SCHEMA))
    r = specserve("generate", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "--spec", "draft",
                  "--json-schema", f, "-p", "hello", "-n", 40, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert out["stats"]["finish_reason"] == "stop" and out["stats"]["t_grammar_s"] > 0


def test_gbnf_and_lark_grammar_files(tiny_paths, tmp_path):
    gbnf, lark = tmp_path / "g.gbnf", tmp_path / "g.lark"
    gbnf.write_text('root ::= "yes" | "no"\n')
    lark.write_text('start: "up" | "down"\n')
    for f, allowed in ((gbnf, ("yes", "no")), (lark, ("up", "down"))):
        r = specserve("generate", "-m", tiny_paths["target"], "--spec", "ngram", "--grammar", f, "-p", "hi", "-n", 9)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() in allowed and "grammar" in r.stderr


def test_bad_schema_and_grammar_exit_2_with_the_reason(tiny_paths, tmp_path):
    cases = [("--json-schema", '{"type": "object", "if": {}}', '"if"'),
             ("--json-schema", '{"type": ', "not valid JSON"),
             ("--grammar", 'root ::= "x', "GBNF")]
    for flag, text, message in cases:
        f = tmp_path / "bad"
        f.write_text(text)
        r = specserve("generate", "-m", tiny_paths["target"], flag, f, "-p", "x")
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
