"""Running the SDK inside web frameworks: ``fastapi`` (any Starlette-style lifespan) and
``django`` (an app with the ``run_consumer`` command). Each is imported only by its users, so
``import consumers_sdk`` needs neither framework."""
