"""The release: read by both builds (pyproject.toml, sdk/pyproject.toml), the API's OpenAPI
document and the package. pyproject.toml pins delay-dispatcher-sdk to it: change both together
(the packaging test holds them equal)."""

__version__ = "0.1.0"
