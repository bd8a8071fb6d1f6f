"""Plan checks for internet-facing APIs (the Batch API's front, infra/components/batch_api.py), whoever adds them.

- `api-routes`: every API Gateway v2 route, and an API's quick-create `target` (its implicit `$default` route),
  goes to an `AWS_PROXY` integration of a Lambda function of the plan running the Batch API front's handler
  (`workload.batch_api.lambda_front.handler`), whose app refuses every request but `/health` without a key of the
  endpoint's secret. The front has no API Gateway authoriser on purpose: the key check is the app's, the same
  locally and on AWS. So a route to anything else (an HTTP proxy, another function, a mock, no target) is a door
  without that check, and is refused; so is a WebSocket API or a Lambda function URL (no route to hold).
- `public-endpoints`: an HTTP API is always reachable from the internet (API Gateway has no private HTTP API; a
  private REST API needs an execute-api interface endpoint, about $7.30 a zone a month, docs/batch-api.md). So
  every API Gateway API that is not a PRIVATE REST API, and every Lambda function URL, must carry the tag
  `llm-batch:public-endpoint=acknowledged`, which the program sets only from the stack's
  `batch_api.public_endpoint_acknowledged: true`: a stack is on the internet only where its config says so.

Both rules also read the stack's exports: a `batch_api_url` export without an API in the plan is a front the
rules cannot see, and is refused. A plan without an API still has Lambda functions (the doors' possible
targets, and where a function URL would be added), so neither rule passes by seeing nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.components.batch_api import HTTP_HANDLER, PUBLIC_ENDPOINT_TAG
from infra.rules.plan_view import (
    Plan,
    Resource,
    Rule,
    Violation,
    as_list,
    label,
    of_type,
    refers_to,
    require_matches,
)

ROUTES = "api-routes"
PUBLIC = "public-endpoints"
API = "aws:apigatewayv2/api:Api"
ROUTE = "aws:apigatewayv2/route:Route"
INTEGRATION = "aws:apigatewayv2/integration:Integration"
REST_API = "aws:apigateway/restApi:RestApi"
FUNCTION_URL = "aws:lambda/functionUrl:FunctionUrl"
FUNCTION = "aws:lambda/function:Function"
STACK = "pulumi:pulumi:Stack"


def _inputs(item: Resource) -> Mapping[str, Any]:
    # The plan's own mapping, not a copy: under the policy pack its reads are what catch a value unknown at preview.
    return item.get("inputs") or {}


def _stacks(plan: Plan) -> list[Resource]:
    return [item for item in plan if item["type"] == STACK]


def _exported_without_api(plan: Plan, check: str) -> list[Violation]:
    apis = of_type(plan, API, REST_API)
    return [
        Violation(check, label(stack), "exports batch_api_url but the plan has no API Gateway API to check")
        for stack in _stacks(plan)
        if "batch_api_url" in (stack.get("outputs") or {}) and not apis
    ]


def _front_functions(plan: Plan) -> set[str]:
    """ARNs (and names) of the plan's functions that run the front's handler: the only targets a route may have."""
    found: set[str] = set()
    for function in of_type(plan, FUNCTION):
        if _inputs(function).get("handler") == HTTP_HANDLER:
            outputs = function.get("outputs") or {}
            found |= {str(v) for v in (outputs.get("arn"), outputs.get("invokeArn"), function.get("id")) if v}
    return found


def _integration_problem(integration: Resource | None, fronts: set[str]) -> str | None:
    if integration is None:
        return "targets no integration of the plan"
    inputs = _inputs(integration)
    if inputs.get("integrationType") != "AWS_PROXY":
        return f"targets a {inputs.get('integrationType')} integration, not the Batch API function (no key check)"
    if str(inputs.get("integrationUri")) not in fronts:
        return f"targets {inputs.get('integrationUri')}, not the Batch API function whose app checks the key"
    return None


def check_api_routes(plan: Plan) -> list[Violation]:
    fronts = _front_functions(plan)
    integrations = of_type(plan, INTEGRATION)
    violations = _exported_without_api(plan, ROUTES)
    routes = of_type(plan, ROUTE)
    for route in routes:
        target = str(_inputs(route).get("target") or "")
        linked = target.startswith("integrations/")
        integration = next(
            (i for i in integrations if linked and refers_to(route, "target", i, lambda t: str(t).split("/")[-1])), None
        )
        problem = "has no target" if not target else _integration_problem(integration, fronts)
        if problem:
            violations.append(Violation(ROUTES, label(route), f"route {_inputs(route).get('routeKey')} {problem}"))
    for api in of_type(plan, API):
        inputs = _inputs(api)
        if inputs.get("protocolType") != "HTTP":
            violations.append(Violation(ROUTES, label(api), f"a {inputs.get('protocolType')} API: only HTTP APIs"))
        if inputs.get("target") and str(inputs["target"]) not in fronts:
            violations.append(
                Violation(ROUTES, label(api), f"its quick-create default route goes to {inputs['target']}")
            )
    for url in of_type(plan, FUNCTION_URL):
        violations.append(Violation(ROUTES, label(url), "a Lambda function URL: a door with no route to check"))
    # The doors a request could come in by, and the functions a door could lead to (every plan has one).
    matched = len(routes) + len(of_type(plan, API, FUNCTION_URL, FUNCTION))
    require_matches(ROUTES, matched, "API, route, function URL or Lambda function")
    return violations


def _is_public(item: Resource) -> bool:
    if item["type"] == REST_API:
        # pulumi_aws 7 takes `types` as one string ("PRIVATE"); older schemas as a list of one.
        types = (_inputs(item).get("endpointConfiguration") or {}).get("types") or "EDGE"
        return as_list(types) != ["PRIVATE"]
    return True


def check_public_endpoints(plan: Plan) -> list[Violation]:
    violations = _exported_without_api(plan, PUBLIC)
    fronts = [item for item in of_type(plan, API, REST_API, FUNCTION_URL) if _is_public(item)]
    for front in fronts:
        tags = _inputs(front).get("tags") or {}
        if tags.get(PUBLIC_ENDPOINT_TAG) != "acknowledged":
            violations.append(
                Violation(PUBLIC, label(front), "reachable from the internet, and the stack's config does not say so")
            )
    # With the functions: each is a place a function URL (a public door) would be added beside.
    require_matches(PUBLIC, len(fronts) + len(of_type(plan, FUNCTION)), "API, function URL or Lambda function")
    return violations


RULES: dict[str, Rule] = {
    ROUTES: Rule(
        check_api_routes,
        "route every request to the Batch API function (infra/components/batch_api.py: `$default` -> its "
        "AWS_PROXY integration); its app checks the key",
    ),
    PUBLIC: Rule(
        check_public_endpoints,
        "an HTTP API is always on the internet: set llm-batch:batch_api.public_endpoint_acknowledged to true if "
        "the stack means it (the program then tags the API), or leave batch_api.enabled off",
    ),
}
