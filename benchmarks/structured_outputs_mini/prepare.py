"""Write the structured_outputs_mini benchmark: an entity to describe plus a JSON schema built from a few of its
properties, drawn with a seeded random generator (offline), in the structured_outputs resources server's format."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "structured_outputs_mini_benchmark.jsonl"

# entity -> (task sentence, {property: schema}); a row's schema takes two to four of the properties.
ENTITIES = {
    "book": ("Describe a made-up novel about a lighthouse keeper.", {
        "title": {"type": "string"},
        "author": {"type": "string"},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2030},
        "genres": {"type": "array", "items": {"type": "string"}},
        "in_print": {"type": "boolean"},
    }),
    "city": ("Describe a fictional coastal city.", {
        "name": {"type": "string"},
        "population": {"type": "integer", "minimum": 0},
        "country": {"type": "string"},
        "climate": {"type": "string", "enum": ["warm", "mild", "cold"]},
        "landmarks": {"type": "array", "items": {"type": "string"}},
    }),
    "recipe": ("Describe a simple recipe for vegetable soup.", {
        "dish": {"type": "string"},
        "servings": {"type": "integer", "minimum": 1},
        "vegetarian": {"type": "boolean"},
        "ingredients": {"type": "array", "items": {"type": "string"}},
        "difficulty": {"type": "string", "enum": ["easy", "medium", "hard"]},
    }),
    "employee": ("Describe a fictional engineer who joined a company last year.", {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 18},
        "team": {"type": "string"},
        "skills": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}},
    }),
}


def _row(rng: random.Random, index: int) -> dict:
    entity = list(ENTITIES)[index % len(ENTITIES)]
    task, properties = ENTITIES[entity]
    names = sorted(rng.sample(list(properties), rng.randint(2, 4)), key=list(properties).index)
    schema = {"type": "object", "properties": {name: properties[name] for name in names}}
    schema_str = json.dumps(schema)
    prompt = (
        "Answer with a single JSON document and nothing else (no prose, no code fences). It must match this JSON "
        "schema exactly: every listed property is required and no other property is allowed.\n\n"
        f"Schema:\n{schema_str}\n\nTask: {task}"
    )
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "schema_str": schema_str,
        "schema_type": "json",
    }


def prepare(num_rows: int = 24, seed: int = 3) -> str:
    """Write `num_rows` tasks and return the file's path."""
    rng = random.Random(seed)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with OUTPUT.open("w", encoding="utf-8") as out:
        for index in range(num_rows):
            out.write(json.dumps(_row(rng, index)) + "\n")
    return str(OUTPUT)
