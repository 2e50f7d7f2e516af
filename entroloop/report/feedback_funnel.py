"""The first steps of the bad-case funnel (feedback, negative feedback, corrections) as one SQL
query, shared by the report and the Grafana funnel so both count the same verdicts.

A verdict counts only for the answer's own tenant (equal tenants, or either empty; an answer not
stored has none), as the bad-case join decides: another tenant that learned request ids cannot
inflate the funnel any more than it can reach bad cases. The raw ``feedback`` table is read, not
``feedback_1m``: the rollup does not know the answer's tenant.
"""

from __future__ import annotations


def feedback_funnel_sql(db: str, in_window: str, negative_rating: int) -> str:
    """One row: ``feedback``, ``negative``, ``corrections`` (verdicts that apply) and ``other_tenant``
    (ratings of answers served to another tenant, left out). ``in_window`` filters ``emitted_at``
    (the report's window, or Grafana's ``$__timeFilter(emitted_at)``)."""
    return f"""
        SELECT countIf(applies) AS feedback, countIf(applies AND rating <= {int(negative_rating)}) AS negative,
               countIf(applies AND has_correction) AS corrections, countIf(NOT applies) AS other_tenant
        FROM (
            SELECT f.rating, f.has_correction, f.tenant = '' OR a.tenant = '' OR f.tenant = a.tenant AS applies
            FROM (SELECT request_id, rating, has_correction, tenant FROM {db}.feedback FINAL WHERE {in_window}) AS f
            LEFT JOIN (SELECT request_id, any(tenant) AS tenant FROM {db}.audit_index
                       WHERE request_id IN (SELECT request_id FROM {db}.feedback WHERE {in_window})
                       GROUP BY request_id) AS a USING (request_id)
        )"""
