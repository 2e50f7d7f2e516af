"""The operator's view without Grafana: a self-contained HTML report read from ClickHouse."""

from entroloop.report.data import ReportData, load_report_data
from entroloop.report.page import render_page

__all__ = ["ReportData", "load_report_data", "render_page"]
