"""The operator's view without Grafana: a self-contained HTML report read from ClickHouse."""

from entroloop.report.data import ReportData, load_report_data
from entroloop.report.page import EntropyThresholds, render_page
from entroloop.report.window import ReportWindow, WindowError

__all__ = ["EntropyThresholds", "ReportData", "ReportWindow", "WindowError", "load_report_data", "render_page"]
