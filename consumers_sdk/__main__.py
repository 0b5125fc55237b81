"""``python -m consumers_sdk package.module:consumer`` runs that Consumer until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys

from consumers_sdk.consumer import Consumer


def main(argv: list[str]) -> int:
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m consumers_sdk package.module:consumer", file=sys.stderr)
        return 2
    module_name, _, attribute = argv[0].partition(":")
    consumer = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(consumer, Consumer):
        print(f"{argv[0]} is not a consumers_sdk.Consumer", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(consumer.run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
