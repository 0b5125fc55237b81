"""In-memory scheduling: the due lanes, the loader that fills them, the firing loop that takes from
them."""
