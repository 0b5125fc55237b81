"""The HTTP edge: the app (``app``), its routes and schemas, and what a connection and a request
may cost. Nothing is imported here, so that the pure modules of this package (``unsent``,
``client_slots``) load without the web framework."""
