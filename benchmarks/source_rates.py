"""How often each source's candidates were right, depth by depth: what ``SOURCE_PRIORS``
(``lookahead.proposers.gauges``) starts a fresh request from.

Greedy lookahead over a data set, its prompts sharing one ``SuccessorTable`` as ``lookahead
bench``'s and a server's requests do; for every step, per source and depth, whether the token
there added a committed token that no candidate before it had reached -- the rule
``DepthGauge.record`` counts hits by. A recycled branch (``recycled@2.1``) counts as
``recycled@``, as ``DepthGauge.prior_of`` takes it::

    python benchmarks/source_rates.py --model smollm2-135m \\
        --dataset benchmarks/task-groups-12.jsonl --limit 12 --max-new-tokens 128

Prints a line per source: ``rate/samples`` at depths 1, 2, ...
"""

from __future__ import annotations

from collections import defaultdict

import lookahead.proposers.lookahead as lookahead_proposer
# ab_options: the script beside this one
from ab_options import decoding_arguments, decoding_inputs, proposer
from lookahead import SuccessorTable, generate
from lookahead.bench.datasets import encode_prompt
from lookahead.proposers.gauges import DepthGauge, _common_prefix, source_kind


def counting_proposer(totals: dict) -> type:
    """``LookaheadProposer`` whose depth gauges also add every step to ``totals``
    {(source kind, depth index): [hits, samples]}."""

    class Counting(DepthGauge):
        def record(self, proposed, fed, committed):
            before = 0
            for candidate, source in proposed:
                reach = _common_prefix(candidate, committed)
                known = len(candidate) if reach < len(committed) else reach
                for d in range(known):
                    entry = totals[(source_kind(source), d)]
                    entry[0] += before <= d < reach
                    entry[1] += 1
                before = max(before, reach)
            super().record(proposed, fed, committed)

    class Proposer(lookahead_proposer.LookaheadProposer):
        def _new_depths(self):
            return Counting(self.config.token_cost, step_costs=self.config.step_costs)

    return Proposer


def main(argv: list[str] | None = None) -> int:
    parser = decoding_arguments(__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    model, tokenizer, prompts = decoding_inputs(parser, args)
    totals: dict = defaultdict(lambda: [0, 0])
    table = SuccessorTable()
    with proposer(counting_proposer(totals)):
        for prompt in prompts:
            generate(model, encode_prompt(tokenizer, prompt), do_sample=False,
                     max_new_tokens=args.max_new_tokens, method="lookahead",
                     successors=table)
    for source in sorted({source for source, _ in totals}):
        depths = sorted(d for s, d in totals if s == source)
        print(f"{source:10s} " + " ".join(
            f"{totals[(source, d)][0] / totals[(source, d)][1]:.2f}/{totals[(source, d)][1]}"
            for d in depths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
