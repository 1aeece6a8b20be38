"""How far a lookahead step's proposals reached into the text the model went on to write,
against what the step fed and what it committed: whether a data set is held back by its
candidates (nothing proposed was right) or by the cut (the right tokens were proposed, and
priced out).

Greedy lookahead over a data set, its prompts sharing one ``SuccessorTable`` as ``lookahead
bench``'s and a server's requests do. For every step, each candidate's *reach* is how many of
its tokens match the text that followed x0 (the finished output, which greedy decoding makes
the model's own). Per step it counts the reach of the candidates as fed, the reach of all
the candidates as proposed before the cut, and the tokens fed (candidate tree nodes)::

    python benchmarks/proposal_reach.py --model smollm2-135m \\
        --dataset benchmarks/task-groups-12.jsonl --limit 12 --max-new-tokens 128

Prints tokens a step: committed, reachable with what was fed, reachable with all that was
proposed; then, per source, what its candidates alone would have reached uncut, and what
the cut lost where that source held the longest proposal.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import lookahead.proposers.lookahead as lookahead_proposer
# ab_options: the script beside this one
from ab_options import decoding_arguments, decoding_inputs, proposer
from lookahead import SuccessorTable, generate
from lookahead.bench.datasets import encode_prompt
from lookahead.proposers.gauges import _common_prefix, source_kind


@dataclass
class Step:
    """One step: where x0 sat in the text, the candidates as proposed (with their sources) and
    as fed, and how many tokens it committed."""

    position: int
    proposed: list[tuple[list[int], str]]
    fed: list[list[int]]
    committed: int = 0


@dataclass
class Reach:
    """Totals over steps (``add``), in tokens."""

    steps: int = 0
    committed: int = 0
    fed_reach: int = 0
    proposed_reach: int = 0
    nodes: int = 0
    alone: Counter = field(default_factory=Counter)  # source -> its candidates' best reach
    lost: Counter = field(default_factory=Counter)   # source -> reach the cut took from it

    def add(self, step: Step, following: list[int]) -> None:
        """Count ``step``, whose x0 was followed by ``following`` in the finished text."""
        reach = [(_common_prefix(tokens, following), source) for tokens, source in step.proposed]
        fed = max((_common_prefix(tokens, following) for tokens in step.fed), default=0)
        best = max(reach, default=(0, ""))
        self.steps += 1
        self.committed += step.committed
        self.fed_reach += fed
        self.proposed_reach += best[0]
        self.nodes += len({tuple(tokens[:d]) for tokens in step.fed
                           for d in range(1, len(tokens) + 1)})
        kinds: dict[str, int] = {}
        for length, source in reach:
            kind = source_kind(source)
            kinds[kind] = max(kinds.get(kind, 0), length)
        self.alone.update(kinds)
        if best[0] > fed:
            self.lost[source_kind(best[1])] += best[0] - fed

    def report(self) -> list[str]:
        """The lines the script prints."""
        n = max(self.steps, 1)
        lines = [f"steps {self.steps}: committed {self.committed / n:.3f} tokens a step, "
                 f"reachable with what was fed {1 + self.fed_reach / n:.3f}, with all that was "
                 f"proposed {1 + self.proposed_reach / n:.3f}; fed {self.nodes / n:.2f} "
                 f"candidate tokens a step"]
        for source in sorted(self.alone):
            lines.append(f"  {source:10s} alone, uncut: {self.alone[source] / n:.3f} tokens a "
                         f"step; lost to the cut where it reached furthest: "
                         f"{self.lost[source] / n:.3f}")
        return lines


def logging_proposer(steps: list[Step]) -> type:
    """``LookaheadProposer`` that appends each step it proposes for to ``steps``."""

    class Logging(lookahead_proposer.LookaheadProposer):
        def propose(self, context, max_tokens):
            proposal = super().propose(context, max_tokens)
            steps.append(Step(len(context), [(list(t), s) for t, s in self._proposed],
                              [list(c) for c in proposal.candidates]))
            return proposal

        def update(self, context, outcome):
            steps[-1].committed = len(outcome.committed)
            super().update(context, outcome)

    return Logging


def main(argv: list[str] | None = None) -> int:
    parser = decoding_arguments(__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    model, tokenizer, prompts = decoding_inputs(parser, args)
    table, totals = SuccessorTable(), Reach()
    for prompt in prompts:
        steps: list[Step] = []
        input_ids = encode_prompt(tokenizer, prompt)
        with proposer(logging_proposer(steps)):
            result = generate(model, input_ids, do_sample=False,
                              max_new_tokens=args.max_new_tokens, method="lookahead",
                              successors=table)
        text = result.sequences[0].tolist()
        for step in steps:
            totals.add(step, text[step.position:])
    print("\n".join(totals.report()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
