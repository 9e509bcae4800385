"""Capture: what runs inside each rank and writes its events to the run directory.

Entry point: ``session.CaptureSession`` (started by ``syncscope.launch.attach``, or by
``syncscope.track()``), which installs ``hooks`` feeding the ``recorder`` and appends its
records through ``writer.EventWriter``; ``heartbeat``, ``flightdump``, ``profiler`` (the
``--trace`` torch.profiler trace) and ``native`` (the compiled collective kernel) serve it.
"""
