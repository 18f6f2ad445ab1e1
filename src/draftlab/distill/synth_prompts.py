"""Chat prompts of the benchmark's eight kinds, composed from templates and passages of --text files.

A head learns what the target says after prompts like the ones it will draft for, and the packaged
prompt file holds only 240. These add as many as asked, spread evenly over the kinds: translation,
summarization, questions on a context (rag), grammar correction of corrupted sentences, arithmetic
word problems with fresh numbers, general questions, contract clauses to analyse, and two-turn
conversations. None is drawn from the benchmark's own prompts.
"""

from __future__ import annotations

import random
import re

from draftlab.distill.data import passages

KINDS = (
    "translation",
    "summarization",
    "rag",
    "grammar correction",
    "math_reasoning",
    "qa",
    "law analytics",
    "multi-turn",
)

_LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch")
_NAMES = ("Maya", "Tom", "Aisha", "Lucas", "Priya", "Ben", "Sofia", "Omar", "Lena", "Jack", "Yuki", "Carlos")
_ITEMS = (
    ("apples", 1, 3),
    ("notebooks", 2, 6),
    ("tickets", 8, 25),
    ("sandwiches", 4, 9),
    ("books", 7, 20),
    ("plants", 5, 15),
    ("shirts", 12, 30),
)
_TOPICS = (
    "photosynthesis", "the water cycle", "compound interest", "vaccines", "black holes", "recycling",
    "the immune system", "machine learning", "inflation", "earthquakes", "the printing press",
    "solar panels", "sleep", "volcanoes", "electric cars", "coral reefs", "the stock market",
    "democracy", "antibiotics", "the internet", "bees", "climate change", "the Roman Empire",
    "nuclear energy", "a balanced diet", "gravity", "rainbows", "credit scores", "meditation",
    "the moon's phases", "batteries", "jazz music", "glaciers", "3D printing", "the heart",
    "supply and demand", "renewable energy", "time zones", "fermentation", "public libraries",
)  # fmt: skip
_QUESTIONS = (
    "What is {t}? Explain it in simple terms.",
    "What should everyone know about {t}?",
    "Give three interesting facts about {t}.",
    "What are the main benefits and drawbacks of {t}?",
    "Explain {t} to a high school student in one paragraph.",
    "Why is {t} important?",
    "What are common misconceptions about {t}?",
    "Write a short quiz with three questions about {t}, with answers.",
)
_CONTEXT_QUESTIONS = (
    "Who is the main character, and what do they want?",
    "What happens at the end?",
    "Where does this take place?",
    "How does the main character feel, and why?",
    "What problem comes up, and how is it solved?",
    "List every character that is mentioned.",
)
_PARTIES = (("Tenant", "Landlord"), ("Supplier", "Buyer"), ("Contractor", "Client"), ("Licensee", "Licensor"),
            ("Employee", "Company"), ("Borrower", "Lender"))  # fmt: skip
_DUTIES = (
    "deliver the goods described in Schedule A",
    "pay the monthly fee",
    "keep all Confidential Information secret",
    "maintain insurance covering the premises",
    "repair any damage caused by its staff",
    "provide written notice of any defect",
    "return all equipment in good condition",
)
_CONDITIONS = (
    "the delay is caused by an event of force majeure",
    "the other party agrees otherwise in writing",
    "payment has not been received in full",
    "the law requires disclosure",
    "the agreement has been terminated under Clause 9",
)
_LAW_ASKS = (
    "Analyze this contract clause: what obligations does it create, and for whom?",
    "Identify the risks in this clause for the {b}, and suggest one improvement.",
    "Explain this clause in plain English, then name one ambiguity in it.",
    "Which party benefits most from this clause, and why?",
)
_FOLLOW_UPS = (
    "Now make your answer shorter, in two sentences.",
    "Rewrite your answer as a bulleted list.",
    "Explain that again for a ten-year-old.",
    "Give one more example.",
    "What is the most important point in your answer, and why?",
    "Now write it in a more formal tone.",
)
_FIRST_TURNS = (
    "Write a short story (about 120 words) about {t}.",
    "Write a friendly email inviting a colleague to a talk about {t}.",
    "Describe a day in the life of someone whose job involves {t}.",
    "Write a short blog post about what you learned about {t} this week.",
)


def synth_prompt_items(texts: list[str], count: int, seed: int) -> list[tuple[str, list[str]]]:
    """`count` (category, user turns) items, the kinds in turn; kinds that need a passage are left
    out when there is no text."""
    if count <= 0:
        return []
    rng = random.Random(seed + 7)
    pool = [p for t in texts for p in passages(t)]
    kinds = [k for k in KINDS if pool or k not in _NEEDS_PASSAGE]
    items = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        items.append((kind, _MAKERS[kind](rng, pool)))
    return items


def _sentences(passage: str, rng: random.Random, most: int) -> str:
    parts = [s for s in re.split(r"(?<=[.!?])\s+", passage.replace("\n", " ")) if s.strip()]
    start = rng.randrange(max(1, len(parts) - most + 1))
    return " ".join(parts[start : start + rng.randint(1, most)])


def _translation(rng: random.Random, pool: list[str]) -> list[str]:
    text = _sentences(rng.choice(pool), rng, 3)
    return [f"Translate the following text into {rng.choice(_LANGUAGES)}:\n\n{text}"]


def _summarization(rng: random.Random, pool: list[str]) -> list[str]:
    ask = rng.choice(
        (
            "Summarize the following text in one sentence.",
            "Write a title and a two-sentence summary for this text.",
            "Summarize this passage in three bullet points.",
            "Give a short summary of the following text.",
        )
    )
    return [f"{ask}\n\n{rng.choice(pool)}"]


def _rag(rng: random.Random, pool: list[str]) -> list[str]:
    question = rng.choice(_CONTEXT_QUESTIONS)
    return [f"Context:\n{rng.choice(pool)}\n\nUsing only the context above, answer: {question}"]


_SWAPS = ((" was ", " were "), (" is ", " are "), (" has ", " have "), (" their ", " there "),
          (" went ", " goed "), (" the ", " "), (" a ", " "), ("'s", "s"))  # fmt: skip


def _grammar(rng: random.Random, pool: list[str]) -> list[str]:
    text = f" {_sentences(rng.choice(pool), rng, 3)} "
    for wrong in rng.sample(_SWAPS, 3):
        text = text.replace(*wrong, 1)
    text = text.strip()
    if rng.random() < 0.5:
        text = text.lower().replace(".", "", 1)
    return [f"Correct the grammar and spelling in this text and return only the corrected version:\n\n{text}"]


def _math(rng: random.Random, pool: list[str]) -> list[str]:
    name, other = rng.sample(_NAMES, 2)
    item, low, high = rng.choice(_ITEMS)
    price, count = rng.randint(low, high), rng.randint(2, 9)
    form = rng.randrange(4)
    if form == 0:
        paid = (price * count // 10 + 1) * 10 + rng.choice((0, 10, 20))
        q = f"{name} buys {count} {item} at ${price} each and pays with ${paid}. How much change does {name} get?"
    elif form == 1:
        q = (f"{name} has {count * rng.randint(3, 8)} {item} and shares them equally among {count} friends. "
             f"Then {other} gives {name} {rng.randint(2, 12)} more. How many does each friend get, and how many "
             f"does {name} have now if {name} kept none?")  # fmt: skip
    elif form == 2:
        speed, hours = rng.randint(30, 90), rng.randint(2, 6)
        q = f"A train travels at {speed} km/h for {hours} hours, then at {speed + 15} km/h for 1 hour. How far does it go?"
    else:
        pct = rng.choice((10, 15, 20, 25, 30))
        q = f"A box of {item} costs ${price * 10}. It is on sale for {pct}% off. {name} buys {count} boxes. What is the total?"
    return [f"{q} Explain step by step."]


def _qa(rng: random.Random, pool: list[str]) -> list[str]:
    return [rng.choice(_QUESTIONS).format(t=rng.choice(_TOPICS))]


def _law(rng: random.Random, pool: list[str]) -> list[str]:
    a, b = rng.choice(_PARTIES)
    clause = (f"{rng.randint(2, 14)}.{rng.randint(1, 6)} The {a} shall {rng.choice(_DUTIES)} within "
              f"{rng.choice((7, 10, 14, 30, 60))} days of the {b}'s request, unless {rng.choice(_CONDITIONS)}. "
              f"Any failure to do so entitles the {b} to {rng.choice(('terminate this Agreement', 'withhold payment', 'claim damages'))}.")  # fmt: skip
    return [f'{rng.choice(_LAW_ASKS).format(b=b)}\n\n"{clause}"']


def _multi_turn(rng: random.Random, pool: list[str]) -> list[str]:
    return [rng.choice(_FIRST_TURNS).format(t=rng.choice(_TOPICS)), rng.choice(_FOLLOW_UPS)]


_MAKERS = {
    "translation": _translation,
    "summarization": _summarization,
    "rag": _rag,
    "grammar correction": _grammar,
    "math_reasoning": _math,
    "qa": _qa,
    "law analytics": _law,
    "multi-turn": _multi_turn,
}
_NEEDS_PASSAGE = {"translation", "summarization", "rag", "grammar correction"}
