"""The shape of a state machine definition as a graph, for the checks that keep GPUs from being left on.

Edges are every way control can move: Next, Default, Choice rules (nested And/Or/Not included) and Catch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

State = dict[str, Any]
TERMINAL_TYPES = {"Succeed", "Fail"}


def states(definition: dict[str, Any]) -> dict[str, State]:
    found: dict[str, State] = definition["States"]
    return found


def successors(state: State) -> list[str]:
    targets: list[str] = []
    if "Next" in state:
        targets.append(state["Next"])
    if "Default" in state:
        targets.append(state["Default"])
    targets.extend(rule["Next"] for rule in state.get("Choices", []))
    targets.extend(catcher["Next"] for catcher in state.get("Catch", []))
    return targets


def is_terminal(state: State) -> bool:
    return state["Type"] in TERMINAL_TYPES or bool(state.get("End"))


def reachable(definition: dict[str, Any], start: str, blocked: Iterable[str] = ()) -> set[str]:
    """States reachable from `start` without entering any of `blocked` (`start` itself counts)."""
    graph = states(definition)
    stop = set(blocked)
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        todo.extend(successors(graph[name]))
    return seen


def has_cycle(definition: dict[str, Any], removed: Iterable[str] = ()) -> bool:
    """Whether control can loop forever once the `removed` states are taken out of the graph."""
    graph = states(definition)
    gone = set(removed)
    colour: dict[str, int] = {}

    def visit(name: str) -> bool:
        colour[name] = 1
        for nxt in successors(graph[name]):
            if nxt in gone:
                continue
            if colour.get(nxt) == 1 or (nxt not in colour and visit(nxt)):
                return True
        colour[name] = 2
        return False

    return any(name not in colour and visit(name) for name in graph if name not in gone)


def matching(definition: dict[str, Any], predicate: Callable[[State], bool]) -> set[str]:
    return {name for name, state in states(definition).items() if predicate(state)}


def is_release(state: State) -> bool:
    """A task that takes GPU capacity away: the group to 0, or the submitter's release action."""
    if state["Type"] != "Task":
        return False
    params = state.get("Parameters", {})
    if state["Resource"].endswith(":autoscaling:setDesiredCapacity"):
        return bool(params.get("DesiredCapacity") == 0)
    if state["Resource"].endswith(":lambda:invoke"):
        return bool(params.get("Payload", {}).get("action") == "release")
    return False


def is_capacity_start(state: State) -> bool:
    """A task that (re)starts the work: the group to 1, or the submitter's submit action."""
    if state["Type"] != "Task":
        return False
    params = state.get("Parameters", {})
    if state["Resource"].endswith(":autoscaling:setDesiredCapacity"):
        return bool(params.get("DesiredCapacity") == 1)
    if state["Resource"].endswith(":lambda:invoke"):
        return bool(params.get("Payload", {}).get("action") == "submit")
    return False


def catches_everything(state: State) -> bool:
    return any("States.ALL" in catcher["ErrorEquals"] for catcher in state.get("Catch", []))


def walk(
    definition: dict[str, Any], start: str, choices: dict[str, str] | None = None, stop: str | None = None
) -> list[str]:
    """The states one pass enters from `start`, in order: Next, a Choice's Default unless `choices` names the branch
    it takes (by its target), until a terminal state or `stop` (not entered again; `start` may be it, for a loop).
    Step Functions bills a transition for each state entered (infra/pricing/idle_cost.py)."""
    graph, picks = states(definition), dict(choices or {})
    path: list[str] = []
    name: str | None = start
    while name is not None and (name != stop or not path):
        if name not in graph:
            raise ValueError(f"the walk reached {name!r}, which the definition does not have")
        if name in path:
            raise ValueError(
                f"the walk loops back to {name!r} before {stop or 'a terminal state'}: {' -> '.join(path)}"
            )
        path.append(name)
        state = graph[name]
        if is_terminal(state):
            break
        if state["Type"] == "Choice":
            targets = [rule["Next"] for rule in state.get("Choices", [])] + [state.get("Default")]
            name = picks.pop(name, state.get("Default"))
            if name not in targets or name is None:
                raise ValueError(f"choice {path[-1]!r} has no branch to {name!r} (has {', '.join(map(str, targets))})")
        else:
            name = state["Next"]
    if picks:
        raise ValueError(f"the walk never reached the choice(s) {', '.join(sorted(picks))}")
    return path
