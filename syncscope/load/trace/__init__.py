"""One Kineto trace file at a time: streamed (``read.py``), reduced to the events that matter
(``events.py``), cut into windows (``windows.py``, with the overlap ``overlap.py`` measures),
in worker processes (``worker.py``) or on a Dask cluster (``cluster.py``); ``rankfile.py``
reads one rank's file into its part of the run model, ``jobs.py`` says which job each file is from."""
