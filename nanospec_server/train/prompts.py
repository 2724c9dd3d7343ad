"""Chat prompts for self-distillation, composed offline from templates written here.

Why these: an EAGLE head is judged by how often the target accepts its guesses, so
it should learn the target's own answers to the kind of requests a chat server gets
(writing, role play, reasoning, maths, code, extraction, science and humanities,
translation, summarisation, questions with and without a document). The first
trained head saw Python sources only and reached 1.13 tokens per verification on
chat prompts. Nothing here comes from a benchmark: topics and templates are this
file's own; passages and sentences are the prose docstrings of this interpreter's
standard library.

Split: a prompt goes to validation when the first byte of sha256(prompt) is below
``VAL_BYTE_CUTOFF`` (~5%), so no validation prompt is trained on.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import sysconfig
from enum import Enum
from pathlib import Path

VAL_BYTE_CUTOFF = 13  # 13/256 ~ 5% of prompts

TOPICS = (
    "renewable energy", "the history of the printing press", "learning a second language",
    "remote work", "healthy breakfast ideas", "black holes", "the water cycle",
    "personal budgeting", "the French Revolution", "machine learning", "urban gardening",
    "sleep hygiene", "electric cars", "the Roman Empire", "photosynthesis",
    "public speaking", "climate change", "the stock market", "volcanoes", "jazz music",
    "time management", "the human immune system", "space exploration", "recycling",
    "ancient Egypt", "social media and teenagers", "coffee brewing", "marathon training",
    "the theory of evolution", "cybersecurity", "minimalism", "the Renaissance",
    "artificial intelligence ethics", "plate tectonics", "starting a small business",
    "meditation", "the Industrial Revolution", "quantum computing", "bird migration",
    "online privacy", "baking bread", "the Olympic Games", "vaccines", "chess strategy",
    "the Great Wall of China", "inflation", "coral reefs", "writing a resume",
    "the solar system", "democracy", "video game design", "antibiotic resistance",
    "traveling on a budget", "the invention of the telephone", "honeybees",
    "job interviews", "the Cold War", "nutrition for athletes", "3D printing",
    "desert ecosystems", "classical music", "open source software", "earthquakes",
    "team leadership", "the Silk Road", "the internet of things", "rainforests",
    "mental health at work", "the moon landing", "cryptography", "composting",
    "the printing of money", "electric power grids", "ocean tides", "dinosaurs",
    "customer service", "the history of medicine", "self-driving cars", "glaciers",
    "negotiation", "the Byzantine Empire", "solar panels", "wildlife photography",
    "learning to code", "the periodic table", "podcasting", "DNA", "tea culture in Asia",
    "wind turbines", "the scientific method", "fast fashion", "ancient Greek philosophy",
    "the human brain", "smartphones", "hiking safety", "supply chains", "penguins",
)  # fmt: skip

TOPIC_TASKS = (
    "Write a short blog post about {topic}.",
    "Explain {topic} to a high school student.",
    "Give me five practical tips about {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a poem about {topic}.",
    "Compose a friendly email inviting my colleagues to a talk on {topic}.",
    "Pretend you are a museum guide. Describe an exhibit about {topic} to visitors.",
    "Imagine you are a famous scientist being interviewed about {topic}. Answer the first question: why does it matter?",
    "Write a short story in which {topic} plays an important role.",
    "What is the history of {topic}? Keep it brief.",
    "Compare {topic} and {other}. How are they related, if at all?",
    "Write a persuasive paragraph arguing that schools should teach more about {topic}.",
    "What are common misconceptions about {topic}?",
    "Create a study plan for learning about {topic} in two weeks.",
    "Summarize the most important facts about {topic} as a bulleted list.",
    "Write a dialogue between two friends discussing {topic}.",
    "What questions should I ask an expert on {topic}?",
    "Describe {topic} in exactly three sentences.",
)  # fmt: skip

PASSAGE_TASKS = (
    "Summarize the following text in two or three sentences.\n\n{passage}",
    "Read the document below and answer the question.\n\nDocument:\n{passage}\n\nQuestion: What is the main purpose described in this document?",
    "Extract the key terms from the following text and explain each in one line.\n\n{passage}",
    "Rewrite the following text in plain language for a non-programmer.\n\n{passage}",
    "Based only on the passage below, list three facts it states.\n\n{passage}",
)  # fmt: skip

LANGUAGES = ("German", "French", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese")
SENTENCE_TASKS = (
    "Translate the following sentence into {language}: {sentence}",
    "Translate into {language}:\n{sentence}",
)
CODE_TASKS = (
    "Write a Python function that does the following: {sentence}",
    'Explain what a function described as "{sentence}" would be used for, with an example.',
)
ITEMS = ("apples", "notebooks", "tickets", "pencils", "muffins", "batteries", "plants")
NAMES = ("Maria", "Tom", "Aisha", "Ken", "Lena", "Omar", "Sofia", "Raj")


class Split(str, Enum):
    TRAIN = "train"
    VAL = "val"


def split_of(prompt: str) -> Split:
    return (
        Split.VAL if hashlib.sha256(prompt.encode()).digest()[0] < VAL_BYTE_CUTOFF else Split.TRAIN
    )


@functools.cache
def stdlib_prose() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(paragraphs, sentences) from the module docstrings of the standard library.

    A paragraph is a docstring block of 200-1200 characters that reads as prose (no
    ``>>>`` examples, mostly letters); a sentence is a docstring's first line of 30-160
    characters. Sorted and de-duplicated, so the result is fixed per Python version.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    paragraphs: set[str] = set()
    sentences: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if {"test", "tests", "site-packages", "idle_test"}.intersection(
            path.relative_to(root).parts
        ):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            first = doc.split("\n", 1)[0].strip()
            if 30 <= len(first) <= 160 and first.endswith(".") and _is_prose(first):
                sentences.add(first)
            for block in doc.split("\n\n"):
                text = " ".join(block.split())
                if 200 <= len(text) <= 1200 and _is_prose(text):
                    paragraphs.add(text)
    return tuple(sorted(paragraphs)), tuple(sorted(sentences))


def _is_prose(text: str) -> bool:
    letters = sum(ch.isalpha() or ch == " " for ch in text)
    return ">>>" not in text and letters >= 0.85 * len(text)


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(50, 500)
    kind = rng.randrange(4)
    if kind == 0:
        return (f"{rng.choice(NAMES)} buys {b} {rng.choice(ITEMS)} at ${a} each and pays "
                f"with ${c + a * b}. How much change is due? Explain step by step.")  # fmt: skip
    if kind == 1:
        return f"Solve for x: {a}x + {b} = {a * rng.randint(1, 20) + b}. Show your work."
    if kind == 2:
        return (f"A train travels {c} km in {b} hours. What is its average speed, and how "
                f"far would it go in {a} hours at that speed?")  # fmt: skip
    return f"What is {a} percent of {c}? Then add {b} to the result. Explain your reasoning."


def _candidate(rng: random.Random) -> str:
    paragraphs, sentences = stdlib_prose()
    kind = rng.randrange(10)
    if kind < 5:
        topic, other = rng.sample(TOPICS, 2)
        return rng.choice(TOPIC_TASKS).format(topic=topic, other=other)
    if kind < 7:
        return rng.choice(PASSAGE_TASKS).format(passage=rng.choice(paragraphs))
    if kind == 7:
        sentence = rng.choice(sentences)
        return rng.choice(SENTENCE_TASKS).format(language=rng.choice(LANGUAGES), sentence=sentence)
    if kind == 8:
        return _math_problem(rng)
    return rng.choice(CODE_TASKS).format(sentence=rng.choice(sentences))


def chat_prompts(split: Split, count: int, seed: int) -> list[str]:
    """``count`` distinct prompts of ``split``, in a seeded order (same seed, same list)."""
    rng = random.Random(seed)
    chosen: dict[str, None] = {}
    for _ in range(count * 200):  # validation keeps ~1 in 20 candidates
        prompt = _candidate(rng)
        if split_of(prompt) is split:
            chosen.setdefault(prompt)
            if len(chosen) == count:
                return list(chosen)
    raise ValueError(f"could not compose {count} distinct {split.value} prompts")
