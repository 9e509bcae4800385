"""Analysis: the rules, pure functions from the run model to findings (no I/O, no plots).

Entry point: ``findings.findings_for(run)`` (and ``with_flight_dumps`` for a hang's dumps),
which runs ``diagnose.diagnose`` (the per-window rules of ``window_rules``, the cross-rank
ones of ``crossrank`` and ``hangs``, what the run lets be judged: ``coverage``) and
``exposed`` (communication a trace measured); ``advice`` holds the fix snippets they share.
"""
