"""Write a suite of long rag and summarization prompts (~700 tokens of context) built from a text file.

The suite is not shipped: it is composed at run time from a corpus the user has (by default the
TinyStories excerpt in ../shared/corpus), taking stories from the end of the file, away from the
part used to distil the shipped draft. Each prompt is unseen by the built-in suite.

    python benchmarks/long_prompts.py --out runs/long_prompts.jsonl
    draftlab bench --suite runs/long_prompts.jsonl --full
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "tinystories_validation_head.txt"


# Capitalised words that start sentences rather than name someone.
COMMON_CAPITALS = set(
    "One Once The They She His Her Then When But And From This That After There What Why Let Yes Thank "
    "Mom Dad Mommy Daddy Every Some Its Their Can Look Come Please Did Don Suddenly Finally Soon Today Just".split()
)


def stories(text: str) -> list[str]:
    """Stories are runs of paragraphs; a new one starts with a typical opening."""
    out: list[str] = []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        if not out or re.match(r"(Once upon a time|One day|There was|There once)", para):
            out.append(para)
        else:
            out[-1] += "\n\n" + para
    return [s for s in out if 60 <= len(s.split()) <= 260]


def take(pool: list[str], words: int) -> list[str]:
    picked, total = [], 0
    while pool and total < words:
        story = pool.pop()
        picked.append(story)
        total += len(story.split())
    return picked


def build(corpus: Path, count: int, words: int) -> list[dict]:
    pool = stories(corpus.read_text(encoding="utf-8"))
    rows = []
    for i in range(1, count + 1):
        docs = take(pool, words)
        body = "\n\n".join(docs)
        rows.append(
            {
                "id": f"long-summarization-{i:02d}",
                "category": "summarization",
                "turns": [f"Summarize the following stories in about five sentences.\n\n{body}"],
            }
        )
        docs = take(pool, words)
        numbered = "\n\n".join(f"Document {n}:\n{d}" for n, d in enumerate(docs, 1))
        names = re.findall(r"named ([A-Z][a-z]+)", "\n".join(docs)) or [
            w for w in re.findall(r"\b([A-Z][a-z]{2,})\b", docs[-1]) if w not in COMMON_CAPITALS
        ]
        who = names[0] if names else "the main character"
        question = (
            f"In which document does {who} appear, and what happens to {who} there? Quote the document."
        )
        rows.append(
            {
                "id": f"long-rag-{i:02d}",
                "category": "rag",
                "turns": [
                    f"Answer the question using only the documents below.\n\n{numbered}\n\nQuestion: {question}"
                ],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, default=Path("runs/long_prompts.jsonl"))
    parser.add_argument("--count", type=int, default=4, help="prompts per subtask")
    parser.add_argument("--words", type=int, default=520, help="words of context per prompt")
    args = parser.parse_args()
    rows = build(args.corpus, args.count, args.words)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
