"""Write (or check) the committed OpenAPI documents of the producer and the queue service.

python -m infra.openapi          # rewrite openapi/producer.json and openapi/queue.json
python -m infra.openapi --check  # exit 1 if they differ from what the code generates
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from services.producer.app import create_app as create_producer
from services.producer.settings import ProducerSettings
from services.queue.app import create_app as create_queue
from services.queue.settings import QueueSettings

DOCS = Path(__file__).resolve().parent.parent / "openapi"


def generate() -> dict[str, dict[str, Any]]:
    """{file name: OpenAPI document} as the code describes the two HTTP services now."""
    producer = create_producer(ProducerSettings())
    queue = create_queue(QueueSettings())
    return {
        "producer.json": producer.openapi_schema.to_schema(),
        "queue.json": queue.openapi_schema.to_schema(),
    }


def render(document: dict[str, Any]) -> str:
    """The committed form: sorted keys, two-space indent, trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    """CLI: write the documents, or with --check report drift and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    drift = []
    for name, document in generate().items():
        path = DOCS / name
        text = render(document)
        if args.check:
            if not path.exists() or path.read_text() != text:
                drift.append(name)
        else:
            DOCS.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(DOCS.parent)}")
    if drift:
        print(f"OpenAPI out of date: {', '.join(drift)}; run `make openapi`", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
