"""Multi-turn chats and shared system prompts through an OpenAI-compatible server.

    # conversations: C chats of T turns, each turn sending the whole conversation so far
    python benchmarks/conversation.py chat --url http://127.0.0.1:8000 --chats 2 --turns 5 \
        --max-tokens 200 --out conversation.json
    # every request = one long system prompt + its own question, at 1, 4 and 8 clients
    python benchmarks/conversation.py shared --url http://127.0.0.1:8000 --clients 1,4,8 \
        --requests 16 --max-tokens 128 --out shared.json

Works against any server that speaks ``/v1/chat/completions`` with streaming (``lookahead
serve``, ``llama-server``, vLLM). Greedy (temperature 0). Reports, for ``chat``, the time to
first token of every turn and the conversation's tokens per second counting every wait
(answer tokens over the wall time of all turns); for ``shared``, aggregate tokens per second,
time to first token and latency per level. The questions are MT-Bench's from the 41st on, which
no tuning here has seen; the system prompt is a fixed text of about 500 tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from lookahead.bench.datasets import load_prompts

SYSTEM = " ".join([
    "You are a careful assistant for a software company. Answer in plain English, cite the",
    "relevant part of the question, and keep answers focused. Company policy follows.",
] + [f"Policy {i}: requests about topic {i} are answered with the documented procedure {i}, "
     f"the escalation contact for team {i}, and a short summary of the steps a user takes "
     f"before opening a ticket; never promise dates for topic {i}." for i in range(1, 15)])


def ask(client: httpx.Client, url: str, model: str, messages: list[dict], max_tokens: int,
        ignore_eos: bool) -> dict:
    """One streamed chat completion: its text, tokens, time to first token and latency (s)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # llama-server's field; lookahead's is under "lookahead"
        body["lookahead"] = {"ignore_eos": True}
    start, first, text, tokens, pieces = time.perf_counter(), None, [], None, 0
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
                    pieces += 1
    end = time.perf_counter()
    return {"text": "".join(text), "tokens": tokens if tokens is not None else pieces,
            "ttft": (first or end) - start, "latency": end - start}


def run_chats(args) -> dict:
    questions = [p.text for p in load_prompts("mtbench", limit=80)][40:]
    chats = [questions[c * args.turns:(c + 1) * args.turns] for c in range(args.chats)]
    histories: list[list[dict]] = [[] for _ in chats]
    turns, start = [], time.perf_counter()
    # A new connection per request: llama-server may close a streamed one that the client
    # would otherwise reuse ("server disconnected").
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for turn in range(args.turns):
            for number, (chat, history) in enumerate(zip(chats, histories)):
                history.append({"role": "user", "content": chat[turn]})
                answer = ask(client, args.url, args.model, history, args.max_tokens,
                             args.ignore_eos)
                history.append({"role": "assistant", "content": answer["text"]})
                turns.append({"chat": number, "turn": turn + 1, **answer})
                print(f"chat {number} turn {turn + 1}: ttft {answer['ttft']:.2f} s, "
                      f"{answer['tokens']} tokens in {answer['latency']:.2f} s", flush=True)
    wall = time.perf_counter() - start
    tokens = sum(t["tokens"] for t in turns)
    summary = {"tokens_per_second": tokens / wall, "wall_seconds": wall, "tokens": tokens,
               "ttft_by_turn": [statistics.mean(t["ttft"] for t in turns if t["turn"] == k)
                                for k in range(1, args.turns + 1)]}
    print(f"conversation: {tokens} tokens in {wall:.1f} s, {summary['tokens_per_second']:.2f} "
          f"tok/s; mean ttft by turn: "
          + ", ".join(f"{x:.2f}" for x in summary["ttft_by_turn"]))
    return {"summary": summary, "turns": turns}


def run_shared(args) -> dict:
    questions = [p.text for p in load_prompts("mtbench", limit=80)][40:]
    levels = []
    with httpx.Client(limits=httpx.Limits(max_connections=64,
                                          max_keepalive_connections=0)) as client:
        for clients in args.clients:
            def one(index: int) -> dict:
                messages = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": questions[index % len(questions)]}]
                return ask(client, args.url, args.model, messages, args.max_tokens,
                           args.ignore_eos)

            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                answers = list(pool.map(one, range(args.requests)))
            wall = time.perf_counter() - start
            tokens = sum(a["tokens"] for a in answers)
            level = {"clients": clients, "tokens_per_second": tokens / wall,
                     "ttft_mean": statistics.mean(a["ttft"] for a in answers),
                     "latency_mean": statistics.mean(a["latency"] for a in answers),
                     "tokens": tokens, "wall_seconds": wall}
            levels.append(level)
            print(f"{clients} clients: {level['tokens_per_second']:.2f} tok/s, ttft "
                  f"{level['ttft_mean']:.2f} s, latency {level['latency_mean']:.2f} s", flush=True)
    return {"levels": levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for name in ("chat", "shared"):
        mode = sub.add_parser(name)
        mode.add_argument("--url", default="http://127.0.0.1:8000")
        mode.add_argument("--model", default="default", help="the name the server answers to")
        mode.add_argument("--max-tokens", type=int, default=200)
        mode.add_argument("--ignore-eos", action="store_true",
                          help="every answer runs to --max-tokens")
        mode.add_argument("--out", help="write the figures and every answer here (JSON)")
    chat, shared = sub.choices["chat"], sub.choices["shared"]
    chat.add_argument("--chats", type=int, default=2)
    chat.add_argument("--turns", type=int, default=5)
    shared.add_argument("--clients", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1, 4, 8])
    shared.add_argument("--requests", type=int, default=16, help="requests per level")
    args = parser.parse_args()
    result = run_chats(args) if args.mode == "chat" else run_shared(args)
    result["config"] = {k: v for k, v in vars(args).items()}
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
