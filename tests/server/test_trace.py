"""The trace of who produced each token (server/trace.py): runs that follow the streamed text.

The text comes from the real StreamDecoder, fed as the engine's commit feeds it, so what is
checked is what a client gets: each chunk's runs concatenate to its text, a character goes
to the token that completed it, text held back for a stop string arrives with its source.
"""
import random

from specserve.auto import Controller
from specserve.slot import Chunk
from specserve.server.core.trace import Tracer, sources, target_alone_tokens_per_s
from specserve.stats import GenerationStats
from specserve.text import StreamDecoder


def run(steps, pieces, stop=()):
    """steps: [(token ids, drafter, n drafted)] -> [(chunk text, trace)], as the engine and server make them."""
    decoder, tracer, out = StreamDecoder(pieces.__getitem__, stop), Tracer(pieces.__getitem__, keep=True), []
    for i, (tokens, drafter, n) in enumerate(steps):
        text, _ = decoder.push(tokens)
        if i == len(steps) - 1:
            text += decoder.flush()
        out.append((text, tracer.feed(Chunk(tokens, text, drafter, n))))
    return out, tracer


def runs(trace):
    return [(e["text"], e["source"]) for e in trace]


def test_sources_are_the_kept_draft_then_the_target():
    assert sources(Chunk([1, 2, 3], "", "draft", 2)) == ["draft", "draft", "target"]
    assert sources(Chunk([7], "", None, 0)) == ["target"]
    assert sources(Chunk([4, 5], "", "grammar", 2)) == ["grammar", "grammar"]  # a name passes through


def test_ascii_tokens_give_one_run_each():
    pieces = {1: b"def", 2: b" f", 3: b"(x", 4: b"):", 5: b"\n"}
    out, _ = run([([1, 2, 3], "draft", 2), ([4, 5], "ngram", 1)], pieces)
    assert runs(out[0][1]) == [("def", "draft"), (" f", "draft"), ("(x", "target")]
    assert runs(out[1][1]) == [("):", "ngram"), ("\n", "target")]


def test_a_character_split_across_tokens_goes_to_the_token_that_completes_it():
    pieces = {1: b"a", 2: "é".encode()[:1], 3: "é".encode()[1:] + b"b"}
    out, _ = run([([1, 2], "draft", 2), ([3], None, 0)], pieces)
    assert out[0][0] == "a" and runs(out[0][1]) == [("a", "draft")]  # é waits for its second byte
    assert runs(out[1][1]) == [("éb", "target")]


def test_text_held_back_for_a_stop_string_arrives_later_with_its_source():
    pieces = {1: b"abc E", 2: b"NX", 3: b"yz"}
    out, _ = run([([1], "suffix", 1), ([2, 3], "draft", 1)], pieces, stop=("END",))
    assert runs(out[0][1]) == [("abc", "suffix")]  # " E" might start END: held back (its length - 1)
    assert runs(out[1][1]) == [(" E", "suffix"), ("NX", "draft"), ("yz", "target")]


def test_runs_concatenate_to_each_chunk_whatever_the_bytes():
    rng = random.Random(0)
    alphabet = list("aé東🙂 E".encode()) + [0xFF, 0x80, 0xC3]  # multi-byte characters and invalid bytes
    pieces = {i: bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for i in range(64)}
    for _ in range(300):
        steps = []
        for _ in range(rng.randint(1, 8)):
            n = rng.randint(0, 4)
            steps.append(([rng.randrange(64) for _ in range(n + 1)], rng.choice(["draft", "ngram", None]), n))
        out, tracer = run(steps, pieces, stop=rng.choice([(), ("EE",)]))
        for text, trace in out:
            assert "".join(e["text"] for e in trace) == text
            assert all(e["text"] for e in trace)
        assert "".join(e["text"] for e in tracer.entries) == "".join(t for t, _ in out)


def test_target_alone_speed_only_once_a_one_token_pass_was_measured():
    ctl, stats = Controller(), GenerationStats()
    assert target_alone_tokens_per_s(ctl, stats) is None
    ctl.costs.verify.add(5, 0.05)  # a 5-token pass does not tell what one token costs
    assert target_alone_tokens_per_s(ctl, stats) is None
    ctl.costs.verify.add(1, 0.02)
    assert target_alone_tokens_per_s(ctl, stats) == 50.0
    assert target_alone_tokens_per_s(None, stats) is None


def test_target_alone_speed_pays_the_requests_own_cost_beside_its_passes():
    ctl = Controller()
    ctl.costs.verify.add(1, 0.02)
    # 10 steps in 1.1 s after the prompt, 0.5 s of them drafting and 0.5 s verifying: 0.01 s a step beside both
    stats = GenerationStats(n_passes=10, t_prompt=0.1, t_total=1.2, t_draft=0.5, t_verify=0.5)
    assert target_alone_tokens_per_s(ctl, stats) == round(1 / 0.03, 2)


def test_a_drafted_run_says_where_the_drafter_found_it():
    """A suffix draft copied from an earlier request: its runs carry the drafter's note (which
    continuation, of how many); the target's own token carries none."""
    note = {"continuations": 2, "share": 0.667, "requests_ago": 1, "same_request": True}
    tracer = Tracer(lambda t: b"ab"[t:t + 1])
    runs = tracer.feed(Chunk([0, 1], "ab", "suffix", 1, note))
    assert runs == [{"text": "a", "source": "suffix", "from": note}, {"text": "b", "source": "target"}]
