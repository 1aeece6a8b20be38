"""How far can candidates copied from the text go? Replay the proposers on recorded outputs.

Under greedy decoding, which proposed tokens a step accepts depends only on the text the model
writes, not on timing. So the baseline's outputs in a ``lookahead bench`` results.json let us
replay every *text-only* proposer -- prompt lookup, and lookahead's n-gram pool and lookup
without its Jacobi window -- with no model at all: per step, the tokens accepted and the tokens
the step would feed. With a tuned forward-cost curve (``lookahead tune``) that gives a predicted
speed-up over one-token decoding. This bounds what the text itself offers on a data set; the
lookahead window adds its own n-grams on top, at the cost of its W x (N - 1) tokens per step.

    python benchmarks/replay_text_proposers.py docs/results/qwen2.5-coder-1.5b-humaneval-hf-pld.json
    python benchmarks/replay_text_proposers.py RESULTS.json --datastore stdlib --window-tokens 1

Prints, per proposer: tokens per decoding step, mean tokens fed per step and, when the model has
a saved profile, the predicted speed-up (one-token cost x tokens / sum of each step's cost).
Proposers "+ memory" also copy from the earlier outputs (``lookahead.TextMemory``, as
``lookahead bench --memory``), and with ``--datastore`` the rows "+ datastore" also from a
corpus (``lookahead.Datastore``). The last rows are oracles. The first: each step takes the
longest match of the true continuation among everything that followed an earlier x0 in the
text, a bound for any proposer that copies from the text alone. The second feeds, every step,
every source's candidate at once (copies after the last 3-, 2- and 1-gram of the text, the
memory's, the datastore's, the pool's n-grams), each up to ``--lookup-tokens`` long: what the
sources hold between them, at the cost of the tokens they take.

    python benchmarks/replay_text_proposers.py RESULTS.json --datastore python \
        --lookup-tokens 8 --workload code     # priced on the saved "code" profile's curve

With a saved profile, two rows replay its tuned shape: its candidates cut on the token cost
(with the copy after the first earlier 3-gram, as before step costs) and priced on its curve
(``LookaheadConfig.step_costs``). Steps are capped at the tuned shape's ``max_step_tokens``
unless ``--max-step-tokens`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lookahead.attention import TokenTree
from lookahead.decode import fit_budget
from lookahead.cli.bench_args import quiet_loading
from lookahead.bench.cost_curve import cost_at
from lookahead.profiles import load_profile, shape_label, tuned_shape
from lookahead.sources.datastore import Datastore, load_datastore
from lookahead.config import LookaheadConfig, PromptLookupConfig
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.sources.memory import TextMemory
from lookahead.models.load import load_model
from lookahead.proposers.base import StepOutcome
from lookahead.proposers.lookahead import LookaheadProposer, NGramPool
from lookahead.proposers.prompt_lookup import PromptLookupProposer, find_continuation


def accepted_path(tree: TokenTree, truth: list[int]) -> int:
    """How many of ``truth``'s tokens the candidate trie holds as a root path."""
    node = depth = 0
    while depth < len(truth) and truth[depth] in tree.children[node]:
        node = tree.children[node][truth[depth]]
        depth += 1
    return depth


def replay(proposer, texts: list[tuple[list[int], list[int]]], extra: int = 0,
           cap: int | None = None) -> tuple[int, list[int]]:
    """(tokens after the first, fed tokens of each decoding step) over ``texts``, each a
    (prompt ids, greedy output ids) pair; the first output token comes from the prefill.

    Only the proposal's candidates are replayed: a lookahead window needs the model's outputs,
    so it is left out (its proposer then learns from the text alone) and counted as ``extra``
    fed tokens per step. ``cap``: the most tokens a step feeds, x0 included
    (``max_step_tokens``), as the decoder trims a proposal (``fit_budget``)."""
    tokens, fed = 0, []
    memory = getattr(proposer, "memory", None)
    for prompt, output in texts:
        proposer.start(prompt)
        done = 1
        while done < len(output):
            context = prompt + output[:done]
            room = len(output) - done - 1
            room = room if cap is None else min(room, cap - 1)
            proposal = fit_budget(proposer.propose(context, room), cap)
            tree = TokenTree(context[-1], proposal.candidates)
            accepted = accepted_path(tree, output[done:])
            committed = output[done : done + accepted + 1]
            done += len(committed)
            tokens += len(committed)
            fed.append(len(tree) + extra)
            proposer.update(prompt + output[:done], StepOutcome(committed, accepted))
        if memory is not None:
            memory.add(prompt + output)
    return tokens, fed


def oracle(texts: list[tuple[list[int], list[int]]]) -> tuple[int, list[int]]:
    """``replay``'s figures for a step that copies the longest true continuation among all
    the text's earlier continuations of x0 (fed: x0 and that one candidate)."""
    tokens, fed = 0, []
    for prompt, output in texts:
        done = 1
        while done < len(output):
            context, truth = prompt + output[:done], output[done:]
            best = 0
            for start in (i + 1 for i in range(len(context) - 1) if context[i] == context[-1]):
                run = 0
                while run < len(truth) and start + run < len(context) and (
                        context[start + run] == truth[run]):
                    run += 1
                best = max(best, run)
            committed = min(best + 1, len(truth))  # no bonus token past the text's end
            done += committed
            tokens += committed
            fed.append(best + 1)
    return tokens, fed


def every_source(texts: list[tuple[list[int], list[int]]], length: int,
                 datastore: Datastore | None) -> tuple[int, list[int]]:
    """``replay``'s figures for steps that feed every source's candidate, ``length`` tokens
    each: the text's continuations of its last 3-, 2- and 1-gram, the memory's (earlier
    outputs), the datastore's and every tail of a 4-gram pool of the text keyed by x0."""
    tokens, fed = 0, []
    memory = TextMemory()
    for prompt, output in texts:
        pool = NGramPool(4, capacity=1 << 20)
        pool.add_all(prompt)
        done = 1
        while done < len(output):
            context = prompt + output[:done]
            before = len(context)
            candidates = [find_continuation(context, n, n, length) for n in (3, 2, 1)]
            candidates += [store.find(context, length) for store in (memory, datastore)
                           if store is not None]
            candidates += pool.get(context[-1])
            tree = TokenTree(context[-1], [c for c in candidates if c])
            accepted = accepted_path(tree, output[done:])
            committed = min(accepted + 1, len(output) - done)  # no bonus token past the end
            done += committed
            tokens += committed
            fed.append(len(tree))
            pool.add_all(prompt + output[:done], start=before - 3)  # the new 4-grams
        memory.add(prompt + output)
    return tokens, fed


def proposers(window_tokens: int, datastore: Datastore | None = None,
              lookup_tokens: int = 8, tuned: dict | None = None) -> dict[str, tuple[object, int]]:
    """The text-only proposers to replay, by name, with the extra tokens each step feeds
    (``tuned``: a profile's shape, ``find_shape``'s keywords, replayed as it was cut before
    step costs, with the copy after the first earlier 3-gram, and as it is cut now)."""
    table: dict[str, tuple[object, int]] = {
        f"ours prompt lookup, {n} tokens": (PromptLookupProposer(PromptLookupConfig(n)), 0)
        for n in (4, 6, 8, 10, 16)
    }
    # Hugging Face's defaults: the last 2-gram, else 1-gram; 10 tokens.
    hf = PromptLookupConfig(num_draft_tokens=10, max_ngram=2, min_ngram=1)
    table["HF prompt lookup (2-gram), 10 tokens"] = (PromptLookupProposer(hf), 0)
    for ngram, guess in ((5, 4), (4, 4), (4, 2), (3, 3)):
        config = LookaheadConfig(window=1, ngram=ngram, guess=guess)
        name = f"lookahead N{ngram} G{guess} pool + lookup"
        table[name + ", no window"] = (LookaheadProposer(config), 0)
        table[name + f" + {window_tokens} window tokens"] = (LookaheadProposer(config),
                                                              window_tokens)
    table["ours prompt lookup, 10 tokens + memory"] = (
        PromptLookupProposer(PromptLookupConfig(10), memory=TextMemory()), 0)
    config = LookaheadConfig(window=1, ngram=4, guess=2, lookup_tokens=lookup_tokens)
    name = f"lookahead N4 G2 L{lookup_tokens} pool + lookup + memory + {window_tokens} window tokens"
    table[name] = (LookaheadProposer(config, memory=TextMemory()), window_tokens)
    if tuned is not None:  # the profile's shape, cut on its token cost, then on its curve
        name = "tuned " + shape_label(tuned)
        fields = {k: v for k, v in tuned.items() if k not in ("max_step_tokens", "step_costs")}
        table[name + ", cut on the token cost"] = (
            LookaheadProposer(LookaheadConfig(**fields, lookup_ngram=3)), window_tokens)
        if tuned.get("step_costs") is not None:
            table[name + ", priced on the curve"] = (
                LookaheadProposer(LookaheadConfig(**fields, step_costs=tuned["step_costs"])),
                window_tokens)
    if datastore is not None:
        table["ours prompt lookup, 10 tokens + memory + datastore"] = (PromptLookupProposer(
            PromptLookupConfig(10), memory=TextMemory(), datastore=datastore), 0)
        table[name + " + datastore"] = (
            LookaheadProposer(config, memory=TextMemory(), datastore=datastore), window_tokens)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a results.json of `lookahead bench`")
    parser.add_argument("--baseline", default="hf", help="the method whose outputs to replay")
    parser.add_argument("--window-tokens", type=int, default=8,
                        help="tokens of the window to add to the fed count (W2 N5: 8)")
    parser.add_argument("--datastore", help="also replay with a datastore: 'stdlib' (the Python "
                        "standard library), 'python' (it and the installed packages) or a file "
                        "or folder of text")
    parser.add_argument("--workload", help="price the steps on the curve of this workload's "
                        "profile (e.g. code; default: the model's general profile)")
    parser.add_argument("--lookup-tokens", type=int, default=8,
                        help="lookahead's first copy length, L (8)")
    parser.add_argument("--max-step-tokens", type=int,
                        help="the most tokens a step feeds, x0 included (default: the tuned "
                        "shape's cap, else none)")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text(encoding="utf-8"))
    config = results["config"]
    quiet_loading(args)
    quantized = config["dtype"] == "quantized"  # a GGUF model on the integer kernel
    dtype = "float32" if quantized else config["dtype"]
    _, tokenizer = load_model(config["model"], *(() if quantized else (dtype,)))
    datastore = load_datastore(args.datastore, tokenizer) if args.datastore else None
    texts = []
    setting = config.get("setting", config["dtype"])
    for dataset in config["datasets"]:
        prompts = {p.id: p for p in load_prompts(dataset, config["limit"])}
        for run in results["runs"]:
            # With --baseline-dtypes the baseline ran once per setting: replay one of them,
            # or the memory proposers would see every output twice.
            if (run["dataset"] == dataset and run["method"] == args.baseline
                    and run.get("dtype", setting) == setting):
                ids = encode_prompt(tokenizer, prompts[run["prompt"]])[0].tolist()
                texts.append((ids, run["tokens"]))
    if not texts:
        parser.error(f"no runs of method {args.baseline!r} in {args.results}")
    packed = "quantized" if quantized else "packed" in config.get("setting", "")
    profile = load_profile(config["model"], dtype, workload=args.workload, packed=packed)
    curve = profile["curve"] if profile else None
    tuned = tuned_shape(profile) if profile else None
    cap = args.max_step_tokens or (tuned or {}).get("max_step_tokens")
    print(f"{config['model']}: {len(texts)} outputs of {args.baseline!r}, "
          f"{sum(len(o) for _, o in texts)} tokens; cost curve: "
          f"{'profile of ' + profile['created'] if profile else 'none saved'}"
          f"{f'; steps of at most {cap} tokens' if cap else ''}\n")
    print("| proposer | tokens/step | fed tokens/step | predicted speed-up |")
    print("|---|--:|--:|--:|")
    table = proposers(args.window_tokens, datastore, args.lookup_tokens, tuned)
    for name, (proposer, extra) in table.items():
        tokens, fed = replay(proposer, texts, extra, cap)
        speed = "-"
        if curve is not None:
            speed = f"{tokens * cost_at(curve, 1) / sum(cost_at(curve, k) for k in fed):.2f}x"
        print(f"| {name} | {tokens / len(fed):.2f} | {sum(fed) / len(fed):.1f} | {speed} |")
    tokens, fed = oracle(texts)
    print(f"| oracle: best earlier continuation of x0 | {tokens / len(fed):.2f} | - | - |")
    tokens, fed = every_source(texts, args.lookup_tokens, datastore)
    speed = "-"
    if curve is not None:
        speed = f"{tokens * cost_at(curve, 1) / sum(cost_at(curve, k) for k in fed):.2f}x"
    print(f"| oracle: every source's candidate fed, {args.lookup_tokens} tokens each | "
          f"{tokens / len(fed):.2f} | {sum(fed) / len(fed):.1f} | {speed} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
