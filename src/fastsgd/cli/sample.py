"""`fastsgd sample RUN_DIR`: text drawn from a finished run's GPT."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    text = "draw text from the GPT a finished run trained (model.name = 'gpt')"
    p = sub.add_parser("sample", help=text, description=text)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory")
    p.add_argument("--prompt", default="", help="what the text starts with (default: a "
                   "newline); for a run on token ids, ids such as '464 2068'")
    p.add_argument("--tokens", type=int, default=200, help="tokens to draw (default 200; "
                   "bytes, for text)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="below 1 sharper, above 1 flatter; 0: always the likeliest (default 0.8)")
    p.add_argument("--top-k", type=int, default=0,
                   help="draw from the K likeliest only (default 0: from all)")
    p.add_argument("--seed", type=int, default=0, help="the same seed, the same text")


def run(args: argparse.Namespace) -> int:
    from fastsgd.records.trained import sample

    print(sample(args.run_dir, args.prompt, args.tokens, args.temperature, args.top_k,
                 args.seed))
    return 0
