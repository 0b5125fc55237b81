"""In-memory scheduling: the due heap, the loader that fills it, the firing loop that empties it."""
