"""The HTTP API reference, from the OpenAPI document the app serves at /openapi.json."""

from __future__ import annotations

import json
from typing import Any, cast

from dispatcher.api import app
from dispatcher.api.context import ApiContext
from dispatcher.metrics import Metrics
from dispatcher.settings import Settings

PROBLEM = "Problem"  # the schema of every error answer
METHODS = ("get", "post", "put", "patch", "delete")

INTRO = """\
# HTTP API

Every path and method of the API (v1, JSON), with its parameters, request body and answers. A
running node serves the same document at `/openapi.json`, browsable at
[/docs](http://127.0.0.1:8080/docs) (Swagger UI, with an "Authorize" button for an API key) and
[/redoc](http://127.0.0.1:8080/redoc). What the endpoints do and the rules of a job's fields:
[API overview](api.md).

This page is generated from the OpenAPI document.
"""


def document() -> dict[str, Any]:
    """The app's OpenAPI document, without a node: building the app only reads the settings and
    the metrics; the routes' other dependencies are reached per request, and none is made."""
    settings = Settings()
    unused = cast(Any, None)
    context = ApiContext(
        settings=settings,
        intake=unused,
        jobs=unused,
        history=unused,
        schedules=unused,
        keyring=unused,
        metrics=Metrics(),
        now_dt=unused,
        readiness=unused,
        degraded=unused,
        clock=unused,
        standing=unused,
        publish_path=unused,
        counts=unused,
        heap_size=unused,
        cluster=unused,
        vacuum=unused,
        flow_rules=unused,
        rules=unused,
        rules_changed=unused,
        bulk_actions=unused,
        bulk_started=unused,
    )
    return app.create_api(context).fastapi.openapi()


def ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def type_text(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, linking to the named schemas it uses."""
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()})"
    for combiner in ("anyOf", "oneOf", "allOf"):
        if combiner in schema:
            return " or ".join(type_text(part) for part in schema[combiner])
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {type_text(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"object of {type_text(extra)}" if isinstance(extra, dict) else "object"
    return str(kind)


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def parameters_table(parameters: list[dict[str, Any]]) -> str:
    rows = [
        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
        f"{cell(type_text(p.get('schema', {})))} | {cell(p.get('description', ''))} |"
        for p in parameters
    ]
    return "| parameter | in | required | type | description |\n|---|---|---|---|---|\n" + (
        "\n".join(rows) + "\n"
    )


def body_text(content: dict[str, Any]) -> str:
    return ", ".join(
        f"`{media}`: {type_text(spec.get('schema', {}))}" for media, spec in content.items()
    )


def operation(path: str, method: str, op: dict[str, Any]) -> str:
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [f"**{op['summary']}**", ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    if op.get("parameters"):
        lines += [parameters_table(op["parameters"])]
    if "requestBody" in op:
        lines += [f"Request body: {body_text(op['requestBody'].get('content', {}))}", ""]
    lines += ["| answer | meaning | body |", "|---|---|---|"]
    problems: list[str] = []
    for status, answer in op.get("responses", {}).items():
        content = body_text(answer.get("content", {}))
        if content.endswith(f"[{PROBLEM}](#{PROBLEM.lower()})"):
            problems.append(status)  # the error shape every route shares: one row
            continue
        lines.append(f"| {status} | {cell(answer.get('description', ''))} | {cell(content)} |")
    if problems:
        lines.append(f"| {', '.join(problems)} | refused | [{PROBLEM}](#{PROBLEM.lower()}) |")
    return "\n".join(lines) + "\n"


def schema_section(name: str, schema: dict[str, Any]) -> str:
    lines = [f"### {name} {{#{name.lower()}}}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    properties: dict[str, Any] = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | description |", "|---|---|---|---|"]
        lines += [
            f"| `{field}` | {cell(type_text(spec))} | {'yes' if field in required else 'no'} | "
            f"{cell(spec.get('description', ''))} |"
            for field, spec in properties.items()
        ]
    else:
        lines.append(f"Type: {type_text(schema)}")
    return "\n".join(lines) + "\n"


def render() -> str:
    spec = document()
    parts = [INTRO, f"Version {spec['info']['version']}, OpenAPI {spec['openapi']}.\n"]
    parts.append("## Endpoints\n")
    for path, item in spec["paths"].items():
        parts += [operation(path, method, item[method]) for method in METHODS if method in item]
    parts.append("## Schemas\n")
    schemas: dict[str, Any] = spec.get("components", {}).get("schemas", {})
    parts += [schema_section(name, schema) for name, schema in sorted(schemas.items())]
    return "\n".join(parts)
