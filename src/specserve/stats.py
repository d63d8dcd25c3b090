"""Per-generation statistics: what speculation did and what it cost."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens whose KV was already in the slot's cache (prefix reuse)
    n_generated: int = 0
    n_passes: int = 0  # target forward passes while decoding (the prompt pass not counted)
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    k_chosen: Counter = field(default_factory=Counter)  # draft length chosen each step (0 = plain decoding)
    drafter_steps: Counter = field(default_factory=Counter)  # steps per drafter ("none" when off)
    t_prompt: float = 0.0  # the target's prompt processing
    t_prompt_draft: float = 0.0  # the draft model's, when it took the prompt up front (part of t_draft)
    t_draft: float = 0.0  # drafting: the draft model's passes and draws, lookups, the policy's choice
    t_verify: float = 0.0  # the target's pass over each step's tokens, and verification
    t_forward: float = 0.0  # of the time after the target's prompt: forward passes (target and draft)
    t_grammar: float = 0.0  # grammar work: masks, the matcher, forced tokens (part of draft, verify, python)
    t_total: float = 0.0
    t_first_token: float = 0.0
    predicted_tokens_per_s: float = 0.0  # the controller's own forecast, when it makes one
    finish_reason: str = ""
    stop_word: str = ""  # the stop string that ended the text, if one did
    grammar_error: str | None = None  # why a grammar ended the text with no way forward

    def record_step(self, drafter: str, k: int, n_drafted: int, n_accepted: int) -> None:
        self.n_passes += 1
        self.k_chosen[k] += 1
        self.drafter_steps[drafter if n_drafted else "none"] += 1
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        grow = n_drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(n_drafted):
            self.drafted_by_position[i] += 1
        for i in range(n_accepted):
            self.accepted_by_position[i] += 1

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """tau: tokens emitted per target pass (1 + accepted drafts per pass)."""
        return 1.0 + self.n_accepted / self.n_passes if self.n_passes else 0.0

    @property
    def t_decode(self) -> float:
        return max(self.t_total - self.t_prompt, 1e-9)

    @property
    def t_python(self) -> float:
        """Time in our own code while decoding: everything that was not a forward pass."""
        return max(self.t_decode - self.t_forward, 0.0) if self.t_total else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.t_decode if self.n_generated else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        evaluated = self.n_prompt - self.n_cached
        return evaluated / self.t_prompt if self.t_prompt > 0 and evaluated > 0 else 0.0

    def as_dict(self) -> dict:
        off = self.k_chosen.get(0, 0)
        return {
            "n_prompt": self.n_prompt,
            "n_cached": self.n_cached,
            "n_generated": self.n_generated,
            "n_passes": self.n_passes,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance": round(self.acceptance, 4),
            "mean_accepted_len": round(self.mean_accepted_len, 4),
            "drafted_by_position": list(self.drafted_by_position),
            "accepted_by_position": list(self.accepted_by_position),
            "acceptance_by_position": [
                round(a / d, 4) if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)
            ],
            "k_histogram": {str(k): v for k, v in sorted(self.k_chosen.items())},
            "share_steps_off": round(off / self.n_passes, 4) if self.n_passes else 0.0,
            "drafter_steps": dict(self.drafter_steps),
            "t_prompt_s": round(self.t_prompt, 4),
            "t_prompt_draft_s": round(self.t_prompt_draft, 4),
            "t_draft_s": round(self.t_draft, 4),
            "t_verify_s": round(self.t_verify, 4),
            "t_forward_s": round(self.t_forward, 4),
            "t_python_s": round(self.t_python, 4),
            "t_grammar_s": round(self.t_grammar, 4),
            "grammar_ms_per_token": round(1000 * self.t_grammar / self.n_generated, 4) if self.n_generated else 0.0,
            "t_total_s": round(self.t_total, 4),
            "time_to_first_token_s": round(self.t_first_token, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "prompt_tokens_per_s": round(self.prompt_tokens_per_s, 2),
            "predicted_tokens_per_s": round(self.predicted_tokens_per_s, 2),
            "finish_reason": self.finish_reason,
            "stop_word": self.stop_word,
            "grammar_error": self.grammar_error,
        }

    def summary_line(self) -> str:
        line = self._summary()
        if self.predicted_tokens_per_s > 0:  # an adaptive policy ran: show what it decided
            ks = ", ".join(f"{k}:{n}" for k, n in sorted(self.k_chosen.items()))
            off = self.k_chosen.get(0, 0) / self.n_passes if self.n_passes else 0.0
            line += (f"\nauto: off {100 * off:.0f}% of steps | k chosen {{{ks}}} | drafters "
                     f"{dict(self.drafter_steps)} | predicted {self.predicted_tokens_per_s:.1f} tok/s, "
                     f"actual {self.tokens_per_s:.1f}")
        return line

    def _summary(self) -> str:
        return (
            f"prompt {self.n_prompt} tok ({self.n_cached} cached, {self.prompt_tokens_per_s:.1f} tok/s) | "
            f"generated {self.n_generated} tok in {self.t_decode:.2f} s ({self.tokens_per_s:.1f} tok/s) | "
            f"passes {self.n_passes} | drafted {self.n_drafted} accepted {self.n_accepted} "
            f"({100 * self.acceptance:.1f}%) tau {self.mean_accepted_len:.2f} | "
            f"draft {self.t_draft:.2f}s verify {self.t_verify:.2f}s python {self.t_python:.2f}s"
        ) + (f" | grammar {self.t_grammar:.3f}s ({100 * self.t_grammar / self.t_decode:.1f}% of decode)"
             if self.t_grammar else "") + (f"\ngrammar: {self.grammar_error}" if self.grammar_error else "")
