"""Helpers shared by the tests of every folder: hand-built runs (``runs``) and event streams
(``events``), hostile run directories and profiled scripts (``hostile``), the ranks'
training loops for ``syncscope.testing.spawn`` (``ranks``), report-only run directories
(``reports``), the script-side truth counters' checks (``truth``) and synthetic Kineto
traces of a DDP job at any size (``synth_traces``)."""
