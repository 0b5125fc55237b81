"""The release: read by the build (pyproject.toml), the API's OpenAPI document and the package."""

__version__ = "0.1.0"
