"""The statistics every generation returns (and the server exports)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    """What one generation did, step by step.

    A *step* is one forward pass of the target model; the prompt's prefill is step 1 and yields
    the first token. ``accepted_per_step[i]`` counts the proposed tokens step i accepted (the
    bonus token excluded), ``proposed_per_step[i]`` the tokens it proposed (the candidate
    tree's nodes) and ``forward_tokens_per_step[i]`` the tokens fed to that forward pass.
    ``accepted_per_position[k]`` counts the steps that accepted at least k + 1 tokens.
    ``shape_source`` (lookahead only, else None): what chose the window, ngram and guess --
    the tuning profile's path, "default" (no profile: the untuned shape) or "given" (the
    caller's window). ``cached_prompt_tokens``: the prompt's first tokens whose KV entries
    came from an earlier text (``lookahead.prefix_cache``), not from this prefill.
    """

    method: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    time_to_first_token: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list)
    proposed_per_step: list[int] = field(default_factory=list)
    forward_tokens_per_step: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    shape_source: str | None = None
    cached_prompt_tokens: int = 0

    def record_step(self, forward_tokens: int, proposed: int, accepted: int) -> None:
        """Count one forward pass that proposed ``proposed`` tokens and accepted ``accepted``."""
        self.steps += 1
        self.forward_tokens_per_step.append(forward_tokens)
        self.proposed_per_step.append(proposed)
        self.accepted_per_step.append(accepted)
        missing = accepted - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)
        for k in range(accepted):
            self.accepted_per_position[k] += 1

    @property
    def tokens_per_step(self) -> float:
        """New tokens per forward pass of the target (the compression ratio)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """Proposed tokens accepted per step that proposed any."""
        counts = [a for a, p in zip(self.accepted_per_step, self.proposed_per_step) if p > 0]
        return sum(counts) / len(counts) if counts else 0.0

    @property
    def mean_forward_tokens(self) -> float:
        steps = self.forward_tokens_per_step[1:]  # the prefill is not a decoding step
        return sum(steps) / len(steps) if steps else 0.0

    def as_dict(self) -> dict:
        """Plain data for JSON, logs and the HTTP API, with the derived figures."""
        data = asdict(self)
        data.update(
            tokens_per_step=self.tokens_per_step,
            tokens_per_second=self.tokens_per_second,
            mean_accepted=self.mean_accepted,
            mean_forward_tokens=self.mean_forward_tokens,
        )
        return data
