"""Incremental detokenization: streamed text equals the whole text, however tokens are grouped."""
import random

from specserve.text import StreamDecoder

PIECES = {i: bytes([i]) for i in range(256)}


def stream(chunks, stop=()):
    d = StreamDecoder(PIECES.__getitem__, stop)
    out = "".join(d.push(c)[0] for c in chunks)
    return out + d.flush(), d.stopped


def test_any_grouping_of_any_bytes_decodes_like_the_whole():
    rng = random.Random(0)
    alphabet = list("aé東🙂".encode()) + [0xFF, 0x80, 0xC3]  # valid multi-byte characters and invalid bytes
    for _ in range(2000):
        data = [rng.choice(alphabet) for _ in range(rng.randint(0, 24))]
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 5))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        assert stream(chunks)[0] == bytes(data).decode("utf-8", errors="replace")


def test_stop_string_split_across_tokens_is_cut_and_never_emitted():
    text, stopped = stream([list(b"Hello, wor"), list(b"ld! END"), list(b"more")], stop=("ld! E",))
    assert stopped and text == "Hello, wor"


def test_text_that_only_looks_like_a_stop_prefix_is_released():
    text, stopped = stream([list(b"abc EN"), list(b"X")], stop=("END",))
    assert not stopped and text == "abc ENX"
