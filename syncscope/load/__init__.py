"""Loading: what a run left behind, read into the run model (``syncscope.model``).

The one place where windows are cut: ``captured.py`` from the events a rank's capture wrote
(run directories: ``runs.py``), ``trace/windows.py`` from a torch.profiler (Kineto) trace
(``traces.py`` reads a job's trace files, ``trace/`` one file at a time, in worker processes
or on a Dask cluster). ``flight.py`` reads torch Flight Recorder dumps, ``combine.py`` puts a
live capture and its trace in one run, and ``inputs.py`` says which of them a command was
given. Nothing here diagnoses: ``syncscope.analysis`` does, from the model alone.
"""
