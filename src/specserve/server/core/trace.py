"""Who produced each token: the `"speculative": {"trace": true}` extension (docs/webui.md).

A step commits the draft tokens the target kept, then the target's own token (slot.Chunk
says how many came from which drafter). The answer's text, though, is not cut at token
boundaries: a character whose UTF-8 bytes span two tokens becomes final with the second,
and text that might start a stop string is held back to a later chunk. So the trace follows
the text, not the tokens: each emitted character belongs to the token whose bytes completed
it, and a chunk's trace is its text cut into runs of one token each, in order. The runs'
texts concatenate to exactly the chunk's text, by construction; a token whose text was
held back shows up in the chunk that carries it (split across two chunks if its text was).
"""
from __future__ import annotations

import codecs
from collections import deque
from typing import Callable

from ...auto import Controller
from ...slot import Chunk
from ...stats import GenerationStats

TARGET = "target"  # the source of a token the target wrote itself


def sources(chunk: Chunk) -> list[str]:
    """Per token of the chunk: the drafter that proposed it (and the target kept), or "target"."""
    return [chunk.drafter or TARGET] * chunk.n_drafted + [TARGET] * (len(chunk.tokens) - chunk.n_drafted)


def _run(text: str, source: str, note: dict | None) -> dict:
    """One run of the trace: a drafted token's carries where the drafter found it (`from`), if it says."""
    return {"text": text, "source": source, "from": note} if note else {"text": text, "source": source}


class Tracer:
    """Turns a request's chunks into `[{"text": ..., "source": ...}, ...]`, one run per token; a drafted
    token's run also says where the drafter found it (`"from"`: Draft.note), when the drafter says.

    Decodes each token's bytes on its own (an incremental UTF-8 decoder, as the server's
    text is made) to know how many characters each token completed; the characters of a
    chunk's text are then given out in that order. Where the two decodings could disagree
    (invalid bytes, the U+FFFD of an unfinished character at the end) only the attribution
    of those characters can be off, never the text."""

    def __init__(self, token_bytes: Callable[[int], bytes], keep: bool = False, skip: int = 0):
        self._token_bytes = token_bytes
        self._skip = skip  # leading bytes the text leaves out (token healing's), as text.StreamDecoder does
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._queue: deque[list] = deque()  # [characters not yet emitted, source], per token
        self._last: tuple[str, dict | None] = (TARGET, None)  # the last token's (source, note): the end's flushed text
        self.entries: list[dict] | None = [] if keep else None  # every run so far, when kept
        self.last: list[dict] = []  # the runs of the last chunk fed

    def feed(self, chunk: Chunk) -> list[dict]:
        """The runs of `chunk.text`. Call for every chunk, in order, those without text too."""
        for i, (token, source) in enumerate(zip(chunk.tokens, sources(chunk))):
            piece = self._token_bytes(token)
            if self._skip:
                piece, self._skip = piece[self._skip:], max(0, self._skip - len(piece))
            text = self._decoder.decode(piece)
            note = chunk.note if i < chunk.n_drafted else None
            if text:
                self._queue.append([len(text), source, note])
            self._last = (source, note)
        out, i, text = [], 0, chunk.text
        while i < len(text):
            if self._queue:
                head = self._queue[0]
                n, source, note = min(head[0], len(text) - i), head[1], head[2]
                head[0] -= n
                if not head[0]:
                    self._queue.popleft()
            else:
                n, (source, note) = len(text) - i, self._last
            out.append(_run(text[i:i + n], source, note))
            i += n
        if self.entries is not None:
            self.entries.extend(out)
        self.last = out
        return out


def target_alone_tokens_per_s(controller: Controller | None, stats: GenerationStats) -> float | None:
    """What the target alone would have generated per second for this request, if the server has
    measured it: each of its tokens a 1-token target pass and its verification, as auto measures
    them on the steps it does not draft (auto.cost.VerifyCost), plus what this request's steps cost
    beside their passes (the engine's and the server's own work, which the target alone has too).
    None until a 1-token pass has been measured: the estimate for other lengths does not tell it."""
    if controller is None:
        return None
    with controller.lock:
        passes = controller.costs.verify.state()["passes"]  # [[n, EMA seconds, observations, tick], ...]
    seconds = next((p[1] for p in passes if p[0] == 1), None)
    if not seconds:
        return None
    if stats.n_passes and stats.t_total:
        seconds += max(stats.t_decode - stats.t_draft - stats.t_verify, 0.0) / stats.n_passes
    return round(1 / seconds, 2)
