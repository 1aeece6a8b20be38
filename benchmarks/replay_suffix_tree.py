"""Suffix trees (SuffixDecoding) against our copies, replayed on recorded greedy outputs.

SuffixDecoding (Oliaro et al., 2024) keeps a suffix tree of the prompt, the output so far and
earlier requests' texts, matches the longest suffix of the text in it, and proposes a tree of
the continuations seen most often after that match, grown best-first by their frequency up to
a budget of tokens. Our lookahead and prompt lookup copy one continuation instead: what
followed the latest of the longest earlier matches of the text's last tokens (up to 8).

Under greedy decoding which proposed tokens a step accepts depends only on the text, so both
are replayed on the outputs of a ``lookahead bench`` run (no model needed): tokens per step at
the same budget of tokens fed per step (x0 included), the figure that matters where a step of
a few tokens costs about as much as a step of one (``lookahead.step_costs``)::

    python benchmarks/replay_suffix_tree.py RESULTS.json --baseline autoregressive \
        --budgets 2,4,8,16

Rows: "copy" (our longest-match copy, one chain of budget - 1 tokens), "suffix tree, this
text" (a tree over the prompt and the output so far), "suffix tree + earlier texts" (also over
the earlier prompts' texts, as a server's would be; SuffixDecoding's global tree).
"""

from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path

from lookahead.attention import TokenTree
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.cli.bench_args import quiet_loading
from lookahead.models.load import load_model
from lookahead.proposers.prompt_lookup import longest_match
from replay_text_proposers import accepted_path  # the script beside this one

DEPTH = 24  # the longest path the tree keeps (match plus continuation)
MATCH = 8  # the longest suffix of the text matched, as our copy's lookup_ngram


class SuffixTrie:
    """Every substring of up to ``DEPTH`` tokens of the texts added, with how often each was
    seen: ``children[node][token] = child``, ``counts[child]``."""

    def __init__(self) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.counts: list[int] = [0]
        self.active: list[int] = []  # the nodes of the substrings ending at the last token

    def start(self) -> None:
        """A new text begins: nothing before it continues into it."""
        self.active = []

    def extend(self, tokens: list[int]) -> None:
        """Add the substrings (up to ``DEPTH`` long) that end at each of ``tokens``, which
        continue the text added since ``start``."""
        for token in tokens:
            self.active = [self._child(node, token) for node in [0, *self.active][:DEPTH]]

    def _child(self, node: int, token: int) -> int:
        child = self.children[node].get(token)
        if child is None:
            child = len(self.children)
            self.children.append({})
            self.counts.append(0)
            self.children[node][token] = child
        self.counts[child] += 1
        return child

    def match(self, context: list[int]) -> int | None:
        """The node of the longest suffix of ``context`` (at most ``MATCH`` tokens) that was
        seen followed by something, or None."""
        for length in range(min(MATCH, len(context)), 0, -1):
            node = 0
            for token in context[-length:]:
                node = self.children[node].get(token)
                if node is None:
                    break
            if node is not None and self.children[node]:
                return node
        return None

    def tree(self, node: int, budget: int) -> list[list[int]]:
        """Up to ``budget`` tokens after ``node``, grown best-first by the estimated chance
        of each path (the product of its steps' frequencies), as root-to-leaf candidates."""
        heap = [(-1.0, [], node)]
        paths: list[list[int]] = []
        while heap and len(paths) < budget:
            score, path, at = heapq.heappop(heap)
            if path:
                paths.append(path)
            total = sum(self.counts[c] for c in self.children[at].values())
            for token, child in self.children[at].items():
                heapq.heappush(heap, (score * self.counts[child] / total, path + [token], child))
        leaves = [p for p in paths if not any(q[: len(p)] == p and len(q) > len(p)
                                              for q in paths)]
        return leaves


def replay(texts, budget: int, mode: str) -> tuple[float, float]:
    """(tokens per step, tokens fed per step) of ``mode`` ("copy", "suffix", "suffix+") at
    ``budget`` tokens a step, x0 included, over ``texts`` [(prompt ids, output ids)]."""
    tokens = steps = fed = 0
    trie = SuffixTrie()
    for prompt, output in texts:
        if mode == "suffix":
            trie = SuffixTrie()  # this text's alone
        trie.start()
        trie.extend(prompt + output[:1])
        done = 1
        while done < len(output):
            context = prompt + output[:done]
            room = min(budget - 1, len(output) - done - 1)
            if room <= 0:
                candidates = []
            elif mode == "copy":
                copy = longest_match(context, MATCH, room)[0]
                candidates = [copy] if copy else []
            else:
                node = trie.match(context)
                candidates = trie.tree(node, room) if node is not None else []
            tree = TokenTree(context[-1], candidates)
            committed = min(accepted_path(tree, output[done:]) + 1, len(output) - done)
            trie.extend(output[done:done + committed])
            done += committed
            tokens, steps, fed = tokens + committed, steps + 1, fed + len(tree)
    return tokens / steps, fed / steps


def load_texts(path: Path, baseline: str) -> list[tuple[list[int], list[int]]]:
    results = json.loads(path.read_text(encoding="utf-8"))
    config = results["config"]
    _, tokenizer = load_model(config["model"])[:2]
    texts = []
    for dataset in config["datasets"]:
        prompts = {p.id: p for p in load_prompts(dataset, config["limit"])}
        for run in results["runs"]:
            # a JSONL data set's runs carry its file's stem
            if run["dataset"] in (dataset, Path(dataset).stem) and run["method"] == baseline:
                ids = encode_prompt(tokenizer, prompts[run["prompt"]])[0].tolist()
                texts.append((ids, run["tokens"]))
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a results.json of `lookahead bench`")
    parser.add_argument("--baseline", default="autoregressive",
                        help="the method whose outputs to replay (autoregressive)")
    parser.add_argument("--budgets", default="2,4,8,16",
                        help="tokens a step feeds at most, x0 included (2,4,8,16)")
    args = parser.parse_args(argv)
    quiet_loading(args)
    texts = load_texts(args.results, args.baseline)
    if not texts:
        parser.error(f"no runs of method {args.baseline!r} in {args.results}")
    modes = {"copy": "copy (ours: latest longest match)", "suffix": "suffix tree, this text",
             "suffix+": "suffix tree + earlier texts"}
    print(f"{len(texts)} texts, {sum(len(o) for _, o in texts)} tokens\n")
    print("| budget | " + " | ".join(modes.values()) + " |")
    print("|--:|" + "--:|" * len(modes))
    for budget in (int(b) for b in args.budgets.split(",")):
        cells = [replay(texts, budget, mode) for mode in modes]
        print(f"| {budget} | " + " | ".join(f"{t:.2f} ({f:.1f} fed)" for t, f in cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
