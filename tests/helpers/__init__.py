"""Helpers shared by the tests of every folder: hand-built runs (``runs``) and event streams
(``events``), hostile run directories and profiled scripts (``hostile``), the ranks' training
loops for ``syncscope.testing.spawn`` (``ranks``), report-only run directories (``reports``),
``fix_source`` results cached per session (``fixed``), Flight Recorder dumps (``dumps``), the
ground-truth counter the scripts of tests/scripts/ run in their ranks, with its comparison
with report.json (``truth``), and synthetic Kineto traces of a DDP job at any size
(``synth_traces``)."""
