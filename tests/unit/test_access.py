"""The access table against the app it guards: every route the app serves has exactly one entry
and no entry names a missing route; each entry's scope and body are the ones the route declares
to FastAPI; and the gate finds, for any request, the rule of the route the router would run."""

from __future__ import annotations

import itertools

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match, Mount, Route

from dispatcher.api import access, app, auth
from dispatcher.api.gate import SMALL_BODY_BYTES, Rule, Rules
from dispatcher.auth import api_keys
from dispatcher.settings import Settings

APP = app.build_fastapi()
SERVED = list(app.routes(APP.router.routes))
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def entries_of(route: BaseRoute) -> list[tuple[str, str]]:
    """The (method, template) pairs a route serves, as the table names them."""
    if isinstance(route, Mount):
        return [("GET", route.path + "/{path:path}")]
    assert isinstance(route, Route), route
    methods = set(route.methods or ())
    if "GET" in methods:
        methods.discard("HEAD")  # Starlette's HEAD for every GET: the table names the GET
    return [(method, route.path) for method in sorted(methods)]


def test_every_served_route_has_exactly_one_entry_and_every_entry_a_route() -> None:
    served = [entry for route in SERVED for entry in entries_of(route)]
    assert len(served) == len(set(served))
    assert set(served) == set(access.ROUTES)


def declared(dependant: object) -> tuple[bool, api_keys.Scope | None]:
    """The key and scope a route's dependencies ask for (FastAPI's own record of them)."""
    for dependency in getattr(dependant, "dependencies", ()):
        if isinstance(dependency.call, auth.ScopeCheck):
            return True, dependency.call.scope
        if dependency.call is auth.principal:
            return True, None
        found = declared(dependency)
        if found[0]:
            return found
    return False, None


def test_each_entry_grants_what_its_route_declares_to_fastapi() -> None:
    for route in SERVED:
        for entry in entries_of(route):
            granted = access.ROUTES[entry]
            if not isinstance(route, APIRoute):
                assert granted == access.OPEN, entry  # FastAPI's documents and static files
                continue
            assert (granted.needs_key, granted.scope) == declared(route.dependant), entry
            if route.body_field is not None:
                assert granted.body is access.Body.DOCUMENT, entry
            else:  # a batch reads its body itself, as bytes
                assert granted.body in (access.Body.SMALL, access.Body.BATCH), entry


def sample_path(template: str) -> str:
    return template.replace("{path:path}", "app/main.js").replace("{", "x").replace("}", "")


def routers_rule(method: str, path: str, rules: Rules) -> Rule:
    """The rule of the route the router runs: the first full match, else the first partial
    one (405), else none (404)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    partial = None
    for route in SERVED:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return rules.rule({**scope, "method": entries_of(route)[0][0]})
        if match is Match.PARTIAL and partial is None:
            partial = route
    if partial is not None:
        return rules.rule({**scope, "method": entries_of(partial)[0][0]})
    return Rule(False, None, SMALL_BODY_BYTES)


def test_the_table_finds_the_route_the_router_runs_for_any_method() -> None:
    rules = Rules(Settings())
    paths = [sample_path(template) for _, template in access.ROUTES]
    paths += ["/nowhere", "/v1/jobs/", "/v1/jobs//requeue", "/v1/schedules/a/b", "/console"]
    for method, path in itertools.product(METHODS, paths):
        scope = {"type": "http", "method": method, "path": path, "headers": []}
        assert rules.rule(scope) == routers_rule(method, path, rules), (method, path)


def test_the_batch_route_takes_a_batch_and_requeue_an_admin() -> None:
    rules = Rules(Settings(max_batch=3))
    batch = rules.rule({"method": "POST", "path": "/v1/jobs/batch"})
    one = rules.rule({"method": "POST", "path": "/v1/jobs"})
    assert batch.max_body_bytes == min(3 * one.max_body_bytes, Settings().max_body_bytes)
    requeue = rules.rule({"method": "POST", "path": "/v1/jobs/abc/requeue"})
    assert requeue.scope is api_keys.Scope.ADMIN
