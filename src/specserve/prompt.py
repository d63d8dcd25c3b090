"""Prompt text -> target token ids, for plain and chat prompts.

In a chat, only the template's own markup may produce control tokens (`<|im_start|>`,
`<|im_end|>`, ...) and the added tokens it spells (Qwen2.5's `<tool_call>`, which llama.cpp
splits out of any text, parse_special or not). What the client sent is text: message content, a tool's
definition, a past call's arguments. Spelling such a token in it must not close the turn and
open a system one, or open a tool call. So where any of it spells one, the template is
rendered with a placeholder in its place, and the rendered text is tokenized the way
llama.cpp does it (special tokens split out first, the text between tokenized plainly), the
placeholder's text counting as plain text (an added token spelled there is cut before its
last character, so that llama.cpp cannot find it). Chats that spell none are tokenized as
before, in one call. (llama-server and vLLM tokenize the whole rendering with special tokens
parsed: there a tool description saying `<|im_end|>` ends the system turn.)
"""
from __future__ import annotations

import bisect
import json
import re
import secrets
import weakref

from .chat import ChatTemplateError, render_for, validate_messages

# llama_token_attr bits: parse_special=False skips CONTROL and UNKNOWN tokens' texts (not USER_DEFINED ones)
_ATTR_UNKNOWN, _ATTR_CONTROL, _ATTR_USER_DEFINED = 1 << 0, 1 << 3, 1 << 4
_ATTR_LSTRIP, _ATTR_RSTRIP = 1 << 7, 1 << 8
_ASCII_SPACE = " \t\n\v\f\r"  # C isspace, which llama.cpp's LSTRIP/RSTRIP strip
_specials_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def prompt_tokens(model, prompt: str, chat: bool = False) -> list[int]:
    """Tokenize a prompt; with chat=True wrap it as one user message in the chat template."""
    if chat:
        return chat_tokens(model, [{"role": "user", "content": prompt}])
    return model.tokenize(prompt, add_special=True, parse_special=False)


def control_tokens(model) -> "_ControlTokens":
    """The tokens a text may produce only where the template wrote them, cached per model: those only
    parse_special=True produces (CONTROL and UNKNOWN ones), and the added ones (USER_DEFINED) that the
    chat template spells as markup (Qwen2.5's `<tool_call>`; not Gemma's `<b>`, which is text)."""
    try:
        return _specials_cache[model]
    except (KeyError, TypeError):
        pass
    found = _ControlTokens(model.vocab, model.metadata.get("tokenizer.chat_template") or "")
    try:
        _specials_cache[model] = found
    except TypeError:
        pass
    return found


class _ControlTokens:
    """(text, id, attr) of the control tokens, grouped by their first characters so that finding
    which occur in a text takes a scan per group, not per token (Gemma has 6250 of them)."""

    PREFIX = 4

    def __init__(self, vocab, template: str = "") -> None:
        self.groups: dict[str, list[tuple[str, int, int]]] = {}
        for i, (text, attr) in enumerate(zip(vocab.token_texts, vocab.token_attrs)):
            if text and (attr & (_ATTR_CONTROL | _ATTR_UNKNOWN) or attr & _ATTR_USER_DEFINED and text in template):
                self.groups.setdefault(text[:self.PREFIX], []).append((text, i, attr))

    def occurring(self, text: str) -> list[tuple[str, int, int]]:
        """Those whose text occurs in `text`, longest first (the order in which llama.cpp splits
        them out; equal lengths by id)."""
        found = [s for prefix, group in self.groups.items() if prefix in text for s in group if s[0] in text]
        return sorted(found, key=lambda s: (-len(s[0]), s[1]))


def chat_tokens(model, messages, tools: list | None = None, continue_final: bool = False,
                template_kwargs: dict | None = None) -> list[int]:
    """Render messages (and OpenAI `tools`, for the template) with the model's template and
    tokenize: the template's markup with its control tokens, what the client sent (content, tool
    definitions, call arguments) as plain text (see the module docstring).

    Templates that write the BOS text themselves would get a second BOS from the
    tokenizer; it is dropped. `continue_final`: the last (assistant) message is continued;
    `template_kwargs`: more variables for the template (chat.render).
    """
    msgs = validate_messages(messages)
    specials = control_tokens(model)
    spelled = specials.occurring("\x00".join(_texts([msgs, tools])))  # a false find costs time, not tokens
    if not spelled:
        tokens = model.tokenize(render_for(model, msgs, tools, continue_final, template_kwargs), add_special=True,
                                parse_special=True)
    else:
        tokens = _tokens_with_plain_content(model, msgs, spelled, specials, tools, continue_final, template_kwargs)
    bos = model.vocab.bos
    if bos is not None and len(tokens) >= 2 and tokens[0] == bos and tokens[1] == bos:
        tokens = tokens[1:]
    return tokens


def _tokens_with_plain_content(model, msgs: list[dict], spelled, specials, tools: list | None,
                               continue_final: bool = False, template_kwargs: dict | None = None) -> list[int]:
    nonce = "".join(secrets.choice("0123456789") for _ in range(16))  # digits: no filter changes them
    literals: list[str] = []

    def escape(value, encoded: bool):
        """value with each spelled token in its strings (dict keys too) replaced by a placeholder."""
        if isinstance(value, dict):
            return {escape(k, encoded): escape(v, encoded) for k, v in value.items()}
        if isinstance(value, list):
            return [escape(v, encoded) for v in value]
        if not isinstance(value, str):
            return value
        pieces, pos = [], 0
        for start, end, _ in _split_out(value, spelled, ()):
            literals.append(value[start:end])
            # \x01: a character every JSON encoder escapes (tojson with ensure_ascii=False included), so a
            # template that escapes content loses the placeholder and is refused below. Tool definitions
            # and call arguments are rendered with tojson: their placeholder leaves it out, for a token's
            # text that JSON leaves as it is.
            mark = "" if encoded and json.dumps(literals[-1], ensure_ascii=False)[1:-1] == literals[-1] else "\x01"
            pieces += [value[pos:start], f"\ue000{mark}{nonce}.{len(literals) - 1}\ue001"]
            pos = end
        return "".join(pieces) + value[pos:]

    escaped = [{k: escape(v, k != "content") for k, v in m.items()} for m in msgs]
    rendered = render_for(model, escaped, escape(tools, True), continue_final, template_kwargs)
    # The rendered text with each placeholder's own text back in place; those spans stay plain text.
    parts = re.split(f"\ue000\x01?{nonce}\\.(\\d+)\ue001", rendered)
    text, zones = [], []
    pos = 0
    for k, part in enumerate(parts):
        if k % 2:
            part = literals[int(part)]
            zones.append((pos, pos + len(part)))
        elif nonce in part:
            raise ChatTemplateError("a message spells a control token and this model's chat template changes "
                                    "message content in a way that keeps it from being tokenized as plain text")
        text.append(part)
        pos += len(part)
    text = "".join(text)
    return _tokenize_outside(model, text, zones, specials.occurring(text))


def _texts(value):
    """Every string in messages and tools (dict keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _texts(k)
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def _split_out(text: str, specials, zones) -> list[tuple[int, int, tuple]]:
    """Where llama.cpp would split `specials` out of `text` (longest first, each found left to
    right in what is left), skipping matches that touch a zone: [(start, end, special)], sorted."""
    raw = [(0, len(text))]
    found = []
    starts = [z[0] for z in zones]
    for special in specials:
        t = special[0]
        if t not in text:
            continue
        pieces = []
        for a, b in raw:
            p = text.find(t, a, b)
            while p != -1:
                q = p + len(t)
                i = bisect.bisect_left(starts, q)  # zones starting before q
                if i and zones[i - 1][1] > p:  # overlaps a zone: user text, not a token
                    p = text.find(t, p + 1, b)
                    continue
                pieces.append((a, p))
                found.append((p, q, special))
                a = q
                p = text.find(t, a, b)
            pieces.append((a, b))
        raw = [(a, b) for a, b in pieces if b > a]
    return sorted(found, key=lambda f: f[0])


def _tokenize_outside(model, text: str, zones, specials: list) -> list[int]:
    """Tokenize as llama.cpp does with parse_special=True, except that no control token is
    taken from inside `zones`: control tokens split out, every stretch between them tokenized
    plainly (as llama.cpp tokenizes each on its own, with its SPM space prefix), BOS/EOS added.
    An added token's text inside a zone is cut before its last character (each side tokenized on
    its own), since llama.cpp splits added tokens out of plain text too."""
    v = model.vocab
    tokens = [v.bos] if v.add_bos and v.bos is not None else []
    pos = 0
    found = _split_out(text, specials, zones)
    added = [t for t, _, attr in specials if attr & _ATTR_USER_DEFINED]
    cuts = sorted({a + p + len(t) - 1 for a, b in zones for t in added for p in _finds(text[a:b], t)})

    def plain(a: int, b: int) -> list[int]:
        out = []
        for c in [*cuts[bisect.bisect_right(cuts, a):bisect.bisect_left(cuts, b)], b]:
            out += model.tokenize(text[a:c], add_special=False, parse_special=False)
            a = c
        return out

    for k, (start, end, (_, token, attr)) in enumerate(found):
        stop = start
        if attr & _ATTR_LSTRIP:
            while stop > pos and text[stop - 1] in _ASCII_SPACE:
                stop -= 1
        if stop > pos:
            tokens += plain(pos, stop)
        tokens.append(token)
        pos = end
        if attr & _ATTR_RSTRIP:
            limit = found[k + 1][0] if k + 1 < len(found) else len(text)
            while pos < limit and text[pos] in _ASCII_SPACE:
                pos += 1
    if pos < len(text):
        tokens += plain(pos, len(text))
    if v.add_eos and v.eos is not None:
        tokens.append(v.eos)
    return tokens


def _finds(text: str, t: str) -> list[int]:
    """Where t occurs in text, overlapping occurrences included."""
    found, p = [], text.find(t)
    while p != -1:
        found.append(p)
        p = text.find(t, p + 1)
    return found
