"""Saved Logs Insights queries: well formed, and reading fields the job really logs."""

from __future__ import annotations

import pytest

from monitoring.queries import QueryError, check_query, load_queries
from tests.monitoring.conftest import PublishedRun


def test_the_three_saved_queries_load() -> None:
    queries = {query.name: query for query in load_queries()}
    assert set(queries) == {"hourly_batch_throughput", "slow_batches", "low_gpu_utilisation_by_instance"}
    assert queries["slow_batches"].event == "batch_complete"
    assert {"duration_ms", "rows", "total_tokens"} <= queries["slow_batches"].fields
    assert queries["low_gpu_utilisation_by_instance"].event == "gpu_sample"
    assert "instance_id" in queries["low_gpu_utilisation_by_instance"].fields
    assert "bin(1h)" in queries["hourly_batch_throughput"].text


def test_every_field_a_query_reads_is_in_a_real_log_line(published_run: PublishedRun) -> None:
    for query in load_queries():
        lines = [line for line in published_run.log_lines if line["event"] == query.event]
        assert lines, f"the job logged no {query.event} line"
        for field in query.fields:
            assert all(field in line for line in lines), f"{query.name} reads {field}, missing in {lines[0]}"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('filter event = "batch_complete" | sortt duration_ms', "unknown command 'sortt'"),
        ('filter event = "batch_complete" | sort latency_ms desc', "fields ['latency_ms'] are not in"),
        ('filter event = "batch_complete" | stats count(*) by bin(1h', "unbalanced '('"),
        ('filter event = "batch_complete | limit 5', 'unclosed " quote'),
        ('filter event = "batch_complete" || limit 5', "empty command"),
        ("fields duration_ms | limit 5", "must filter on exactly one job log event"),
        ('filter event = "batch_done" | limit 5', "the job logs no event 'batch_done'"),
    ],
)
def test_broken_queries_are_named(text: str, problem: str) -> None:
    with pytest.raises(QueryError, match="query q: " + problem.replace("(", r"\(").replace("[", r"\[")):
        check_query("q", text)


def test_comments_and_aliases_are_not_fields() -> None:
    query = check_query(
        "q",
        '# rows per run, "quoted" words in a comment are fine\n'
        'filter event = "batch_complete" | stats sum(rows) as done by run | sort done desc',
    )
    assert query.fields == {"event", "rows", "run"}
