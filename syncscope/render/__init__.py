"""Render: the outputs, shown from the run model and its findings (never computed here).

Entry point: ``outputs`` (``render(run, findings, fmt)``, ``write_reports``, ``finish``), one
module per format: ``terminal`` (rich), ``json_report`` (report.json), ``html`` with ``page``,
``charts`` and ``timeline`` (report.html); ``diff`` compares two runs; ``summary`` the
per-window figures the page and ``diff`` share.
"""
