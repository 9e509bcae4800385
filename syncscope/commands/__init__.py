"""The command line: one module per ``syncscope`` command, imported when it runs.

Each of ``profile``, ``analyze``, ``report``, ``diff``, ``fix`` and ``build_kernel`` has
``add_parser(subparsers)`` and ``run(args) -> int`` (``syncscope.cli`` calls them);
``saved.load_and_diagnose`` is the one path from a saved run to its findings.
"""
